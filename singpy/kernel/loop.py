"""Loop devices: expose a byte range of a file as a read-only block device.

Used as root to mount a SIF's squashfs partition with the kernel's own
squashfs driver. The device is attached with offset and size limit set, so
the partition is mounted in place, and with `LO_FLAGS_AUTOCLEAR`, so the
kernel detaches it by itself once its last user is gone: our file
descriptor (closed right after the mount) and then the mount, which lives
only in the container's private mount namespace. Whatever way the container
ends, the device is released with the namespace; nothing needs undoing.

`LOOP_CONFIGURE` (Linux 5.8) sets the backing file and the status in one
call; older kernels, or `avoid kernel features = loop_configure`, get `LOOP_SET_FD`
+ `LOOP_SET_STATUS64`, as util-linux's losetup does ([1] linux/drivers/block/loop.c, loop_configure();
[2] man 4 loop). A free device number comes from /dev/loop-control; another
process may take the same one between our two calls, hence the retries.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct

from singpy import console
from singpy.errors import KernelError

LOOP_SET_FD = 0x4C00
LOOP_CLR_FD = 0x4C01
LOOP_SET_STATUS64 = 0x4C04
LOOP_CONFIGURE = 0x4C0A
LOOP_CTL_GET_FREE = 0x4C82

LO_FLAGS_READ_ONLY = 1
LO_FLAGS_AUTOCLEAR = 4

# struct loop_info64 (include/uapi/linux/loop.h): device, inode, rdevice, offset, sizelimit (u64);
# number, encrypt_type, encrypt_key_size, flags (u32); file_name[64], crypt_name[64],
# encrypt_key[32]; init[2] (u64). 232 bytes, naturally aligned.
_INFO64 = "5Q4I64s64s32s2Q"
# struct loop_config: fd, block_size (u32), loop_info64, __reserved[8] (u64). 304 bytes.
_CONFIG = struct.Struct("=2I" + _INFO64 + "8Q")
_STATUS = struct.Struct("=" + _INFO64)
# Tries when another process takes the free device first: the kernel hands the same lowest free number to
# everyone who asks until one of them configures it, so 32 runs of one image started together (a job array
# on one node) collide many times; a short random pause spreads them out.
_ATTEMPTS = 64
# `max loop devices` (singpy.conf, Apptainer's directive): only /dev/loop0 to loop{N-1} are used, as Apptainer
# scans them; set by the launch from its plan (singpy.launch.launch) before anything is attached.
_max_devices = 256
# `avoid kernel features = loop_configure` (singpy.conf): LOOP_SET_FD + LOOP_SET_STATUS64 even where
# LOOP_CONFIGURE exists; set by the launch from its plan, as _max_devices.
_use_configure = True


def set_max_devices(count: int) -> None:
    global _max_devices
    _max_devices = count


def set_use_configure(use: bool) -> None:
    global _use_configure
    _use_configure = use


def _info(path: str, offset: int, size: int, writable: bool = False) -> tuple[object, ...]:
    name = os.fsencode(path)[-63:]  # shown by `losetup -a`; truncated as the kernel does
    flags = LO_FLAGS_AUTOCLEAR if writable else LO_FLAGS_READ_ONLY | LO_FLAGS_AUTOCLEAR
    return (0, 0, 0, offset, size, 0, 0, 0, flags, name, b"", b"", 0, 0)


def attach(image: str, offset: int, size: int, *, dev: str = "/dev", writable: bool = False,
           backing_fd: int | None = None) -> tuple[int, str]:
    """Attach `size` bytes of `image` from `offset` (0: to the end) to a free loop device.

    Returns an open read-only descriptor of the device and its path. The
    caller mounts the device, then closes the descriptor: with autoclear set
    the device stays attached exactly as long as something uses it.
    `writable`: a read-write device (an ext3 overlay image), else read-only.
    `backing_fd`: the image already opened (and checked) by the caller: that
    very file is attached, `image` only names it, never reopened (a path
    swapped since the check can't slip another file in); left open.
    """
    backing = os.dup(backing_fd) if backing_fd is not None else _open(image, "image", writable)
    try:
        for _ in range(_ATTEMPTS):
            number = _free_device(dev)
            if number >= _max_devices:
                # No path in the message: `image` is seen from the staging root here (/oldroot/...).
                raise KernelError(f"can't attach a loop device: no loop devices available (the first free one "
                                  f"is loop{number}; max loop devices = {_max_devices})",
                                  hint="`max loop devices` in singpy.conf may be raised")
            path = f"{dev}/loop{number}"
            loop = _open(path, "loop device", writable)
            try:
                _configure(loop, backing, image, offset, size, writable)
            except BlockingIOError:  # EAGAIN/EBUSY: taken meanwhile, ask for another one
                os.close(loop)
                _pause()
                continue
            except BaseException:
                os.close(loop)
                raise
            return loop, path
        raise KernelError(f"can't attach {image} to a loop device: all free devices were taken meanwhile")
    finally:
        os.close(backing)


def _pause() -> None:
    """Up to 5 ms, at random: called in the staging root, where only built-in modules (time) can be imported."""
    import time

    time.sleep(int.from_bytes(os.urandom(2), "little") / 0xFFFF * 0.005)


def _open(path: str, what: str, writable: bool = False) -> int:
    try:
        return os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC)
    except OSError as error:
        raise KernelError(f"can't open {what} {path}: {error.strerror}") from None


def _free_device(dev: str) -> int:
    control = _open(f"{dev}/loop-control", "loop control device")
    try:
        return fcntl.ioctl(control, LOOP_CTL_GET_FREE)
    except OSError as error:
        raise KernelError(f"can't find a free loop device: {error.strerror}") from None
    finally:
        os.close(control)


def _configure(loop: int, backing: int, image: str, offset: int, size: int, writable: bool = False) -> None:
    info = _info(image, offset, size, writable)
    if _use_configure:
        try:
            fcntl.ioctl(loop, LOOP_CONFIGURE, _CONFIG.pack(backing, 0, *info, *([0] * 8)))
            return
        except OSError as error:
            if error.errno == errno.EBUSY:
                raise BlockingIOError(error.errno, error.strerror) from None
            if error.errno not in (errno.EINVAL, errno.ENOTTY):  # EINVAL/ENOTTY: kernel older than 5.8
                raise KernelError(f"can't attach {image} to a loop device: {error.strerror}") from None
    console.debug("loop device: LOOP_SET_FD + LOOP_SET_STATUS64" + ("" if _use_configure else
                  " (avoid kernel features = loop_configure)"))
    _set_fd_and_status(loop, backing, image, info)


def _set_fd_and_status(loop: int, backing: int, image: str, info: tuple[object, ...]) -> None:
    try:
        fcntl.ioctl(loop, LOOP_SET_FD, backing)
    except OSError as error:
        if error.errno == errno.EBUSY:
            raise BlockingIOError(error.errno, error.strerror) from None
        raise KernelError(f"can't attach {image} to a loop device: {error.strerror}") from None
    try:
        fcntl.ioctl(loop, LOOP_SET_STATUS64, _STATUS.pack(*info))
    except OSError as error:
        fcntl.ioctl(loop, LOOP_CLR_FD, 0)  # without autoclear set, it would stay attached
        raise KernelError(f"can't set up the loop device for {image}: {error.strerror}") from None
