"""An instance's pids as this PID namespace sees them (singpy.launch.instance).

A record names its holder by a pid of the PID namespace of the `instance
start` that wrote it (a start inside `unshare -p`, or inside a container
with --pid), and says which one: the inode of that start's
/proc/self/ns/pid. Elsewhere that pid means another process, or none: a
`list` there must not take the instance for an ended one (and remove its
record), nor a `stop` signal whatever has that pid there.

From a PID namespace above the record's, the holder is in our /proc: the
process of ours in that namespace whose innermost pid (the last of NSpid in
its status) is the record's; its entry in /proc is its pid here (a /proc of
our own namespace: checked). From the host's (the initial) namespace every
process is in sight, so a holder not found has ended. From anywhere else
nothing can be said: the record is out of sight, neither running nor ended.
"""

from __future__ import annotations

import os

_INIT_PID_NS = 0xEFFFFFFC  # PROC_PID_INIT_INO: the inode of the initial PID namespace, on every kernel
OUT_OF_SIGHT = -1


def own() -> int:
    """The inode of our PID namespace; 0 when it can't be read (no /proc): records are then judged as before."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def locate(pid: int, namespace: int, uid: int) -> int:
    """Our pid of the process of `uid` that is `pid` in PID namespace `namespace`; 0 when it surely has gone (we
    are in the initial namespace, which sees all); OUT_OF_SIGHT when it can't be told from here.

    The caller still checks that process is the holder (its name, its start time: an inode, a pid of an ended
    namespace may be a new one's)."""
    if not _proc_is_ours():
        return OUT_OF_SIGHT
    suffix = f"[{namespace}]"
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid or not os.readlink(f"/proc/{entry}/ns/pid").endswith(suffix):
                continue
        except OSError:  # gone, or not ours to look at
            continue
        if _innermost(int(entry)) == pid:
            return int(entry)
    return 0 if own() == _INIT_PID_NS else OUT_OF_SIGHT


def _proc_is_ours() -> bool:
    """Whether /proc is of our PID namespace (its numbers are our pids): not a parent's, left mounted."""
    try:
        return os.readlink("/proc/self") == str(os.getpid())
    except OSError:
        return False


def _innermost(pid: int) -> int:
    """The pid of process `pid` in its own PID namespace (the last of the NSpid line); 0 if gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"NSpid:"):
                    last = line.split()[-1]
                    return int(last) if last.isdigit() else 0
    except OSError:
        pass
    return 0
