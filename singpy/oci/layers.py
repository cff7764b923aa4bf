"""Image layers applied to a directory tree, safely: each kind of tar entry, its data and its metadata.

A layer is a tar archive (read through singpy.oci.streams) of changes to the
layers below it ([1] OCI image-spec layer.md): files, directories, links,
device nodes, FIFOs, and whiteouts (singpy.oci.whiteouts). A layer is
untrusted input, so:

* an entry's name is cleaned as a path (`../../etc/x` and `/etc/x` are
  `etc/x`), and its parent directories are resolved inside the root, links
  followed as a process inside would follow them, on descriptors
  (singpy.oci.layertree);
* the last component is never followed: what is there is removed and
  replaced (a link `etc -> /host/dir` followed by `etc/passwd` writes the
  image's /host/dir/passwd, a file over a directory replaces the directory);
* a hard link names an earlier entry inside the root, and links that entry
  itself, even a symbolic link; one to nothing in the image is an error, as
  in umoci ([2] oci/layer/tar_extract.go) and Docker;
* a file takes the disk its data takes: a GNU sparse member's holes, and
  whole chunks of zeros (a compressed layer's cheapest bomb), stay holes;
* nothing the layer creates is ever opened but its own new regular files:
  FIFOs are made with mkfifo and devices with mknod, never read;
* every failure is one ImageError naming the layer (`source`), bounded in
  time and memory whatever the input: a corrupt or truncated stream, a PAX
  header that claims gigabytes, millions of entries.

As root (`ownership` None) owners, modes, set-id bits, device nodes and
file capabilities (PAX SCHILY.xattr.*, but for an SELinux label or an
NFSv4 ACL, the host's own) are applied for real. As a user, files stay the
user's and readable/writable by them (u+rw, directories u+rwx), device
nodes are not made, and the image's real modes, owners and devices are
recorded in an `Ownership` (singpy.oci.owners), for mksquashfs.

Modification times are kept: files' as they are made, directories' once the
layer is done (children change them), and a directory of a lower layer that
the layer changed gets its time back, as umoci does.

[1] https://github.com/opencontainers/image-spec/blob/main/layer.md
[2] https://github.com/opencontainers/umoci
"""

from __future__ import annotations

import contextlib
import os
import stat
import tarfile

from singpy.errors import ImageError, PathError
from singpy.host.hostfiles import write_all
from singpy.oci import whiteouts
from singpy.oci.layertree import MAX_CACHED, OPEN_DIR, EntryError, LayerTree, clean, join, shown, sparse_regions
from singpy.oci.owners import Ownership
from singpy.oci.readahead import ReadAhead
from singpy.oci.streams import CHUNK, BoundedTarInfo, Readable, drain, reason

_TAR_BUFFER = 1 << 16  # tarfile's read size; larger only costs a copy of the rest on every header
_MAX_NAME = 4096  # PATH_MAX: a longer entry name is no path mksquashfs or a process could use
_MAX_ID = (1 << 32) - 2  # (uid_t)-1 means "unchanged" to chown(2)
_ZEROS = bytes(CHUNK)  # a chunk of a file's data that is all zeros is left a hole
# the host's own attributes, never an image's: an SELinux label and an NFSv4 ACL (umoci's specialXattrs,
# oci/layer/xattr.go, forbids the same two)
_HOST_XATTRS = frozenset(("security.selinux", "system.nfs4_acl"))
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def apply_layer(root: str, stream: Readable, *, ownership: Ownership | None, source: str) -> None:
    """Apply the layer tar archive `stream` (see open_layer) to the tree at `root`, a directory singpy made.

    `ownership` None: as root, owners, modes and device nodes for real.
    Otherwise they are recorded there, and the tree stays the user's.
    `source` names the layer in errors ("layer sha256:... of docker://x").
    """
    if ownership is not None:
        ownership.tree = root
    layer = _Layer(root, ownership, source)
    try:
        try:
            # the stream is inflated and hashed on a thread while this one writes (singpy.oci.readahead)
            with ReadAhead(stream) as ahead, tarfile.open(  # type: ignore[call-overload]
                    fileobj=ahead, mode="r|", bufsize=_TAR_BUFFER, tarinfo=BoundedTarInfo) as archive:
                for member in archive:
                    archive.members.clear()  # a stream's members are kept in a list nobody here reads
                    layer.apply(member, archive)
                drain(ahead)
        except (tarfile.TarError, ValueError, OverflowError, EOFError, RecursionError) as error:
            # tarfile's own errors, and what its parsing lets through on hostile headers: a bad number in a
            # GNU sparse map (ValueError), a chain of hundreds of extended headers (read recursively)
            raise ImageError(f"can't extract {source}: it is not a valid tar archive ({reason(error)})") from None
        except OSError as error:  # reading the layer itself (the entries' own errors are ImageErrors already)
            raise ImageError(f"can't read {source}: {error.strerror or reason(error)}") from None
        layer.finish()
    finally:
        layer.close()



