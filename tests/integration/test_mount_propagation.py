"""`mount slave`: what the host mounts after the container started (an automounted home or project directory)
shows up inside, as with Apptainer's default; `mount slave = no` keeps the container's mounts private.

The "host" here is a mount namespace of the test's own (`unshare --propagation shared`), so nothing on the
real host is mounted: singpy starts in it, as the profile's user, and the test mounts a tmpfs there once the
container is running.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import SINGPY, Singpy
from tests.support.users import is_root

WAIT = "touch /data/ready; i=0; while [ $i -lt 30 ]; do [ -e /data/auto/file ] && exec cat /data/auto/file; " \
       "sleep 0.1; i=$((i+1)); done; echo absent"


@pytest.mark.skipif(not is_root(), reason="mounting in a namespace of the test's own needs root")
@pytest.mark.parametrize("slave", ["yes", "no"])
def test_host_mounts_made_later_reach_the_container(singpy: Singpy, image: Path, workdir: Path, slave: str) -> None:
    base = workdir / f"propagation-{singpy.profile}-{slave}"
    (base / "auto").mkdir(parents=True)
    os.chown(base, singpy.uid, singpy.gid)
    conf = workdir / f"mount-slave-{slave}.conf"
    conf.write_text(f"mount slave = {slave}\n")
    user = f"setpriv --reuid={singpy.uid} --regid={singpy.gid} --clear-groups " if singpy.uid else ""
    launch = f"{user}{SINGPY} --config {conf} exec -B {base}:/data {image} sh -c '{WAIT}'"
    script = (f"{launch} & pid=$!; while [ ! -e {base}/ready ] && kill -0 $pid 2>/dev/null; do sleep 0.05; done; "
              f"mount -t tmpfs automounted {base}/auto && echo mounted later > {base}/auto/file; wait $pid")
    done = subprocess.run(["unshare", "--mount", "--propagation", "shared", "sh", "-c", script], capture_output=True,
                          text=True, env=singpy.env(), cwd=str(base), timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ("mounted later\n" if slave == "yes" else "absent\n"), done.stderr
    assert not (base / "auto" / "file").exists()  # the tmpfs was in the test's namespace only
