//! One tap reader's queue, bounded in bytes: a reader that falls [`READER_BYTES`] behind is
//! cut off (its queue freed at once, and its stream ended with a reason) rather than held, so
//! a reader that never reads costs the agent at most that much, whatever the tenant sends. A
//! tenant has at most [`MAX_READERS`]: a newer tap ends the oldest (never refused, so a tap
//! opened again right after one was closed is not turned away while the old one winds down).

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

/// A reader's events, and whether it was ended.
#[derive(Default)]
struct Queue {
    events: VecDeque<TapEvent>,
    bytes: usize,
    /// Set when the reader was ended, and why.
    ended: Option<Ended>,
}

/// Why a reader was ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// It fell this many bytes behind.
    Behind(usize),
    /// A newer tap of the tenant took its place.
    Replaced,
}

/// One reader's end: what it has to read.
#[derive(Default)]
pub struct TapReader {
    queue: Mutex<Queue>,
    ready: Notify,
}

/// What a reader gets next.
#[derive(Debug)]
#[allow(
    clippy::large_enum_variant,
    reason = "returned once per event and moved on at once: boxing would allocate for each"
)]
pub enum Next {
    /// An event.
    Event(TapEvent),
    /// The reader was ended: its stream ends, saying why.
    Ended(Ended),
}

impl TapReader {
    /// The next event, waiting for one.
    pub async fn next(&self) -> Next {
        loop {
            let notified = self.ready.notified();
            {
                let mut queue = self.queue.locked();
                if let Some(ended) = queue.ended {
                    return Next::Ended(ended);
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
        if queue.ended.is_some() {
            return;
        }
        if queue.bytes + size > READER_BYTES {
            let behind = queue.bytes + size;
            drop(queue);
            self.end(Ended::Behind(behind));
            return;
        } else {
            queue.events.push_back(event.clone());
            queue.bytes += size;
        }
        drop(queue);
        self.ready.notify_one();
    }

    /// Ends the reader: its queue is freed at once.
    fn end(&self, why: Ended) {
        let mut queue = self.queue.locked();
        queue.ended.get_or_insert(why);
        queue.events = VecDeque::new();
        queue.bytes = 0;
        drop(queue);
        self.ready.notify_one();
    }
}

/// A tenant's tap readers (held weakly: a reader that hung up goes with its stream).
#[derive(Default)]
pub struct TapReaders {
    readers: Vec<Weak<TapReader>>,
}

impl TapReaders {
    /// Whether any reader is listening.
    pub fn any(&mut self) -> bool {
        self.readers.retain(|r| r.strong_count() > 0);
        !self.readers.is_empty()
    }

    /// A new reader; with [`MAX_READERS`] already, the oldest is ended to make room.
    pub fn add(&mut self) -> Arc<TapReader> {
        self.any();
        while self.readers.len() >= MAX_READERS {
            let oldest = self.readers.remove(0);
            if let Some(oldest) = oldest.upgrade() {
                oldest.end(Ended::Replaced);
            }
        }
        let reader = Arc::new(TapReader::default());
        self.readers.push(Arc::downgrade(&reader));
        reader
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
        let slow = readers.add();
        let quick = readers.add();
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
                Next::Ended(Ended::Behind(behind)) => {
                    assert!(behind > READER_BYTES);
                    break;
                }
                Next::Ended(other) => panic!("{other:?}"),
            }
        }
        assert_eq!(read, 0, "what was queued went with the cut");
        readers.send(&event(10));
        assert!(matches!(quick.next().await, Next::Event(_)), "others go on");
    }

    #[tokio::test]
    async fn a_tenant_has_a_bounded_number_of_readers_and_a_newer_one_ends_the_oldest() {
        let mut readers = TapReaders::default();
        let held: Vec<_> = (0..MAX_READERS).map(|_| readers.add()).collect();
        let newest = readers.add();
        assert!(matches!(held[0].next().await, Next::Ended(Ended::Replaced)));
        assert_eq!(readers.readers.len(), MAX_READERS);
        readers.send(&event(10));
        assert!(matches!(newest.next().await, Next::Event(_)));
        assert!(matches!(held[1].next().await, Next::Event(_)));
        drop((held, newest));
        assert!(!readers.any(), "a reader gone frees its place");
    }
}
