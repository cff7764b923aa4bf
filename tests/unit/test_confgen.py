"""`singpy confgen`'s text (singpy.config.confgen.generate): the shipped template with OLD's settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from singpy.config import sysconf
from singpy.config.confgen import generate
from singpy.errors import ConfigError
from tests.support.sysconf_expected import IGNORED_IN_STOCK, STOCK_APPTAINER_CONF

# The stock apptainer.conf as an administrator left it: settings away from the defaults, a list directive
# given twice (one line a comma list), single ones given twice (the first counts, as singpy reads it).
EDITED = (STOCK_APPTAINER_CONF.replace("mount home = yes", "mount home = no\nmount home = yes")
          .replace("allow pid ns = yes", "allow pid ns = no")
          .replace("root default capabilities = full", "root default capabilities = file")
          + "bind path = /opt/data:/data, /scratch\nroot default capabilities = no\n")


def template() -> str:
    return Path(sysconf.shipped_path()).read_text()


def test_without_old_it_is_the_template() -> None:
    assert generate(None) == (template(), [])


def test_every_setting_of_old_is_kept(tmp_path: Path) -> None:
    old = tmp_path / "apptainer.conf"
    old.write_text(EDITED)
    text, dropped = generate(str(old))
    new, before = sysconf.parse(text, "new"), sysconf.parse(EDITED, "old")
    assert new.values == before.values
    assert not new.flag("mount home") and not new.flag("allow pid ns")
    assert new.items("bind path")[-2:] == ("/opt/data:/data", "/scratch")
    assert new.text("root default capabilities") == "file"
    assert dropped == [name for name in IGNORED_IN_STOCK if f"\n{name} =" in EDITED]


def test_the_templates_comments_stay(tmp_path: Path) -> None:
    old = tmp_path / "apptainer.conf"
    old.write_text(EDITED)
    text, _ = generate(str(old))
    comments = [line for line in template().splitlines() if line.startswith("#")]
    assert [line for line in text.splitlines() if line.startswith("#")] == comments
    assert "# APPTAINER.CONF" not in text  # OLD's own comments are not copied


@pytest.mark.parametrize(("content", "message"), [
    ("mount home = maybe\n", "old.conf:1: mount home must be yes or no"),
    ("no such directive = 1\n", "old.conf:1: unknown directive 'no such directive'"),
])
def test_a_mistake_in_old_is_its_line(tmp_path: Path, content: str, message: str) -> None:
    old = tmp_path / "old.conf"
    old.write_text(content)
    with pytest.raises(ConfigError, match=message):
        generate(str(old))
