"""Files and paths that users and admins hand singpy, checked before the kernel sees them.

Whatever is named on the command line or in singpy.conf may be a FIFO (an
open for reading waits for a writer forever), a device (`/dev/zero` never
ends), a huge file, text that is not UTF-8, or a path longer than the
kernel takes. Here every such case becomes one clear `SingpyError`:

* `read_text`: a regular file, opened without blocking, at most `limit`
  bytes, UTF-8 without NUL bytes (the error names `file:line`);
* `open_regular`: a descriptor on a regular file, for binary readers;
* `path_problem`: why a path can never be used (over PATH_MAX, a component
  over NAME_MAX, a NUL byte), checked where paths are parsed so that the
  launch never meets ENAMETOOLONG;
* `which`: a program on a PATH, as execvp(3) and a shell find it, the one
  lookup of the package (host tools, and inside the container the payload).
* `spawn_reading`: a host tool run with one of its standard streams read to
  its end (posix_spawn: no copy of the launcher's page tables, nothing of
  Python's run between the spawn and the exec).

Stdlib `os` and `stat` only: `read_text` is on the path of every
`singpy exec` (singpy.conf).
"""

from __future__ import annotations

import os
import stat

from singpy.errors import SingpyError

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from collections.abc import Mapping

PATH_MAX = 4096  # bytes, the terminating NUL included (linux/limits.h)
NAME_MAX = 255  # bytes of one path component
MAX_TEXT = 1 << 20  # a configuration or environment file is a few KB; 1 MiB is generous
_SHOWN = 80  # characters of a path quoted in a message

_KINDS = ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISLNK, "a symbolic link"))


CONFIGDIR_VARIABLES = ("SINGPY_CONFIGDIR", "APPTAINER_CONFIGDIR", "SINGULARITY_CONFIGDIR")


def user_config_dir(env: Mapping[str, str], home: str) -> str:
    """The user's configuration directory, as Apptainer's syfs.ConfigDir: $APPTAINER_CONFIGDIR, else ~/.apptainer
    (remote.yaml, docker-config.json and the keyrings are kept there)."""
    configdir = next((env[name] for name in CONFIGDIR_VARIABLES if env.get(name)), "")
    return os.path.abspath(configdir) if configdir else os.path.join(home, ".apptainer")


