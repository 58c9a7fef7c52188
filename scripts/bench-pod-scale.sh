#!/usr/bin/env bash
# 10,000 pods offloaded through one peering (fake-kubelet nodes on the provider): how long
# until every one is Running at the origin and where that time goes, a provider pod's status
# back at the origin under the burst and at 50 changes a second, and each agent's memory per
# pod. Builds what is missing first (release profile).
# Extra arguments go to pod-scale-bench (see --help), for example --pods 1000.
# REFRACT_BIN_DIR=<dir> measures the agents in <dir> instead (say, an earlier commit's build).
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '\033[1m[bench-pod-scale]\033[0m %s\n' "$*" >&2; }

say "toolchain: etcd and Kubernetes 1.20.2 (cached after the first run)"
eval "$(scripts/ensure-toolchain.sh | grep '^REFRACT_K8S_BIN=')"
export REFRACT_K8S_BIN
say "building the agents, refract-certs and pod-scale-bench (release)"
cargo build --release --locked --bin local-agent --bin remote-agent --bin refract-certs --bin pod-scale-bench
say "running"
export REFRACT_BIN_DIR="${REFRACT_BIN_DIR:-$PWD/target/release}"
exec target/release/pod-scale-bench "$@"
