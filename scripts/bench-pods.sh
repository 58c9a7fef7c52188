#!/usr/bin/env bash
# Times pod offloading on real nodes: single pods created at the origin until Running there,
# against the same pods created directly on the provider (p50, p99, ratio), and a Deployment of
# 100 replicas each way. Builds what is missing first (release profile); about ten minutes.
# Extra arguments go to pod-bench (see --help), for example --pods 100 --replicas 50.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '\033[1m[bench-pods]\033[0m %s\n' "$*" >&2; }

say "toolchain: etcd, Kubernetes 1.20.2 with kubelet, containerd (cached after the first run)"
eval "$(scripts/ensure-toolchain.sh | grep '^REFRACT_K8S_BIN=')"
export REFRACT_K8S_BIN
say "building the agents, refract-certs and pod-bench (release), and the node images"
cargo build --release --locked --bin local-agent --bin remote-agent --bin refract-certs --bin pod-bench
scripts/images.sh --base
say "running"
# The agents and refract-certs the run starts are the release builds beside it.
export REFRACT_BIN_DIR="$PWD/target/release"
exec target/release/pod-bench "$@"
