//! Tenants' objects on the provider, as one watch per kind sees them.
//!
//! Every object the remote agent writes carries the destination label; one metadata-only watch
//! per allowed kind over that label keeps a store the applier reads before writing (an object
//! already holding the desired state costs no request at all, one that differs costs one
//! apply), and forwards each change to [`crate::restore`], which repairs copies edited or
//! deleted on the provider. Metadata is all either needs (labels, the desired-state hash,
//! resourceVersion), and it keeps both the API server's work and the agent's memory small:
//! the store keeps only what is read back of it ([`kept`]).

mod kept;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use refract_core::keys::{DESTINATION_LABEL, ORIGIN_LABEL, TENANT_NAMESPACE_LABEL};
use refract_core::lock::{Locked, RwLocked};
use refract_shared::tls::ClusterId;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::kinds::Allowed;
use crate::quota::Footprint;
use kept::Kept;

/// A tenant object's metadata.
pub type Meta = PartialObjectMeta<DynamicObject>;

/// A change of a tenant object seen by the watch.
pub type Change = (Allowed, watcher::Event<Meta>);

/// One kind's objects: by namespace (empty for namespaces), then by name.
type Names = HashMap<Box<str>, HashMap<Box<str>, Kept>>;

/// What the watch of one kind has seen.
struct KindStore {
    objects: RwLock<Names>,
    /// What each tenant's objects of the kind count for against its quota, added up.
    usage: RwLock<HashMap<Box<str>, Footprint>>,
    /// The watch has listed at least once.
    listed: AtomicBool,
    /// Counts the store's changes, for readers that follow it.
    changed: tokio::sync::watch::Sender<u64>,
}

impl KindStore {
    /// The object `namespace/name`, if the watch has it.
    fn get(&self, namespace: &str, name: &str) -> Option<Meta> {
        let objects = self.objects.read_locked();
        let kept = objects.get(namespace)?.get(name)?;
        Some(kept.meta(namespace, name))
    }
}

impl Default for KindStore {
    fn default() -> Self {
        Self {
            objects: RwLock::default(),
            usage: RwLock::default(),
            listed: AtomicBool::default(),
            changed: tokio::sync::watch::channel(0).0,
        }
    }
}

/// Every watched kind's store.
type Stores = BTreeMap<Allowed, Arc<KindStore>>;

/// Read access to the watched tenant objects; clones share the stores.
#[derive(Clone)]
pub struct TenantObjects {
    /// Grows when the followed policy names a custom kind ([`TenantObjects::watch_kind`]).
    stores: Arc<RwLock<Stores>>,
    /// What watching one more kind needs (none in tests that watch nothing).
    watching: Option<Arc<Watching>>,
}

/// What a kind's watch needs.
struct Watching {
    client: kube::Client,
    /// The label selector's destination: this provider.
    provider: ClusterId,
    keeps_managed_fields: fn(Allowed) -> bool,
    changes: mpsc::Sender<Change>,
    shutdown: CancellationToken,
}

impl TenantObjects {
    /// The store of `kind`, if it is watched.
    fn store(&self, kind: Allowed) -> Option<Arc<KindStore>> {
        self.stores.read_locked().get(&kind).cloned()
    }

    /// Every watched kind's store, as they are now.
    fn all_stores(&self) -> Vec<(Allowed, Arc<KindStore>)> {
        let stores = self.stores.read_locked();
        stores.iter().map(|(k, s)| (*k, s.clone())).collect()
    }

    /// Starts watching `kind` (a custom kind the followed policy names since the agent
    /// started); nothing when it is watched already. Its objects are in the store once the
    /// watch lists them.
    pub fn watch_kind(&self, kind: Allowed) {
        let Some(watching) = &self.watching else {
            return;
        };
        let store = {
            let mut stores = self.stores.write_locked();
            if stores.contains_key(&kind) {
                return;
            }
            let store = Arc::new(KindStore::default());
            stores.insert(kind, store.clone());
            store
        };
        watching.spawn(kind, store);
    }

    /// The object `kind` `namespace/name` (namespace empty for namespaces), if the watch has it.
    pub fn get(&self, kind: Allowed, namespace: &str, name: &str) -> Option<Meta> {
        self.store(kind)?.get(namespace, name)
    }

    /// Whether the watch has the namespace `name`, labelled `key` = `value` and not being
    /// deleted. Read in place: every request of a tenant checks its namespace, and rebuilding
    /// the namespace's metadata for it showed in a profile.
    pub fn has_live_namespace(&self, name: &str, key: &str, value: &str) -> bool {
        self.namespace_is(name, |kept| {
            kept.label(key) == Some(value) && !kept.deleting()
        })
    }

