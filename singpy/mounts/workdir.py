"""-W/--workdir and -S/--scratch, as Apptainer 1.5 lays them out (its container_linux.go: addTmpMount,
addHomeStagingDir, addScratchMount).

With --contain, the host directories behind the container's /tmp and /var/tmp
are WORKDIR/tmp and WORKDIR/var_tmp (mode 1777), and the default home is
WORKDIR/home (0700); without --contain, /tmp and /var/tmp stay the host's and
the home the user's, as in Apptainer. A scratch directory PATH is
WORKDIR/scratch/PATH (0750, WORKDIR/scratch too) with --workdir, else an empty
tmpfs of the launch. The directories are the user's and outlive the container
(Apptainer leaves them too): a job reruns with what it left there, and
Slurm's $SLURM_TMPDIR goes with the job.

The planner calls the `plan_*` functions (pure apart from a stat of WORKDIR);
the launch makes the planned `HostDir`s with `make_host_dirs`, before any
namespace, as the invoking user.
"""

from __future__ import annotations

import os

from singpy.errors import SingpyError, UsageError
from singpy.plan import HostDir, Missing, MountOp, MountSpec, Stage
from singpy.record import Record

_TMP_MODE = "1777"  # sticky and writable by all, as /tmp (Apptainer: os.ModeSticky|0o777, umask cleared)
_HOME_MODE = "0700"
_SCRATCH_MODE = "0750"


def checked_workdir(value: str, cwd: str) -> str:
    """--workdir's directory, absolute and normalised: an existing directory (Apptainer fails later, making its
    tmp in a directory that isn't there)."""
    from singpy.host.hostfiles import path_problem, shown

    problem = path_problem(value) if value else "empty path"
    if problem:
        raise UsageError(f"bad --workdir {shown(value)!r}: {problem}")
    path = os.path.normpath(os.path.join(cwd, value))
    if not (os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)):
        reason = "is not a directory you can write to" if os.path.isdir(path) else "is not a directory"
        raise SingpyError(f"--workdir {shown(path)} {reason}",
                          hint="create it first (sites point --workdir at $SLURM_TMPDIR or $TMPDIR)")
    if os.stat(path).st_mode & 0o1002 == 0o002:  # anyone could rename its home or tmp and leave a link instead
        raise SingpyError(f"--workdir {shown(path)} is writable by everyone but not sticky",
                          hint="choose a directory of your own, or one sticky like /tmp (chmod +t)")
    return path


