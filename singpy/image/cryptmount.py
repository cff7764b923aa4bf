"""Running a gocryptfs-encrypted SIF (singpy.image.cryptbuild, or Apptainer's), as root and as a user.

As Apptainer's gocryptfsMount (runtime/engine/apptainer/container_linux.go),
three mounts in the container's private mount namespace, under the staging
root: the partition's squashfs (kernel squashfs on a loop device as root,
else squashfuse) on IMAGE.cipher; gocryptfs serving IMAGE.plain from it,
given the password on a pipe; the decrypted `squashfs-NNN` file inside,
mounted on IMAGE (a loop device as root, else squashfuse). The helpers are
the launcher's (the supervisor stops them); the mounts, and the loop devices
they hold (autoclear), go with the namespace, whatever ends the container.

`prepare` runs on the host before any namespace: the site's permission, the
key (asked now, or decrypted from the SIF's message with the RSA private
key), and how to mount; the plan records where the key came from, never
the key (held in this process by singpy.image.cryptkey).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

from singpy import console
from singpy.constants import FUSE_DEVICE
from singpy.errors import ImageError, KernelError
from singpy.image import cryptkey, cryptluks, squashfs
from singpy.kernel import loop
from singpy.kernel import syscalls as k
from singpy.launch import process
from singpy.layers import rootfs
from singpy.plan import ImageSpec

GOCRYPTFS = "gocryptfs"
_FLAGS = k.MS_RDONLY | k.MS_NOSUID | k.MS_NODEV
_INNER_PREFIX = "squashfs-"
_PASSWORD = "password of the image"  # the cryptkey slot holding what unlocks this launch's image


def prepare(image: ImageSpec, *, uid: int, env: Mapping[str, str], prompt: bool, pem_path: str,
            allowed: bool, allow_kernel: bool, user_namespace: bool) -> ImageSpec:
    """The encrypted image's key and mount strategy, or one error saying why it can't run here."""
    from singpy.image.tools import find_tool

    if not allowed and uid != 0:
        raise ImageError(f"configuration disallows users from running encrypted SIF containers ({image.path}): "
                         "`allow container encrypted = no`")
    if image.encryption == "luks":
        return _prepare_luks(image, uid=uid, env=env, prompt=prompt, pem_path=pem_path, allow_kernel=allow_kernel,
                             user_namespace=user_namespace)
    key = _key(image, env, prompt=prompt, pem_path=pem_path)
    gocryptfs = find_tool(GOCRYPTFS, env)
    if gocryptfs is None:
        raise ImageError(f"can't run the encrypted image {image.path}: gocryptfs is not installed (not found in "
                         "PATH)", hint="install gocryptfs")
    _hold_password(image, key)
    squashfuse = next((path for name in ("squashfuse_ll", "squashfuse") if (path := find_tool(name, env))), "")
    if uid == 0 and not user_namespace and allow_kernel and os.path.exists("/dev/loop-control"):
        strategy = "loop"
    elif not squashfuse:
        raise ImageError(f"can't run the encrypted image {image.path}: squashfuse is not installed (not found in "
                         "PATH)", hint="install squashfuse")
    else:
        strategy = "fuse"
    if not os.access(FUSE_DEVICE, os.R_OK | os.W_OK):
        raise ImageError(f"can't run the encrypted image {image.path}: gocryptfs needs FUSE, and {FUSE_DEVICE} is "
                         "not readable and writable by you")
    console.verbose(f"encrypted image {image.path}: gocryptfs, key from {key.source}, squashfs by {strategy}")
    squashfs.open_checked(image)  # `attach` mounts this very file, whatever is renamed over its path meanwhile
    return image.replace(strategy=strategy, tool=squashfuse if strategy == "fuse" else "", gocryptfs=gocryptfs,
                         key=f"{key.format} from {key.source}")


def _key(image: ImageSpec, env: Mapping[str, str], *, prompt: bool, pem_path: str,
         what: str = "is encrypted") -> cryptkey.KeyInfo:
    key = cryptkey.material(env, prompt=prompt, pem_path=pem_path, public=False)
    if key is None:
        raise ImageError(f"{image.path} {what}: give its key with --passphrase or --pem-path (or "
                         "APPTAINER_ENCRYPTION_PASSPHRASE, APPTAINER_ENCRYPTION_PEM_PATH)")
    return key


def _prepare_luks(image: ImageSpec, *, uid: int, env: Mapping[str, str], prompt: bool, pem_path: str,
                  allow_kernel: bool, user_namespace: bool) -> ImageSpec:
    """Apptainer's root-built kind (singpy.image.cryptluks): root, cryptsetup and a device-mapper needed."""
    from singpy.image.tools import find_tool

    what = "the primary partition is encrypted squashfs (dm-crypt LUKS2, built by Apptainer as root)"
    # an admin's tool, in sbin, which a user's PATH often lacks (Apptainer looks in its own list of places)
    cryptsetup = find_tool("cryptsetup", env) or find_tool("cryptsetup", {"PATH": "/usr/sbin:/sbin"})
    why = cryptluks.refusal(image, uid=uid, user_namespace=user_namespace, cryptsetup=cryptsetup,
                            allow_kernel=allow_kernel)
    if why is not None:
        raise ImageError(f"{image.path}: {what}: {why}")
    key = _key(image, env, prompt=prompt, pem_path=pem_path, what=f"({what})")
    _hold_password(image, key, binary=True)
    console.verbose(f"encrypted image {image.path}: dm-crypt (LUKS2), key from {key.source}")
    return image.replace(strategy="dm-crypt", tool=cryptsetup or "", key=f"{key.format} from {key.source}")


