"""`singpy sif` against the reference `siftool` (Debian's package): the same output, and files it accepts.

The golden SIFs are tests/data/sif-golden (README.md there says where each comes from).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from singpy.image.sif import read_raw
from tests.conftest import Singpy, assert_one_fatal

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "sif-golden"
# Debian's siftool predates the OCI object types: it calls them "Unknown", Apptainer 1.5's sif names them
OCI_GOLDEN = ("one-object-oci-blob.sif", "one-object-oci-root-index.sif", "singularityce/empty.oci.sif")
SIGNER = "433FE984155206BD962725E20E8713472A879943"


def _goldens() -> list[str]:
    return sorted(str(path.relative_to(GOLDEN)) for path in GOLDEN.rglob("*.sif"))


def _siftool(*args: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("siftool") is None:
        pytest.skip("the reference siftool is not installed (Debian package siftool)")
    return subprocess.run(["siftool", *args], capture_output=True, text=True, check=False)


def _ids(path: Path) -> list[int]:
    return [slot.id for slot in read_raw(path)[1] if slot.used]


def _own_dir(singpy: Singpy, workdir: Path, name: str) -> Path:
    path = workdir / f"{name}-{singpy.profile}"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()
    os.chown(path, singpy.uid, singpy.gid)
    return path


@pytest.mark.parametrize("name", _goldens())
def test_list_header_info_match_siftool(singpy: Singpy, name: str) -> None:
    path = str(GOLDEN / name)
    for command in (["list"], ["header"], *(["info", str(number)] for number in _ids(GOLDEN / name))):
        expected = _siftool(*command, path)
        assert expected.returncode == 0, expected.stderr
        ours = singpy.ok("sif", *command, path)
        if name in OCI_GOLDEN:
            assert "OCI." in ours or command == ["header"]
            ours = ours.replace("OCI.RootIndex", "Unknown").replace("OCI.Blob", "Unknown")
            ours = "".join(line for line in ours.splitlines(keepends=True) if not line.startswith("  Digest:"))
        assert ours == expected.stdout, command


@pytest.mark.parametrize("name", ["two-groups-signed-pgp.sif", "one-object-sbom.sif", "real/busybox_arm64.sif"])
def test_dump_matches_siftool(singpy: Singpy, name: str) -> None:
    path = str(GOLDEN / name)
    for number in _ids(GOLDEN / name):
        expected = subprocess.run(["siftool", "dump", str(number), path], capture_output=True, check=True).stdout
        argv, ids = singpy.command(["sif", "dump", str(number), path])
        ours = subprocess.run(argv, capture_output=True, check=True, env=singpy.env(), **ids).stdout  # type: ignore[call-overload]
        assert ours == expected


def _edits(tool: list[str], sif: Path, data: Path, run: object) -> None:
    """The same edits made by one tool or the other (`run` runs one command line)."""
    steps = [["new", str(sif)],
             ["add", "--datatype", "1", str(sif), str(data)],
             ["add", "--datatype", "6", "--groupid", "1", "--filename", "meta.json", str(sif), str(data)],
             ["add", "--datatype", "4", "--partfs", "1", "--parttype", "2", "--partarch", "2", "--groupid", "1",
              str(sif), str(data)],
             ["add", "--datatype", "4", "--partfs", "4", "--parttype", "1", "--partarch", "4", str(sif), str(data)],
             ["add", "--datatype", "5", "--signhash", "1", "--signentity", SIGNER, "--link", "1", str(sif), str(data)],
             ["add", "--datatype", "9", "--sbomformat", "spdx-json", str(sif), str(data)],
             ["add", "--datatype", "7", "--alignment", "100", "--link", "2", str(sif), str(data)],
             ["del", "2", str(sif)],
             ["add", "--datatype", "3", str(sif), str(data)]]  # into the slot `del` freed
    for step in steps:
        run([*tool, *step])  # type: ignore[operator]


def _without_times(path: Path) -> tuple[object, list[object], bytes]:
    header, slots, _ = read_raw(path)
    return (header._replace(id=b"", created=0, modified=0),
            [slot._replace(created=0, modified=0) for slot in slots],
            path.read_bytes()[header.data_offset:])


def test_new_add_del_setprim_write_what_siftool_writes(singpy: Singpy, workdir: Path) -> None:
    _siftool("version")
    where = _own_dir(singpy, workdir, "sif-edits")
    data = where / "object.bin"
    data.write_bytes(b"some object data\n" * 20)
    os.chown(data, singpy.uid, singpy.gid)
    reference, ours = where / "reference.sif", where / "ours.sif"
    _edits(["siftool"], reference, data, lambda argv: subprocess.run(argv, check=True, capture_output=True))
    _edits(["sif"], ours, data, lambda argv: singpy.ok(*argv))
    assert _without_times(ours) == _without_times(reference)
    listed = _siftool("list", str(ours))  # the reference reads what singpy wrote
    assert listed.returncode == 0 and listed.stdout == _siftool("list", str(reference)).stdout
    for number in _ids(ours):
        assert _siftool("info", str(number), str(ours)).returncode == 0
    # Debian's siftool (sif 2.8) writes a Go arch name over the partition's arch code on setprim, a bug the
    # library has since fixed ("arm64" stored as "arm"): singpy writes what Apptainer 1.5's sif writes
    singpy.ok("sif", "setprim", "4", str(ours))
    listed = _siftool("list", str(ours))
    assert "|FS (Raw/*System/arm64)" in listed.stdout and "|FS (Squashfs/System/amd64)" in listed.stdout
    assert "Primary Architecture: arm64" in _siftool("header", str(ours)).stdout
    assert ours.stat().st_uid == singpy.uid
    assert ours.stat().st_mode & 0o777 == 0o755


def test_errors_are_one_fatal_line_and_leave_the_file_as_it_was(singpy: Singpy, workdir: Path) -> None:
    where = _own_dir(singpy, workdir, "sif-errors")
    sif = where / "image.sif"
    shutil.copyfile(GOLDEN / "one-group.sif", sif)
    os.chown(sif, singpy.uid, singpy.gid)
    before = sif.read_bytes()
    assert_one_fatal(singpy.run("sif", "info", "9", str(sif)), "object 9 not found")
    assert_one_fatal(singpy.run("sif", "dump", "9", str(sif)), "object 9 not found")
    assert_one_fatal(singpy.run("sif", "del", "9", str(sif)), "no object with ID 9")
    assert_one_fatal(singpy.run("sif", "add", str(sif), "/etc/hostname"), "--datatype", code=1)
    assert_one_fatal(singpy.run("sif", "add", "--datatype", "4", str(sif), "/etc/hostname"), "--partfs", code=1)
    assert_one_fatal(singpy.run("sif", "add", "--datatype", "9", str(sif), "/etc/hostname"), "--sbomformat", code=1)
    assert_one_fatal(singpy.run("sif", "add", "--datatype", "1", str(sif), str(where / "missing")), "missing")
    assert_one_fatal(singpy.run("sif", "list", "/etc/hostname"), "not a SIF file")
    assert sif.read_bytes() == before
    assert sorted(os.listdir(where)) == ["image.sif"]  # no temporary file left


def test_siftool_is_an_alias(singpy: Singpy) -> None:
    path = str(GOLDEN / "one-group.sif")
    assert singpy.ok("siftool", "list", path) == singpy.ok("sif", "list", path)


def test_dump_on_a_terminal_escapes_control_characters(as_root: Singpy, workdir: Path) -> None:
    """The object's bytes are the file's: on a terminal, an escape sequence in them is shown, never obeyed."""
    import pty

    where = _own_dir(as_root, workdir, "sif-dump-tty")
    data, sif = where / "escape.txt", where / "escape.sif"
    data.write_bytes(b"a\x1b[31mred\n")
    as_root.ok("sif", "new", str(sif))
    as_root.ok("sif", "add", "--datatype", "7", str(sif), str(data))
    argv, _ = as_root.command(["sif", "dump", "1", str(sif)])
    pid, terminal = pty.fork()
    if pid == 0:  # the child: singpy with the pty as its stdout
        os.execve(argv[0], argv, as_root.env())
    shown = b""
    while True:
        try:
            chunk = os.read(terminal, 1024)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(terminal)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert shown == b"a\\x1b[31mred\r\n"
