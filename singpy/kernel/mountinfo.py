"""The mount points of this process's mount namespace, as /proc/self/mountinfo (proc(5)) names them."""

from __future__ import annotations


def mount_points(proc: str = "/proc") -> list[str]:
    """Each mount's mount point (the 5th field), in the file's order: a parent before the mounts made on it.
    `proc`: where a procfs is mounted (the host's, seen from the launcher's staging root)."""
    with open(f"{proc}/self/mountinfo", encoding="utf-8", errors="surrogateescape") as handle:
        return [unescape(line.split(" ")[4]) for line in handle if line.count(" ") > 4]


def entries(text: str) -> list[tuple[str, str, str]]:
    """Each mount's (mount point, filesystem type, super options) in mountinfo `text`, in its order. The optional
    fields before " - " vary in number, so the last three are counted from there; a line without them is skipped."""
    found = []
    for line in text.splitlines():
        fields, _, tail = line.partition(" - ")
        parts, after = fields.split(), tail.split()
        if len(parts) > 4 and len(after) > 2:
            found.append((unescape(parts[4]), after[0], after[2]))
    return found


def unescape(field: str) -> str:
    """A mountinfo path: a space, a tab, a newline or a backslash is written as an octal escape (\\040...), so
    every backslash begins one."""
    first, *rest = field.split("\\")
    return first + "".join(chr(int(part[:3], 8)) + part[3:] for part in rest)
