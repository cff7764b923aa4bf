"""The executor's phases, in the order `singpy.launch.launch.launch` runs them.

enter_namespaces, attach_image, prepare_root (the image surveyed, its root
mounted: singpy.layers), build_container (the mount plan applied, the root
finished). Below the executor and the supervisors that run the same phases
(singpy.launch.holder for a shared container, singpy.launch.pidns for PID 1):
they import these, never the executor.
"""

from __future__ import annotations

import os

from singpy import console
from singpy.image.scripts import ImageScripts, find_scripts, runscript_path
from singpy.kernel import caps
from singpy.kernel import syscalls as k
from singpy.kernel.idmap import write_id_maps
from singpy.layers import rootfs
from singpy.mounts.apply import apply_mounts
from singpy.mounts.rootpath import Resolver, Tree
from singpy.mounts.survey import survey
from singpy.plan import LaunchPlan
from singpy.record import Record

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:

    pass


def import_for_phases(plan: LaunchPlan) -> None:
    """The modules the phases of this plan need, imported now: after the first pivot the package is out of reach
    (a launch, and a shared container's or an instance's holder, which builds its container the same way)."""
    if plan.image.strategy in ("loop", "fuse") and plan.image.kind != "ext3":
        from singpy.image import squashfs  # noqa: F401  (attach_image)
    if plan.image.encryption:
        from singpy.image import cryptmount  # noqa: F401
    if layered(plan):
        from singpy.layers import overlayfs  # noqa: F401  (prepare_root)
    elif plan.underlay == "always":
        from singpy.layers import underlay  # noqa: F401  (a refused overlay imports it later: rootfs)
    if plan.image.kind == "ext3" or any(layer.kind == "extfs" for layer in plan.overlays):
        from singpy.image import extfs  # noqa: F401
    if plan.fusemounts:
        from singpy.launch import fusemount  # noqa: F401  (build_container)


def attach_image(plan: LaunchPlan) -> tuple[str, tuple[int, ...]]:
    """Called in the staging root: the image root's path there, and the helper processes serving it."""
    if plan.image.kind == "ext3":  # a Singularity 2.x ext3 image: the kernel's ext3 (loop) or fuse2fs
        from singpy.image import extfs

        return extfs.attach_root(plan.image, plan.uid, writable=plan.writable)
    if plan.image.encryption:
        from singpy.image import cryptmount

        uid, gid = (0, 0) if plan.fakeroot is not None else (plan.uid, plan.gid)
        return cryptmount.attach(plan.image, uid, gid, quiet=console.level() < console.DEBUG)
    if plan.image.strategy in ("loop", "fuse"):
        from singpy.image import squashfs

        # The FUSE mount serves ids as seen in our user namespace: the user is 0 there with --fakeroot.
        uid, gid = (0, 0) if plan.fakeroot is not None else (plan.uid, plan.gid)
        return squashfs.attach(plan.image, uid, gid)
    assert plan.image.rootfs is not None
    return rootfs.host_path(plan.image.rootfs), ()


def enter_namespaces(plan: LaunchPlan, net_fd: int | None = None) -> None:
    """Called first, in the launcher's only thread (the kernel refuses CLONE_NEWUSER otherwise).

    The PID namespace comes later (`launch`), once the image's helpers run.
    `net_fd`, a network namespace wired from the host (attach_network), is
    joined before a new user namespace exists: that one would have no
    privilege over it. Otherwise --net gets a new one with the loopback up.
    """
    ns = plan.namespaces
    if plan.host_dirs:  # --workdir, --scratch: on the host, as the user, before any namespace
        from singpy.mounts.workdir import make_host_dirs

        make_host_dirs(plan.host_dirs)
    caps.preload(plan.process.privileges)  # python-prctl is out of reach once the container is the root
    if plan.netns_path:  # --netns-path: joined first, while no new user namespace takes our rights over it
        from singpy.launch import netnspath

        netnspath.join(plan.netns_path)
    if net_fd is not None:
        from singpy.kernel import netns

        netns.join(net_fd)
        os.close(net_fd)
    flags = k.CLONE_NEWNS
    flags |= k.CLONE_NEWUSER if ns.user else 0
    flags |= k.CLONE_NEWIPC if ns.ipc else 0
    flags |= k.CLONE_NEWUTS if ns.uts else 0
    flags |= k.CLONE_NEWNET if ns.net and net_fd is None else 0
    console.debug(f"unshare namespaces {ns}")
    if plan.fakeroot is not None:
        from singpy.layers.fakeroot import enter_user_namespace

        console.verbose(plan.fakeroot.note)
        enter_user_namespace(plan.fakeroot, flags)
    else:
        k.unshare(flags)
        if ns.user:
            write_id_maps(plan.uid, plan.gid)
    if ns.net and net_fd is None:
        from singpy.kernel import netns

        netns.loopback_up()


