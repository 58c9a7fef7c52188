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
        "/../deploy/remote-agent/shadowpod-crd.yaml"
    );
    let deployed = std::fs::read_to_string(path).expect("deploy/remote-agent/shadowpod-crd.yaml");
    assert_eq!(
        deployed,
        refract_remote_agent::shadowpod::crd_yaml().unwrap(),
        "regenerate with `remote-agent crd > deploy/remote-agent/shadowpod-crd.yaml`"
    );
}
