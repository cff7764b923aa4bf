"""User and group id maps for a new user namespace.

The invoking user is mapped to themselves (uid U outside is U inside), so
files they create in bound host directories carry their own ids. A process
may write a single-id map for itself once `setgroups` is denied
(user_namespaces(7), "Interaction with setgroups").
"""

from __future__ import annotations

from singpy.errors import KernelError


def write_id_maps(uid: int, gid: int, pid: str = "self") -> None:
    """Map `uid`/`gid` to themselves in the user namespace of process `pid`."""
    write_proc_file(f"/proc/{pid}/setgroups", "deny")
    write_proc_file(f"/proc/{pid}/uid_map", f"{uid} {uid} 1\n")
    write_proc_file(f"/proc/{pid}/gid_map", f"{gid} {gid} 1\n")


def write_proc_file(path: str, text: str) -> None:
    """Write a /proc file; a refused id map write names the host policy behind it where one shows."""
    try:
        with open(path, "w") as handle:
            handle.write(text)
    except OSError as error:
        why = _diagnose(error.errno or 0) if path.endswith(("/uid_map", "/gid_map", "/setgroups")) else None
        if why is not None:
            raise KernelError(f"can't write {path}: {error.strerror}: {why}", hint=_hint()) from None
        raise KernelError(f"can't write {path}: {error.strerror}") from None


def _diagnose(error: int) -> str | None:
    """singpy.host.hostcheck's reading of the failure (Ubuntu's AppArmor restriction), imported only now."""
    try:
        from singpy.host.hostcheck import in_userns_failure

        return in_userns_failure(error)
    except Exception:  # out of reach or failing: the plain message is said instead
        return None


def _hint() -> str | None:
    try:
        from singpy.host.hostcheck import HINT

        return HINT
    except Exception:
        return None