class PreparedRoot(Record):
    """The image on NEWROOT, before the plan's mounts (prepare_root), for build_container."""

    image: Tree  # the image's own root, open: what is read from it is its own
    scripts: ImageScripts  # its scripts the payload may use
    host: Resolver  # the bind sources the survey resolved, with what it found there (for apply_mounts)


def layered(plan: LaunchPlan) -> bool:
    """Whether the root is written or has layers over it: singpy.layers.overlayfs builds it then."""
    return plan.writable or bool(plan.overlays) or plan.overlay_driver == "fuse"


def prepare_root(plan: LaunchPlan, image_root: str) -> tuple[PreparedRoot, tuple[int, ...]]:
    """Called in the staging root before anything is forked: the image, and its layers, on NEWROOT.

    `image_root` is the image's root as seen from the staging root (attach_image).
    Returns the pids of the helpers serving layers (fuse2fs, fuse-overlayfs):
    started here, they are the launcher's children, which its supervisor stops.
    """
    image = Tree(image_root, proc=rootfs.PROC)
    try:
        found = survey(plan.mounts, image)
        action = plan.process.action
        runscript = runscript_path(plan.process.app, action) if action in ("run", "test") else None
        scripts = find_scripts(image, covered=found.covers, runscript=runscript, asked=found.asked_for)
        missing = [] if plan.no_layer() else found.missing
        layer = "the underlay" if plan.underlay == "always" and not layered(plan) else "an overlay layer"
        for path, _ in missing:
            console.debug(f"mount point /{path} is missing from the image: adding it in {layer}")
        helpers: tuple[int, ...] = ()
        if layered(plan):
            from singpy.layers import overlayfs

            helpers = overlayfs.mount_root(plan, image, missing, plan.uid, plan.gid)
        else:
            rootfs.mount_image(image, mount_points=missing, writable=plan.writable_tmpfs,
                               userns=plan.namespaces.user, underlay=plan.underlay)
        if plan.allow_setuid:  # root in no user namespace: the image's set-uid programs work (singpy.launch.setuid)
            rootfs.allow_setuid(rootfs.NEWROOT, mount_setattr="mount_setattr" not in plan.avoid_features)
    except BaseException:
        image.close()
        raise
    return PreparedRoot(image=image, scripts=scripts, host=found.host), helpers


def build_container(plan: LaunchPlan, root: PreparedRoot) -> ImageScripts:
    """Called in the staging root, in the new namespaces (inside the new PID namespace with --pid).

    `root` is the image on NEWROOT (prepare_root). Returns the image's
    scripts the payload may use, found in the image alone.
    """
    writes = plan.writable or plan.writable_tmpfs or any(not layer.readonly for layer in plan.overlays)
    with root.image as image:
        apply_mounts(plan.mounts, image=image, writable_root=plan.writable_tmpfs, no_layer=plan.no_layer(),
                     mount_setattr="mount_setattr" not in plan.avoid_features, host=root.host)
    fuse = None
    if plan.fusemounts:  # the FUSE mounts on their mount points, the host's programs started (singpy.launch.fusemount)
        from singpy.launch import fusemount

        fuse = fusemount.mount_all(plan)
    timed = bool(plan.process.runscript_timeout and root.scripts.env)  # env scripts under a deadline
    if timed:  # imported before the pivot, out of reach after it
        from singpy.launch import scripttimer
    rootfs.finish_root(writable=writes)
    if timed:
        scripttimer.arm(scripttimer.parse_duration(plan.process.runscript_timeout), plan.process.runscript_timeout)
    if fuse is not None:  # the container's programs, once it is the root; then each mount is checked
        fusemount.serve(fuse, plan.process.privileges)
    scripts = root.scripts
    if plan.hostname is not None:
        k.sethostname(plan.hostname)
    return scripts
