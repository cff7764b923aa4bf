"""The framework-sized image of pull_big.py: this host's files in 8 gzip layers, streamed to build/bench-pull/.

The image of issue 31 is 2 GiB of files, 100,000 of them, in 8 gzip layers (the size of a CUDA or PyTorch
image). It is made of this host's /usr (binaries, shared libraries, Python, headers, /usr/share): files are
taken in sorted walk order, a file being skipped when it would put the bytes taken more than SLACK ahead of their
share of the files taken (so both budgets run out together and big files do not crowd out small ones), then cut into 8
consecutive layers, each with the parent directories of its entries. Layers are written as they are read
(tarfile into gzip level 6, Go's and so Docker's default, into the blob file): memory stays small whatever
the size. Owners root, times fixed, set-id bits dropped; only what anyone may read (umoci and mksquashfs run
as the test user). Built once; `--rebuild` or another recipe version makes it again.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import stat
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import TypedDict

from pull_image import CACHE

RECIPE_VERSION = 2  # bump when the recipe changes: a cached layout of another version is rebuilt
GIB = 1 << 30
ROOTS = ("/usr/lib", "/usr/share", "/usr/include", "/usr/bin", "/usr/sbin", "/usr/libexec", "/usr/local")
MTIME = 1_700_000_000
SLACK = 320 << 20  # how far the bytes taken may run ahead of their share: this host's /usr then fills both budgets
LAYER_MEDIA = "application/vnd.oci.image.layer.v1.tar+gzip"


class FrameworkInfo(TypedDict):
    """build/bench-pull/NAME/image.json."""

    version: int
    files: int  # regular files
    entries: int  # tar members, all layers
    content_bytes: int  # regular files' bytes
    compressed_bytes: int  # the layer blobs
    layers: int


def host_files(file_budget: int, byte_budget: int) -> Iterator[tuple[str, os.stat_result]]:
    """(path, lstat) of regular files, links and directories under ROOTS, sorted, within both budgets."""
    files = used = 0
    share = byte_budget / file_budget
    for root in ROOTS:
        if not os.path.isdir(root) or os.path.islink(root):
            continue
        for current, dirs, names in os.walk(root):
            dirs.sort()
            for name in sorted(names):
                path = os.path.join(current, name)
                try:
                    info = os.lstat(path)
                except OSError:
                    continue
                if stat.S_ISREG(info.st_mode):
                    if not info.st_mode & 0o004 or used + info.st_size > (files + 1) * share + SLACK:
                        continue
                    files += 1
                    used += info.st_size
                elif not stat.S_ISLNK(info.st_mode):
                    continue
                yield path, info
                if files >= file_budget or used >= byte_budget:
                    return


class _Hashing:
    """A writable file object that hashes (sha256) and counts what goes through it."""

    def __init__(self, out: object) -> None:
        self.out, self.hash, self.size = out, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.hash.update(data)
        self.size += len(data)
        return self.out.write(data)  # type: ignore[attr-defined, no-any-return]

    def flush(self) -> None:
        pass


def _member(path: str, info: os.stat_result) -> tarfile.TarInfo:
    member = tarfile.TarInfo(path.lstrip("/"))
    member.mode = stat.S_IMODE(info.st_mode) & ~0o6000
    member.uid = member.gid = 0
    member.uname = member.gname = "root"
    member.mtime = MTIME
    if stat.S_ISLNK(info.st_mode):
        member.type, member.linkname = tarfile.SYMTYPE, os.readlink(path)
    elif stat.S_ISDIR(info.st_mode):
        member.type = tarfile.DIRTYPE
    else:
        member.size = info.st_size
    return member


def write_layer(blobs: Path, paths: list[tuple[str, os.stat_result]]) -> tuple[dict[str, object], str, int]:
    """One gzip layer of `paths` (with their parent directories) into blobs/: (descriptor, diff_id, content bytes)."""
    partial = blobs / "layer.partial"
    content = 0
    with open(partial, "wb") as raw:
        blob = _Hashing(raw)
        with gzip.GzipFile(fileobj=blob, mode="wb", compresslevel=6, mtime=0) as zipped:
            plain = _Hashing(zipped)
            with tarfile.open(fileobj=plain, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
                made: set[str] = set()
                for path, info in paths:
                    for parent in _parents(path, made):
                        tar.addfile(_member(parent, os.stat(parent)))
                    member = _member(path, info)
                    if member.isreg():
                        try:
                            with open(path, "rb") as data:
                                tar.addfile(member, data)
                        except OSError:
                            continue
                        content += member.size
                    else:
                        tar.addfile(member)
    digest = blob.hash.hexdigest()
    partial.rename(blobs / digest)
    return {"mediaType": LAYER_MEDIA, "digest": f"sha256:{digest}", "size": blob.size}, \
        f"sha256:{plain.hash.hexdigest()}", content


def _parents(path: str, made: set[str]) -> list[str]:
    found = []
    parent = os.path.dirname(path)
    while parent not in ("/", "") and parent not in made:
        made.add(parent)
        found.append(parent)
        parent = os.path.dirname(parent)
    return found[::-1]


def _put(blobs: Path, document: dict[str, object], media: str) -> dict[str, object]:
    data = json.dumps(document, separators=(",", ":")).encode()
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    return {"mediaType": media, "digest": f"sha256:{digest}", "size": len(data)}


def build_layout(where: Path, files: int, size: int, layers: int) -> FrameworkInfo:
    """The OCI layout (tag latest) at `where`, made of `files` host files holding about `size` bytes."""
    blobs = where / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    chosen = list(host_files(files, size))
    descriptors, diff_ids, content = [], [], 0
    for number in range(layers):
        part = chosen[number * len(chosen) // layers:(number + 1) * len(chosen) // layers]
        print(f"  layer {number + 1}/{layers}: {len(part)} entries ...", file=sys.stderr)
        descriptor, diff_id, used = write_layer(blobs, part)
        descriptors.append(descriptor)
        diff_ids.append(diff_id)
        content += used
    config = _put(blobs, {"architecture": "amd64", "os": "linux", "config": {"Cmd": ["/bin/sh"]},
                          "rootfs": {"type": "layers", "diff_ids": diff_ids}},
                  "application/vnd.oci.image.config.v1+json")
    manifest = _put(blobs, {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                            "config": config, "layers": descriptors}, "application/vnd.oci.image.manifest.v1+json")
    manifest["annotations"] = {"org.opencontainers.image.ref.name": "latest"}
    (where / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [manifest]}))
    (where / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    return {"version": RECIPE_VERSION, "files": sum(1 for _, info in chosen if stat.S_ISREG(info.st_mode)),
            "entries": len(chosen), "content_bytes": content, "layers": layers,
            "compressed_bytes": sum(int(str(d["size"])) for d in descriptors)}


def framework_layout(name: str, files: int, size: int, layers: int, rebuild: bool) -> tuple[Path, FrameworkInfo]:
    """The cached layout build/bench-pull/NAME/layout (built first if missing or of another recipe)."""
    where = CACHE / name
    info_file = where / "image.json"
    wanted = {"version": RECIPE_VERSION, "budget": [files, size, layers]}
    if not rebuild and info_file.exists():
        try:
            info = json.loads(info_file.read_text())
            if {key: info.get(key) for key in wanted} == wanted and (where / "layout" / "index.json").exists():
                return where / "layout", info
        except ValueError:
            pass
    print(f"building the {name} image ({files} files, {size / GIB:.2f} GiB, {layers} layers) in {where} ...",
          file=sys.stderr)
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    info = build_layout(where / "layout", files, size, layers)
    for path in [where, *where.rglob("*")]:  # the test user reads it (umoci, skopeo)
        path.chmod(0o755 if path.is_dir() else 0o644)
    info_file.write_text(json.dumps({**info, **wanted}, indent=1) + "\n")  # last: a layout without it is rebuilt
    return where / "layout", info
