"""Instances: named containers that run in the background (`singpy instance start|list|stop`).

An instance is a shared-container holder (singpy.launch.shared) with a name: it
runs the image's startscript, outlives the shell that started it, and
`exec|run|shell instance://NAME` join its namespaces. Its state is a JSON
record per instance, and its logs, in the user's directory laid out as
Apptainer's (~/.apptainer/instances/{app,logs}/HOST/USER/): here under
~/.singpy/instances. Whether an instance runs is asked of its holder process,
not of the record: a holder killed with SIGKILL leaves a record that `list`
removes. A record's pid is of its starter's PID namespace (singpy.launch.pidview).

Instances belong to their owner alone. The holder's abstract socket has an
unpredictable name (`singpy-instance/UID/` and 128 random bits), chosen at
start and kept in the record: anyone can bind any abstract name, so a name
derived from the instance's would let another user take it first. The
directories must pass the cache's ownership rule (singpy.host.cachefiles.
check_owned: nobody else can have planted anything in them), checked again
once made; a record is read only from a regular file of the user, without
following a link, and written under a random name (O_EXCL | O_NOFOLLOW), then
renamed; a log is opened O_NOFOLLOW and must be a regular file of the user.
Root reads another user's records (`instance list|stop|stats --user`): what
they hold is untrusted. A record is used only under its own name (NAME.json
holding the name NAME, a valid one), its holder only while the process of
that pid is the user's, named as a holder, and started when the record says
(a pid reused since is not the instance), and its cgroup only if singpy made
it for that user and the holder is in it (`cgroup_of`).
Whether a name is taken is decided by its record (a running holder), and two
starts of one name at once by a lock on its log (`claim`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import stat
import time

from singpy.errors import SingpyError, UsageError
from singpy.host.hostfiles import kind_name, shown
from singpy.record import Record

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
PREFIX = "instance://"
_MAX_RECORD = 1 << 16  # bytes: a record is a few hundred


class InstanceRecord(Record):
    """What `instance list` shows, and what `exec instance://NAME` and `instance stop` need."""

    name: str
    pid: int  # the holder's
    image: str
    socket: str  # abstract socket name of the holder
    log_out: str
    log_err: str
    started: float  # time.time() at start
    cgroup: tuple[str, ...] = ()  # its cgroup's directories, when started with resource limits (singpy.cgroups)
    cgroup_version: int = 0  # 1 or 2 with a cgroup
    # its --security values (seccomp: an absolute path), which `exec|run|shell instance://NAME` inherit as Apptainer's
    # joins do (a feature the joining command gives itself wins: singpy.launch.planner)
    security: tuple[str, ...] = ()
    # the holder's start time (field 22 of /proc/PID/stat, clock ticks since boot), set by write_record: a process
    # that got the pid of a holder gone since is not the instance (0: unknown, an older record: not running)
    holder_start: int = 0
    pid_ns: int = 0  # the inode of the starter's /proc/self/ns/pid, whose pid `pid` is (0: an older record's: ours)
    ip: str = ""  # the container's address with --network bridge|ptp (singpy.launch.holdernet), as `list` shows it
    allow_setuid: bool = False  # started by root with --allow-setuid: root's joins too run without no_new_privs


def check_name(name: str) -> str:
    if not name or len(name) > 128 or not set(name) <= _NAME_CHARS or name.startswith("."):
        raise UsageError(f"bad instance name {name!r}: use letters, digits, '.', '_' and '-'")
    return name


def new_socket_name(uid: int) -> str:
    """The abstract socket name of an instance being started: nobody can guess it to bind it first."""
    return f"singpy-instance/{uid}/{os.urandom(16).hex()}"


def socket_name(home: str, user: str, uid: int, name: str) -> str:
    """The socket of the running instance NAME of the user (`home`, `user`, `uid` as singpy.host.host.capture found
    them), to join it: its record's, chosen at start."""
    records, _ = state_dirs(home, user)
    return find(records, name, uid).socket


