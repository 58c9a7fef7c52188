//! One tap reader's queue, bounded in bytes: a reader that falls [`READER_BYTES`] behind is
//! cut off (its queue freed at once, and its stream ended with a reason) rather than held, so
//! a reader that never reads costs the agent at most that much, whatever the tenant sends.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};

use prost::Message as _;
use refract_core::lock::Locked;
use refract_wire::proto::TapEvent;
use tokio::sync::Notify;

/// How far (encoded bytes of events not yet read) a reader may fall behind.
pub const READER_BYTES: usize = 8 * 1024 * 1024;
/// Readers one tenant may have at once.
pub const MAX_READERS: usize = 4;

/// A reader's events, and whether it was cut off.
#[derive(Default)]
struct Queue {
    events: VecDeque<TapEvent>,
    bytes: usize,
    /// Set when the reader fell too far behind: how many bytes it had not read.
    cut_off: Option<usize>,
}

/// One reader's end: what it has to read.
#[derive(Default)]
pub struct TapReader {
    queue: Mutex<Queue>,
    ready: Notify,
}

/// What a reader gets next.
#[derive(Debug)]
pub enum Next {
    /// An event.
    Event(TapEvent),
    /// The reader fell this many bytes behind and was cut off: its stream ends.
    CutOff(usize),
}

impl TapReader {
    /// The next event, waiting for one.
    pub async fn next(&self) -> Next {
        loop {
            let notified = self.ready.notified();
            {
                let mut queue = self.queue.locked();
                if let Some(behind) = queue.cut_off {
                    return Next::CutOff(behind);
                }
                if let Some(event) = queue.events.pop_front() {
                    queue.bytes -= event.encoded_len();
                    return Next::Event(event);
                }
            }
            notified.await;
        }
    }

    /// Queues `event` (of `size` encoded bytes), or cuts the reader off when it would fall
    /// more than [`READER_BYTES`] behind.
    fn offer(&self, event: &TapEvent, size: usize) {
        let mut queue = self.queue.locked();
        if queue.cut_off.is_some() {
            return;
        }
        if queue.bytes + size > READER_BYTES {
            queue.cut_off = Some(queue.bytes + size);
            queue.events = VecDeque::new();
            queue.bytes = 0;
        } else {
            queue.events.push_back(event.clone());
            queue.bytes += size;
        }
        drop(queue);
        self.ready.notify_one();
    }
}

/// A tenant's tap readers (held weakly: a reader that hung up goes with its stream).
#[derive(Default)]
pub struct TapReaders {
    readers: Vec<Weak<TapReader>>,
}

/// Why a tap cannot be opened.
#[derive(Debug, thiserror::Error)]
#[error("the tenant has {MAX_READERS} taps open already")]
pub struct TooManyReaders;

impl TapReaders {
    /// Whether any reader is listening.
    pub fn any(&mut self) -> bool {
        self.readers.retain(|r| r.strong_count() > 0);
        !self.readers.is_empty()
    }

    /// A new reader, unless the tenant has [`MAX_READERS`] already.
    pub fn add(&mut self) -> Result<Arc<TapReader>, TooManyReaders> {
        if self.any() && self.readers.len() >= MAX_READERS {
            return Err(TooManyReaders);
        }
        let reader = Arc::new(TapReader::default());
        self.readers.push(Arc::downgrade(&reader));
        Ok(reader)
    }

    /// Offers `event` to every reader.
    pub fn send(&self, event: &TapEvent) {
        let size = event.encoded_len();
        for reader in self.readers.iter().filter_map(Weak::upgrade) {
            reader.offer(event, size);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(bytes: usize) -> TapEvent {
        TapEvent {
            at: "x".repeat(bytes),
            message: None,
            dropped_before: 0,
        }
    }

    #[tokio::test]
    async fn a_reader_that_falls_too_far_behind_is_cut_off_and_its_queue_freed() {
        let mut readers = TapReaders::default();
        let slow = readers.add().unwrap();
        let quick = readers.add().unwrap();
        let big = event(1024 * 1024);
        for _ in 0..7 {
            readers.send(&big);
            assert!(matches!(quick.next().await, Next::Event(_)));
        }
        assert!(slow.queue.locked().bytes < READER_BYTES);
        readers.send(&big);
        readers.send(&big);
        assert!(matches!(quick.next().await, Next::Event(_)));
        assert_eq!(slow.queue.locked().bytes, 0, "freed");
        let mut read = 0;
        loop {
            match slow.next().await {
                Next::Event(_) => read += 1,
                Next::CutOff(behind) => {
                    assert!(behind > READER_BYTES);
                    break;
                }
            }
        }
        assert_eq!(read, 0, "what was queued went with the cut");
        readers.send(&event(10));
        assert!(matches!(quick.next().await, Next::Event(_)), "others go on");
    }

    #[test]
    fn a_tenant_has_a_bounded_number_of_readers_and_a_gone_one_frees_its_place() {
        let mut readers = TapReaders::default();
        let held: Vec<_> = (0..MAX_READERS).map(|_| readers.add().unwrap()).collect();
        assert!(readers.add().is_err());
        drop(held);
        assert!(!readers.any());
        assert!(readers.add().is_ok());
    }
}
