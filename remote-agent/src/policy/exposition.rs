//! Services, EndpointSlices and Ingresses: what a tenant may ask of the provider's network.
//!
//! A Service never claims addresses (`externalIPs`, a chosen cluster IP, a load-balancer IP or
//! node ports unless allowed); an EndpointSlice only points at the addresses the provider
//! assigned to the tenant, never at the provider itself; an Ingress only carries annotations
//! and classes the provider allows, and never a configuration snippet.

use std::net::IpAddr;

use ipnet::IpNet;

use super::{IngressPolicy, ProviderNetworks, ServicePolicy, TenantPolicy, Violation};

/// Checks a Service.
pub(super) fn check_service(
    svc: &serde_json::Value,
    policy: &ServicePolicy,
) -> Result<(), Violation> {
    let spec = &svc["spec"];
    if spec["externalIPs"]
        .as_array()
        .is_some_and(|ips| !ips.is_empty())
    {
        return Err(Violation::new(
            "spec.externalIPs",
            "external IPs would take over traffic to those addresses on every provider node",
        ));
    }
    for field in ["clusterIP", "clusterIPs"] {
        let chosen = match &spec[field] {
            serde_json::Value::String(ip) => vec![ip.as_str()],
            serde_json::Value::Array(ips) => ips.iter().filter_map(|i| i.as_str()).collect(),
            _ => Vec::new(),
        };
        if chosen.iter().any(|ip| !ip.is_empty() && *ip != "None") {
            return Err(Violation::new(
                format!("spec.{field}"),
                "cluster IPs are the provider's to allocate (only \"None\", for a headless Service)",
            ));
        }
    }
    let type_ = spec["type"].as_str().unwrap_or("ClusterIP");
    if type_ == "ExternalName" && !policy.allow_external_name {
        return Err(Violation::new(
            "spec.type",
            "Services of type ExternalName are not allowed for this tenant: the name could be one of the provider's own Services (services.allowExternalName in the provider's policy)",
        ));
    }
    if type_ == "LoadBalancer" && !policy.allow_load_balancer {
        return Err(Violation::new(
            "spec.type",
            "Services of type LoadBalancer are not allowed for this tenant",
        ));
    }
    if spec["loadBalancerIP"]
        .as_str()
        .is_some_and(|ip| !ip.is_empty())
        && !policy.allow_load_balancer_ip
    {
        return Err(Violation::new(
            "spec.loadBalancerIP",
            "choosing the load balancer's IP is not allowed for this tenant",
        ));
    }
    if !policy.allow_node_ports {
        let chosen = |p: &serde_json::Value| p["nodePort"].as_u64().unwrap_or(0) != 0;
        if let Some(i) = spec["ports"]
            .as_array()
            .and_then(|ports| ports.iter().position(chosen))
        {
            return Err(Violation::new(
                format!("spec.ports[{i}].nodePort"),
                "choosing node ports is not allowed for this tenant; the provider allocates them",
            ));
        }
        if spec["healthCheckNodePort"].as_u64().unwrap_or(0) != 0 {
            return Err(Violation::new(
                "spec.healthCheckNodePort",
                "choosing node ports is not allowed for this tenant; the provider allocates them",
            ));
        }
    }
    Ok(())
}

/// Checks every address of an EndpointSlice, and drops what would tie an endpoint to the
/// provider's own objects (`targetRef`, `nodeName`).
pub(super) fn check_endpoint_slice(
    slice: &mut serde_json::Value,
    policy: &TenantPolicy,
    provider: &ProviderNetworks,
) -> Result<(), Violation> {
    let address_type = slice["addressType"].as_str().unwrap_or_default();
    if address_type != "IPv4" && address_type != "IPv6" {
        return Err(Violation::new(
            "addressType",
            format!("{address_type:?} endpoints cannot be checked; only IPv4 and IPv6 are allowed"),
        ));
    }
    let endpoints = slice["endpoints"].as_array_mut();
    for (i, endpoint) in endpoints.into_iter().flatten().enumerate() {
        for (j, address) in endpoint["addresses"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let field = format!("endpoints[{i}].addresses[{j}]");
            let ip: IpAddr = address
                .as_str()
                .and_then(|a| a.parse().ok())
                .ok_or_else(|| Violation::new(&field, "is not an IP address"))?;
            address_allowed(ip, policy, provider)
                .map_err(|reason| Violation::new(field, reason))?;
        }
        if let Some(e) = endpoint.as_object_mut() {
            e.remove("targetRef");
            e.remove("nodeName");
        }
    }
    Ok(())
}

