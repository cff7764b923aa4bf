"""Instances: named containers that run in the background (`singpy instance start|list|stop`).

An instance is a shared-container holder (singpy.shared) with a name: it
runs the image's startscript, outlives the shell that started it, and
`exec|run|shell instance://NAME` join its namespaces. Its state is a JSON
record per instance, and its logs, in the user's directory laid out as
Apptainer's (~/.apptainer/instances/{app,logs}/HOST/USER/): here under
~/.singpy/instances. Whether an instance runs is asked of its holder process,
not of the record: a holder killed with SIGKILL leaves a record that `list`
removes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

from singpy.errors import SingpyError, UsageError
from singpy.record import Record

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
PREFIX = "instance://"


class InstanceRecord(Record):
    """What `instance list` shows, and what `exec instance://NAME` and `instance stop` need."""

    name: str
    pid: int  # the holder's
    image: str
    socket: str  # abstract socket name of the holder
    log_out: str
    log_err: str
    started: float  # time.time() at start


def check_name(name: str) -> str:
    if not name or len(name) > 128 or not set(name) <= _NAME_CHARS or name.startswith("."):
        raise UsageError(f"bad instance name {name!r}: use letters, digits, '.', '_' and '-'")
    return name


def socket_name(uid: int, name: str) -> str:
    return f"singpy-instance/{uid}/{name}"


def state_dirs(home: str, user: str) -> tuple[str, str]:
    """(records, logs) directories of this user on this host, made private if missing."""
    host = os.uname().nodename
    base = os.path.join(home, ".singpy", "instances")
    dirs = (os.path.join(base, "app", host, user), os.path.join(base, "logs", host, user))
    for path in dirs:
        os.makedirs(path, mode=0o700, exist_ok=True)
    return dirs


def write_record(records: str, record: InstanceRecord) -> None:
    """Atomically: a `list` running meanwhile sees the whole record or none."""
    path = os.path.join(records, f"{record.name}.json")
    partial = f"{path}.{os.getpid()}.partial"
    with open(partial, "w") as out:
        json.dump(record.as_dict(), out, indent=2)
    os.replace(partial, path)


def running(records: str, uid: int) -> list[InstanceRecord]:
    """The user's instances that run, by name; records of dead ones are removed."""
    found = []
    for entry in sorted(os.listdir(records)):
        if not entry.endswith(".json"):
            continue
        record = _read(os.path.join(records, entry))
        if record is not None and is_alive(record, uid):
            found.append(record)
        else:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(records, entry))
    return found


def find(records: str, name: str, uid: int) -> InstanceRecord:
    record = _read(os.path.join(records, f"{check_name(name)}.json"))
    if record is None or not is_alive(record, uid):
        raise SingpyError(f"no instance found with name {name}")
    return record


def _read(path: str) -> InstanceRecord | None:
    try:
        with open(path) as source:
            data = json.load(source)
        return InstanceRecord(**data)
    except (OSError, ValueError, TypeError):
        return None


def is_alive(record: InstanceRecord, uid: int) -> bool:
    """Whether the record's holder still runs: our process, named as a holder, not a zombie.

    Asked of /proc, not of the holder's socket: a process that connects is one
    the holder signals when the instance is stopped (`instance stop` would be).
    """
    try:
        owner = os.stat(f"/proc/{record.pid}").st_uid
        with open(f"/proc/{record.pid}/stat", "rb") as stat:
            fields = stat.read()
    except OSError:
        return False
    name, _, rest = fields.partition(b") ")
    return owner == uid and name.endswith(b"(singpy-instance") and not rest.startswith((b"Z", b"X"))


def stop(records: str, record: InstanceRecord, uid: int, *, signum: int, timeout: float, force: bool) -> None:
    """Signal the instance and wait until it has gone; SIGKILL after `timeout` seconds (at once with force).

    The holder removes its record as it ends, but not when killed.
    """
    _stop(record, uid, signum=signum, timeout=timeout, force=force)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(records, f"{record.name}.json"))


def _stop(record: InstanceRecord, uid: int, *, signum: int, timeout: float, force: bool) -> None:
    _signal(record.pid, signal.SIGKILL if force else signum)
    deadline = time.monotonic() + timeout
    while is_alive(record, uid):
        if time.monotonic() > deadline:
            _signal(record.pid, signal.SIGKILL)
            deadline = time.monotonic() + 5.0
            if not force:
                force = True
                continue
            raise SingpyError(f"instance {record.name} (pid {record.pid}) did not stop")
        time.sleep(0.02)


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def parse_signal(text: str) -> int:
    """A signal as `instance stop --signal` takes it: a number, TERM or SIGTERM."""
    if text.isdigit():
        return int(text)
    name = text.upper() if text.upper().startswith("SIG") else f"SIG{text.upper()}"
    try:
        return int(signal.Signals[name])
    except KeyError:
        raise UsageError(f"unknown signal {text!r}") from None