def _hold_password(image: ImageSpec, key: cryptkey.KeyInfo, *, binary: bool = False) -> None:
    """The password, held in this process; `binary`: a LUKS key (any bytes), else gocryptfs's (one line)."""
    if key.format == cryptkey.PASSPHRASE:
        password = cryptkey.held(key)
    else:
        password = cryptkey.decrypt_password(key, _sealed_password(image.path), image.path)
    if not binary and b"\n" in password:
        raise ImageError(f"can't decrypt {image.path}: a passphrase with a newline can't be one of its keys")
    cryptkey._held[_PASSWORD] = password


def _sealed_password(path: str) -> bytes:
    """The RSA-OAEP message linked to the primary partition (Apptainer's getEncryptionKeyFromImage)."""
    import struct

    from singpy.image import sif

    image = sif.read_sif(path)
    primary = image.primary_partition()
    for desc in image.find(sif.DATA_CRYPTO_MESSAGE):
        if desc.link == primary.id and not desc.link_is_group and len(desc.extra) >= 8 and struct.unpack_from(
                "<ii", desc.extra) == (cryptkey.FORMAT_PEM, cryptkey.MESSAGE_RSA_OAEP):
            return image.read_object(desc, max_size=1 << 20)
    raise ImageError(f"can't decrypt {path} with an RSA key: it holds no encrypted key (it was encrypted with a "
                     "passphrase: use --passphrase)")


def attach(image: ImageSpec, uid: int, gid: int, *, quiet: bool) -> tuple[str, tuple[int, ...]]:
    """In the staging root: the decrypted image mounted on IMAGE; (IMAGE, the helpers' pids, last first)."""
    if image.encryption == "luks":
        return cryptluks.attach(image, cryptkey._held[_PASSWORD]), ()
    cipher, plain = f"{rootfs.IMAGE}.cipher", f"{rootfs.IMAGE}.plain"
    for path in (cipher, plain, rootfs.IMAGE):
        os.mkdir(path, 0o700)
    helpers: list[int] = []
    try:
        _squashfs(image, squashfs.checked_descriptor(image), image.offset, image.size, cipher, uid, gid, helpers,
                  quiet=quiet)
        name = _inner_name(cipher, image.path)
        helpers.append(_gocryptfs(image, cipher, plain, uid, gid, quiet=quiet))
        inner = _open_inner(f"{plain}/{name}", image.path)
        try:  # by descriptor: a link in the image must not lead the mount to another file
            _squashfs(image, inner, 0, 0, rootfs.IMAGE, uid, gid, helpers, quiet=quiet)
        finally:
            os.close(inner)
    except BaseException:
        for pid in reversed(helpers):
            process.stop_helper(pid)
        raise
    finally:  # the loop device, or squashfuse, holds the file now
        squashfs.release_checked(image)
    return rootfs.IMAGE, tuple(reversed(helpers))


