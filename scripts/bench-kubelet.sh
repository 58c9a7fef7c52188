#!/usr/bin/env bash
# Measures the virtual node's kubelet API: time to the first log line and an exec round trip
# through Refract against the same command on the provider, and reflection latency with and
# without ten concurrent `kubectl logs -f`. Builds what is missing first (release profile);
# about five minutes. Extra arguments go to kubelet-bench (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '\033[1m[bench-kubelet]\033[0m %s\n' "$*" >&2; }

say "toolchain: etcd, Kubernetes 1.20.2 with kubelet, containerd (cached after the first run)"
eval "$(scripts/ensure-toolchain.sh | grep '^REFRACT_K8S_BIN=')"
export REFRACT_K8S_BIN
say "building the agents, refract-certs and kubelet-bench (release), and the node images"
cargo build --release --locked --bin local-agent --bin remote-agent --bin refract-certs --bin kubelet-bench
scripts/images.sh --base
say "running"
# The agents and refract-certs the run starts are the release builds beside it.
export REFRACT_BIN_DIR="$PWD/target/release"
exec target/release/kubelet-bench "$@"
