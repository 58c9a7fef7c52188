//! Output gathered for a moment before it leaves as one message.
//!
//! A log line, a shell's output or a forwarded packet each arrive as a small chunk; sent as
//! they come, each becomes an HTTP/2 DATA frame of its own. A receiver keeps every frame its
//! reader has not taken yet, and h2 counts what small frames cost it: an origin whose
//! `kubectl logs -f` are not read (piped into a pager, say) would hold thousands of them per
//! call until its h2 closed the whole connection (`ENHANCE_YOUR_CALM`, "too_many_data_frames").
//! Chunks that come together therefore leave together: after the first, whatever else comes
//! within [`LINGER`] joins it, up to [`MAX_CHUNK`] bytes.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use refract_wire::spdy::Stream;

/// How long a chunk waits for more to join it: short enough for a shell to feel immediate.
pub const LINGER: Duration = Duration::from_millis(5);
/// The most bytes gathered into one message (a single chunk may be larger).
pub const MAX_CHUNK: usize = 32 * 1024;

/// Where chunks come from. `next_chunk` must be cancel-safe: a call that has not yielded when
/// the time is up is dropped, and must have taken nothing.
pub trait ChunkSource {
    /// The next chunk; `None` once the source ended.
    fn next_chunk(&mut self) -> impl Future<Output = Option<Bytes>> + Send;
}

impl ChunkSource for Stream {
    fn next_chunk(&mut self) -> impl Future<Output = Option<Bytes>> + Send {
        self.read()
    }
}

/// A stream the caller may not have asked for: no chunks, ever.
impl ChunkSource for Option<Stream> {
    async fn next_chunk(&mut self) -> Option<Bytes> {
        match self {
            Some(s) => s.read().await,
            None => std::future::pending().await,
        }
    }
}

impl ChunkSource for tokio::sync::mpsc::Receiver<Bytes> {
    fn next_chunk(&mut self) -> impl Future<Output = Option<Bytes>> + Send {
        self.recv()
    }
}

/// `first`, and whatever `source` yields within [`LINGER`] after it, up to [`MAX_CHUNK`] bytes;
/// and whether the source ended meanwhile.
pub async fn gather(first: Bytes, source: &mut impl ChunkSource) -> (Vec<u8>, bool) {
    let mut out = first.to_vec();
    let deadline = tokio::time::Instant::now() + LINGER;
    while out.len() < MAX_CHUNK {
        match tokio::time::timeout_at(deadline, source.next_chunk()).await {
            Ok(Some(bytes)) => out.extend_from_slice(&bytes),
            Ok(None) => return (out, true),
            Err(_) => break,
        }
    }
    (out, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    #[tokio::test]
    async fn chunks_that_come_together_leave_together() {
        let (tx, mut rx) = mpsc::channel(16);
        for line in ["a\n", "b\n", "c\n"] {
            tx.send(Bytes::from(line)).await.unwrap();
        }
        let first = rx.recv().await.unwrap();
        let (out, ended) = gather(first, &mut rx).await;
        assert_eq!(out, b"a\nb\nc\n");
        assert!(!ended);
        drop(tx);
        let (_, ended) = gather(Bytes::new(), &mut rx).await;
        assert!(ended);
    }

    #[tokio::test]
    async fn a_late_chunk_waits_for_the_next_message() {
        let (tx, mut rx) = mpsc::channel(16);
        let sender = tokio::spawn(async move {
            tokio::time::sleep(LINGER * 10).await;
            tx.send(Bytes::from("late")).await.unwrap();
        });
        let (out, ended) = gather(Bytes::from("early"), &mut rx).await;
        assert_eq!(out, b"early");
        assert!(!ended);
        sender.await.unwrap();
        assert_eq!(rx.recv().await.unwrap(), "late");
    }

    #[tokio::test]
    async fn gathering_stops_at_the_most_bytes() {
        let (tx, mut rx) = mpsc::channel(64);
        for _ in 0..40 {
            tx.send(Bytes::from(vec![b'x'; 1024])).await.unwrap();
        }
        let (out, _) = gather(Bytes::from(vec![b'x'; 1024]), &mut rx).await;
        assert_eq!(out.len(), MAX_CHUNK);
        assert_eq!(rx.len(), 40 - (MAX_CHUNK / 1024 - 1));
    }
}