    /// Whether the watch has the namespace `name` and it is being deleted.
    pub fn namespace_terminating(&self, name: &str) -> bool {
        self.namespace_is(name, Kept::deleting)
    }

    /// Whether the watch has the namespace `name` and `test` holds for it, read in place.
    fn namespace_is(&self, name: &str, test: impl Fn(&Kept) -> bool) -> bool {
        let Some(store) = self.store(Allowed::Namespace) else {
            return false;
        };
        let objects = store.objects.read_locked();
        objects
            .get("")
            .and_then(|names| names.get(name))
            .is_some_and(test)
    }

    /// Every live tenant namespace the watch has, with the tenant it is labelled for.
    pub fn tenant_namespaces(&self) -> BTreeMap<String, ClusterId> {
        let Some(store) = self.store(Allowed::Namespace) else {
            return BTreeMap::new();
        };
        let objects = store.objects.read_locked();
        objects
            .get("")
            .into_iter()
            .flatten()
            .filter(|(_, kept)| !kept.deleting())
            .filter_map(|(name, kept)| {
                let tenant = ClusterId::parse(kept.label(TENANT_NAMESPACE_LABEL)?).ok()?;
                Some((name.to_string(), tenant))
            })
            .collect()
    }

    /// Returns once the namespaces' watch has listed.
    pub async fn namespaces_listed(&self) {
        let Some(store) = self.store(Allowed::Namespace) else {
            return;
        };
        let mut changed = store.changed.subscribe();
        while !store.listed.load(Ordering::Acquire) {
            if changed.changed().await.is_err() {
                return;
            }
        }
    }

    /// Changes whenever the store of `kind` changes.
    pub fn follow(&self, kind: Allowed) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.store(kind)?.changed.subscribe())
    }

    /// Every object of `tenant` (by its origin label) in every kind's store, once each has
    /// listed; `None` if some store has not listed within `within` (an agent just started, or
    /// the ShadowPod CRD missing). A custom kind's store that has not listed (its CRD missing
    /// on this provider) is left out rather than waited for: the tenant then sends every object
    /// of that kind, as for a bucket the provider does not hold, which costs answers but never
    /// a wrong deletion.
    pub async fn snapshot_of(
        &self,
        tenant: &ClusterId,
        within: std::time::Duration,
    ) -> Option<Vec<(Allowed, Meta)>> {
        let listed = |(kind, store): &(Allowed, Arc<KindStore>)| {
            store.listed.load(Ordering::Acquire)
                || matches!(
                    kind,
                    Allowed::Reflected(refract_core::options::Kind::Custom(_))
                )
        };
        let deadline = tokio::time::Instant::now() + within;
        while !self.all_stores().iter().all(listed) {
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let mut all = Vec::new();
        for (kind, store) in self.all_stores() {
            if !store.listed.load(Ordering::Acquire) {
                continue;
            }
            let objects = store.objects.read_locked();
            for (namespace, names) in objects.iter() {
                let of_tenant = names
                    .iter()
                    .filter(|(_, kept)| kept.label(ORIGIN_LABEL) == Some(tenant.as_str()));
                all.extend(of_tenant.map(|(name, kept)| (kind, kept.meta(namespace, name))));
            }
        }
        Some(all)
    }

    /// What `tenant`'s objects on the provider count for against its quota, all kinds together.
    pub fn usage(&self, tenant: &ClusterId) -> Footprint {
        let mut total = Footprint::default();
        for (_, store) in self.all_stores() {
            if let Some(fp) = store.usage.read_locked().get(tenant.as_str()) {
                total.add(fp);
            }
        }
        total
    }

    /// Every tenant holding anything, with what it holds counts for.
    pub fn usage_by_tenant(&self) -> BTreeMap<String, Footprint> {
        let mut all: BTreeMap<String, Footprint> = BTreeMap::new();
        for (_, store) in self.all_stores() {
            for (tenant, fp) in store.usage.read_locked().iter() {
                all.entry(tenant.to_string()).or_default().add(fp);
            }
        }
        all
    }

    /// What the object `kind` `namespace/name` counts for now, as the watch has it.
    pub fn footprint(&self, kind: Allowed, namespace: &str, name: &str) -> Footprint {
        let Some(store) = self.store(kind) else {
            return Footprint::default();
        };
        let objects = store.objects.read_locked();
        objects
            .get(namespace)
            .and_then(|names| names.get(name))
            .and_then(|kept| kept.footprint(kind))
            .map(|(_, fp)| fp)
            .unwrap_or_default()
    }

    /// No stores at all: every lookup misses (tests of the write path against a mocked API).
    #[cfg(test)]
    pub fn none() -> Self {
        Self {
            stores: Arc::default(),
            watching: None,
        }
    }
}

