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
//! Seats bound what a tenant holds in flight, not how fast it writes: one seat held without a
//! pause still keeps the provider's API server and etcd busy, and every other tenant's write
//! lands beside that work (BENCHMARKS.md, "A rate per tenant while others write": one seat
//! at 254 writes/s beside 100 quiet tenants moved their p99 2.75x in the median and 5.8x at
//! worst; held to 100/s, 2.22x and 4.86x). So while others write, a tenant also starts at
//! most `--tenant-write-rate` writes a second ([`Bucket`]); a tenant writing now and then
//! never meets that limit, and one writing alone is held by its seats only.
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

/// How many writes a tenant may start at once, in seconds of its rate, once it has been
/// held: a quarter second, so a tenant held at 100/s starts 25 in a row at most.
const BURST_SECONDS: f64 = 0.25;

/// Seats a tenant may hold: an even share of `total` among `writing` tenants, at least one,
/// at most `per_tenant`.
pub fn seats(total: usize, per_tenant: usize, writing: usize) -> usize {
    (total / writing.max(1)).clamp(1, per_tenant.max(1))
}

/// A token bucket: `rate` writes a second, up to [`BURST_SECONDS`] of them saved up.
#[derive(Debug)]
struct Bucket {
    rate: f64,
    tokens: f64,
    filled_at: Instant,
}

impl Bucket {
    /// A full bucket.
    fn new(rate: f64, now: Instant) -> Self {
        Self {
            rate,
            tokens: Self::capacity_at(rate),
            filled_at: now,
        }
    }

    fn capacity_at(rate: f64) -> f64 {
        (rate * BURST_SECONDS).max(1.0)
    }

    fn capacity(&self) -> f64 {
        Self::capacity_at(self.rate)
    }

    /// Takes one write if the bucket has it; otherwise how long until it will.
    fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let earned = now.saturating_duration_since(self.filled_at).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + earned).min(self.capacity());
        self.filled_at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
        }
    }
}

/// The provider-wide share, one per agent.
#[derive(Clone)]
pub struct WriteShare {
    inner: Arc<Shared>,
}

