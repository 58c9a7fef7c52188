//! Desired objects kept whole, deflated.
//!
//! The remote agent keeps whole only what it must restore without the origin (twin
//! namespaces, ShadowPods, pods' token Secrets; see [`super::desired`]), one per offloaded pod
//! at least, and reads one back only to restore a copy someone changed or deleted on the
//! provider. So each is deflated once as it is written and inflated on that rare path: a
//! small ShadowPod's JSON text shrinks to a little over half (540 bytes to 298 for the one in
//! the tests below), a larger one, with more repeated keys, further.

use std::io::{Read, Write};

use flate2::read::DeflateDecoder;
use flate2::write::DeflateEncoder;
use flate2::Compression;

/// JSON text, deflated.
#[derive(Clone)]
pub(super) struct Packed(Box<[u8]>);

impl Packed {
    /// `text`, deflated; `None` only if the encoder fails, which writing into memory does not.
    pub(super) fn of(text: &str) -> Option<Self> {
        let mut encoder = DeflateEncoder::new(Vec::new(), Compression::fast());
        encoder.write_all(text.as_bytes()).ok()?;
        let packed = encoder.finish().ok()?;
        Some(Self(packed.into_boxed_slice()))
    }

    /// The text again; `None` if it does not inflate (not expected: it was deflated here).
    pub(super) fn text(&self) -> Option<String> {
        let mut text = String::new();
        DeflateDecoder::new(&self.0[..])
            .read_to_string(&mut text)
            .ok()?;
        Some(text)
    }

    /// Bytes held.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_comes_back_as_it_went_in_and_smaller() {
        let text = serde_json::json!({
            "apiVersion": "offloading.refract.io/v1alpha1",
            "kind": "ShadowPod",
            "metadata": {"name": "web-7d4b9c8f5-x2x9k", "namespace": "apps-origin",
                "labels": {"app": "web", "pod-template-hash": "7d4b9c8f5",
                    "refract.io/origin": "origin-cluster", "refract.io/managed-by": "refract"}},
            "spec": {"pod": {"containers": [
                {"name": "web", "image": "nginx:1.27", "ports": [{"containerPort": 80}],
                 "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}},
                {"name": "sidecar", "image": "busybox:1.36", "command": ["sleep", "3600"],
                 "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}},
        })
        .to_string();
        let packed = Packed::of(&text).unwrap();
        assert_eq!(packed.text().as_deref(), Some(text.as_str()));
        assert!(
            packed.len() < text.len() * 3 / 4,
            "{} of {}",
            packed.len(),
            text.len()
        );
        assert_eq!(Packed::of("").unwrap().text().as_deref(), Some(""));
    }

    #[test]
    fn bytes_that_do_not_inflate_read_as_nothing() {
        assert_eq!(Packed(Box::new([0xff, 0x00, 0x12])).text(), None);
    }
}
