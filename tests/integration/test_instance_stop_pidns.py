"""`instance stop` of an instance with a PID namespace of its own (--pid, --containall): its signal reaches
everything in the namespace, the processes a joiner left there included.

A joiner's payload runs in the namespace; what it starts in the background and
leaves behind is reparented to the namespace's PID 1 (singpy's init), not to
the holder, so only that init can pass the stop signal on. Before it did, such
a process got no signal: `instance stop` waited out the holder's grace (7 s)
and the process died of the SIGKILL that ends the namespace, with no chance to
clean up.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Singpy, readable_by_all
from tests.support.images import build_busybox_rootfs
from tests.support.instances import forget_instance

SESSION = f"s{os.getpid()}-{uuid.uuid4().hex[:6]}"
# Left running by the joiner: says so, then waits; on SIGTERM it says that too and ends.
LEFT_BEHIND = "(trap 'echo left behind: got TERM; exit 0' TERM; echo ready; while :; do sleep 0.05; done) &"


@pytest.fixture(scope="module")
def image(workdir: Path) -> Path:
    sandbox = workdir / "stop-pidns"
    if not sandbox.exists():
        build_busybox_rootfs(sandbox)
        readable_by_all(sandbox)
    return sandbox


@pytest.fixture
def name(singpy: Singpy) -> Iterator[str]:
    """An instance name of this test; stopped (SIGKILL) and its files removed at the end, whatever happened."""
    made = f"{SESSION}-{uuid.uuid4().hex[:6]}"
    yield made
    forget_instance(singpy, made)


@pytest.mark.parametrize("flag", ["--pid", "--containall"])
def test_stop_signals_what_a_joiner_left_in_the_namespace(singpy: Singpy, image: Path, name: str, flag: str) -> None:
    started = singpy.run("instance", "start", flag, str(image), name)
    assert started.returncode == 0, started.stderr
    joined = singpy.popen(["exec", f"instance://{name}", "sh", "-c", LEFT_BEHIND],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert joined.stdout is not None
    assert joined.stdout.readline() == "ready\n"
    assert joined.wait(timeout=60) == 0  # the joiner has gone; what it left runs on (it holds our pipe)
    stopped = singpy.run("instance", "stop", name)
    assert stopped.returncode == 0, stopped.stderr
    out, _ = joined.communicate(timeout=30)
    assert out == "left behind: got TERM\n"  # the stop's signal, not only the SIGKILL that ends the namespace
    assert name not in singpy.ok("instance", "list")