/// Why `ip` may not be an endpoint of this tenant, if it may not.
fn address_allowed(
    ip: IpAddr,
    policy: &TenantPolicy,
    provider: &ProviderNetworks,
) -> Result<(), String> {
    let special = match ip {
        IpAddr::V4(v4) => {
            v4.is_loopback()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast()
        }
        IpAddr::V6(v6) => {
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (v6.segments()[0] & 0xffc0) == 0xfe80
                || v6.to_ipv4_mapped().is_some()
        }
    };
    if special {
        return Err(format!(
            "{ip} is a loopback, link-local, unspecified, multicast or broadcast address"
        ));
    }
    if let Some(range) = provider.cidrs.iter().find(|r| r.contains(&ip)) {
        return Err(format!("{ip} is in the provider's own range {range}"));
    }
    let ranges = &policy.endpoint_ranges;
    if !ranges.is_empty() && !ranges.iter().any(|r| r.contains(&ip)) {
        return Err(format!(
            "{ip} is outside the ranges assigned to this tenant ({})",
            ranges
                .iter()
                .map(IpNet::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(())
}

/// Checks an Ingress's annotations and class.
pub(super) fn check_ingress(
    ingress: &serde_json::Value,
    policy: &IngressPolicy,
) -> Result<(), Violation> {
    let annotations = ingress["metadata"]["annotations"].as_object();
    for key in annotations.into_iter().flatten().map(|(k, _)| k) {
        let field = || format!("metadata.annotations[{key}]");
        if key.to_ascii_lowercase().contains("snippet") {
            return Err(Violation::new(
                field(),
                "configuration snippets would run the tenant's configuration in the provider's ingress controller",
            ));
        }
        if !policy
            .allowed_annotations
            .iter()
            .any(|pattern| matches(pattern, key))
        {
            return Err(Violation::new(
                field(),
                "this annotation is not in the provider's allowlist for Ingresses (ingress.allowedAnnotations in the provider's policy)",
            ));
        }
    }
    let class = ingress["spec"]["ingressClassName"]
        .as_str()
        .or_else(|| annotations.and_then(|a| a.get(LEGACY_CLASS_ANNOTATION)?.as_str()));
    if let Some(class) = class {
        if !policy.classes.is_empty() && !policy.classes.iter().any(|c| c == class) {
            return Err(Violation::new(
                "spec.ingressClassName",
                format!(
                    "ingress class {class:?} is not allowed for this tenant (allowed: {})",
                    policy.classes.join(", ")
                ),
            ));
        }
    }
    let backends = ingress["spec"]["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| r["http"]["paths"].as_array().into_iter().flatten())
        .map(|p| &p["backend"])
        .chain(std::iter::once(&ingress["spec"]["defaultBackend"]));
    if backends.into_iter().any(|b| !b["resource"].is_null()) {
        return Err(Violation::new(
            "spec.rules[].http.paths[].backend.resource",
            "resource backends are not allowed; backends are the tenant's Services",
        ));
    }
    Ok(())
}

const LEGACY_CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";

/// Whether `key` matches an allowlist entry: exact, or a prefix ending in `*`.
fn matches(pattern: &str, key: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => key.starts_with(prefix),
        None => key == pattern,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn service(spec: serde_json::Value, policy: &ServicePolicy) -> Option<String> {
        check_service(&json!({"spec": spec}), policy)
            .err()
            .map(|v| v.field)
    }

    #[test]
    fn services_never_claim_addresses() {
        let p = ServicePolicy::default();
        assert_eq!(service(json!({"ports": [{"port": 80}]}), &p), None);
        assert_eq!(service(json!({"clusterIP": "None"}), &p), None);
        let refused = [
            (json!({"externalIPs": ["1.2.3.4"]}), "spec.externalIPs"),
            (json!({"clusterIP": "10.96.0.10"}), "spec.clusterIP"),
            (
                json!({"type": "LoadBalancer", "loadBalancerIP": "1.2.3.4"}),
                "spec.loadBalancerIP",
            ),
            (
                json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 30080}]}),
                "spec.ports[0].nodePort",
            ),
        ];
        for (spec, field) in refused {
            assert_eq!(service(spec, &p).as_deref(), Some(field));
        }
        let open = ServicePolicy {
            allow_load_balancer: true,
            allow_load_balancer_ip: true,
            allow_node_ports: true,
            allow_external_name: true,
        };
        let external =
            json!({"type": "ExternalName", "externalName": "kubernetes.default.svc.cluster.local"});
        assert_eq!(service(external.clone(), &p).as_deref(), Some("spec.type"));
        assert_eq!(service(external, &open), None);
        let chosen = json!({"type": "LoadBalancer", "loadBalancerIP": "1.2.3.4", "ports": [{"port": 80, "nodePort": 30080}]});
        assert_eq!(service(chosen, &open), None);
        let closed = ServicePolicy {
            allow_load_balancer: false,
            ..ServicePolicy::default()
        };
        assert_eq!(
            service(json!({"type": "LoadBalancer"}), &closed).as_deref(),
            Some("spec.type")
        );
    }

    fn slice(addresses: &[&str]) -> serde_json::Value {
        json!({"addressType": "IPv4", "endpoints": [{"addresses": addresses, "targetRef": {"kind": "Pod", "name": "x"}, "nodeName": "n"}]})
    }

    #[test]
    fn endpoints_stay_in_the_tenants_ranges() {
        let provider = ProviderNetworks {
            cidrs: vec!["10.200.0.0/16".parse().unwrap()],
        };
        let open = TenantPolicy::default();
        let mut ok = slice(&["10.0.3.7"]);
        assert_eq!(check_endpoint_slice(&mut ok, &open, &provider), Ok(()));
        assert!(
            ok["endpoints"][0]["targetRef"].is_null() && ok["endpoints"][0]["nodeName"].is_null()
        );
        for bad in [
            "127.0.0.1",
            "169.254.169.254",
            "0.0.0.0",
            "224.0.0.1",
            "10.200.3.4",
            "x",
        ] {
            let e =
                check_endpoint_slice(&mut slice(&["10.0.3.7", bad]), &open, &provider).unwrap_err();
            assert_eq!(e.field, "endpoints[0].addresses[1]", "{bad}");
        }
        let ranged = TenantPolicy {
            endpoint_ranges: vec!["10.71.0.0/16".parse().unwrap()],
            ..TenantPolicy::default()
        };
        assert!(check_endpoint_slice(&mut slice(&["10.0.3.7"]), &ranged, &provider).is_err());
        assert_eq!(
            check_endpoint_slice(&mut slice(&["10.71.0.9"]), &ranged, &provider),
            Ok(())
        );
        let mut fqdn =
            json!({"addressType": "FQDN", "endpoints": [{"addresses": ["example.com"]}]});
        assert!(check_endpoint_slice(&mut fqdn, &open, &provider).is_err());
        let mut v6 = json!({"addressType": "IPv6", "endpoints": [{"addresses": ["fe80::1"]}]});
        assert!(check_endpoint_slice(&mut v6, &open, &provider).is_err());
    }

    #[test]
    fn by_default_ingresses_carry_only_annotations_known_to_be_safe() {
        let default = IngressPolicy::default();
        let with = |key: &str| json!({"metadata": {"annotations": {key: "x"}}, "spec": {}});
        for safe in [
            "nginx.ingress.kubernetes.io/rewrite-target",
            "nginx.ingress.kubernetes.io/ssl-redirect",
            "kubectl.kubernetes.io/last-applied-configuration",
        ] {
            assert_eq!(check_ingress(&with(safe), &default), Ok(()), "{safe}");
        }
        // CVE-2025-24514 (auth-url), -1097 (auth-tls-match-cn), -1098 (mirror-target), and the
        // rest of their families.
        for unsafe_ in [
            "nginx.ingress.kubernetes.io/auth-url",
            "nginx.ingress.kubernetes.io/auth-tls-match-cn",
            "nginx.ingress.kubernetes.io/mirror-target",
            "nginx.ingress.kubernetes.io/mirror-uri",
            "nginx.ingress.kubernetes.io/custom-http-errors",
            "nginx.ingress.kubernetes.io/upstream-vhost",
            "cert-manager.io/cluster-issuer",
        ] {
            let refused = check_ingress(&with(unsafe_), &default).unwrap_err();
            assert!(
                refused.reason.contains("ingress.allowedAnnotations"),
                "{unsafe_}: {refused}"
            );
        }
    }

    #[test]
    fn ingresses_carry_only_allowed_annotations_and_classes() {
        let open = IngressPolicy {
            allowed_annotations: vec!["*".into()],
            ..IngressPolicy::default()
        };
        let with = |a: serde_json::Value| json!({"metadata": {"annotations": a}, "spec": {}});
        assert_eq!(
            check_ingress(
                &with(json!({"nginx.ingress.kubernetes.io/rewrite-target": "/"})),
                &open
            ),
            Ok(())
        );
        let snippet = with(json!({"nginx.ingress.kubernetes.io/configuration-snippet": "x"}));
        assert!(check_ingress(&snippet, &open)
            .unwrap_err()
            .reason
            .contains("snippet"));
        let strict = IngressPolicy {
            allowed_annotations: vec!["nginx.ingress.kubernetes.io/rewrite-*".into()],
            classes: vec!["public".into()],
        };
        assert_eq!(
            check_ingress(
                &with(json!({"nginx.ingress.kubernetes.io/rewrite-target": "/"})),
                &strict
            ),
            Ok(())
        );
        assert!(check_ingress(
            &with(json!({"nginx.ingress.kubernetes.io/auth-url": "x"})),
            &strict
        )
        .is_err());
        let class = json!({"metadata": {}, "spec": {"ingressClassName": "internal"}});
        assert_eq!(
            check_ingress(&class, &strict).unwrap_err().field,
            "spec.ingressClassName"
        );
        let legacy = with(json!({"kubernetes.io/ingress.class": "internal"}));
        let legacy_ok = IngressPolicy {
            classes: vec!["public".into()],
            ..IngressPolicy::default()
        };
        assert!(check_ingress(&legacy, &legacy_ok).is_err());
        let resource = json!({"metadata": {}, "spec": {"defaultBackend": {"resource": {"kind": "Bucket", "name": "b"}}}});
        assert!(check_ingress(&resource, &open).is_err());
    }
}
