"""singpy.oci.mirrors: registries.conf as containers/image reads it, and the endpoint fallback (no network)."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from singpy.errors import ImageError
from singpy.host.hostfiles import shown
from singpy.oci import mirrors, regfiles
from singpy.oci.auth import Credentials
from singpy.oci.ref import Reference, parse
from singpy.oci.regerrors import CantWrite, DigestMismatch, Unreachable
from singpy.oci.registry import Registry


def entries(text: str, path: str = "/etc/r.conf") -> tuple[mirrors.Entry, ...]:
    found = mirrors.parse_config(tomllib.loads(text), path, text)
    return tuple(sorted(found, key=lambda entry: entry.prefix))


HUB = '[[registry]]\nprefix = "docker.io"\nlocation = "docker.io"\n'


# --- matching ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "prefix", "length"), [
    ("docker.io/library/debian", "docker.io", 9),
    ("docker.io/library/debian", "docker.io/library", 17),
    ("docker.io/library/debian", "docker.io/library/debian", 24),
    ("docker.io/library/debianx", "docker.io/library/debian", -1),
    ("docker.io/library/debian", "docker.i", -1),
    ("example.com:5000/x", "example.com", 11),  # containers/image's quirk, kept
    ("a.example.com/x", "*.example.com", 13),
    ("b.a.example.com:5000/x", "*.example.com", 15),
    ("example.com/x", "*.example.com", -1),
    ("other.com/a.example.com/x", "*.example.com", -1),
    ("a.example.comx/x", "*.example.com", -1),
])
def test_prefix_matching(name: str, prefix: str, length: int) -> None:
    assert mirrors.matched(name, prefix) == length


def test_the_longest_prefix_wins() -> None:
    found = entries(HUB + '[[registry]]\nprefix = "docker.io/library"\nlocation = "m.example:1/lib"\n'
                    '[[registry]]\nprefix = "*.example"\nlocation = ""\n')
    assert mirrors.find(found, "docker.io/library/debian").prefix == "docker.io/library"  # type: ignore[union-attr]
    assert mirrors.find(found, "docker.io/user/x").prefix == "docker.io"  # type: ignore[union-attr]
    assert mirrors.find(found, "q.example/x").prefix == "*.example"  # type: ignore[union-attr]
    assert mirrors.find(found, "ghcr.io/x") is None


# --- the entries -----------------------------------------------------------------------------------------------------


def test_prefix_defaults_to_location_and_flags_default_to_false() -> None:
    (entry,) = entries('[[registry]]\nlocation = "reg.example:5000/"\n')
    assert entry == mirrors.Entry(prefix="reg.example:5000", location="reg.example:5000", source="/etc/r.conf")


@pytest.mark.parametrize(("text", "problem"), [
    ('[[registry]]\ninsecure = true\n', ":1: [[registry]] has neither 'prefix' nor 'location'"),
    ('[[registry]]\nprefix = "docker.io"\n', "has no 'location'"),
    ('[[registry]]\nprefix = "*.example.com"\nlocation = "x.example.com"\n', "wildcard prefix and a 'location'"),
    (HUB + 'pull-from-mirror = "all"\n', "only a [[registry.mirror]] may have"),
    (HUB + '[[registry.mirror]]\nlocation = "m.example"\npull-from-mirror = "never"\n', "'never', not one of"),
    (HUB + 'mirror-by-digest-only = true\n[[registry.mirror]]\nlocation = "m.example"\npull-from-mirror = "all"\n',
     "can't be set with 'mirror-by-digest-only'"),
    (HUB + '[[registry.mirror]]\ninsecure = true\n', "a mirror without 'location'"),
    ('[[registry]]\nlocation = "http://reg.example"\n', "no URL scheme"),
    (HUB + 'insecure = "yes"\n', "'insecure' must be true or false"),
    ('[[registry]]\nlocation = 5\n', "'location' must be a string"),
    ('registry = 5\n', "'registry' must be [[registry]] tables"),
    (HUB + 'mirror = ["m.example"]\n', "'mirror' must be [[registry.mirror]] tables"),
    (HUB + '[[registry]]\nprefix = "docker.io/library"\nlocation = "docker.io"\ninsecure = true\n',
     "defined more than once with different 'insecure'"),
    ('[registries.block]\nregistries = "x"\n', "[registries.block] registries must be a list of strings"),
    ('[registries.block]\nregistries = ["x.example"]\n' + HUB, "can't be mixed"),
])
def test_bad_entries_are_one_error_naming_the_file(text: str, problem: str) -> None:
    with pytest.raises(ImageError) as raised:
        entries(text)
    assert raised.value.message.startswith("/etc/r.conf") and problem in raised.value.message


def test_a_bad_table_is_named_by_its_line() -> None:
    text = f'# comment\n{HUB}\n  [[ registry ]]\nprefix = "quay.io"\n'
    with pytest.raises(ImageError, match=r"^/etc/r.conf:6: \[\[registry\]\] quay.io has no 'location'"):
        entries(text)


def test_the_first_entry_of_a_prefix_counts() -> None:
    (entry,) = entries(HUB + '[[registry]]\nprefix = "docker.io"\nlocation = "other.example"\n')
    assert entry.location == "docker.io"


def test_version_1_blocks_and_insecure_registries() -> None:
    found = entries('[registries.search]\nregistries = ["docker.io"]\n[registries.block]\nregistries = ["b.example"]\n'
                    '[registries.insecure]\nregistries = ["i.example:5000", "b.example"]\n')
    assert [(entry.prefix, entry.blocked, entry.insecure) for entry in found] == \
        [("b.example", True, True), ("i.example:5000", False, True)]
    with pytest.raises(ImageError, match="a drop-in must be in the version 2 format"):
        mirrors.parse_config({"registries": {}}, "/d/x.conf", drop_in=True)


# --- endpoints -------------------------------------------------------------------------------------------------------


def endpoints(text: str, reference: str) -> list[tuple[str, bool, bool, str]]:
    found = entries(text)
    ref = parse(reference)
    entry = mirrors.find(found, f"{ref.registry}/{ref.repository}")
    assert entry is not None
    return [(str(source.reference), source.insecure, source.mirror, source.blocked)
            for source in mirrors.sources(found, entry, ref)]


def test_mirrors_then_the_location_the_prefix_rewritten() -> None:
    text = ('[[registry]]\nprefix = "docker.io/library"\nlocation = "primary.example/hub/library"\n'
            '[[registry.mirror]]\nlocation = "m1.example:5000/cache"\ninsecure = true\n'
            '[[registry.mirror]]\nlocation = "m2.example"\n')
    assert endpoints(text, "docker://debian:12") == [
        ("docker://m1.example:5000/cache/debian:12", True, True, ""),
        ("docker://m2.example/debian:12", False, True, ""),
        ("docker://primary.example/hub/library/debian:12", False, False, "")]


def test_pull_from_mirror_and_mirror_by_digest_only() -> None:
    digest = "sha256:" + "a" * 64
    text = (HUB + '[[registry.mirror]]\nlocation = "d.example"\npull-from-mirror = "digest-only"\n'
            '[[registry.mirror]]\nlocation = "t.example"\npull-from-mirror = "tag-only"\n'
            '[[registry.mirror]]\nlocation = "a.example"\n')
    assert [host for host, *_ in endpoints(text, "docker://debian")] == \
        ["docker://t.example/library/debian:latest", "docker://a.example/library/debian:latest",
         "docker://docker.io/library/debian:latest"]
    assert [host.split("/")[2] for host, *_ in endpoints(text, f"docker://debian@{digest}")] == \
        ["d.example", "a.example", "docker.io"]
    only = HUB + 'mirror-by-digest-only = true\n[[registry.mirror]]\nlocation = "d.example"\n'
    assert len(endpoints(only, "docker://debian:12")) == 1
    assert len(endpoints(only, f"docker://debian:12@{digest}")) == 2


def test_a_wildcard_prefix_keeps_the_image_host_and_rewrites_for_mirrors() -> None:
    text = '[[registry]]\nprefix = "*.corp.example"\n[[registry.mirror]]\nlocation = "cache.example/corp"\n'
    assert [name for name, *_ in endpoints(text, "docker://a.corp.example/team/x:1")] == \
        ["docker://cache.example/corp/team/x:1", "docker://a.corp.example/team/x:1"]
    with pytest.raises(ImageError, match="turns docker://a.corp.example:5000/team/x:1 into a malformed reference"):
        endpoints(text, "docker://a.corp.example:5000/team/x:1")  # the port is kept (containers/image does too)


def test_blocked_endpoints() -> None:
    text = ('[[registry]]\nprefix = "docker.io"\nlocation = "127.0.0.1:9"\nblocked = true\n'
            '[[registry.mirror]]\nlocation = "bad.example"\n[[registry.mirror]]\nlocation = "good.example"\n'
            '[[registry]]\nlocation = "bad.example"\nblocked = true\n')
    assert [blocked for *_, blocked in endpoints(text, "docker://debian")] == \
        ["bad.example is blocked in /etc/r.conf", "", "docker.io is blocked in /etc/r.conf"]
    only_digests = HUB + 'blocked = true\nmirror-by-digest-only = true\n[[registry.mirror]]\nlocation = "d.example"\n'
    assert "its mirrors are not for this kind of reference" in endpoints(only_digests, "docker://debian")[0][3]


def test_a_location_without_a_host_is_refused() -> None:
    with pytest.raises(ImageError, match="location 'mirror/hub' does not start with a registry host"):
        endpoints('[[registry]]\nprefix = "docker.io"\nlocation = "mirror/hub"\n', "docker://debian")


# --- the files -------------------------------------------------------------------------------------------------------


@pytest.fixture
def system(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The system files, moved to a directory of the test's own."""
    root = tmp_path / "etc"
    (root / "registries.conf.d").mkdir(parents=True)
    monkeypatch.setattr(regfiles, "SYSTEM_FILE", str(root / "registries.conf"))
    monkeypatch.setattr(regfiles, "SYSTEM_DIR", str(root / "registries.conf.d"))
    return root


