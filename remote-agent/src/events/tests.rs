use super::*;

/// The scheduler's event for a pod, as the provider's API server lists it.
fn scheduled() -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": "pod-1.18a2b3c4d5e6f708",
            "namespace": "scale-origin",
            "uid": "0b5a2c1e-0000-4000-8000-000000000001",
            "resourceVersion": "4711",
            "creationTimestamp": "2026-12-01T19:00:00Z",
            "annotations": {"liqo.io/skip-reflection": "true"},
            "managedFields": [{
                "manager": "kube-scheduler",
                "operation": "Update",
                "apiVersion": "v1",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:count": {}, "f:message": {}, "f:reason": {}, "f:source": {"f:component": {}}}
            }]
        },
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": "pod-1",
            "namespace": "scale-origin",
            "uid": "0b5a2c1e-0000-4000-8000-000000000002",
            "resourceVersion": "4700",
            "fieldPath": "spec.containers{app}"
        },
        "reason": "Scheduled",
        "message": "Successfully assigned scale-origin/pod-1 to worker-3",
        "type": "Normal",
        "count": 2,
        "firstTimestamp": "2026-12-01T19:00:00Z",
        "lastTimestamp": "2026-12-01T19:00:05Z",
        "source": {"component": "default-scheduler", "host": "worker-3"},
        "reportingComponent": "default-scheduler",
        "reportingInstance": "default-scheduler-worker-3",
        "action": "Binding"
    })
}

#[test]
fn an_event_is_sent_with_what_the_origin_reads_and_nothing_of_the_provider_s_bookkeeping() {
    let event: Event = serde_json::from_value(scheduled()).unwrap();
    let sent = serde_json::to_value(as_sent(event)).unwrap();
    // Everything but the provider's bookkeeping and node names.
    let mut expected = scheduled();
    for (object, field) in [
        ("/metadata", "uid"),
        ("/metadata", "resourceVersion"),
        ("/metadata", "creationTimestamp"),
        ("/metadata", "managedFields"),
        ("/involvedObject", "uid"),
        ("/involvedObject", "resourceVersion"),
        ("/source", "host"),
        ("", "reportingInstance"),
    ] {
        let removed = expected
            .pointer_mut(object)
            .and_then(|o| o.as_object_mut())
            .and_then(|o| o.remove(field));
        assert!(removed.is_some(), "{object}/{field}");
    }
    assert_eq!(sent, expected);
    let (full, slim) = (scheduled().to_string().len(), sent.to_string().len());
    assert!(slim * 3 < full * 2, "{slim} bytes sent of {full}");
}
