#!/usr/bin/env bash
# What the agents cost while nothing changes: 10,000 reflected ConfigMaps and 1,000 offloaded
# pods (fake-kubelet nodes on the provider), then both agents' CPU and wake-ups over an idle
# minute, and the watches the remote agent holds on the provider's API server by kind.
# Builds what is missing first (release profile); about ten minutes.
# Extra arguments go to idle-bench (see --help), for example --objects 1000 --pods 100.
# REFRACT_BIN_DIR=<dir> measures the agents in <dir> instead (say, an earlier commit's build).
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '\033[1m[bench-idle]\033[0m %s\n' "$*" >&2; }

say "toolchain: etcd and Kubernetes 1.20.2 (cached after the first run)"
eval "$(scripts/ensure-toolchain.sh | grep '^REFRACT_K8S_BIN=')"
export REFRACT_K8S_BIN
say "building the agents, refract-certs and idle-bench (release)"
cargo build --release --locked --bin local-agent --bin remote-agent --bin refract-certs --bin idle-bench
say "running"
export REFRACT_BIN_DIR="${REFRACT_BIN_DIR:-$PWD/target/release}"
exec target/release/idle-bench "$@"
