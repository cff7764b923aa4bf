"""An OCI image config made Apptainer's /.singularity.d, written into an extracted image tree.

What `apptainer build|pull ... docker://X` puts in the image, from its
current source ([A] = github.com/apptainer/apptainer, main):

* the base environment of every build ([A] internal/pkg/build/sources/
  base_environment.go `makeBaseEnv(b, overwrite=true)`): the directories
  /.singularity.d/{libs,actions,env}, /dev, /proc, /root, /var/tmp, /tmp,
  /etc, /sys, /home (created when missing, anything already there left as
  it is), the links /singularity, /.run, /.exec, /.test, /.shell and
  /environment, empty /etc/hosts and /etc/resolv.conf, and the action and
  env scripts, whose text is embedded here as Apptainer embeds it (the
  files are Apptainer's, BSD-licensed: their copyright lines are kept);
* from the image config ([A] internal/pkg/build/sources/conveyorPacker_oci.go):
  /.singularity.d/runscript from Entrypoint and Cmd (`insertRunScript`, the
  `ociRunscript` template) and /.singularity.d/env/10-docker2singularity.sh
  from Env (`insertEnv`);
* /.singularity.d/labels.json: the image's Labels with the build's labels
  over them ([A] internal/pkg/build/metadata.go `insertLabelsJSON`), in the
  bytes Go's json.MarshalIndent writes;
* an empty /.singularity.d/env/94-appsbase.sh ([A] internal/pkg/build/apps/
  apps.go `createAllApps`, run for every build, with no apps here);
* with `deffile`, /.singularity.d/Singularity, an older one moved to
  /.singularity.d/bootstrap_history/ApptainerN ([A] metadata.go `insertDefinition`).

Their paths, contents and modes are singpy.oci.singularityd's (data, on
singpy.oci.basefiles and singpy.oci.gotemplate).

`install` writes them into an extracted tree, which is untrusted: every
path is resolved inside the tree as a process inside would see it
(singpy.mounts.rootpath.Tree: links followed, but never out of it), so an
image whose /.singularity.d, /etc or /tmp is a link to /etc of the host
gets its files written below the tree's own root. Where Apptainer's
os.Root refuses an absolute link, the tree's root is its "/" here; the
rest is as Apptainer does it, but for what Apptainer would hang on or
write through:

* a FIFO, device or socket where a file is written, or a regular file with
  other hard links, is replaced by a new file (Apptainer would open it and
  block, or write to the device or to every link); an existing file is
  otherwise truncated and rewritten in place, as Apptainer does, and given
  the mode Apptainer gives (0755 scripts, 0644 labels and /etc files);
* a directory where a file is written, or anything but a directory where
  /.singularity.d or one of its directories must be, is one ImageError
  (Apptainer's build fails there too);
* a file's or directory's missing parents are created, also where a link
  leads to something missing (Apptainer fails on those); every directory
  made is 0755 whatever the umask (Apptainer builds under umask 002).

`install` returns what it wrote, by resolved path, with its mode: an
unprivileged pull records those as root's (singpy.oci.owners.Ownership),
as Apptainer's files are root's in the images it builds.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from typing import Any

from singpy.constants import SINGULARITY_D
from singpy.errors import ImageError, PathError
from singpy.host.hostfiles import write_all
from singpy.kernel.syscalls import fd_path
from singpy.mounts.rootpath import Lookup, Tree
from singpy.oci.singularityd import (
    DEFFILE,
    HISTORY,
    base_files,
    singularity_files,
    singularity_links,
    skeleton_dirs,
)


def install(root: str | Tree, config: Mapping[str, Any], labels: Mapping[str, str], *,
            deffile: bytes | None = None) -> dict[str, int]:
    """Write Apptainer's directories, links and files into the extracted image `root` (a path or a Tree).

    Returns what it wrote or created, by path inside the image with links
    resolved (as singpy.oci.owners.Ownership keys them) -> its mode: an
    unprivileged conversion records those as root's, with these modes,
    over whatever a layer had recorded there.
    """
    files = singularity_files(config, labels=labels, deffile=deffile)
    tree = Tree(root) if isinstance(root, str) else root
    written: dict[str, int] = {}
    try:
        _skeleton(tree, written)
        if deffile is not None:
            _keep_old_deffile(tree, written)
        for guest, (content, mode) in files.items():
            written[_write_file(tree, guest, content, mode, written)] = mode
    except PathError as error:
        raise ImageError(f"can't write Apptainer's files into the image: {error.message}") from None
    except OSError as error:
        raise ImageError(f"can't write Apptainer's files into the image at {tree.root}: {error.strerror}") from None
    finally:
        if isinstance(root, str):
            tree.close()
    return written


def install_base(root: str) -> None:
    """Apptainer's base environment where the image `root` lacks it ([A] makeBaseEnv, overwrite false): the
    skeleton directories, the links, and the base files that are missing (an existing one is kept)."""
    written: dict[str, int] = {}
    with Tree(root) as tree:
        try:
            _skeleton(tree, written)
            for guest, (content, mode) in base_files().items():
                found = tree.lookup(guest)
                if found.fd is not None:
                    os.close(found.fd)
                    continue
                _write_file(tree, guest, content, mode, written)
        except PathError as error:
            raise ImageError(f"can't write Apptainer's files into the image: {error.message}") from None
        except OSError as error:
            raise ImageError(f"can't write Apptainer's files into the image at {root}: {error.strerror}") from None


def _skeleton(tree: Tree, written: dict[str, int]) -> None:
    """The root made writable by its owner, the skeleton directories and the links of [A] makeBaseEnv."""
    _owner_writable(tree)
    for guest in skeleton_dirs():
        _ensure_directory(tree, guest, keep_anything=not guest.startswith(SINGULARITY_D), written=written)
    for guest, target in singularity_links().items():
        _ensure_link(tree, guest.lstrip("/"), target)


def _owner_writable(tree: Tree) -> None:
    """[A] makeBaseEnv: a root directory its owner cannot write gets u+w."""
    mode = os.fstat(tree.fd).st_mode
    if not mode & stat.S_IWUSR:
        os.chmod(fd_path(tree.fd, tree.proc), stat.S_IMODE(mode) | stat.S_IWUSR)


def _ensure_directory(tree: Tree, guest: str, *, keep_anything: bool, written: dict[str, int]) -> None:
    """Create directory `guest` if missing. A mount point (keep_anything) is left as it is whatever it is, as
    Apptainer's Lstat check does; a directory of /.singularity.d must be one, to hold the files written next."""
    found = tree.lookup(guest, follow=not keep_anything)
    if found.fd is not None:
        is_directory = stat.S_ISDIR(os.fstat(found.fd).st_mode)
        os.close(found.fd)
        if keep_anything or is_directory:
            return
        raise ImageError(f"can't write Apptainer's files into the image: {guest}{_leads(guest, found)} is not a "
                         "directory")
    created = _created(found)
    os.close(tree.make(found, directory=True))
    _fix_directory_modes(tree, created, written)


