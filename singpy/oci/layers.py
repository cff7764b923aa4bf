"""Image layers applied to a directory tree, safely, and what an unprivileged user could not apply.

A layer is a tar archive (gzip- or zstd-compressed, or plain) of changes to
the layers below it ([1] OCI image-spec layer.md): files, directories,
links, device nodes, FIFOs, and whiteouts (`.wh.NAME` removes NAME of the
lower layers; `.wh..wh..opq` empties its directory of them). A layer is
untrusted input, so:

* an entry's name is cleaned as a path (`../../etc/x` and `/etc/x` are
  `etc/x`), and its parent directories are resolved inside the root, links
  followed as a process inside would follow them (RESOLVE_IN_ROOT: absolute
  targets start again at the root, `..` stops there), on descriptors, one
  component at a time (singpy.mounts.rootpath for the rare link on the way);
* the last component is never followed: what is there is removed and
  replaced (a link `etc -> /host/dir` followed by `etc/passwd` writes the
  image's /host/dir/passwd, a file over a directory replaces the directory);
* a hard link names an earlier entry inside the root, and links that entry
  itself, even a symbolic link; one to nothing in the image is an error, as
  in umoci ([2] oci/layer/tar_extract.go) and Docker;
* nothing the layer creates is ever opened but its own new regular files:
  FIFOs are made with mkfifo and devices with mknod, never read;
* every failure is one ImageError naming the layer (`source`), bounded in
  time and memory whatever the input: a corrupt or truncated stream, a PAX
  header that claims gigabytes, millions of entries.

As root (`ownership` None) owners, modes, set-id bits, device nodes and
file capabilities (PAX SCHILY.xattr.*) are applied for real. As a user,
files stay the user's and readable/writable by them (u+rw, directories
u+rwx), device nodes are not made, and the image's real modes, owners and
devices are recorded in an `Ownership`; `squash_options` hands them to
mksquashfs as pseudo definitions ([3] mksquashfs 4.5.1 -pf), so that the SIF
holds root-owned /usr, a uid-1000 home and /dev/null 1,3 as the image has
them. (Extended attributes are not recorded: mksquashfs 4.5.1 has no pseudo
definition for them.)

Modification times are kept: files' as they are made, directories' once the
layer is done (children change them), and a directory of a lower layer that
the layer changed gets its time back, as umoci does.

[1] https://github.com/opencontainers/image-spec/blob/main/layer.md
[2] https://github.com/opencontainers/umoci
[3] squashfs-tools 4.5.1 pseudo.c (read_pseudo_def) and mksquashfs.c (dir_scan2)
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import re
import stat
import tarfile
import zlib
from collections.abc import Iterator
from typing import Protocol

from singpy.errors import ImageError, PathError
from singpy.hostfiles import write_all
from singpy.image import trees

_CHUNK = 1 << 20  # bytes copied at once: a file of a layer is one read and one write when it fits
_TAR_BUFFER = 1 << 16  # tarfile's read size; larger only costs a copy of the rest on every header
_MAX_EXTENDED = 1 << 20  # a PAX or GNU long-name header larger than this is hostile (tarfile reads it whole)
_MAX_NAME = 4096  # PATH_MAX: a longer entry name is no path mksquashfs or a process could use
_MAX_LINE = 16000  # of a pseudo definition's name: mksquashfs 4.5.1 reads lines of up to 16383 bytes
_MAX_CACHED = 256  # directory descriptors kept between entries
_DRAIN = 1 << 20  # decompressed bytes read after the end of the archive (the gzip trailer's check)
_MAX_ID = (1 << 32) - 2  # (uid_t)-1 means "unchanged" to chown(2)
_DIR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_WHITEOUT = ".wh."
_OPAQUE = ".wh..wh..opq"
_GZIP = b"\x1f\x8b"
_ZSTD = b"\x28\xb5\x2f\xfd"
_DIGEST = re.compile(r"(sha256:[0-9a-f]{64}|sha512:[0-9a-f]{128})\Z")
_EXTENDED_TYPES = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME,
                   tarfile.GNUTYPE_LONGLINK)
_PLAIN = re.compile(rb"[A-Za-z0-9/._+,:=@%~^-]*\Z")  # bytes mksquashfs reads as they are in a pseudo file


class Readable(Protocol):
    """What a layer is read from: a file, a download, a decompressor."""

    def read(self, size: int = -1, /) -> bytes: ...


# ---------------------------------------------------------------------------------------------------------
# Streams


class VerifyingReader:
    """A stream whose bytes are hashed as they are read; at its end, a digest mismatch is an ImageError.

    The end is when `read` returns nothing, `finish()` is called, or the
    reader leaves a `with` block without an error (which reads what is left:
    a decompressor may stop before the end of its input). `size`, when
    given, bounds the stream: a byte more is an error at once.
    """

    def __init__(self, stream: Readable, digest: str, *, source: str | None = None, size: int | None = None) -> None:
        if not isinstance(digest, str) or not _DIGEST.match(digest):
            raise ImageError(f"unsupported digest {str(digest)[:80]!r} of {source or 'a blob'}")
        self.stream = stream
        self.digest = digest
        self.source = source or f"blob {digest}"
        self.size = size
        algorithm, self._expected = digest.split(":", 1)
        self._hash = hashlib.new(algorithm)
        self._count = 0
        self._done = False

    def read(self, size: int = -1, /) -> bytes:
        if self._done:
            return b""
        data = self.stream.read(size)
        if data:
            self._count += len(data)
            if self.size is not None and self._count > self.size:
                raise ImageError(f"{self.source} is larger than the {self.size} bytes its descriptor says")
            self._hash.update(data)
        elif size != 0:
            self._check()
        return data

    def finish(self) -> None:
        """Read what is left and check the digest (once)."""
        while not self._done:
            self.read(_CHUNK)

    def _check(self) -> None:
        self._done = True
        if self.size is not None and self._count != self.size:
            raise ImageError(f"{self.source} is truncated: {self._count} of {self.size} bytes")
        actual = self._hash.hexdigest()
        if actual != self._expected:
            algorithm = self.digest.split(":", 1)[0]
            raise ImageError(f"digest mismatch for {self.source}: its data has digest {algorithm}:{actual}")

    def close(self) -> None:
        close = getattr(self.stream, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> VerifyingReader:
        return self

    def __exit__(self, kind: object, *rest: object) -> None:
        try:
            if kind is None:
                self.finish()
        finally:
            self.close()


class _Prefixed:
    """`head` (already read to see what the stream is) followed by the rest of `stream`."""

    def __init__(self, head: bytes, stream: Readable) -> None:
        self.head = head
        self.stream = stream

    def read(self, size: int = -1, /) -> bytes:
        if not self.head:
            return self.stream.read(size)
        if size < 0:
            data, self.head = self.head + self.stream.read(), b""
            return data
        data, self.head = self.head[:size], self.head[size:]
        return data


class _Decompressed:
    """A decompressor's output; its errors become one ImageError naming the layer."""

    def __init__(self, reader: Readable, kind: str, source: str, errors: tuple[type[BaseException], ...]) -> None:
        self.reader = reader
        self.kind = kind
        self.source = source
        self.errors = errors

    def read(self, size: int = -1, /) -> bytes:
        try:
            return self.reader.read(size)
        except ImageError:
            raise
        except self.errors as error:
            raise ImageError(f"can't extract {self.source}: its {self.kind} data is corrupt or truncated "
                             f"({_reason(error)})") from None


