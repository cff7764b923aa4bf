"""--boot (Apptainer's, root only): an instance whose PID 1 is the image's /sbin/init.

As Apptainer's launcher does for it: the instance is contained (--contain), in PID, UTS and network namespaces
(root's `bridge` network unless --network names another), its hostname the instance's name unless --hostname
gives one, and without CAP_SYS_BOOT and CAP_SYS_RAWIO unless --keep-privs. No startscript runs: the namespace's
PID 1 (singpy.launch.pidns), which otherwise stays singpy's init, builds the container and then executes
/sbin/init in its own place, with the container's environment and no env script sourced (as Apptainer executes
it without its action script). `instance stop` signals it, as any instance's PID 1; what /sbin/init does then is
the image's, and past the holder's grace it is killed with everything in its namespace.
"""

from __future__ import annotations

import os

from singpy.errors import SingpyError
from singpy.image.scripts import ImageScripts
from singpy.launch import process
from singpy.launch.request import LaunchRequest
from singpy.plan import ProcessSpec

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from typing import NoReturn

INIT = "/sbin/init"
_DROPPED = "CAP_SYS_BOOT,CAP_SYS_RAWIO"


def booted(request: LaunchRequest, name: str, uid: int) -> LaunchRequest:
    """The request of `instance start|run --boot IMAGE NAME`; a user is refused with Apptainer's words."""
    if uid != 0:
        raise SingpyError("--boot requires root privileges")
    return request.replace(action="boot", contain=True, pid=True, uts=True, net=True,
                           hostname=request.hostname or name,
                           drop_caps=request.drop_caps if request.keep_privs else (*request.drop_caps, _DROPPED))


def check_init() -> None:
    """In the container's root, before it is reported built: an image without /sbin/init fails the start."""
    if not os.access(INIT, os.X_OK):
        raise SingpyError(f"--boot: the image has no executable {INIT}")


def exec_init(spec: ProcessSpec) -> NoReturn:
    """PID 1 becomes /sbin/init: the payload's steps (working directory, capabilities, environment), no script."""
    process.exec_process(spec.replace(action="exec", args=(INIT,)), ImageScripts())
