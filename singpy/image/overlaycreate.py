"""`singpy overlay create`: a writable ext3 overlay, as a new image file or a partition added to a SIF.

Apptainer's layout and tools ([1] apptainer internal/app/apptainer/overlay_create.go):
the filesystem is made by `mkfs.ext3 -d` from a staging directory holding
`upper/` and `work/` (and the `--create-dir` directories under `upper/`),
so no mount and no root are needed, and they belong to whoever runs the
command: the user, who can then write them through fuse2fs in a user
namespace (the kernel refuses writes to an inode whose owner is not mapped
there), or root with `--fakeroot`, for containers run with `--fakeroot`
(mkfs.ext3 is then run in a user namespace of its own that maps the user
to root, so it records the staging directory as root's).

Nothing is left behind on failure: the filesystem is built in a hidden
temporary file next to the target, which becomes the target only at the
end (a hard link, which never replaces a file created meanwhile), or is
appended to the SIF by `sifwrite.append_partition`, which writes the
descriptor last and truncates its data away on an error.
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import tempfile
from collections.abc import Mapping

from singpy import console
from singpy.errors import ImageError, SifError
from singpy.image import sif, sifwrite, trees
from singpy.image.detect import host_arch
from singpy.image.tools import Interruptible, find_tool

MIN_SIZE_MB = 64  # Apptainer's lower bound
MAX_SIZE_MB = (2**63 - 1) >> 20  # the largest file size (off_t) in whole MiB
MKFS = "mkfs.ext3"
SBIN_PATH = "/usr/local/sbin:/usr/sbin:/sbin"
EXT_MAGIC_AT = 1080  # the superblock (at 1024) has its magic 56 bytes in
EXT_MAGIC = b"\x53\xef"
_ZEROS = 1 << 20


def create(path: str, *, size_mb: int, sparse: bool, dirs: list[str], fakeroot: bool,
           env: Mapping[str, str], tmpdir: str) -> str:
    """Make the overlay; returns what was done, for the user."""
    if size_mb < MIN_SIZE_MB:
        raise ImageError(f"image size must be equal or greater than {MIN_SIZE_MB} MiB")
    if size_mb > MAX_SIZE_MB:  # past what a file offset (off_t) can address: the kernel would never take it
        raise ImageError(f"image size of {size_mb} MiB is too large: at most {MAX_SIZE_MB} MiB")
    # An sbin program: a user's PATH often lacks those directories (Apptainer looks there too).
    mkfs = find_tool(MKFS, env) or find_tool(MKFS, {"PATH": SBIN_PATH})
    if mkfs is None:
        raise ImageError(f"{MKFS} is not installed (not found in PATH): it is needed to create an overlay image",
                         hint="install e2fsprogs")
    relative_dirs = [_inside_upper(name) for name in dirs]
    into_sif = _check_target(path)
    directory, base = os.path.split(os.path.abspath(path))
    with Interruptible():
        try:
            fd, scratch = tempfile.mkstemp(prefix=f".{base}.", suffix=".ext3", dir=directory)
        except OSError as error:
            raise ImageError(f"can't create {path}: {error.strerror}") from None
        try:
            _allocate(fd, size_mb << 20, sparse=sparse, path=path)
            closing, fd = fd, -1  # forgotten, then closed: a signal's exception between never closes it twice
            os.close(closing)
            _make_filesystem(mkfs, scratch, relative_dirs, sparse=sparse, fakeroot=fakeroot, tmpdir=tmpdir)
            if into_sif:
                _append_to_sif(path, scratch)
                return f"writable overlay partition of {size_mb} MiB added to {path}"
            _publish(scratch, path)
            return f"overlay image {path} created ({size_mb} MiB)"
        finally:
            if fd >= 0:
                os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(scratch)


def _inside_upper(name: str) -> str:
    """A --create-dir path, relative to upper/; it may not climb out of it."""
    relative = os.path.normpath("/" + name).lstrip("/")
    if not name or ".." in name.split("/") or not relative:
        raise ImageError(f"--create-dir {name!r}: overlay directory created outside of overlay layout")
    return relative


def _check_target(path: str) -> bool:
    """True for a SIF that may take an overlay partition, False for a new file; anything else is refused."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return False
    except OSError as error:
        raise ImageError(f"can't use {path}: {error.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ImageError(f"{path} exists and is not a regular file: not overwriting it")
    if _is_ext(path):
        raise ImageError(f"EXT3 overlay image {path} already exists")
    if not sif.is_sif(path):
        raise ImageError(f"{path} exists and is not a SIF image: not overwriting it",
                         hint="name a new file, or a SIF image to add a writable overlay partition to")
    image = sif.read_sif(path)
    if image.find(sif.DATA_SIGNATURE):
        raise ImageError(f"SIF image {path} is signed: could not add writable overlay")
    for desc in image.descriptors:
        if desc.is_primary and desc.fstype == sif.FS_ENCRYPTED_SQUASHFS:
            raise ImageError(f"encrypted root FS partition in {path}: could not add writable overlay")
    existing = next((d for d in image.descriptors if d.is_partition and d.parttype == sif.PART_OVERLAY
                     and d.fstype == sif.FS_EXT3), None)
    if existing is not None:
        raise ImageError(f"a writable overlay partition already exists in {path} (ID: {existing.id})",
                         hint=f"delete it first with `siftool del {existing.id} {path}`")
    if not os.access(path, os.W_OK):
        raise ImageError(f"can't add an overlay partition to {path}: Permission denied")
    return True


def _is_ext(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return os.pread(fd, 2, EXT_MAGIC_AT) == EXT_MAGIC
    except OSError:
        return False
    finally:
        os.close(fd)


def _allocate(fd: int, size: int, *, sparse: bool, path: str) -> None:
    """The file's blocks: a hole (--sparse, as `truncate`) or real zeros (as Apptainer's `dd`)."""
    try:
        if sparse:
            os.ftruncate(fd, size)
            return
        try:
            os.posix_fallocate(fd, 0, size)  # allocated, reading as zeros, without writing them
        except OSError as error:
            if error.errno not in (95, 22):  # EOPNOTSUPP, EINVAL: a filesystem without fallocate
                raise
            zeros = bytes(_ZEROS)
            for start in range(0, size, _ZEROS):
                os.pwrite(fd, zeros[: min(_ZEROS, size - start)], start)
    except OSError as error:
        raise ImageError(f"can't create {path}: {error.strerror}") from None


def _make_filesystem(mkfs: str, image: str, dirs: list[str], *, sparse: bool, fakeroot: bool, tmpdir: str) -> None:
    """mkfs.ext3 -d from a staging tree: upper/ and work/ (mode 0755, Apptainer's), the asked dirs in upper/."""
    # Ids above 65535 get 0777 in Apptainer: their owner may not be who uses the image (old 16-bit ids).
    mode = 0o777 if os.getuid() > 65535 or os.getgid() > 65535 else 0o755
    try:
        staging = tempfile.mkdtemp(prefix="overlay-", dir=tmpdir)
    except OSError as error:
        raise ImageError(f"can't create a staging directory in {tmpdir}: {error.strerror}") from None
    try:
        for name in ("upper", "work", *(f"upper/{d}" for d in dirs)):
            parts = name.split("/")
            for depth in range(1, len(parts) + 1):
                path = os.path.join(staging, *parts[:depth])
                if not os.path.isdir(path):
                    os.mkdir(path)
                    os.chmod(path, mode)  # not the umask's
        # nodiscard: mke2fs would punch holes in the zeros, making the file sparse all the same
        discard = [] if sparse else ["-E", "nodiscard"]
        _run_mkfs([mkfs, "-q", "-F", *discard, "-d", staging, image], fakeroot=fakeroot and os.getuid() != 0)
    except OSError as error:
        raise ImageError(f"can't prepare the overlay layout in {staging}: {error.strerror}") from None
    finally:
        with contextlib.suppress(OSError):  # a leftover in TMPDIR is no reason to fail the overlay made
            trees.remove(staging)


def _run_mkfs(argv: list[str], *, fakeroot: bool) -> None:
    from singpy.kernel import syscalls as k
    from singpy.kernel.idmap import write_proc_file

    console.debug(f"running {argv}{' as root in a user namespace' if fakeroot else ''}")
    uid, gid = os.getuid(), os.getgid()

    def as_root() -> None:  # in the child: the user is root in a namespace of its own, as mkfs.ext3 sees it
        k.prctl(k.PR_SET_PDEATHSIG, 9)
        if fakeroot:
            k.unshare(k.CLONE_NEWUSER)
            write_proc_file("/proc/self/setgroups", "deny")
            write_proc_file("/proc/self/uid_map", f"0 {uid} 1\n")
            write_proc_file("/proc/self/gid_map", f"0 {gid} 1\n")

    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              preexec_fn=as_root, check=False)
    except (OSError, subprocess.SubprocessError) as error:
        raise ImageError(f"can't run {argv[0]}: {error}") from None
    if done.returncode != 0:
        lines = [line.strip() for line in done.stdout.decode(errors="replace").splitlines() if line.strip()]
        reason = lines[-1] if lines else f"exited with status {done.returncode}"
        raise ImageError(f"while creating the ext3 filesystem: {os.path.basename(argv[0])}: {reason}")


def _publish(scratch: str, path: str) -> None:
    """The new file appears whole, and never replaces one made meanwhile (link fails on an existing name)."""
    try:
        os.link(scratch, path)
    except FileExistsError:
        raise ImageError(f"{path} was created meanwhile: not overwriting it") from None
    except OSError as error:
        if error.errno not in (1, 95):  # EPERM, EOPNOTSUPP: no hard links on this filesystem
            raise ImageError(f"can't create {path}: {error.strerror}") from None
        if os.path.lexists(path):
            raise ImageError(f"{path} was created meanwhile: not overwriting it") from None
        try:
            os.rename(scratch, path)
        except OSError as rename_error:
            raise ImageError(f"can't create {path}: {rename_error.strerror}") from None


def _append_to_sif(path: str, ext3: str) -> None:
    """As Apptainer: the primary partition's architecture, or the host's if it has none known."""
    try:
        arch = sif.read_sif(path).primary_partition().arch
    except SifError:
        arch = "unknown"
    sifwrite.append_partition(path, sifwrite.SifObject(sif.DATA_PARTITION, path=ext3, fstype=sif.FS_EXT3,
                                                       parttype=sif.PART_OVERLAY,
                                                       arch=host_arch() if arch == "unknown" else arch))