def checked_scratch(values: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """--scratch's paths (comma lists, repeatable): absolute, normalised, each once, never the root."""
    from singpy.host.hostfiles import path_problem, shown

    paths: dict[str, None] = {}
    for value in values:
        for raw in value.split(","):
            problem = path_problem(raw) if raw else "empty path"
            if not problem and not raw.startswith("/"):
                problem = "a scratch directory is an absolute path in the container"
            path = "/" + os.path.normpath(raw).lstrip("/") if not problem else ""
            if path == "/":
                problem = "the container's root can't be a scratch directory"
            if problem:
                raise UsageError(f"bad --scratch {shown(raw)!r}: {problem}")
            paths[path] = None
    return tuple(paths)


class WorkdirPlan(Record, kw_only=False):
    """The mounts with --workdir's and --scratch's changes, the host directories to make, and warnings."""

    mounts: list[MountSpec]
    host_dirs: tuple[HostDir, ...]
    warnings: tuple[str, ...]


def plan(mounts: list[MountSpec], *, workdir: str, scratch: tuple[str, ...], contain: bool, home_dest: str,
         default_home: bool, bind_control: bool) -> WorkdirPlan:
    """The planner's default mounts changed for --workdir (with --contain: /tmp, /var/tmp, an empty home) and
    --scratch added after them; with `user bind control = no`, as Apptainer, no /tmp nor /var/tmp at all (they
    would come from a user's directory) and no scratch directory, each with a warning."""
    dirs: list[HostDir] = []
    warnings: list[str] = []
    tmp_planned = any(_is_contained_tmp(spec) for spec in mounts)
    if workdir and contain and tmp_planned:
        mounts = [spec for spec in mounts if not _is_contained_tmp(spec)]
        if bind_control:
            tmp, tmp_dirs = plan_tmp(workdir)
            mounts += tmp
            dirs += tmp_dirs
        else:
            warnings.append("--workdir: no /tmp nor /var/tmp in the container: user bind control is disabled by "
                            "the system administrator")
    if workdir and contain and default_home:
        home = next((index for index, spec in enumerate(mounts) if spec.op == MountOp.TMPFS
                     and spec.dest == home_dest and spec.stage == Stage.HOME_TMP), None)
        if home is not None:  # --contain's empty home: WORKDIR/home instead of a tmpfs
            source, home_dir = plan_home(workdir)
            mounts[home] = mounts[home].replace(op=MountOp.BIND, source=source)
            dirs.append(home_dir)
    if scratch and not bind_control:
        warnings.append("--scratch ignored: user bind control is disabled by the system administrator")
    elif scratch:
        scratch_mounts, scratch_dirs = plan_scratch(scratch, workdir)
        mounts += scratch_mounts
        dirs += scratch_dirs
    return WorkdirPlan(mounts, tuple(dirs), tuple(warnings))


def _is_contained_tmp(spec: MountSpec) -> bool:
    return spec.op == MountOp.TMPFS and spec.dest in ("/tmp", "/var/tmp") and spec.stage == Stage.HOME_TMP


def plan_tmp(workdir: str) -> tuple[list[MountSpec], list[HostDir]]:
    """--contain with --workdir: /tmp and /var/tmp bound from WORKDIR/tmp and WORKDIR/var_tmp."""
    sources = (os.path.join(workdir, "tmp"), os.path.join(workdir, "var_tmp"))
    mounts = [MountSpec(op=MountOp.BIND, source=source, dest=dest, missing=Missing.SKIP, stage=Stage.HOME_TMP)
              for source, dest in zip(sources, ("/tmp", "/var/tmp"), strict=True)]
    return mounts, [HostDir(path=source, mode=_TMP_MODE) for source in sources]


def plan_home(workdir: str) -> tuple[str, HostDir]:
    """--contain with --workdir, the default home: WORKDIR/home, bound as the home (Apptainer's homeStage)."""
    path = os.path.join(workdir, "home")
    return path, HostDir(path=path, mode=_HOME_MODE)


def plan_scratch(paths: tuple[str, ...], workdir: str) -> tuple[list[MountSpec], list[HostDir]]:
    """--scratch: a tmpfs at each path, or with --workdir a bind of WORKDIR/scratch/PATH (made with its parents)."""
    if not workdir:
        return [MountSpec(op=MountOp.TMPFS, dest=path, stage=Stage.HOME_TMP) for path in paths], []
    top = os.path.join(workdir, "scratch")
    dirs = {top: None}
    mounts = []
    for path in paths:
        source = top
        for part in path.strip("/").split("/"):
            source = os.path.join(source, part)
            dirs[source] = None
        mounts.append(MountSpec(op=MountOp.BIND, source=source, dest=path, stage=Stage.HOME_TMP))
    return mounts, [HostDir(path=path, mode=_SCRATCH_MODE) for path in dirs]


def make_host_dirs(dirs: tuple[HostDir, ...]) -> None:
    """The planned directories, made where missing with exactly their mode (Apptainer clears the umask).

    One that exists is used as it is, as in Apptainer, but it must be a
    directory of its own: a symbolic link (planted in a shared workdir, say)
    would send the container's /tmp elsewhere, and another user's directory
    (made first in a shared workdir such as /tmp) would get the container's
    files, its owner free to read them or to swap the directory for a link.
    """
    for entry in dirs:  # all checked before any is made: a refused run leaves nothing in the workdir
        _refuse_unusable(entry.path)
    for entry in dirs:
        try:
            os.mkdir(entry.path)
        except FileExistsError:
            _refuse_unusable(entry.path)  # made meanwhile
            continue
        except OSError as error:
            from singpy.host.hostfiles import shown

            raise SingpyError(f"can't make work directory {shown(entry.path)}: {error.strerror}") from None
        # mkdir's mode would lose the bits the umask holds; chmod on a descriptor of what mkdir made, not on a name
        fd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchmod(fd, int(entry.mode, 8))
        finally:
            os.close(fd)


def _refuse_unusable(path: str) -> None:
    """Refuse an existing `path` that is not a directory of this user's (nothing there: fine)."""
    import stat

    from singpy.host.hostfiles import shown

    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as error:
        raise SingpyError(f"can't use work directory {shown(path)}: {error.strerror}") from None
    problem = ("not a directory" + (" (a symbolic link)" if stat.S_ISLNK(info.st_mode) else "")
               if not stat.S_ISDIR(info.st_mode)
               else f"a directory of another user (uid {info.st_uid})" if info.st_uid != os.geteuid() else "")
    if problem:
        raise SingpyError(f"{shown(path)} is in the way of the work directory: {problem}",
                          hint="remove it, or choose another --workdir")