def kind_name(mode: int) -> str:
    """What a file is, for messages ("a FIFO", "a character device", ...)."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def shown(path: str) -> str:
    """`path` as a message quotes it: long paths are cut, so that the line stays one line to read."""
    if len(path) <= _SHOWN:
        return path
    return f"{path[:_SHOWN // 2]}...{path[-_SHOWN // 4:]} ({len(os.fsencode(path))} bytes)"


def reason(error: OSError | ValueError) -> str:
    """What went wrong, without the path (which the message names once, shortened).

    ValueError: what `os` raises for a path with a NUL byte.
    """
    if isinstance(error, OSError):
        return error.strerror or type(error).__name__
    return str(error) or type(error).__name__


def open_regular(path: str | os.PathLike[str], *, what: str, error: type[SingpyError],
                 unreadable: str | None = None) -> int:
    """A read-only descriptor on the regular file `path` (the caller closes it).

    `unreadable` starts the message when the file can't be opened at all
    (default: "can't read WHAT PATH"), for callers with wording of their own.

    The type is checked with stat() before the open, so that a device is never
    opened (opening one can have effects: a tape rewinds, a terminal hangs up),
    and again on the descriptor; O_NONBLOCK keeps a FIFO swapped in between the
    two from blocking the open.
    """
    path = os.fspath(path)
    unreadable = unreadable or f"can't read {what} {shown(path)}"
    problem = path_problem(path)
    if problem:
        raise error(f"{unreadable}: {problem}")
    try:
        if not stat.S_ISREG(mode := os.stat(path).st_mode):
            raise error(f"{what} {shown(path)} is {kind_name(mode)}, not a regular file")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as failure:
        raise error(f"{unreadable}: {reason(failure)}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise error(f"{what} {shown(path)} is {kind_name(mode)}, not a regular file")
    return fd  # O_NONBLOCK stays: it changes nothing for a regular file


def read_text(path: str | os.PathLike[str], *, what: str, error: type[SingpyError], limit: int = MAX_TEXT,
              unreadable: str | None = None) -> str:
    """The UTF-8 text of the regular file `path`, at most `limit` bytes (`unreadable`: see open_regular)."""
    path = os.fspath(path)
    fd = open_regular(path, what=what, error=error, unreadable=unreadable)
    try:
        data = read_bounded(fd, limit)
    except OSError as failure:
        raise error(f"can't read {what} {shown(path)}: {reason(failure)}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise error(f"{what} {shown(path)} is too large (more than {_size(limit)})")
    return decode_text(data, shown(path), error=error)


def _size(count: int) -> str:
    return f"{count >> 20} MiB" if count >= 1 << 20 else f"{count >> 10} KiB" if count >= 1 << 10 else f"{count} bytes"


def write_all(fd: int, data: bytes) -> None:
    """All of `data` to `fd` (os.write may write less than asked)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def spawn_reading(argv: list[str], env: dict[str, str], stream: int,
                  actions: tuple[tuple[object, ...], ...] = (), setsigdef: tuple[int, ...] = ()) -> tuple[int, bytes]:
    """(exit code, what it wrote) of host program `argv` run with `env`, its descriptor `stream` a pipe read to
    its end; `actions` are further posix_spawn file actions (another stream to /dev/null, closed...), `setsigdef`
    the signals it gets back at their default. Raises OSError where it can't be started."""
    read_end, write_end = os.pipe()
    try:
        pid = os.posix_spawn(argv[0], argv, env, setsigdef=setsigdef,
                             file_actions=[(os.POSIX_SPAWN_DUP2, write_end, stream), *actions])
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    try:
        chunks = []
        while chunk := os.read(read_end, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(read_end)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return code, b"".join(chunks)


def read_bounded(fd: int, limit: int) -> bytes:
    """Up to limit + 1 bytes (one more than allowed tells "too large" from "exactly at the limit")."""
    chunks = []
    left = limit + 1
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def decode_text(data: bytes, origin: str, *, error: type[SingpyError]) -> str:
    """`data` as UTF-8 text; a NUL byte or an invalid sequence is an error naming `origin:line`."""
    nul = data.find(b"\0")
    if nul >= 0:
        raise error(f"{origin}:{_line_of(data, nul)}: a NUL byte: not a text file")
    try:
        return data.decode()
    except UnicodeDecodeError as failure:
        where = f"{origin}:{_line_of(data, failure.start)}"
        raise error(f"{where}: not UTF-8 text (byte {data[failure.start]:#04x})") from None


def _line_of(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def path_problem(path: str) -> str | None:
    """Why `path` can never be used by the kernel, or None: too long, a component too long, a NUL byte."""
    encoded = os.fsencode(path)
    if b"\0" in encoded:
        return "contains a NUL byte"
    if len(encoded) >= PATH_MAX:
        return f"longer than PATH_MAX ({len(encoded)} bytes, {PATH_MAX - 1} at most)"
    if len(encoded) > NAME_MAX:
        for part in encoded.split(b"/"):
            if len(part) > NAME_MAX:
                return f"a component is longer than NAME_MAX ({len(part)} bytes, {NAME_MAX} at most)"
    return None


def which(name: str, path: str) -> str | None:
    """The first executable file `name` in the directories of `path` (an empty entry is the current directory).

    A name with a slash is not looked up: it is returned as it is if executable.
    """
    if "/" in name:
        return name if _is_program(name) else None
    for directory in path.split(":"):
        candidate = os.path.join(directory or ".", name)
        if _is_program(candidate):
            return candidate
    return None


def _is_program(path: str) -> bool:
    return os.access(path, os.X_OK) and not os.path.isdir(path)


def current_umask() -> int:
    """The process's umask, read from /proc/self/status (Linux 4.7+) without setting it even for a moment
    (another thread could create a file then); where that can't be read, set and restored."""
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
