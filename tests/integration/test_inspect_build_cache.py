"""`singpy inspect`, `singpy build` and `singpy cache`, as root and unprivileged."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
from pathlib import Path

import pytest

from singpy.image.sif import read_sif
from tests.conftest import Singpy
from tests.support import sifs
from tests.support.sifs import assert_restored, entries, snapshot

ARM64 = Path(__file__).resolve().parents[1] / "data" / "sif-golden" / "real" / "busybox_arm64.sif"
ARM64_LABELS = """\
org.label-schema.build-arch: arm64
org.label-schema.build-date: Monday_2_August_2021_21:41:28_UTC
org.label-schema.schema-version: 1.0
org.label-schema.usage.singularity.deffile.bootstrap: docker
org.label-schema.usage.singularity.deffile.from: busybox:1.33.1
org.label-schema.usage.singularity.version: 3.8.1
"""


@pytest.fixture(scope="session")
def images(workdir: Path) -> dict[str, Path]:
    return sifs.all_images(workdir)


def owned_dir(singpy: Singpy, workdir: Path, name: str) -> Path:
    path = workdir / f"{name}-{singpy.profile}"
    path.mkdir(exist_ok=True)
    os.chown(path, singpy.uid, singpy.gid)
    return path


def siftool_list(image: Path) -> list[tuple[int, int, int, str]]:
    """(id, start, end, type) of each object, as the reference tool reads the file."""
    out = subprocess.run(["siftool", "list", str(image)], capture_output=True, text=True, check=True).stdout
    rows = re.findall(r"^(\d+)\s+\|[^|]*\|[^|]*\|(\d+)-(\d+)\s+\|(.*)$", out, re.MULTILINE)
    return [(int(i), int(start), int(end), kind.strip()) for i, start, end, kind in rows]


# --- inspect --------------------------------------------------------------------------------------------------------


def test_inspect_labels_from_metadata_objects(singpy: Singpy, workdir: Path) -> None:
    """An arm64 image: read from its objects, nothing mounted or unpacked, the arch does not matter."""
    before = snapshot(workdir)
    assert singpy.ok("inspect", str(ARM64)) == ARM64_LABELS
    assert singpy.ok("inspect", "--deffile", str(ARM64)) == "BootStrap: docker\nFrom: busybox:1.33.1\n"
    environment = singpy.ok("inspect", "-e", str(ARM64))
    assert "=== /.singularity.d/env/10-docker2singularity.sh ===" in environment
    assert 'export PATH="/usr/local/sbin' in environment
    assert "OCI_CMD='\"sh\"'" in singpy.ok("inspect", "--runscript", str(ARM64))
    assert_restored(before, workdir)


def test_inspect_list_matches_siftool(singpy: Singpy) -> None:
    table = singpy.ok("inspect", "--list", str(ARM64)).splitlines()
    assert table[0].split() == ["ID", "GROUP", "LINK", "OFFSET", "SIZE", "TYPE", "NAME"]
    ours = []
    for line in table[1:]:
        fields = line.split()
        ours.append((int(fields[0]), int(fields[3 if fields[2] == "NONE" else 4]),
                     int(fields[4 if fields[2] == "NONE" else 5])))
    assert ours == [(i, start, end - start) for i, start, end, _ in siftool_list(ARM64)]
    assert "FS (Squashfs/*System/arm64)" in "\n".join(table)


def test_inspect_json_has_descriptors(singpy: Singpy) -> None:
    document = json.loads(singpy.ok("inspect", "--json", "--all", str(ARM64)))
    assert document["type"] == "container"
    attributes = document["data"]["attributes"]
    assert attributes["labels"]["org.label-schema.build-arch"] == "arm64"
    assert set(attributes) >= {"labels", "deffile", "runscript", "environment", "startscript"}
    descriptors = document["sif"]["descriptors"]
    assert [(d["id"], d["offset"], d["offset"] + d["size"]) for d in descriptors] == \
        [(i, start, end) for i, start, end, _ in siftool_list(ARM64)]
    primary = [d for d in descriptors if d.get("partition", {}).get("primary")]
    assert [(d["partition"]["fs"], d["partition"]["arch"]) for d in primary] == [("Squashfs", "arm64")]
    assert descriptors[-1]["link"] == 1 and descriptors[-1]["link_is_group"]
    assert document["sif"]["header"]["arch"] == "arm64"


def test_inspect_reads_the_root_filesystem_when_objects_lack_it(singpy: Singpy, images: dict[str, Path],
                                                               workdir: Path) -> None:
    """siftool's SIF carries only a deffile: the rest comes from the squashfs, unpacked aside, not mounted."""
    before = snapshot(workdir)
    assert singpy.ok("inspect", str(images["siftool"])) == "maker: tests.support.sifs\n"
    assert "Hello from a singpy container" in singpy.ok("inspect", "-r", str(images["siftool"]))
    assert singpy.ok("inspect", "-d", str(images["siftool"])) == "Bootstrap: localimage\nFrom: busybox\n"
    assert "Hello from a singpy container" in singpy.ok("inspect", "-r", str(images["squashfs"]))
    assert_restored(before, workdir)  # singpy's TMPDIR included: no singpy-inspect-* scratch left there


