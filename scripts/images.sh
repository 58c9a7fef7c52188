#!/usr/bin/env bash
# Builds the images the real test nodes and the in-cluster agents run, without Docker, from
# files on this machine:
#
#   refract.local/pause:<k8s version>          Kubernetes' pause.c, built by ensure-toolchain.sh
#   refract.local/busybox:<Debian version>     Debian's busybox-static, with its applet links
#   refract.local/local-agent:<version>        from local-agent/Containerfile, with buildah
#   refract.local/remote-agent:<version>       from remote-agent/Containerfile
#   refract.local/refractctl:<version>         from refractctl/Containerfile
#
#   scripts/images.sh                          # all, binaries built with `cargo build --release`
#   scripts/images.sh --profile debug          # binaries from target/debug (what the tests build)
#   scripts/images.sh --base                   # pause and busybox only
#   scripts/images.sh --push 127.0.0.1:5000/refract   # also push the three to a registry
#
# pause and busybox are OCI archives in target/images/ (or --out DIR), which testkit imports
# into its nodes with `ctr images import`. The agents and refractctl are built by Debian's
# buildah from their Containerfiles, on a stand-in for the distroless base made from this
# machine's glibc (no registry to pull the real one from here), in a storage of their own
# under ~/.cache/refract/containers; each is tagged <version> and <version>-<git revision>.
# With --push they go to REGISTRY/<name>:<both tags> (plain HTTP for 127.0.0.1 and localhost,
# TLS otherwise); testkit runs a registry on loopback and its nodes pull the agents from it.
# images.txt lists `name reference archive` (archive `-` for an image kept in buildah's
# storage). Nothing is rebuilt whose inputs did not change.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
say() { printf '\033[1m[images]\033[0m %s\n' "$*" >&2; }

