#!/usr/bin/env python3
"""Build the nodelet test bed's images as OCI image layout archives.

The archives are deterministic (mtime 0, uid/gid 0, sorted entries, gzip
without name or time), so the same inputs always give the same digests.
Each archive holds one image: oci-layout, index.json and blobs/sha256/*
(one layer, the config, the manifest). The manifest descriptor in
index.json carries `io.containerd.image.name` with the full reference
(without it `ctr images import` imports nothing and still exits 0) and
`org.opencontainers.image.ref.name` with the tag.

    mkimage.py pause   --binary PATH     --ref localhost/pause:local   --out FILE
    mkimage.py busybox --busybox PATH    --ref localhost/busybox:local --out FILE [--stamp TEXT]
                       [--add SRC:DEST[:MODE]] [--dir DEST[:MODE]] [--link DEST:TARGET]
                       [--passwd LINE] [--group LINE] [--user USER] [--path PATH]
                       [--entrypoint JSON] [--cmd JSON]

The busybox options add files, directories and symlinks (MODE in octal, setuid bits
included), /etc/passwd and /etc/group lines, and set the config's User, PATH, Entrypoint
and Cmd: enough to stand in for upstream's small test images.

The manifest digest is printed on stdout (and written to --digest-file).
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"


class Tree:
    """The files of one layer, keyed by their path without a leading slash."""

    def __init__(self):
        self.entries = {}

    def _parents(self, path):
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in self.entries:
                self.dir(d)

    def dir(self, path, mode=0o755):
        path = path.strip("/")
        self._parents(path)
        self.entries[path] = ("dir", mode, None)

    def file(self, path, data, mode=0o644):
        path = path.strip("/")
        self._parents(path)
        self.entries[path] = ("file", mode, data)

    def symlink(self, path, target):
        path = path.strip("/")
        self._parents(path)
        self.entries[path] = ("symlink", 0o777, target)

    def tar(self):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
            for path in sorted(self.entries):
                kind, mode, payload = self.entries[path]
                info = tarfile.TarInfo(path)
                info.mode = mode
                info.mtime = 0
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                if kind == "dir":
                    info.type = tarfile.DIRTYPE
                    tf.addfile(info)
                elif kind == "symlink":
                    info.type = tarfile.SYMTYPE
                    info.linkname = payload
                    tf.addfile(info)
                else:
                    info.type = tarfile.REGTYPE
                    info.size = len(payload)
                    tf.addfile(info, io.BytesIO(payload))
        return buf.getvalue()


def sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical_json(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def gzip_bytes(data):
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
        gz.write(data)
    return buf.getvalue()


def split_ref(ref):
    """Return the tag of a reference like localhost/pause:local."""
    name = ref.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" not in last:
        raise SystemExit(f"mkimage: reference {ref!r} needs an explicit tag")
    return last.rsplit(":", 1)[1]


def build_layout(tree, image_config, ref, compress, arch):
    layer_tar = tree.tar()
    diff_id = sha256(layer_tar)
    layer_blob = gzip_bytes(layer_tar) if compress else layer_tar

    config = {
        "architecture": arch,
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": image_config,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "nodelet hack/mkimage.py"}],
    }
    config_blob = canonical_json(config)

    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": sha256(config_blob), "size": len(config_blob)},
        "layers": [{
            "mediaType": OCI_LAYER_GZIP if compress else OCI_LAYER,
            "digest": sha256(layer_blob),
            "size": len(layer_blob),
        }],
    }
    manifest_blob = canonical_json(manifest)
    manifest_digest = sha256(manifest_blob)

    index = {
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [{
            "mediaType": OCI_MANIFEST,
            "digest": manifest_digest,
            "size": len(manifest_blob),
            "platform": {"architecture": arch, "os": "linux"},
            "annotations": {
                "io.containerd.image.name": ref,
                "org.opencontainers.image.ref.name": split_ref(ref),
            },
        }],
    }

    outer = Tree()
    outer.file("oci-layout", canonical_json({"imageLayoutVersion": "1.0.0"}))
    outer.file("index.json", canonical_json(index))
    for blob in (layer_blob, config_blob, manifest_blob):
        outer.file("blobs/sha256/" + sha256(blob).split(":", 1)[1], blob)
    return outer.tar(), manifest_digest


def read_binary(path):
    with open(path, "rb") as f:
        return f.read()


def pause_image(args):
    tree = Tree()
    tree.file("pause", read_binary(args.binary), mode=0o755)
    config = {"Entrypoint": ["/pause"], "Env": ["PATH=/"], "WorkingDir": "/"}
    return tree, config


def busybox_image(args):
    out = subprocess.run([args.busybox, "--list"], check=True, capture_output=True, text=True).stdout
    applets = sorted({a.strip() for a in out.split() if a.strip() and "/" not in a})
    if not applets:
        raise SystemExit(f"mkimage: {args.busybox} --list gave no applets")

    tree = Tree()
    tree.file("bin/busybox", read_binary(args.busybox), mode=0o755)
    for applet in applets:
        if applet != "busybox":
            tree.symlink("bin/" + applet, "busybox")
    passwd = ["root:x:0:0:root:/root:/bin/sh", "nobody:x:65534:65534:nobody:/nonexistent:/bin/false"]
    group = ["root:x:0:", "nogroup:x:65534:"]
    tree.file("etc/passwd", "".join(line + "\n" for line in passwd + args.passwd).encode())
    tree.file("etc/group", "".join(line + "\n" for line in group + args.group).encode())
    tree.dir("root", mode=0o700)
    tree.dir("tmp", mode=0o1777)
    if args.stamp:
        tree.file("etc/nodelet-stamp", args.stamp.encode() + b"\n")
    for spec in args.dir:
        dest, _, mode = spec.partition(":")
        tree.dir(dest, mode=int(mode or "755", 8))
    for spec in args.add:
        parts = spec.split(":")
        if len(parts) not in (2, 3):
            raise SystemExit(f"mkimage: --add {spec!r}: want SRC:DEST[:MODE]")
        mode = int(parts[2], 8) if len(parts) == 3 else os.stat(parts[0]).st_mode & 0o7777
        tree.file(parts[1], read_binary(parts[0]), mode=mode)
    for spec in args.link:
        dest, sep, target = spec.partition(":")
        if not sep:
            raise SystemExit(f"mkimage: --link {spec!r}: want DEST:TARGET")
        tree.symlink(dest, target)
    config = {"Cmd": ["sh"], "Env": ["PATH=" + args.path], "WorkingDir": "/"}
    if args.entrypoint is not None:
        config["Entrypoint"] = json.loads(args.entrypoint)
    if args.cmd is not None:
        config["Cmd"] = json.loads(args.cmd)
    if args.user:
        config["User"] = args.user
    return tree, config


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="kind", required=True)
    for kind, flag, helptext in (("pause", "--binary", "the static pause binary"),
                                 ("busybox", "--busybox", "a static busybox binary")):
        p = sub.add_parser(kind)
        p.add_argument(flag, required=True, help=helptext)
        p.add_argument("--ref", required=True, help="full image reference, e.g. localhost/%s:local" % kind)
        p.add_argument("--out", required=True, help="archive to write")
        p.add_argument("--digest-file", help="also write the manifest digest here")
        p.add_argument("--arch", default="amd64", help="image architecture (default amd64)")
        p.add_argument("--no-gzip", dest="gzip", action="store_false", help="store the layer uncompressed")
        if kind == "busybox":
            p.add_argument("--stamp", help="write this text to /etc/nodelet-stamp (a distinct image)")
            p.add_argument("--add", action="append", default=[], help="SRC:DEST[:MODE], a file to add")
            p.add_argument("--dir", action="append", default=[], help="DEST[:MODE], a directory to add")
            p.add_argument("--link", action="append", default=[], help="DEST:TARGET, a symlink to add")
            p.add_argument("--passwd", action="append", default=[], help="a line for /etc/passwd")
            p.add_argument("--group", action="append", default=[], help="a line for /etc/group")
            p.add_argument("--path", default="/bin", help="the config's PATH (default /bin)")
            p.add_argument("--user", help="the config's User")
            p.add_argument("--entrypoint", help="the config's Entrypoint, a JSON array")
            p.add_argument("--cmd", help="the config's Cmd, a JSON array")
    args = parser.parse_args()

    tree, config = pause_image(args) if args.kind == "pause" else busybox_image(args)
    archive, digest = build_layout(tree, config, args.ref, args.gzip, args.arch)

    tmp = args.out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(archive)
    os.replace(tmp, args.out)
    if args.digest_file:
        with open(args.digest_file + ".tmp", "w") as f:
            f.write(digest + "\n")
        os.replace(args.digest_file + ".tmp", args.digest_file)
    print(digest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