def test_inspect_sandbox_environment(singpy: Singpy, env_image: Path) -> None:
    out = singpy.ok("inspect", "--environment", str(env_image))
    assert "=== /.singularity.d/env/90-environment.sh ===\nexport FROM_IMAGE=image90" in out
    assert json.loads(singpy.ok("inspect", "--json", str(env_image))) == {"data": {"attributes": {}},
                                                                          "type": "container"}


def test_inspect_errors(singpy: Singpy, workdir: Path) -> None:
    result = singpy.run("inspect", str(workdir / "nope.sif"))
    assert result.returncode == 255
    assert result.stderr.startswith("FATAL:") and "does not exist" in result.stderr
    assert len(result.stderr.splitlines()) == 1


# --- build ----------------------------------------------------------------------------------------------------------


def test_build_sif_from_sandbox(singpy: Singpy, workdir: Path) -> None:
    tree = sifs.busybox_tree(workdir)
    out = owned_dir(singpy, workdir, "build") / "built.sif"
    out.unlink(missing_ok=True)
    singpy.ok("build", str(out), str(tree))
    # What apptainer build writes: deffile, inspect-metadata.json, squashfs primary partition, all group 1.
    assert [kind for _, _, _, kind in siftool_list(out)] == ["Def.FILE", "JSON.Generic",
                                                             "FS (Squashfs/*System/amd64)"]
    subprocess.run(["siftool", "header", str(out)], check=True, capture_output=True)
    image = read_sif(out)
    assert {d.group_id for d in image.descriptors} == {1}
    assert image.find(0x4006)[0].name == "inspect-metadata.json" and image.arch == "amd64"
    metadata = json.loads(subprocess.run(["siftool", "dump", "2", str(out)], capture_output=True,
                                         check=True).stdout)
    attributes = metadata["data"]["attributes"]
    assert attributes["labels"]["maker"] == "tests.support.sifs"
    assert attributes["labels"]["org.label-schema.build-arch"] == "amd64"
    assert attributes["deffile"] == f"bootstrap: localimage\nfrom: {tree}\n"
    with open(out, "rb") as handle:
        handle.seek(image.primary_partition().offset)
        superblock = handle.read(24)
    assert superblock[:4] == b"hsqs" and struct.unpack_from("<H", superblock, 20)[0] == 1  # gzip
    assert singpy.ok("exec", "--unsquash", str(out), "cat", "/etc/marker",
                     env=singpy.env(SINGPY_CACHEDIR=str(sifs.new_cache(singpy, workdir, "built")))
                     ).strip() == sifs.MARKER
    owner = subprocess.run(["unsquashfs", "-o", str(image.primary_partition().offset), "-lln", str(out),
                            "/etc/marker"], capture_output=True, text=True, check=True).stdout
    assert " 0/0 " in owner  # root-owned inside, whoever built it


def test_build_refuses_to_overwrite(singpy: Singpy, workdir: Path) -> None:
    out = owned_dir(singpy, workdir, "build") / "exists.sif"
    out.write_text("keep me")
    result = singpy.run("build", str(out), str(sifs.busybox_tree(workdir)))
    assert result.returncode == 255 and "already exists (use --force" in result.stderr
    assert out.read_text() == "keep me"
    singpy.ok("build", "--force", str(out), str(sifs.busybox_tree(workdir)))
    assert read_sif(out).primary_partition().arch == "amd64"
    assert sorted(os.listdir(out.parent)) == sorted({"exists.sif", *os.listdir(out.parent)})  # no leftovers
    assert not [name for name in os.listdir(out.parent) if name.startswith(".singpy-")]


@pytest.mark.parametrize("maker", ["siftool", "singpy", "squashfs", "arm64"])
def test_build_sandbox_from_image(singpy: Singpy, images: dict[str, Path], workdir: Path, maker: str) -> None:
    source = ARM64 if maker == "arm64" else images[maker]
    out = owned_dir(singpy, workdir, "unpack") / maker
    if out.exists():
        subprocess.run(["rm", "-rf", str(out)], check=True)
    singpy.ok("build", "--sandbox", str(out), str(source))
    assert (out / "bin" / "busybox").is_file() and (out / "dev").is_dir()
    if maker != "arm64":
        assert (out / "etc" / "marker").read_text().strip() == sifs.MARKER
        assert singpy.ok("exec", str(out), "cat", "/etc/marker").strip() == sifs.MARKER
    again = singpy.run("build", "--sandbox", str(out), str(source))
    assert again.returncode == 255 and "already exists" in again.stderr
    singpy.ok("build", "-F", "--sandbox", str(out), str(source))
    assert not [name for name in os.listdir(out.parent) if name.startswith(".singpy-")]