def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _mtime_ns(member: tarfile.TarInfo) -> int | None:
    try:
        value = int(member.mtime * 1_000_000_000) if isinstance(member.mtime, float) else member.mtime * 10**9
    except (ValueError, OverflowError):  # NaN or infinity in a PAX header
        return None
    return value if -(1 << 62) < value < (1 << 62) else None


class _Layer(LayerTree):
    """One layer's entries applied to its tree: each kind of entry, its data and its metadata."""

    # -- the entry -------------------------------------------------------------------------------------

    def apply(self, member: tarfile.TarInfo, archive: tarfile.TarFile) -> None:
        if self.stale or len(self.cache) > MAX_CACHED:
            self.drop_cache(keep=None if self.stale else self.last)
        try:
            self._apply(member, archive)
        except EntryError as error:
            raise ImageError(f"can't extract {self.source}: {shown(member.name)}: {error}") from None
        except OSError as error:
            why = error.strerror or reason(error)
            raise ImageError(f"can't extract {self.source}: {shown(member.name)}: {why}") from None
        except PathError as error:
            raise ImageError(f"can't extract {self.source}: {shown(member.name)}: {error.message}") from None
        except (ValueError, OverflowError) as error:  # a NUL byte in a name, a number out of range
            raise ImageError(f"can't extract {self.source}: {shown(member.name)}: {reason(error)}") from None

    def _apply(self, member: tarfile.TarInfo, archive: tarfile.TarFile) -> None:
        if len(member.name) > _MAX_NAME or len(member.linkname) > _MAX_NAME:
            raise EntryError("the name is too long")
        parts = clean(member.name)
        if not parts:
            self._skip_data(member, archive)
            if not member.isdir():
                raise EntryError("the root directory can't be replaced by another kind of file")
            self._root_dir(member)
            return
        name = parts[-1]
        if name.startswith(whiteouts.WHITEOUT):
            self._skip_data(member, archive)
            whiteouts.whiteout(self, parts[:-1], name)
            return
        if not (member.isreg() or member.isdir() or member.issym() or member.islnk() or member.ischr()
                or member.isblk() or member.isfifo()):
            raise EntryError(f"unknown entry type {member.type!r}")
        self._check_ids(member)
        found = self.directory(parts[:-1], create=True)
        assert found is not None
        parent, directory = found
        self.touch(parent, directory)
        path = join(directory, name)
        if member.islnk():
            self._hard_link(member, parent, name, path)
        elif member.isreg():
            self._file(member, archive, parent, name, path)
        elif member.isdir():
            self._dir(member, parent, name, path)
        elif member.issym():
            self._symlink(member, parent, name, path)
        elif member.isfifo():
            self._fifo(member, parent, name, path)
        else:
            self._device(member, parent, name, path)
        self.mark_written(path)

    def _check_ids(self, member: tarfile.TarInfo) -> None:
        for what, value in (("uid", member.uid), ("gid", member.gid)):
            if not 0 <= value <= _MAX_ID:
                raise EntryError(f"{what} {value} is out of range")

    # -- kinds of entries -----------------------------------------------------------------------------

    def _file(self, member: tarfile.TarInfo, archive: tarfile.TarFile, parent: int, name: str, path: str) -> None:
        try:
            fd = os.open(name, _NEW_FILE, 0o600, dir_fd=parent)
        except FileExistsError:
            self.clear(parent, name, path)
            fd = os.open(name, _NEW_FILE, 0o600, dir_fd=parent)
        try:
            self._copy(member, archive, fd)
            self._owner(member, fd=fd)
            os.fchmod(fd, self._disk_mode(member.mode, 0o600))
            if self.ownership is None:
                self._xattrs(member, fd)
            mtime = _mtime_ns(member)
            if mtime is not None:
                os.utime(fd, ns=(mtime, mtime))
        finally:
            os.close(fd)
        self._record(path, member)

    def _dir(self, member: tarfile.TarInfo, parent: int, name: str, path: str) -> None:
        try:
            os.mkdir(name, 0o700, dir_fd=parent)
        except FileExistsError:
            if not stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                self.clear(parent, name, path)
                os.mkdir(name, 0o700, dir_fd=parent)
        fd = os.open(name, OPEN_DIR, dir_fd=parent)
        try:
            self._owner(member, fd=fd)
            os.fchmod(fd, self._disk_mode(member.mode, 0o700))
            if self.ownership is None:
                self._xattrs(member, fd)
        finally:
            os.close(fd)
        mtime = _mtime_ns(member)
        if mtime is not None:
            self.dir_times[path] = mtime
        self._record(path, member)

    def _root_dir(self, member: tarfile.TarInfo) -> None:
        self._check_ids(member)
        self._owner(member, fd=self.root_fd)
        os.fchmod(self.root_fd, self._disk_mode(member.mode, 0o700))
        mtime = _mtime_ns(member)
        if mtime is not None:
            self.dir_times["/"] = mtime
        if self.ownership is not None:
            self.ownership.record("/", member.mode, member.uid, member.gid)

    def _symlink(self, member: tarfile.TarInfo, parent: int, name: str, path: str) -> None:
        try:
            os.symlink(member.linkname, name, dir_fd=parent)
        except FileExistsError:
            self.clear(parent, name, path)
            os.symlink(member.linkname, name, dir_fd=parent)
        self._owner(member, parent=parent, name=name)
        self._set_mtime(member, parent, name)
        if self.ownership is not None:
            self.ownership.record(path, 0o777, member.uid, member.gid)

    def _fifo(self, member: tarfile.TarInfo, parent: int, name: str, path: str) -> None:
        try:
            os.mkfifo(name, 0o600, dir_fd=parent)
        except FileExistsError:
            self.clear(parent, name, path)
            os.mkfifo(name, 0o600, dir_fd=parent)
        self._owner(member, parent=parent, name=name)
        os.chmod(name, self._disk_mode(member.mode, 0o600), dir_fd=parent)  # a FIFO made just now: no link
        self._set_mtime(member, parent, name)
        self._record(path, member)

    def _device(self, member: tarfile.TarInfo, parent: int, name: str, path: str) -> None:
        if not (0 <= member.devmajor <= 0xFFF and 0 <= member.devminor <= 0xFFFFF):
            raise EntryError(f"device number {member.devmajor},{member.devminor} is out of range")
        kind = stat.S_IFCHR if member.ischr() else stat.S_IFBLK
        if self.ownership is not None:  # mknod needs privilege: the node exists in the squashfs only
            try:
                os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                pass
            else:
                self.clear(parent, name, path)
            mtime = _mtime_ns(member)
            self.ownership.device(path, "c" if member.ischr() else "b", member.mode, member.uid, member.gid,
                                  member.devmajor, member.devminor, (mtime or 0) // 1_000_000_000)
            return
        number = os.makedev(member.devmajor, member.devminor)
        try:
            os.mknod(name, kind | 0o600, number, dir_fd=parent)
        except FileExistsError:
            self.clear(parent, name, path)
            os.mknod(name, kind | 0o600, number, dir_fd=parent)
        self._owner(member, parent=parent, name=name)
        os.chmod(name, member.mode & 0o7777, dir_fd=parent)  # a node made just now: no link
        self._set_mtime(member, parent, name)

    def _hard_link(self, member: tarfile.TarInfo, parent: int, name: str, path: str) -> None:
        target_parts = clean(member.linkname)
        if not target_parts:
            raise EntryError("a hard link to the root directory")
        found = self.directory(target_parts[:-1], create=False)
        target = join(found[1], target_parts[-1]) if found is not None else "/" + "/".join(target_parts)
        if target == path:
            return  # a link to itself: nothing to do
        if found is not None:
            try:
                os.stat(target_parts[-1], dir_fd=found[0], follow_symlinks=False)
            except FileNotFoundError:
                found = None
        recorded = self.ownership.get(target) if self.ownership is not None else None
        if found is None and not (recorded is not None and recorded[0] in "cb"):
            raise EntryError(f"a hard link to {shown(target)}, which is not in the image (an earlier entry)")
        try:
            os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            pass
        else:
            self.clear(parent, name, path)
        if found is None:  # a device node of the record only: another node with the same numbers
            assert self.ownership is not None
            self.ownership.copy(target, path)
            return
        try:
            os.link(target_parts[-1], name, src_dir_fd=found[0], dst_dir_fd=parent, follow_symlinks=False)
        except PermissionError:
            raise EntryError(f"a hard link to {shown(target)}, which can't be linked (a directory?)") from None
        except FileNotFoundError:
            raise EntryError(f"a hard link to {shown(target)}, which is not in the image") from None
        if self.ownership is not None:
            self.ownership.copy(target, path)

    # -- metadata -------------------------------------------------------------------------------------

    def _disk_mode(self, mode: int, private: int) -> int:
        """The mode on disk: the image's as root; as a user, no set-id bits and `private` added, so that
        the user can go on reading, writing and entering (the image's own mode is recorded)."""
        return mode & 0o7777 if self.ownership is None else (mode & 0o777) | private

    def _owner(self, member: tarfile.TarInfo, *, fd: int | None = None, parent: int = -1, name: str = "") -> None:
        """The entry's uid and gid as root (numbers: the archive's names are ignored, as the image's own
        /etc/passwd is what names them)."""
        if self.ownership is not None:
            return
        if fd is not None:
            os.fchown(fd, member.uid, member.gid)
        else:
            os.chown(name, member.uid, member.gid, dir_fd=parent, follow_symlinks=False)

    def _record(self, path: str, member: tarfile.TarInfo) -> None:
        if self.ownership is not None:
            self.ownership.record(path, member.mode, member.uid, member.gid)

    def _xattrs(self, member: tarfile.TarInfo, fd: int) -> None:
        """PAX SCHILY.xattr.* (file capabilities: security.capability), as root only, after the owner
        (chown clears capabilities), but the host's own (_HOST_XATTRS). A filesystem without them loses
        them, as with umoci."""
        for key, value in member.pax_headers.items():
            if key.startswith("SCHILY.xattr.") and key[len("SCHILY.xattr."):] not in _HOST_XATTRS:
                with contextlib.suppress(OSError):
                    os.setxattr(fd, key[len("SCHILY.xattr."):], value.encode("utf-8", "surrogateescape"))

    def _set_mtime(self, member: tarfile.TarInfo, parent: int, name: str) -> None:
        mtime = _mtime_ns(member)
        if mtime is not None:
            os.utime(name, ns=(mtime, mtime), dir_fd=parent, follow_symlinks=False)

    # -- data -----------------------------------------------------------------------------------------

    def _copy(self, member: tarfile.TarInfo, archive: tarfile.TarFile, fd: int) -> None:
        source: Readable = archive.fileobj  # type: ignore[assignment]
        if member.sparse is not None:  # GNU sparse: its data regions only, the holes left holes (as GNU tar)
            self._copy_sparse(member, source, fd)
            return
        left = member.size
        holes = False
        while left > 0:
            data = source.read(min(left, CHUNK))
            if not data:
                raise EntryError(f"the archive ends inside this file ({member.size - left} of {member.size} bytes)")
            left -= len(data)
            if len(data) == CHUNK and data == _ZEROS:  # a hole: a layer of compressed zeros takes no disk
                os.lseek(fd, CHUNK, os.SEEK_CUR)
                holes = True
            else:
                write_all(fd, data)
        if holes:
            os.ftruncate(fd, member.size)  # a hole at the end is there once the size is

    def _copy_sparse(self, member: tarfile.TarInfo, source: Readable, fd: int) -> None:
        """A sparse member's regions (stored one after another) written where its map says; then its size."""
        for offset, length in sparse_regions(member.sparse, member.size):  # type: ignore[arg-type]
            left = length
            while left > 0:
                data = source.read(min(left, CHUNK))
                if not data:
                    raise EntryError(f"the archive ends inside this file (a region at {offset})")
                _pwrite_all(fd, data, offset + length - left)
                left -= len(data)
        os.ftruncate(fd, member.size)

    def _skip_data(self, member: tarfile.TarInfo, archive: tarfile.TarFile) -> None:
        """Read past an entry's data here (tarfile would skip a truncated one block by block, at length)."""
        if not member.isreg() or member.size <= 0 or member.sparse is not None:
            return  # a sparse member's size is what it claims, not what it holds: tarfile skips what it holds
        source: Readable = archive.fileobj  # type: ignore[assignment]
        left = member.size
        while left > 0:
            data = source.read(min(left, CHUNK))
            if not data:
                raise EntryError("the archive ends inside this entry")
            left -= len(data)
