//! The outbound half of a tenant's stream, with acknowledgements held back briefly so that
//! several leave in one write.
//!
//! Under a steady load every Upsert is answered alone: one HTTP/2 frame, one TLS record and one
//! system call on this side, one wake-up and one read on the local agent's, per object. tonic
//! already packs into one write whatever the stream has ready when it polls, so holding acks
//! for the linger (`--ack-linger`) is enough to send them together. Only acks that say the
//! object was written or already held (Applied, Unchanged) wait, and only when the origin did
//! not ask for the answer at once (`Upsert.awaited`: a twin namespace): for
//! those the local agent's outbox is the only reader, and users see the delay only as an object
//! counted unacknowledged up to the linger longer (`refractctl status`, the outbox gauges). A
//! refusal, a request to resend, an awaited answer and every other message (Welcome, pod
//! status, events, capacity, inventories, the stream's end) flush at once, behind the acks
//! held before them, so order is kept and nothing a user or a waiting request sees is slowed.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use refract_wire::proto::{remote_message, Outcome, RemoteMessage};
use tokio::sync::mpsc;
use tokio::time::Sleep;
use tonic::Status;

/// The longest linger accepted (`--ack-linger`): the outbox's unacknowledged gauges would mislead beyond it.
pub const MAX_ACK_LINGER: Duration = Duration::from_secs(1);
/// Acks sent together at most; a burst flushes as soon as this many are held.
pub(crate) const MAX_HELD_ACKS: usize = 64;

type Item = Result<RemoteMessage, Status>;

/// The stream tonic sends to the local agent.
pub struct Outbound {
    rx: mpsc::Receiver<Item>,
    /// How long the first held ack waits; zero sends each at once.
    linger: Duration,
    held: VecDeque<Item>,
    /// When the oldest held ack must leave.
    deadline: Option<Pin<Box<Sleep>>>,
    /// Handing out what is held, one item per poll, until none is left.
    flushing: bool,
    /// The channel closed: flush and end.
    closed: bool,
}

impl Outbound {
    pub(crate) fn new(rx: mpsc::Receiver<Item>, linger: Duration) -> Self {
        Self {
            rx,
            linger,
            held: VecDeque::new(),
            deadline: None,
            flushing: false,
            closed: false,
        }
    }

    /// Takes `item` in: an ack nobody waits on may wait for company, anything else flushes.
    fn hold(&mut self, item: Item) {
        let lingers = !self.linger.is_zero() && may_linger(&item);
        self.held.push_back(item);
        if !lingers || self.held.len() >= MAX_HELD_ACKS {
            self.flushing = true;
        } else if self.deadline.is_none() {
            self.deadline = Some(Box::pin(tokio::time::sleep(self.linger)));
        }
    }
}

/// Whether `item` is an ack only the origin's outbox reads: a write done or not needed, of an
/// object the origin did not ask to be answered at once.
fn may_linger(item: &Item) -> bool {
    let Ok(RemoteMessage {
        kind: Some(remote_message::Kind::Ack(ack)),
    }) = item
    else {
        return false;
    };
    let settled = matches!(
        Outcome::try_from(ack.outcome),
        Ok(Outcome::Applied | Outcome::Unchanged)
    );
    settled && !ack.awaited
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

    const LINGER: Duration = Duration::from_millis(20);

    fn ack(revision: &str) -> Item {
        answer(revision, Outcome::Applied, false)
    }

    fn answer(revision: &str, outcome: Outcome, awaited: bool) -> Item {
        Ok(RemoteMessage {
            kind: Some(remote_message::Kind::Ack(Ack {
                revision: revision.into(),
                outcome: outcome as i32,
                awaited,
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
        let mut out = Outbound::new(rx, LINGER);
        let start = tokio::time::Instant::now();
        tx.send(ack("1")).await.unwrap();
        tx.send(ack("2")).await.unwrap();
        assert!(
            out.next().now_or_never().is_none(),
            "an ack left before the linger"
        );
        assert_eq!(revision(out.next().await), "1");
        assert!(
            start.elapsed() >= LINGER,
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
        let mut out = Outbound::new(rx, LINGER);
        tx.send(ack("1")).await.unwrap();
        tx.send(capacity()).await.unwrap();
        assert_eq!(revision(out.next().now_or_never().unwrap()), "1");
        let second = out.next().now_or_never().unwrap();
        assert!(revision(second).starts_with("Some(Capacity"));
    }

    #[tokio::test]
    async fn a_full_group_leaves_without_waiting() {
        let (tx, rx) = mpsc::channel(MAX_HELD_ACKS * 2);
        let mut out = Outbound::new(rx, LINGER);
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
        let mut out = Outbound::new(rx, LINGER);
        tx.send(ack("1")).await.unwrap();
        drop(tx);
        assert_eq!(revision(out.next().now_or_never().unwrap()), "1");
        assert!(out.next().now_or_never().unwrap().is_none());
    }

    #[tokio::test]
    async fn awaited_answers_refusals_and_resends_flush_at_once() {
        let (tx, rx) = mpsc::channel(16);
        let mut out = Outbound::new(rx, LINGER);
        tx.send(ack("1")).await.unwrap();
        tx.send(answer("2", Outcome::Applied, true)).await.unwrap();
        assert_eq!(revision(out.next().now_or_never().unwrap()), "1");
        assert_eq!(revision(out.next().now_or_never().unwrap()), "2");
        for (name, outcome) in [("3", Outcome::Denied), ("4", Outcome::Resend)] {
            tx.send(answer(name, outcome, false)).await.unwrap();
            assert_eq!(revision(out.next().now_or_never().unwrap()), name);
        }
        tx.send(answer("5", Outcome::Unchanged, false))
            .await
            .unwrap();
        assert!(
            out.next().now_or_never().is_none(),
            "an unchanged ack waits"
        );
    }

    #[tokio::test]
    async fn no_linger_sends_each_ack_at_once() {
        let (tx, rx) = mpsc::channel(16);
        let mut out = Outbound::new(rx, Duration::ZERO);
        tx.send(ack("1")).await.unwrap();
        assert_eq!(revision(out.next().now_or_never().unwrap()), "1");
    }
}
