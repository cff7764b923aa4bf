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
from tests.gpu.test_nv_capabilities import DriverRun
from tests.gpu.test_nv_launch import _host, _sim

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="the simulated GPU host needs root (mknod)")
SHOW = ["sh", "-c", "ls /.singularity.d/libs"]


@pytest.fixture
def base(workdir: Path) -> Path:
    """A directory of this test's own that the test user can write in (pytest's tmp_path is private)."""
    path = workdir / f"listcache-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    path.chmod(0o777)
    return path


@pytest.fixture
def listed(singpy: Singpy, base: Path) -> DriverRun:
    """A simulated host of this test's own (its tool is changed here)."""
    host = _host(base, "sim-nvidia", simhost.build_nvidia_host)
    conf = base / "conf"
    conf.mkdir()
    sim = _sim(singpy, host, conf, "nvliblist.conf")
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
