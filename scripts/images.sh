#!/usr/bin/env bash
# Builds the OCI image archives the real test nodes and the in-cluster agents run, without
# Docker or a registry, from files on this machine:
#
#   refract.local/pause:<k8s version>         Kubernetes' pause.c, built by ensure-toolchain.sh
#   refract.local/busybox:<Debian version>    Debian's busybox-static, with its applet links
#   refract.local/local-agent:<version>       the agent binary and the libraries it links
#   refract.local/remote-agent:<version>
#
#   scripts/images.sh                      # all four, agents built with `cargo build --release`
#   scripts/images.sh --profile debug      # agents from target/debug (what the tests build)
#   scripts/images.sh --base               # pause and busybox only
#
# Archives go to target/images/ (or --out DIR) with images.txt listing `name reference file`;
# an archive is rewritten only when its inputs changed. Load one into a node's containerd with
# `ctr --address <socket> -n k8s.io images import <file>`; testkit does this for its nodes.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
say() { printf '\033[1m[images]\033[0m %s\n' "$*" >&2; }

PROFILE=release
OUT=$ROOT/target/images
BASE_ONLY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) PROFILE=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --base) BASE_ONLY=1; shift ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "images.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$PROFILE" in release|debug) ;; *) echo "images.sh: --profile is release or debug" >&2; exit 2 ;; esac

CACHE="${REFRACT_CACHE:-$HOME/.cache/refract}"
K8S_VERSION=1.20.2
PAUSE_BIN="${REFRACT_K8S_BIN:-$CACHE/k8s-$K8S_VERSION}/pause"
[ -x "$PAUSE_BIN" ] || { echo "images.sh: $PAUSE_BIN missing: run scripts/ensure-toolchain.sh" >&2; exit 1; }
[ -x /bin/busybox ] || { echo "images.sh: /bin/busybox missing: run scripts/ensure-toolchain.sh (Debian's busybox-static)" >&2; exit 1; }
mkdir -p "$OUT"
LIST=$OUT/images.txt.tmp
: >"$LIST"

# archive NAME REFERENCE INPUT... -- builder args: rebuilt when an input is newer, or when
# what the archive holds changed ($STAMP: the reference, and the profile of an agent's binary).
archive() {
  local name=$1 ref=$2; shift 2
  local inputs=() file=$OUT/$name.tar
  while [ "$1" != -- ]; do inputs+=("$1"); shift; done; shift
  local stale=0
  [ -f "$file" ] || stale=1
  for i in "${inputs[@]}" scripts/oci-archive.py "$0"; do [ "$i" -nt "$file" ] && stale=1; done
  local stamp="$ref${STAMP_EXTRA:+ $STAMP_EXTRA}"
  [ "$(cat "$OUT/$name.ref" 2>/dev/null)" = "$stamp" ] || stale=1
  if [ $stale = 1 ]; then
    say "building $ref${STAMP_EXTRA:+ ($STAMP_EXTRA)}"
    python3 scripts/oci-archive.py --name "$ref" --out "$file" "$@"
    echo "$stamp" >"$OUT/$name.ref"
  fi
  echo "$name $ref $file" >>"$LIST"
}

archive pause "refract.local/pause:$K8S_VERSION" "$PAUSE_BIN" -- \
  --file "$PAUSE_BIN:/pause" --entrypoint /pause --user 65535

BUSYBOX_VERSION=$(dpkg-query -W -f '${Version}' busybox-static | sed 's/^[0-9]*://; s/-.*//')
links=()
# The list names busybox itself: a link there would replace the binary.
for applet in $(/bin/busybox --list); do
  [ "$applet" = busybox ] || links+=(--symlink "/bin/$applet:busybox")
done
archive busybox "refract.local/busybox:$BUSYBOX_VERSION" /bin/busybox -- \
  --file /bin/busybox:/bin/busybox "${links[@]}" --dir /tmp --entrypoint /bin/sh

if [ $BASE_ONLY = 0 ]; then
  VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
  if [ "$PROFILE" = release ]; then
    say "building the agents (cargo build --release --bin local-agent --bin remote-agent)"
    cargo build --release --locked --bin local-agent --bin remote-agent
  else
    # The whole workspace, as scripts/test.sh builds it: a build of the two binaries alone
    # would unify features differently and compile their crates a second time.
    say "building the agents (cargo build --workspace --bins)"
    cargo build --locked --workspace --bins
  fi
  STAGE=$OUT/stage/$PROFILE
  mkdir -p "$STAGE"
  STAMP_EXTRA=$PROFILE
  for agent in local-agent remote-agent; do
    bin=$ROOT/target/$PROFILE/$agent
    # Stripped: the debug build's line tables are most of its size and nothing in a pod reads them.
    if [ "$bin" -nt "$STAGE/$agent" ] || [ ! -f "$STAGE/$agent" ]; then
      strip -o "$STAGE/$agent" "$bin"
    fi
    libs=()
    for lib in $(ldd "$bin" | grep -oE '/[^ ]+'); do libs+=(--file "$lib:$lib"); done
    archive "$agent" "refract.local/$agent:$VERSION" "$STAGE/$agent" -- \
      --file "$STAGE/$agent:/usr/local/bin/$agent" "${libs[@]}" --dir /tmp \
      --entrypoint "/usr/local/bin/$agent" --user 65532
  done
fi
mv "$LIST" "$OUT/images.txt"
say "archives in $OUT: $(cut -d' ' -f2 "$OUT/images.txt" | tr '\n' ' ')"
