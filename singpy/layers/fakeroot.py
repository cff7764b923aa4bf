"""--fakeroot: root inside the container (uid 0, capabilities valid only in its user namespace), the user outside.

Two mappings, chosen at plan time ([1] user_namespaces(7), "User and group ID
mappings: uid_map and gid_map"; [2] newuidmap(1)):

* The user has a subordinate range in /etc/subuid and /etc/subgid: uid 0
  inside is the user, 1..N are the ids of that range, so tools that chown
  (apt-get, dpkg, tar) work. Only the setuid helpers newuidmap/newgidmap may
  write such a map, and a process cannot run them on itself once inside
  (a setuid file owned by an unmapped root gives no privilege there). So the
  launcher forks a helper *before* unsharing, unshares, tells the helper to
  go; the helper runs newuidmap/newgidmap on the launcher's pid from outside,
  reports, exits. The launcher stays the process that becomes the payload.
  Of the user's lines one is mapped, as Apptainer's GetIDRange picks it
  (the rule of singpy.config.subid's `find`): the first of 65536 ids, else
  the largest above 65536; lines of fewer ids map nothing.
* Otherwise a single mapping (uid 0 inside = the user), which a process may
  write for itself once `setgroups` is denied; other ids do not exist inside.
"""

from __future__ import annotations

import os

from singpy.constants import SYSTEM_PATH
from singpy.errors import KernelError, SingpyError
from singpy.host.hostfiles import read_bounded, spawn_reading, which
from singpy.kernel import syscalls as k
from singpy.kernel.idmap import write_proc_file
from singpy.launch.process import fork_tied
from singpy.plan import IdMap

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    import signal  # the same constants, typed
    from typing import NoReturn
else:  # the C module, as singpy.launch.process: `signal` would load enum on the way
    import _signal as signal

SUBUID, SUBGID = "/etc/subuid", "/etc/subgid"
RANGE = 65536  # the count of a fakeroot range (Apptainer's validRangeCount)
_ID_END = 1 << 32  # ids are 32-bit: a range past this can't be mapped
_LIMIT = 4 << 20  # bytes of a subid file read at most
TOOL_PATH = SYSTEM_PATH  # where newuidmap/newgidmap live (never the user's $PATH: they are setuid helpers)


def read_ranges(text: str, user: str, uid: int) -> tuple[tuple[int, int], ...]:
    """(first id, count) of every `user:first:count` (or `uid:first:count`) line, in file order."""
    ranges = []
    for line in text.splitlines():
        fields = line.strip().split(":")
        if len(fields) != 3 or fields[0] not in (user, str(uid)):
            continue
        if all(field.isascii() and field.isdigit() for field in fields[1:]) and int(fields[2]) > 0 \
                and int(fields[1]) + int(fields[2]) <= _ID_END:
            ranges.append((int(fields[1]), int(fields[2])))
    return tuple(ranges)


def pick_range(ranges: tuple[tuple[int, int], ...]) -> tuple[int, int] | None:
    """The one range --fakeroot maps, as Apptainer picks it: the first of 65536 ids, else the first of the
    largest above 65536; None when every range is smaller."""
    for first, count in ranges:
        if count == RANGE:
            return first, count
    large = [item for item in ranges if item[1] > RANGE]
    return max(large, key=lambda item: item[1]) if large else None


def own_id_map(*, ignore_subuid: bool = False, ignore_userns: bool = False, building: bool = False) -> IdMap:
    """`fakeroot_id_map` for the calling user (named as the password database says, else by uid)."""
    import pwd

    uid = os.getuid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    return fakeroot_id_map(uid=uid, gid=os.getgid(), user=user, ignore_subuid=ignore_subuid,
                           ignore_userns=ignore_userns, building=building)


def fakeroot_id_map(*, uid: int, gid: int, user: str, ignore_subuid: bool = False, ignore_userns: bool = False,
                    building: bool = False) -> IdMap:
    """`plan_id_map` under Apptainer's hidden --ignore-subuid and --ignore-userns (the switches its tests use to
    force one of its fakeroot modes), as its launcher and build decide for a user (root: neither applies).

    --ignore-userns takes away the single mapping: a root-mapped user namespace the user makes alone, which is
    what Apptainer then gives up for its fakeroot command, a mode singpy does not have. A launch with a range
    still goes on, as Apptainer's (it does not look at the flag then); a build refuses both, as Apptainer's.
    """
    idmap = plan_id_map(uid=uid, gid=gid, user=user, ignore_subuid=ignore_subuid and uid != 0)
    if not ignore_userns or uid == 0:
        return idmap
    if not idmap.helper:
        what = "building from a definition file unprivileged" if building else "--fakeroot"
        raise SingpyError(f"{what} requires either being in {SUBUID}, unprivileged user namespaces or the fakeroot "
                          "command: --ignore-userns leaves none (singpy has no fakeroot command mode)")
    if building:
        raise SingpyError(f"{SUBUID} mapping found but no user namespace available for fakeroot (--ignore-userns)",
                          hint=f"the {SUBUID} mapping can be ignored with --ignore-subuid")
    return idmap