def instance_cgroup(home: str, user: str, uid: int, name: str) -> tuple[str, ...]:
    """The cgroup directories of the running instance NAME (() without limits): a process joining it joins them."""
    records, _ = state_dirs(home, user)
    return cgroup_of(find(records, name, uid), uid)


def cgroup_of(record: InstanceRecord, uid: int) -> tuple[str, ...]:
    """The record's cgroup directories if they are its instance's, else (): a record names what its writer wants,
    and `stop` kills all in them. Only a cgroup singpy made for the user `uid` (singpy.cgroups.manager.made_for:
    its name, and where it is), with the holder in it."""
    if not record.cgroup:
        return ()
    from singpy.cgroups import manager, stats

    ours = manager.made_for(record.cgroup, record.cgroup_version, uid) and stats.member_of(record.pid, record.cgroup)
    return record.cgroup if ours else ()


def instance_record(home: str, user: str, uid: int, name: str) -> InstanceRecord:
    """The record of the running instance NAME (what it was started with), for a command joining it."""
    records, _ = state_dirs(home, user)
    return find(records, name, uid)


def state_dirs(home: str, user: str) -> tuple[str, str]:
    """(records, logs) directories of this user on this host, made private if missing.

    Refused (one error naming the directory) when someone else owns or can
    write it or a directory above it: they could have planted a record or a
    link there. Checked before and again after making them (a directory someone
    else made first in between is refused too).
    """
    from singpy.host.cachefiles import check_owned

    host = os.uname().nodename
    base = os.path.join(home, ".singpy", "instances")
    dirs = (os.path.join(base, "app", host, user), os.path.join(base, "logs", host, user))
    for path in dirs:
        check_owned(path, what="instance directory")
        _make_private(home, path)
        check_owned(path, what="instance directory")
    return dirs


def _make_private(home: str, path: str) -> None:
    """`path` and its missing parents below `home`, each made 0700 (os.makedirs makes the parents by the umask)."""
    missing = []
    while path != home and not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:  # made meanwhile by another start: check_owned judges it
            pass
        except OSError as error:
            raise SingpyError(f"can't create the instance directory {shown(directory)}: {error.strerror}") from None


def claim(logs: str, name: str) -> tuple[int, int, int]:
    """The instance's logs (stdout, stderr), opened to append, and a lock that no other start of NAME holds.

    The lock (flock on a descriptor of its own on the stdout log) is held by
    this start alone, until it closes it: the holder closes its copy, so a
    running instance is known by its record, not by the lock. Refused: a log
    that is a link (never followed: its target stays as it was), not a regular
    file, or not the user's.
    """
    import fcntl

    out = open_log(os.path.join(logs, f"{name}.out"), name)
    opened = [out]
    try:
        opened.append(open_log(os.path.join(logs, f"{name}.err"), name))
        lock = os.open(f"/proc/self/fd/{out}", os.O_RDONLY | os.O_CLOEXEC)  # the same file, a description of its own
        opened.append(lock)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SingpyError(f"instance {name} already exists (it is being started)") from None
    except BaseException:
        for fd in opened:
            os.close(fd)
        raise
    return out, opened[1], lock


