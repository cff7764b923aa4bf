"""Definition files and base images for the `singpy build OUT RECIPE.def` tests (issue 12).

The base images are made once per session under the session `workdir`, readable by the test user:

    base_sandbox(workdir)    busybox sandbox (tests.support.images) with /etc/base-marker "sandbox base" and /mnt
    base_sif(workdir)        the same as a SIF, made by `singpy build x.sif sandbox/` (marker "sandbox base")
    base_oci_image()         busybox OCI image with /etc/base-marker "oci base" (for the registry, layouts, archives)
    oci_base(workdir, name, extra)   an OCI layout of busybox plus a layer of `extra`, made once under `name`

Per test: `out_dir(singpy, workdir, name)` is an empty directory the profile's user owns (outputs, recipes,
files to copy in), `write_recipe(directory, text)` writes a dedented definition file there.
`sif_owners(sif)` reads the owners in a SIF's partition with `unsquashfs -lln` (the reference tool).
`build_dirs(directory)` lists the build work directories (`.singpy-build-*`) a directory holds.
`build(singpy, *args)` runs `singpy build ARGS`, which must succeed within BUILD_TIMEOUT.
`read_until(process, text)` reads the merged output of a running singpy until `text` shows.
`subordinate_ranges(user, workdir, name, present)` gives the test user a subordinate id range (or none)
for the singpy runs of a `with` block (tests.support.hostsim; root only).
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support import hostsim, oci, sifs
from tests.support.images import build_busybox_rootfs

SINGPY = str(Path(sys.executable).parent / "singpy")
BUILD_DIR_PREFIX = ".singpy-build-"
SUBUID_START = 200000  # the simulated range: SUBUID_START:65536 for the test user
SUBUID_COUNT = 65536
BUILD_TIMEOUT = 120  # seconds: one `singpy build` of a test

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tests.conftest import Singpy


def base_sandbox(workdir: Path) -> Path:
    root = workdir / "recipe-base"
    marker = root / "etc" / "base-marker"
    if not marker.exists():
        build_busybox_rootfs(root)
        (root / "mnt").mkdir()
        marker.write_text("sandbox base\n")
        _readable_by_all(root)
    return root


def base_sif(workdir: Path) -> Path:
    out = workdir / "recipe-base.sif"
    if not out.exists():
        subprocess.run([SINGPY, "-q", "build", str(out), str(base_sandbox(workdir))], check=True,
                       env={**os.environ, "TMPDIR": str(workdir / "tmp")})
        out.chmod(0o644)
    return out


def base_oci_image() -> oci.Image:
    return oci.busybox_image(extra=[oci.directory("mnt"), oci.file("etc/base-marker", "oci base\n")])


def _readable_by_all(root: Path) -> None:
    for path in (root, *root.rglob("*")):
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | (0o555 if path.is_dir() else 0o444))


def out_dir(singpy: Singpy, workdir: Path, name: str) -> Path:
    """An empty directory owned by the profile's user, named after `name` (made safe for globs and shells)."""
    parent = workdir / "recipes"
    parent.mkdir(mode=0o755, exist_ok=True)
    path = parent / f"{singpy.profile}-{re.sub(r'[^A-Za-z0-9_.-]', '-', name)}"
    path.mkdir()
    os.chown(path, singpy.uid, singpy.gid)
    return path


def write_recipe(directory: Path, text: str, name: str = "recipe.def") -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    path.chmod(0o644)
    return path


def build_dirs(directory: Path) -> list[str]:
    """The build work directories in `directory` (none once a build has ended, whatever its outcome)."""
    try:
        return sorted(name for name in os.listdir(directory) if name.startswith(BUILD_DIR_PREFIX))
    except FileNotFoundError:
        return []


def sif_owners(sif: Path) -> dict[str, str]:
    """`path -> "mode uid/gid"` of the SIF's root filesystem, as `unsquashfs -lln` lists it."""
    listing = subprocess.run(["unsquashfs", "-lln", "-o", str(sifs.primary_offset(sif)), str(sif)],
                             capture_output=True, text=True, check=True).stdout
    found = {}
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[5].startswith("squashfs-root"):
            found[fields[5].removeprefix("squashfs-root") or "/"] = f"{fields[0]} {fields[1]}"
    return found


def read_until(process: subprocess.Popen[str], text: str, timeout: float = 30.0) -> str:
    """What `process` wrote (stdout, stderr merged into it) up to the line holding `text`.

    Fails with what was read when the text does not come in time or the process ends first.
    """
    assert process.stdout is not None
    fd = process.stdout.fileno()  # read below the text wrapper: select() can't see what it has buffered
    seen = b""
    deadline = time.monotonic() + timeout
    while text.encode() not in seen:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(left, 0))
        if not ready:
            raise AssertionError(f"{text!r} did not show in {timeout} s; output so far:\n{seen.decode()}")
        chunk = os.read(fd, 65536)
        if not chunk:
            raise AssertionError(f"exit {process.wait()} before {text!r} showed; output:\n{seen.decode()}")
        seen += chunk
    return seen.decode(errors="replace")


@contextlib.contextmanager
def subordinate_ranges(user: Singpy, workdir: Path, name: str, present: bool) -> Iterator[None]:
    """Within the block, the test user has SUBUID_START:SUBUID_COUNT in /etc/subuid and /etc/subgid, or none.

    The host's files are never written: private copies, with the user's lines replaced, are bound over them
    for singpy alone (tests.support.hostsim). Needs root.
    """
    line = f"{user.user}:{SUBUID_START}:{SUBUID_COUNT}" if present else None
    with hostsim.subid_files(*hostsim.subid_copies(user.user, user.uid, line, str(workdir / f"recipe-{name}"))):
        yield


def build(singpy: Singpy, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`singpy build ARGS`, which must succeed; the result (its output) for further checks."""
    result = singpy.run("build", *args, env=env, timeout=BUILD_TIMEOUT)
    assert result.returncode == 0, f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    return result


def oci_base(workdir: Path, name: str, extra: list[oci.Entry]) -> Path:
    """An OCI layout of busybox plus a layer of `extra`, made once per session under `name`."""
    layout = workdir / f"recipe-{name}-layout"
    if not layout.exists():
        oci.write_layout(layout, {"latest": oci.busybox_image(extra=extra)})
        subprocess.run(["chmod", "-R", "a+rX", str(layout)], check=True)
    return layout