def _open_inner(path: str, image: str) -> int:
    """The decrypted squashfs file, opened without following a link; refused unless a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        raise ImageError(f"can't open the decrypted partition of {image}: {error.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ImageError(f"can't open the decrypted partition of {image}: not a regular file")
    return fd


def _inner_name(cipher: str, path: str) -> str:
    try:
        names = os.listdir(cipher)
    except OSError as error:
        raise ImageError(f"can't read the encrypted partition of {path}: {error.strerror}") from None
    inner = sorted(name for name in names if name.startswith(_INNER_PREFIX))
    if "gocryptfs.conf" not in names or not inner:
        raise ImageError(f"{path}: its encrypted partition is not a gocryptfs one (no gocryptfs.conf and "
                         f"{_INNER_PREFIX}* file)")
    return inner[0]


def _squashfs(image: ImageSpec, backing: int, offset: int, size: int, target: str, uid: int, gid: int,
              helpers: list[int], *, quiet: bool) -> None:
    """The squashfs in the file open as `backing` (the SIF checked before the launch, or the decrypted file) on
    `target`: loop (root) or squashfuse; by descriptor, never by a path that could name another file by now."""
    if image.strategy == "loop":
        fd, device = loop.attach(image.path, offset, size, dev=rootfs.host_path("/dev"), backing_fd=backing)
        try:
            k.mount(device, target, "squashfs", _FLAGS)
        except KernelError as error:
            raise ImageError(f"can't mount the squashfs of {image.path}: {error.reason}") from None
        finally:
            os.close(fd)  # autoclear: the mount holds the device alone
        return
    fuse = rootfs.mount_fuse(target, "squashfuse", f"fuse.{os.path.basename(image.tool)}", _FLAGS, uid=uid, gid=gid,
                             what=image.path)
    os.set_inheritable(backing, True)  # only across this fork: the payload must not get it
    try:  # /proc/self/fd/N: a host's /dev may lack the /dev/fd link; "/dev/fd/N" last is libfuse's, parsed, not opened
        argv = [image.tool, "-f", "-o", f"offset={offset}", f"/proc/self/fd/{backing}", f"/dev/fd/{fuse}"]
        pid, errors = process.spawn_helper(argv, root=rootfs.HOST, keep_fd=fuse, quiet=quiet)
    finally:
        os.set_inheritable(backing, False)
        os.close(fuse)
    helpers.append(pid)
    _wait_served(target, pid, errors, f"can't mount the squashfs of {image.path}")


def _gocryptfs(image: ImageSpec, cipher: str, plain: str, uid: int, gid: int, *, quiet: bool) -> int:
    """gocryptfs serving `plain` from `cipher`, its password written to a pipe it reads (-passfile)."""
    fuse = rootfs.mount_fuse(plain, "gocryptfs", "fuse.gocryptfs", k.MS_NOSUID | k.MS_NODEV, uid=uid, gid=gid,
                             what=image.path)
    directory = os.open(cipher, os.O_RDONLY | os.O_DIRECTORY)
    secret_read, secret_write = os.pipe()
    try:
        os.write(secret_write, cryptkey._held[_PASSWORD] + b"\n")
        os.close(secret_write)
        for fd in (directory, secret_read):
            os.set_inheritable(fd, True)
        argv = [image.gocryptfs, "-q", "-fg", "-passfile", f"/proc/self/fd/{secret_read}",
                f"/proc/self/fd/{directory}", f"/dev/fd/{fuse}"]  # the last: go-fuse's mounted descriptor, parsed
        pid, errors = process.spawn_helper(argv, root=rootfs.HOST, keep_fd=fuse, quiet=quiet)
    finally:
        for fd in (fuse, directory, secret_read):
            os.close(fd)
    _wait_served(plain, pid, errors, f"can't decrypt {image.path}", wrong_key=True)
    return pid


def _wait_served(target: str, pid: int, errors: int, what: str, *, wrong_key: bool = False) -> None:
    """The first access waits for the helper to serve; a helper that failed aborts it (ENOTCONN)."""
    try:
        os.stat(target)
    except OSError as error:
        reason = process.helper_failure(pid, errors) or error.strerror or "the helper failed"
        if wrong_key and "password incorrect" in reason.lower():
            reason = "wrong passphrase or key (gocryptfs: password incorrect)"
        raise ImageError(f"{what}: {console.escape(reason)}") from None
