"""The tree a layer is applied to: its directories found inside the root on descriptors, and what changed.

Parent directories are resolved inside the root, links followed as a process
inside would follow them (RESOLVE_IN_ROOT: absolute targets start again at
the root, `..` stops there), on descriptors, one component at a time
(singpy.mounts.rootpath for the rare link on the way), a bounded number kept
open between entries. What a layer writes and the directories it changes are
noted here: the whiteout rules (singpy.oci.whiteouts) spare the first, and
`finish` gives the second their times back, as umoci does.
"""

from __future__ import annotations

import os
import stat

from singpy.errors import ImageError
from singpy.image import trees
from singpy.oci.owners import Ownership

MAX_CACHED = 256  # directory descriptors kept between entries
_DIR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class EntryError(Exception):
    """One entry can't be applied: the message says why (the entry's name is added by the caller)."""


def clean(name: str) -> list[str]:
    """The components of `name` as a path below the root: '.' and '' dropped, '..' climbing no higher."""
    parts: list[str] = []
    for part in name.split("/"):
        if part == "..":
            if parts:
                parts.pop()
        elif part and part != ".":
            parts.append(part)
    return parts


def join(directory: str, name: str) -> str:
    return f"/{name}" if directory == "/" else f"{directory}/{name}"


def parent_of(path: str) -> str:
    return path.rpartition("/")[0] or "/"


def shown(name: str) -> str:
    text = name if len(name) <= 200 else name[:200] + "..."
    return text if text.isprintable() else repr(text)


def sparse_regions(sparse: list[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    """A GNU sparse member's data regions (offset, length), checked: in order, apart, inside the file's `size`
    (tarfile takes the map as the archive says it). Empty regions, which hold nothing, dropped: GNU tar ends
    its map with one, and tarfile reads an old GNU header's unused slots as (0, 0)."""
    regions = []
    end = 0
    for offset, length in sparse:
        if length == 0:
            continue
        if offset < end or length < 0 or offset + length > size:
            raise EntryError(f"its sparse map is invalid (a region of {length} bytes at {offset})")
        regions.append((offset, length))
        end = offset + length
    return regions


def mode_at(directory: int, name: str) -> int | None:
    """The st_mode of `name` in the open `directory` (links not followed), None when there is none."""
    try:
        return os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None


class LayerTree:
    """The state of one layer's application: the root, the directory cache, what this layer wrote."""

    def __init__(self, root: str, ownership: Ownership | None, source: str) -> None:
        self.root = root
        self.ownership = ownership
        self.source = source
        try:
            self.root_fd = os.open(root, OPEN_DIR)
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
        self.drop_cache()
        os.close(self.root_fd)

    def mark_written(self, path: str) -> None:
        self.written.add(path)
        parent = parent_of(path)
        while parent not in self.kept:
            self.kept.add(parent)
            parent = parent_of(parent)

    def touch(self, fd: int, directory: str) -> None:
        """`directory` is about to change: remember its mtime, to give it back at the end of the layer."""
        if directory not in self.old_times:
            self.old_times[directory] = os.stat(fd).st_mtime_ns

    # -- directories ----------------------------------------------------------------------------------

    def directory(self, parts: list[str], *, create: bool, follow: bool = True) -> tuple[int, str] | None:
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
                    closing, spare = spare, -1  # forgotten first: never closed twice (drop_cache says why)
                    os.close(closing)
                if step is None:
                    return None
                fd, path = step
                if len(self.cache) < MAX_CACHED or index == len(parts) - 1:  # the result is always kept
                    self.cache["/".join(parts[:index + 1])] = step
                else:
                    spare = fd
        finally:
            if spare != -1:
                os.close(spare)
        self.last = key
        return fd, path

    def _step(self, fd: int, path: str, name: str, *, create: bool, follow: bool) -> tuple[int, str] | None:
        here = join(path, name)
        try:
            return os.open(name, _DIR, dir_fd=fd), here
        except FileNotFoundError:
            if not create:
                return None
            if self.ownership is not None and (self.ownership.get(here) or "m")[0] != "m":
                raise EntryError(f"{shown(here)} is a device node, not a directory") from None
            self.touch(fd, path)
            os.mkdir(name, 0o755, dir_fd=fd)
            os.chmod(name, 0o755, dir_fd=fd)  # whatever the umask: a directory made just now, no link
            if self.ownership is not None:
                self.ownership.record(here, 0o755)
            return os.open(name, _DIR, dir_fd=fd), here
        except NotADirectoryError:
            mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
            if not stat.S_ISLNK(mode):
                raise EntryError(f"{shown(here)} is not a directory") from None
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
                raise EntryError(f"{shown(guest)} leads to {shown(found.path)}, which is not a directory")
            return found.fd, found.path

    def drop_cache(self, keep: str | None = None) -> None:
        """Close the cached descriptors, but `keep`'s: a deep tree's next entry starts there, not at the root."""
        kept = self.cache.pop(keep, None) if keep is not None else None
        # Forgotten, then closed: a signal's exception (image.tools.Interruptible) between the closes leaves the
        # rest open until the exit, where `close` closing them again would close what another thread opened
        # meanwhile under those numbers.
        closing = [fd for fd, _ in self.cache.values()]
        self.cache.clear()
        if kept is not None and keep is not None:
            self.cache[keep] = kept
        self.stale = False
        for fd in closing:
            os.close(fd)

    def clear(self, parent: int, name: str, path: str) -> None:
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

    # -- the end --------------------------------------------------------------------------------------

    def finish(self) -> None:
        """Directories' mtimes: this layer's as the archive says, lower ones' as they were before."""
        self.drop_cache()
        for path, mtime in {**self.old_times, **self.dir_times}.items():
            if len(self.cache) > MAX_CACHED:
                self.drop_cache(keep=self.last)
            try:
                if path == "/":
                    os.utime(self.root_fd, ns=(mtime, mtime))
                    continue
                parts = path.split("/")[1:]
                found = self.directory(parts[:-1], create=False, follow=False)
                if found is not None:
                    os.utime(parts[-1], ns=(mtime, mtime), dir_fd=found[0], follow_symlinks=False)
            except (OSError, EntryError, OverflowError):
                continue  # removed since, or no longer a directory: its time does not matter
        self.drop_cache()

