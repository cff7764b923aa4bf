"""Host facts, read once.

`capture()` is the only place that reads the invoking user's identity, the
process environment and the working directory; the planner receives the
resulting `HostInfo` as an argument, so tests can hand it any host they like.
"""

from __future__ import annotations

import os
import pwd

from singpy.record import Record

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:  # collections.abc (with collections, operator, keyword...) costs ~1.5 ms of every exec
    from collections.abc import Mapping


class HostInfo(Record):
    """The invoking user and process, as the launcher found them."""

    uid: int  # real user id
    gid: int  # real primary group id
    user: str  # login name (or the uid as text when the passwd database has none)
    gecos: str  # passwd comment field
    shell: str  # login shell
    home: str  # the passwd home directory ($HOME only for a uid the passwd database lacks)
    cwd: str  # working directory (logical: $PWD when it names the same directory)
    env: Mapping[str, str]  # the launcher's environment
    group: str  # name of the primary group (or the gid as text)


def capture(environ: Mapping[str, str] | None = None) -> HostInfo:
    """Snapshot the invoking user and process."""
    env = dict(os.environ if environ is None else environ)
    uid, gid = os.getuid(), os.getgid()
    try:
        entry = pwd.getpwuid(uid)
        user, gecos, shell, pw_home = entry.pw_name, entry.pw_gecos, entry.pw_shell, entry.pw_dir
    except KeyError:
        user, gecos, shell, pw_home = str(uid), "", "/bin/sh", env.get("HOME") or "/"
    return HostInfo(
        uid=uid,
        gid=gid,
        user=user,
        gecos=gecos,
        shell=shell,
        home=pw_home,  # never the caller's $HOME, as Apptainer: the container's HOME is the passwd entry's
        cwd=_logical_cwd(env.get("PWD")),
        env=env,
        group=_group_name(gid),
    )


def _logical_cwd(pwd_env: str | None) -> str:
    """$PWD keeps the user's symlinked path (as a shell shows it) when it is accurate."""
    physical = os.getcwd()
    if pwd_env and os.path.isabs(pwd_env):
        try:
            if os.path.samefile(pwd_env, physical):
                return pwd_env
        except OSError:
            pass
    return physical


def _group_name(gid: int) -> str:
    import grp  # only needed here

    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
