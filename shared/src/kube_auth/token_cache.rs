//! TokenReview answers reused for a while, and failed authentications bounded per source, as
//! a kubelet's webhook authenticator does: without it, anyone who reaches an agent's
//! authenticated port (the virtual node's kubelet API, the admin endpoint) makes the cluster's
//! API server review one token per request, unbounded.
//!
//! Answers are kept by a hash of the token (never the token): an accepted token for
//! [`ACCEPTED_TTL`] (a kubelet's default), a refused one for [`REFUSED_TTL`]. A source address
//! with [`MAX_FAILURES`] failed authentications within [`FAILURE_WINDOW`] is answered 429 without
//! a review until the window passes. What the API server could not answer is never kept.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use refract_core::hash::bytes_hash;
use refract_core::lock::Locked;

use super::{review_token, AuthError, User};

/// How long an accepted token's user is reused.
pub const ACCEPTED_TTL: Duration = Duration::from_secs(120);
/// How long a refused token is answered without asking again.
pub const REFUSED_TTL: Duration = Duration::from_secs(10);
/// Failed authentications one source may have within [`FAILURE_WINDOW`].
pub const MAX_FAILURES: u32 = 20;
/// The window failed authentications are counted in.
pub const FAILURE_WINDOW: Duration = Duration::from_secs(10);
/// Answers (and sources) remembered at most; expired ones go first, then the oldest.
const MAX_ENTRIES: usize = 4096;

/// Reviews bearer tokens with the cluster, reusing recent answers.
#[derive(Default)]
pub struct TokenCache {
    memo: Mutex<Memo>,
}

impl TokenCache {
    /// The user of the bearer token in `authorization` (an `Authorization` header's value),
    /// sent from `source`.
    pub async fn bearer_user(
        &self,
        client: &kube::Client,
        authorization: Option<&str>,
        source: IpAddr,
    ) -> Result<User, AuthError> {
        let token = super::bearer(authorization).ok_or(AuthError::Anonymous)?;
        self.review(client, token, source).await
    }

    /// The user of `token`, sent from `source`.
    pub async fn review(
        &self,
        client: &kube::Client,
        token: &str,
        source: IpAddr,
    ) -> Result<User, AuthError> {
        let key = bytes_hash(token.as_bytes());
        let cached = {
            let mut memo = self.memo.locked();
            let now = Instant::now();
            if memo.throttled(source, now) {
                return Err(AuthError::TooManyFailures);
            }
            memo.cached(&key, now)
        };
        let answer = match cached {
            Some(answer) => answer.map_err(AuthError::BadToken),
            None => {
                let answer = review_token(client, token).await;
                let kept = match &answer {
                    Ok(user) => Some(Ok(user.clone())),
                    Err(AuthError::BadToken(reason)) => Some(Err(reason.clone())),
                    Err(_) => None,
                };
                if let Some(kept) = kept {
                    self.memo.locked().remember(key, kept, Instant::now());
                }
                answer
            }
        };
        if matches!(answer, Err(AuthError::BadToken(_))) {
            self.memo.locked().failed(source, Instant::now());
        }
        answer
    }
}

/// Whether an answer given at `at` may still be reused at `now`.
fn fresh(at: Instant, answer: &Result<User, String>, now: Instant) -> bool {
    let ttl = if answer.is_ok() {
        ACCEPTED_TTL
    } else {
        REFUSED_TTL
    };
    now.duration_since(at) < ttl
}

/// The answers and failure counts, with the clock passed in.
#[derive(Default)]
struct Memo {
    answers: HashMap<String, (Instant, Result<User, String>)>,
    failures: HashMap<IpAddr, (Instant, u32)>,
}

impl Memo {
    /// The kept answer for the token hashed `key`, if still fresh.
    fn cached(&mut self, key: &str, now: Instant) -> Option<Result<User, String>> {
        let (at, answer) = self.answers.get(key)?;
        if fresh(*at, answer, now) {
            return Some(answer.clone());
        }
        self.answers.remove(key);
        None
    }

    fn remember(&mut self, key: String, answer: Result<User, String>, now: Instant) {
        if self.answers.len() >= MAX_ENTRIES {
            self.answers.retain(|_, (at, a)| fresh(*at, a, now));
            if self.answers.len() >= MAX_ENTRIES {
                if let Some(oldest) = self
                    .answers
                    .iter()
                    .min_by_key(|(_, (at, _))| *at)
                    .map(|(k, _)| k.clone())
                {
                    self.answers.remove(&oldest);
                }
            }
        }
        self.answers.insert(key, (now, answer));
    }

    /// Counts a failed authentication from `source`.
    fn failed(&mut self, source: IpAddr, now: Instant) {
        if self.failures.len() >= MAX_ENTRIES && !self.failures.contains_key(&source) {
            self.failures
                .retain(|_, (since, _)| now.duration_since(*since) < FAILURE_WINDOW);
            if self.failures.len() >= MAX_ENTRIES {
                return;
            }
        }
        let entry = self.failures.entry(source).or_insert((now, 0));
        if now.duration_since(entry.0) >= FAILURE_WINDOW {
            *entry = (now, 0);
        }
        entry.1 = entry.1.saturating_add(1);
    }

    /// Whether `source` has failed too often in the current window.
    fn throttled(&self, source: IpAddr, now: Instant) -> bool {
        self.failures.get(&source).is_some_and(|(since, count)| {
            now.duration_since(*since) < FAILURE_WINDOW && *count >= MAX_FAILURES
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user() -> User {
        User {
            name: "alice".into(),
            ..Default::default()
        }
    }

    #[test]
    fn accepted_and_refused_answers_are_reused_for_their_ttl_only() {
        let mut memo = Memo::default();
        let t = Instant::now();
        memo.remember("good".into(), Ok(user()), t);
        memo.remember("bad".into(), Err("expired".into()), t);
        assert!(memo.cached("good", t + ACCEPTED_TTL / 2).unwrap().is_ok());
        assert_eq!(
            memo.cached("bad", t + REFUSED_TTL / 2),
            Some(Err("expired".into()))
        );
        assert!(memo.cached("bad", t + REFUSED_TTL).is_none(), "asked again");
        assert!(memo.cached("good", t + ACCEPTED_TTL).is_none());
        assert!(memo.cached("unknown", t).is_none());
    }

    #[test]
    fn a_source_that_keeps_failing_is_turned_away_until_its_window_passes() {
        let mut memo = Memo::default();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let t = Instant::now();
        for _ in 0..MAX_FAILURES {
            assert!(!memo.throttled(a, t));
            memo.failed(a, t);
        }
        assert!(memo.throttled(a, t));
        assert!(!memo.throttled(b, t), "another source is not held back");
        assert!(!memo.throttled(a, t + FAILURE_WINDOW));
        memo.failed(a, t + FAILURE_WINDOW);
        assert!(!memo.throttled(a, t + FAILURE_WINDOW), "a new window");
    }

    #[test]
    fn the_memory_is_bounded() {
        let mut memo = Memo::default();
        let t = Instant::now();
        for i in 0..MAX_ENTRIES + 10 {
            memo.remember(
                i.to_string(),
                Ok(user()),
                t + Duration::from_micros(i as u64),
            );
        }
        assert_eq!(memo.answers.len(), MAX_ENTRIES);
        assert!(memo.cached("0", t).is_none(), "the oldest went first");
    }
}
