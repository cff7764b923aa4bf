"""`singpy config global` (on a private copy of singpy.conf, named by --config) and `singpy config fakeroot`
(on private copies of /etc/subuid and /etc/subgid bound over the real ones for singpy alone: tests.support.hostsim).
The real /etc files are never written."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from singpy.config import sysconf
from tests.conftest import Singpy, assert_one_fatal
from tests.support import hostsim

SHIPPED = Path(sysconf.SHIPPED_DIR) / "singpy.conf"
TOP_START = 4294967296 - 131072  # Apptainer's first candidate range start


def _private_conf(singpy: Singpy, workdir: Path) -> Path:
    where = workdir / f"config-{uuid.uuid4().hex[:8]}"
    where.mkdir()
    where.chmod(0o755)
    conf = where / "singpy.conf"
    shutil.copyfile(SHIPPED, conf)
    conf.chmod(0o644)
    return conf


def _without(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith(f"{name} =")]


def test_set_adds_to_a_list_and_the_launch_uses_it(as_root: Singpy, image: Path, workdir: Path) -> None:
    conf = _private_conf(as_root, workdir)
    marked = conf.parent / "marked"
    marked.mkdir()
    (marked / "mark").write_text("from bind path\n")
    before = conf.read_text()
    as_root.ok("--config", str(conf), "config", "global", "--set", "bind path", f"{marked}:/mnt/cfg")
    after = conf.read_text()
    assert _without(after, "bind path") == _without(before, "bind path")  # every comment and line kept
    assert as_root.ok("--config", str(conf), "config", "global", "--get", "bind path") == \
        f"{marked}:/mnt/cfg,/etc/localtime,/etc/hosts\n"  # Apptainer's order: new values first
    assert as_root.ok("--config", str(conf), "exec", str(image), "cat", "/mnt/cfg/mark") == "from bind path\n"
    as_root.ok("--config", str(conf), "config", "global", "--unset", "bind path", f"{marked}:/mnt/cfg")
    assert conf.read_text() == before


def test_set_reset_a_single_value_and_an_absent_directive(as_root: Singpy, workdir: Path) -> None:
    conf = _private_conf(as_root, workdir)
    before = conf.read_text()
    as_root.ok("--config", str(conf), "config", "global", "--set", "mount home", "no")
    assert "mount home = no" in conf.read_text().splitlines()
    assert sysconf.load(str(conf)).flag("mount home") is False
    as_root.ok("--config", str(conf), "config", "global", "--reset", "mount home")
    assert conf.read_text() == before
    # not set in the file: written after its commented-out example; --reset writes the default there
    as_root.ok("--config", str(conf), "config", "global", "--set", "allow ipc ns", "no")
    lines = conf.read_text().splitlines()
    assert lines[lines.index("allow ipc ns = no") - 1] == "# allow ipc ns = yes"
    assert as_root.ok("--config", str(conf), "config", "global", "--get", "allow ipc ns") == "no\n"
    as_root.ok("--config", str(conf), "config", "global", "--reset", "allow ipc ns")
    assert _without(conf.read_text(), "allow ipc ns") == before.splitlines()
    assert as_root.ok("--config", str(conf), "config", "global", "--get", "allow ipc ns") == "yes\n"
    # a list reset: its template's lines back, as Apptainer's (`bind path`: /etc/localtime and /etc/hosts)
    as_root.ok("--config", str(conf), "config", "global", "--set", "bind path", "/opt")
    as_root.ok("--config", str(conf), "config", "global", "--reset", "bind path")
    assert _without(conf.read_text(), "allow ipc ns") == before.splitlines()


def test_reset_of_a_list_writes_its_template_lines_back(as_root: Singpy, workdir: Path) -> None:
    """Apptainer regenerates its template: `bind path` comes back even where the file had none; a list whose
    template sets nothing (`allow net users`) is left with no line."""
    conf = _private_conf(as_root, workdir)
    before = conf.read_text()
    as_root.ok("--config", str(conf), "config", "global", "--unset", "bind path", "/etc/localtime,/etc/hosts")
    assert as_root.run("--config", str(conf), "config", "global", "--get", "bind path").stdout == ""
    assert sysconf.load(str(conf)).values["bind path"] == ()
    as_root.ok("--config", str(conf), "config", "global", "--reset", "bind path")
    assert _without(conf.read_text(), "bind path") == _without(before, "bind path")  # the rest kept
    assert as_root.ok("--config", str(conf), "config", "global", "--get", "bind path") == "/etc/localtime,/etc/hosts\n"
    assert sysconf.load(str(conf)).values["bind path"] == ("/etc/localtime", "/etc/hosts")
    before = conf.read_text()
    as_root.ok("--config", str(conf), "config", "global", "--set", "allow net users", "alice,bob")
    as_root.ok("--config", str(conf), "config", "global", "--reset", "allow net users")
    assert conf.read_text() == before


def test_get_and_dry_run_need_no_root_and_write_nothing(singpy: Singpy, workdir: Path) -> None:
    conf = _private_conf(singpy, workdir)
    before = conf.read_bytes()
    assert singpy.ok("--config", str(conf), "config", "global", "--get", "mount tmp") == "yes\n"
    shown = singpy.ok("--config", str(conf), "config", "global", "--dry-run", "--set", "mount tmp", "no")
    assert "mount tmp = no" in shown.splitlines()
    assert shown.splitlines()[0] == before.decode().splitlines()[0]  # the whole file, comments included
    assert conf.read_bytes() == before


def test_writing_needs_root(as_user: Singpy, workdir: Path) -> None:
    conf = _private_conf(as_user, workdir)
    os.chown(conf, as_user.uid, as_user.gid)  # even a file of the user's: the command is root's
    before = conf.read_bytes()
    result = as_user.run("--config", str(conf), "config", "global", "--set", "mount tmp", "no")
    assert_one_fatal(result, "requires root privileges")
    assert conf.read_bytes() == before


@pytest.mark.parametrize(("args", "message", "code"), [
    (["--set", "bogus directive", "x"], "'bogus directive' is not a valid configuration directive", 1),
    (["--set", "mount home", "maybe"], "configuration directive invalid", 255),
    (["--set", "mount home"], 'you must specify a value for directive "mount home"', 1),
    (["--set", "mount home", "yes,no"], "takes one value", 1),
    (["--unset", "bind path", "/not/there"], "value '/not/there' not found for directive \"bind path\"", 1),
    (["mount home", "no"], "you must specify an option", 1),
    (["--set", "--unset", "mount home", "no"], "choose one of --set and --unset", 1),
    (["--set", "bind path", "/scratch\nmount home = no"], "holds a line break", 1),  # was a second directive
    (["--set", "network bridge name", "\udcff"], "not printable UTF-8 text", 1),  # was a traceback
])
def test_mistakes_are_one_fatal_line_and_change_nothing(as_root: Singpy, workdir: Path, args: list[str],
                                                      message: str, code: int) -> None:
    conf = _private_conf(as_root, workdir)
    before = conf.read_bytes()
    assert_one_fatal(as_root.run("--config", str(conf), "config", "global", *args), message, code)
    assert conf.read_bytes() == before
    assert os.listdir(conf.parent) == ["singpy.conf"]  # no temporary file left


def test_a_symbolic_link_is_not_rewritten(as_root: Singpy, workdir: Path) -> None:
    conf = _private_conf(as_root, workdir)
    link = conf.parent / "link.conf"
    link.symlink_to(conf)
    before = conf.read_bytes()
    assert_one_fatal(as_root.run("--config", str(link), "config", "global", "--set", "mount tmp", "no"),
                     "not a regular file")
    assert conf.read_bytes() == before


# --- config fakeroot ---------------------------------------------------------------------------------------------


@pytest.fixture
def subids(as_user: Singpy, workdir: Path) -> Iterator[tuple[Path, Path]]:
    """Private /etc/subuid and /etc/subgid without the test user's lines, bound over the real ones for singpy."""
    if os.geteuid() != 0:
        pytest.skip("binding files over /etc/subuid needs root")
    subuid, subgid = hostsim.subid_copies(as_user.user, as_user.uid, None,
                                          str(workdir / f"fakeroot-{uuid.uuid4().hex[:8]}"))
    with hostsim.subid_files(subuid, subgid):
        yield Path(subuid), Path(subgid)


