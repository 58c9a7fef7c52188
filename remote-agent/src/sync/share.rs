//! The provider's writes shared among the tenants writing at the same time.
//!
//! Every tenant's requests reach one provider API server and one etcd. A tenant pipelining a
//! burst with `--apply-concurrency` writes in flight fills their queues, and every other
//! tenant's write waits behind them: in the 100-tenant benchmark, a tenant pipelining 10,000
//! ConfigMaps with 16 writes in flight raised the median quiet tenant's p99 12.7-fold; with
//! one, 1.2-fold (BENCHMARKS.md, "A noisy neighbour"). So a tenant alone may use all of
//! `--apply-concurrency`, and while others write too each gets an even share of
//! `--apply-concurrency-total`: that divided by the number of tenants that wrote in the last
//! [`ACTIVE_WINDOW`], at least one. A tenant writing now and then is not held back (one seat
//! is all it uses); one with a backlog gets its share, and more as the others go quiet.
//!
//! The count of active tenants is refreshed at most every [`RECOUNT_EVERY`], by whichever
//! tenant asks first, so a seat costs two atomic loads, not a walk over every tenant.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use refract_core::lock::Locked;
use tokio::sync::Notify;

/// A tenant that started a write within this long counts as writing.
pub const ACTIVE_WINDOW: Duration = Duration::from_secs(2);
/// How stale the count of writing tenants may be.
const RECOUNT_EVERY: Duration = Duration::from_millis(250);
/// How often a tenant waiting for a seat looks whether its share grew (others went quiet)
/// when none of its own writes ended meanwhile.
const RECHECK_EVERY: Duration = Duration::from_millis(100);

/// Seats a tenant may hold: an even share of `total` among `writing` tenants, at least one,
/// at most `per_tenant`.
pub fn seats(total: usize, per_tenant: usize, writing: usize) -> usize {
    (total / writing.max(1)).clamp(1, per_tenant.max(1))
}

/// The provider-wide share, one per agent.
#[derive(Clone)]
pub struct WriteShare {
    inner: Arc<Shared>,
}

struct Shared {
    total: usize,
    per_tenant: usize,
    epoch: Instant,
    /// Every open session's activity; dead ones are pruned at a recount.
    sessions: Mutex<Vec<Weak<Activity>>>,
    /// Tenants that wrote within [`ACTIVE_WINDOW`], as of the last recount.
    writing: AtomicUsize,
    /// When the last recount was, in milliseconds since `epoch`.
    recounted_ms: AtomicU64,
}

/// One session's last write, in milliseconds since the share's epoch plus one (0: never).
#[derive(Default)]
struct Activity {
    last_write_ms: AtomicU64,
}

impl WriteShare {
    /// `total` seats shared among writing tenants, each holding at most `per_tenant`.
    pub fn new(total: usize, per_tenant: usize) -> Self {
        Self {
            inner: Arc::new(Shared {
                total: total.max(1),
                per_tenant: per_tenant.max(1),
                epoch: Instant::now(),
                sessions: Mutex::default(),
                writing: AtomicUsize::new(0),
                recounted_ms: AtomicU64::new(0),
            }),
        }
    }

    /// The seats of one session of a tenant, for its dispatcher.
    pub fn session(&self) -> Seats {
        let activity = Arc::new(Activity::default());
        self.inner.sessions.locked().push(Arc::downgrade(&activity));
        Seats {
            shared: self.inner.clone(),
            activity,
            taken: Mutex::new(0),
            freed: Notify::new(),
        }
    }

    /// Tenants counted as writing now.
    #[cfg(test)]
    fn writing(&self) -> usize {
        self.inner.recount_if_stale();
        self.inner.writing.load(Ordering::Relaxed)
    }
}

impl Shared {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn recount_if_stale(&self) {
        let now = self.now_ms();
        let last = self.recounted_ms.load(Ordering::Relaxed);
        let every = RECOUNT_EVERY.as_millis() as u64;
        if now.saturating_sub(last) < every
            || self
                .recounted_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let window = ACTIVE_WINDOW.as_millis() as u64;
        let mut sessions = self.sessions.locked();
        let mut writing = 0;
        sessions.retain(|session| {
            let Some(activity) = session.upgrade() else {
                return false;
            };
            let last = activity.last_write_ms.load(Ordering::Relaxed);
            if last != 0 && now.saturating_sub(last - 1) < window {
                writing += 1;
            }
            true
        });
        self.writing.store(writing, Ordering::Relaxed);
    }
}