/// Keeps one kind's store as its watch reports changes.
struct StoreWriter {
    /// The kind watched.
    kind: Allowed,
    store: Arc<KindStore>,
    /// Whether the kind's objects are written without server-side apply (see `apply::merge`):
    /// then the agent's own managedFields say which keys are its own, and are kept.
    own_fields: bool,
    /// A listing under way: replaces the store when complete, so objects deleted while the
    /// watch was down go.
    relisting: Option<Names>,
}

impl StoreWriter {
    fn apply(&mut self, event: &watcher::Event<Meta>) {
        self.keep(event);
        if !matches!(event, watcher::Event::Init | watcher::Event::InitApply(_)) {
            // What a listing gathers shows when it is complete.
            self.store.changed.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    fn keep(&mut self, event: &watcher::Event<Meta>) {
        match event {
            watcher::Event::Init => self.relisting = Some(Names::new()),
            watcher::Event::InitApply(obj) => {
                let kept = Kept::of(&obj.metadata, self.own_fields);
                if let Some(names) = self.relisting.as_mut() {
                    insert(names, obj, kept);
                }
            }
            watcher::Event::InitDone => {
                if let Some(names) = self.relisting.take() {
                    let mut usage = HashMap::new();
                    for kept in names.values().flat_map(HashMap::values) {
                        count(&mut usage, self.kind, kept, Footprint::add);
                    }
                    *self.store.objects.write_locked() = names;
                    *self.store.usage.write_locked() = usage;
                }
                self.store.listed.store(true, Ordering::Release);
            }
            watcher::Event::Apply(obj) => {
                let kept = Kept::of(&obj.metadata, self.own_fields);
                let new = kept
                    .footprint(self.kind)
                    .map(|(t, fp)| (Box::<str>::from(t), fp));
                let old = insert(&mut self.store.objects.write_locked(), obj, kept);
                let mut usage = self.store.usage.write_locked();
                if let Some(old) = old {
                    count(&mut usage, self.kind, &old, Footprint::subtract);
                }
                if let Some((tenant, fp)) = new {
                    usage.entry(tenant).or_default().add(&fp);
                }
            }
            watcher::Event::Delete(obj) => {
                let mut objects = self.store.objects.write_locked();
                let namespace = obj.namespace().unwrap_or_default();
                if let Some(names) = objects.get_mut(namespace.as_str()) {
                    if let Some(old) = names.remove(obj.name_any().as_str()) {
                        let mut usage = self.store.usage.write_locked();
                        count(&mut usage, self.kind, &old, Footprint::subtract);
                    }
                    if names.is_empty() {
                        objects.remove(namespace.as_str());
                    }
                }
            }
        }
    }
}

/// Stores `kept` for `obj`; returns what it replaces.
fn insert(objects: &mut Names, obj: &Meta, kept: Kept) -> Option<Kept> {
    let namespace = obj.namespace().unwrap_or_default();
    objects
        .entry(namespace.into_boxed_str())
        .or_default()
        .insert(obj.name_any().into_boxed_str(), kept)
}

/// Adds `kept`'s footprint to, or takes it from, its tenant's usage.
fn count(
    usage: &mut HashMap<Box<str>, Footprint>,
    kind: Allowed,
    kept: &Kept,
    op: fn(&mut Footprint, &Footprint),
) {
    let Some((tenant, fp)) = kept.footprint(kind) else {
        return;
    };
    let total = usage.entry(tenant.into()).or_default();
    op(total, &fp);
    if total.iter().next().is_none() {
        usage.remove(tenant);
    }
}

/// The store of a kind that another part of the agent watches whole, with the same selector
/// (ShadowPods for their controller, claims for the volume stream): that one watch feeds it,
/// so the kind is watched once. Clones feed the same store.
#[derive(Clone)]
pub struct Feed {
    kind: Allowed,
    writer: Arc<std::sync::Mutex<StoreWriter>>,
    changes: mpsc::Sender<Change>,
}

impl Feed {
    /// Keeps the store as the metadata watch would have, and passes the change on.
    pub async fn apply<K>(&self, event: &watcher::Event<K>)
    where
        K: kube::Resource<DynamicType = ()>,
    {
        let event = meta_event(event);
        self.writer.locked().apply(&event);
        let _ = self.changes.send((self.kind, event)).await;
    }

    /// Tells the restorer alone to judge `namespace/name` again as the store holds it now: for
    /// an object whose judgement was held and turned out to have been written by someone else.
    /// Nothing for one the store no longer has: its deletion was judged as it came.
    pub async fn recheck(&self, namespace: &str, name: &str) {
        let store = self.writer.locked().store.clone();
        if let Some(meta) = store.get(namespace, name) {
            let _ = self
                .changes
                .send((self.kind, watcher::Event::Apply(meta)))
                .await;
        }
    }

    /// A feed of `kind` into a store of its own whose changes go nowhere (tests of a part
    /// that holds a feed).
    #[cfg(test)]
    pub fn detached(kind: Allowed) -> Self {
        let writer = StoreWriter {
            kind,
            store: Arc::default(),
            own_fields: false,
            relisting: None,
        };
        Self {
            kind,
            writer: Arc::new(std::sync::Mutex::new(writer)),
            changes: mpsc::channel(1).0,
        }
    }

    /// `events` (a watch of the kind), each applied to the store on its way.
    pub fn feeding<K, S>(
        self,
        events: S,
    ) -> impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>>
    where
        K: kube::Resource<DynamicType = ()>,
        S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    {
        events.then(move |event| {
            let feed = self.clone();
            async move {
                if let Ok(event) = &event {
                    feed.apply(event).await;
                }
                event
            }
        })
    }
}

/// The feeds of the kinds [`spawn`] was told are watched elsewhere.
pub type Feeds = BTreeMap<Allowed, Feed>;

/// `event` with its objects' metadata only.
fn meta_event<K: kube::Resource<DynamicType = ()>>(
    event: &watcher::Event<K>,
) -> watcher::Event<Meta> {
    let meta = |obj: &K| Meta {
        types: Some(kube::core::TypeMeta {
            api_version: K::api_version(&()).into_owned(),
            kind: K::kind(&()).into_owned(),
        }),
        metadata: obj.meta().clone(),
        _phantom: Default::default(),
    };
    match event {
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(obj) => watcher::Event::InitApply(meta(obj)),
        watcher::Event::InitDone => watcher::Event::InitDone,
        watcher::Event::Apply(obj) => watcher::Event::Apply(meta(obj)),
        watcher::Event::Delete(obj) => watcher::Event::Delete(meta(obj)),
    }
}

/// Starts one watch per allowed kind, except the kinds in `fed`, whose stores are fed by
/// another watch ([`Feed`]); returns the stores, the stream of changes and the feeds.
/// `keeps_managed_fields` says of which kinds the store keeps the agent's managedFields
/// entries; the writer decides (`apply::needs_managed_fields`), the store only keeps them.
pub fn spawn(
    client: kube::Client,
    provider: &ClusterId,
    keeps_managed_fields: fn(Allowed) -> bool,
    fed: &[Allowed],
    shutdown: CancellationToken,
) -> (TenantObjects, mpsc::Receiver<Change>, Feeds) {
    let (changes_tx, changes_rx) = mpsc::channel(1024);
    let watching = Arc::new(Watching {
        client,
        provider: provider.clone(),
        keeps_managed_fields,
        changes: changes_tx,
        shutdown,
    });
    let mut stores = Stores::new();
    let mut feeds = Feeds::new();
    for kind in Allowed::all() {
        let store = Arc::new(KindStore::default());
        stores.insert(kind, store.clone());
        if fed.contains(&kind) {
            let feed = Feed {
                kind,
                writer: Arc::new(std::sync::Mutex::new(watching.writer(kind, store))),
                changes: watching.changes.clone(),
            };
            feeds.insert(kind, feed);
            continue;
        }
        watching.spawn(kind, store);
    }
    (
        TenantObjects {
            stores: Arc::new(RwLock::new(stores)),
            watching: Some(watching),
        },
        changes_rx,
        feeds,
    )
}

impl Watching {
    fn writer(&self, kind: Allowed, store: Arc<KindStore>) -> StoreWriter {
        StoreWriter {
            kind,
            store,
            own_fields: (self.keeps_managed_fields)(kind),
            relisting: None,
        }
    }

    /// Starts the metadata watch of `kind` over this provider's destination label, keeping
    /// `store` and passing each change on.
    fn spawn(&self, kind: Allowed, store: Arc<KindStore>) {
        let mut writer = self.writer(kind, store);
        // An Api of partial objects asks for metadata only.
        let api: Api<Meta> = Api::all_with(self.client.clone(), &kind.resource());
        let selector = std::iter::once(format!("{DESTINATION_LABEL}={}", self.provider))
            .chain(kind.own_labels().iter().map(|(k, v)| format!("{k}={v}")))
            .collect::<Vec<_>>()
            .join(",");
        let config = watcher::Config::default().labels(&selector);
        let (tx, shutdown) = (self.changes.clone(), self.shutdown.clone());
        tokio::spawn(async move {
            let events = watcher(api, config).default_backoff().boxed();
            let what = format!("tenant objects of kind {}", kind.kind());
            let mut watch = crate::watching::Following::new(events, what);
            while let Some(event) = watch.next(&shutdown).await {
                writer.apply(&event);
                if tx.send((kind, event)).await.is_err() {
                    return;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use kube::api::ObjectMeta;
    use refract_core::options::Kind;

    use super::*;

    const CM: Allowed = Allowed::Reflected(Kind::ConfigMap);

    fn meta(name: &str, origin: &str, version: &str) -> Meta {
        Meta {
            types: None,
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("apps-origin".into()),
                resource_version: Some(version.into()),
                labels: Some(BTreeMap::from([(ORIGIN_LABEL.into(), origin.into())])),
                ..Default::default()
            },
            _phantom: Default::default(),
        }
    }

    /// A store of `kind` alone, and the writer its watch would feed.
    fn store_of(kind: Allowed) -> (TenantObjects, StoreWriter) {
        let store = Arc::new(KindStore::default());
        let objects = TenantObjects {
            stores: Arc::new(RwLock::new(BTreeMap::from([(kind, store.clone())]))),
            watching: None,
        };
        let writer = StoreWriter {
            kind,
            store,
            own_fields: false,
            relisting: None,
        };
        (objects, writer)
    }

    fn version(objects: &TenantObjects, name: &str) -> Option<String> {
        objects
            .get(CM, "apps-origin", name)
            .and_then(|m| m.metadata.resource_version)
    }

    #[tokio::test]
    async fn a_custom_kind_whose_watch_never_lists_is_left_out_of_the_snapshot() {
        let widget = refract_core::custom_kind::register(&crate::kinds::CustomKindName {
            group: "objects.test.refract.example".into(),
            version: "v1".into(),
            kind: "Lever".into(),
            plural: "levers".into(),
        })
        .unwrap();
        let cm = Arc::new(KindStore::default());
        let objects = TenantObjects {
            stores: Arc::new(RwLock::new(BTreeMap::from([
                (CM, cm.clone()),
                (Allowed::Reflected(Kind::Custom(widget)), Arc::default()),
            ]))),
            watching: None,
        };
        let mut writer = StoreWriter {
            kind: CM,
            store: cm,
            own_fields: false,
            relisting: None,
        };
        let tenant = ClusterId::parse("origin").unwrap();
        let short = std::time::Duration::from_millis(30);
        assert!(objects.snapshot_of(&tenant, short).await.is_none());
        writer.apply(&watcher::Event::Init);
        writer.apply(&watcher::Event::InitApply(meta("a", "origin", "1")));
        writer.apply(&watcher::Event::InitDone);
        let snapshot = objects.snapshot_of(&tenant, short).await.expect("listed");
        assert_eq!(snapshot.len(), 1);
        assert_eq!(snapshot[0].0, CM);
    }

    #[tokio::test]
    async fn a_listing_replaces_the_store_once_complete_and_changes_apply_as_they_come() {
        let (objects, mut writer) = store_of(CM);
        let tenant = ClusterId::parse("origin").unwrap();
        let short = std::time::Duration::from_millis(30);
        assert!(
            objects.snapshot_of(&tenant, short).await.is_none(),
            "not listed yet"
        );
        writer.apply(&watcher::Event::Init);
        writer.apply(&watcher::Event::InitApply(meta("a", "origin", "1")));
        writer.apply(&watcher::Event::InitApply(meta("b", "other", "2")));
        assert_eq!(
            version(&objects, "a"),
            None,
            "a listing shows when complete"
        );
        writer.apply(&watcher::Event::InitDone);
        assert_eq!(version(&objects, "a").as_deref(), Some("1"));
        let of_tenant = objects.snapshot_of(&tenant, short).await.expect("listed");
        assert_eq!(of_tenant.len(), 1, "only the tenant's objects");
        assert_eq!(of_tenant[0].1.name_any(), "a");

        writer.apply(&watcher::Event::Apply(meta("a", "origin", "3")));
        assert_eq!(version(&objects, "a").as_deref(), Some("3"));
        writer.apply(&watcher::Event::Delete(meta("a", "origin", "3")));
        assert_eq!(version(&objects, "a"), None);

        // The watch restarts: whatever the new listing lacks was deleted meanwhile.
        writer.apply(&watcher::Event::Init);
        writer.apply(&watcher::Event::InitApply(meta("c", "origin", "5")));
        assert_eq!(
            version(&objects, "b").as_deref(),
            Some("2"),
            "until complete"
        );
        writer.apply(&watcher::Event::InitDone);
        assert_eq!(version(&objects, "b"), None);
        assert_eq!(version(&objects, "c").as_deref(), Some("5"));
    }

    #[test]
    fn each_tenants_footprints_add_up_as_objects_come_change_and_go() {
        use crate::quota::footprint::ANNOTATION;
        let (objects, mut writer) = store_of(CM);
        let stamped = |name: &str, origin: &str, bytes: i128| {
            let mut m = meta(name, origin, "1");
            m.metadata.annotations = Some(BTreeMap::from([(
                ANNOTATION.into(),
                format!("bytes={bytes},objects/ConfigMap=1000"),
            )]));
            m
        };
        let origin = ClusterId::parse("origin").unwrap();
        let bytes = |objects: &TenantObjects| objects.usage(&origin).get("bytes");
        writer.apply(&watcher::Event::Init);
        writer.apply(&watcher::Event::InitApply(stamped("a", "origin", 1000)));
        writer.apply(&watcher::Event::InitApply(stamped("b", "other", 7000)));
        // Written before footprints: one object, no bytes.
        writer.apply(&watcher::Event::InitApply(meta("old", "origin", "1")));
        writer.apply(&watcher::Event::InitDone);
        assert_eq!(bytes(&objects), 1000);
        assert_eq!(objects.usage(&origin).get("objects/ConfigMap"), 2000);
        writer.apply(&watcher::Event::Apply(stamped("a", "origin", 3000)));
        assert_eq!(
            bytes(&objects),
            3000,
            "a change replaces what the object counted"
        );
        assert_eq!(objects.footprint(CM, "apps-origin", "a").get("bytes"), 3000);
        writer.apply(&watcher::Event::Delete(stamped("a", "origin", 3000)));
        assert_eq!(bytes(&objects), 0);
        assert_eq!(objects.usage(&origin).get("objects/ConfigMap"), 1000);
        let all = objects.usage_by_tenant();
        assert_eq!(all["other"].get("bytes"), 7000, "the other tenant's apart");
        // A new listing counts again from what it lists.
        writer.apply(&watcher::Event::Init);
        writer.apply(&watcher::Event::InitApply(stamped("c", "origin", 500)));
        writer.apply(&watcher::Event::InitDone);
        assert_eq!(bytes(&objects), 500);
        assert!(!objects.usage_by_tenant().contains_key("other"));
    }

    #[test]
    fn a_live_namespace_is_its_tenants_until_it_is_being_deleted() {
        use refract_core::keys::TENANT_NAMESPACE_LABEL as TENANT;
        let (objects, mut writer) = store_of(Allowed::Namespace);
        let namespace = |name: &str, tenant: &str, deleting: bool| Meta {
            types: None,
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(BTreeMap::from([(TENANT.into(), tenant.into())])),
                deletion_timestamp: deleting.then(|| {
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default())
                }),
                ..Default::default()
            },
            _phantom: Default::default(),
        };
        writer.apply(&watcher::Event::Apply(namespace("apps", "origin", false)));
        assert!(objects.has_live_namespace("apps", TENANT, "origin"));
        assert!(
            !objects.has_live_namespace("apps", TENANT, "other"),
            "another tenant's"
        );
        assert!(
            !objects.has_live_namespace("web", TENANT, "origin"),
            "not watched"
        );
        writer.apply(&watcher::Event::Apply(namespace("apps", "origin", true)));
        assert!(
            !objects.has_live_namespace("apps", TENANT, "origin"),
            "being deleted"
        );
        let (no_namespaces, _) = store_of(CM);
        assert!(!no_namespaces.has_live_namespace("apps", TENANT, "origin"));
    }
}
