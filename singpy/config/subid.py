"""`singpy config fakeroot`: a user's subordinate id range in /etc/subuid and /etc/subgid, as Apptainer.

Apptainer's rules (its internal/pkg/fakeroot/fakeroot.go), kept exactly:
- a line is `USER:START:COUNT`, USER a name or a uid, `!USER:...` disabled;
- a user's entry is its first valid line of COUNT 65536, else its largest
  line above 65536; lines below 65536 are not fakeroot ranges (an error names them);
- `--add` gives a user with no entry the range `UID:START:65536` whose START
  is the highest multiple-of-65536 step from 4294967296 - 131072 down to 65536
  that no valid line's range contains; a user who has an entry keeps it;
- `--remove` deletes the entry's line; `--enable` and `--disable` take the `!` off or put it on.
Lines singpy cannot read are kept as they are (Apptainer drops lines of fewer
than three fields when it rewrites a file). Each file is handled on its own,
/etc/subuid first; nothing is written unless both edits succeed.
"""

from __future__ import annotations

import pwd

from singpy.errors import ConfigError, UsageError

SUBUID, SUBGID = "/etc/subuid", "/etc/subgid"
RANGE = 65536
START_MAX = 4294967296 - 131072
START_MIN = 65536
DISABLED = "!"
OPERATIONS = ("add", "remove", "enable", "disable")


class Entry:
    """One line of a subid file, read as Apptainer reads it."""

    def __init__(self, line: str) -> None:
        self.line = line
        fields = line.split(":")
        self.parsed = len(fields) >= 3
        if not self.parsed:
            return
        self.start = _number(fields[1])
        count = _number(fields[2])
        self.count = count or 0
        self.valid = self.start is not None and bool(count)
        owner = fields[0]
        self.disabled = owner.startswith(DISABLED)
        self.uid = _owner_uid(owner.removeprefix(DISABLED))


def _number(text: str) -> int | None:
    return int(text) if text.isdecimal() and text.isascii() and int(text) <= 0xFFFFFFFF else None


def _owner_uid(owner: str) -> int | None:
    uid = _number(owner)
    if uid is not None:
        return uid
    try:
        return pwd.getpwnam(owner).pw_uid
    except (KeyError, ValueError):
        return None  # Apptainer's maximal uid: the line belongs to nobody it can look up


def user_uid(name: str) -> int:
    try:
        return pwd.getpwnam(name).pw_uid
    except (KeyError, ValueError):
        raise UsageError(f"could not retrieve user information for {name}: no such user") from None


class SubidFile:
    def __init__(self, path: str, text: str) -> None:
        self.path = path
        self.entries = [Entry(line) for line in text.splitlines()]

    def find(self, name: str) -> Entry:
        """The user's fakeroot entry (Apptainer's GetUserEntry)."""
        uid = user_uid(name)
        mine = [entry for entry in self.entries if entry.parsed and entry.valid and entry.uid == uid]
        for entry in mine:
            if entry.count == RANGE:
                return entry
        large = [entry for entry in mine if entry.count > RANGE]
        if large:
            return max(large, key=lambda entry: entry.count)  # the first of the largest, as Apptainer
        if mine:
            raise ConfigError(f"mapping entries for user {name} found in {self.path} but all with a range count "
                              f"lower than {RANGE}")
        raise ConfigError(f"no mapping entry found in {self.path} for {name}")

    def add(self, name: str) -> None:
        try:
            self.find(name)
            return
        except ConfigError:
            pass
        uid = user_uid(name)
        taken = [(entry.start or 0, (entry.start or 0) + entry.count - 1) for entry in self.entries
                 if entry.parsed and entry.valid]
        for start in range(START_MAX, START_MIN - 1, -RANGE):
            if not any(first <= start <= last for first, last in taken):
                self.entries.append(Entry(f"{uid}:{start}:{RANGE}"))
                return
        raise ConfigError(f"no range available in {self.path}")

    def remove(self, name: str) -> None:
        self.entries.remove(self.find(name))

    def enable(self, name: str) -> None:
        entry = self.find(name)
        entry.line = entry.line.removeprefix(DISABLED)

    def disable(self, name: str) -> None:
        entry = self.find(name)
        if not entry.line.startswith(DISABLED):
            entry.line = DISABLED + entry.line

    def text(self) -> str:
        return "".join(entry.line + "\n" for entry in self.entries)


_VERBS = {"add": "adding", "remove": "removing", "enable": "enabling", "disable": "disabling"}


def edited(path: str, operation: str, name: str) -> tuple[str, str]:
    """The file's text before and after `operation` for user `name` (Apptainer's wording on errors)."""
    import os

    from singpy.host.hostfiles import read_text

    # a missing file is an empty one, as for Apptainer (which creates it)
    before = read_text(path, what="subordinate id file", error=ConfigError) if os.path.lexists(path) else ""
    subids = SubidFile(path, before)
    try:
        getattr(subids, operation)(name)
    except (ConfigError, UsageError) as error:
        raise type(error)(f"while {_VERBS[operation]} {name}: {error.message}") from None
    return before, subids.text()
