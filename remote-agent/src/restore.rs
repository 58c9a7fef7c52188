//! Keeping tenants' objects as they sent them: a copy deleted or edited on the provider is
//! re-applied from the desired state the tenant last sent.
//!
//! One watch per kind over objects labelled with this provider as destination. An event whose
//! resourceVersion is not the one the remote agent last wrote means someone else touched the
//! object; server-side apply with force takes back the fields Refract owns, and is a no-op (no
//! write) when nothing of ours changed.

use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use refract_shared::keys::{DESTINATION_LABEL, ORIGIN_LABEL};
use refract_shared::tls::ClusterId;
use tokio_util::sync::CancellationToken;

use crate::apply::{Applier, ObjectKey};
use crate::kinds::Allowed;
use refract_shared::options::Kind;

/// Starts one restore watch per allowed kind.
pub fn spawn_restorers(
    client: kube::Client,
    applier: Applier,
    provider: ClusterId,
    shutdown: CancellationToken,
) {
    for kind in Allowed::all() {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &kind.resource());
        let config = watcher::Config::default().labels(&format!("{DESTINATION_LABEL}={provider}"));
        let applier = applier.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let mut events = watcher(api, config).default_backoff().boxed();
            loop {
                let event = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    e = events.next() => match e {
                        Some(e) => e,
                        None => return,
                    },
                };
                match event {
                    Ok(watcher::Event::Apply(obj)) if obj.metadata.deletion_timestamp.is_none() => {
                        check(&applier, kind, &obj, obj.resource_version().as_deref()).await
                    }
                    // A claim deleted on the provider is not re-created: a new claim would be a
                    // new, empty volume behind the origin's back (Liqo does the same).
                    Ok(watcher::Event::Delete(_))
                        if kind == Allowed::Reflected(Kind::PersistentVolumeClaim) => {}
                    Ok(watcher::Event::Delete(obj)) => check(&applier, kind, &obj, None).await,
                    Ok(_) => {}
                    Err(error) => {
                        tracing::warn!(kind = kind.kind(), %error, "cannot watch tenant objects of this kind (is its CRD installed?); retrying with backoff")
                    }
                }
            }
        });
    }
}

async fn check(
    applier: &Applier,
    kind: Allowed,
    obj: &DynamicObject,
    resource_version: Option<&str>,
) {
    let Some(tenant) = obj
        .labels()
        .get(ORIGIN_LABEL)
        .and_then(|t| ClusterId::parse(t).ok())
    else {
        return;
    };
    let key = ObjectKey {
        tenant,
        kind,
        namespace: obj.namespace().unwrap_or_default(),
        name: obj.name_any(),
    };
    tracing::debug!(tenant = %key.tenant, kind = kind.kind(), namespace = %key.namespace, name = %key.name, ?resource_version, "tenant object changed on the provider");
    let Some(desired) = applier.desired.needs_restore(&key, resource_version) else {
        return;
    };
    let what = if resource_version.is_none() {
        "deleted"
    } else {
        "changed"
    };
    let (outcome, message) = applier.restore(&key, &desired, resource_version).await;
    tracing::info!(
        tenant = %key.tenant, kind = kind.kind(), namespace = %key.namespace, name = %key.name,
        outcome = outcome.as_str_name(), %message,
        "reflected object {what} on the provider; restored the tenant's desired state"
    );
}
