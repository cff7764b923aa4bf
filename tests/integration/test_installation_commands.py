"""Apptainer's hidden installation commands, as root and as a user: `buildcfg [NAME]` (where singpy is installed
and reads its configuration) and `confgen [OLD] NEW` (a whole singpy.conf with OLD's settings)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.conftest import SINGPY, Singpy, assert_one_fatal
from tests.support.sysconf_expected import STOCK_APPTAINER_CONF


def own_dir(singpy: Singpy, workdir: Path, name: str) -> Path:
    path = workdir / f"installation-{singpy.profile}-{name}"
    path.mkdir()
    os.chown(path, singpy.uid, singpy.gid)
    return path


def as_user_file(singpy: Singpy, path: Path, text: str) -> Path:
    path.write_text(text)
    os.chown(path, singpy.uid, singpy.gid)
    return path


# --- buildcfg ---------------------------------------------------------------------------------------------------


def test_buildcfg_lists_the_parameters(singpy: Singpy, workdir: Path) -> None:
    from singpy import __version__

    conf = as_user_file(singpy, workdir / f"buildcfg-{singpy.profile}.conf", "mount home = yes\n")
    out = singpy.ok("buildcfg", env=singpy.env(SINGPY_CONFIG=str(conf)))
    found = dict(line.split("=", 1) for line in out.splitlines())
    assert list(found)[:2] == ["PACKAGE_NAME", "PACKAGE_VERSION"]
    assert (found["PACKAGE_NAME"], found["PACKAGE_VERSION"]) == ("singpy", __version__)
    assert found["APPTAINER_CONF_FILE"] == str(conf)  # the file singpy reads without --config
    assert found["APPTAINER_CONFDIR"] == str(conf.parent)
    assert found["BINDIR"] == os.path.dirname(SINGPY)
    assert os.path.isdir(found["PREFIX"]) and found["APPTAINER_SUID_INSTALL"] == "0"
    assert singpy.ok("buildcfg", "BINDIR") == f"{os.path.dirname(SINGPY)}\n"


def test_buildcfg_under_apptainers_name(singpy: Singpy, workdir: Path) -> None:
    """As `--version`: the package answering is the Apptainer release singpy stands in for."""
    from singpy import APPTAINER_VERSION

    links = own_dir(singpy, workdir, "links")
    (links / "apptainer").symlink_to(SINGPY)
    shown = subprocess.run([str(links / "apptainer"), "buildcfg"], env=singpy.env(), capture_output=True, text=True,
                           timeout=60, check=False, **singpy.switch())  # type: ignore[call-overload]
    found = dict(line.split("=", 1) for line in shown.stdout.splitlines())
    assert (found["PACKAGE_NAME"], found["PACKAGE_VERSION"]) == ("apptainer", APPTAINER_VERSION), shown.stderr
    assert found["BINDIR"] == str(links)  # where it was started from


@pytest.mark.parametrize("name", ["LIBEXECDIR", "SESSIONDIR", "no\x1b[31mred"])
def test_buildcfg_has_no_made_up_parameters(singpy: Singpy, name: str) -> None:
    result = singpy.run("buildcfg", name)
    assert_one_fatal(result, "no variable named", code=1)
    assert "\x1b" not in result.stderr


# --- confgen ----------------------------------------------------------------------------------------------------


EDITED = STOCK_APPTAINER_CONF.replace("mount home = yes", "mount home = no") + "bind path = {data}:/data\n"


def test_confgen_carries_an_apptainer_conf_over(singpy: Singpy, image: Path, workdir: Path) -> None:
    """What the user observes is OLD's settings in force: its bind path bound, its home not mounted."""
    here = own_dir(singpy, workdir, "carried")
    data = own_dir(singpy, workdir, "data")
    (data / "marker").write_text("from the old file\n")
    old = as_user_file(singpy, here / "apptainer.conf", EDITED.format(data=data))
    result = singpy.run("confgen", str(old), str(here / "singpy.conf"), cwd=here)
    assert result.returncode == 0, result.stderr
    assert "not carried over (Apptainer directives singpy ignores): allow setuid, " in result.stderr
    new = here / "singpy.conf"
    assert stat.S_IMODE(new.stat().st_mode) == 0o644 and new.stat().st_uid == singpy.uid
    assert "\nmount home = no\n" in new.read_text() and "# mount home: bind the user's home" in new.read_text()
    out = singpy.ok("--config", str(new), "exec", str(image), "sh", "-c",
                    f"cat /data/marker; grep -q ' {singpy.home} ' /proc/self/mountinfo && echo home || echo no-home")
    assert out == "from the old file\nno-home\n"


def test_confgen_with_new_alone_writes_the_defaults(singpy: Singpy, workdir: Path) -> None:
    from singpy.config.sysconf import shipped_path

    here = own_dir(singpy, workdir, "defaults")
    for args in (["only.conf"], ["absent.conf", "from-absent.conf"]):
        result = singpy.run("confgen", *args, cwd=here)
        assert result.returncode == 0, result.stderr
        assert (here / args[-1]).read_text() == Path(shipped_path()).read_text()
    assert "absent.conf does not exist: every directive at its default" in result.stderr


def test_confgen_keeps_an_existing_files_mode(singpy: Singpy, workdir: Path) -> None:
    here = own_dir(singpy, workdir, "existing")
    new = as_user_file(singpy, here / "singpy.conf", "mount home = yes\n")
    new.chmod(0o600)
    old = as_user_file(singpy, here / "old.conf", "mount tmp = no\n")
    singpy.ok("confgen", str(old), str(new))
    assert stat.S_IMODE(new.stat().st_mode) == 0o600
    assert "\nmount tmp = no\n" in new.read_text()
    assert sorted(path.name for path in here.iterdir()) == ["old.conf", "singpy.conf"]  # no temporary file left


@pytest.mark.parametrize("case", ["bad old", "symlink", "directory", "missing directory", "three paths"])
def test_confgen_mistakes_write_nothing(singpy: Singpy, workdir: Path, case: str) -> None:
    here = own_dir(singpy, workdir, f"mistake-{case.replace(' ', '-')}")
    old = as_user_file(singpy, here / "old.conf", "mount home = maybe\n" if case == "bad old" else "mount tmp = no\n")
    target = here / "target.conf"
    victim = as_user_file(singpy, here / "victim", "untouched\n")
    if case == "symlink":
        target.symlink_to(victim)
    elif case == "directory":
        target.mkdir()
    elif case == "missing directory":
        target = here / "nowhere" / "new.conf"
    args = [str(old), str(target), *(["extra.conf"] if case == "three paths" else [])]
    before = sorted(path.name for path in here.iterdir())
    expected = {"bad old": ("old.conf:1: mount home must be yes or no", 255),
                "symlink": ("is not a regular file: refusing to rewrite it", 255),
                "directory": ("is not a regular file: refusing to rewrite it", 255),
                "missing directory": ("can't write beside", 255),
                "three paths": ("confgen takes [OLD] NEW: 3 paths given", 1)}[case]
    result = singpy.run("confgen", *args)
    assert_one_fatal(result, expected[0], code=expected[1])
    assert sorted(path.name for path in here.iterdir()) == before
    assert victim.read_text() == "untouched\n"


def test_the_commands_are_hidden(singpy: Singpy) -> None:
    listed = singpy.ok("--help").split()
    assert "build" in listed and "buildcfg" not in listed and "confgen" not in listed
