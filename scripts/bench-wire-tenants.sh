#!/usr/bin/env bash
# One remote agent serving 100 synthetic tenants, each speaking the wire itself with a client
# certificate of its own, 1,000 ConfigMaps each: aggregate burst throughput, each tenant's
# steady p99 and fairness, a noisy tenant's pipelined burst against the others' p99, and the
# remote agent's memory per connected tenant and per object. Builds what is missing first
# (release profile). Extra arguments go to wire-tenants-bench (see --help), e.g.
# --tenants 20 --noisy-objects 0.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '\033[1m[bench-wire-tenants]\033[0m %s\n' "$*" >&2; }

say "toolchain: etcd and Kubernetes 1.20.2 (cached after the first run)"
eval "$(scripts/ensure-toolchain.sh | grep '^REFRACT_K8S_BIN=')"
export REFRACT_K8S_BIN
say "building the remote agent, refract-certs and wire-tenants-bench (release)"
cargo build --release --locked --bin local-agent --bin remote-agent --bin refract-certs --bin wire-tenants-bench
say "running"
# The agent and refract-certs the run starts are the release builds beside it.
export REFRACT_BIN_DIR="$PWD/target/release"
exec target/release/wire-tenants-bench "$@"
