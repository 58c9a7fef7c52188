//! ServiceAccount tokens for offloaded pods.
//!
//! For every offloaded pod that mounts projected ServiceAccount tokens, the agent asks the
//! origin's TokenRequest API for tokens bound to that pod (audience and lifetime as the pod's
//! volume asks) and sends them as the pod's token Secret, which the provider mounts in place of
//! the projected tokens (see `refract_core::forge::token`). A token is renewed once
//! `--token-refresh-percentage` of its lifetime has passed; the Secret is deleted when the pod
//! goes (and the provider also removes it with the pod's ShadowPod). Tokens are kept in memory
//! only; the origin API server invalidates them when the pod is deleted.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, PostParams};
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::reflector::{ObjectRef as StoreRef, Store};
use kube::{Resource, ResourceExt};
use refract_core::forge::token::{
    origin_tokens, requested_lifetime, service_account_of, token_secret, token_secret_name,
    token_sources, TokenSource,
};
use refract_core::forge::Context;
use refract_core::json;
use refract_core::lock::Locked;
use refract_core::options::ReflectionOptions;
use refract_wire::proto::{ObjectRef, Outcome, Upsert};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::extension::Extension;
use crate::key::Key;
use crate::link::SessionTx;
use crate::outbox::{Answer, Origin, Outbox, Producer, Recipient, Request};
use crate::pods::OriginPod;
use crate::recorder::publish_event;
use crate::reflect::queue::{Claimed, WorkQueue};
use crate::settings::LiveOptions;

/// Longest wait before a refused or failed token Secret is tried again.
const MAX_RETRY: Duration = Duration::from_secs(60);

/// Settings of token reflection.
#[derive(Clone)]
pub struct TokenConfig {
    /// The pods bound to the virtual node, as the pod offloader's watch sees them; the
    /// offloader tells the token reflector of each change ([`TokenReflector::pod_changed`]).
    pub pods: Store<OriginPod>,
    /// Renew a token once this share (percent) of its lifetime has passed.
    pub refresh_percentage: u32,
}

/// A token issued by the origin.
#[derive(Clone)]
struct Issued {
    token: String,
    audience: Option<String>,
    expiration_seconds: i64,
    expires: SystemTime,
    refresh_at: SystemTime,
}

#[derive(Default)]
struct PodTokens {
    uid: String,
    tokens: BTreeMap<String, Issued>,
}

#[derive(Default)]
struct State {
    cache: HashMap<Key, PodTokens>,
    failures: HashMap<Key, u32>,
    /// Pods already told that their API server address is the provider's: the UID told.
    warned_home: HashMap<Key, String>,
}

/// The reason of the Warning event on an offloaded pod whose API server address is still the
/// provider's.
pub const HOME_API_SERVER_UNSET_REASON: &str = "HomeAPIServerUnset";

/// Reflects offloaded pods' ServiceAccount tokens.
pub struct TokenReflector {
    client: kube::Client,
    config: TokenConfig,
    options: LiveOptions,
    extension: watch::Receiver<Extension>,
    recorder: Recorder,
    pods: Store<OriginPod>,
    queue: WorkQueue<Key>,
    /// What the current session was sent, shared with every producer.
    outbox: Outbox,
    state: Mutex<State>,
}

/// Starts token reflection (nothing when API server support is off).
pub fn spawn(
    client: kube::Client,
    config: TokenConfig,
    options: LiveOptions,
    extension: watch::Receiver<Extension>,
    recorder: Recorder,
    outbox: &Outbox,
    shutdown: CancellationToken,
) -> Option<Arc<TokenReflector>> {
    if !options.current().api_server.enabled {
        tracing::info!("API server support disabled: no ServiceAccount tokens are reflected");
        return None;
    }
    let pods = config.pods.clone();
    let r = Arc::new(TokenReflector {
        client: client.clone(),
        config: config.clone(),
        options,
        extension,
        recorder,
        pods,
        queue: WorkQueue::new(),
        outbox: outbox.clone(),
        state: Mutex::new(State::default()),
    });
    outbox.register(Producer::Tokens, r.clone());
    let worker = {
        let r = r.clone();
        async move {
            loop {
                let key = r.queue.next().await;
                r.reconcile(&key).await;
                drop(key);
            }
        }
    };
    let follow = {
        let r = r.clone();
        async move { r.follow_extension().await }
    };
    tokio::spawn(async move {
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = worker => {}
            _ = follow => {}
        }
    });
    Some(r)
}

fn origin(key: &Key) -> Origin {
    Origin::new(Producer::Tokens, key.clone())
}

fn key_of(pod: &OriginPod) -> Key {
    Key {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
    }
}

impl TokenReflector {
    /// A pod on the virtual node changed (or went): its token Secret is checked.
    pub fn pod_changed(&self, pod: &OriginPod) {
        self.queue.add(key_of(pod));
    }

