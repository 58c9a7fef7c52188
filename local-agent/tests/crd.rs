//! The CRD shipped in `deploy/` is the one the code defines.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
#[test]
fn deployed_crd_matches_the_code() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/local-agent/namespaceoffloading-crd.yaml"
    );
    let deployed =
        std::fs::read_to_string(path).expect("deploy/local-agent/namespaceoffloading-crd.yaml");
    assert_eq!(
        deployed,
        refract_local_agent::crd::crd_yaml().unwrap(),
        "regenerate with `local-agent crd > deploy/local-agent/namespaceoffloading-crd.yaml`"
    );
}