def _created(found: Lookup) -> list[str]:
    """The paths `Tree.make(found)` is about to create, parents first (links resolved)."""
    parts = found.path.rstrip("/").split("/")
    base = "/".join(parts[:len(parts) - len(found.missing)]) or ""
    return [f"{base}/{'/'.join(found.missing[:count])}" for count in range(1, len(found.missing) + 1)]


def _fix_directory_modes(tree: Tree, paths: list[str], written: dict[str, int]) -> None:
    """Directories just made get 0755 whatever the umask ([A] makes them 0755 under its build's umask 002)."""
    for path in paths:
        found = tree.lookup(path, follow=False)
        if found.fd is None:
            raise ImageError(f"can't write Apptainer's files into the image: {path} vanished while written")
        try:
            if stat.S_ISDIR(os.fstat(found.fd).st_mode):
                os.chmod(fd_path(found.fd, tree.proc), 0o755)
                written[path] = 0o755
        finally:
            os.close(found.fd)


def _ensure_link(tree: Tree, name: str, target: str) -> None:
    """[A] base_environment.go `makeSymlink`: made if missing, remade if it leads elsewhere, a non-link kept."""
    try:
        mode = os.stat(name, dir_fd=tree.fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        os.symlink(target, name, dir_fd=tree.fd)
        return
    if not stat.S_ISLNK(mode) or os.readlink(name, dir_fd=tree.fd) == target:
        return
    os.unlink(name, dir_fd=tree.fd)
    os.symlink(target, name, dir_fd=tree.fd)


def _keep_old_deffile(tree: Tree, written: dict[str, int]) -> None:
    """[A] metadata.go `insertDefinition`: an image's own definition goes to bootstrap_history/ApptainerN."""
    found = tree.lookup(DEFFILE, follow=False)
    if found.fd is None:
        return
    os.close(found.fd)
    history = tree.lookup(HISTORY)
    if history.fd is None:
        created = _created(history)
        history.fd = tree.make(history, directory=True)
        _fix_directory_modes(tree, created, written)
    try:
        if not stat.S_ISDIR(os.fstat(history.fd).st_mode):
            raise ImageError(f"can't write Apptainer's files into the image: {HISTORY} is not a directory")
        count = len(os.listdir(fd_path(history.fd, tree.proc)))
        found = tree.lookup(DEFFILE, follow=False)  # again: a Tree holds a lookup's parent until the next one
        if found.fd is not None:
            os.close(found.fd)
            os.rename(found.name, f"Apptainer{count}", src_dir_fd=found.parent, dst_dir_fd=history.fd)
    finally:
        os.close(history.fd)


_WRITE = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def _write_file(tree: Tree, guest: str, content: bytes, mode: int, written: dict[str, int]) -> str:
    """`guest` (links followed inside the tree) holding `content` with `mode`: see the module's docstring.
    Returns the path written, links resolved."""
    found = tree.lookup(guest)
    path = found.path
    if found.fd is None:
        parents = _created(found)[:-1]
        fd = tree.make(found, directory=False)
        try:
            _fix_directory_modes(tree, parents, written)
        except BaseException:
            os.close(fd)
            raise
    else:
        try:
            info = os.fstat(found.fd)
            if stat.S_ISDIR(info.st_mode):
                raise ImageError(f"can't write Apptainer's files into the image: {guest}{_leads(guest, found)} is "
                                 "a directory")
            if stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
                # As [A] makeFile: the mode first, so that a file its owner may not write can be rewritten.
                os.chmod(fd_path(found.fd, tree.proc), mode)
        finally:
            os.close(found.fd)
        fd = _reopen_or_replace(found, info)
    try:
        os.fchmod(fd, mode)
        write_all(fd, content)
    finally:
        os.close(fd)
    return path


def _reopen_or_replace(found: Lookup, info: os.stat_result) -> int:
    """A descriptor to write the existing file through: itself, truncated, when it is a regular file with no
    other link; else (a FIFO, a device, a socket, a file linked elsewhere) a new file in its place."""
    if stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
        fd = os.open(found.name, _WRITE | os.O_TRUNC, dir_fd=found.parent)
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) == (info.st_dev, info.st_ino) and stat.S_ISREG(now.st_mode):
            return fd
        os.close(fd)
        raise ImageError(f"can't write Apptainer's files into the image: {found.path} changed while written")
    os.unlink(found.name, dir_fd=found.parent)
    return os.open(found.name, _WRITE | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=found.parent)


def _leads(guest: str, found: Lookup) -> str:
    return "" if found.path == guest else f" (it leads to {found.path})"