    /// On a new session or a change of extended namespaces, re-checks every pod: the provider
    /// may lack what the previous session sent.
    async fn follow_extension(&self) {
        let mut rx = self.extension.clone();
        loop {
            rx.borrow_and_update();
            // Not `wait_until_ready`: the store is the pod offloader's, which waits on it, and
            // kube-runtime wakes only the last of two tasks waiting for a store's first listing.
            // Pods not listed yet reach this reflector as the offloader's watch sees them.
            for pod in self.pods.state() {
                self.queue.add(key_of(&pod));
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    async fn reconcile(&self, claim: &Claimed<Key>) {
        let key: &Key = claim;
        let extension = self.extension.borrow().clone();
        let Some(session) = extension.session.as_ref() else {
            return;
        };
        let kept = self
            .pods
            .get(&StoreRef::new(&key.name).within(&key.namespace));
        // Not expected (the API server sent it); the Secret stays as it is rather than go.
        let pod = match kept.map(|kept| kept.pod()).transpose() {
            Ok(pod) => pod,
            Err(error) => {
                tracing::warn!(namespace = %key.namespace, pod = %key.name, %error, "cannot check the pod's ServiceAccount tokens");
                return;
            }
        };
        let remote_ns = extension.namespaces.get(&key.namespace);
        let wanted = match (&pod, remote_ns) {
            (Some(pod), Some(remote_ns)) if pod.metadata.deletion_timestamp.is_none() => {
                let options = self.options.current();
                let ctx = context(&options, remote_ns);
                let sources = token_sources(pod);
                (origin_tokens(pod, &ctx) && !sources.is_empty())
                    .then(|| (pod.clone(), remote_ns.clone(), sources))
            }
            _ => None,
        };
        let Some((pod, remote_ns, sources)) = wanted else {
            self.remove(session, key).await;
            return;
        };
        let tokens = match self.tokens_for(key, &pod, &sources).await {
            Ok(t) => t,
            Err(error) => {
                let message =
                    format!("failed to request ServiceAccount tokens for the provider: {error}");
                tracing::warn!(namespace = %key.namespace, pod = %key.name, %message);
                publish_event(
                    &self.recorder,
                    pod.object_ref(&()),
                    EventType::Warning,
                    "FailedSATokensReflection",
                    message,
                )
                .await;
                self.retry_later(key.clone());
                return;
            }
        };
        let options = self.options.current();
        let ctx = context(&options, &remote_ns);
        let values: BTreeMap<String, String> = tokens
            .iter()
            .map(|(k, t)| (k.clone(), t.token.clone()))
            .collect();
        let earliest = tokens.values().map(|t| t.expires).min();
        let refresh = tokens.values().map(|t| t.refresh_at).min();
        let expiration = earliest.map(rfc3339).unwrap_or_default();
        let secret = token_secret(&pod, &values, &expiration, &ctx);
        let remote = ObjectRef {
            api_version: "v1".into(),
            kind: "Secret".into(),
            namespace: remote_ns.clone(),
            name: token_secret_name(&key.name),
        };
        let upsert = Upsert {
            object: Some(remote),
            revision: pod.resource_version().unwrap_or_default(),
            object_json: json::to_vec(&secret),
            origin_uid: pod.uid().unwrap_or_default(),
            awaited: false,
            trace_parent: String::new(),
        };
        self.outbox
            .upsert(session, origin(key), upsert, claim.noticed())
            .await;
        self.warn_without_home_api_server(key, &pod).await;
        if let Some(at) = refresh {
            let wait = at.duration_since(SystemTime::now()).unwrap_or_default();
            self.queue.add_after(key.clone(), wait);
        }
    }

    /// The pod's tokens, renewing those past their refresh time.
    async fn tokens_for(
        &self,
        key: &Key,
        pod: &Pod,
        sources: &[TokenSource],
    ) -> Result<BTreeMap<String, Issued>, kube::Error> {
        let uid = pod.uid().unwrap_or_default();
        let mut current = {
            let mut s = self.state.locked();
            let cached = s.cache.remove(key).unwrap_or_default();
            if cached.uid == uid {
                cached.tokens
            } else {
                BTreeMap::new() // a new pod of the same name: nothing of the old one is valid
            }
        };
        let now = SystemTime::now();
        let mut tokens = BTreeMap::new();
        let mut result = Ok(());
        for source in sources {
            let reusable = current.remove(&source.key).filter(|t| {
                t.refresh_at > now
                    && t.audience == source.audience
                    && t.expiration_seconds == source.expiration_seconds
            });
            let issued = match reusable {
                Some(t) => t,
                None => match self.request(pod, source).await {
                    Ok(t) => t,
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                },
            };
            tokens.insert(source.key.clone(), issued);
        }
        self.state.locked().cache.insert(
            key.clone(),
            PodTokens {
                uid,
                tokens: tokens.clone(),
            },
        );
        result.map(|()| tokens)
    }

    async fn request(&self, pod: &Pod, source: &TokenSource) -> Result<Issued, kube::Error> {
        let api: Api<ServiceAccount> =
            Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: source.audience.clone().into_iter().collect(),
                expiration_seconds: Some(requested_lifetime(source.expiration_seconds)),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: pod.metadata.name.clone(),
                    uid: pod.metadata.uid.clone(),
                }),
            },
            ..Default::default()
        };
        let issued_at = SystemTime::now();
        let answer = api
            .create_token_request(&service_account_of(pod), &PostParams::default(), &request)
            .await?;
        let Some(status) = answer.status else {
            return Err(kube::Error::Service(
                "the API server answered a TokenRequest without a token".into(),
            ));
        };
        let expires = SystemTime::UNIX_EPOCH
            + Duration::from_secs(status.expiration_timestamp.0.as_second().max(0) as u64);
        let lifetime = expires.duration_since(issued_at).unwrap_or_default();
        let refresh_at = issued_at + lifetime * self.config.refresh_percentage.min(100) / 100;
        tracing::debug!(namespace = %pod.namespace().unwrap_or_default(), pod = %pod.name_any(), key = %source.key, ?lifetime, "requested a ServiceAccount token");
        Ok(Issued {
            token: status.token,
            audience: source.audience.clone(),
            expiration_seconds: source.expiration_seconds,
            expires,
            refresh_at,
        })
    }

    /// Deletes the pod's token Secret if this session sent one, and forgets its tokens.
    /// Without `--home-api-server-host/--home-api-server-port` an offloaded pod gets origin
    /// tokens while its `KUBERNETES_SERVICE_*` still name the provider's API server, which
    /// refuses them: said once per pod, on the pod, where its owner looks.
    async fn warn_without_home_api_server(&self, key: &Key, pod: &Pod) {
        if self.options.current().api_server.address().is_some() {
            return;
        }
        let uid = pod.uid().unwrap_or_default();
        let first = {
            let mut s = self.state.locked();
            s.warned_home.insert(key.clone(), uid.clone()) != Some(uid)
        };
        if first {
            publish_event(
                &self.recorder,
                pod.object_ref(&()),
                EventType::Warning,
                HOME_API_SERVER_UNSET_REASON,
                "the pod gets tokens of the origin cluster, but its KUBERNETES_SERVICE_HOST/PORT still name the provider's API server, which refuses them; set the local agent's --home-api-server-host and --home-api-server-port (or annotate the pod liqo.io/api-server-support: disabled, or remote to use a provider ServiceAccount the provider's policy allows)".into(),
            )
            .await;
        }
    }

    async fn remove(&self, session: &SessionTx, key: &Key) {
        {
            let mut s = self.state.locked();
            s.cache.remove(key);
            s.failures.remove(key);
            s.warned_home.remove(key);
        }
        self.outbox.delete(session, &origin(key), None).await;
    }

    fn retry_later(&self, key: Key) {
        let failures = {
            let mut s = self.state.locked();
            let n = s.failures.entry(key.clone()).or_default();
            *n += 1;
            *n
        };
        let delay = Duration::from_secs(1 << failures.min(6)).min(MAX_RETRY);
        self.queue.add_after(key, delay);
    }
}