def _free_start(*files: Path) -> int:
    """Apptainer's rule: the highest step-of-65536 start, from 2**32 - 131072 down, inside no range of the file."""
    taken = []
    for path in files:
        for line in path.read_text().splitlines():
            fields = line.split(":")
            if len(fields) >= 3 and fields[1].isdigit() and fields[2].isdigit() and int(fields[2]):
                taken.append((int(fields[1]), int(fields[1]) + int(fields[2]) - 1))
    return next(start for start in range(TOP_START, 65535, -65536)
                if not any(first <= start <= last for first, last in taken))


def test_fakeroot_add_disable_enable_remove(as_root: Singpy, as_user: Singpy, image: Path,
                                             subids: tuple[Path, Path]) -> None:
    subuid, subgid = subids
    before = (subuid.read_text(), subgid.read_text())
    starts = (_free_start(subuid), _free_start(subgid))
    as_root.ok("config", "fakeroot", "--add", as_user.user)
    for path, text, start in zip(subids, before, starts, strict=True):
        assert path.read_text() == text + f"{as_user.uid}:{start}:65536\n"
    # the range is the user's: --fakeroot maps it (newuidmap reads the same bound files)
    uid_map = as_user.ok("exec", "--fakeroot", str(image), "cat", "/proc/self/uid_map").split()
    assert uid_map[:6] == ["0", str(as_user.uid), "1", "1", str(starts[0]), "65536"]
    as_root.ok("config", "fakeroot", "--add", as_user.user)  # has one already: nothing changes
    assert subuid.read_text() == before[0] + f"{as_user.uid}:{starts[0]}:65536\n"
    as_root.ok("config", "fakeroot", "--disable", as_user.user)
    assert subuid.read_text().endswith(f"\n!{as_user.uid}:{starts[0]}:65536\n")
    as_root.ok("config", "fakeroot", "--enable", as_user.user)
    assert subgid.read_text() == before[1] + f"{as_user.uid}:{starts[1]}:65536\n"
    as_root.ok("config", "fakeroot", "--remove", as_user.user)
    assert (subuid.read_text(), subgid.read_text()) == before