def open_layer(stream: Readable, *, source: str = "the layer") -> Readable:
    """The tar archive in layer `stream`, decompressed as its first bytes say: gzip, zstd, or none."""
    head = b""
    while len(head) < tarfile.BLOCKSIZE:
        try:
            data = stream.read(tarfile.BLOCKSIZE - len(head))
        except OSError as error:
            raise ImageError(f"can't read {source}: {error.strerror or _reason(error)}") from None
        if not data:
            break
        head += data
    joined = _Prefixed(head, stream)
    if head.startswith(_GZIP):
        return _Decompressed(gzip.GzipFile(fileobj=joined, mode="rb"),  # type: ignore[call-overload]
                             "gzip", source, (OSError, EOFError, zlib.error))
    if head.startswith(_ZSTD):
        import zstandard

        reader = zstandard.ZstdDecompressor().stream_reader(joined, read_size=1 << 17,  # type: ignore[arg-type]
                                                            read_across_frames=True, closefd=False)
        return _Decompressed(reader, "zstd", source, (zstandard.ZstdError, OSError))
    if _is_tar(head):
        return joined
    if not head:
        raise ImageError(f"can't extract {source}: it is empty")
    raise ImageError(f"can't extract {source}: it is not a tar archive, gzip- or zstd-compressed "
                     f"(it starts with bytes {head[:8].hex()})")