/// What the forge of a token Secret reads.
fn context<'a>(options: &'a ReflectionOptions, remote_ns: &'a str) -> Context<'a> {
    Context {
        options,
        remote_namespace: remote_ns,
        service: None,
        nodes: &refract_core::forge::NO_NODES,
    }
}

impl Recipient for TokenReflector {
    fn on_answer(&self, answer: Answer) {
        if answer.request != Request::Upsert {
            return;
        }
        let key = answer.origin.key;
        if matches!(answer.outcome, Outcome::Applied | Outcome::Unchanged) {
            self.state.locked().failures.remove(&key);
            return;
        }
        if matches!(answer.outcome, Outcome::Drifted | Outcome::Quarantined) {
            // Said of the copy, which the remote agent keeps whole and restored (or leaves to
            // the writer it fights): nothing to send again.
            tracing::warn!(namespace = %key.namespace, pod = %key.name, outcome = answer.outcome.label(), message = %answer.message, "someone on the provider rewrote the pod's token Secret");
            return;
        }
        // The ShadowPod may not be there yet, or was refused: send it again later, spaced out.
        self.outbox.forget(&origin(&key));
        tracing::info!(namespace = %key.namespace, pod = %key.name, outcome = answer.outcome.as_str_name(), message = %answer.message, "token Secret not applied; retrying later");
        self.retry_later(key);
    }
}

fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs() as i64;
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .map(|t| t.to_string())
        .unwrap_or_default()
}
