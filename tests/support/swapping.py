"""`singpy` run with a file renamed over an image's path between the image's check and its mount.

The run goes through a small script that wraps `singpy.image.MODULE.attach` (called after every check of the
launch, in the container's mount namespace, where the host is HOST): it renames `source` over `target` there,
then attaches. A launch that mounts the descriptor it checked is not fooled; one that reopens the path is.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import SINGPY, Singpy

_SWAPPING = """
import os, sys
from singpy.image import {module}
from singpy.layers import rootfs
original = {module}.attach
def attach(*args, **kwargs):
    os.rename(rootfs.HOST + {source!r}, rootfs.HOST + {target!r})
    return original(*args, **kwargs)
{module}.attach = attach
from singpy.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def run_swapping(singpy: Singpy, place: Path, module: str, source: Path, target: Path, *args: str,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`singpy ARGS` as `singpy`'s user in `place`, `source` renamed over `target` right before MODULE attaches."""
    script = place / "swapping.py"
    script.write_text(_SWAPPING.format(module=module, source=str(source), target=str(target)))
    argv, ids = singpy.command(list(args))
    index = argv.index(SINGPY)
    argv[index:index + 1] = [sys.executable, str(script)]
    result: subprocess.CompletedProcess[str] = subprocess.run(  # type: ignore[call-overload]
        argv, env=env or singpy.env(), cwd=str(place), capture_output=True, text=True, timeout=60, **ids)
    return result