def _is_tar(head: bytes) -> bool:
    if len(head) < tarfile.BLOCKSIZE:
        return False
    if head == bytes(tarfile.BLOCKSIZE):  # an empty archive: the end marker only
        return True
    try:
        tarfile.TarInfo.frombuf(head, "utf-8", "surrogateescape")  # checks the header's checksum
    except tarfile.HeaderError:
        return False
    return True


def _reason(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text if len(text) < 200 else text[:200] + "..."


class _BoundedTarInfo(tarfile.TarInfo):
    """tarfile reads a PAX or GNU long-name header's data whole into memory: a hostile one that claims
    terabytes must be refused before that."""

    __slots__ = ()

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _EXTENDED_TYPES and self.size > _MAX_EXTENDED:
            raise tarfile.HeaderError(f"an extended header of {self.size} bytes")
        if self.type == tarfile.XGLTYPE:  # global headers add up, for the rest of the archive
            held = sum(len(key) + len(value) for key, value in tarfile_.pax_headers.items())
            if held + self.size > _MAX_EXTENDED:
                raise tarfile.HeaderError("global extended headers of over 1 MiB")
        return super()._proc_member(tarfile_)  # type: ignore[misc, no-any-return]


# ---------------------------------------------------------------------------------------------------------
# What an unprivileged extraction records

# One recorded entry: (type, mode, uid, gid, major, minor, mtime); type is "m" (a file on disk whose mode
# and owner are the image's) or "c"/"b" (a device node that exists only here).
_Entry = tuple[str, int, int, int, int, int, int]


class Ownership:
    """The modes, owners and device nodes of the image, where the tree on disk (a user's) can't hold them.

    Keyed by guest path, links resolved ("/usr/bin/su", never "/bin/su" when
    /bin is a link), as mksquashfs sees the tree. `pseudo_definitions` gives
    them as mksquashfs pseudo definitions; the root directory itself goes to
    `-root-uid/-root-gid/-root-mode` (mksquashfs ignores a pseudo definition
    of "/" when it has a source directory).
    """

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._children: dict[str, set[str]] = {}  # directory -> names below it that have an entry
        self.root: tuple[int, int, int] = (0o755, 0, 0)  # mode, uid, gid of "/"
        self.tree: str | None = None  # the directory the layers were applied to (set by apply_layer)
        self.unrecordable: list[str] = []  # paths no pseudo definition can name (set by pseudo_definitions)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, path: object) -> bool:
        return path in self._entries

    def record(self, path: str, mode: int, uid: int = 0, gid: int = 0) -> None:
        """Guest path `path` (links resolved) is a file on disk whose mode and owner are `mode`, `uid`, `gid`."""
        if path == "/":
            self.root = (mode & 0o7777, uid, gid)
            return
        self._set(path, ("m", mode & 0o7777, uid, gid, 0, 0, 0))

    def device(self, path: str, kind: str, mode: int, uid: int, gid: int, major: int, minor: int,
               mtime: int) -> None:
        """A device node the tree on disk does not have; `kind` "c" or "b"."""
        self._set(path, (kind, mode & 0o7777, uid, gid, major, minor, mtime))

    def get(self, path: str) -> _Entry | None:
        if path == "/":
            return ("m", *self.root, 0, 0, 0)
        return self._entries.get(path)

    def copy(self, source: str, path: str) -> None:
        """`path` is a hard link to `source`: the same inode, so the same mode and owner."""
        entry = self._entries.get(source)
        if entry is not None:
            self._set(path, entry)

    def children(self, path: str) -> set[str]:
        """The names in directory `path` that have an entry, or entries below them."""
        return set(self._children.get(path, ()))

    def forget(self, path: str) -> None:
        """`path` and everything below it are gone."""
        parent, _, name = path.rpartition("/")
        names = self._children.get(parent or "/")
        if names is not None:
            names.discard(name)
        stack = [path]
        while stack:
            current = stack.pop()
            self._entries.pop(current, None)
            below = self._children.pop(current, None)
            if below:
                stack.extend(f"{current}/{name}" for name in below)

    def _set(self, path: str, entry: _Entry) -> None:
        self._entries[path] = entry
        while path != "/":  # every ancestor is listed in its parent: `forget` finds all below a path
            parent, _, name = path.rpartition("/")
            names = self._children.setdefault(parent or "/", set())
            if name in names:
                return
            names.add(name)
            path = parent or "/"

    def pseudo_definitions(self) -> Iterator[str]:
        """mksquashfs 4.5.1 pseudo definitions, one per line: "PATH m MODE UID GID" for a file on disk,
        "PATH C MTIME MODE UID GID MAJOR MINOR" (or B) for a device node.

        mksquashfs reads a pseudo file line by line, a name up to the first
        unescaped white space, a backslash taking the next byte as it is; a
        line that ends with a backslash goes on on the next line. So every
        byte but letters, digits and a few signs is escaped, and a name with
        a newline can't be written at all: such paths go to `unrecordable`
        (their files keep the builder's owner in the squashfs).
        """
        self.unrecordable = []
        for path, (kind, mode, uid, gid, major, minor, mtime) in self._entries.items():
            name = _pseudo_name(path)
            if name is None:
                self.unrecordable.append(path)
                continue
            if kind == "m":
                yield f"{name} m {mode:o} {uid} {gid}"
            else:
                yield f"{name} {kind.upper()} {min(max(mtime, 0), (1 << 32) - 1)} {mode:o} {uid} {gid} {major} {minor}"

    def complete(self) -> None:
        """Files added to the tree after its layers (Apptainer's /.singularity.d) are root's, as every
        file singpy adds to an image is: record those that have no entry, with their mode on disk."""
        if self.tree is None:
            return
        try:  # by descriptors: a path of the tree may be longer than PATH_MAX
            for where, name, info in trees.walk(self.tree):
                guest = f"/{where}/{name}" if where else f"/{name}"
                known = self._entries.get(guest)
                if known is None or known[0] != "m":  # new, or where a device node was recorded
                    self.record(guest, 0o777 if stat.S_ISLNK(info.st_mode) else info.st_mode)
        except OSError as error:
            raise ImageError(f"can't read {self.tree}: {error.strerror}") from None


def _pseudo_name(path: str) -> str | None:
    """`path` as a pseudo file names it, or None if it can't (a newline; over mksquashfs's 16383-byte lines)."""
    raw = os.fsencode(path)
    if b"\n" in raw:
        return None
    if not _PLAIN.match(raw):
        raw = b"".join(bytes((byte,)) if _PLAIN.match(bytes((byte,))) else b"\\" + bytes((byte,)) for byte in raw)
    return os.fsdecode(raw) if len(raw) < _MAX_LINE else None


def squash_options(ownership: Ownership | None, pseudo_file: str) -> list[str]:
    """The mksquashfs options that give the squashfs the image's modes, owners and device nodes.

    None (extracted as root: the tree holds them) needs none. Otherwise the
    pseudo definitions are written to `pseudo_file` (created) and the root
    directory's mode and owner given as options. Not `-all-root`, nor
    `-force-uid`: those override every pseudo definition in mksquashfs.
    Files of the tree that nothing recorded (added after the layers) are
    recorded as root's first (`Ownership.complete`).
    """
    if ownership is None:
        return []
    from singpy import console

    ownership.complete()
    try:
        with open(pseudo_file, "wb") as out:
            out.write(b"".join(os.fsencode(line) + b"\n" for line in ownership.pseudo_definitions()))
    except OSError as error:
        raise ImageError(f"can't write {pseudo_file}: {error.strerror}") from None
    if ownership.unrecordable:
        console.warning(f"{len(ownership.unrecordable)} file(s) keep your owner in the image: mksquashfs "
                        f"can't name them (a newline in the name, or too long a path: "
                        f"{_shown(ownership.unrecordable[0])})")
    mode, uid, gid = ownership.root
    return ["-pf", pseudo_file, "-root-mode", f"{mode:o}", "-root-uid", str(uid), "-root-gid", str(gid)]


# ---------------------------------------------------------------------------------------------------------
# Applying a layer


class _EntryError(Exception):
    """One entry can't be applied: the message says why (the entry's name is added by the caller)."""


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
            with tarfile.open(fileobj=stream, mode="r|", bufsize=_TAR_BUFFER,  # type: ignore[call-overload]
                              tarinfo=_BoundedTarInfo) as archive:
                for member in archive:
                    archive.members.clear()  # a stream's members are kept in a list nobody here reads
                    layer.apply(member, archive)
            _drain(stream)
        except (tarfile.TarError, ValueError, OverflowError, EOFError, RecursionError) as error:
            # tarfile's own errors, and what its parsing lets through on hostile headers: a bad number in a
            # GNU sparse map (ValueError), a chain of hundreds of extended headers (read recursively)
            raise ImageError(f"can't extract {source}: it is not a valid tar archive ({_reason(error)})") from None
        except OSError as error:  # reading the layer itself (the entries' own errors are ImageErrors already)
            raise ImageError(f"can't read {source}: {error.strerror or _reason(error)}") from None
        layer.finish()
    finally:
        layer.close()


def _drain(stream: Readable) -> None:
    """Read a little past the archive's end marker: a gzip stream's checksum is at its very end."""
    left = _DRAIN
    while left > 0:
        data = stream.read(min(left, _CHUNK))
        if not data:
            return
        left -= len(data)


def _clean(name: str) -> list[str]:
    """The components of `name` as a path below the root: '.' and '' dropped, '..' climbing no higher."""
    parts: list[str] = []
    for part in name.split("/"):
        if part == "..":
            if parts:
                parts.pop()
        elif part and part != ".":
            parts.append(part)
    return parts


def _join(directory: str, name: str) -> str:
    return f"/{name}" if directory == "/" else f"{directory}/{name}"


def _parent(path: str) -> str:
    return path.rpartition("/")[0] or "/"


def _shown(name: str) -> str:
    text = name if len(name) <= 200 else name[:200] + "..."
    return text if text.isprintable() else repr(text)


def _mtime_ns(member: tarfile.TarInfo) -> int | None:
    try:
        value = int(member.mtime * 1_000_000_000) if isinstance(member.mtime, float) else member.mtime * 10**9
    except (ValueError, OverflowError):  # NaN or infinity in a PAX header
        return None
    return value if -(1 << 62) < value < (1 << 62) else None


class _Layer:
    """The state of one layer's application: the root, the directory cache, what this layer wrote."""

    def __init__(self, root: str, ownership: Ownership | None, source: str) -> None:
        self.root = root
        self.ownership = ownership
        self.source = source
        try:
            self.root_fd = os.open(root, _OPEN_DIR)
        except OSError as error:
            raise ImageError(f"can't extract {source}: can't open {root}: {error.strerror}") from None
        # Entry path as named in the archive ("usr/lib") -> (descriptor, resolved guest path). Dropped
        # whole at the next entry once a directory or a link was removed (`stale`): a path may have
        # led through it.
        self.cache: dict[str, tuple[int, str]] = {}
        self.stale = False
        self.last: str | None = None  # the key of the last directory found: the next entry's is often below it
        self.written: set[str] = set()  # guest paths of this layer's entries
        self.kept: set[str] = {"/"}  # and their ancestors: a whiteout hides only lower layers
        self.dir_times: dict[str, int] = {}  # directories of this layer: their mtime, set at the end
        self.old_times: dict[str, int] = {}  # lower directories this layer changed: their mtime before

    def close(self) -> None:
        self._drop_cache()
        os.close(self.root_fd)

    # -- the entry -------------------------------------------------------------------------------------

    def apply(self, member: tarfile.TarInfo, archive: tarfile.TarFile) -> None:
        if self.stale or len(self.cache) > _MAX_CACHED:
            self._drop_cache(keep=None if self.stale else self.last)
        try:
            self._apply(member, archive)
        except _EntryError as error:
            raise ImageError(f"can't extract {self.source}: {_shown(member.name)}: {error}") from None
        except OSError as error:
            reason = error.strerror or _reason(error)
            raise ImageError(f"can't extract {self.source}: {_shown(member.name)}: {reason}") from None
        except PathError as error:
            raise ImageError(f"can't extract {self.source}: {_shown(member.name)}: {error.message}") from None
        except (ValueError, OverflowError) as error:  # a NUL byte in a name, a number out of range
            raise ImageError(f"can't extract {self.source}: {_shown(member.name)}: {_reason(error)}") from None

    def _apply(self, member: tarfile.TarInfo, archive: tarfile.TarFile) -> None:
        if len(member.name) > _MAX_NAME or len(member.linkname) > _MAX_NAME:
            raise _EntryError("the name is too long")
        parts = _clean(member.name)
        if not parts:
            self._skip_data(member, archive)
            if not member.isdir():
                raise _EntryError("the root directory can't be replaced by another kind of file")
            self._root_dir(member)
            return
        name = parts[-1]
        if name.startswith(_WHITEOUT):
            self._skip_data(member, archive)
            self._whiteout(parts[:-1], name)
            return
        if not (member.isreg() or member.isdir() or member.issym() or member.islnk() or member.ischr()
                or member.isblk() or member.isfifo()):
            raise _EntryError(f"unknown entry type {member.type!r}")
        self._check_ids(member)
        found = self._directory(parts[:-1], create=True)
        assert found is not None
        parent, directory = found
        self._touch(parent, directory)
        path = _join(directory, name)
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
        self._written(path)

    def _check_ids(self, member: tarfile.TarInfo) -> None:
        for what, value in (("uid", member.uid), ("gid", member.gid)):
            if not 0 <= value <= _MAX_ID:
                raise _EntryError(f"{what} {value} is out of range")

    def _written(self, path: str) -> None:
        self.written.add(path)
        parent = _parent(path)
        while parent not in self.kept:
            self.kept.add(parent)
            parent = _parent(parent)

    def _touch(self, fd: int, directory: str) -> None:
        """`directory` is about to change: remember its mtime, to give it back at the end of the layer."""
        if directory not in self.old_times:
            self.old_times[directory] = os.stat(fd).st_mtime_ns

    # -- kinds of entries -----------------------------------------------------------------------------

    def _file(self, member: tarfile.TarInfo, archive: tarfile.TarFile, parent: int, name: str, path: str) -> None:
        try:
            fd = os.open(name, _NEW_FILE, 0o600, dir_fd=parent)
        except FileExistsError:
            self._clear(parent, name, path)
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
                self._clear(parent, name, path)
                os.mkdir(name, 0o700, dir_fd=parent)
        fd = os.open(name, _OPEN_DIR, dir_fd=parent)
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
            self._clear(parent, name, path)
            os.symlink(member.linkname, name, dir_fd=parent)
        self._owner(member, parent=parent, name=name)
        self._set_mtime(member, parent, name)
        if self.ownership is not None:
            self.ownership.record(path, 0o777, member.uid, member.gid)

    def _fifo(self, member: tarfile.TarInfo, parent: int, name: str, path: str) -> None:
        try:
            os.mkfifo(name, 0o600, dir_fd=parent)
        except FileExistsError:
            self._clear(parent, name, path)
            os.mkfifo(name, 0o600, dir_fd=parent)
        self._owner(member, parent=parent, name=name)
        os.chmod(name, self._disk_mode(member.mode, 0o600), dir_fd=parent)  # a FIFO made just now: no link
        self._set_mtime(member, parent, name)
        self._record(path, member)

    def _device(self, member: tarfile.TarInfo, parent: int, name: str, path: str) -> None:
        if not (0 <= member.devmajor <= 0xFFF and 0 <= member.devminor <= 0xFFFFF):
            raise _EntryError(f"device number {member.devmajor},{member.devminor} is out of range")
        kind = stat.S_IFCHR if member.ischr() else stat.S_IFBLK
        if self.ownership is not None:  # mknod needs privilege: the node exists in the squashfs only
            try:
                os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                pass
            else:
                self._clear(parent, name, path)
            mtime = _mtime_ns(member)
            self.ownership.device(path, "c" if member.ischr() else "b", member.mode, member.uid, member.gid,
                                  member.devmajor, member.devminor, (mtime or 0) // 1_000_000_000)
            return
        number = os.makedev(member.devmajor, member.devminor)
        try:
            os.mknod(name, kind | 0o600, number, dir_fd=parent)
        except FileExistsError:
            self._clear(parent, name, path)
            os.mknod(name, kind | 0o600, number, dir_fd=parent)
        self._owner(member, parent=parent, name=name)
        os.chmod(name, member.mode & 0o7777, dir_fd=parent)  # a node made just now: no link
        self._set_mtime(member, parent, name)

    def _hard_link(self, member: tarfile.TarInfo, parent: int, name: str, path: str) -> None:
        target_parts = _clean(member.linkname)
        if not target_parts:
            raise _EntryError("a hard link to the root directory")
        found = self._directory(target_parts[:-1], create=False)
        target = _join(found[1], target_parts[-1]) if found is not None else "/" + "/".join(target_parts)
        if target == path:
            return  # a link to itself: nothing to do
        if found is not None:
            try:
                os.stat(target_parts[-1], dir_fd=found[0], follow_symlinks=False)
            except FileNotFoundError:
                found = None
        recorded = self.ownership.get(target) if self.ownership is not None else None
        if found is None and not (recorded is not None and recorded[0] in "cb"):
            raise _EntryError(f"a hard link to {_shown(target)}, which is not in the image (an earlier entry)")
        try:
            os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            pass
        else:
            self._clear(parent, name, path)
        if found is None:  # a device node of the record only: another node with the same numbers
            assert self.ownership is not None
            self.ownership.copy(target, path)
            return
        try:
            os.link(target_parts[-1], name, src_dir_fd=found[0], dst_dir_fd=parent, follow_symlinks=False)
        except PermissionError:
            raise _EntryError(f"a hard link to {_shown(target)}, which can't be linked (a directory?)") from None
        except FileNotFoundError:
            raise _EntryError(f"a hard link to {_shown(target)}, which is not in the image") from None
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
        (chown clears capabilities). A filesystem without them loses them, as with umoci."""
        for key, value in member.pax_headers.items():
            if key.startswith("SCHILY.xattr."):
                with contextlib.suppress(OSError):
                    os.setxattr(fd, key[len("SCHILY.xattr."):], value.encode("utf-8", "surrogateescape"))

    def _set_mtime(self, member: tarfile.TarInfo, parent: int, name: str) -> None:
        mtime = _mtime_ns(member)
        if mtime is not None:
            os.utime(name, ns=(mtime, mtime), dir_fd=parent, follow_symlinks=False)

    # -- data -----------------------------------------------------------------------------------------

    def _copy(self, member: tarfile.TarInfo, archive: tarfile.TarFile, fd: int) -> None:
        source: Readable = archive.fileobj  # type: ignore[assignment]
        if member.sparse is not None:  # GNU sparse: tarfile knows where the holes are
            extracted = archive.extractfile(member)
            assert extracted is not None
            source = extracted
        left = member.size
        while left > 0:
            data = source.read(min(left, _CHUNK))
            if not data:
                raise _EntryError(f"the archive ends inside this file ({member.size - left} of {member.size} bytes)")
            left -= len(data)
            write_all(fd, data)

    def _skip_data(self, member: tarfile.TarInfo, archive: tarfile.TarFile) -> None:
        """Read past an entry's data here (tarfile would skip a truncated one block by block, at length)."""
        if not member.isreg() or member.size <= 0:
            return
        source: Readable = archive.fileobj  # type: ignore[assignment]
        left = member.size
        while left > 0:
            data = source.read(min(left, _CHUNK))
            if not data:
                raise _EntryError("the archive ends inside this entry")
            left -= len(data)

    # -- directories ----------------------------------------------------------------------------------

    def _directory(self, parts: list[str], *, create: bool, follow: bool = True) -> tuple[int, str] | None:
        """(descriptor, resolved guest path) of the directory `parts` leads to, inside the root.

        Missing directories are made when `create` (mode 0755, root's, as
        umoci and Docker make them), else None. Not a directory: an error.
        """
        if not parts:
            return self.root_fd, "/"
        key = "/".join(parts)
        hit = self.cache.get(key)
        if hit is not None:
            self.last = key
            return hit
        start = len(parts) - 1
        while start > 0:
            base = self.cache.get("/".join(parts[:start]))
            if base is not None:
                break
            start -= 1
        else:
            base = (self.root_fd, "/")
        fd, path = base
        spare = -1  # a descriptor of the walk not kept in the cache: a deep path holds two at most, not one a level
        try:
            for index in range(start, len(parts)):
                step = self._step(fd, path, parts[index], create=create, follow=follow)
                if spare != -1:
                    os.close(spare)
                    spare = -1
                if step is None:
                    return None
                fd, path = step
                if len(self.cache) < _MAX_CACHED or index == len(parts) - 1:  # the result is always kept
                    self.cache["/".join(parts[:index + 1])] = step
                else:
                    spare = fd
        finally:
            if spare != -1:
                os.close(spare)
        self.last = key
        return fd, path

    def _step(self, fd: int, path: str, name: str, *, create: bool, follow: bool) -> tuple[int, str] | None:
        here = _join(path, name)
        try:
            return os.open(name, _DIR, dir_fd=fd), here
        except FileNotFoundError:
            if not create:
                return None
            if self.ownership is not None and (self.ownership.get(here) or "m")[0] != "m":
                raise _EntryError(f"{_shown(here)} is a device node, not a directory") from None
            self._touch(fd, path)
            os.mkdir(name, 0o755, dir_fd=fd)
            os.chmod(name, 0o755, dir_fd=fd)  # whatever the umask: a directory made just now, no link
            if self.ownership is not None:
                self.ownership.record(here, 0o755)
            return os.open(name, _DIR, dir_fd=fd), here
        except NotADirectoryError:
            mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
            if not stat.S_ISLNK(mode):
                raise _EntryError(f"{_shown(here)} is not a directory") from None
            if not follow:
                return None
            return self._through_link(here, create=create)

    def _through_link(self, guest: str, *, create: bool) -> tuple[int, str] | None:
        """The directory link `guest` leads to, resolved inside the root (singpy.mounts.rootpath)."""
        from singpy.mounts.rootpath import Tree

        with Tree(self.root) as tree:
            found = tree.lookup(guest)
            if found.fd is None:
                if not create:
                    return None
                missing = found.missing
                tree.make(found, directory=True)
                if self.ownership is not None:
                    parts = found.path.split("/")
                    for count in range(len(missing), 0, -1):
                        self.ownership.record("/".join(parts[:len(parts) - count + 1]), 0o755)
            assert found.fd is not None
            if not stat.S_ISDIR(os.fstat(found.fd).st_mode):
                os.close(found.fd)
                raise _EntryError(f"{_shown(guest)} leads to {_shown(found.path)}, which is not a directory")
            return found.fd, found.path

    def _drop_cache(self, keep: str | None = None) -> None:
        """Close the cached descriptors, but `keep`'s: a deep tree's next entry starts there, not at the root."""
        kept = self.cache.pop(keep, None) if keep is not None else None
        for fd, _ in self.cache.values():
            os.close(fd)
        self.cache.clear()
        if kept is not None and keep is not None:
            self.cache[keep] = kept
        self.stale = False

    # -- removal --------------------------------------------------------------------------------------

    def _clear(self, parent: int, name: str, path: str) -> None:
        """Remove what is at `name` (never following it), for an entry of another kind or a whiteout."""
        mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
        if stat.S_ISDIR(mode):
            trees.remove_at(parent, name)  # iterative: a hostile layer's deep tree would exhaust the stack
            self.stale = True
        else:
            os.unlink(name, dir_fd=parent)
            if stat.S_ISLNK(mode):
                self.stale = True
        if self.ownership is not None:
            self.ownership.forget(path)

    def _whiteout(self, dirs: list[str], name: str) -> None:
        hidden = name[len(_WHITEOUT):]
        if name != _OPAQUE and (hidden in ("", ".", "..") or hidden.startswith(_WHITEOUT)):
            return  # not a whiteout of a name (".wh..wh.plnk": AUFS's own bookkeeping)
        try:
            found = self._directory(dirs, create=False)
        except _EntryError:  # a file where a directory would be: nothing is below it to remove
            return
        if found is None:
            return
        if name == _OPAQUE:
            self._prune(found[1])
            return
        parent, directory = found
        path = _join(directory, hidden)
        mode = _mode_at(parent, hidden)
        if path in self.written or path in self.kept:  # this layer's own: only what is below it from lower
            if mode is not None and stat.S_ISDIR(mode):
                self._prune(path)
            return
        if mode is not None:
            self._touch(parent, directory)
            self._clear(parent, hidden, path)
        if self.ownership is not None:
            self.ownership.forget(path)

    def _prune(self, top: str) -> None:
        """Remove everything below directory `top` that this layer did not write (an opaque whiteout)."""
        pending = [top]
        while pending:
            directory = pending.pop()
            if len(self.cache) > _MAX_CACHED:  # no descriptor of an earlier round is used again
                self._drop_cache()
            found = self._directory(_clean(directory), create=False, follow=False)
            if found is None:
                continue
            fd = found[0]
            listing = os.open(".", _OPEN_DIR, dir_fd=fd)
            try:
                names = set(os.listdir(listing))
            finally:
                os.close(listing)
            if self.ownership is not None:
                names |= self.ownership.children(directory)
            for name in names:
                path = _join(directory, name)
                mode = _mode_at(fd, name)
                if path in self.written or path in self.kept:
                    if mode is not None and stat.S_ISDIR(mode):
                        pending.append(path)
                    continue
                if mode is not None:
                    self._touch(fd, directory)
                    self._clear(fd, name, path)
                elif self.ownership is not None:
                    self.ownership.forget(path)

    # -- the end --------------------------------------------------------------------------------------

    def finish(self) -> None:
        """Directories' mtimes: this layer's as the archive says, lower ones' as they were before."""
        self._drop_cache()
        for path, mtime in {**self.old_times, **self.dir_times}.items():
            if len(self.cache) > _MAX_CACHED:
                self._drop_cache(keep=self.last)
            try:
                if path == "/":
                    os.utime(self.root_fd, ns=(mtime, mtime))
                    continue
                parts = path.split("/")[1:]
                found = self._directory(parts[:-1], create=False, follow=False)
                if found is not None:
                    os.utime(parts[-1], ns=(mtime, mtime), dir_fd=found[0], follow_symlinks=False)
            except (OSError, _EntryError, OverflowError):
                continue  # removed since, or no longer a directory: its time does not matter
        self._drop_cache()


def _mode_at(directory: int, name: str) -> int | None:
    """The st_mode of `name` in the open `directory` (links not followed), None when there is none."""
    try:
        return os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None
