"""GPU discovery for --nv (NVIDIA) and --rocm (AMD): leaf modules that return data.

`singpy.gpu.nvidia.discover` and `singpy.gpu.rocm.discover` look at the host
(device nodes, the ld cache, $PATH, a few files under /proc and /var/run) and
return a `GpuContribution`; they never mount, never read the plan and never
import `singpy.kernel` (architecture convention 5, modelled on Apptainer's
`internal/pkg/util/gpu` package: lists out, the launcher binds).

This module stays import-light (no subprocess): the launcher imports it to
type its arguments even when no GPU flag is given.
"""

from __future__ import annotations

from collections.abc import Iterable

from singpy.plan import MountSpec
from singpy.record import Record


class GpuContribution(Record):
    """What one GPU vendor adds to a launch; every mount is at Stage.GPU."""

    mounts: tuple[MountSpec, ...] = ()  # devices, libs tmpfs + binds, binaries, files; in order
    env: tuple[tuple[str, str], ...] = ()  # variables forced into the container
    keep_host_env: tuple[str, ...] = ()  # host variable names that must survive --cleanenv
    libs_dir_used: bool = False  # something is bound under /.singularity.d/libs
    warnings: tuple[str, ...] = ()  # shown at normal verbosity
    notes: tuple[str, ...] = ()  # shown with -v ("binding SRC -> DEST", per-library misses)


def merge(*contribs: GpuContribution) -> GpuContribution:
    """Combine --nv and --rocm contributions (Apptainer >= 1.2.3 allows both).

    The first mount for a destination wins, so the one tmpfs at
    /.singularity.d/libs stays ahead of every library bind and a library
    listed by both vendors (libOpenCL.so, libdrm.so) is bound once.
    """
    mounts: dict[str, MountSpec] = {}
    notes: list[str] = []
    for contrib in contribs:
        for spec in contrib.mounts:
            kept = mounts.setdefault(spec.dest, spec)
            if kept is not spec and kept != spec:
                notes.append(f"{spec.dest}: keeping {kept.source or kept.op.value}, ignoring {spec.source}")
    env: dict[str, str] = {}
    for contrib in contribs:
        for name, value in contrib.env:
            env.setdefault(name, value)
    return GpuContribution(
        mounts=tuple(mounts.values()),
        env=tuple(env.items()),
        keep_host_env=_unique(name for contrib in contribs for name in contrib.keep_host_env),
        libs_dir_used=any(contrib.libs_dir_used for contrib in contribs),
        warnings=_unique(text for contrib in contribs for text in contrib.warnings),
        notes=_unique([text for contrib in contribs for text in contrib.notes] + notes),
    )


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))
