"""--allow-setuid: set-uid programs of the image and of the host's binds work, for root outside a user namespace.

As Apptainer (its container_linux.go, `suidFlag`): every container filesystem is mounted nosuid and the payload
runs with no_new_privs, unless root, in no user namespace, asks for --allow-setuid. Then the image's root
filesystem and its layers, and the binds of host directories (`bind path`, the host's mounts, the home, /tmp
and /var/tmp, the working directory, --bind and --mount) are mounted without nosuid, a host mount's own nosuid
cleared on its bind. What keeps nosuid: /proc, /sys, /dev and what is bound there, the files singpy writes
(passwd, group, hostname), the GPU libraries and programs (--nv, --rocm, CDI) and FUSE mounts.

A user is refused (Apptainer's words). In a user namespace (root with --userns or --fakeroot) the flag changes
nothing, as Apptainer's. no_new_privs, which makes the kernel ignore set-uid bits, is left off only where that
gives the payload nothing it lacks: root with all its capabilities, no --security. Where they are trimmed
(`root default capabilities`, --drop-caps, --no-privs), it stays, so that no set-uid root program hands them back:
the flag then changes nothing either. -v says why in both cases. Root joining an instance started with it gets
the same (its record says so: singpy.launch.planner), as Apptainer's joins take the instance's no_new_privs.
"""

from __future__ import annotations

from singpy import console
from singpy.errors import SingpyError
from singpy.kernel import mountinfo  # noqa: F401  # for the executor's fallback, out of reach after the pivot
from singpy.plan import LaunchPlan, MountOp, MountSpec, Stage

_HOST_STAGES = (Stage.SYSTEM_FILES, Stage.HOME_TMP, Stage.USER)  # not KERNEL (/proc, /sys, /dev) nor GPU


def allow_setuid(plan: LaunchPlan) -> LaunchPlan:
    """The plan with --allow-setuid's changes, where they apply (a user is refused)."""
    if plan.uid != 0:
        raise SingpyError("--allow-setuid requires root privileges")
    if plan.namespaces.user:
        console.verbose("--allow-setuid changes nothing in a user namespace (--userns, --fakeroot)")
        return plan
    if plan.process.privileges.keep is not None or plan.process.security is not None:
        console.verbose("--allow-setuid changes nothing: with capabilities trimmed or --security, no_new_privs stays")
        return plan
    return plan.replace(allow_setuid=True, process=plan.process.replace(no_new_privs=False),
                        mounts=tuple(spec.replace(setuid=True) if _from_host(spec) else spec for spec in plan.mounts))


def _from_host(spec: MountSpec) -> bool:
    """A bind of the host's files or a tmpfs for them (the contained /tmp, the home), outside /dev."""
    return spec.op in (MountOp.BIND, MountOp.TMPFS) and spec.stage in _HOST_STAGES and not spec.dev
