//! Events recorded on the provider, recorded again on the matching origin objects.
//!
//! Only events about objects this agent reflected arrive (the remote agent filters by tenant
//! namespace and kind); an event is created once (a copy that exists is left alone) on the
//! origin object of the same kind and name in the origin namespace, ShadowPod events on the
//! Pod. Origin events never go to the provider.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kube::ResourceExt;
use refract_shared::keys::{DESTINATION_LABEL, ORIGIN_LABEL};
use refract_shared::proto;

use crate::extension::Extension;

fn local_resource(kind: &str) -> Option<(ApiResource, &'static str)> {
    use k8s_openapi::api::{core::v1, discovery, networking};
    Some(match kind {
        "Pod" | "ShadowPod" => (ApiResource::erase::<v1::Pod>(&()), "Pod"),
        "Service" => (ApiResource::erase::<v1::Service>(&()), "Service"),
        "ConfigMap" => (ApiResource::erase::<v1::ConfigMap>(&()), "ConfigMap"),
        "Secret" => (ApiResource::erase::<v1::Secret>(&()), "Secret"),
        "PersistentVolumeClaim" => (
            ApiResource::erase::<v1::PersistentVolumeClaim>(&()),
            "PersistentVolumeClaim",
        ),
        "EndpointSlice" => (
            ApiResource::erase::<discovery::v1::EndpointSlice>(&()),
            "EndpointSlice",
        ),
        "Ingress" => (
            ApiResource::erase::<networking::v1::Ingress>(&()),
            "Ingress",
        ),
        _ => return None,
    })
}

/// Records one provider event on its origin object.
pub async fn on_event(
    client: kube::Client,
    extension: Extension,
    local_id: String,
    remote_id: String,
    message: proto::Event,
) {
    let Some(involved) = message.involved else {
        return;
    };
    let Some(local_ns) = extension
        .namespaces
        .iter()
        .find(|(_, remote)| **remote == involved.namespace)
        .map(|(local, _)| local.clone())
    else {
        return;
    };
    let Some((resource, local_kind)) = local_resource(&involved.kind) else {
        return;
    };
    let remote: Event = match serde_json::from_slice(&message.event_json) {
        Ok(e) => e,
        Err(error) => {
            tracing::warn!(%error, "malformed event from the provider");
            return;
        }
    };
    let objects: Api<DynamicObject> = Api::namespaced_with(client.clone(), &local_ns, &resource);
    let Ok(Some(target)) = objects.get_opt(&involved.name).await else {
        return;
    };
    let source = remote.source.clone().unwrap_or_default();
    let event = Event {
        metadata: kube::api::ObjectMeta {
            name: Some(remote.name_any()),
            namespace: Some(local_ns.clone()),
            labels: Some(
                [
                    (ORIGIN_LABEL.to_string(), local_id),
                    (DESTINATION_LABEL.to_string(), remote_id.clone()),
                ]
                .into_iter()
                .collect(),
            ),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some(resource.api_version.clone()),
            kind: Some(local_kind.into()),
            name: Some(involved.name.clone()),
            namespace: Some(local_ns.clone()),
            uid: target.uid(),
            field_path: remote.involved_object.field_path.clone(),
            resource_version: None,
        },
        reason: remote.reason.clone(),
        message: remote.message.clone(),
        type_: remote.type_.clone(),
        count: remote.count,
        first_timestamp: remote.first_timestamp.clone(),
        last_timestamp: remote.last_timestamp.clone(),
        event_time: remote.event_time.clone(),
        action: remote.action.clone(),
        // A qualified name is required here; "(remote)" is shown through the source instead.
        reporting_component: remote
            .reporting_component
            .clone()
            .filter(|c| !c.is_empty())
            .or_else(|| {
                remote
                    .event_time
                    .is_some()
                    .then(|| "refract-remote-agent".to_string())
            }),
        reporting_instance: remote.reporting_instance.clone(),
        source: Some(EventSource {
            component: Some(format!("{} (remote)", source.component.unwrap_or_default())),
            host: source.host,
        }),
        related: None,
        series: None,
    };
    let events: Api<Event> = Api::namespaced(client, &local_ns);
    match events.create(&PostParams::default(), &event).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(error) => {
            tracing::warn!(namespace = %local_ns, object = %involved.name, %error, "failed to record provider event")
        }
    }
}
