"""nvidia-container-cli's listing is kept per driver (singpy.gpu.listcache), on the simulated GPU host.

What a user sees: the second `--nv` launch gets the same libraries without
running the tool again (proved with a tool that now fails, under --nvccli,
where a failing tool would be fatal), and a changed tool (a driver update
replaces it) is run again.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.gpu import simhost
from tests.support.simhost_runs import DriverRun, sim_host, sim_run

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="the simulated GPU host needs root (mknod)")
SHOW = ["sh", "-c", "ls /.singularity.d/libs"]


@pytest.fixture
def base(workdir: Path) -> Path:
    """A directory of this test's own that the test user can write in (pytest's tmp_path is private)."""
    path = workdir / f"listcache-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    path.chmod(0o1777)  # sticky, like /tmp: a cache below a directory others can write is refused (issue 24)
    return path


@pytest.fixture
def listed(singpy: Singpy, base: Path) -> DriverRun:
    """A simulated host of this test's own (its tool is changed here)."""
    host = sim_host(base, "sim-nvidia", simhost.build_nvidia_host)
    sim = sim_run(singpy, host, base / "conf", "nvliblist.conf")
    return DriverRun(sim.runner, sim.host, sim.confdir)


def failing_in_place(tool: Path) -> None:
    """Make the tool fail, keeping the size and times the cache's key reads (as if it broke, not updated)."""
    info = tool.stat()
    text = tool.read_text()
    broken = "#!/bin/sh\nexit 1\n"
    tool.write_text(broken + "#" * (len(text) - len(broken) - 1) + "\n")
    os.utime(tool, ns=(info.st_atime_ns, info.st_mtime_ns))


def test_the_listing_is_kept_until_the_tool_changes(listed: DriverRun, image: Path, base: Path) -> None:
    env = {"SINGPY_CACHEDIR": str(base / "cache")}  # empty: the first launch runs the tool
    first = listed.ok("exec", "--nvccli", "--contain", str(image), *SHOW, **env).split()
    assert "libcuda.so.1" in first
    tool = listed.host.container_cli
    failing_in_place(tool)
    again = listed.ok("exec", "--nvccli", "--contain", str(image), *SHOW, **env).split()
    assert again == first  # the tool was not run: it would have failed, fatally under --nvccli
    tool.write_text(tool.read_text() + "\n")  # a new tool (size and mtime change): run again, and it fails
    assert_one_fatal(listed.run("exec", "--nvccli", "--contain", str(image), "true", **env), "--nvccli:")


def test_glibc_needs_are_kept_with_the_listing(tmp_path: Path) -> None:
    """The newest GLIBC_2.x of each listed file is read when the listing is saved, not on every launch."""
    from singpy.gpu import ImageHints
    from tests.gpu.discovering import discover_nv, lib_binds

    host = simhost.build_nvidia_host(tmp_path / "host")
    env = {"SINGPY_CACHEDIR": str(tmp_path / "cache")}
    old_image = ImageHints(glibc="2.31")
    glcore = f"libnvidia-glcore.so.{simhost.DRIVER}"
    first = discover_nv(host, image=old_image, nvidia_container_cli=str(host.container_cli), env=env)
    (saved,) = (tmp_path / "cache" / "nv-list").iterdir()
    fields = saved.read_bytes().split(b"\0")
    needs = {fields[i + 1].decode(): fields[i + 2].decode() for i in range(0, len(fields), 3) if fields[i] == b"G"}
    assert needs[str(host.lib_dir / glcore)] == "2.34"
    assert needs[str(host.lib_dir / f"libcuda.so.{simhost.DRIVER}")] in ("", "2.2")  # __cxa_finalize@GLIBC_2.2.5
    kept = discover_nv(host, image=old_image, nvidia_container_cli=str(host.container_cli), env=env)
    assert glcore not in lib_binds(first) and lib_binds(kept) == lib_binds(first)
    assert [w for w in kept.warnings if "GLIBC_2.34" in w] == [w for w in first.warnings if "GLIBC_2.34" in w] != []
    # What is kept is what is used: a glcore that now needs nothing older is still judged by the saved value.
    (host.lib_dir / glcore).write_bytes((host.lib_dir / f"libcuda.so.{simhost.DRIVER}").read_bytes())
    assert glcore not in lib_binds(discover_nv(host, image=old_image, nvidia_container_cli=str(host.container_cli),
                                               env=env))
