"""A test's instances: what singpy keeps of one, removed at the end whatever happened."""

from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import Singpy


def forget_instance(singpy: Singpy, name: str) -> None:
    """Instance `name` stopped (SIGKILL, if it still runs) and its record and logs removed."""
    singpy.run("instance", "stop", "--force", name)
    base = Path(singpy.home, ".singpy", "instances")
    for path in (base / "logs" / os.uname().nodename / singpy.user / f"{name}.out",
                 base / "logs" / os.uname().nodename / singpy.user / f"{name}.err",
                 base / "app" / os.uname().nodename / singpy.user / f"{name}.json"):
        path.unlink(missing_ok=True)