def conf(prefix: str, location: str) -> str:
    return f'[[registry]]\nprefix = "{prefix}"\nlocation = "{location}"\n'


def test_no_file_at_all_is_none(system: Path, tmp_path: Path) -> None:
    assert mirrors.load({"HOME": str(tmp_path / "home")}, "/nonexistent") is None


def test_the_system_file_then_both_drop_in_directories(system: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    user_dir = home / ".config/containers/registries.conf.d"
    user_dir.mkdir(parents=True)
    (system / "registries.conf").write_text(conf("docker.io", "main.example") + conf("quay.io", "q.example"))
    (system / "registries.conf.d/20-b.conf").write_text(conf("docker.io", "system-20.example"))
    (system / "registries.conf.d/10-a.conf").write_text(conf("docker.io", "system-10.example"))
    (system / "registries.conf.d/30-c.txt").write_text("ignored [")
    (system / "registries.conf.d/40-dir.conf").mkdir()
    (user_dir / "05-user.conf").write_text(conf("docker.io", "user.example") + conf("ghcr.io", "g.example"))
    found = mirrors.load({"HOME": str(home)}, "/nonexistent")
    assert found is not None
    assert {entry.prefix: entry.location for entry in found} == \
        {"docker.io": "user.example", "ghcr.io": "g.example", "quay.io": "q.example"}
    assert [entry.prefix for entry in found] == ["docker.io", "ghcr.io", "quay.io"]


def test_the_users_file_replaces_the_systems_and_its_drop_ins(system: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".config/containers").mkdir(parents=True)
    (home / ".config/containers/registries.conf").write_text(conf("docker.io", "user.example"))
    (system / "registries.conf").write_text(conf("quay.io", "q.example"))
    (system / "registries.conf.d/10-a.conf").write_text(conf("docker.io", "system.example"))
    found = mirrors.load({"HOME": str(home)}, "/nonexistent")
    assert found is not None and [(entry.prefix, entry.location) for entry in found] == [("docker.io", "user.example")]
    assert mirrors.load({}, str(home)) == found  # $HOME unset: the passwd home


def test_the_variable_names_the_file(system: Path, tmp_path: Path) -> None:
    named = tmp_path / "mine.conf"
    named.write_text(conf("docker.io", "mine.example"))
    (system / "registries.conf").write_text(conf("docker.io", "system.example"))
    (system / "registries.conf.d/10-a.conf").write_text(conf("quay.io", "q.example"))
    found = mirrors.load({"CONTAINERS_REGISTRIES_CONF": str(named), "HOME": str(tmp_path)}, "/x")
    assert found is not None and {entry.prefix: entry.location for entry in found} == \
        {"docker.io": "mine.example", "quay.io": "q.example"}
    assert found[0].source == str(named)
    with pytest.raises(ImageError, match="CONTAINERS_REGISTRIES_CONF names .*missing.conf, which does not exist"):
        mirrors.load({"CONTAINERS_REGISTRIES_CONF": str(tmp_path / "missing.conf")}, "/x")


def test_malformed_toml_names_file_and_line(system: Path, tmp_path: Path) -> None:
    (system / "registries.conf").write_text('[[registry]]\nprefix = "docker.io"\nlocation = "x\n')
    with pytest.raises(ImageError) as raised:
        mirrors.load({"HOME": str(tmp_path)}, "/x")
    assert raised.value.message.startswith(f"{shown(str(system / 'registries.conf'))}:3: not valid TOML: ")
    assert "(at line" not in raised.value.message


# --- the client ------------------------------------------------------------------------------------------------------


def no_credentials(ref: Reference, env: Mapping[str, str]) -> Credentials | None:
    return None


def test_a_plain_registry_when_nothing_applies(system: Path, tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    ref = parse("docker://debian")
    assert type(mirrors.registry_for(ref, env=env, home="/x", https=True, credentials=no_credentials)) is Registry
    (system / "registries.conf").write_text(HUB + conf("quay.io", "q.example"))
    assert type(mirrors.registry_for(ref, env=env, home="/x", https=True, credentials=no_credentials)) is Registry
    (system / "registries.conf").write_text(HUB + '[[registry.mirror]]\nlocation = "m.example"\n')
    client = mirrors.registry_for(ref, env=env, home="/x", https=True, credentials=no_credentials)
    assert isinstance(client, mirrors.Mirrored) and len(client.endpoints) == 2


class Fake:
    """A Registry stand-in: each method answers from `answers` (an exception is raised)."""

    def __init__(self, name: str, answer: object, asked: list[str]) -> None:
        self.name, self.answer, self.asked = name, answer, asked

    def _reply(self) -> Any:
        self.asked.append(self.name)
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer

    def manifest(self, reference: str) -> Any:
        return self._reply()

    def blob_bytes(self, digest: str, limit: int) -> Any:
        return self._reply()

    def head_digest(self, reference: str) -> Any:
        return self._reply()

    def close(self) -> None:
        pass


def mirrored(*answers: object, blocked: tuple[int, ...] = ()) -> tuple[mirrors.Mirrored, list[str]]:
    ref = parse("docker://debian")
    sources = [mirrors.Source(reference=parse(f"docker://e{index}.example/library/debian"), insecure=False,
                              mirror=index < len(answers) - 1,
                              blocked="docker.io is blocked in /r.conf" if index in blocked else "")
               for index in range(len(answers))]
    client = mirrors.Mirrored(ref, sources, env={}, https=True, credentials=no_credentials)
    asked: list[str] = []
    for index, answer in enumerate(answers):
        client._clients[index] = Fake(f"e{index}", answer, asked)
    return client, asked


def test_the_first_endpoint_that_answers_and_failed_ones_are_not_asked_again() -> None:
    client, asked = mirrored(Unreachable("can't reach e0"), ImageError("e1: not found"), b"config")
    assert client.blob_bytes("sha256:" + "0" * 64) == b"config"
    assert client.blob_bytes("sha256:" + "0" * 64) == b"config"
    assert asked == ["e0", "e1", "e2", "e2"]


def test_a_blob_that_does_not_match_goes_to_the_next_endpoint_a_manifest_stops() -> None:
    client, asked = mirrored(DigestMismatch("digest mismatch for blob x from e0"), b"good")
    assert client.blob_bytes("sha256:" + "0" * 64) == b"good"
    client, asked = mirrored(DigestMismatch("digest mismatch for manifest x from e0"), "manifest")
    with pytest.raises(DigestMismatch):
        client.manifest("latest")
    assert asked == ["e0"]


@pytest.mark.parametrize("error", [CantWrite("can't write x.partial: no space"), KeyboardInterrupt()])
def test_local_failures_are_not_tried_elsewhere(error: BaseException) -> None:
    client, asked = mirrored(error, b"good")
    with pytest.raises(type(error)):
        client.blob_bytes("sha256:" + "0" * 64)
    assert asked == ["e0"]


def test_all_endpoints_failing_is_one_error_of_the_primary_naming_the_mirrors() -> None:
    client, _ = mirrored(Unreachable("can't reach e0"), Unreachable("can't reach e1", hint="try later"))
    with pytest.raises(Unreachable) as raised:
        client.head_digest("latest")
    assert raised.value.message == "can't reach e1 (mirrors also failed: e0.example: can't reach e0)"
    assert raised.value.hint == "try later"
    client, _ = mirrored(ImageError("e0: not found"), Unreachable("can't reach e1"))
    with pytest.raises(ImageError) as plain:
        client.head_digest("latest")
    assert not isinstance(plain.value, Unreachable)  # a refusal: a cached image must not hide it


def test_a_single_endpoint_keeps_its_error_and_a_blocked_primary_is_never_asked() -> None:
    error = ImageError("not found in e0", hint="h")
    client, _ = mirrored(error)
    with pytest.raises(ImageError) as raised:
        client.manifest("latest")
    assert raised.value is error
    client, asked = mirrored(Unreachable("can't reach e0"), "never", blocked=(1,))
    with pytest.raises(Unreachable, match=r"^can't pull docker://docker.io/library/debian:latest: registry "
                       r"docker.io is blocked in /r.conf \(mirrors also failed: e0.example: can't reach e0\)$"):
        client.manifest("latest")
    assert asked == ["e0"]


def test_the_credentials_given_for_the_registry_never_go_to_a_mirror() -> None:
    seen: list[tuple[str, Mapping[str, str]]] = []

    def credentials(ref: Reference, env: Mapping[str, str]) -> Credentials | None:
        seen.append((ref.registry, env))
        return None

    env = {"SINGPY_DOCKER_USERNAME": "u", "APPTAINER_DOCKER_PASSWORD": "p", "PATH": "/bin"}
    sources = [mirrors.Source(reference=parse(f"docker://{host}/library/debian"), insecure=False, mirror=mirror)
               for host, mirror in (("m.example", True), ("docker.io", False))]
    client = mirrors.Mirrored(parse("docker://debian"), sources, env=env, https=True, credentials=credentials)
    for index in (0, 1):
        client._client(index)
    assert seen == [("m.example", {"PATH": "/bin"}), ("docker.io", env)]
