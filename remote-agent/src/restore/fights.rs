//! Which copies someone on the provider keeps rewriting: each restore is counted per object,
//! and an object restored too often in a short time is quarantined (left as the other writer
//! made it) until the fight stops. Pure: the caller says what time it is.
//!
//! Without this, a provider controller that owns the same fields (a mutating controller, a
//! GitOps tool pointed at the twin namespace) and the remote agent rewrite the copy in a loop
//! for ever, each write waking the other, and neither says so.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// When a fight becomes a quarantine, and when it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FightRule {
    /// Restores allowed within `window`; one more quarantines the object. 0 never
    /// quarantines.
    pub restores: u32,
    /// How far back restores count.
    pub window: Duration,
    /// How long a quarantined object must go without a foreign write before it is restored
    /// again.
    pub quiet: Duration,
}

impl Default for FightRule {
    fn default() -> Self {
        Self {
            restores: 5,
            window: Duration::from_secs(60),
            quiet: Duration::from_secs(300),
        }
    }
}

/// What one confirmed restore leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing more. `count` is this fight's restores, this one included; `report` says
    /// whether to tell the origin (the fight's first restore, then at most once per window).
    Restore {
        /// This fight's restores, this one included.
        count: u32,
        /// Whether to tell the origin.
        report: bool,
    },
    /// It was one too many within the window: the object is quarantined from now on, after
    /// `count` restores. Said once.
    Quarantine {
        /// This fight's restores, this one included.
        count: u32,
    },
}

/// What is known of one object's fight, for operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FightView {
    /// Restores in this fight.
    pub restores: u32,
    /// Since when the object is quarantined, if it is.
    pub quarantined_since: Option<Instant>,
}

#[derive(Debug)]
struct Fight {
    /// The origin was asked to send the object again after someone else's write, seen at
    /// this resourceVersion (`None`: deleted); the write that lands it says whether it
    /// changed the copy back ([`Fights::take_awaited`]).
    awaited: Option<Option<String>>,
    /// Restores within the window, oldest first.
    recent: VecDeque<Instant>,
    /// Restores since the fight began.
    restores: u32,
    /// The last foreign write.
    last_foreign: Instant,
    /// The last restore the origin was told of.
    last_report: Option<Instant>,
    quarantined_since: Option<Instant>,
}

impl Fight {
    fn new(now: Instant) -> Self {
        Self {
            awaited: None,
            recent: VecDeque::new(),
            restores: 0,
            last_foreign: now,
            last_report: None,
            quarantined_since: None,
        }
    }
}

/// Every object in a fight, by key. An object is forgotten once `quiet` passes without a
/// foreign write (a quarantined one is then released), so what is kept is bounded by what
/// others write now.
#[derive(Debug)]
pub struct Fights<K> {
    rule: FightRule,
    fights: BTreeMap<K, Fight>,
}

impl<K: Ord + Clone> Fights<K> {
    /// No fights yet, judged by `rule`.
    pub fn new(rule: FightRule) -> Self {
        Self {
            rule,
            fights: BTreeMap::new(),
        }
    }

    /// Someone other than the agent wrote `key` at `now`: whether to restore it. A
    /// quarantined object is left alone, and its quiet period starts again.
    pub fn foreign_write(&mut self, key: &K, now: Instant) -> bool {
        match self.fights.get_mut(key) {
            Some(fight) if fight.quarantined_since.is_some() => {
                fight.last_foreign = now;
                false
            }
            _ => true,
        }
    }

    /// The origin was asked at `now` to send `key` again, after someone else's write seen at
    /// `seen` (`None`: deleted): the write that lands it says whether the copy had really
    /// changed ([`Fights::take_awaited`]). Kept like a fight, and forgotten with it after the
    /// quiet period.
    pub fn await_resend(&mut self, key: &K, seen: Option<String>, now: Instant) {
        let fight = self
            .fights
            .entry(key.clone())
            .or_insert_with(|| Fight::new(now));
        fight.awaited = Some(seen);
        fight.last_foreign = now;
    }

