"""`instance start|run` and `inspect` take every image transport run/exec take (docker://, oci:..., oras://,
library://: singpy.cli.actions.pulled, the one routing), and `instance start --disable-cache` pulls into a
temporary directory that lives as long as the instance (its holder removes it as it ends). Real registries
(Debian's docker-registry, the suite's library server), as root and as the unprivileged test user.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support.library_server import LibraryServer, start_library
from tests.support.oci import busybox_image, file, write_layout
from tests.support.oras_sifs import sdk_push
from tests.support.registry import RegistryServer
from tests.support.sifs import MARKER, new_cache, singpy_sif


@pytest.fixture(scope="module")
def library(workdir: Path) -> Iterator[LibraryServer]:
    with start_library(workdir / "library-instances") as server:
        server.store.add(singpy_sif(workdir), "alice/tools/busybox", ("latest",))
        yield server


@pytest.fixture(scope="module")
def oras_ref(registry_plain: RegistryServer, workdir: Path) -> str:
    sif = singpy_sif(workdir)
    sdk_push(registry_plain, sif, "instances/oras-busybox:v1")
    return f"oras://{registry_plain.host}/instances/oras-busybox:v1"


@pytest.fixture(scope="module")
def docker_ref(registry_plain: RegistryServer, workdir: Path) -> str:
    image = busybox_image(extra=[file("etc/marker", MARKER + "\n")])
    registry_plain.push(write_layout(workdir / "instance-transports-layout", {"latest": image}), "instances/docker")
    return registry_plain.ref("instances/docker")


def _own_dir(singpy: Singpy, workdir: Path, name: str) -> Path:
    path = workdir / "instance-transports" / f"{singpy.profile}-{name}-{uuid.uuid4().hex[:6]}"
    path.mkdir(parents=True)
    path.parent.chmod(0o755)
    os.chown(path, singpy.uid, singpy.gid)
    return path


def _env(singpy: Singpy, workdir: Path, name: str) -> dict[str, str]:
    return singpy.env(SINGPY_CACHEDIR=str(new_cache(singpy, workdir, f"inst-{name}-{uuid.uuid4().hex[:6]}")),
                      TMPDIR=str(_own_dir(singpy, workdir, f"tmp-{name}")))


@pytest.mark.parametrize("transport", ["oras", "library"])
def test_instance_start_from_a_sif_transport(singpy: Singpy, workdir: Path, transport: str, oras_ref: str,
                                             library: LibraryServer, named: Callable[[Singpy], str]) -> None:
    reference = oras_ref if transport == "oras" else library.ref("alice/tools/busybox")
    env = _env(singpy, workdir, transport)
    name = named(singpy)
    singpy.ok("instance", "start", "--no-https", reference, name, env=env)
    assert singpy.ok("exec", f"instance://{name}", "cat", "/etc/marker", env=env) == MARKER + "\n"
    listed = json.loads(singpy.ok("instance", "list", "--json", name, env=env))["instances"]
    assert listed[0]["img"].startswith(env["SINGPY_CACHEDIR"])  # the cached SIF, as run/exec use it
    run = named(singpy)
    singpy.ok("instance", "run", "--no-https", reference, run, env=env)  # from the cache now
    assert singpy.ok("exec", f"instance://{run}", "cat", "/etc/marker", env=env) == MARKER + "\n"


@pytest.mark.parametrize("transport", ["oras", "library"])
def test_inspect_a_sif_transport(singpy: Singpy, workdir: Path, transport: str, oras_ref: str,
                                 library: LibraryServer) -> None:
    """What inspect shows of the pulled image is what it shows of the file itself."""
    reference = oras_ref if transport == "oras" else library.ref("alice/tools/busybox")
    env = _env(singpy, workdir, f"inspect-{transport}")
    local = str(singpy_sif(workdir))
    for flags in (["--json", "--all"], ["--runscript"], []):
        result = singpy.run("inspect", "--no-https", *flags, reference, env=env)
        assert result.returncode == 0, result.stderr
        assert result.stdout == singpy.ok("inspect", *flags, local, env=env)
    assert list(Path(env["SINGPY_CACHEDIR"]).iterdir())  # pulled into the cache, as by run


def test_inspect_of_a_missing_library_image_is_one_fatal_line(singpy: Singpy, workdir: Path,
                                                               library: LibraryServer) -> None:
    env = _env(singpy, workdir, "inspect-missing")
    assert_one_fatal(singpy.run("inspect", "--no-https", library.ref("alice/tools/nothing"), env=env), "nothing")


def _wait_empty(path: Path, timeout: float = 10.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while (left := os.listdir(path)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@pytest.mark.parametrize("how", ["--disable-cache", "APPTAINER_DISABLE_CACHE"])
@pytest.mark.parametrize("transport", ["docker", "oras"])
def test_instance_disable_cache_lives_with_the_instance(singpy: Singpy, workdir: Path, docker_ref: str,
                                                        oras_ref: str, named: Callable[[Singpy], str],
                                                        transport: str, how: str) -> None:
    env = _env(singpy, workdir, f"nocache-{transport}")
    cache, tmp = Path(env["SINGPY_CACHEDIR"]), Path(env["TMPDIR"])
    args = [how] if how.startswith("-") else []
    if not args:
        env[how] = "1"
    name = named(singpy)
    reference = docker_ref if transport == "docker" else oras_ref
    singpy.ok("instance", "start", *args, "--no-https", reference, name, env=env)
    assert list(cache.iterdir()) == []  # nothing read from or written to the cache
    [temporary] = os.listdir(tmp)
    assert temporary.startswith("singpy-nocache-")
    assert singpy.ok("exec", f"instance://{name}", "cat", "/etc/marker", env=env) == MARKER + "\n"
    assert singpy.ok("exec", f"instance://{name}", "cat", "/etc/marker", env=env) == MARKER + "\n"
    singpy.ok("instance", "stop", name, env=env)
    assert _wait_empty(tmp) == []  # removed as the instance ended


def test_instance_disable_cache_failed_pull_leaves_nothing(singpy: Singpy, workdir: Path, docker_ref: str,
                                                           named: Callable[[Singpy], str]) -> None:
    env = _env(singpy, workdir, "nocache-fail")
    name = named(singpy)
    result = singpy.run("instance", "start", "--disable-cache", "--no-https",
                        docker_ref.replace("instances/docker", "instances/nothing"), name, env=env)
    assert_one_fatal(result, "nothing")
    assert os.listdir(env["TMPDIR"]) == [] and os.listdir(env["SINGPY_CACHEDIR"]) == []
    assert json.loads(singpy.ok("instance", "list", "--json", name, env=env))["instances"] == []


def test_instance_disable_cache_of_a_failing_start_leaves_nothing(singpy: Singpy, workdir: Path, docker_ref: str,
                                                                  named: Callable[[Singpy], str]) -> None:
    """The holder fails to build (a --bind of a missing source): it removes the directory as it exits."""
    env = _env(singpy, workdir, "nocache-holder-fail")
    name = named(singpy)
    result = singpy.run("instance", "start", "--disable-cache", "--no-https", "-B", f"{workdir}/no-such-dir:/mnt",
                        docker_ref, name, env=env)
    assert result.returncode != 0 and "FATAL" in result.stderr
    assert _wait_empty(Path(env["TMPDIR"])) == []
