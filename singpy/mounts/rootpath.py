"""Paths inside an image, resolved as a process inside would see them: the one door.

Everything singpy reads, creates or mounts on inside an image goes through a
`Tree`: the identity merge, the mount points, the image checks before a
launch, `inspect` and `build`. An image is untrusted input, and a symlink in
it may point anywhere: `/dev -> /etc`, `/etc/group -> /dev/zero`,
`runscript -> /etc/shadow`. Resolved by the kernel from the staging root or
from the host, such links lead to host files. So:

* the walk is done here, one component at a time, on O_PATH | O_NOFOLLOW
  descriptors, each opened relative to the previous one; a link is read with
  readlinkat() on its own descriptor, so what is followed is what was opened;
* the semantics are those of openat2(2) RESOLVE_IN_ROOT, i.e. of a process
  inside: an absolute link target starts again from the root and `..` never
  climbs above it ([1] man 2 openat2);
* the result is a descriptor, and what is done next is done on it
  (`fstat`, a read through /proc/self/fd/N, a mount on /proc/self/fd/N,
  mkdirat() below it), never on a path string the kernel would resolve again.

openat2() itself (Linux 5.6) is not used: this walk behaves the same on every
kernel singpy runs on (RHEL 8's 4.18 included), and it tells where a missing
path stops, which is what a mount point needs.

Host paths (bind sources) are another matter: the user chose them and sees the
host as it is, so `resolve` only re-roots the host's absolute links below
/oldroot in the staging root (singpy.layers.rootfs.host_path).
"""

from __future__ import annotations

import os
import stat

from singpy.errors import BindSpecError, PathError
from singpy.host.hostfiles import kind_name, read_bounded
from singpy.kernel.syscalls import fd_path

_MAX_LINKS = 40  # as the kernel's MAXSYMLINKS
_OPEN = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
class Lookup:
    """Where one guest path leads: the deepest existing directory on the way, and what is there.

    `parent` belongs to the `Tree` and stays open until its next lookup; `fd`
    (None when the path does not exist) belongs to the caller, who closes it.
    """

    __slots__ = ("parent", "name", "path", "fd", "missing")

    def __init__(self, parent: int, name: str, path: str, fd: int | None, missing: tuple[str, ...]) -> None:
        self.parent = parent  # O_PATH descriptor of the directory holding `name`
        self.name = name  # the final component, or the first missing one ("" for the root itself)
        self.path = path  # the guest path with every link replaced by its target ("/usr/share/zoneinfo/UTC")
        self.fd = fd  # O_PATH descriptor of the file itself when it exists
        self.missing = missing  # components to create below `parent`, `name` first; () when it exists


