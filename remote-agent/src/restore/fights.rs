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
    /// Restores allowed within `window`; the next foreign write quarantines the object.
    /// 0 never quarantines.
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

/// What to do about one foreign write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Restore it. `count` is this fight's restores, this one included; `report` says whether
    /// to tell the origin (the fight's first restore, then at most once per window).
    Restore {
        /// This fight's restores, this one included.
        count: u32,
        /// Whether to tell the origin.
        report: bool,
    },
    /// Leave it: the object has just been quarantined after `count` restores. Said once.
    Quarantine {
        /// The restores before it.
        count: u32,
    },
    /// Leave it: it is quarantined already (the foreign write moves its release later).
    Quarantined,
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

    /// Someone other than the agent wrote `key` at `now`, and its copy differs from the
    /// tenant's desired state.
    pub fn record(&mut self, key: &K, now: Instant) -> Verdict {
        let rule = self.rule;
        let fight = self.fights.entry(key.clone()).or_insert_with(|| Fight {
            recent: VecDeque::new(),
            restores: 0,
            last_foreign: now,
            last_report: None,
            quarantined_since: None,
        });
        fight.last_foreign = now;
        if fight.quarantined_since.is_some() {
            return Verdict::Quarantined;
        }
        while fight
            .recent
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= rule.window)
        {
            fight.recent.pop_front();
        }
        if rule.restores > 0 && fight.recent.len() >= rule.restores as usize {
            fight.quarantined_since = Some(now);
            fight.recent.clear();
            return Verdict::Quarantine {
                count: fight.restores,
            };
        }
        fight.recent.push_back(now);
        fight.restores = fight.restores.saturating_add(1);
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
        self.fights.get(key).map(|f| FightView {
            restores: f.restores,
            quarantined_since: f.quarantined_since,
        })
    }

    /// The quarantined objects whose key `of` accepts.
    pub fn quarantined(&self, of: impl Fn(&K) -> bool) -> usize {
        self.fights
            .iter()
            .filter(|(k, f)| f.quarantined_since.is_some() && of(k))
            .count()
    }

    /// How long a quarantined object waits without a foreign write.
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
        assert_eq!(
            fights.record(&"cm", t0),
            Verdict::Restore {
                count: 1,
                report: true
            }
        );
        assert_eq!(
            fights.record(&"cm", t0 + 30 * S),
            Verdict::Restore {
                count: 2,
                report: false
            }
        );
        // The first has left the window: two in it, a third is allowed, and a window has
        // passed since the last report.
        assert_eq!(
            fights.record(&"cm", t0 + 61 * S),
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
                fights.record(&"cm", t0 + i * S),
                Verdict::Restore { .. }
            ));
        }
        assert_eq!(
            fights.record(&"cm", t0 + 3 * S),
            Verdict::Quarantine { count: 3 }
        );
        assert_eq!(fights.record(&"cm", t0 + 4 * S), Verdict::Quarantined);
        assert_eq!(
            fights.view(&"cm").unwrap().quarantined_since,
            Some(t0 + 3 * S)
        );
        assert_eq!(fights.quarantined(|_| true), 1);
        // Each foreign write moves the release: quiet counts from the last one.
        assert_eq!(fights.next_due(), Some(t0 + 4 * S + 300 * S));
        assert!(fights.release_due(t0 + 303 * S).is_empty());
        assert_eq!(fights.release_due(t0 + 304 * S), vec!["cm"]);
        assert_eq!(fights.view(&"cm"), None, "forgotten once released");
        // A new fight starts from nothing, reported again.
        assert_eq!(
            fights.record(&"cm", t0 + 400 * S),
            Verdict::Restore {
                count: 1,
                report: true
            }
        );
    }

    #[test]
    fn a_fight_that_stops_is_forgotten_without_a_release() {
        let mut fights = Fights::new(rule());
        let t0 = Instant::now();
        fights.record(&"cm", t0);
        assert!(fights.release_due(t0 + 300 * S).is_empty());
        assert_eq!(fights.view(&"cm"), None);
        assert_eq!(fights.next_due(), None);
    }

    #[test]
    fn an_operator_clears_a_quarantine_only() {
        let mut fights = Fights::new(rule());
        let t0 = Instant::now();
        fights.record(&"calm", t0);
        assert!(!fights.clear(&"calm"), "not quarantined");
        assert!(fights.view(&"calm").is_some());
        for i in 0..4 {
            fights.record(&"cm", t0 + i * S);
        }
        assert!(fights.clear(&"cm"));
        assert_eq!(fights.view(&"cm"), None);
        assert_eq!(fights.quarantined(|_| true), 0);
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
                fights.record(&"cm", t0 + i * S / 10),
                Verdict::Restore { .. }
            ));
        }
    }
}
