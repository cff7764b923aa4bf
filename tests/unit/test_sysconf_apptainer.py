"""singpy.config.sysconf reading Apptainer's apptainer.conf: the stock file of Apptainer 1.4.5 and every other
directive Apptainer knows carry over (applied, or read and checked), with errors naming file and line. The
rest of singpy.conf's tests are in test_sysconf.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from singpy.config import sysconf
from singpy.config.sysconf import DIRECTIVES
from singpy.errors import ConfigError
from tests.support.sysconf_expected import EXPECTED_DEFAULTS, IGNORED_IN_STOCK, STOCK_APPTAINER_CONF

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "etc" / "singpy.conf"


# --- Apptainer's apptainer.conf carries over -------------------------------------------------------------------------


# Every other directive Apptainer 1.4 knows (set by admins, absent from the default file), at a non-default value.
OTHER_APPTAINER_LINES = """\
allow setuid-mount encrypted = no
allow setuid-mount squashfs = yes
allow setuid-mount extfs = yes
sync writable extfs = yes
limit container owners = alice, bob
limit container groups = hpc
limit container paths = /scratch, /project
allow net users = alice
allow net groups = hpc
allow net networks = bridge, ptp
allow netns paths = /var/run/netns/a
cni configuration path = /etc/cni
cni plugin path = /usr/libexec/cni
binary path = /usr/bin:/bin
suidbinary path = /usr/bin
mksquashfs mem = 1G
apptheus communication socket path = /run/a.sock
"""

def test_stock_apptainer_conf_loads(capsys: pytest.CaptureFixture[str]) -> None:
    config = sysconf.parse(STOCK_APPTAINER_CONF, "/etc/apptainer/apptainer.conf")
    # Apptainer's defaults where singpy's differ: nvidia-container-cli only when asked, binds from the file.
    assert dict(config.values) == {**EXPECTED_DEFAULTS, "use nvidia-container-cli": False,
                                   "bind path": ("/etc/localtime", "/etc/hosts")}
    assert capsys.readouterr().err == ""  # notes only with --verbose


def test_ignored_directives_give_one_verbose_note_each(capsys: pytest.CaptureFixture[str]) -> None:
    from singpy import console

    before = console.level()
    console.set_level(console.VERBOSE)
    try:
        sysconf.parse(STOCK_APPTAINER_CONF + "allow setuid = no\n", "a.conf")
    finally:
        console.set_level(before)
    notes = capsys.readouterr().err.splitlines()
    assert len(notes) == len(IGNORED_IN_STOCK)
    for name, note in zip(IGNORED_IN_STOCK, notes, strict=True):
        assert note.startswith("VERBOSE:")
        assert f"Apptainer directive {name!r} has no meaning for singpy: ignored" in note
    assert "a.conf:2: " in notes[0]  # the first `allow setuid`, once


def test_every_apptainer_directive_is_accepted() -> None:
    config = sysconf.parse(STOCK_APPTAINER_CONF + OTHER_APPTAINER_LINES, "a.conf")
    assert config.items("limit container owners") == ("alice", "bob")
    assert config.items("limit container groups") == ("hpc",)
    assert config.items("limit container paths") == ("/scratch", "/project")
    assert config.items("allow net networks") == ("bridge", "ptp")
    assert config.items("allow netns paths") == ("/var/run/netns/a",)
    names = {line.partition("=")[0].strip().lstrip("# ") for line in (STOCK_APPTAINER_CONF + OTHER_APPTAINER_LINES)
             .splitlines() if "=" in line}
    known = {d.name for d in DIRECTIVES} | sysconf.APPTAINER_IGNORED
    assert names - {"bind path = /etc/apptainer/default-nsswitch.conf:/etc/nsswitch.conf"} <= known


def _release_sets() -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = json.loads((Path(__file__).parents[1] / "data" / "conf" / "directives.json")
                                            .read_text())
    return data


@pytest.mark.parametrize("release_set", _release_sets(), ids=lambda entry: entry["releases"][-1])
def test_every_releases_configuration_loads(release_set: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    """Apptainer 1.0-1.5 and Singularity/SingularityCE 3.0-4.5: each release's directives at their defaults load,
    those that map to singpy take effect, and each of the others gives one --verbose note, never an error."""
    from singpy import console

    # Directives declared without a default (lists, paths) are written only when a site sets them.
    text = "".join(f"{name} = {default}\n" for name, default in release_set["directives"] if default is not None)
    before = console.level()
    console.set_level(console.VERBOSE)
    try:
        config = sysconf.parse(text, "release.conf")
    finally:
        console.set_level(before)
    notes = capsys.readouterr().err
    known = {d.name for d in DIRECTIVES}
    for name, default in release_set["directives"]:
        if default is None:
            continue
        if name in known:
            assert name not in notes, name
        else:
            assert f"Apptainer directive {name!r} has no meaning for singpy: ignored" in notes
    assert config.flag("mount home") and config.flag("allow pid ns")


@pytest.mark.parametrize(("text", "name", "value"), [
    ("enable overlay = try", "enable overlay", "try"),
    ("enable overlay = driver", "enable overlay", "driver"),
    ("enable underlay = preferred", "enable underlay", "preferred"),
    ("avoid kernel features = mount_setattr,loop_configure", "avoid kernel features",
     ("mount_setattr", "loop_configure")),
    ("sessiondir max size = 0", "sessiondir max size", 0),
    ("max loop devices = 4096", "max loop devices", 4096),
    ("memory fs type = ramfs", "memory fs type", "ramfs"),
    ("allow container sif = no", "allow container sif", False),
    ("allow container dir = no", "allow container dir", False),
    ("bind path = /etc/localtime,/etc/hosts", "bind path", ("/etc/localtime", "/etc/hosts")),
    ("bind path = /a , /b:/c\nbind path = /d", "bind path", ("/a", "/b:/c", "/d")),
    ("limit container paths = /x,\nlimit container paths = /y", "limit container paths", ("/x", "/y")),
], ids=["overlay-try", "overlay-driver", "underlay-preferred", "avoid-features",
        "sessiondir-0", "loop", "ramfs", "no-sif", "no-dir", "bind-comma",
        "bind-comma-repeat", "limit-paths-repeat"])
def test_apptainer_values(text: str, name: str, value: object) -> None:
    assert sysconf.parse(text, "a.conf").get(name) == value


@pytest.mark.parametrize(("text", "message"), [
    ("enable overlay = maybe", "a.conf:1: enable overlay must be one of yes, no, try, driver, not 'maybe'"),
    ("sessiondir max size = -1", "a.conf:1: sessiondir max size must be a number (0 or more), not '-1'"),
    ("max loop devices = lots", "a.conf:1: max loop devices must be a number (0 or more), not 'lots'"),
    ("memory fs type = ext4", "a.conf:1: memory fs type must be one of tmpfs, ramfs, not 'ext4'"),
    ("allow container sif = sometimes", "a.conf:1: allow container sif must be yes or no, not 'sometimes'"),
    ("bind path = /a,etc", "a.conf:1: bind path source 'etc' is not an absolute path"),
    ("allow setuid\n", "a.conf:1: unknown directive 'allow setuid'"),
    ("allow setuidx = yes", "a.conf:1: unknown directive 'allow setuidx'"),
], ids=["overlay", "negative", "not-a-number", "memfs", "bool", "bind-comma-relative", "ignored-without-value",
        "near-miss"])
def test_apptainer_value_errors_carry_file_and_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        sysconf.parse(text, "a.conf")
    assert caught.value.message == message
