#!/usr/bin/env python3
"""Writes an OCI image archive (what `ctr images import` loads) from files on this machine.

The archive holds `oci-layout`, `index.json` (named with the `io.containerd.image.name`
annotation) and `blobs/sha256/`: one uncompressed layer, the image config and the manifest.
Every timestamp and owner is fixed, so the same inputs give the same bytes.

  oci-archive.py --name refract.local/busybox:1.35.0 --out busybox.tar \
      --file /bin/busybox:/bin/busybox --symlink /bin/sh:busybox --entrypoint /bin/sh
"""
import argparse
import hashlib
import io
import json
import os
import tarfile


def layer_bytes(files, symlinks, dirs):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        made = set()

        def add_dir(path):
            parts = path.strip("/").split("/")
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d and d not in made:
                    made.add(d)
                    info = tarfile.TarInfo(d)
                    info.type = tarfile.DIRTYPE
                    info.mode = 0o1777 if d == "tmp" else 0o755
                    tar.addfile(info)

        for d in dirs:
            add_dir(d)
        for src, dst in sorted(files, key=lambda f: f[1]):
            add_dir(os.path.dirname(dst))
            with open(src, "rb") as f:
                data = f.read()
            info = tarfile.TarInfo(dst.lstrip("/"))
            info.size = len(data)
            info.mode = 0o755 if os.access(src, os.X_OK) else 0o644
            tar.addfile(info, io.BytesIO(data))
        for link, target in sorted(symlinks):
            add_dir(os.path.dirname(link))
            info = tarfile.TarInfo(link.lstrip("/"))
            info.type = tarfile.SYMTYPE
            info.linkname = target
            info.mode = 0o777
            tar.addfile(info)
    return buf.getvalue()


def blob(out, data):
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    info.mode = 0o644
    out.addfile(info, io.BytesIO(data))
    return f"sha256:{digest}", len(data)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", required=True, help="image reference, e.g. refract.local/pause:1.20.2")
    p.add_argument("--out", required=True, help="the archive to write")
    p.add_argument("--file", action="append", default=[], help="SRC:DST, a file copied into the image")
    p.add_argument("--symlink", action="append", default=[], help="LINK:TARGET")
    p.add_argument("--dir", action="append", default=[], help="an empty folder to create")
    p.add_argument("--entrypoint", action="append", default=[], help="entrypoint word (repeatable)")
    p.add_argument("--user", default="", help="default user, e.g. 65532")
    a = p.parse_args()

    files = [tuple(f.split(":", 1)) for f in a.file]
    symlinks = [tuple(s.split(":", 1)) for s in a.symlink]
    layer = layer_bytes(files, symlinks, a.dir)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": a.entrypoint or None, "User": a.user, "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }
    tmp = a.out + ".tmp"
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as out:
        layer_digest, layer_size = blob(out, layer)
        config_bytes = json.dumps(config, sort_keys=True).encode()
        config_digest, config_size = blob(out, config_bytes)
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config_size},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest, "size": layer_size}],
        }
        manifest_digest, manifest_size = blob(out, json.dumps(manifest, sort_keys=True).encode())
        index = {
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest,
                "size": manifest_size,
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": a.name,
                    "org.opencontainers.image.ref.name": a.name.rsplit(":", 1)[1],
                },
            }],
        }
        for name, data in (("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", json.dumps(index, sort_keys=True).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            out.addfile(info, io.BytesIO(data))
    os.replace(tmp, a.out)


if __name__ == "__main__":
    main()