def open_log(path: str, name: str) -> int:
    """A log of instance `name`, opened to append (made 0600 if missing); one SingpyError if it can't be used."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    problem = f"instance {name}: can't use its log"
    try:
        fd = os.open(path, flags, 0o600)  # O_NONBLOCK: a FIFO never blocks the open
    except OSError as error:
        why = {errno.ELOOP: "it is a symbolic link", errno.EISDIR: "it is a directory",
               errno.ENXIO: "it is not a regular file"}.get(error.errno or 0, error.strerror)
        raise SingpyError(f"{problem} {shown(path)}: {why}") from None
    info = os.fstat(fd)
    why = "" if stat.S_ISREG(info.st_mode) else f"it is {kind_name(info.st_mode)}, not a regular file"
    if not why and info.st_uid != os.geteuid():
        why = f"it belongs to uid {info.st_uid}, not to you"
    if why:
        os.close(fd)
        raise SingpyError(f"{problem} {shown(path)}: {why}")
    os.set_blocking(fd, True)  # the startscript's stdout and stderr, as a plain open gives them
    return fd


def write_record(records: str, record: InstanceRecord) -> None:
    """Atomically: a `list` running meanwhile sees the whole record or none.

    The partial file has an unpredictable name and is made with O_EXCL |
    O_NOFOLLOW: nothing already there is ever written through. The holder's
    start time is read here, once it runs (`is_alive` compares it).
    """
    if not record.holder_start:
        record = record.replace(holder_start=start_time(record.pid))
    if not record.pid_ns:
        from singpy.launch import pidview

        record = record.replace(pid_ns=pidview.own())
    path = os.path.join(records, f"{record.name}.json")
    partial = os.path.join(records, f".{record.name}.{os.urandom(8).hex()}.partial")
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(record.as_dict(), out, indent=2)
        os.replace(partial, path)
    except OSError as error:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise SingpyError(f"can't write the record of instance {record.name} in {shown(records)}: "
                          f"{error.strerror}") from None


def running(records: str, uid: int, *, owner: int | None = None) -> list[InstanceRecord]:
    """The user's instances that run, by name, as this PID namespace sees them (`_seen`); records of ended ones
    are removed (not for root looking at another user's: `owner`, their uid, whose files are only read), those
    out of sight here are neither listed nor removed."""
    found = []
    try:
        entries = sorted(os.listdir(records))
    except FileNotFoundError:  # another user's, who never started an instance here
        return []
    for entry in entries:
        if not entry.endswith(".json"):
            continue
        record = _read(os.path.join(records, entry), owner)
        seen = _seen(record, uid) if record is not None else None
        if isinstance(seen, InstanceRecord):
            found.append(seen)
        elif seen is None and owner is None:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(records, entry))
    return found


def find(records: str, name: str, uid: int, owner: int | None = None) -> InstanceRecord:
    seen = _seen_by_name(records, name, uid, owner)
    if seen is _ELSEWHERE:
        raise SingpyError(f"instance {name} runs in another PID namespace, out of sight here: use it from there")
    if not isinstance(seen, InstanceRecord):
        raise SingpyError(f"no instance found with name {name}")
    return seen


def refuse_running(records: str, name: str, uid: int) -> None:
    """A name is taken while its record names a running holder (the user's own: the records are private), or one
    out of sight in another PID namespace."""
    seen = _seen_by_name(records, name, uid)
    if seen is _ELSEWHERE:
        raise SingpyError(f"instance {name} already exists (in another PID namespace)")
    if seen is not None:
        raise SingpyError(f"instance {name} already exists")


def out_of_sight(records: str, name: str, uid: int, owner: int | None = None) -> bool:
    """Whether NAME's record is of another PID namespace, whose holder can't be looked for from here."""
    return _valid_name(name) and _seen_by_name(records, name, uid, owner) is _ELSEWHERE


def _seen_by_name(records: str, name: str, uid: int, owner: int | None = None) -> InstanceRecord | str | None:
    record = _read(os.path.join(records, f"{check_name(name)}.json"), owner)
    return _seen(record, uid) if record is not None else None


_ELSEWHERE = "elsewhere"  # `_seen`: a record of another PID namespace whose holder can't be looked for from here


def _seen(record: InstanceRecord, uid: int) -> InstanceRecord | str | None:
    """The record as this PID namespace sees it, if its holder runs: its pid made ours (singpy.launch.pidview);
    None if it has ended; _ELSEWHERE if that can't be told from here."""
    if record.pid_ns:
        from singpy.launch import pidview

        here = pidview.own()
        if here and record.pid_ns != here:
            local = pidview.locate(record.pid, record.pid_ns, uid)
            if local == pidview.OUT_OF_SIGHT:
                return _ELSEWHERE
            if not local:
                return None
            record = record.replace(pid=local, pid_ns=here)
    return record if is_alive(record, uid) else None


def _read(path: str, owner: int | None = None) -> InstanceRecord | None:
    """The record at `path`; None when there is none, or what is there is not a record the user wrote.

    Not through a link, from a regular file of the user only (of `owner` when root reads another user's), of a
    bounded size (cachefiles.read_private).
    """
    from singpy.host.cachefiles import read_private

    data = read_private(path, _MAX_RECORD + 1) if owner is None else _read_owned(path, owner)
    if data is None or len(data) > _MAX_RECORD:
        return None
    try:
        return _record(json.loads(data), os.path.basename(path).removesuffix(".json"))
    except (ValueError, RecursionError):
        return None


def _read_owned(path: str, owner: int) -> bytes | None:
    """Root reading a record of user `owner`: a regular file of theirs, not through a link, bounded."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != owner:
            return None
        return os.read(fd, _MAX_RECORD + 1)
    finally:
        os.close(fd)


def user_dirs(home: str, user: str, uid: int) -> tuple[str, str]:
    """(records, logs) of another user (root's --user): checked as theirs (check_owned), never made."""
    from singpy.host.cachefiles import check_owned

    base = os.path.join(home, ".singpy", "instances")
    dirs = (os.path.join(base, "app", os.uname().nodename, user), os.path.join(base, "logs", os.uname().nodename,
                                                                                user))
    for path in dirs:
        check_owned(path, what="instance directory", uid=uid)
    return dirs


_FIELDS = (("name", str), ("pid", int), ("image", str), ("socket", str), ("log_out", str), ("log_err", str),
           ("started", (int, float)))
_OPTIONAL = (("cgroup", list), ("cgroup_version", int),  # only in the records of instances with a cgroup
             ("security", list), ("holder_start", int),  # ...with --security; (none in an older singpy's)
             ("pid_ns", int), ("ip", str), ("allow_setuid", bool))
_KNOWN = frozenset(name for name, _ in _OPTIONAL)


def _record(data: object, stem: str) -> InstanceRecord | None:
    """A record's JSON as InstanceRecord, each field of its type; None for anything else, or one not named as its
    file `stem`.json: root's `instance stop --user` removes the file of the name it holds. A field it doesn't
    know (a later singpy's) is left out: an older singpy refused such a record, and its `list` removed it."""
    required = {name for name, _ in _FIELDS}
    if not isinstance(data, dict) or not required <= set(data):
        return None
    data = {name: value for name, value in data.items() if name in required or name in _KNOWN}
    if data["name"] != stem or not _valid_name(stem):
        return None
    for name, kind in (*_FIELDS, *_OPTIONAL):
        if name in data and (not isinstance(data[name], kind) or isinstance(data[name], bool) and kind is not bool):
            return None
    lists = ("cgroup", "security")
    if data["pid"] <= 0 or not all(isinstance(item, str) for key in lists for item in data.get(key, ())):
        return None
    return InstanceRecord(**{**data, **{key: tuple(data.get(key, ())) for key in lists}})


def _valid_name(name: str) -> bool:
    try:
        check_name(name)
    except UsageError:
        return False
    return True


def is_alive(record: InstanceRecord, uid: int) -> bool:
    """Whether the record's holder still runs: our process, named as a holder, not a zombie, started when the
    record says (a pid reused since, even by another instance's holder, is not this one).

    Asked of /proc, not of the holder's socket: a process that connects is one
    the holder signals when the instance is stopped (`instance stop` would be).
    """
    try:
        owner = os.stat(f"/proc/{record.pid}").st_uid
    except OSError:
        return False
    found = _proc_stat(record.pid)
    if found is None or owner != uid:
        return False
    name, state, started = found
    # A record of an older singpy has no start time: judged as that singpy judged it (an upgrade must not orphan
    # the instances it started; a record a user forges so reaches only that user's own processes named so)
    return name == b"singpy-instance" and state not in (b"Z", b"X") and record.holder_start in (0, started)


def start_time(pid: int) -> int:
    """When process `pid` started (clock ticks since boot); 0 if it is gone."""
    found = _proc_stat(pid)
    return found[2] if found else 0


def _proc_stat(pid: int) -> tuple[bytes, bytes, int] | None:
    """(name, state, start time) of process `pid` from /proc/PID/stat; None if it is gone.

    The name is between the first "(" and the last ")": it may hold anything, ") " too.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return None
    head, _, rest = text.rpartition(b")")
    fields = rest.split()  # from field 3 (the state) on: the start time is field 22
    if len(fields) < 20 or not fields[19].isdigit():
        return None
    return head.partition(b"(")[2], fields[0], int(fields[19])


def stop(records: str, record: InstanceRecord, uid: int, *, signum: int, timeout: float, force: bool) -> None:
    """Signal the instance and wait until it has gone; SIGKILL after `timeout` seconds (at once with force).

    The holder removes its record as it ends, but not when killed. Its cgroup, if any, is removed here once
    it has gone: only one singpy made, with the holder seen in it (`cgroup_of`). The record removed is the file
    of its name (`_record`: a valid name, the file's).
    """
    if not 0 <= timeout < float("inf"):  # (nan too: a deadline never reached, a stop never ending)
        raise UsageError(f"--timeout {timeout:g}: a number of seconds, 0 or more")
    cgroup = cgroup_of(record, uid)
    _stop(record, uid, signum=signum, timeout=timeout, force=force)
    if cgroup:
        from singpy.cgroups import manager
        from singpy.plan import CgroupSpec

        manager.remove(CgroupSpec(version=record.cgroup_version, dirs=cgroup, writes=()))
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(records, f"{check_name(record.name)}.json"))


def _stop(record: InstanceRecord, uid: int, *, signum: int, timeout: float, force: bool) -> None:
    """The signal to the holder, which passes it on and ends once they have; past `timeout` (at once with force)
    the whole instance is killed (singpy.launch.stoptree): a SIGKILL to the holder alone leaves its processes."""
    holder = _holder(record, uid)
    if holder is None:  # ended meanwhile
        return
    try:
        deadline = time.monotonic() + timeout
        if not force:
            _signal(record.pid, holder, signum)
            while is_alive(record, uid) and time.monotonic() <= deadline:
                time.sleep(0.02)
        if is_alive(record, uid):
            from singpy.launch import stoptree

            stoptree.kill_tree(record.pid, holder)
            deadline = time.monotonic() + 5.0
            while is_alive(record, uid):
                if time.monotonic() > deadline:
                    raise SingpyError(f"instance {record.name} (pid {record.pid}) did not stop")
                time.sleep(0.02)
    finally:
        if holder >= 0:
            os.close(holder)


def _holder(record: InstanceRecord, uid: int) -> int | None:
    """A pidfd of the record's holder, opened before checking it is the holder: every signal through it reaches
    that process or none, never the pid's next owner. -1 where the kernel has none (< 5.3: signalled by pid); None
    if the holder has gone."""
    try:
        pidfd = os.pidfd_open(record.pid)
    except ProcessLookupError:
        return None
    except OSError:  # ENOSYS
        pidfd = -1
    if not is_alive(record, uid):
        if pidfd >= 0:
            os.close(pidfd)
        return None
    return pidfd


def _signal(pid: int, pidfd: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        if pidfd >= 0:
            signal.pidfd_send_signal(pidfd, signum)
        else:
            os.kill(pid, signum)


def parse_signal(text: str) -> int:
    """A signal as `instance stop --signal` takes it: a number (1 to NSIG - 1), TERM or SIGTERM."""
    if text.isascii() and text.isdigit():
        if len(text) > 4 or not 1 <= int(text) < signal.NSIG:  # (str to int is bounded: 4300 digits)
            raise UsageError(f"unknown signal {text!r}: a signal's number is 1 to {signal.NSIG - 1}")
        return int(text)
    name = text.upper() if text.upper().startswith("SIG") else f"SIG{text.upper()}"
    try:
        return int(signal.Signals[name])
    except KeyError:
        raise UsageError(f"unknown signal {text!r}") from None
