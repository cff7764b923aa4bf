"""`singpy build --passphrase | --pem-path`: a SIF whose root filesystem is encrypted with gocryptfs.

Laid out as Apptainer's unprivileged encrypted build writes it
(internal/pkg/image/packer/gocryptfs.go, build/assemblers/sif.go), which
Apptainer >= 1.3 runs as root and as a user alike: the image's squashfs,
written through a gocryptfs mount (`-init -deterministic-names
-plaintextnames`) as a file named `squashfs-NNN`, is squashed again, with the
`gocryptfs.conf` beside it, uncompressed (`-noD -noF`), into the primary
partition (filesystem type "Gocryptfs squashfs"). The gocryptfs password is
the passphrase, or, with an RSA public key, 32 random bytes' MD5 in hex,
stored in a Cryptographic Message object linked to the partition
(singpy.image.cryptkey).

The plain image is built first into a private directory next to the target
(singpy.cli.build), then encrypted: the target is written atomically at the
end (sifwrite.create_sif), and the directory removed whatever happens, so a
failed build leaves nothing at the output path. The gocryptfs mount lives in
a forked child's private mount namespace, gone with it.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Mapping

from singpy import console
from singpy.errors import ImageError
from singpy.image import cryptkey

_INNER_PREFIX = "squashfs-"  # Apptainer finds the encrypted file by this prefix (container_linux.go)


def build_encrypted(target: str, key: cryptkey.KeyInfo, *, force: bool, env: Mapping[str, str],
                    build_plain: Callable[[str], None]) -> None:
    """Build the plain SIF with `build_plain(path)`, then write TARGET as its encrypted copy."""
    from singpy.image import cache
    from singpy.image.builder import scratch_dir
    from singpy.image.tools import find_tool, require_tool

    target = os.path.abspath(target)
    if os.path.lexists(target) and not force:
        raise ImageError(f"{target} already exists (use --force to overwrite it)")
    gocryptfs = find_tool("gocryptfs", env)
    if gocryptfs is None:
        raise ImageError("gocryptfs is not installed (not found in PATH): it is needed to build an encrypted image",
                         hint="install gocryptfs")
    mksquashfs = require_tool("mksquashfs", env, "build an encrypted image")
    password = _password(key)
    work = scratch_dir(target, ".singpy-encrypt-")
    try:
        build_plain(f"{work}/plain.sif")
        console.info(f"encrypting the root filesystem with gocryptfs ({key.format} from {key.source})")
        inner = _encrypt_partition(f"{work}/plain.sif", work, gocryptfs, password)
        outer = f"{work}/outer.sqfs"
        _squash(mksquashfs, [inner, f"{work}/cipher/gocryptfs.conf"], outer, env)
        _write_sif(f"{work}/plain.sif", outer, target, key, password)
    finally:
        cache.remove_tree(work)


def _password(key: cryptkey.KeyInfo) -> bytes:
    """gocryptfs's password: the passphrase, or a random one for an RSA key (hex: no newline can end it)."""
    if key.format == cryptkey.PASSPHRASE:
        secret = cryptkey.held(key)
        if b"\n" in secret:
            raise ImageError("an encryption passphrase cannot contain a newline")
        return secret
    import hashlib

    return hashlib.md5(secrets.token_bytes(32), usedforsecurity=False).hexdigest().encode()  # as Apptainer


def _encrypt_partition(plain_sif: str, work: str, gocryptfs: str, password: bytes) -> str:
    """The primary squashfs of `plain_sif` written through gocryptfs: the ciphertext file's path."""
    import subprocess

    from singpy.image.sif import read_sif

    part = read_sif(plain_sif).primary_partition()
    cipher, plain = f"{work}/cipher", f"{work}/plain"
    os.mkdir(cipher, 0o700)
    os.mkdir(plain, 0o700)
    twice = password + b"\n" + password + b"\n"
    done = subprocess.run([gocryptfs, "-q", "-init", "-deterministic-names", "-plaintextnames", cipher],
                          input=twice, capture_output=True, check=False)
    if done.returncode != 0:
        raise ImageError(f"gocryptfs -init failed: {_last_line(done.stderr)}")
    name = f"{_INNER_PREFIX}{secrets.randbelow(10**9)}"
    _in_private_mount(lambda: _copy_through(gocryptfs, password, cipher, plain, plain_sif, part.offset, part.size,
                                            name))
    inner = f"{cipher}/{name}"
    for path in (inner, f"{cipher}/gocryptfs.conf"):  # readable where the runner's squashfuse shows them
        os.chmod(path, 0o644)
    return inner


def _last_line(data: bytes) -> str:
    lines = [line.strip() for line in data.decode(errors="replace").splitlines() if line.strip()]
    return console.escape(lines[-1]) if lines else "no message"


def _in_private_mount(work: Callable[[], None]) -> None:
    """Run `work` in a forked child with a mount namespace of its own (and a user namespace, unprivileged)."""
    from singpy.launch import process

    errors_read, errors_write = os.pipe2(os.O_CLOEXEC)
    pid = process.fork_tied()
    if pid == 0:
        status = 1
        try:
            os.close(errors_read)
            _enter_private_mount()
            work()
            status = 0
        except BaseException as error:  # never unwind into the parent's code
            os.write(errors_write, str(error).encode(errors="replace")[:4000])
        os._exit(status)
    os.close(errors_write)
    with os.fdopen(errors_read, "rb") as pipe:
        message = pipe.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if status != 0:
        raise ImageError(f"can't encrypt the image: {message or 'the encrypting process failed'}")


