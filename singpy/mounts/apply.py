"""apply_mounts: the one place that carries out a mount plan.

Called in the staging root (see singpy.layers.rootfs), with the host tree at
/oldroot and the container root at /newroot, holding CAP_SYS_ADMIN over the
mount namespace. Every `MountOp` is handled in the single `match` below;
`assert_never` makes a new op fail type-checking until it is handled here.

The image is untrusted, and so is every path in it (singpy.mounts.rootpath):

* A destination is resolved inside the container root, in the container as
  it stands when that mount is made (a bind below an earlier bind lands in
  it, as with Apptainer), and the mount is made on the descriptor that walk
  returned (/proc/self/fd/N), never on a path the kernel would resolve again.
* A missing mount point is created only in a filesystem this launch made
  for the container: a tmpfs mounted here, or the writable overlay of
  --writable-tmpfs. Those the image lacks were put in the overlay's lower
  layer beforehand (`singpy.mounts.survey`). Never in a directory bound from
  the host, even when an image link leads there (`/dev -> /etc`): the mount is
  then refused (`Missing.REQUIRED`: one FATAL line) or left out
  (`Missing.SKIP`: a --verbose note, where Apptainer would skip it too).
  One exception, as in Apptainer, runc and crun: a bind the user asked for
  (`MountSpec.asked`) inside another the user asked for gets its mount point
  made in that bind's host directory (cwltool's `--home DIR:/W` with
  `--mount ...,target=/W/input`), through the descriptor the walk returned,
  with the launcher's own (the user's) rights, and left there afterwards.
* A sealed tmpfs (/.singularity.d/libs) is filled in the staging root, a
  directory of singpy's own, and moved into place sealed (`_Applier._stage`);
  read-only binds of files from one host directory are taken from a
  read-only view of it, so they need no remount each (`_read_only_view`).
* What is read from the image (/etc/passwd and /etc/group, to merge the
  user's entry in) is read from the image alone (`image`, a Tree on its own
  root, where nothing from the host is mounted): a regular file, bounded.
"""

from __future__ import annotations

import os
import stat

from singpy import console
from singpy.errors import BindSpecError, KernelError, PathError
from singpy.kernel import syscalls as k
from singpy.layers.rootfs import HOST, NEWROOT, PROC, SCRATCH, remount
from singpy.mounts.rootpath import Lookup, Resolver, Tree, is_under
from singpy.plan import Missing, MountOp, MountSpec

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from typing import NoReturn

IDENTITY_LIMIT = 16 << 20  # /etc/passwd and /etc/group of an image: LDAP-sized files are a few MB


def apply_mounts(specs: tuple[MountSpec, ...], *, image: Tree, writable_root: bool, no_layer: str = "",
                 host: Resolver, mount_setattr: bool = True) -> None:
    """Apply `specs` in order on NEWROOT; `image` is the image's own root, for what is read from it.

    `writable_root`: the root's upper layer is a tmpfs of this launch (--writable-tmpfs), where a
    missing mount point may be made. `no_layer`: why the image got no layer of mount points
    (--writable, `enable overlay = no`), for the message naming one it lacks. `mount_setattr`: False with
    `avoid kernel features = mount_setattr`, a SEAL is then a remount per mount, as on Linux < 5.12. `host`:
    the survey's resolver of bind sources (`singpy.mounts.survey.Survey.host`), with what it found.
    """
    with Tree(NEWROOT, proc=PROC) as container:
        applier = _Applier(container, image, specs, writable_root=writable_root, host=host)
        applier.no_layer = no_layer
        applier.mount_setattr = mount_setattr
        left_out: list[str] = []  # destinations of default mounts left out for want of a mount point
        try:
            for number, spec in enumerate(specs):
                try:
                    applier.apply(number, spec)
                except PathError as error:
                    if spec.missing == Missing.REQUIRED:
                        raise PathError(f"can't {_doing(spec)}: {error.message}", hint=error.hint) from None
                    # Without a layer of mount points, a default mount the image has no place for is left out
                    # with a warning, as Apptainer does: the user sees why their home or cwd is not there.
                    # One per missing place: not again for the mounts below one left out (the staged home).
                    if isinstance(error, _NoMountPoint) and not any(is_under(spec.dest, d) for d in left_out):
                        console.warning(f"can't {_doing(spec)}, left out: {error.message}")
                    else:
                        console.verbose(f"can't {_doing(spec)} (left out): {error.message}")
                    left_out.append(spec.dest)
        finally:
            applier.close()


