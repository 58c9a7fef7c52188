//! What the agents' watch stores keep of each object.

/// Drops an object's managedFields before a watch store keeps it. No reader of the stores that
/// use it looks at them, and they are the largest part of a Pod in memory: each field
/// manager's FieldsV1 is a tree of JSON maps, and a running pod has several managers (its
/// creator, the scheduler, the kubelet, the agent writing its status).
pub fn without_managed_fields<K: kube::Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    use super::*;

    #[test]
    fn managed_fields_go_and_the_rest_stays() {
        let mut pod = Pod::default();
        pod.metadata.name = Some("p".into());
        pod.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some("kubelet".into()),
            ..Default::default()
        }]);
        without_managed_fields(&mut pod);
        assert_eq!(pod.metadata.managed_fields, None);
        assert_eq!(pod.metadata.name.as_deref(), Some("p"));
    }
}
