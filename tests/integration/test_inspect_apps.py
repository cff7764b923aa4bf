"""`inspect --list-apps --json` (and `--all --json`): Apptainer's document, `data.attributes.apps` holding
each SCIF app with its attributes (its AppAttributes: labels, runscript, startscript, test, helpfile,
environment; empty ones left out), for a sandbox, a SIF made of it and a SIF built from a definition file.
As root and as the test user."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import Singpy, readable_by_all
from tests.support.app_images import fixture_built_sif as fixture_built_sif  # noqa: F401
from tests.support.app_images import fixture_tested as fixture_tested  # noqa: F401
from tests.support.app_images import fixture_tested_images as fixture_tested_images  # noqa: F401
from tests.support.leftovers import settled, traces


def _document(singpy: Singpy, *args: str) -> dict[str, object]:
    document = json.loads(singpy.ok("inspect", *args))
    assert document["type"] == "container"
    return dict(document["data"]["attributes"])


def test_list_apps_json_has_each_app_with_its_attributes(singpy: Singpy, tested: Path) -> None:
    before = traces(tested)
    attributes = _document(singpy, "--list-apps", "--json", str(tested))
    assert attributes == {"apps": {"bar": {}, "foo": {"test": "#!/bin/sh\necho foo tested",
                                                     "helpfile": "Help of foo."}}}  # no labels unless asked
    assert settled(before, tested) == before  # the unpacked apps of a SIF are gone


def test_list_apps_json_of_an_image_without_apps(singpy: Singpy, image: Path) -> None:
    assert _document(singpy, "--list-apps", "--json", str(image)) == {}  # "apps" omitted, as Go's omitempty


def test_all_json_has_the_apps_too(singpy: Singpy, tested: Path) -> None:
    attributes = _document(singpy, "--all", "--json", str(tested))
    assert attributes["apps"] == {"bar": {}, "foo": {"test": "#!/bin/sh\necho foo tested", "helpfile": "Help of foo."}}
    assert "runscript" in attributes  # with the image's own sections
    assert "apps" not in _document(singpy, "--json", str(tested))  # only when asked for


def test_all_alone_prints_the_json_document(singpy: Singpy, tested: Path) -> None:
    """Apptainer's --all implies --json: the same document with or without it."""
    assert _document(singpy, "--all", str(tested)) == _document(singpy, "--all", "--json", str(tested))


def test_list_apps_json_of_a_built_image(singpy: Singpy, built_sif: Path) -> None:
    apps = _document(singpy, "--list-apps", "--json", str(built_sif))["apps"]
    assert isinstance(apps, dict) and sorted(apps) == ["other", "tool"]
    tool, other = apps["tool"], apps["other"]
    assert "echo running tool" in tool["runscript"] and "echo running other" in other["runscript"]
    assert tool["helpfile"].strip() == "Help of the tool app."  # as %apphelp wrote it
    assert "echo tool tested" in tool["test"] and "test" not in other
    assert tool["labels"]["SCIF_APP_NAME"] == "tool"  # %applabels-less apps still carry their name label
    assert all(path.startswith("/scif/apps/tool/scif/env/") for path in tool.get("environment", {}))


def test_an_app_labels_json_nested_too_deeply_is_left_out_with_a_warning(singpy: Singpy, workdir: Path) -> None:
    """`[` 100000 deep makes json's scanner raise RecursionError: a warning, as for any labels.json not JSON."""
    root = workdir / "deep-app-labels"
    if not root.exists():
        scif = root / "scif" / "apps" / "a" / "scif"
        scif.mkdir(parents=True)
        (root / "usr").mkdir()  # a container image: a directory with usr/
        (scif / "labels.json").write_text("[" * 100_000)
        (scif / "runscript.help").write_text("Help of a.\n")
        readable_by_all(root)
    for args in (("--all",), ("--list-apps", "--json")):
        result = singpy.run("inspect", *args, str(root))
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr == "WARNING: Unable to parse labels of /scif/apps/a/scif/labels.json: nested too " \
                                "deeply\n"
        assert json.loads(result.stdout)["data"]["attributes"]["apps"] == {"a": {"helpfile": "Help of a."}}
