"""The pull benchmark's image: busybox plus this host's files in gzip layers, built once into build/bench-pull/."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from pathlib import Path
from typing import TypedDict

from startup_repo import REPO

from tests.support.oci import Entry, Image, Layer, busybox_entries, directory, file, hardlink, symlink, write_layout

CACHE = REPO / "build" / "bench-pull"  # the built image layouts, kept between runs (build/ is git-ignored)
IMAGE_VERSION = 1  # bump when the image recipe changes: a cached layout of another version is rebuilt
MB = 1_000_000
# Bytes of host files in each image: with busybox and the tar headers, about 200 MB (20 MB) of layer tars.
BIG_BYTES = 186 * MB
QUICK_BYTES = 17 * MB
# (host directory, its share of the image's bytes) per layer, after a busybox base layer; a directory this host
# lacks is left out. Binaries, Python source and bytecode, text and already-gzipped man pages: what real images
# hold, in their proportions.
LIB_DIR = next((str(p) for p in sorted(Path("/usr/lib").glob("*-linux-gnu")) if p.is_dir()), "/usr/lib")
PYTHON_DIR = f"/usr/lib/python3.{sys.version_info.minor}"
LAYERS: tuple[tuple[tuple[str, float], ...], ...] = (
    ((PYTHON_DIR, 0.25),),
    ((LIB_DIR, 0.45),),
    (("/usr/share/perl", 0.08), ("/usr/share/man", 0.08), ("/usr/share/doc", 0.06), ("/usr/share/i18n", 0.04),
     ("/usr/share/zoneinfo", 0.02), ("/usr/share/vim", 0.02)),
)


class LayerInfo(TypedDict):
    source: str  # the host directories, or "busybox"
    entries: int
    content_bytes: int  # regular files' bytes
    tar_bytes: int  # the uncompressed layer
    blob_bytes: int  # gzip


class ImageInfo(TypedDict):
    """What the image holds: build/bench-pull/KIND/image.json, and the JSON's "image"."""

    version: int
    budget: int  # bytes of host files asked for
    layers: list[LayerInfo]
    uncompressed_bytes: int
    compressed_bytes: int
    digest: str


def host_entries(source: str, budget: int) -> tuple[list[Entry], int]:
    """Entries for `source` (its parents first) in sorted walk order until `budget` bytes of files; the bytes.

    Only what anyone may read (the test user runs umoci and mksquashfs on it): a file without o+r, a directory
    without o+rx, sockets and devices are left out. Owners root, times fixed, hard links kept.
    """
    member = source.strip("/")
    parts = member.split("/")
    entries = [directory("/".join(parts[:n])) for n in range(1, len(parts) + 1)]
    used = 0
    seen: dict[tuple[int, int], str] = {}
    for current, dirs, files in os.walk(source):
        relative = os.path.relpath(current, source)
        kept_dirs = []
        for name in sorted([*dirs, *files]):
            path = os.path.join(current, name)
            name_in_image = os.path.normpath(os.path.join(member, relative, name))
            entry, size = _host_entry(path, name_in_image, seen)
            if entry is None or used + size > budget:
                continue
            entries.append(entry)
            used += size
            if entry.kind == "dir":
                kept_dirs.append(name)
        dirs[:] = sorted(kept_dirs)
        if used >= budget * 0.999:
            break
    return entries, used


def _host_entry(path: str, name: str, seen: dict[tuple[int, int], str]) -> tuple[Entry | None, int]:
    """The entry for one host path and the bytes it adds; None for what is left out."""
    try:
        info = os.lstat(path)
    except OSError:
        return None, 0
    mode = stat.S_IMODE(info.st_mode)
    if stat.S_ISLNK(info.st_mode):
        return symlink(name, os.readlink(path)), 0
    if stat.S_ISDIR(info.st_mode):
        return (directory(name, mode=mode), 0) if mode & 0o005 == 0o005 else (None, 0)
    if not stat.S_ISREG(info.st_mode) or not mode & 0o004:
        return None, 0
    key = (info.st_dev, info.st_ino)
    if info.st_nlink > 1 and key in seen:
        return hardlink(name, seen[key], mode=mode), 0
    try:
        with open(path, "rb") as handle:
            content = handle.read()
    except OSError:
        return None, 0
    seen[key] = name
    return file(name, content, mode=mode & ~0o6000), len(content)


def build_image(total: int) -> tuple[Image, list[LayerInfo]]:
    """busybox, then one layer per LAYERS entry, each its share of `total` bytes of this host's files."""
    base = Layer(busybox_entries())
    layers, infos = [base], [_layer_info("busybox", base, sum(len(e.content) for e in base.entries))]
    for sources in LAYERS:
        entries: list[Entry] = []
        content = 0
        present = [(path, share) for path, share in sources if os.path.isdir(path)]
        for path, share in present:
            found, used = host_entries(path, int(total * share))
            entries += found
            content += used
        if entries:
            layer = Layer(entries)
            layers.append(layer)
            infos.append(_layer_info(", ".join(path for path, _ in present), layer, content))
    return Image(layers, cmd=["/bin/sh"]), infos


def _layer_info(source: str, layer: Layer, content: int) -> LayerInfo:
    return {"source": source, "entries": len(layer.entries), "content_bytes": content, "tar_bytes": len(layer.tar),
            "blob_bytes": layer.size}


def cached_layout(kind: str, total: int, rebuild: bool) -> tuple[Path, ImageInfo]:
    """The OCI layout of the benchmark image `kind` ("big", "quick") under build/bench-pull/, built if needed."""
    where = CACHE / kind
    info_file = where / "image.json"
    if not rebuild and info_file.exists():
        try:
            info: ImageInfo = json.loads(info_file.read_text())
            if (info.get("version"), info.get("budget")) == (IMAGE_VERSION, total) \
                    and (where / "layout" / "index.json").exists():
                return where / "layout", info
        except ValueError:
            pass
    print(f"building the {kind} image ({total // MB} MB of this host's files) in {where} ...", file=sys.stderr)
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    image, layers = build_image(total)
    write_layout(where / "layout", {"latest": image})
    info = {"version": IMAGE_VERSION, "budget": total, "layers": layers,
            "uncompressed_bytes": sum(li["tar_bytes"] for li in layers),
            "compressed_bytes": sum(li["blob_bytes"] for li in layers), "digest": image.digest}
    info_file.write_text(json.dumps(info, indent=1) + "\n")  # last: a layout without it is built again
    return where / "layout", info
