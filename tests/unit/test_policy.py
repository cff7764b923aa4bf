"""singpy.host.policy: the pure parts of the site's limits (the image checks run for real in
tests/integration/test_admin_directives.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from singpy.config import sysconf
from singpy.errors import ImageError
from singpy.host import policy
from singpy.plan import ImageSpec


def _config(text: str) -> sysconf.SysConfig:
    return sysconf.parse(text, "site.conf")


@pytest.mark.parametrize(("text", "asked", "granted", "warned"), [
    ("", (True, True, True, "node"), (True, True, True, "node"), ()),
    ("allow pid ns = no", (True, False, False, None), (False, False, False, None), ("allow pid ns = no",)),
    ("allow ipc ns = no", (False, True, False, None), (False, False, False, None), ("allow ipc ns = no",)),
    ("allow ipc ns = no", (True, False, True, None), (True, False, True, None), ()),
    ("allow uts ns = no", (False, False, True, "node"), (False, False, False, None), ("--hostname ignored",)),
    ("allow uts ns = no", (False, False, True, None), (False, False, False, None), ("no UTS namespace",)),
    ("allow uts ns = no\nallow ipc ns = no\nallow pid ns = no", (True, True, True, "n"),
     (False, False, False, None), ("PID", "IPC", "--hostname")),
    ("allow uts ns = no\nallow ipc ns = no", (False, False, False, None), (False, False, False, None), ()),
], ids=["allowed", "pid-refused", "ipc-refused", "ipc-not-asked", "hostname-refused", "uts-refused", "all",
        "nothing-asked"])
def test_grant_namespaces(text: str, asked: tuple[bool, bool, bool, str | None],
                          granted: tuple[bool, bool, bool, str | None], warned: tuple[str, ...]) -> None:
    pid, ipc, uts, hostname = asked
    *grant, warnings = policy.grant_namespaces(_config(text), pid=pid, ipc=ipc, uts=uts, hostname=hostname)
    assert tuple(grant) == granted
    assert len(warnings) == len(warned)
    for warning, expected in zip(warnings, warned, strict=True):
        assert expected in warning


def test_image_checks_skip_root_and_defaults(tmp_path: Path) -> None:
    sandbox = ImageSpec(kind="sandbox", path=str(tmp_path))
    policy.check_image(sandbox, sysconf.defaults(), 1000)
    strict = _config("allow container dir = no\nlimit container paths = /nonexistent")
    policy.check_image(sandbox, strict, 0)
    with pytest.raises(ImageError, match=r"limit container paths = /nonexistent"):
        policy.check_image(sandbox, strict, 1000)


@pytest.mark.parametrize("entry", ["{parent}", "{parent}/", "{image}", "/"], ids=["parent", "slash", "itself", "root"])
def test_limit_container_paths_admits(tmp_path: Path, entry: str) -> None:
    image = tmp_path / "images" / "busybox"
    image.mkdir(parents=True)
    config = _config(f"limit container paths = {entry.format(parent=image.parent, image=image)}")
    policy.check_image(ImageSpec(kind="sandbox", path=str(image)), config, 1000)


@pytest.mark.parametrize("entry", ["{image}2", "{parent}/busy", "{image}/sub"], ids=["sibling", "prefix", "below"])
def test_limit_container_paths_refuses(tmp_path: Path, entry: str) -> None:
    image = tmp_path / "images" / "busybox"
    image.mkdir(parents=True)
    config = _config(f"limit container paths = {entry.format(parent=image.parent, image=image)}")
    with pytest.raises(ImageError, match="limit container paths"):
        policy.check_image(ImageSpec(kind="sandbox", path=str(image)), config, 1000)


@pytest.mark.parametrize("line", ["limit container owners = alice", "limit container groups = hpc",
                                  "limit container paths = /scratch", "allow container sif = no",
                                  "allow container squashfs = no", "allow container extfs = no",
                                  "allow container dir = no"])
def test_image_limits_are_noticed_cheaply(line: str) -> None:
    """The launch loads singpy.host.policy only when one of these is set (tests/unit/test_hot_path_imports.py)."""
    assert not sysconf.defaults().changed(sysconf.IMAGE_LIMITS)
    assert not _config("allow container dir = yes\nlimit container paths =\n").changed(sysconf.IMAGE_LIMITS)
    assert _config(line).changed(sysconf.IMAGE_LIMITS)