struct Shared {
    total: usize,
    per_tenant: usize,
    /// Writes a second one tenant may start while others write; `None`: no limit.
    rate_while_shared: Option<f64>,
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
    /// `total` seats shared among writing tenants, each holding at most `per_tenant` and,
    /// while others write, starting at most `rate_while_shared` writes a second (0: no limit).
    pub fn new(total: usize, per_tenant: usize, rate_while_shared: u32) -> Self {
        Self {
            inner: Arc::new(Shared {
                total: total.max(1),
                per_tenant: per_tenant.max(1),
                rate_while_shared: (rate_while_shared > 0).then_some(f64::from(rate_while_shared)),
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
            bucket: self
                .inner
                .rate_while_shared
                .map(|rate| Mutex::new(Bucket::new(rate, Instant::now()))),
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
    /// The session's rate while others write, if the share has one.
    bucket: Option<Mutex<Bucket>>,
}

/// A seat held; given back when dropped.
pub struct Seat {
    seats: Arc<Seats>,
}

impl Seat {
    /// Waits until the tenant's rate lets it start one more write on this seat: a further
    /// write of the same object, which rides the seat of the one before it, meets the rate
    /// like any other (or a tenant rewriting one object would outrun it).
    pub async fn pace(&self) {
        loop {
            self.seats.mark_writing();
            match self.seats.paced_among(self.seats.writing()) {
                Ok(()) => return,
                Err(until_paced) => tokio::time::sleep(until_paced.min(RECHECK_EVERY)).await,
            }
        }
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        *self.seats.taken.locked() -= 1;
        self.seats.freed.notify_one();
    }
}

impl Seats {
    /// Tenants writing now, this session's among them even before the recount sees it.
    fn writing(&self) -> usize {
        self.shared.recount_if_stale();
        self.shared.writing.load(Ordering::Relaxed).max(1)
    }

    /// Marks the tenant as writing, for the others' shares.
    fn mark_writing(&self) {
        self.activity
            .last_write_ms
            .store(self.shared.now_ms() + 1, Ordering::Relaxed);
    }

    /// What this session may hold while `writing` tenants write.
    fn allowed_among(&self, writing: usize) -> usize {
        seats(self.shared.total, self.shared.per_tenant, writing)
    }

    /// What this session may hold now.
    #[cfg(test)]
    fn allowed(&self) -> usize {
        self.allowed_among(self.writing())
    }

    /// Whether the session may start a write now as far as its rate goes, with `writing`
    /// tenants writing; if not, how long until it may. Only while others write: alone, a
    /// tenant is held by its seats only.
    fn paced_among(&self, writing: usize) -> Result<(), Duration> {
        match &self.bucket {
            Some(bucket) if writing > 1 => bucket.locked().take(Instant::now()),
            _ => Ok(()),
        }
    }

    /// Waits for a seat within the session's share, and marks the tenant as writing.
    pub async fn take(self: &Arc<Self>) -> Seat {
        loop {
            // Waiting to write is writing, for the others' shares.
            self.mark_writing();
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let wait = {
                let mut taken = self.taken.locked();
                // One count of the writing tenants for both the share and the rate.
                let writing = self.writing();
                if *taken < self.allowed_among(writing) {
                    match self.paced_among(writing) {
                        Ok(()) => {
                            *taken += 1;
                            return Seat {
                                seats: self.clone(),
                            };
                        }
                        // A seat is free; the rate is what holds it. Ending writes change
                        // nothing there, so only the time is waited for.
                        Err(until_paced) => Some(until_paced.min(RECHECK_EVERY)),
                    }
                } else {
                    None
                }
            };
            match wait {
                Some(until_paced) => tokio::time::sleep(until_paced).await,
                None => tokio::select! {
                    () = freed => {}
                    () = tokio::time::sleep(RECHECK_EVERY) => {}
                },
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
        let share = WriteShare::new(4, 4, 0);
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
        let share = WriteShare::new(2, 2, 0);
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
    fn the_bucket_lets_a_quarter_second_through_then_paces_at_the_rate() {
        let start = Instant::now();
        let mut bucket = Bucket::new(100.0, start);
        for _ in 0..25 {
            assert_eq!(bucket.take(start), Ok(()));
        }
        let wait = bucket.take(start).expect_err("the burst is spent");
        assert!(wait > Duration::from_millis(9) && wait <= Duration::from_millis(10));
        assert_eq!(bucket.take(start + Duration::from_millis(10)), Ok(()));
        assert!(bucket.take(start + Duration::from_millis(10)).is_err());
        assert_eq!(
            Bucket::new(2.0, start).capacity(),
            1.0,
            "a slow rate still lets one write through"
        );
    }

    /// Another tenant of `share` that has just written, once the recount counts it beside
    /// one that already wrote.
    async fn writing_beside(share: &WriteShare) -> Arc<Seats> {
        let other = Arc::new(share.session());
        drop(other.take().await);
        tokio::time::sleep(RECOUNT_EVERY + Duration::from_millis(50)).await;
        assert_eq!(share.writing(), 2);
        other
    }

    #[tokio::test]
    async fn a_tenant_is_paced_only_while_another_writes() {
        let share = WriteShare::new(16, 16, 20);
        let busy = Arc::new(share.session());
        let started = Instant::now();
        for _ in 0..40 {
            drop(busy.take().await);
        }
        assert!(
            started.elapsed() < Duration::from_millis(200),
            "alone: seats only, no rate ({:?})",
            started.elapsed()
        );

        let quiet = writing_beside(&share).await;
        let started = Instant::now();
        // The bucket holds five (a quarter second at 20/s); ten more take half a second.
        for _ in 0..15 {
            drop(busy.take().await);
        }
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(450) && took < Duration::from_millis(900),
            "while another writes: 20 a second after the burst ({took:?})"
        );
        let quiet_started = Instant::now();
        drop(quiet.take().await);
        assert!(
            quiet_started.elapsed() < Duration::from_millis(20),
            "the quiet tenant's own bucket is full"
        );
    }

    #[tokio::test]
    async fn a_write_riding_an_earlier_write_s_seat_meets_the_rate_too() {
        let share = WriteShare::new(16, 16, 20);
        let busy = Arc::new(share.session());
        let seat = busy.take().await;
        let _quiet = writing_beside(&share).await;
        let started = Instant::now();
        // The quarter second's five (the seat was taken alone, unpaced), then ten at 20/s.
        for _ in 0..15 {
            seat.pace().await;
        }
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(450) && took < Duration::from_millis(900),
            "the same seat's further writes: 20 a second after the burst ({took:?})"
        );
    }

    #[test]
    fn a_closed_session_no_longer_counts() {
        let share = WriteShare::new(8, 8, 0);
        let gone = share.session();
        gone.activity.last_write_ms.store(1, Ordering::Relaxed);
        drop(gone);
        share.inner.recounted_ms.store(0, Ordering::Relaxed);
        std::thread::sleep(RECOUNT_EVERY);
        assert_eq!(share.writing(), 0);
        assert!(share.inner.sessions.locked().is_empty());
    }
}
