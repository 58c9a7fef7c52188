//! Real Kubernetes control planes for Refract's end-to-end tests and demo.
//!
//! [`ControlPlane::start`] runs etcd and kube-apiserver 1.20.2 (optionally kube-scheduler and
//! kube-controller-manager) as child processes on free 127.0.0.1 ports, writes an admin
//! kubeconfig, and installs the `discovery.k8s.io/v1` EndpointSlice shim (see
//! `shared/design/testing.md`). Dropping it stops everything and removes its files.
//!
//! With [`Options::with_node`] a cluster also gets a real [`node`]: containerd, kubelet
//! 1.20.2 and a CNI bridge, running pods as real containers from the images of
//! `scripts/images.sh` ([`images`]: the base images imported from archives, the agents pulled
//! from a real [`registry`] on loopback); with [`Options::with_own_network`] that node has a
//! network namespace of its own and runs kube-proxy, so Services route ([`node_network`]).
//!
//! [`fake_kubelet`] stands in for the provider's kubelets: it registers Nodes with capacity and
//! runs the pods bound to them (Running, with IPs from a pod CIDR).
//!
//! Binaries come from `$REFRACT_K8S_BIN` or `~/.cache/refract/k8s-1.20.2/`, built by
//! `scripts/ensure-toolchain.sh`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test and benchmark harness: a panic is how it reports a failed step"
)]
pub mod control_plane;
pub mod endpointslice_mirror;
pub mod fabric;
pub mod fake_cert_manager;
pub mod fake_kubelet;
pub mod fake_provisioner;
pub mod fuzz;
pub mod images;
pub mod netns;
pub mod node;
pub mod node_network;
pub mod pki;
pub mod ports;
pub mod procfs;
pub mod registry;

pub use control_plane::{ControlPlane, Options};
