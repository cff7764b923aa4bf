"""singpy.host.hostfiles: user- and admin-named files read without blocking or bounds, paths checked by the kernel."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

from singpy.errors import ConfigError, SingpyError
from singpy.host import hostfiles


def read(path: str | Path, limit: int = hostfiles.MAX_TEXT) -> str:
    return hostfiles.read_text(path, what="configuration", error=ConfigError, limit=limit)


def message(path: str | Path, limit: int = hostfiles.MAX_TEXT) -> str:
    with pytest.raises(ConfigError) as caught:
        read(path, limit)
    return caught.value.message


def run_with_deadline(function: object, seconds: float = 10) -> None:
    """Call `function` in a thread; a hang fails the test instead of stopping the suite."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            function()  # type: ignore[operator]
        except BaseException as error:  # noqa: BLE001 - handed to the test
            errors.append(error)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "blocked"
    if errors:
        raise errors[0]


def test_reads_utf8_text(tmp_path: Path) -> None:
    path = tmp_path / "a.conf"
    path.write_text("mount home = no\n# é\n")
    assert read(path) == "mount home = no\n# é\n"
    assert read(str(path)) == "mount home = no\n# é\n"


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    run_with_deadline(lambda: pytest.raises(ConfigError, read, fifo))
    assert message(fifo) == f"configuration {fifo} is a FIFO, not a regular file"


@pytest.mark.parametrize(("path", "kind"), [("/dev/zero", "a character device"), ("/dev/null", "a character device"),
                                            ("/", "a directory")])
def test_special_files_are_refused(path: str, kind: str) -> None:
    assert message(path) == f"configuration {path} is {kind}, not a regular file"


def test_a_socket_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "sock"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        assert message(path) == f"configuration {path} is a socket, not a regular file"


def test_size_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "big.conf"
    path.write_bytes(b"#" * 1025)
    assert message(path, limit=1024) == f"configuration {path} is too large (more than 1 KiB)"
    path.write_bytes(b"#" * 1024)
    assert read(path, limit=1024) == "#" * 1024


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"a = b\n\xff\n", "2: not UTF-8 text (byte 0xff)"),
        (b"\xc3(", "1: not UTF-8 text (byte 0xc3)"),
        (b"a\nb\nc\0d\n", "3: a NUL byte: not a text file"),
        (b"\0", "1: a NUL byte: not a text file"),
    ],
    ids=["invalid-byte-line-2", "truncated-sequence", "nul-line-3", "nul-first"],
)
def test_text_errors_name_file_and_line(tmp_path: Path, data: bytes, expected: str) -> None:
    path = tmp_path / "bad.conf"
    path.write_bytes(data)
    assert message(path) == f"{path}:{expected}"


def test_missing_and_unreadable(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    assert message(missing) == f"can't read configuration {missing}: No such file or directory"
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert message(loop) == f"can't read configuration {loop}: Too many levels of symbolic links"


def test_the_error_class_is_the_callers(tmp_path: Path) -> None:
    with pytest.raises(SingpyError) as caught:
        hostfiles.read_text(tmp_path / "nope", what="--env-file", error=SingpyError)
    assert type(caught.value) is SingpyError
    assert caught.value.message.startswith("can't read --env-file ")


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("/a/b", None),
        ("/" + "x" * 255, None),
        ("/" + "x" * 256, "a component is longer than NAME_MAX (256 bytes, 255 at most)"),
        ("/" + "é" * 128, "a component is longer than NAME_MAX (256 bytes, 255 at most)"),
        ("/x" * 2047, None),
        ("/x" * 2048, "longer than PATH_MAX (4096 bytes, 4095 at most)"),
        ("/a\0b", "contains a NUL byte"),
    ],
    ids=["plain", "name-max", "name-too-long", "counted-in-bytes", "path-max", "path-too-long", "nul"],
)
def test_path_problem(path: str, problem: str | None) -> None:
    assert hostfiles.path_problem(path) == problem


def test_long_paths_are_refused_before_the_kernel() -> None:
    long = "/" + "y" * 300
    text = message(long)
    assert text.startswith("can't read configuration /yyy") and "NAME_MAX" in text
    assert len(text) < 200  # the path is shortened in the message


def test_shown() -> None:
    assert hostfiles.shown("/short") == "/short"
    long = "/" + "z" * 1000
    assert len(hostfiles.shown(long)) < 100 and hostfiles.shown(long).endswith("(1001 bytes)")
