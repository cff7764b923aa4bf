"""Apptainer's remote.yaml rules (internal/pkg/remote.Config): the system's remotes merged into the user's,
exclusive remotes, what the user may remove, the layout written and the keys refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from singpy.library.remotes import RemoteError, Remotes, load, save, user_path


def system() -> Remotes:
    return Remotes({"Active": "site", "Remotes": {"site": {"URI": "lib.site.org", "System": True,
                                                           "Exclusive": False}}}, path="/sys", system=True)


def test_sync_from_marks_system_remotes_and_keeps_the_users_choice() -> None:
    mine = Remotes({"Active": "own", "Remotes": {"own": {"URI": "own.org"}}}, path="/u", system=False)
    mine.sync_from(system())
    assert mine.active == "own" and mine.remotes["site"]["System"] is True
    fresh = Remotes({}, path="/u", system=False)
    fresh.sync_from(system())
    assert fresh.active == "site"


def test_exclusive_wins_and_users_cant_set_it() -> None:
    admin = system()
    admin.use("site", exclusive=True)
    mine = Remotes({"Active": "own", "Remotes": {"own": {"URI": "own.org"}}}, path="/u", system=False)
    mine.sync_from(admin)
    assert mine.active == "site"
    with pytest.raises(RemoteError, match="set exclusive by the system administrator"):
        mine.use("own", exclusive=False)
    with pytest.raises(RemoteError, match="exclusive can't be set by user"):
        mine.use("site", exclusive=True)
    with pytest.raises(RemoteError, match="is global and can't be removed"):
        mine.remove("site")


def test_written_as_apptainer_writes_it(tmp_path: Path) -> None:
    remotes = Remotes({}, path=str(tmp_path / "remote.yaml"), system=False)
    remotes.add("lib", "lib.org", insecure=False, make_default=True)
    remotes.remotes["lib"]["Token"] = "t"
    save(remotes)
    text = (tmp_path / "remote.yaml").read_text()
    assert text.splitlines()[:3] == ["Active: lib", "Remotes:", "    lib:"]
    assert list(yaml.safe_load(text)["Remotes"]["lib"]) == ["URI", "Token", "System", "Exclusive"]
    assert (tmp_path / "remote.yaml").stat().st_mode & 0o777 == 0o600
    assert load(str(tmp_path / "remote.yaml"), system=False).remotes == remotes.remotes


@pytest.mark.parametrize(("text", "why"), [
    ("- a list\n", "not a YAML mapping"), ("Remotes: {x: {URI: a, Extra: 1}}\n", "unknown key 'Extra'"),
    ("Remotes: {x: {URI: [1]}}\n", "URI must be a string"), ("Active: [x]\n", "Active must be a name"),
    ("Remotes: {x: [\n", "can't parse"),
])
def test_refused_files(tmp_path: Path, text: str, why: str) -> None:
    (tmp_path / "remote.yaml").write_text(text)
    with pytest.raises(RemoteError, match=why.replace("[", r"\[")):
        load(str(tmp_path / "remote.yaml"), system=False)


def test_user_path_variables() -> None:
    assert user_path({"APPTAINER_CONFIGDIR": "/c"}, "/home/u") == "/c/remote.yaml"
    assert user_path({"SINGPY_CONFIGDIR": "/s", "APPTAINER_CONFIGDIR": "/c"}, "/home/u") == "/s/remote.yaml"
    assert user_path({}, "/home/u") == "/home/u/.apptainer/remote.yaml"
