//! Custom resources reflected end to end: a CustomResourceDefinition installed in both
//! clusters, the origin's reflection values naming its kind, the provider's policy naming the
//! kinds the tenant may write, and the provider's own schema checked before every write. Both
//! agent binaries, real API servers, kubectl on both sides.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::time::Duration;

use refract_e2e::{kubectl_get, kubectl_stdin, Peering};

const WAIT: Duration = Duration::from_secs(45);
const GROUP: &str = "example.com";

/// A namespaced CRD of `kind` in GROUP/v1 whose `spec` schema is `spec_schema` (JSON).
fn crd(kind: &str, plural: &str, spec_schema: &str) -> String {
    format!(
        r#"{{"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
  "metadata": {{"name": "{plural}.{GROUP}"}},
  "spec": {{"group": "{GROUP}", "scope": "Namespaced",
    "names": {{"kind": "{kind}", "plural": "{plural}", "singular": "{singular}", "listKind": "{kind}List"}},
    "versions": [{{"name": "v1", "served": true, "storage": true,
      "subresources": {{"status": {{}}}},
      "schema": {{"openAPIV3Schema": {{"type": "object", "properties": {{
        "spec": {spec_schema},
        "status": {{"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}}}}}}]}}}}"#,
        singular = kind.to_lowercase()
    )
}

/// The origin's Widgets take any spec; the provider's allow a size from 1 to 10 and nothing
/// else, so the provider's schema is what refuses.
const LOOSE: &str = r#"{"type": "object", "x-kubernetes-preserve-unknown-fields": true}"#;
const STRICT: &str = r#"{"type": "object", "properties": {"size": {"type": "integer", "minimum": 1, "maximum": 10}}}"#;

/// Writes `status` on the provider's copy of Widget `name`, as a provider controller would.
async fn provider_status(p: &Peering, name: &str, status: serde_json::Value) {
    provider_status_of(p, ("Widget", "widgets"), name, status).await
}

/// Writes `status` on the provider's copy of `name` of `kind` (kind, plural).
async fn provider_status_of(
    p: &Peering,
    (kind, plural): (&str, &str),
    name: &str,
    status: serde_json::Value,
) {
    use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
    let resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, "v1", kind), plural);
    let api: Api<DynamicObject> =
        Api::namespaced_with(p.provider.client().await.unwrap(), "shop-origin", &resource);
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "status": status })),
    )
    .await
    .expect("the provider's status write");
}

/// The values file naming the three custom kinds the origin reflects.
const VALUES: &str = "offloading:
  reflection:
    customKinds:
    - {group: example.com, version: v1, kind: Widget, plural: widgets, status: [ready]}
    - {group: example.com, version: v1, kind: Gadget, plural: gadgets, workers: 1}
    - {group: example.com, version: v1, kind: Gizmo, plural: gizmos}
";

/// The provider lets the tenant `origin` write Widgets and Gizmos (whose CRD it lacks), and
/// only another tenant Gadgets.
const POLICY: &str = "tenants:
  origin:
    customKinds:
    - {group: example.com, version: v1, kind: Widget, plural: widgets}
    - {group: example.com, version: v1, kind: Gizmo, plural: gizmos}
  other:
    customKinds:
    - {group: example.com, version: v1, kind: Gadget, plural: gadgets}
";

/// Adds to the tenant role what the provider's operator would, so that tenants may write
/// `resources` (plurals) of GROUP.
fn let_tenants_write(p: &Peering, resources: &[&str]) {
    let rule = serde_json::json!([{"op": "add", "path": "/rules/-", "value": {
        "apiGroups": [GROUP],
        "resources": resources,
        "verbs": ["get", "list", "create", "patch", "delete"],
    }}]);
    p.provider_kubectl(&[
        "patch",
        "clusterrole",
        "refract-tenant",
        "--type=json",
        "-p",
        &rule.to_string(),
    ]);
}

fn provider(p: &Peering, what: &str, jsonpath: &str) -> Option<String> {
    kubectl_get(
        &p.provider,
        &[
            "-n",
            "shop-origin",
            what,
            "-o",
            &format!("jsonpath={jsonpath}"),
        ],
    )
}

/// Waits until the provider's copy `what` (`kind/name`) has `spec.size` `size`.
async fn until_size(p: &Peering, what: &str, size: u32, waiting_for: &str) {
    let size = size.to_string();
    p.eventually(WAIT, waiting_for, || {
        (provider(p, what, "{.spec.size}").as_deref() == Some(size.as_str())).then_some(())
    })
    .await
}

/// Sets `spec.size` of the provider's copy `kind` `name`, as a provider controller would.
fn rewrite_on_provider(p: &Peering, kind: &str, name: &str, size: u32) {
    p.provider_kubectl(&[
        "-n",
        "shop-origin",
        "patch",
        kind,
        name,
        "--type=merge",
        "-p",
        &format!(r#"{{"spec": {{"size": {size}}}}}"#),
    ]);
}

/// The messages of the Warning events on origin object `name` in `shop`.
fn warnings(p: &Peering, name: &str) -> String {
    kubectl_get(
        &p.origin,
        &[
            "-n",
            "shop",
            "events",
            "--field-selector",
            &format!("involvedObject.name={name},type=Warning"),
            "-o",
            "jsonpath={.items[*].message}",
        ],
    )
    .unwrap_or_default()
}

async fn until_warning(p: &Peering, name: &str, says: &str) -> String {
    p.eventually(
        WAIT,
        &format!("a Warning on {name} saying {says:?}"),
        || {
            let messages = warnings(p, name);
            messages.contains(says).then_some(messages)
        },
    )
    .await
}

fn apply_origin(p: &Peering, kind: &str, name: &str, spec: &str) {
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!("apiVersion: example.com/v1\nkind: {kind}\nmetadata: {{name: {name}, namespace: shop}}\nspec: {spec}\n"),
    );
}

#[tokio::test]
async fn custom_kinds_are_reflected_through_the_providers_schema_and_policy() {
    let mut p = Peering::start(false).await.expect("peering");
    // The operators' side: the CRDs, the tenant role's rule, the values and policy files, and
    // a restart of each agent to take the new kinds.
    for (kind, plural) in [
        ("Widget", "widgets"),
        ("Gadget", "gadgets"),
        ("Gizmo", "gizmos"),
    ] {
        kubectl_stdin(&p.origin, &["apply", "-f", "-"], &crd(kind, plural, LOOSE));
    }
    for (kind, plural) in [("Widget", "widgets"), ("Gadget", "gadgets")] {
        kubectl_stdin(
            &p.provider,
            &["apply", "-f", "-"],
            &crd(kind, plural, STRICT),
        );
    }
    for cluster in [&p.origin, &p.provider] {
        refract_e2e::kubectl(
            cluster,
            &[
                "wait",
                "--for=condition=Established",
                "crd",
                "--all",
                "--timeout=30s",
            ],
        );
    }
    let_tenants_write(&p, &["widgets", "gadgets", "gizmos"]);
    let values = p.dir.path().join("reflection.yaml");
    std::fs::write(&values, VALUES).unwrap();
    let policy = p.dir.path().join("policy.yaml");
    std::fs::write(&policy, POLICY).unwrap();
    p.restart_remote_with(format!("--policy={}", policy.display()))
        .await;
    p.local.take().unwrap().stop().await;
    p.local_flags
        .push(format!("--reflection-config={}", values.display()));
    p.start_local();

    p.extend("shop", "{}");
    p.until_extended("shop", WAIT).await;

    // A Widget the provider's schema accepts is reflected, spec and labels, and follows the
    // origin's changes.
    apply_origin(&p, "Widget", "small", "{size: 3}");
    until_size(&p, "widget/small", 3, "widget small on the provider").await;
    // `local-agent preview` shows the same, from the live namespace and the values file.
    let out = refract_e2e::run_ok(
        refract_e2e::bin("local-agent"),
        &[
            "preview",
            "--cluster-id",
            "origin",
            "--remote-cluster-id",
            "provider",
            "--kubeconfig",
            p.origin.kubeconfig.to_str().unwrap(),
            "--namespace",
            "shop",
            &format!("--reflection-config={}", values.display()),
        ],
    );
    let previewed: serde_json::Value = serde_json::from_str(&out).expect("preview JSON");
    let widget = previewed
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["source"] == "Widget shop/small")
        .unwrap_or_else(|| panic!("widget small not previewed: {out}"));
    assert_eq!(widget["object"]["spec"]["size"], 3, "{widget}");
    let labels = provider(&p, "widget/small", "{.metadata.labels}");
    println!("widget small reflected: spec.size=3, labels {labels:?}");
    apply_origin(&p, "Widget", "small", "{size: 4}");
    until_size(
        &p,
        "widget/small",
        4,
        "widget small updated on the provider",
    )
    .await;

    // Rewritten on the provider, the copy is restored from the origin.
    rewrite_on_provider(&p, "widget", "small", 9);
    until_size(
        &p,
        "widget/small",
        4,
        "widget small restored on the provider",
    )
    .await;
    println!("widget small rewritten on the provider (size 9) and restored (size 4)");

    // A status the provider's controller writes on the copy comes back to the origin object,
    // the fields the values ask for only.
    provider_status(
        &p,
        "small",
        serde_json::json!({"ready": true, "internal": "x"}),
    )
    .await;
    let status = p
        .eventually(WAIT, "widget small's status at the origin", || {
            let status = kubectl_get(
                &p.origin,
                &["-n", "shop", "widget", "small", "-o", "jsonpath={.status}"],
            )?;
            status.contains("ready").then_some(status)
        })
        .await;
    println!("widget small's status at the origin: {status}");
    assert!(!status.contains("internal"), "{status}");
    provider_status(&p, "small", serde_json::json!({"ready": false})).await;
    p.eventually(
        WAIT,
        "widget small's status to follow at the origin",
        || {
            let ready = kubectl_get(
                &p.origin,
                &[
                    "-n",
                    "shop",
                    "widget",
                    "small",
                    "-o",
                    "jsonpath={.status.ready}",
                ],
            )?;
            (ready == "false").then_some(())
        },
    )
    .await;

    // The provider's schema refuses a size over its maximum: nothing written, the reason on
    // the origin object.
    apply_origin(&p, "Widget", "huge", "{size: 100}");
    let said = until_warning(
        &p,
        "huge",
        "the provider's schema of example.com/v1 Widget refuses it",
    )
    .await;
    println!("widget huge refused: {said}");
    assert!(said.contains("spec.size"), "{said}");
    assert!(provider(&p, "widget/huge", "{.metadata.name}").is_none());

    // A field the provider's schema does not have: refused, named (Kubernetes 1.20 refuses
    // it in the dry run; a newer API server that prunes it instead is caught by the agent).
    apply_origin(&p, "Widget", "painted", "{size: 2, colour: red}");
    let said = until_warning(
        &p,
        "painted",
        "the provider's schema of example.com/v1 Widget",
    )
    .await;
    assert!(said.contains("spec.colour"), "{said}");
    println!("widget painted refused: {said}");
    assert!(provider(&p, "widget/painted", "{.metadata.name}").is_none());

    // A kind the provider's policy does not let this tenant write.
    apply_origin(&p, "Gadget", "g1", "{size: 1}");
    let said = until_warning(&p, "g1", "not among the custom kinds this tenant may write").await;
    println!("gadget g1 refused: {said}");
    assert!(provider(&p, "gadget/g1", "{.metadata.name}").is_none());

    // A kind the policy allows but the provider does not serve.
    apply_origin(&p, "Gizmo", "z1", "{size: 1}");
    let said = until_warning(
        &p,
        "z1",
        "the provider does not serve example.com/v1 gizmos",
    )
    .await;
    println!("gizmo z1 refused: {said}");

    // Fixed at the origin, the painted Widget goes through; deleted there, the small one goes
    // from the provider.
    apply_origin(&p, "Widget", "painted", "{size: 2}");
    until_size(
        &p,
        "widget/painted",
        2,
        "widget painted on the provider once fixed",
    )
    .await;
    // Dropped from the values while the agent runs, Widgets are withdrawn from the provider;
    // named again, they are sent anew.
    std::fs::write(&values, VALUES.replace("    - {group: example.com, version: v1, kind: Widget, plural: widgets, status: [ready]}\n", "")).unwrap();
    p.eventually(WAIT, "widget painted withdrawn", || {
        provider(&p, "widget/painted", "{.metadata.name}")
            .is_none()
            .then_some(())
    })
    .await;
    std::fs::write(&values, VALUES).unwrap();
    until_size(&p, "widget/painted", 2, "widget painted sent anew").await;
    println!("Widgets dropped from the values were withdrawn, and sent anew when named again");
    p.origin_kubectl(&["-n", "shop", "delete", "widget", "small"]);
    p.eventually(WAIT, "widget small gone from the provider", || {
        provider(&p, "widget/small", "{.metadata.name}")
            .is_none()
            .then_some(())
    })
    .await;
    let remote_log = p.remote_log();
    assert!(
        remote_log.contains("custom kind tenants may write"),
        "the remote agent does not say which custom kinds it watches:\n{remote_log}"
    );

    // A policy change letting this tenant write Gadgets: the remote agent asks the origin for
    // the Gadget it denied, and writes it, with no change at the origin.
    std::fs::write(
        &policy,
        POLICY.replace(
            "  other:",
            "    - {group: example.com, version: v1, kind: Gadget, plural: gadgets}\n  other:",
        ),
    )
    .unwrap();
    until_size(
        &p,
        "gadget/g1",
        1,
        "gadget g1 on the provider once the policy allows it",
    )
    .await;
    println!("gadget g1 reflected after the policy file let the tenant write Gadgets");

    // A kind neither agent had when it started: its CRD installed in both clusters, named in
    // the values and the policy while the agents run, reflected with no restart; restored on
    // the provider (the new kind's watch there), its status brought back.
    for cluster in [&p.origin, &p.provider] {
        kubectl_stdin(
            cluster,
            &["apply", "-f", "-"],
            &crd("Doodad", "doodads", LOOSE),
        );
        refract_e2e::kubectl(
            cluster,
            &[
                "wait",
                "--for=condition=Established",
                "crd/doodads.example.com",
                "--timeout=30s",
            ],
        );
    }
    let_tenants_write(&p, &["doodads"]);
    let doodads = "    - {group: example.com, version: v1, kind: Doodad, plural: doodads}\n";
    // The origin first, bringing the whole status of Doodads back: the provider, which does
    // not know the kind yet, refuses the object.
    let doodads_back = doodads.replace("}\n", ", status: [\"*\"]}\n");
    std::fs::write(&values, format!("{VALUES}{doodads_back}")).unwrap();
    apply_origin(&p, "Doodad", "d1", "{size: 5}");
    let said = until_warning(&p, "d1", "Error reflecting object").await;
    println!("doodad d1 refused before the provider's policy names Doodads: {said}");
    // Then the provider's policy: the remote agent watches the kind from now on, and asks for
    // the object it denied.
    let policy_text = std::fs::read_to_string(&policy).unwrap();
    std::fs::write(
        &policy,
        policy_text.replace("  other:", &format!("{doodads}  other:")),
    )
    .unwrap();
    until_size(&p, "doodad/d1", 5, "doodad d1 on the provider").await;
    rewrite_on_provider(&p, "doodad", "d1", 6);
    until_size(&p, "doodad/d1", 5, "doodad d1 restored on the provider").await;
    provider_status_of(
        &p,
        ("Doodad", "doodads"),
        "d1",
        serde_json::json!({"phase": "Done"}),
    )
    .await;
    let status = p
        .eventually(WAIT, "doodad d1's status at the origin", || {
            let status = kubectl_get(
                &p.origin,
                &[
                    "-n",
                    "shop",
                    "doodad",
                    "d1",
                    "-o",
                    "jsonpath={.status.phase}",
                ],
            )?;
            (status == "Done").then_some(status)
        })
        .await;
    println!("doodad d1, a kind added to both agents' files while they run: reflected, restored after a provider edit, status {status} brought back");
    let remote_log = p.remote_log();
    assert!(
        remote_log.contains("custom kind added to the policy: watched from now on"),
        "the remote agent does not say it watches the added kind:\n{remote_log}"
    );
    assert!(
        !remote_log.contains("panicked") && !p.local_log().contains("panicked"),
        "an agent panicked"
    );
}