/// One session's writes in flight, bounded by its share.
pub struct Seats {
    shared: Arc<Shared>,
    activity: Arc<Activity>,
    taken: Mutex<usize>,
    freed: Notify,
}

/// A seat held; given back when dropped.
pub struct Seat {
    seats: Arc<Seats>,
}

impl Drop for Seat {
    fn drop(&mut self) {
        *self.seats.taken.locked() -= 1;
        self.seats.freed.notify_one();
    }
}

impl Seats {
    /// What this session may hold now.
    pub fn allowed(&self) -> usize {
        self.shared.recount_if_stale();
        // This session counts as writing even before the recount sees it.
        let writing = self.shared.writing.load(Ordering::Relaxed).max(1);
        seats(self.shared.total, self.shared.per_tenant, writing)
    }

    /// Waits for a seat within the session's share, and marks the tenant as writing.
    pub async fn take(self: &Arc<Self>) -> Seat {
        loop {
            // Waiting to write is writing, for the others' shares.
            self.activity
                .last_write_ms
                .store(self.shared.now_ms() + 1, Ordering::Relaxed);
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut taken = self.taken.locked();
                if *taken < self.allowed() {
                    *taken += 1;
                    return Seat {
                        seats: self.clone(),
                    };
                }
            }
            tokio::select! {
                () = freed => {}
                () = tokio::time::sleep(RECHECK_EVERY) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_alone_has_its_own_limit_and_shares_evenly_with_others() {
        assert_eq!(seats(16, 16, 1), 16);
        assert_eq!(seats(16, 8, 1), 8, "never above --apply-concurrency");
        assert_eq!(seats(16, 16, 2), 8);
        assert_eq!(seats(16, 16, 3), 5);
        assert_eq!(seats(16, 16, 100), 1, "always at least one");
        assert_eq!(
            seats(16, 16, 0),
            16,
            "nobody counted yet: the asker is alone"
        );
    }

    #[tokio::test]
    async fn a_tenant_gets_fewer_seats_while_another_writes_and_more_once_it_stops() {
        let share = WriteShare::new(4, 4);
        let noisy = Arc::new(share.session());
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(noisy.take().await);
        }
        assert_eq!(noisy.allowed(), 4, "alone, the whole share");

        let quiet = Arc::new(share.session());
        let _one = quiet.take().await;
        tokio::time::sleep(RECOUNT_EVERY + Duration::from_millis(50)).await;
        assert_eq!(share.writing(), 2);
        assert_eq!(noisy.allowed(), 2, "two writing: half each");
        let fifth = tokio::time::timeout(Duration::from_millis(300), noisy.take()).await;
        assert!(fifth.is_err(), "no seat beyond the share");

        // Two of the noisy tenant's writes end; it is still over its share of two.
        held.truncate(2);
        let third = tokio::time::timeout(Duration::from_millis(200), noisy.take()).await;
        assert!(third.is_err(), "holding two of two");
        held.truncate(1);
        let again = tokio::time::timeout(Duration::from_millis(200), noisy.take()).await;
        assert!(again.is_ok(), "a write ended: a seat within the share");
    }

    #[tokio::test]
    async fn the_share_grows_back_when_the_other_tenant_has_been_quiet_a_while() {
        let share = WriteShare::new(2, 2);
        let busy = Arc::new(share.session());
        let other = Arc::new(share.session());
        drop(other.take().await);
        let _a = busy.take().await;
        tokio::time::sleep(RECOUNT_EVERY + Duration::from_millis(50)).await;
        assert_eq!(busy.allowed(), 1);
        let waiting = tokio::spawn({
            let busy = busy.clone();
            async move { busy.take().await }
        });
        tokio::time::sleep(ACTIVE_WINDOW + RECOUNT_EVERY * 2).await;
        assert_eq!(share.writing(), 1, "the other went quiet");
        let second = tokio::time::timeout(RECHECK_EVERY * 3, waiting).await;
        assert!(
            second.is_ok(),
            "the waiting write started without one ending"
        );
    }

    #[test]
    fn a_closed_session_no_longer_counts() {
        let share = WriteShare::new(8, 8);
        let gone = share.session();
        gone.activity.last_write_ms.store(1, Ordering::Relaxed);
        drop(gone);
        share.inner.recounted_ms.store(0, Ordering::Relaxed);
        std::thread::sleep(RECOUNT_EVERY);
        assert_eq!(share.writing(), 0);
        assert!(share.inner.sessions.locked().is_empty());
    }
}
