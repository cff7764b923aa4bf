"""`config global --reset` of a list directive writes its template's lines back (Apptainer regenerates its
template): singpy.config.edit.TEMPLATE_LISTS is checked here against etc/singpy.conf, singpy's template."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from singpy.config import edit, sysconf

SHIPPED = Path(sysconf.SHIPPED_DIR) / "singpy.conf"


def _template_values(name: str) -> tuple[str, ...]:
    config = edit.ConfigFile(str(SHIPPED))
    return tuple(config.values(name))


@pytest.mark.parametrize("directive", [d for d in sysconf.DIRECTIVES if d.kind == sysconf.LIST], ids=str)
def test_template_lists_are_the_shipped_templates_lines(directive: sysconf.Directive) -> None:
    assert edit.TEMPLATE_LISTS.get(directive.name, ()) == _template_values(directive.name)


def test_bind_path_template_is_apptainers() -> None:
    assert edit.TEMPLATE_LISTS == {"bind path": ("/etc/localtime", "/etc/hosts")}


@pytest.mark.parametrize("start", ["", "bind path = /opt\n", "# bind path = /x\nmount home = no\n"])
def test_reset_bind_path_gives_the_two_template_lines(tmp_path: Path, start: str) -> None:
    path = tmp_path / "singpy.conf"
    path.write_text(start)
    text = edit.edit(edit.ConfigFile(str(path)), "reset", "bind path", "")
    assert text is not None
    lines = text.splitlines()
    assert [line for line in lines if line.startswith("bind path")] == ["bind path = /etc/localtime",
                                                                        "bind path = /etc/hosts"]
    assert [line for line in lines if not line.startswith("bind path")] == \
        [line for line in start.splitlines() if not line.startswith("bind path")]
    assert not os.path.exists(tmp_path / "singpy.conf.new")  # edit() writes nothing itself


def test_reset_of_an_untemplated_list_leaves_no_line(tmp_path: Path) -> None:
    path = tmp_path / "singpy.conf"
    path.write_text("allow net users = alice\nallow net users = bob\nmount home = yes\n")
    assert edit.edit(edit.ConfigFile(str(path)), "reset", "allow net users", "") == "mount home = yes\n"
