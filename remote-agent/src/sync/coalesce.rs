//! The outbound half of a tenant's stream, with acknowledgements held back briefly so that
//! several leave in one write.
//!
//! Under a steady load every Upsert is answered alone: one HTTP/2 frame, one TLS record and one
//! system call on this side, one wake-up and one read on the local agent's, per object. tonic
//! already packs into one write whatever the stream has ready when it polls, so holding acks
//! for a few milliseconds is enough to send them together. Nothing waits on an ack but the
//! local agent's outbox (it resends what is unacknowledged after a reconnect, and the hash
//! makes a resent object cost a read): users see the delay only as an object counted
//! unacknowledged up to 20 ms longer (`refractctl status`, the outbox gauges). Every other message
//! (Welcome, pod status, events, capacity, inventories, the stream's end) flushes at once,
//! behind the acks held before it, so order is kept and pod status is not slowed.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use refract_wire::proto::{remote_message, RemoteMessage};
use tokio::sync::mpsc;
use tokio::time::Sleep;
use tonic::Status;

/// How long the first of a group of acks may wait for others. At a steady 300 objects a second,
/// about six leave together.
pub(crate) const ACK_LINGER: Duration = Duration::from_millis(20);
/// Acks sent together at most; a burst flushes as soon as this many are held.
pub(crate) const MAX_HELD_ACKS: usize = 64;

type Item = Result<RemoteMessage, Status>;

/// The stream tonic sends to the local agent.
pub struct Outbound {
    rx: mpsc::Receiver<Item>,
    held: VecDeque<Item>,
    /// When the oldest held ack must leave.
    deadline: Option<Pin<Box<Sleep>>>,
    /// Handing out what is held, one item per poll, until none is left.
    flushing: bool,
    /// The channel closed: flush and end.
    closed: bool,
}

impl Outbound {
    pub(crate) fn new(rx: mpsc::Receiver<Item>) -> Self {
        Self {
            rx,
            held: VecDeque::new(),
            deadline: None,
            flushing: false,
            closed: false,
        }
    }

    /// Takes `item` in: an ack may wait for company, anything else flushes.
    fn hold(&mut self, item: Item) {
        let lingers = matches!(
            &item,
            Ok(RemoteMessage {
                kind: Some(remote_message::Kind::Ack(_))
            })
        );
        self.held.push_back(item);
        if !lingers || self.held.len() >= MAX_HELD_ACKS {
            self.flushing = true;
        } else if self.deadline.is_none() {
            self.deadline = Some(Box::pin(tokio::time::sleep(ACK_LINGER)));
        }
    }
}

impl futures::Stream for Outbound {
    type Item = Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Item>> {
        let this = self.get_mut();
        loop {
            if this.flushing {
                // Returned back to back, so tonic encodes them into one write.
                if let Some(item) = this.held.pop_front() {
                    return Poll::Ready(Some(item));
                }
                this.flushing = false;
                this.deadline = None;
            }
            if this.closed {
                return Poll::Ready(None);
            }
            match this.rx.poll_recv(cx) {
                Poll::Ready(Some(item)) => this.hold(item),
                Poll::Ready(None) => {
                    this.closed = true;
                    this.flushing = true;
                }
                Poll::Pending => {
                    let due = match this.deadline.as_mut() {
                        Some(deadline) => deadline.as_mut().poll(cx).is_ready(),
                        None => false,
                    };
                    if !due {
                        return Poll::Pending;
                    }
                    this.flushing = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::{FutureExt, StreamExt};
    use refract_wire::proto::{Ack, Capacity};

    fn ack(revision: &str) -> Item {
        Ok(RemoteMessage {
            kind: Some(remote_message::Kind::Ack(Ack {
                revision: revision.into(),
                ..Default::default()
            })),
        })
    }

    fn capacity() -> Item {
        Ok(RemoteMessage {
            kind: Some(remote_message::Kind::Capacity(Capacity::default())),
        })
    }

    fn revision(item: Option<Item>) -> String {
        match item.expect("an item").expect("not an error").kind {
            Some(remote_message::Kind::Ack(ack)) => ack.revision,
            other => format!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn acks_wait_for_the_linger_then_leave_together() {
        let (tx, rx) = mpsc::channel(16);
        let mut out = Outbound::new(rx);
        let start = tokio::time::Instant::now();
        tx.send(ack("1")).await.unwrap();
        tx.send(ack("2")).await.unwrap();
        assert!(
            out.next().now_or_never().is_none(),
            "an ack left before the linger"
        );
        assert_eq!(revision(out.next().await), "1");
        assert!(
            start.elapsed() >= ACK_LINGER,
            "left after {:?}",
            start.elapsed()
        );
        // The rest of the group is ready at once: one write.
        assert_eq!(revision(out.next().now_or_never().unwrap()), "2");
        assert!(out.next().now_or_never().is_none());
    }

    #[tokio::test]
    async fn any_other_message_flushes_the_held_acks_in_order() {
        let (tx, rx) = mpsc::channel(16);
        let mut out = Outbound::new(rx);
        tx.send(ack("1")).await.unwrap();
        tx.send(capacity()).await.unwrap();
        assert_eq!(revision(out.next().now_or_never().unwrap()), "1");
        let second = out.next().now_or_never().unwrap();
        assert!(revision(second).starts_with("Some(Capacity"));
    }

    #[tokio::test]
    async fn a_full_group_leaves_without_waiting() {
        let (tx, rx) = mpsc::channel(MAX_HELD_ACKS * 2);
        let mut out = Outbound::new(rx);
        for i in 0..MAX_HELD_ACKS {
            tx.send(ack(&i.to_string())).await.unwrap();
        }
        for i in 0..MAX_HELD_ACKS {
            assert_eq!(revision(out.next().now_or_never().unwrap()), i.to_string());
        }
    }

    #[tokio::test]
    async fn a_closed_channel_flushes_then_ends() {
        let (tx, rx) = mpsc::channel(16);
        let mut out = Outbound::new(rx);
        tx.send(ack("1")).await.unwrap();
        drop(tx);
        assert_eq!(revision(out.next().now_or_never().unwrap()), "1");
        assert!(out.next().now_or_never().unwrap().is_none());
    }
}
