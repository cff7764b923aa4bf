"""--containlibs: host library files in /.singularity.d/libs, where --nv puts the driver's.

Singularity 2's flag, which Apptainer 1.5 still takes (hidden, `CONTAINLIBS`):
each PATH, or PATH:NAME to give it another name there, is bound read-only into
the libraries directory, which LD_LIBRARY_PATH always ends with, so the
container's programs load it. Apptainer's rules, kept:

* they are the user's binds: with `user bind control = no` every one is
  left out, with Apptainer's warning;
* a GPU library of the same name wins (Apptainer binds the GPU's later, over
  it); here `singpy.gpu.merge` keeps the first, and this part comes last.

One bind per PATH and name, not `singpy.gpu.libsdir`'s one bind per file with
links for its other names: a link to a name a GPU library took would lead
to the GPU's file, not to the one the user gave.

Unlike Apptainer, whose mount fails inside the container's set-up, a PATH that
is not a file is refused before anything is made, naming the value.
"""

from __future__ import annotations

import os
import stat

from singpy.constants import LIBS_DIR
from singpy.errors import BindSpecError
from singpy.gpu import GpuContribution, binding_note
from singpy.plan import MountOp, MountSpec, Stage

NOT_ALLOWED = "Ignoring libraries bind request: user bind control disabled by system administrator"  # Apptainer's


def contribution(values: tuple[str, ...], *, cwd: str, bind_control: bool) -> GpuContribution:
    """The binds of --containlibs `values` (each a comma list of PATH[:NAME]; relative paths from `cwd`)."""
    if not bind_control:
        return GpuContribution(warnings=(NOT_ALLOWED,))
    # name -> host file: a name given twice gets the later file, as in Apptainer (the later bind over the first)
    files = dict(_library(item, cwd) for value in values for item in value.split(",") if item)
    binds = [MountSpec(op=MountOp.BIND, source=path, dest=f"{LIBS_DIR}/{name}", readonly=True, stage=Stage.GPU)
             for name, path in files.items()]
    if not binds:
        return GpuContribution()
    return GpuContribution(mounts=(MountSpec(op=MountOp.TMPFS, dest=LIBS_DIR, stage=Stage.GPU), *binds,
                                   MountSpec(op=MountOp.SEAL, dest=LIBS_DIR, stage=Stage.GPU)),
                           libs_dir_used=True, notes=tuple(binding_note(spec) for spec in binds))


def _library(item: str, cwd: str) -> tuple[str, str]:
    """(its name in the libraries directory, the host file) of one PATH[:NAME]."""
    from singpy.host.hostfiles import reason, shown

    path, _, name = item.partition(":")
    path = os.path.normpath(os.path.join(cwd, path))
    name = os.path.basename(name or path)
    if name in ("", ".", ".."):
        raise BindSpecError(f"--containlibs {shown(item)}: the name {name!r} can't be a file of {LIBS_DIR}")
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError) as error:
        raise BindSpecError(f"--containlibs {shown(item)}: can't use {shown(path)}: {reason(error)}") from None
    if not stat.S_ISREG(mode):
        raise BindSpecError(f"--containlibs {shown(item)}: {shown(path)} is not a file")
    return name, path