    /// Whether `key`'s next write is the resend the origin was asked for (then no longer),
    /// and the resourceVersion the other writer left (`None`: deleted). Not once the object
    /// is quarantined: a resend asked before lands as a plain write.
    pub fn take_awaited(&mut self, key: &K) -> Option<Option<String>> {
        let fight = self.fights.get_mut(key)?;
        let awaited = fight.awaited.take()?;
        fight.quarantined_since.is_none().then_some(awaited)
    }

    /// `key` was restored at `now`, and the restore changed it: someone else really had (a
    /// restore that changes nothing answered a write that touched none of Refract's fields,
    /// such as a status, and is not counted).
    pub fn restored(&mut self, key: &K, now: Instant) -> Verdict {
        let rule = self.rule;
        let fight = self
            .fights
            .entry(key.clone())
            .or_insert_with(|| Fight::new(now));
        fight.last_foreign = now;
        while fight
            .recent
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= rule.window)
        {
            fight.recent.pop_front();
        }
        fight.recent.push_back(now);
        fight.restores = fight.restores.saturating_add(1);
        if rule.restores > 0 && fight.recent.len() > rule.restores as usize {
            fight.quarantined_since = Some(now);
            fight.recent.clear();
            return Verdict::Quarantine {
                count: fight.restores,
            };
        }
        let report = fight
            .last_report
            .is_none_or(|t| now.saturating_duration_since(t) >= rule.window);
        if report {
            fight.last_report = Some(now);
        }
        Verdict::Restore {
            count: fight.restores,
            report,
        }
    }

    /// Ends the quarantine of `key` now, as an operator asks; false when it was not
    /// quarantined. The caller restores it.
    pub fn clear(&mut self, key: &K) -> bool {
        let quarantined = self
            .fights
            .get(key)
            .is_some_and(|f| f.quarantined_since.is_some());
        if quarantined {
            self.fights.remove(key);
        }
        quarantined
    }

    /// Forgets every fight `quiet` has passed over and returns the quarantined ones among
    /// them, which the caller restores.
    pub fn release_due(&mut self, now: Instant) -> Vec<K> {
        let quiet = self.rule.quiet;
        let mut released = Vec::new();
        self.fights.retain(|key, fight| {
            let over = now.saturating_duration_since(fight.last_foreign) >= quiet;
            if over && fight.quarantined_since.is_some() {
                released.push(key.clone());
            }
            !over
        });
        released
    }

    /// When the next fight's quiet period ends, if any is kept.
    pub fn next_due(&self) -> Option<Instant> {
        self.fights
            .values()
            .map(|f| f.last_foreign + self.rule.quiet)
            .min()
    }

    /// What is known of `key`'s fight.
    pub fn view(&self, key: &K) -> Option<FightView> {
        self.fights
            .get(key)
            .filter(|f| f.restores > 0)
            .map(|f| FightView {
                restores: f.restores,
                quarantined_since: f.quarantined_since,
            })
    }

    /// The rule in force.
    pub fn rule(&self) -> FightRule {
        self.rule
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn rule() -> FightRule {
        FightRule {
            restores: 3,
            window: 60 * S,
            quiet: 300 * S,
        }
    }

    #[test]
    fn restores_are_counted_and_reported_first_then_once_a_window() {
        let mut fights = Fights::new(rule());
        let t0 = Instant::now();
        assert!(fights.foreign_write(&"cm", t0), "restore it");
        assert_eq!(fights.view(&"cm"), None, "a write alone starts no fight");
        assert_eq!(
            fights.restored(&"cm", t0),
            Verdict::Restore {
                count: 1,
                report: true
            }
        );
        assert_eq!(
            fights.restored(&"cm", t0 + 30 * S),
            Verdict::Restore {
                count: 2,
                report: false
            }
        );
        // A window has passed since the last report.
        assert_eq!(
            fights.restored(&"cm", t0 + 61 * S),
            Verdict::Restore {
                count: 3,
                report: true
            }
        );
        assert_eq!(fights.view(&"cm").unwrap().restores, 3);
        assert_eq!(fights.view(&"other"), None);
    }

    #[test]
    fn more_restores_than_allowed_in_the_window_quarantine_until_quiet() {
        let mut fights = Fights::new(rule());
        let t0 = Instant::now();
        for i in 0..3 {
            assert!(matches!(
                fights.restored(&"cm", t0 + i * S),
                Verdict::Restore { .. }
            ));
        }
        assert_eq!(
            fights.restored(&"cm", t0 + 3 * S),
            Verdict::Quarantine { count: 4 }
        );
        assert!(!fights.foreign_write(&"cm", t0 + 4 * S), "left alone");
        assert_eq!(
            fights.view(&"cm").unwrap().quarantined_since,
            Some(t0 + 3 * S)
        );
        // Each foreign write moves the release: quiet counts from the last one.
        assert_eq!(fights.next_due(), Some(t0 + 4 * S + 300 * S));
        assert!(fights.release_due(t0 + 303 * S).is_empty());
        assert_eq!(fights.release_due(t0 + 304 * S), vec!["cm"]);
        assert_eq!(fights.view(&"cm"), None, "forgotten once released");
        // A new fight starts from nothing, reported again.
        assert!(fights.foreign_write(&"cm", t0 + 400 * S));
        assert_eq!(
            fights.restored(&"cm", t0 + 400 * S),
            Verdict::Restore {
                count: 1,
                report: true
            }
        );
    }

    #[test]
    fn restores_spread_wider_than_the_window_never_quarantine() {
        let mut fights = Fights::new(rule());
        let t0 = Instant::now();
        for i in 0..20 {
            assert!(matches!(
                fights.restored(&"cm", t0 + i * 21 * S),
                Verdict::Restore { .. }
            ));
        }
    }

    #[test]
    fn a_resend_asked_for_is_awaited_once_and_forgotten_with_the_quiet() {
        let mut fights = Fights::new(rule());
        let t0 = Instant::now();
        assert_eq!(fights.take_awaited(&"cm"), None);
        fights.await_resend(&"cm", Some("7".into()), t0);
        fights.await_resend(&"cm", Some("8".into()), t0);
        assert_eq!(fights.view(&"cm"), None, "no restore yet");
        assert_eq!(
            fights.take_awaited(&"cm"),
            Some(Some("8".into())),
            "the latest"
        );
        assert_eq!(fights.take_awaited(&"cm"), None, "once");
        for i in 0..4 {
            fights.restored(&"cm", t0 + i * S);
        }
        fights.await_resend(&"cm", None, t0 + 4 * S);
        assert_eq!(
            fights.take_awaited(&"cm"),
            None,
            "quarantined: a plain write"
        );
        assert!(fights.clear(&"cm"));
        fights.await_resend(&"cm", None, t0);
        assert!(fights.release_due(t0 + 300 * S).is_empty());
        assert_eq!(fights.take_awaited(&"cm"), None, "forgotten");
    }

    #[test]
    fn a_fight_that_stops_is_forgotten_without_a_release() {
        let mut fights = Fights::new(rule());
        let t0 = Instant::now();
        fights.restored(&"cm", t0);
        assert!(fights.release_due(t0 + 300 * S).is_empty());
        assert_eq!(fights.view(&"cm"), None);
        assert_eq!(fights.next_due(), None);
    }

    #[test]
    fn an_operator_clears_a_quarantine_only() {
        let mut fights = Fights::new(rule());
        let t0 = Instant::now();
        fights.restored(&"calm", t0);
        assert!(!fights.clear(&"calm"), "not quarantined");
        assert!(fights.view(&"calm").is_some());
        for i in 0..4 {
            fights.restored(&"cm", t0 + i * S);
        }
        assert!(fights.clear(&"cm"));
        assert_eq!(fights.view(&"cm"), None);
    }

    #[test]
    fn zero_restores_never_quarantines() {
        let mut fights = Fights::new(FightRule {
            restores: 0,
            ..rule()
        });
        let t0 = Instant::now();
        for i in 0..100 {
            assert!(matches!(
                fights.restored(&"cm", t0 + i * S / 10),
                Verdict::Restore { .. }
            ));
        }
    }
}
