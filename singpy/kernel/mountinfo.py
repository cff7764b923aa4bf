"""The mount points of this process's mount namespace, as /proc/self/mountinfo (proc(5)) names them."""

from __future__ import annotations


def mount_points(proc: str = "/proc") -> list[str]:
    """Each mount's mount point (the 5th field), in the file's order: a parent before the mounts made on it.
    `proc`: where a procfs is mounted (the host's, seen from the launcher's staging root)."""
    with open(f"{proc}/self/mountinfo", encoding="utf-8", errors="surrogateescape") as handle:
        return [unescape(line.split(" ")[4]) for line in handle if line.count(" ") > 4]


def unescape(field: str) -> str:
    """A mountinfo path: a space, a tab, a newline or a backslash is written as an octal escape (\\040...), so
    every backslash begins one."""
    first, *rest = field.split("\\")
    return first + "".join(chr(int(part[:3], 8)) + part[3:] for part in rest)