class Tree:
    """A directory tree seen from inside: `root` is its "/" for every path and every link.

    `proc` is where procfs is, seen by the caller (/oldroot/proc in the staging
    root). One parent directory is remembered between lookups: --nv binds some
    seventy libraries into one directory. A mount elsewhere may change what it
    resolves to: `forget` is called after every mount.
    """

    def __init__(self, root: str, *, proc: str = "/proc") -> None:
        self.root = root
        self.proc = proc
        try:
            self.fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as error:
            raise PathError(f"can't open the image root {root}: {error.strerror}") from None
        self._cached: tuple[str, int, str] | None = None  # (guest directory as asked, its fd, resolved path)
        # For `locate` (surveys, which create nothing): a directory found missing, as asked, with where its
        # walk stopped (a Lookup whose parent the Tree holds). A CDI spec puts ~64 libraries in
        # /usr/lib/x86_64-linux-gnu, which an Alpine or busybox image lacks: one walk, not 64.
        self._absent: tuple[str, Lookup] | None = None
        self._held: int | None = None  # parent descriptor of the last lookup, when not the cached one

    def close(self) -> None:
        self._release()
        self._drop_cache()
        self._forget_absent()
        os.close(self.fd)

    def __enter__(self) -> Tree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def locate(self, guest: str) -> Lookup:
        """Where `guest` leads, links followed, without a descriptor of the file itself: `fd` is None and
        `missing` empty when it exists. For surveys, which only ask where a path leads (one lstat, not
        an open and a close); what is then done on the file needs `lookup`."""
        parts = [part for part in guest.split("/") if part and part != "."]
        if not parts or parts[-1] == ".." or ".." in parts:
            return self._without_fd(self.lookup(guest))
        self._release()
        parent = self._directory(parts[:-1], guest, remember_absent=True)
        if isinstance(parent, Lookup):
            return Lookup(parent.parent, parent.name, f"{parent.path.rstrip('/')}/{parts[-1]}", None,
                          (*parent.missing, parts[-1]))
        parent_fd, parent_path = parent
        try:
            mode = os.stat(parts[-1], dir_fd=parent_fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return Lookup(parent_fd, parts[-1], f"{parent_path.rstrip('/')}/{parts[-1]}", None, (parts[-1],))
        except OSError as error:
            raise PathError(f"can't look up {guest}: {error.strerror}") from None
        if stat.S_ISLNK(mode):
            return self._without_fd(self.lookup(guest))
        return Lookup(parent_fd, parts[-1], f"{parent_path.rstrip('/')}/{parts[-1]}", None, ())

    @staticmethod
    def _without_fd(found: Lookup) -> Lookup:
        if found.fd is not None:  # forgotten, then closed (`_release` says why)
            fd, found.fd = found.fd, None
            os.close(fd)
        return found

    def lookup(self, guest: str, *, follow: bool = True) -> Lookup:
        """Resolve `guest`; with `follow` false, a link as last component is returned itself."""
        self._release()
        parts = [part for part in guest.split("/") if part and part != "."]
        if not parts:
            return Lookup(self.fd, "", "/", os.dup(self.fd), ())
        *dirs, name = parts
        if name == ".." or ".." in dirs:
            return self._walk(parts, follow, guest)
        parent = self._directory(dirs, guest)
        if isinstance(parent, Lookup):  # the parent is missing itself
            return Lookup(parent.parent, parent.name, f"{parent.path.rstrip('/')}/{name}", None,
                          (*parent.missing, name))
        parent_fd, parent_path = parent
        path = f"{parent_path.rstrip('/')}/{name}"
        try:
            fd = os.open(name, _OPEN, dir_fd=parent_fd)
        except FileNotFoundError:
            return Lookup(parent_fd, name, path, None, (name,))
        except OSError as error:
            raise PathError(f"can't look up {guest}: {error.strerror}") from None
        if follow and stat.S_ISLNK(os.fstat(fd).st_mode):
            os.close(fd)
            return self._walk(parts, follow, guest)  # a link as last component: the full walk follows it
        return Lookup(parent_fd, name, path, fd, ())

    def read(self, guest: str, *, limit: int) -> bytes | None:
        """The content of regular file `guest`; None when it does not exist.

        Anything else (a FIFO, a device, a directory, a link loop) or a file over
        `limit` bytes raises PathError: nothing blocks and nothing unbounded is read.
        """
        found = self.lookup(guest)
        if found.fd is None:
            return None
        try:
            info = os.fstat(found.fd)
            if not stat.S_ISREG(info.st_mode):
                raise PathError(f"{guest}{_resolved(guest, found.path)} is {kind_name(info.st_mode)}, "
                                "not a regular file")
            if info.st_size > limit:
                raise PathError(f"{guest} is too large ({info.st_size} bytes; at most {limit} are read)")
            # Reopened through its descriptor: the very file that was checked, never a second lookup.
            handle = os.open(fd_path(found.fd, self.proc), os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
        finally:
            os.close(found.fd)
        try:
            data = read_bounded(handle, limit)
        finally:
            os.close(handle)
        if len(data) > limit:
            raise PathError(f"{guest} is too large (over {limit} bytes)")
        return data

    def dangling(self, guest: str) -> str | None:
        """Where `guest` leads when it is a link to nothing in the image; None otherwise (lookup errors raise)."""
        found = self.locate(guest)
        return found.path if found.missing and found.path != _normal(guest) else None

    def listdir(self, guest: str) -> list[str]:
        """The names in directory `guest` ([] when it does not exist); PathError if it is not a directory."""
        found = self.lookup(guest)
        if found.fd is None:
            return []
        try:
            handle = os.open(fd_path(found.fd, self.proc), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as error:
            raise PathError(f"can't list {guest}: {error.strerror}") from None
        finally:
            os.close(found.fd)
        try:
            return os.listdir(handle)
        finally:
            os.close(handle)

    def make(self, found: Lookup, *, directory: bool) -> int:
        """Create what `found` lacks below its parent (directories, then the last as directory or empty file).

        Returns a descriptor of the new leaf, for the caller to close;
        `found` then describes the leaf (its parent, its name). Never follows a
        link: a name that appeared meanwhile makes it fail.
        """
        current = found.parent  # the directory the next component is created in
        try:
            for name in found.missing[:-1]:
                os.mkdir(name, 0o755, dir_fd=current)
                below = os.open(name, _OPEN, dir_fd=current)
                if current != found.parent:
                    os.close(current)
                current = below
            name = found.missing[-1]
            if directory:
                os.mkdir(name, 0o755, dir_fd=current)
                leaf = os.open(name, _OPEN, dir_fd=current)
            else:  # the new file's own descriptor: a mount target, never read or written through
                leaf = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                               dir_fd=current)
        except OSError as error:
            if current != found.parent:
                os.close(current)
            raise PathError(f"can't create {found.path}: {error.strerror}") from None
        if current != found.parent:  # the Tree holds the leaf's parent now, instead of the lookup's
            if self._held == found.parent:
                self._release()
            self._held = current
        found.parent, found.name, found.missing, found.fd = current, name, (), leaf
        return leaf

    def reopen(self, found: Lookup) -> int:
        """A fresh descriptor of `found.name` in its parent: after a mount there, the new mount's root."""
        try:
            return os.open(found.name, _OPEN, dir_fd=found.parent)
        except OSError as error:
            raise PathError(f"can't look up {found.path}: {error.strerror}") from None

    def forget(self, mounted: str) -> None:
        """A mount was made at resolved guest path `mounted`: drop the remembered directory unless the
        mount is below it (which leaves it as it was: the library binds of --nv, /etc/passwd under /etc).
        Any other mount may change what the directory's path, links included, leads to."""
        if self._cached is not None and not (is_under(mounted, self._cached[2]) and mounted != self._cached[2]):
            self._drop_cache()
        self._forget_absent()

    def _directory(self, dirs: list[str], guest: str, *, remember_absent: bool = False) -> tuple[int, str] | Lookup:
        """The directory `dirs` leads to, as (fd, resolved path), remembered; a Lookup if it is missing
        (remembered too with `remember_absent`)."""
        key = "/".join(dirs)
        if self._cached is not None and self._cached[0] == key:
            return self._cached[1], self._cached[2]
        if remember_absent and self._absent is not None and self._absent[0] == key:
            return self._absent[1]
        if not dirs:
            return self.fd, "/"
        found = self._walk(dirs, True, guest)
        if found.fd is None:
            if not remember_absent:
                return found
            self._forget_absent()
            self._absent = (key, Lookup(os.dup(found.parent), found.name, found.path, None, found.missing))
            return self._absent[1]
        if not stat.S_ISDIR(os.fstat(found.fd).st_mode):
            os.close(found.fd)
            raise PathError(f"can't look up {guest}: {found.path} is not a directory")
        self._release()  # the walk's parent is not needed: the directory itself is kept
        self._drop_cache()
        self._cached = (key, found.fd, found.path)
        return found.fd, found.path

    def _walk(self, parts: list[str], follow: bool, guest: str) -> Lookup:
        """The full walk from the root, with a stack of descriptors for `..`."""
        pending = list(reversed(parts))
        stack: list[tuple[int, str]] = []  # (fd, name) of each resolved directory below the root
        links = 0
        try:
            while pending:
                name = pending.pop()
                if name in ("", "."):
                    continue
                if name == "..":
                    if stack:
                        os.close(stack.pop()[0])
                    continue
                here = stack[-1][0] if stack else self.fd
                try:
                    fd = os.open(name, _OPEN, dir_fd=here)
                except FileNotFoundError:
                    rest = tuple(part for part in reversed(pending) if part not in ("", "."))
                    if ".." in rest:  # as the kernel: nothing below a missing directory, not even its '..'
                        raise PathError(f"can't look up {guest}: {_join(stack, name)} does not exist") from None
                    return self._result(stack, name, None, (name, *rest))
                except OSError as error:  # ENOTDIR, ENAMETOOLONG, EACCES...
                    raise PathError(f"can't look up {guest}: {_join(stack, name)}: {error.strerror}") from None
                mode = os.fstat(fd).st_mode
                if stat.S_ISLNK(mode) and (follow or pending):
                    try:
                        target = os.readlink("", dir_fd=fd)
                    except OSError as error:  # a /proc magic link of another process (/proc/1/root): EACCES
                        raise PathError(f"can't look up {guest}: {_join(stack, name)}: {error.strerror}") from None
                    finally:
                        os.close(fd)
                    links += 1
                    if links > _MAX_LINKS:
                        raise PathError(f"can't look up {guest}: too many levels of symbolic links")
                    if target.startswith("/"):
                        while stack:
                            os.close(stack.pop()[0])
                    pending.extend(reversed(target.split("/")))
                    continue
                if not pending:
                    return self._result(stack, name, fd, ())
                if not stat.S_ISDIR(mode):
                    os.close(fd)
                    raise PathError(f"can't look up {guest}: {_join(stack, name)} is not a directory")
                stack.append((fd, name))
            # Ended on a directory already walked ("a/.." or a link to "/"): it is the result.
            if not stack:
                return Lookup(self.fd, "", "/", os.dup(self.fd), ())
            fd, name = stack.pop()
            return self._result(stack, name, fd, ())
        except BaseException:
            while stack:
                os.close(stack.pop()[0])
            raise

    def _result(self, stack: list[tuple[int, str]], name: str, fd: int | None, missing: tuple[str, ...]) -> Lookup:
        """Close the walk's descriptors but the parent's, which the Tree holds until the next lookup."""
        path = _join(stack, name) + "".join(f"/{part}" for part in missing[1:])
        parent = stack.pop()[0] if stack else self.fd
        others = [other for other, _ in stack]
        stack.clear()  # before the closes: a signal's exception between them must not close one twice (_walk's)
        for other in others:
            os.close(other)
        if parent != self.fd:
            self._held = parent
        return Lookup(parent, name, path, fd, missing)

    # Each descriptor is forgotten before it is closed: a signal's exception (image.tools.Interruptible) that
    # comes between the two then leaves one open until the exit, never one closed twice, which would close
    # what another thread opened meanwhile under that number (seen: a pull's FATAL "Bad file descriptor").
    def _release(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            os.close(held)

    def _forget_absent(self) -> None:
        if self._absent is not None:
            absent, self._absent = self._absent, None
            os.close(absent[1].parent)

    def _drop_cache(self) -> None:
        if self._cached is not None:
            cached, self._cached = self._cached, None
            os.close(cached[1])


def _join(stack: list[tuple[int, str]], name: str) -> str:
    return "/" + "/".join([*(part for _, part in stack), name])


def _normal(guest: str) -> str:
    """`guest` as a walk without links would name it: "/a//./b/" is "/a/b"."""
    return "/" + "/".join(part for part in guest.split("/") if part and part != ".")


def _resolved(guest: str, path: str) -> str:
    """' (it leads to /dev/zero)' when links led elsewhere, for messages."""
    return "" if _normal(guest) == path else f" (it leads to {path})"


def resolve(root: str, host: str) -> str:
    """Host path of `host` below `root` (the host tree at /oldroot), its absolute links re-rooted there.

    For host paths only (bind sources): the last components may not exist yet.
    """
    pending = [part for part in reversed(host.split("/")) if part]
    resolved: list[str] = []
    current = root.rstrip("/")  # host path of `resolved`, kept as a string: this runs for every mount
    absent_from: int | None = None  # index of a missing component: nothing below it can be a link
    links = 0
    while pending:
        name = pending.pop()
        if name == ".":
            continue
        if name == "..":
            if resolved:
                resolved.pop()
                current = current[:current.rindex("/")]
            if absent_from is not None and len(resolved) <= absent_from:
                absent_from = None
            continue
        try:
            if absent_from is not None:
                raise FileNotFoundError
            target = os.readlink(f"{current}/{name}")
        except OSError as error:  # not a link, or not there yet: take the name as it is
            if absent_from is None and isinstance(error, (FileNotFoundError, NotADirectoryError)):
                absent_from = len(resolved)
            resolved.append(name)
            current = f"{current}/{name}"
            continue
        links += 1
        if links > _MAX_LINKS:
            raise BindSpecError(f"path {host} has too many levels of symbolic links")
        if target.startswith("/"):
            resolved, current = [], root.rstrip("/")
        pending.extend(part for part in reversed(target.split("/")) if part)
    return current or "/"


class Resolver:
    """`resolve` below one root, remembering the last directory resolved (host bind sources).

    `found` remembers what each source is: one launch asks about a CDI spec's
    ~64 libraries twice (the survey, then the bind), and the host tree does not
    change under it meanwhile.
    """

    def __init__(self, root: str) -> None:
        self.root = root
        self._parent: str | None = None  # host directory last resolved
        self._resolved = ""  # its path below the root
        self._found: dict[str, tuple[str, os.stat_result | None]] = {}

    def found(self, path: str) -> tuple[str, os.stat_result | None]:
        """`path` resolved, and what is there (None when nothing is)."""
        known = self._found.get(path)
        if known is None:
            known = self._found[path] = self._look(path)
        return known

    def _look(self, path: str) -> tuple[str, os.stat_result | None]:
        """One lstat of the path in its remembered directory: a file that is no link needs no second look."""
        parent, name = path.rstrip("/").rsplit("/", 1) if path.strip("/") else ("", "")
        if name and name not in (".", ".."):
            if parent != self._parent:
                self._parent, self._resolved = parent, resolve(self.root, parent or "/")
            candidate = os.path.join(self._resolved, name)
            try:
                info = os.lstat(candidate)
            except OSError:
                return candidate, None
            if not stat.S_ISLNK(info.st_mode):
                return candidate, info
        resolved = resolve(self.root, path)
        try:
            return resolved, os.stat(resolved)
        except OSError:
            return resolved, None


def is_under(path: str, parent: str) -> bool:
    """True if `path` is `parent` or lies below it (both normalised, absolute)."""
    return path == parent or path.startswith(parent.rstrip("/") + "/")