def test_output_kind_comes_from_sandbox_alone(singpy: Singpy, images: dict[str, Path], workdir: Path) -> None:
    """As Apptainer: a SIF unless --sandbox, whatever the source (a sandbox, a SIF, a squashfs image)."""
    out = owned_dir(singpy, workdir, "output-kind")
    singpy.ok("build", str(out / "from-sif.sif"), str(images["singpy"]))
    singpy.ok("build", str(out / "from-squashfs.sif"), str(images["squashfs"]))
    singpy.ok("build", "--sandbox", str(out / "tree"), str(images["singpy"]))
    singpy.ok("build", "--sandbox", str(out / "copy"), str(out / "tree"))
    singpy.ok("build", str(out / "from-tree.sif"), str(out / "copy"))
    for name in ("from-sif.sif", "from-squashfs.sif", "from-tree.sif"):
        assert (out / name).is_file() and (out / name).read_bytes()[32:41] == b"SIF_MAGIC", name
        assert singpy.ok("exec", str(out / name), "cat", "/etc/marker").strip() == sifs.MARKER
    assert (out / "copy" / "etc" / "marker").read_text().strip() == sifs.MARKER and (out / "tree").is_dir()
    assert not [name for name in os.listdir(out) if name.startswith(".singpy-")]
    # the image each was built from, as its labels name it: the source, never the scratch tree it went through
    for name, source in (("from-sif.sif", images["singpy"]), ("from-squashfs.sif", images["squashfs"]),
                         ("from-tree.sif", out / "copy")):
        labels = singpy.ok("inspect", "--labels", str(out / name))
        assert f"org.label-schema.usage.singularity.deffile.from: {source}\n" in labels, labels


def test_failed_unpack_leaves_nothing(singpy: Singpy, images: dict[str, Path], workdir: Path) -> None:
    broken = sifs.patched(images["singpy"], workdir / "unpack-broken.sif",
                          [(sifs.primary_offset(images["singpy"]) + 20, struct.pack("<H", 99))])
    parent = owned_dir(singpy, workdir, "unpack-fail")
    result = singpy.run("build", "--sandbox", str(parent / "out"), str(broken))
    assert result.returncode == 255, result.stderr
    assert result.stderr.startswith("FATAL:") and "unknown compression" in result.stderr, result.stderr
    assert os.listdir(parent) == []


# --- cache ----------------------------------------------------------------------------------------------------------


def test_cache_list_and_clean(singpy: Singpy, images: dict[str, Path], workdir: Path) -> None:
    cache = sifs.new_cache(singpy, workdir, "list-clean")
    env = singpy.env(SINGPY_CACHEDIR=str(cache))
    assert singpy.ok("cache", "list", env=env) == f"no unpacked images in {cache}\n"
    singpy.ok("exec", "--unsquash", str(images["singpy"]), "true", env=env)
    listing = singpy.ok("cache", "list", env=env).splitlines()
    assert listing[0].split() == ["DIGEST", "SIZE", "CREATED", "SOURCE"]
    assert listing[1].endswith(str(images["singpy"])) and listing[-1].startswith("1 unpacked image(s)")
    assert singpy.ok("cache", "clean", "--dry-run", env=env).startswith("would remove ")
    refused = singpy.run("cache", "clean", env=env)  # no terminal to answer the question: nothing removed
    assert refused.returncode == 1 and len(entries(cache)) == 2  # the tree and its .json
    assert singpy.ok("cache", "clean", "--force", env=env).startswith("removed 1 cache entries")
    assert entries(cache) == [] and os.listdir(cache / "index") == []
    assert singpy.ok("cache", "list", env=env).startswith("no unpacked images")


def test_cache_clean_removes_interrupted_extractions(singpy: Singpy, workdir: Path) -> None:
    cache = sifs.new_cache(singpy, workdir, "clean-partial")
    partial = cache / "rootfs" / f".{'a' * 64}.tmp-x1y2z3" / "root" / "ro"
    partial.mkdir(parents=True)
    partial.chmod(0o555)  # images carry read-only directories: clean must get through them
    subprocess.run(["chown", "-R", f"{singpy.uid}:{singpy.gid}", str(cache)], check=True)
    assert singpy.ok("cache", "clean", "-f", env=singpy.env(SINGPY_CACHEDIR=str(cache))).startswith("removed 1")
    assert entries(cache) == []


def test_cache_location_follows_xdg(singpy: Singpy, workdir: Path) -> None:
    xdg = owned_dir(singpy, workdir, "xdg")
    env = {name: value for name, value in singpy.env().items() if name != "SINGPY_CACHEDIR"}  # the fixtures' own
    out = singpy.ok("cache", "list", env={**env, "XDG_CACHE_HOME": str(xdg)})
    assert out == f"no unpacked images in {xdg}/singpy\n"
    assert singpy.ok("cache", "list", env=env).strip().endswith(f" in {singpy.home}/.cache/singpy")