def plan_id_map(*, uid: int, gid: int, user: str, subuid: str = SUBUID, subgid: str = SUBGID,
                ignore_subuid: bool = False) -> IdMap:
    """The mapping --fakeroot will use for `user`; the note says which and why."""
    single = ((0, uid, 1),), ((0, gid, 1),)
    if ignore_subuid:
        return IdMap(uids=single[0], gids=single[1], helper=False,
                     note=f"fakeroot: --ignore-subuid: single mapping, uid 0 inside is uid {uid} outside and no "
                          "other id exists inside")
    uid_range = pick_range(read_ranges(_read(subuid), user, uid))
    gid_range = pick_range(read_ranges(_read(subgid), user, uid))
    if uid_range is None or gid_range is None:
        missing = subuid if uid_range is None else subgid
        return IdMap(uids=single[0], gids=single[1], helper=False,
                     note=f"fakeroot: no range for {user} in {missing}: single mapping, uid 0 inside is uid {uid} "
                          f"outside and no other id exists inside (a range has {RANGE} ids or more)")
    if not (find_tool("newuidmap") and find_tool("newgidmap")):
        return IdMap(uids=single[0], gids=single[1], helper=False,
                     note=f"fakeroot: newuidmap/newgidmap not found in {TOOL_PATH}: single mapping, uid 0 inside "
                          f"is uid {uid} outside, although {user} has subordinate ranges")
    uids, gids = single[0] + ((1, *uid_range),), single[1] + ((1, *gid_range),)
    first, count = uid_range
    return IdMap(uids=uids, gids=gids, helper=True,
                 note=f"fakeroot: subordinate ranges ({subuid}, {subgid}) through newuidmap/newgidmap: uid 0 "
                      f"inside is uid {uid} outside; ids 1-{count} to {first}-{first + count - 1}")


def _read(path: str) -> str:
    """The file's text; bytes that are not UTF-8 (another user's line in Latin-1) read as U+FFFD, which no
    user name or number matches: those lines are skipped, as any line singpy can't read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return ""  # no file: no ranges, as for a user without an entry
    try:
        if os.fstat(fd).st_mode & 0o170000 != 0o100000:  # a FIFO or a device must not block or feed us
            return ""
        data = read_bounded(fd, _LIMIT)
    except OSError:
        return ""
    finally:
        os.close(fd)
    if len(data) > _LIMIT:
        data = data[:data.rfind(b"\n", 0, _LIMIT) + 1]  # whole lines only: a cut one would read as another range
    return data.decode(errors="replace")


def find_tool(name: str) -> str | None:
    return which(name, TOOL_PATH)


def enter_user_namespace(idmap: IdMap, flags: int) -> None:
    """unshare(flags) (CLONE_NEWUSER among them) and install `idmap`; in the launcher's only thread."""
    if not idmap.helper:
        k.unshare(flags)
        write_proc_file("/proc/self/setgroups", "deny")  # required before an unprivileged gid_map write
        write_proc_file("/proc/self/uid_map", _lines(idmap.uids))
        write_proc_file("/proc/self/gid_map", _lines(idmap.gids))
        return
    target = os.getpid()
    go_read, go_write = os.pipe2(os.O_CLOEXEC)
    done_read, done_write = os.pipe2(os.O_CLOEXEC)
    helper = fork_tied()  # dies with the launcher: it must never map ids onto a stranger reusing its pid
    if helper == 0:
        os.close(go_write)
        os.close(done_read)
        _map_from_outside(target, idmap, go_read, done_write)
    os.close(go_read)
    os.close(done_write)
    try:
        try:
            k.unshare(flags)
            os.write(go_write, b"go")
        finally:
            os.close(go_write)  # on failure the helper reads end-of-file and leaves without mapping
        report = _read_all(done_read)
    finally:
        os.close(done_read)
        _, status = os.waitpid(helper, 0)
    if not report and status != 0:  # killed before it could say anything: the maps may be missing
        report = f"can't map ids for --fakeroot: the helper running newuidmap {_ended(status)}"
    if report:
        raise KernelError(report)


def _ended(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"was killed by signal {os.WTERMSIG(status)}"
    return f"exited with status {os.waitstatus_to_exitcode(status)}"


def _map_from_outside(target: int, idmap: IdMap, go: int, done: int) -> NoReturn:
    """The helper: wait for the launcher to unshare, run newuidmap and newgidmap on it, report errors."""
    report = ""
    try:
        if os.read(go, 2) == b"go":
            report = _run_map_tool("newuidmap", target, idmap.uids) or _run_map_tool("newgidmap", target, idmap.gids)
    except BaseException as error:  # never let a forked child unwind into the launcher's code
        report = f"can't map ids for --fakeroot: {error}"
    try:
        os.write(done, report.encode())
    finally:
        os._exit(0)


def _run_map_tool(name: str, target: int, lines: tuple[tuple[int, int, int], ...]) -> str:
    """Run newuidmap or newgidmap on `target`: "", or what went wrong. Spawned, not through `subprocess`: its
    import (~8 ms with what it loads) was most of what --fakeroot added to a launch (benchmarks/README.md)."""
    tool = find_tool(name)
    if tool is None:
        return f"can't map ids for --fakeroot: {name} not found in {TOOL_PATH}"
    argv = [tool, str(target), *(str(number) for line in lines for number in line)]
    code, errors = spawn_reading(argv, {"PATH": TOOL_PATH}, 2,  # its standard error; its output is never read
                                 ((os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),), _IGNORED_BY_PYTHON)
    if code == 0:
        return ""
    said = [line.strip() for line in errors.decode(errors="replace").splitlines() if line.strip()]
    report = f"can't map ids for --fakeroot with {name}: {said[-1] if said else f'exit status {code}'}"
    from singpy.host.hostcheck import map_tool_failure

    why = map_tool_failure(name, tool)
    return f"{report}: {why}" if why else report


_IGNORED_BY_PYTHON = (signal.SIGPIPE, signal.SIGXFSZ)  # their defaults back for a tool (subprocess's restore_signals)


def _lines(lines: tuple[tuple[int, int, int], ...]) -> str:
    return "".join(f"{inside} {outside} {count}\n" for inside, outside, count in lines)


def _read_all(fd: int) -> str:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")