def test_fakeroot_dry_run_and_root_only(as_user: Singpy, subids: tuple[Path, Path]) -> None:
    before = [path.read_text() for path in subids]
    shown = as_user.ok("config", "fakeroot", "--dry-run", "--add", as_user.user)
    assert f"# /etc/subuid\n{before[0]}{as_user.uid}:{_free_start(subids[0])}:65536\n" in shown
    assert_one_fatal(as_user.run("config", "fakeroot", "--add", as_user.user), "requires root privileges")
    assert [path.read_text() for path in subids] == before


@pytest.mark.parametrize(("args", "message", "code"), [
    (["--add", "no-such-user-here"], "could not retrieve user information for no-such-user-here", 1),
    (["--enable", "USER"], "no mapping entry found in /etc/subuid for USER", 255),
    (["USER"], "you must specify an option (eg: --add/--remove/--enable/--disable)", 1),
])
def test_fakeroot_mistakes(as_root: Singpy, as_user: Singpy, subids: tuple[Path, Path], args: list[str],
                           message: str, code: int) -> None:
    before = [path.read_text() for path in subids]
    args = [as_user.user if arg == "USER" else arg for arg in args]
    assert_one_fatal(as_root.run("config", "fakeroot", *args), message.replace("USER", as_user.user), code)
    assert [path.read_text() for path in subids] == before
