//! The settings files (`--reflection-config`, `--offloading-patch`), followed while the agent
//! runs. A valid change is in force within a poll: every reflected object and offloaded pod is
//! forged again with it, worker pools are resized, provider events are judged by the new
//! policy, and the virtual node offers the new share at once. A file that cannot be read or
//! parsed is refused whole, and the last good settings stay in force.
//!
//! Every kind is turned on and off at once (workers from or to 0), custom kinds named or
//! dropped included: a kind off when the agent started gets its reflector the first time it is
//! turned on. Turned off, ConfigMaps, Secrets, Ingresses and custom kinds stop their reflector
//! and their copies are withdrawn; Services, EndpointSlices and claims, whose watches other
//! parts read, keep theirs, which withdraws their copies (a claim's stays, its volume holds
//! data) and sends them anew when turned on again (see `reflect::start`).

mod changes;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use refract_core::options::ReflectionOptions;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::{ReflectionFlags, Settings};
pub use changes::{describe, forged_differently};

/// How often the files are read again.
pub const POLL: Duration = Duration::from_secs(1);

/// The reflection options in force, changed when a followed file changes.
#[derive(Clone)]
pub struct LiveOptions(watch::Receiver<Arc<ReflectionOptions>>);

impl LiveOptions {
    /// The options in force now: read them once per piece of work, so that one object is
    /// forged with one version of them.
    pub fn current(&self) -> Arc<ReflectionOptions> {
        self.0.borrow().clone()
    }

    /// Resolves with the options each time they change from now on (never, for fixed ones).
    pub fn changes(&self) -> watch::Receiver<Arc<ReflectionOptions>> {
        let mut rx = self.0.clone();
        rx.mark_unchanged();
        rx
    }
}

/// Where the settings come from: the flags, which name the files.
pub struct Sources {
    /// The reflection flags (the files, and flags that win over them).
    pub flags: ReflectionFlags,
    /// The origin's cluster id.
    pub local: String,
    /// The provider's cluster id.
    pub remote: String,
    /// `--sharing-percentage`, which wins over the file.
    pub sharing_flag: Option<u32>,
    /// The virtual node's name.
    pub virtual_node: String,
}

impl Sources {
    /// Reads the files and flags now.
    pub fn read(&self) -> anyhow::Result<Settings> {
        let mut settings = self
            .flags
            .settings(&self.local, &self.remote, self.sharing_flag)?;
        settings.options.virtual_node = self.virtual_node.clone();
        Ok(settings)
    }

    /// The files followed (none when neither is named: nothing then changes at run time).
    fn files(&self) -> Vec<PathBuf> {
        [&self.flags.reflection_config, &self.flags.offloading_patch]
            .into_iter()
            .flatten()
            .cloned()
            .collect()
    }

    /// The files' texts now, to tell whether any changed (an unreadable one as its error).
    fn fingerprint(&self) -> Vec<Result<String, String>> {
        self.files()
            .iter()
            .map(|path| std::fs::read_to_string(path).map_err(|e| e.to_string()))
            .collect()
    }
}

/// The settings' metrics, registered under `refract_local_settings_`.
#[derive(Clone, Default)]
pub struct SettingsMetrics {
    /// 0 while the files on disk are refused (the last good settings are in force), else 1.
    pub valid: Gauge,
    /// Changes put in force since the agent started.
    pub reloads: Counter,
}

/// The settings in force, each changing as the files do.
pub struct Followed {
    /// What is reflected and how.
    pub options: LiveOptions,
    /// The virtual node's share of the provider's free resources, in percent.
    pub sharing_percentage: watch::Receiver<u32>,
}

/// Starts following the files `sources` names, from `initial` (what they said at start),
/// until `shutdown`.
pub fn follow(
    sources: Sources,
    initial: Settings,
    metrics: SettingsMetrics,
    shutdown: CancellationToken,
) -> Followed {
    let (options_tx, options_rx) = watch::channel(Arc::new(initial.options.clone()));
    let (sharing_tx, sharing_rx) = watch::channel(initial.sharing_percentage);
    metrics.valid.set(1);
    let files = sources.files();
    if files.is_empty() {
        return Followed {
            options: LiveOptions(options_rx),
            sharing_percentage: sharing_rx,
        };
    }
    tokio::spawn(async move {
        let mut in_force = initial;
        let mut last_seen = sources.fingerprint();
        // Said once per distinct problem, not every poll.
        let mut last_error = String::new();
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let seen = sources.fingerprint();
            if seen == last_seen {
                continue;
            }
            let read = match sources.read() {
                Ok(read) => read,
                Err(error) => {
                    let error = format!("{error:#}");
                    metrics.valid.set(0);
                    if error != last_error {
                        tracing::error!(%error, "settings file refused; the last good settings stay in force");
                        last_error = error;
                    }
                    continue;
                }
            };
            last_seen = seen;
            last_error.clear();
            metrics.valid.set(1);
            let next = read;
            let changed = describe(&in_force, &next);
            if changed.is_empty() {
                continue;
            }
            tracing::info!(files = ?files, changed = %changed.join("; "), "settings changed; in force from now on");
            metrics.reloads.inc();
            if next.options != in_force.options {
                options_tx.send_replace(Arc::new(next.options.clone()));
            }
            sharing_tx.send_if_modified(|p| {
                let changed = *p != next.sharing_percentage;
                *p = next.sharing_percentage;
                changed
            });
            in_force = next;
        }
    });
    Followed {
        options: LiveOptions(options_rx),
        sharing_percentage: sharing_rx,
    }
}
