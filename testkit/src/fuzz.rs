//! Input generators for the fuzz-style property tests of every decoder of the other side's
//! input (protobuf messages, object JSON, quantities, labels, addresses).
//!
//! They run on stable Rust under `cargo test` with a fixed number of cases, so they are bounded
//! in time in CI; `PROPTEST_CASES` raises the count for a longer hunt.

use proptest::prelude::*;
use serde_json::{Map, Value};

/// Cases each fuzz property runs in CI: enough to cover the generators' shapes, a few seconds
/// in all.
pub const CASES: u32 = 512;

/// The proptest configuration of the fuzz properties: [`CASES`] cases unless `PROPTEST_CASES`
/// says otherwise, no files written for regressions (the seeds are printed on failure).
pub fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(CASES);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Text that parsers trip on: empty, huge, numbers with odd exponents and suffixes, addresses,
/// non-ASCII, control characters, and anything else.
pub fn tricky_text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("1e2147483647".to_string()),
        Just("-1e-2147483648".to_string()),
        Just("169.254.169.254".to_string()),
        Just("::ffff:127.0.0.1".to_string()),
        Just("kubernetes.io/hostname".to_string()),
        "[0-9]{1,40}(\\.[0-9]{0,20})?([eE][-+]?[0-9]{1,12})?(m|k|M|G|T|P|Ki|Mi|Gi|Ti|Pi|n|u|Qi)?",
        "[a-z0-9.-]{1,70}(/[A-Za-z0-9._-]{0,70})?",
        "(10|172|192|169|127|0|255)\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,4}",
        "[0-9a-fA-F:]{0,45}",
        "\\PC{0,64}",
        any::<String>(),
        "x{1000,5000}",
    ]
}

/// Any JSON value up to a few levels deep, with keys from Kubernetes' vocabulary so that
/// generated objects reach past the first field checks.
pub fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        tricky_text().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((json_key(), inner), 0..8)
                .prop_map(|pairs| Value::Object(pairs.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn json_key() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(
            &[
                "apiVersion",
                "kind",
                "metadata",
                "name",
                "namespace",
                "labels",
                "annotations",
                "spec",
                "status",
                "containers",
                "initContainers",
                "image",
                "securityContext",
                "privileged",
                "hostNetwork",
                "hostPID",
                "volumes",
                "hostPath",
                "ports",
                "type",
                "externalIPs",
                "loadBalancerIP",
                "endpoints",
                "addresses",
                "podIP",
                "podIPs",
                "ip",
                "containerStatuses",
                "restartCount",
                "phase",
                "data",
                "stringData",
                "storageClassName",
                "resources",
                "requests",
                "rules",
                "count",
                "reason",
                "message",
                "involvedObject",
            ][..]
        )
        .prop_map(str::to_string),
        "[a-zA-Z]{1,12}",
    ]
}

/// `valid` with up to `edits` random byte edits: flips, insertions, deletions, truncation.
pub fn mutated(valid: Vec<u8>, edits: usize) -> impl Strategy<Value = Vec<u8>> {
    let len = valid.len().max(1);
    prop::collection::vec((0..4u8, 0..len, any::<u8>()), 0..=edits).prop_map(move |ops| {
        let mut bytes = valid.clone();
        for (op, at, byte) in ops {
            let at = at.min(bytes.len());
            match op {
                0 if at < bytes.len() => bytes[at] ^= byte | 1,
                1 => bytes.insert(at, byte),
                2 if at < bytes.len() => {
                    bytes.remove(at);
                }
                _ => bytes.truncate(at),
            }
        }
        bytes
    })
}
