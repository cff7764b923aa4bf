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
    group: str  # name of the primary group ("" when the host's group database has none)
    groups: tuple[tuple[int, str], ...] = ()  # the other groups with an entry there, (gid, name): getgroups(2)'s
    # order, then the passwd entry's group (Apptainer writes them all into the container's /etc/group)


def capture(environ: Mapping[str, str] | None = None) -> HostInfo:
    """Snapshot the invoking user and process."""
    env = dict(os.environ if environ is None else environ)
    uid, gid = os.getuid(), os.getgid()
    try:
        entry = pwd.getpwuid(uid)
        user, gecos, shell, pw_home = entry.pw_name, entry.pw_gecos, entry.pw_shell, entry.pw_dir
        wanted = [gid, *os.getgroups(), entry.pw_gid]
    except KeyError:
        user, gecos, shell, pw_home = str(uid), "", "/bin/sh", env.get("HOME") or "/"
        wanted = [gid, *os.getgroups()]
    names = group_names(wanted)
    return HostInfo(
        uid=uid,
        gid=gid,
        user=user,
        gecos=gecos,
        shell=shell,
        home=pw_home,  # never the caller's $HOME, as Apptainer: the container's HOME is the passwd entry's
        cwd=_logical_cwd(env.get("PWD")),
        env=env,
        group=names.get(gid, ""),
        groups=tuple((other, names[other]) for other in dict.fromkeys(wanted) if other != gid and other in names),
    )


def root_entry() -> tuple[str, str, str]:
    """The host's uid-0 passwd entry (name, gecos, shell): what --fakeroot adds to an image's /etc/passwd without
    a root line (docs/isolation.md says how Apptainer differs); root's usual values where the host has no entry."""
    found = account(0)
    return (found[0], found[2], found[3]) if found else ("root", "root", "/bin/sh")


def account(uid: int) -> tuple[str, int, str, str] | None:
    """The host's passwd entry of `uid`: (name, primary gid, gecos, shell); None where it has none."""
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return None
    return entry.pw_name, entry.pw_gid, entry.pw_gecos, entry.pw_shell


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


def group_names(gids: list[int]) -> dict[int, str]:
    """The names of `gids` in the host's group database; a gid without an entry has none.

    /etc/group is read once, in one pass, for all of them: getgrgid(3) would
    read it again for each (a user may have dozens of groups). Only a gid it
    lacks (a group of LDAP, sssd, systemd) is asked of NSS, one call each.
    """
    wanted = set(gids)
    names: dict[int, str] = {}
    try:
        with open("/etc/group", "rb") as handle:  # the host's own file, root's: no user names it
            data = handle.read(_GROUP_LIMIT)
    except OSError:
        data = b""
    for line in data.split(b"\n"):
        fields = line.split(b":", 3)
        # NIS compat lines (+name, -name) name no group of their own; the first entry of a gid wins, as in NSS
        if len(fields) == 4 and fields[0] and fields[2].isdigit() and not line.startswith((b"+", b"-")):
            gid = int(fields[2])
            if gid in wanted and gid not in names:
                names[gid] = os.fsdecode(fields[0])
    missing = wanted - names.keys()
    if missing:
        import grp  # only for groups /etc/group lacks

        for gid in missing:
            try:
                names[gid] = grp.getgrgid(gid).gr_name
            except (KeyError, OverflowError):
                continue
    return names


_GROUP_LIMIT = 16 << 20  # the host's /etc/group: as the image's (singpy.mounts.apply.IDENTITY_LIMIT)
