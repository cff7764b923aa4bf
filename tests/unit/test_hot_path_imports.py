"""What `singpy exec` imports: a guard against start-up regressions (issue 3), not a timing test.

`singpy exec` ends in execve, so its modules cannot be inspected in-process:
each case runs the real command on a real busybox sandbox under `python -X
importtime` and reads the imported module names from stderr. The container
must really have run (the payload's output is checked), so the whole launch
path was imported.

A plain launch imports no CLI framework (typer, click, rich: singpy.cli.parse
explains why), no pyroute2 or prctl (needed only by --net and capability
handling), no SIF writer, and none of the stdlib modules the code avoids on
purpose (`dataclasses`, `typing`, `pathlib`, `json`: see singpy.record and
benchmarks/README.md). GPU flags may pull in more of the stdlib (not collections,
nor may --overlay or --env-file), but never those third-party packages nor the
SIF writer. A SIF's launch and a cached docker://
image's, run through the console script itself as root and as the test user,
import no enum, signal or contextlib, and only singpy modules the bundle holds.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import Singpy
from tests.support.images import build_busybox_rootfs
from tests.support.importtime import module_names
from tests.support.oci import busybox_image
from tests.support.registry import RegistryServer
from tests.support.sifs import siftool_sif

NEVER = ("typer", "click", "rich", "pyroute2", "prctl", "singpy.image.sifwrite")
# The registry client, layer applier and converter (issue 10) are only for docker:// and OCI sources.
PULL = ("singpy.oci", "http", "ssl", "zstandard", "tarfile")
# The --env-file reader only with --env-file; site policy only when limits are set; overlay code only with overlays;
# the definition-file builder only with `singpy build`.
NOT_ON_PLAIN_PATH = (*NEVER, *PULL, "dataclasses", "typing", "pathlib", "json", "singpy.env.envfile",
                     "singpy.host.policy", "singpy.layers.overlay", "singpy.layers.overlayfs", "singpy.image.extfs",
                     "singpy.recipe", "singpy.recipe.deffile", "singpy.launch.shared", "hashlib", "socket",
                     "difflib",  # difflib: the "did you mean" of a mistake
                     # enum (ExitCode, MountOp... are plain constants) and collections (collections.abc imported
                     # for type checking only) with functools, operator, keyword, reprlib: ~4 ms (issue 31)
                     "enum", "collections", "functools", "signal",
                     # the system calls go through the C extension singpy.kernel._native (built by make setup)
                     "ctypes", "singpy.kernel._libcalls")
# A SIF's launch (the loop device as root, squashfuse as a user) and a cached docker:// or oras:// image's: no
# enum (with functools), no signal wrappers, no contextlib, no ctypes, no collections (issue 31); a SIF's
# launch nothing of singpy.oci or the network either.
IMAGE_FILE_PATH = (*NEVER, "enum", "functools", "signal", "contextlib", "ctypes", "singpy.kernel._libcalls",
                   "dataclasses", "typing", "pathlib", "json")
SIF_PATH = (*IMAGE_FILE_PATH, "collections", "singpy.oci", "http", "ssl", "socket")
CACHED_TAG_PATH = (*IMAGE_FILE_PATH, "collections")  # ~1.9 ms on a cached docker:// run (issue 31)
# Runs the console script's code (singpy.cli.main:main) with the given arguments.
ENTRY = "import sys; from singpy.cli.main import main; sys.argv[0] = 'singpy'; sys.exit(main())"
MARK = "hot-path-ok"


def imported_modules(*args: str, cwd: Path) -> tuple[list[str], subprocess.CompletedProcess[str]]:
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", ENTRY, *args], capture_output=True, text=True,
                          timeout=60, cwd=cwd, check=False)
    return module_names(done.stderr), done


def script_imports(singpy: Singpy, *args: str, **env: str) -> tuple[list[str], subprocess.CompletedProcess[str]]:
    """What the console script itself (`python -S`, the bundle: make setup's) imports for `singpy ARGS`, run as
    the profile's user (with `env` added)."""
    done = singpy.run(*args, env=singpy.env(PYTHONPROFILEIMPORTTIME="1", **env))
    return module_names(done.stderr), done


def offenders(modules: list[str], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(name for name in modules for bad in forbidden if name == bad or name.startswith(bad + "."))


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_busybox_rootfs(tmp_path_factory.mktemp("hot-path") / "sandbox")


@pytest.mark.parametrize("flags", [[], ["--contain"], ["--containall"], ["--writable-tmpfs"], ["--cleanenv"]],
                         ids=lambda flags: " ".join(flags) or "plain")
def test_exec_imports_nothing_heavy(sandbox: Path, flags: list[str]) -> None:
    modules, done = imported_modules("exec", *flags, str(sandbox), "echo", MARK, cwd=sandbox.parent)
    assert done.returncode == 0 and MARK in done.stdout, f"singpy exec failed:\n{done.stderr[-2000:]}"
    assert "singpy.launch.launch" in modules  # the profile covers the launch path
    assert offenders(modules, NOT_ON_PLAIN_PATH) == []


def test_run_and_shell_share_the_fast_path(sandbox: Path) -> None:
    modules, done = imported_modules("run", str(sandbox), cwd=sandbox.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    assert offenders(modules, NOT_ON_PLAIN_PATH) == []


def test_nv_without_gpus_imports_no_framework(sandbox: Path) -> None:
    """--nv on a host without NVIDIA devices warns and runs (Apptainer does the same); its modules import
    collections.abc for type checking only (the collections package and its imports: ~2 ms a --nv launch)."""
    modules, done = imported_modules("exec", "--nv", str(sandbox), "echo", MARK, cwd=sandbox.parent)
    assert done.returncode == 0 and MARK in done.stdout, f"singpy exec --nv failed:\n{done.stderr[-2000:]}"
    assert "singpy.gpu.nvidia" in modules
    assert offenders(modules, (*NEVER, "collections")) == []


def test_overlay_imports_its_code_only(sandbox: Path, tmp_path: Path) -> None:
    """--overlay DIR: the overlay's module, and no collections (for type checking only there too)."""
    upper = tmp_path / "overlay"
    upper.mkdir()
    modules, done = imported_modules("exec", "--overlay", str(upper), str(sandbox), "sh", "-c",
                                     f"echo {MARK} > /made; cat /made", cwd=sandbox.parent)
    assert done.returncode == 0 and MARK in done.stdout, f"singpy exec --overlay failed:\n{done.stderr[-2000:]}"
    assert (upper / "upper" / "made").read_text() == f"{MARK}\n"
    assert "singpy.layers.overlay" in modules
    assert offenders(modules, (*NEVER, "collections")) == []


def test_sif_imports_no_writer(sandbox: Path, tmp_path: Path) -> None:
    mksquashfs = shutil.which("mksquashfs", path="/usr/sbin:/usr/bin:/sbin:/bin")
    if mksquashfs is None:
        pytest.skip("mksquashfs not installed")
    from singpy.image.sif import host_arch
    from singpy.image.sifwrite import build_sif_from_squashfs

    squash, image = tmp_path / "rootfs.squashfs", tmp_path / "busybox.sif"
    subprocess.run([mksquashfs, str(sandbox), str(squash), "-noappend", "-all-root", "-no-progress"], check=True,
                   capture_output=True)
    build_sif_from_squashfs(image, squash, arch=host_arch())
    modules, done = imported_modules("exec", str(image), "echo", MARK, cwd=tmp_path)
    if done.returncode != 0 and "images are not supported yet" in done.stderr:
        pytest.skip("SIF images are not launched yet (issue 4)")
    assert done.returncode == 0 and MARK in done.stdout, f"singpy exec SIF failed:\n{done.stderr[-2000:]}"
    assert offenders(modules, NEVER) == []


def test_the_check_sees_a_heavy_import(sandbox: Path) -> None:
    """The typer path imports typer: proof that the parsing above would catch it."""
    modules, done = imported_modules("version", cwd=sandbox.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "typer" in offenders(modules, NEVER)


def test_env_file_reader_comes_with_env_file_only(sandbox: Path, tmp_path: Path) -> None:
    """The other half of the check above: with --env-file, singpy.env.envfile is imported (and works)."""
    env_file = tmp_path / "vars.env"
    env_file.write_text(f"export GREETING='{MARK}'\n")
    modules, done = imported_modules("exec", "--env-file", str(env_file), str(sandbox), "/bin/sh", "-c",
                                     "echo $GREETING", cwd=sandbox.parent)
    assert done.returncode == 0 and done.stdout == f"{MARK}\n", done.stderr[-2000:]
    assert "singpy.env.envfile" in modules
    assert offenders(modules, ("typer", "click", "rich", "dataclasses", "typing", "pathlib", "json",
                               "collections")) == []


def test_the_bundle_holds_the_whole_plain_launch_path(sandbox: Path) -> None:
    """The bundle's first part (what make setup bundles for every launch) is exactly what a plain launch
    imports of singpy (the packages `singpy` and `singpy.cli` too: the script runs the bundle's own code from
    its .pyc, before any of them); its second part none of it."""
    from singpy.cli import launcher

    modules, done = imported_modules("exec", str(sandbox), "echo", MARK, cwd=sandbox.parent)
    assert done.returncode == 0 and MARK in done.stdout, f"singpy exec failed:\n{done.stderr[-2000:]}"
    root = str(Path(launcher.__file__).resolve().parents[2])
    bundled = {name for name, _ in launcher.hot_path_modules(root)}
    assert {name for name in modules if name.split(".")[0] == "singpy"} == bundled
    assert not bundled & {name for name, _ in launcher.image_path_modules(root)}


def _bundled_everywhere(modules: list[str]) -> list[str]:
    """The singpy modules of `modules` that no part of the bundle holds."""
    from singpy.cli import launcher

    root = str(Path(launcher.__file__).resolve().parents[2])
    bundled = {name for name, _ in (*launcher.hot_path_modules(root), *launcher.image_path_modules(root),
                                    *launcher.gpu_path_modules(root))}
    return sorted(name for name in modules if name.startswith("singpy.") and name not in bundled
                  and name != "singpy.cli.bundle")


def test_a_sif_launch_imports_no_enum_signal_or_collections(singpy: Singpy, workdir: Path, fuse_open: str) -> None:
    """As root (the kernel's squashfs on a loop device) and as a user (squashfuse): every singpy module from the
    bundle, none of the standard library's heavier modules (issue 31)."""
    modules, done = script_imports(singpy, "exec", str(siftool_sif(workdir)), "echo", MARK)
    assert done.returncode == 0 and MARK in done.stdout, done.stderr[-2000:]
    assert "singpy.image.squashfs" in modules and "singpy.launch.launch" in modules
    assert offenders(modules, SIF_PATH) == []
    assert _bundled_everywhere(modules) == []


def test_a_gpu_launch_imports_from_the_bundle(singpy: Singpy, image: Path) -> None:
    """--nv (a host without NVIDIA devices: a warning) through the console script: the GPU modules from the bundle's
    part of their own, no collections, and nothing of the image paths' part (the extraction cache, singpy.oci)."""
    modules, done = script_imports(singpy, "exec", "--nv", str(image), "echo", MARK)
    assert done.returncode == 0 and MARK in done.stdout, done.stderr[-2000:]
    assert "singpy.gpu.nvidia" in modules
    assert offenders(modules, (*IMAGE_FILE_PATH, "collections", "singpy.oci", "singpy.image.cache")) == []
    assert _bundled_everywhere(modules) == []


def test_a_cached_docker_image_imports_from_the_bundle(singpy: Singpy, registry_plain: RegistryServer,
                                                      workdir: Path, fuse_open: str) -> None:
    """`exec docker://X:TAG` of a cached image: its tag's check and cache records come from the bundle's second
    part, without enum, signal, contextlib or collections (issue 31); a registries.conf that defines no
    registry (as Debian's) is read but loads neither its parser nor the registry errors."""
    registry_plain.upload(busybox_image(), f"hot-path/busybox-{singpy.profile}")
    ref = registry_plain.ref(f"hot-path/busybox-{singpy.profile}")
    conf = workdir / "registries.conf"
    conf.write_text("# unqualified-search-registries = ['docker.io']\n")
    conf.chmod(0o644)
    singpy.ok("-q", "exec", "--no-https", ref, "true")  # pulled and cached once
    modules, done = script_imports(singpy, "exec", "--no-https", ref, "echo", MARK,
                                   CONTAINERS_REGISTRIES_CONF=str(conf))
    assert done.returncode == 0 and MARK in done.stdout, done.stderr[-2000:]
    assert {"singpy.oci.tagcheck", "singpy.oci.store", "singpy.oci.regfiles", "singpy.image.squashfs"} <= set(modules)
    assert "singpy.oci.registry" not in modules  # the cached image's check: one HEAD request, no full client
    assert {"singpy.oci.mirrors", "singpy.oci.regerrors"} & set(modules) == set()
    assert offenders(modules, CACHED_TAG_PATH) == []
    assert _bundled_everywhere(modules) == []


@pytest.mark.parametrize("by", ["tag", "digest"])
def test_a_cached_oras_image_imports_from_the_bundle(singpy: Singpy, registry_plain: RegistryServer, workdir: Path,
                                                    fuse_open: str, by: str) -> None:
    """`exec oras://X:TAG` (one HEAD request) and `oras://X@sha256:…` (none) of a cached SIF: as the docker://
    path, everything from the bundle and none of the heavier standard modules (issues 29 and 31)."""
    repository = f"hot-path/oras-{singpy.profile}-{by}"
    reference = f"oras://{registry_plain.host}/{repository}:1"
    singpy.ok("push", "--no-https", str(siftool_sif(workdir)), reference)
    if by == "digest":
        accept = "application/vnd.oci.image.manifest.v1+json"
        request = urllib.request.Request(f"{registry_plain.url}/v2/{repository}/manifests/1", method="HEAD",
                                         headers={"Accept": accept})
        with urllib.request.urlopen(request, timeout=30) as answer:
            reference = f"oras://{registry_plain.host}/{repository}@{answer.headers['Docker-Content-Digest']}"
    singpy.ok("-q", "exec", "--no-https", reference, "true")  # pulled and cached once
    modules, done = script_imports(singpy, "exec", "--no-https", reference, "echo", MARK)
    assert done.returncode == 0 and MARK in done.stdout, done.stderr[-2000:]
    assert {"singpy.oci.oras", "singpy.image.squashfs"} <= set(modules)
    assert "singpy.oci.registry" not in modules
    if by == "digest":  # nothing to ask: no network code either (~1.2 ms)
        assert offenders(modules, ("singpy.oci.quickhead", "singpy.oci.quicktls", "socket", "_socket")) == []
    assert offenders(modules, CACHED_TAG_PATH) == []
    assert _bundled_everywhere(modules) == []