PROFILE=release
OUT=$ROOT/target/images
BASE_ONLY=0
PUSH=
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) PROFILE=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --base) BASE_ONLY=1; shift ;;
    --push) PUSH=${2%/}; shift 2 ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
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
  [ -x "$(command -v buildah)" ] || { echo "images.sh: buildah missing: run scripts/ensure-toolchain.sh (Debian's buildah)" >&2; exit 1; }
  VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
  SOURCE=$(sed -n 's/^repository = "\(.*\)"/\1/p' Cargo.toml | head -1)
  REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
  SHORT=${REVISION:0:12}
  # A tree with uncommitted changes is not the revision it names.
  if [ "$REVISION" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
    SHORT=$SHORT-dirty
  fi
  BINARIES=(local-agent remote-agent refractctl)
  if [ "$PROFILE" = release ]; then
    say "building the binaries (cargo build --release --bin local-agent --bin remote-agent --bin refractctl)"
    cargo build --release --locked --bin local-agent --bin remote-agent --bin refractctl
  else
    # The whole workspace, as scripts/test.sh builds it: a build of the binaries alone
    # would unify features differently and compile their crates a second time.
    say "building the binaries (cargo build --workspace --bins)"
    cargo build --locked --workspace --bins
  fi

  # buildah keeps its own storage, so that it never meets another tool's storage settings;
  # vfs needs no overlay support from the kernel, and these images are a few MB.
  BUILDAH=(buildah --root "$CACHE/containers/storage" --runroot "$CACHE/containers/run" --storage-driver vfs)

  # The stand-in for gcr.io/distroless/cc-debian12:nonroot: glibc and libgcc from this
  # machine's Debian packages, the nonroot user 65532, /tmp; no shell, no package manager.
  DEBIAN=$(cut -d. -f1 /etc/debian_version)
  BASE_REF=refract.local/distroless-cc:debian$DEBIAN
  base_stamp="$BASE_REF $(dpkg-query -W -f '${Version} ' libc6 libgcc-s1)"
  if [ "$(cat "$OUT/distroless-cc.ref" 2>/dev/null)" != "$base_stamp" ] \
      || ! "${BUILDAH[@]}" inspect --type image "$BASE_REF" >/dev/null 2>&1; then
    say "building $BASE_REF (glibc $(dpkg-query -W -f '${Version}' libc6) from Debian's packages)"
    rootfs=$OUT/stage/distroless-cc
    rm -rf "$rootfs"; mkdir -p "$rootfs/etc" "$rootfs/tmp" "$rootfs/home/nonroot"
    chmod 1777 "$rootfs/tmp"
    # Each file at the path its package names (a symlink stays a symlink, e.g. /lib64's
    # loader), under real folders whatever this machine's merged /usr makes of them.
    for f in $(dpkg -L libc6 libgcc-s1 | grep -E '\.so(\.[0-9]+)*$'); do
      mkdir -p "$rootfs$(dirname "$f")"
      cp -P --preserve=mode "$f" "$rootfs$f"
    done
    printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$rootfs/etc/passwd"
    printf 'root:x:0:\nnonroot:x:65532:\n' >"$rootfs/etc/group"
    c=$("${BUILDAH[@]}" from scratch)
    "${BUILDAH[@]}" copy --quiet "$c" "$rootfs/" / >/dev/null
    "${BUILDAH[@]}" config --user 65532:65532 --workingdir /home/nonroot \
      --label org.opencontainers.image.description="Debian $DEBIAN glibc and libgcc, user 65532 (a stand-in for distroless cc)" "$c"
    "${BUILDAH[@]}" commit --quiet --rm "$c" "$BASE_REF" >/dev/null
    echo "$base_stamp" >"$OUT/distroless-cc.ref"
  fi

  STAGE=$OUT/stage/$PROFILE
  mkdir -p "$STAGE"
  for bin in "${BINARIES[@]}"; do
    # Stripped: the debug build's line tables are most of its size and nothing in a pod reads them.
    if [ "$ROOT/target/$PROFILE/$bin" -nt "$STAGE/$bin" ] || [ ! -f "$STAGE/$bin" ]; then
      strip -o "$STAGE/$bin" "$ROOT/target/$PROFILE/$bin"
    fi
    ref=refract.local/$bin:$VERSION
    stamp="$ref $SHORT $PROFILE $(sha256sum "$STAGE/$bin" "$bin/Containerfile" | cut -c1-16 | tr '\n' ' ')$base_stamp"
    if [ "$(cat "$OUT/$bin.ref" 2>/dev/null)" != "$stamp" ] \
        || ! "${BUILDAH[@]}" inspect --type image "$ref-$SHORT" >/dev/null 2>&1; then
      say "building $ref-$SHORT from $bin/Containerfile ($PROFILE binary)"
      "${BUILDAH[@]}" bud --quiet --layers=false -f "$ROOT/$bin/Containerfile" \
        --build-arg BASE="$BASE_REF" --build-arg VERSION="$VERSION" \
        --build-arg REVISION="$REVISION" --build-arg SOURCE="$SOURCE" \
        -t "$ref" -t "$ref-$SHORT" "$STAGE" >/dev/null
      echo "$stamp" >"$OUT/$bin.ref"
    fi
    if [ -n "$PUSH" ]; then
      tls=true
      case "$PUSH" in 127.0.0.1[:/]*|localhost[:/]*) tls=false ;; esac
      for tag in "$VERSION" "$VERSION-$SHORT"; do
        "${BUILDAH[@]}" push --quiet --tls-verify=$tls "$ref-$SHORT" "docker://$PUSH/$bin:$tag" >/dev/null
      done
      say "pushed $PUSH/$bin:$VERSION-$SHORT"
      echo "$bin $PUSH/$bin:$VERSION-$SHORT -" >>"$LIST"
    else
      echo "$bin $ref-$SHORT -" >>"$LIST"
    fi
  done
fi
mv "$LIST" "$OUT/images.txt"
say "images: $(cut -d' ' -f2 "$OUT/images.txt" | tr '\n' ' ')"
