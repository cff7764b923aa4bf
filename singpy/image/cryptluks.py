"""Running Apptainer's root-built encrypted SIFs (LUKS2, for the kernel's dm-crypt): as root only.

Apptainer, building as root, formats the partition with `cryptsetup
luksFormat --type luks2` and a key that is the passphrase, or 64 random bytes
sealed in the SIF for an RSA key (internal/pkg/util/crypt, the same message
as singpy.image.cryptkey's). Run here as Apptainer's crypt.Device.Open does:
a loop device on the partition, `cryptsetup open --type luks2 --key-file`
(the key on a pipe), the kernel's squashfs on /dev/mapper/NAME, mounted on
IMAGE in the container's private mount namespace.

A device-mapper device belongs to the whole host, not to the namespace: it is
closed with `cryptsetup close --deferred` as soon as it is mounted, so the
kernel removes it when its last user, the mount, goes with the namespace,
however the container ends, with no process left to do it. Its name,
`singpy-UUID`, says whose it is (`dmsetup ls`).
"""

from __future__ import annotations

import os
import time
import uuid

from singpy import console
from singpy.errors import ImageError, KernelError
from singpy.kernel import loop
from singpy.kernel import syscalls as k
from singpy.launch import process
from singpy.layers import rootfs
from singpy.plan import ImageSpec

MAPPER_CONTROL = "/dev/mapper/control"
NAME_PREFIX = "singpy-"
_FLAGS = k.MS_RDONLY | k.MS_NOSUID | k.MS_NODEV
_SHOW_UP = 25.0  # seconds for /dev/mapper/NAME to appear (Apptainer waits as long)


def refusal(image: ImageSpec, *, uid: int, user_namespace: bool, cryptsetup: str | None,
            allow_kernel: bool) -> str | None:
    """Why this host or user can't open a LUKS2 image; None when it can."""
    if uid != 0 or user_namespace:
        return "only root can open it (the kernel's dm-crypt), as with Apptainer"
    if not has_device_mapper():
        return "this kernel has no device-mapper (no device-mapper in /proc/misc)"
    if cryptsetup is None:
        return "cryptsetup is not installed (not found in PATH or /usr/sbin; Debian package cryptsetup-bin)"
    if not allow_kernel:
        return "it needs the kernel's squashfs, and `allow kernel squashfs = no`"
    return None


def has_device_mapper() -> bool:
    """Whether the kernel's device-mapper driver is there (its control node may exist without it)."""
    try:
        with open("/proc/misc") as misc:
            return any(line.split()[1:] == ["device-mapper"] for line in misc)
    except OSError:
        return os.path.exists(MAPPER_CONTROL)


def attach(image: ImageSpec, password: bytes) -> str:
    """In the staging root: the decrypted partition's squashfs mounted on IMAGE; returns IMAGE."""
    os.mkdir(rootfs.IMAGE, 0o700)
    fd, device = loop.attach(rootfs.host_path(image.path), image.offset, image.size, dev=rootfs.host_path("/dev"))
    name = f"{NAME_PREFIX}{uuid.uuid4()}"
    try:
        _cryptsetup(image, ["open", "--batch-mode", "--readonly", "--type", "luks2", "--key-file", "KEY",
                            _on_host(device), name], key=password)
    finally:
        os.close(fd)  # autoclear: the dm device holds the loop device from now on
    mapped = rootfs.host_path(f"/dev/mapper/{name}")
    try:
        _wait_for(mapped, image)
        try:
            k.mount(mapped, rootfs.IMAGE, "squashfs", _FLAGS)
        except KernelError as error:
            raise ImageError(f"can't mount the decrypted squashfs of {image.path}: {error.reason}") from None
    except BaseException:
        _cryptsetup(image, ["close", name])
        raise
    _cryptsetup(image, ["close", "--deferred", name])  # removed by the kernel once the mount is gone
    return rootfs.IMAGE


def _on_host(path: str) -> str:
    """A staging path under the host's tree, as the host sees it (where cryptsetup runs)."""
    return path[len(rootfs.HOST):] if path.startswith(rootfs.HOST + "/") else path


def _wait_for(mapped: str, image: ImageSpec) -> None:
    waited, pause = 0.0, 0.01
    while not os.path.exists(mapped):
        if waited > _SHOW_UP:
            raise ImageError(f"can't open {image.path}: its dm-crypt device did not show up within "
                             f"{int(_SHOW_UP)} seconds")
        time.sleep(pause)
        waited, pause = waited + pause, min(pause * 2, 0.5)


def _cryptsetup(image: ImageSpec, args: list[str], *, key: bytes | None = None) -> None:
    """Run the host's cryptsetup (in the host tree), `KEY` in `args` standing for a pipe holding `key`."""
    secret = -1
    if key is not None:
        secret, write_end = os.pipe()
        os.write(write_end, key)  # a LUKS key is read whole, no newline added (Apptainer's key on stdin)
        os.close(write_end)
        os.set_inheritable(secret, True)
        args = [f"/dev/fd/{secret}" if arg == "KEY" else arg for arg in args]
    try:
        pid, errors = process.spawn_helper([image.tool, *args], root=rootfs.HOST, keep_fd=max(secret, 0),
                                           quiet=True)
    finally:
        if secret >= 0:
            os.close(secret)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(errors, "rb") as pipe:
        text = pipe.read().decode(errors="replace")
    if status == 0:
        return
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if "No key available" in text:
        raise ImageError(f"can't decrypt {image.path}: wrong passphrase or key (cryptsetup: no key available with "
                         "this passphrase)")
    raise ImageError(f"can't decrypt {image.path}: cryptsetup {args[0]} failed: "
                     f"{console.escape(lines[-1]) if lines else 'no message'}")