def _enter_private_mount() -> None:
    from singpy.kernel import syscalls as k
    from singpy.kernel.idmap import write_id_maps

    uid, gid = os.getuid(), os.getgid()
    k.unshare(k.CLONE_NEWNS | (k.CLONE_NEWUSER if uid != 0 else 0))
    if uid != 0:
        write_id_maps(uid, gid)
    k.mount(None, "/", None, k.MS_REC | k.MS_PRIVATE)


def _copy_through(gocryptfs: str, password: bytes, cipher: str, plain: str, sif: str, offset: int, size: int,
                  name: str) -> None:
    """In the private mount namespace: serve `plain` with gocryptfs and write the partition into it."""
    import signal
    import subprocess

    from singpy.constants import FUSE_DEVICE
    from singpy.kernel import syscalls as k

    try:
        fuse = os.open(FUSE_DEVICE, os.O_RDWR)
    except OSError as error:
        raise ImageError(f"gocryptfs needs FUSE, and {FUSE_DEVICE} can't be opened: {error.strerror}") from None
    uid, gid = os.getuid(), os.getgid()
    k.mount("gocryptfs", plain, "fuse.gocryptfs", k.MS_NOSUID | k.MS_NODEV,
            f"fd={fuse},rootmode=40000,user_id={uid},group_id={gid}")
    secret_read, secret_write = os.pipe()
    os.write(secret_write, password + b"\n")  # a pipe: the password never touches a disk
    os.close(secret_write)
    helper = subprocess.Popen(  # noqa: S603 - a host tool found on PATH, no shell
        [gocryptfs, "-q", "-fg", "-passfile", f"/dev/fd/{secret_read}", cipher, f"/dev/fd/{fuse}"],
        pass_fds=(fuse, secret_read), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, preexec_fn=_die_with_parent)
    os.close(fuse)
    os.close(secret_read)
    try:
        os.stat(plain)  # waits for gocryptfs to serve: a file created before is refused (EACCES) to a user
        _copy_range(sif, offset, size, f"{plain}/{name}")
    except OSError as error:
        helper.kill()
        raise ImageError(f"writing through gocryptfs failed: {error.strerror} ({error.filename}); gocryptfs: "
                         f"{_last_line(helper.communicate()[1])}") from None
    helper.send_signal(signal.SIGTERM)
    helper.communicate()


def _die_with_parent() -> None:
    import signal

    from singpy.kernel import syscalls as k

    k.prctl(k.PR_SET_PDEATHSIG, signal.SIGKILL)


def _copy_range(source: str, offset: int, size: int, dest: str) -> None:
    with open(source, "rb") as src, open(dest, "xb") as out:
        src.seek(offset)
        left = size
        while left:
            chunk = src.read(min(left, 1 << 20))
            if not chunk:
                raise OSError(5, "the plain image is truncated")
            out.write(chunk)
            left -= len(chunk)
        out.flush()
        os.fsync(out.fileno())


def _squash(mksquashfs: str, files: list[str], dest: str, env: Mapping[str, str]) -> None:
    """Apptainer's second mksquashfs: the ciphertext and its config, not compressed again."""
    import subprocess

    argv = [mksquashfs, *files, dest, "-noappend", "-comp", "gzip", "-noD", "-noF", "-all-root", "-quiet"]
    done = subprocess.run(argv, capture_output=True, check=False, env={"PATH": env.get("PATH", os.defpath)})
    if done.returncode != 0:
        raise ImageError(f"mksquashfs failed: {_last_line(done.stderr or done.stdout)}")


def _write_sif(plain_sif: str, outer: str, target: str, key: cryptkey.KeyInfo, password: bytes) -> None:
    """TARGET: the plain SIF's other objects, the encrypted partition, and for an RSA key its sealed password."""
    from singpy.image import sif
    from singpy.image.sifwrite import SifObject, create_sif

    image = sif.read_sif(plain_sif)
    primary = image.primary_partition()
    objects = [SifObject(d.datatype, image.read_object(d), name=d.name, group=d.group_id, link=d.link,
                         link_is_group=d.link_is_group, extra=d.extra)
               for d in image.descriptors if d.id != primary.id and d.datatype != sif.DATA_PARTITION]
    objects.append(SifObject(sif.DATA_PARTITION, path=outer, name=primary.name, fstype=sif.FS_GOCRYPTFS,
                             parttype=sif.PART_PRIMSYS, arch=primary.arch))
    if key.format == cryptkey.PEM:
        import struct

        objects.append(SifObject(sif.DATA_CRYPTO_MESSAGE, cryptkey.encrypt_password(key, password),
                                 link=len(objects), extra=struct.pack("<ii", cryptkey.FORMAT_PEM,
                                                                      cryptkey.MESSAGE_RSA_OAEP)))
    create_sif(target, objects)