def assert_never(value: NoReturn) -> NoReturn:
    """typing.assert_never, without importing typing at start-up."""
    raise AssertionError(f"unhandled mount op {value!r}")


class _Applier:
    """The container being assembled: what singpy mounted so far, and where it may create files."""

    def __init__(self, container: Tree, image: Tree, specs: tuple[MountSpec, ...], *, writable_root: bool,
                 host: Resolver) -> None:
        self.container = container
        self.image = image
        self.host = host  # the host tree never changes under /oldroot
        # Filesystems made for this container, where a missing mount point may be created.
        self.owned: set[int] = {os.fstat(container.fd).st_dev} if writable_root else set()
        self.host_binds: list[tuple[str, str]] = []  # (resolved destination, source) of host binds, for messages
        self.asked_binds: set[str] = set()  # resolved destinations of the host binds the user asked for
        self.to_seal = {spec.dest for spec in specs if spec.op == MountOp.SEAL}
        self.no_layer = ""  # why no mount point the image lacks was added (--writable...), "" when they were
        self.mount_setattr = True  # SEAL with mount_setattr(2) where the kernel has it (not avoided)
        # Read-only views of host directories that several read-only binds take files from (`_read_only_view`).
        self.sharing = _sharing_a_directory(specs)
        self.views: dict[str, str | None] = {}  # resolved host directory -> its view (None: none could be made)
        self.link_dir: tuple[str, int, str] | None = None  # the last link's directory: (as asked, fd, resolved)
        self.specs = specs
        self.staged: _Staged | None = None  # the tmpfs being filled in the staging root (`_stage`)

    def close(self) -> None:
        self.forget_link_dir()
        if self.staged is not None:  # forgotten, then closed (singpy.mounts.rootpath.Tree._release says why)
            staged, self.staged = self.staged, None
            os.close(staged.target)

    def apply(self, number: int, spec: MountSpec) -> None:
        if spec.op != MountOp.SYMLINK:
            self.forget_link_dir()  # a mount may change what the directory's path leads to
        if self.staged is not None:
            self._apply_staged(spec, self.staged)
            return
        match spec.op:
            case MountOp.BIND:
                self._bind(spec)
            case MountOp.TMPFS if spec.dest in self.to_seal:
                self._stage(spec, number)
            case MountOp.TMPFS:  # (setuid: --allow-setuid, singpy.launch.setuid)
                self._fresh(spec, "tmpfs", (0 if spec.setuid else k.MS_NOSUID) | k.MS_NODEV, f"mode={spec.mode}")
            case MountOp.PROC:
                self._fresh(spec, "proc", k.MS_NOSUID | k.MS_NODEV | k.MS_NOEXEC, None)
            case MountOp.DEVPTS:
                self._fresh(spec, "devpts", k.MS_NOSUID | k.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620")
            case MountOp.MQUEUE:
                self._fresh(spec, "mqueue", k.MS_NOSUID | k.MS_NODEV | k.MS_NOEXEC, None)
            case MountOp.FILE:
                self._file(spec, number)
            case MountOp.SYMLINK:
                self._symlink(spec)
            case MountOp.SEAL:
                raise AssertionError(f"a SEAL of {spec.dest} that does not end its tmpfs's block (singpy.plan)")
            case _:
                assert_never(spec.op)

    def _target(self, dest: str, *, directory: bool, asked: bool = False) -> tuple[Lookup, int]:
        """Where to mount `dest`: an existing file or directory, or one created where that is safe.

        `asked`: the mount is a bind the user asked for, which may get its mount point in another (see the
        module's docstring). Returns the lookup and a descriptor of the target (the caller closes it).
        """
        found = self.container.lookup(dest)
        if found.fd is None:
            self._check_may_create(found, os.fstat(found.parent).st_dev, asked=dest if asked else None)
            found.fd = self.container.make(found, directory=directory)
        if not found.name:
            os.close(found.fd)
            raise PathError("it is the container's root directory")
        return found, found.fd

    def _check_may_create(self, found: Lookup, device: int, *, asked: str | None = None) -> None:
        """Refuse to create `found` outside the container's own filesystems, unless it is the mount point of
        an asked bind (`asked`: its destination) inside another asked bind, reached without following a link
        (the walk's path is the destination as written: no image link chose where it leads)."""
        if device in self.owned:
            return
        where = found.path[:-len("/".join(found.missing)) - 1] or "/"
        binds = [(path, source) for path, source in self.host_binds if is_under(where, path)]
        if binds:
            path, source = max(binds, key=lambda bind: len(bind[0]))
            if asked and path in self.asked_binds and found.path == os.path.normpath(asked):
                console.verbose(f"making {found.path} in {source} (bound on {path}), for a bind inside it")
                return
            reason = f"the host's {source} is bound on {path}"
        elif self.no_layer and device == os.fstat(self.container.fd).st_dev:
            raise _NoMountPoint(f"{found.path} does not exist in the image ({self.no_layer})",
                            hint=f"create {found.path} in the image first")
        else:
            reason = f"nothing may be created in {where}"
        raise PathError(f"{found.path} does not exist and can't be made ({reason}; singpy creates nothing "
                        "outside the container's own filesystems)",
                        hint=f"create {found.path} on the host first, or choose a destination the image has"
                        if binds else None)

    def _source(self, spec: MountSpec) -> tuple[str, os.stat_result] | None:
        """A bind's source on the host and what it is; None for one to leave out (missing, Missing.SKIP)."""
        assert spec.source is not None
        source, info = self.host.found(spec.source)
        if info is not None:
            return source, info
        if spec.missing == Missing.SKIP:
            console.debug(f"skipping bind of {spec.source}: not on this host")
            return None
        raise BindSpecError(f"bind source {spec.source} does not exist")

    def _bind(self, spec: MountSpec) -> None:
        assert spec.source is not None
        if (host := self._source(spec)) is None:
            return
        source, info = host
        found, target = self._target(spec.dest, directory=stat.S_ISDIR(info.st_mode), asked=spec.asked)
        try:
            _check_kinds(spec, info, os.fstat(target))
            _say_binding(spec)
            flags = (0 if spec.setuid else k.MS_NOSUID) | (0 if spec.dev else k.MS_NODEV) | \
                (k.MS_RDONLY if spec.readonly else 0)
            viewed = spec.readonly and not (spec.dev or spec.setuid)  # a view is nodev and nosuid
            view = self._read_only_view(spec.source, source) if viewed else None
            k.mount(view or source, k.fd_path(target, PROC), None, k.MS_BIND | k.MS_REC, shown=spec.dest,
                    source_shown=spec.source)
            if view is None:  # a host mount's nosuid cleared on its bind for --allow-setuid, as Apptainer does
                self._remount(found, flags, spec.dest, clear=k.MS_NOSUID if spec.setuid else 0)
        finally:
            os.close(target)
        self.host_binds.append((found.path, spec.source))
        if spec.asked:
            self.asked_binds.add(found.path)
        self.container.forget(found.path)

    def _read_only_view(self, asked: str, source: str) -> str | None:
        """`source` seen through a read-only, nosuid, nodev bind of its directory, or None.

        A bind copies the flags of the mount it is taken from, so a file bound from
        the view needs no remount of its own: a CDI spec's ~64 libraries of one
        directory are 64 mounts, not 128 plus a lookup and a statvfs each. Made
        only for a directory that more than one read-only bind takes from, with
        mount_setattr(2), which reaches the mounts below the view too (a host
        library that is itself a bind mount, inside another container).
        """
        directory, name = source.rsplit("/", 1)
        if not self.mount_setattr or directory == HOST or asked not in self.sharing:
            return None
        if directory not in self.views:
            self.views[directory] = self._make_view(directory, f"{SCRATCH}/view{len(self.views)}")
        view = self.views[directory]
        return None if view is None else f"{view}/{name}"

    def _make_view(self, directory: str, view: str) -> str | None:
        os.mkdir(view, 0o700)
        try:
            k.mount(directory, view, None, k.MS_BIND | k.MS_REC)
        except KernelError as error:
            console.debug(f"no read-only view of {directory}: {error.message}")
            return None
        fd = os.open(view, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            if k.seal_tree(fd, view):
                return view
        finally:
            os.close(fd)
        k.umount(view, k.MNT_DETACH)  # a kernel without mount_setattr(2): each bind is remounted instead
        self.mount_setattr = False
        return None

    def _check_block(self, number: int) -> None:
        """The tmpfs `specs[number]` is sealed: the specs after it fill it, then its SEAL ends the block."""
        dest = self.specs[number].dest
        for later in self.specs[number + 1:]:
            if later.op == MountOp.SEAL and later.dest == dest:
                return
            directory, name = later.dest.rsplit("/", 1)
            if later.op not in (MountOp.BIND, MountOp.SYMLINK) or directory != dest or name in ("", ".", ".."):
                break
        raise AssertionError(f"the sealed tmpfs {dest} is not one block of the plan (singpy.plan)")

    def _stage(self, spec: MountSpec, number: int) -> None:
        """A sealed tmpfs (/.singularity.d/libs: ~61 library binds and as many links, then its SEAL), made in
        the staging root, where the directory is singpy's own and plain paths are safe (no walk, no descriptor
        per entry: about half the cost of each), then moved into the container sealed (`_apply_staged`). Nothing
        else is mounted meanwhile (`_check_block`), so the container sees the same as if it were made there.
        Its mount point is found (or made) first, as for any tmpfs."""
        self._check_block(number)
        found, target = self._target(spec.dest, directory=True)
        path = f"{SCRATCH}/staged{number}"
        try:
            os.mkdir(path, 0o700)
            console.verbose(f"mounting tmpfs on {spec.dest}")
            k.mount("tmpfs", path, "tmpfs", k.MS_NOSUID | k.MS_NODEV, f"mode={spec.mode}", shown=spec.dest)
        except BaseException:
            os.close(target)
            raise
        self.staged = _Staged(spec.dest, path, found.path, target)

    def _apply_staged(self, spec: MountSpec, staged: _Staged) -> None:
        """One spec of the block: a bind or a link in the staged tmpfs, or the SEAL that moves it into place."""
        entry = f"{staged.path}/{spec.dest.rsplit('/', 1)[1]}"
        match spec.op:
            case MountOp.BIND:
                assert spec.source is not None
                if (host := self._source(spec)) is None:
                    return
                source, info = host
                _make_entry(entry, spec.dest, directory=stat.S_ISDIR(info.st_mode))
                _say_binding(spec)
                k.mount(source, entry, None, k.MS_BIND | k.MS_REC, shown=spec.dest)
                staged.binds.append(entry)
                self.host_binds.append((f"{staged.resolved}/{os.path.basename(entry)}", spec.source))
            case MountOp.SYMLINK:
                assert spec.source is not None
                try:
                    os.symlink(spec.source, entry)
                except FileExistsError:
                    raise PathError(f"{spec.dest} exists already") from None
            case _:  # the SEAL that ends the block
                self._seal_staged(staged)
                self.staged = None
                k.mount(staged.path, k.fd_path(staged.target, PROC), None, k.MS_MOVE, shown=spec.dest)
                os.close(staged.target)
                self.container.forget(staged.resolved)

    def _seal_staged(self, staged: _Staged) -> None:
        fd = os.open(staged.path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            if self.mount_setattr and k.seal_tree(fd, staged.dest):
                console.debug(f"sealed {staged.dest} read-only (mount_setattr)")
                return
        finally:
            os.close(fd)
        console.debug(f"sealing {staged.dest} read-only: a remount per mount ({len(staged.binds)} binds)")
        for path in (*staged.binds, staged.path):
            remount(path, k.MS_RDONLY | k.MS_NOSUID | k.MS_NODEV, shown=staged.dest)

    def _fresh(self, spec: MountSpec, fstype: str, flags: int, data: str | None) -> None:
        found, target = self._target(spec.dest, directory=True)
        try:
            console.verbose(f"mounting {fstype} on {spec.dest}")
            k.mount(fstype, k.fd_path(target, PROC), fstype, flags, data, shown=spec.dest)
            if fstype == "tmpfs":
                mounted = self.container.reopen(found)
                device = os.fstat(mounted).st_dev
                os.close(mounted)
                self.owned.add(device)
        finally:
            os.close(target)
        self.container.forget(found.path)

    def _file(self, spec: MountSpec, number: int) -> None:
        """A file the launcher writes (passwd, group, resolv.conf), bound read-only over the image's."""
        assert spec.content is not None
        data = self._merged(spec, spec.content) if spec.merge else spec.content.encode() + b"\n"
        if data is None:
            return
        staged = f"{SCRATCH}/file{number}"
        handle = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            os.write(handle, data)
        finally:
            os.close(handle)
        found, target = self._target(spec.dest, directory=False)
        try:
            named = ", ".join(line.split(":", 1)[0] for line in spec.content.splitlines())  # passwd's, group's
            console.verbose(f"writing {spec.dest} with entries for {named}" if spec.merge else f"writing {spec.dest}")
            k.mount(staged, k.fd_path(target, PROC), None, k.MS_BIND, shown=spec.dest)
            self._remount(found, k.MS_RDONLY | k.MS_NOSUID | k.MS_NODEV, spec.dest)
        finally:
            os.close(target)
        self.container.forget(found.path)

    def _merged(self, spec: MountSpec, entries: str) -> bytes | None:
        """The image's /etc/passwd or /etc/group with the user's `entries` merged in, as Apptainer merges them
        (singpy.mounts.system); None where Apptainer leaves the image's as it is: a line it can't parse, or no
        such file (a `FROM scratch` image: nothing is bound, and no mount point was made for it, survey)."""
        from singpy.mounts import system  # loaded already by the planner

        try:
            image = self._image_file(spec.dest)
        except PathError as error:  # never read: a warning and the image's file as it is, as Apptainer goes on
            console.warning(f"can't use the image's {spec.dest} ({error.message}): not updating it")
            return None
        if image is None:  # Apptainer's words, a warning there too
            console.warning(f"{spec.dest.rsplit('/', 1)[1]} file doesn't exist in container, not updating")
            return None
        if spec.dest != "/etc/passwd":
            return system.merge_group(image, entries)
        try:
            return system.merge_passwd(image, entries)
        except ValueError as error:
            console.warning(f"the image's /etc/passwd is left as it is, without your entry: {error}")
            return None

    def _image_file(self, dest: str) -> bytes | None:
        """The image's own `dest` (None if it has none), from the image alone; PathError for anything but a
        regular file of at most IDENTITY_LIMIT bytes (a FIFO would block, a device never end).

        A link to nothing in the image is refused too: in the assembled container
        it would lead elsewhere (`/etc/group -> /dev/zero`: the host's /dev).
        """
        data = self.image.read(dest, limit=IDENTITY_LIMIT)
        target = self.image.dangling(dest) if data is None else None
        if target is not None:
            raise PathError(f"it is a link to {target}, which is not in the image")
        return data

    def _symlink(self, spec: MountSpec) -> None:
        assert spec.source is not None
        directory, name = spec.dest.rsplit("/", 1)
        if self.link_dir is not None and self.link_dir[0] == directory and name not in ("", ".", ".."):
            # The links of /.singularity.d/libs come in a row: their directory is walked and checked once.
            _, parent, resolved = self.link_dir
            try:
                os.symlink(spec.source, name, dir_fd=parent)
            except FileExistsError:
                raise PathError(f"{resolved.rstrip('/')}/{name} exists already") from None
            return
        found = self.container.lookup(spec.dest, follow=False)
        if found.fd is not None:
            os.close(found.fd)
            raise PathError(f"{found.path} exists already")
        if len(found.missing) > 1:
            raise PathError(f"{found.path.rsplit('/', 1)[0]} does not exist")
        self._check_may_create(found, os.fstat(found.parent).st_dev)
        os.symlink(spec.source, found.name, dir_fd=found.parent)
        self.forget_link_dir()
        self.link_dir = (directory, os.dup(found.parent), found.path.rsplit("/", 1)[0] or "/")

    def forget_link_dir(self) -> None:
        if self.link_dir is not None:  # forgotten, then closed
            link_dir, self.link_dir = self.link_dir, None
            os.close(link_dir[1])

    def _remount(self, found: Lookup, flags: int, shown: str, clear: int = 0) -> None:
        """Add `flags` to what was just mounted on `found` (reopened: its descriptor is the mount point below)."""
        mounted = self.container.reopen(found)
        try:
            remount(k.fd_path(mounted, PROC), flags, shown=shown, clear=clear)
        finally:
            os.close(mounted)


def _check_kinds(spec: MountSpec, source: os.stat_result, target: os.stat_result) -> None:
    """A directory binds only on a directory, anything else only on a non-directory: said in the user's words
    (the kernel's ENOTDIR/EISDIR would name the staging root's path)."""
    if stat.S_ISDIR(source.st_mode) != stat.S_ISDIR(target.st_mode):
        what, where = ("a directory", "not a directory") if stat.S_ISDIR(source.st_mode) else ("not a directory",
                                                                                          "a directory")
        raise PathError(f"{spec.source} is {what}, and {spec.dest} is {where} in the container")


def _say_binding(spec: MountSpec) -> None:
    if console.level() >= console.VERBOSE:  # the line is not even formatted otherwise: ~130 binds with --nv
        console.verbose(f"binding {spec.source} -> {spec.dest}{' (ro)' if spec.readonly else ''}")


class _NoMountPoint(PathError):
    """A mount point the image lacks, where the launch has no layer to add it in (`no_layer`)."""


def _doing(spec: MountSpec) -> str:
    """What a spec does, for "can't ..." messages."""
    match spec.op:
        case MountOp.BIND:
            return f"bind {spec.source} on {spec.dest}"
        case MountOp.FILE:
            return f"write {spec.dest}"
        case MountOp.SYMLINK:
            return f"make the link {spec.dest}"
        case MountOp.SEAL:
            return f"make {spec.dest} read-only"
        case _:
            return f"mount {spec.op} on {spec.dest}"


class _Staged:
    """A tmpfs of the plan being filled in the staging root, before it is moved to `dest` (`_Applier._stage`)."""

    __slots__ = ("dest", "path", "resolved", "target", "binds")

    def __init__(self, dest: str, path: str, resolved: str, target: int) -> None:
        self.dest = dest  # where the plan puts it
        self.path = path  # where it is meanwhile, in the staging root
        self.resolved = resolved  # `dest` resolved in the container
        self.target = target  # O_PATH descriptor of its mount point in the container
        self.binds: list[str] = []  # its binds (below `path`): a remount each where mount_setattr(2) is missing


def _make_entry(path: str, dest: str, *, directory: bool) -> None:
    """An empty file or directory to bind on, in a tmpfs of singpy's own; a name made twice is refused."""
    try:
        if directory:
            os.mkdir(path, 0o755)
        else:
            os.mknod(path, stat.S_IFREG | 0o644)  # one call, where open and close are two
    except FileExistsError:
        raise PathError(f"{dest} exists already") from None


def _sharing_a_directory(specs: tuple[MountSpec, ...]) -> set[str]:
    """The sources (as asked) of the read-only binds that take from a host directory another one takes from too.

    Never the host's root: its view would copy every mount of the host.
    """
    directories = {spec.source: os.path.dirname(os.path.normpath(spec.source)) for spec in specs
                   if spec.op == MountOp.BIND and spec.readonly and not spec.dev and spec.source}
    counts: dict[str, int] = {}
    for directory in directories.values():
        counts[directory] = counts.get(directory, 0) + 1
    return {source for source, directory in directories.items() if directory != "/" and counts[directory] > 1}
