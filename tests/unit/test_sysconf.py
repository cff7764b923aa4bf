"""singpy.config.sysconf: singpy.conf directives, defaults, errors with file:line, and where it is read from
(Apptainer's apptainer.conf carrying over: test_sysconf_apptainer.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from singpy.config import sysconf
from singpy.config.sysconf import BOOL, CHOICE, DIRECTIVES, INT, LIST, STRING, Directive, SysConfig
from singpy.errors import ConfigError
from tests.support.sysconf_expected import EXPECTED_DEFAULTS, STOCK_APPTAINER_CONF

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "etc" / "singpy.conf"

# Written in the shipped etc/singpy.conf: every directive singpy applies, at its default.
APPLIED = list(EXPECTED_DEFAULTS)[:list(EXPECTED_DEFAULTS).index("allow kernel squashfs") + 1]


@pytest.mark.parametrize(("name", "value"), list(EXPECTED_DEFAULTS.items()), ids=list(EXPECTED_DEFAULTS))
def test_default(name: str, value: object) -> None:
    config = sysconf.defaults()
    assert config.get(name) == value
    assert type(config.get(name)) is type(value)


def test_defaults_cover_every_directive_and_nothing_else() -> None:
    config = sysconf.defaults()
    assert config.path == ""
    assert dict(config.values) == EXPECTED_DEFAULTS
    assert [d.name for d in DIRECTIVES] == list(EXPECTED_DEFAULTS)
    assert sysconf.parse("", "empty.conf").values == config.values


def test_directive_table_is_consistent() -> None:
    for directive in DIRECTIVES:
        assert directive.kind in (BOOL, CHOICE, STRING, LIST, INT), directive.name
        assert directive.doc, directive.name
        if directive.kind == CHOICE:
            assert directive.default in directive.allowed, directive.name
        if directive.kind == LIST:
            assert directive.default == (), directive.name


def test_accessors() -> None:
    config = sysconf.parse("bind path = /a\nmount dev = minimal\nmount home = no\n", "test.conf")
    assert config.items("bind path") == ("/a",)
    assert config.text("mount dev") == "minimal"
    assert config.flag("mount home") is False
    assert config.flag("mount proc") is True


def test_shipped_file_parses_and_equals_defaults_except_bind_path() -> None:
    config = sysconf.load(str(SHIPPED))
    assert config.path == str(SHIPPED)
    assert config.items("bind path") == ("/etc/localtime", "/etc/hosts")
    assert {**config.values, "bind path": ()} == EXPECTED_DEFAULTS


def test_shipped_file_lists_every_directive_except_the_network_lists() -> None:
    text = SHIPPED.read_text()
    written = {line.partition("=")[0].strip() for line in text.splitlines() if line.strip() and
               not line.lstrip().startswith("#")}
    assert written == set(APPLIED) - {"allow net users", "allow net networks"}


@pytest.mark.parametrize(
    ("text", "name", "value"),
    [
        ("mount home = no", "mount home", False),
        ("mount home = NO", "mount home", False),
        ("mount home = false", "mount home", False),
        ("mount home = 0", "mount home", False),
        ("mount hostfs = yes", "mount hostfs", True),
        ("mount hostfs = True", "mount hostfs", True),
        ("mount hostfs = 1", "mount hostfs", True),
        ("mount dev = minimal", "mount dev", "minimal"),
        ("mount dev = no", "mount dev", "no"),
        ("root default capabilities = file", "root default capabilities", "file"),
        ("ldconfig path = /usr/sbin/ldconfig", "ldconfig path", "/usr/sbin/ldconfig"),
        ("nvidia-container-cli path =", "nvidia-container-cli path", ""),
        ("ldconfig path = /a b = c", "ldconfig path", "/a b = c"),
        ("   mount    home   =   no   ", "mount home", False),
        ("\tmount\thome\t=\tno", "mount home", False),
        ("mount home = yes\nmount home = no", "mount home", True),
        ("mount dev = minimal\nmount dev = maybe", "mount dev", "minimal"),
        ("bind path = /a\nbind path = /b:/c\n# x\nbind path = /a", "bind path", ("/a", "/b:/c", "/a")),
        ("allow net users = alice\nallow net users = bob", "allow net users", ("alice", "bob")),
    ],
    ids=["bool-no", "bool-case", "bool-false", "bool-0", "bool-yes", "bool-True", "bool-1", "choice-minimal",
         "choice-no", "choice-caps", "string", "string-empty", "string-keeps-equals", "spaces", "tabs",
         "first-wins", "first-wins-later-unread", "bind-path-in-order", "list"],
)
def test_parse_values(text: str, name: str, value: object) -> None:
    config = sysconf.parse(text, "test.conf")
    assert config.get(name) == value
    assert config.path == "test.conf"


def test_comments_and_blank_lines_are_skipped() -> None:
    text = "# comment\n\n   \n\t# indented comment\nmount sys = no\n"
    assert dict(sysconf.parse(text, "t.conf").values) == {**EXPECTED_DEFAULTS, "mount sys": False}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("mount home = maybe", "site.conf:1: mount home must be yes or no, not 'maybe'"),
        ("# c\n\nmount home =", "site.conf:3: mount home must be yes or no, not ''"),
        ("mount dev = some", "site.conf:1: mount dev must be one of yes, no, minimal, not 'some'"),
        ("\n\nmount dev = Minimal", "site.conf:3: mount dev must be one of yes, no, minimal, not 'Minimal'"),
        ("root default capabilities = all",
         "site.conf:1: root default capabilities must be one of full, file, no, not 'all'"),
        ("bogus = 1", "site.conf:1: unknown directive 'bogus'"),
        ("mount proc = yes\n  mount home\n", "site.conf:2: unknown directive 'mount home'"),
        ("mount proc = yes\n\n\n\nmounthome = yes", "site.conf:5: unknown directive 'mounthome'"),
        ("= yes", "site.conf:1: unknown directive ''"),
        ("Mount Home = yes", "site.conf:1: unknown directive 'Mount Home'"),
        ("avoid kernel features = openat2", "site.conf:1: avoid kernel features: unknown feature 'openat2' "
         "(known: mount_setattr, loop_configure, userns_overlay)"),
        ("enable underlay = maybe", "site.conf:1: enable underlay must be one of yes, no, preferred, not 'maybe'"),
    ],
    ids=["bool", "bool-empty-line-3", "choice", "choice-case-line-3", "choice-caps",
         "unknown", "no-equals", "unknown-line-5", "empty-key", "key-case", "unknown-feature", "underlay-choice"],
)
def test_parse_errors_carry_file_and_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        sysconf.parse(text, "site.conf")
    assert caught.value.message == message
    assert caught.value.exit_code == 255


def test_int_values_and_errors_carry_file_and_line() -> None:
    directive = Directive("max things", INT, 0, "a number")
    assert sysconf._convert(directive, "42", "x.conf:7") == 42
    assert sysconf._convert(directive, "0", "x.conf:7") == 0
    for bad in ("many", "-3", "", "1.5", "\u0663"):  # Apptainer's numbers are unsigned; an Arabic-Indic 3 is no number
        with pytest.raises(ConfigError) as caught:
            sysconf._convert(directive, bad, "x.conf:7")
        assert caught.value.message == f"x.conf:7: max things must be a number (0 or more), not {bad!r}"


def test_load_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "singpy.conf"
    path.write_text("mount tmp = no\nbind path = /x\n")
    config = sysconf.load(str(path))
    assert config == SysConfig(str(path), {**EXPECTED_DEFAULTS, "mount tmp": False, "bind path": ("/x",)})


def test_load_error_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "singpy.conf"
    path.write_text("mount tmp = no\nmount sys = sometimes\n")
    with pytest.raises(ConfigError, match=rf"^{path}:2: mount sys must be yes or no"):
        sysconf.load(str(path))


def test_load_missing_file_is_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.conf"
    with pytest.raises(ConfigError) as caught:
        sysconf.load(str(missing))
    assert caught.value.message == f"can't read configuration {missing}: No such file or directory"


def test_default_path_prefers_singpy_config(tmp_path: Path) -> None:
    chosen = str(tmp_path / "not-even-there.conf")
    assert sysconf.default_path({"SINGPY_CONFIG": chosen}) == chosen


def test_default_path_system_file_when_present(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    system = tmp_path / "etc-singpy" / "singpy.conf"
    system.parent.mkdir()
    system.write_text("")
    # Stand-in for /etc/singpy/singpy.conf, which tests must not create on the host.
    monkeypatch.setattr(sysconf, "SYSTEM_PATH", str(system))
    assert sysconf.default_path({}) == str(system)
    assert sysconf.default_path({"SINGPY_CONFIG": ""}) == str(system)
    assert sysconf.default_path({"SINGPY_CONFIG": "/x.conf"}) == "/x.conf"


def test_default_path_shipped_file_otherwise(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sysconf, "SYSTEM_PATH", str(tmp_path / "absent.conf"))
    assert sysconf.default_path({}) == str(SHIPPED)
    assert sysconf.default_path({"SINGPY_CONFIG": ""}) == str(SHIPPED)


def test_real_system_path_constant() -> None:
    assert sysconf.SYSTEM_PATH == "/etc/singpy/singpy.conf"
    expected = sysconf.SYSTEM_PATH if Path(sysconf.SYSTEM_PATH).exists() else str(SHIPPED)
    assert sysconf.default_path({}) == expected


def test_confdir(tmp_path: Path) -> None:
    assert sysconf.confdir(sysconf.defaults()) == str(REPO / "etc")
    assert sysconf.confdir(sysconf.parse("", str(tmp_path / "site.conf"))) == str(tmp_path)


# --- bad input: one ConfigError naming file:line, never a hang or a traceback later ---------------------------------


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("bind path = etc/hosts", "bind path source 'etc/hosts' is not an absolute path"),
        ("bind path = /etc/hosts:etc/hosts", "bind path destination 'etc/hosts' is not an absolute path"),
        ("bind path = ./x", "bind path source './x' is not an absolute path"),
        ("bind path =", "bind path must be src[:dest] (absolute paths), not ''"),
        ("bind path = :/x", "bind path must be src[:dest] (absolute paths), not ':/x'"),
        ("bind path = /a:/b:ro", "bind path must be src[:dest] (absolute paths), not '/a:/b:ro'"),
        ("bind path = /tmp:/", "bind path '/tmp:/' would replace the container's root directory /"),
        ("bind path = /tmp:/.", "bind path '/tmp:/.' would replace the container's root directory /"),
        ("bind path = /tmp://", "bind path '/tmp://' would replace the container's root directory /"),
        ("bind path = /", "bind path '/' would replace the container's root directory /"),
        ("bind path = /" + "n" * 256, "a component is longer than NAME_MAX (256 bytes, 255 at most)"),
        ("bind path = /tmp:" + "/d" * 2048, "longer than PATH_MAX (4096 bytes, 4095 at most)"),
        ("ldconfig path = /" + "l" * 300, "a component is longer than NAME_MAX (300 bytes, 255 at most)"),
    ],
    ids=["relative-source", "relative-dest", "dot-relative", "empty", "empty-source", "options", "onto-root",
         "onto-root-dot", "onto-root-double-slash", "root-itself", "name-max", "path-max", "program-path"],
)
def test_bad_paths_carry_file_and_line(line: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        sysconf.parse(f"mount proc = yes\n\n{line}\n", "site.conf")
    assert caught.value.message.startswith("site.conf:3: ")
    assert reason in caught.value.message
    assert len(caught.value.message) < 300  # a long path is shortened, the line stays readable


@pytest.mark.parametrize("value", ["/etc/hosts", "/etc/hosts:", "/data:/mnt/data", "/a:/b/../c"],
                         ids=["same-path", "empty-dest", "other-dest", "dest-normalised-later"])
def test_good_bind_paths(value: str) -> None:
    assert sysconf.parse(f"bind path = {value}", "t.conf").items("bind path") == (value,)


@pytest.mark.parametrize(("data", "message"), [
    (b"mount proc = yes\nmount home = \xe9\n", "{path}:2: not UTF-8 text (byte 0xe9)"),
    (b"mount proc = yes\0\n", "{path}:1: a NUL byte: not a text file"),
    (b"#" * (2 << 20), "configuration {path} is too large (more than 1 MiB)"),
], ids=["latin1", "nul", "too-large"])
def test_load_refuses_what_is_not_a_configuration(tmp_path: Path, data: bytes, message: str) -> None:
    path = tmp_path / "singpy.conf"
    path.write_bytes(data)
    with pytest.raises(ConfigError) as caught:
        sysconf.load(str(path))
    assert caught.value.message == message.format(path=path)


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_load_refuses_special_files_without_blocking(tmp_path: Path, kind: str) -> None:
    path = {"fifo": tmp_path / "fifo", "device": Path("/dev/zero"), "directory": tmp_path}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    with pytest.raises(ConfigError, match=rf"^configuration {path} is a .*, not a regular file$"):
        sysconf.load(str(path))  # returns at once: a FIFO is never opened for a blocking read


# --- where singpy looks --------------------------------------------------------------------------------------------


def _candidates(root: Path) -> list[Path]:
    return [root / "etc/singpy/singpy.conf", root / "etc/apptainer/apptainer.conf",
            root / "etc/singularity/singularity.conf", root / "shipped/singpy.conf"]


@pytest.mark.parametrize("present", [(0, 1, 2, 3), (1, 2, 3), (2, 3), (3,), (1,), (2,), ()],
                         ids=["singpy", "apptainer", "singularity", "shipped", "apptainer-only", "singularity-only",
                              "none"])
def test_choose_path_order(tmp_path: Path, present: tuple[int, ...]) -> None:
    candidates = _candidates(tmp_path)
    for index in present:
        candidates[index].parent.mkdir(parents=True)
        candidates[index].write_text("")
    expected = str(candidates[present[0]]) if present else ""
    assert sysconf.choose_path({}, [str(path) for path in candidates]) == expected
    assert sysconf.choose_path({"SINGPY_CONFIG": "/named.conf"}, [str(path) for path in candidates]) == "/named.conf"


def test_default_path_reads_apptainer_conf_when_no_singpy_conf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    apptainer = tmp_path / "apptainer" / "apptainer.conf"
    apptainer.parent.mkdir()
    apptainer.write_text(STOCK_APPTAINER_CONF)
    (apptainer.parent / "nvliblist.conf").write_text("libcuda.so\n")
    monkeypatch.setattr(sysconf, "SYSTEM_PATH", str(tmp_path / "absent.conf"))
    monkeypatch.setattr(sysconf, "APPTAINER_PATHS", (str(apptainer), str(tmp_path / "singularity.conf")))
    path = sysconf.default_path({})
    assert path == str(apptainer)
    config = sysconf.load(path)
    assert sysconf.confdir(config) == str(apptainer.parent)  # nvliblist.conf / rocmliblist.conf beside it


def test_default_path_built_in_defaults_when_nothing_exists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An installed wheel without its data files (pip --target, say): built-in defaults, not an error."""
    monkeypatch.setattr(sysconf, "SYSTEM_PATH", str(tmp_path / "a.conf"))
    monkeypatch.setattr(sysconf, "APPTAINER_PATHS", (str(tmp_path / "b.conf"),))
    monkeypatch.setattr(sysconf, "SHIPPED_DIR", str(tmp_path / "no-etc"))
    monkeypatch.setattr(sysconf, "INSTALLED_DIR", str(tmp_path / "no-prefix-etc"))
    assert sysconf.default_path({}) == ""
    assert sysconf.load("") == sysconf.defaults()
    assert sysconf.confdir(sysconf.defaults()) == str(tmp_path / "no-prefix-etc")


def test_default_path_installed_data_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    installed = tmp_path / "prefix" / "etc" / "singpy"
    installed.mkdir(parents=True)
    (installed / "singpy.conf").write_text("mount tmp = no\n")
    monkeypatch.setattr(sysconf, "SYSTEM_PATH", str(tmp_path / "a.conf"))
    monkeypatch.setattr(sysconf, "APPTAINER_PATHS", ())
    monkeypatch.setattr(sysconf, "SHIPPED_DIR", str(tmp_path / "no-etc"))
    monkeypatch.setattr(sysconf, "INSTALLED_DIR", str(installed))
    assert sysconf.default_path({}) == str(installed / "singpy.conf")
    assert sysconf.confdir(sysconf.defaults()) == str(installed)


def test_real_apptainer_paths_constant() -> None:
    assert sysconf.APPTAINER_PATHS == ("/etc/apptainer/apptainer.conf", "/etc/singularity/singularity.conf")
