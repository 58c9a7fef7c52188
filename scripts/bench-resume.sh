#!/usr/bin/env bash
# Measures what a reconnect costs with many objects reflected (default 10,000 ConfigMaps): bytes
# sent against a full resend, time until both sides agree, Upserts and provider writes, for a
# local agent restart, changes made while it was down, and a remote agent restart. Builds what
# is missing first (release profile); a few minutes. Extra arguments go to resume-bench (see
# --help).
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '\033[1m[bench-resume]\033[0m %s\n' "$*" >&2; }

say "toolchain: etcd and Kubernetes 1.20.2 (cached after the first run)"
eval "$(scripts/ensure-toolchain.sh | grep '^REFRACT_K8S_BIN=')"
export REFRACT_K8S_BIN
say "building the agents, refract-certs and resume-bench (release)"
cargo build --release --locked --bin local-agent --bin remote-agent --bin refract-certs --bin resume-bench
say "running"
# The agents and refract-certs the run starts are the release builds beside it.
export REFRACT_BIN_DIR="$PWD/target/release"
exec target/release/resume-bench "$@"
