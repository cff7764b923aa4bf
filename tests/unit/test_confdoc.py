"""docs/configuration.md and etc/singpy.conf describe exactly the directives the parser knows."""

from __future__ import annotations

from pathlib import Path

from singpy.config.confdoc import render_table
from singpy.config.sysconf import DIRECTIVES

REPO = Path(__file__).resolve().parent.parent.parent


def test_configuration_doc_carries_the_generated_table() -> None:
    assert render_table() in (REPO / "docs" / "configuration.md").read_text()


def test_shipped_conf_mentions_every_directive() -> None:
    text = (REPO / "etc" / "singpy.conf").read_text()
    missing = [d.name for d in DIRECTIVES if f"{d.name} =" not in text]  # possibly commented out
    assert missing == []
