"""singpy.config.sysconf: singpy.conf directives, defaults, errors with file:line, and where it is read from."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from singpy.config import sysconf
from singpy.config.sysconf import BOOL, CHOICE, DIRECTIVES, INT, LIST, STRING, Directive, SysConfig
from singpy.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "etc" / "singpy.conf"

EXPECTED_DEFAULTS = {
    "bind path": (),
    "mount proc": True,
    "mount sys": True,
    "mount dev": "yes",
    "mount devpts": True,
    "mount home": True,
    "mount tmp": True,
    "mount hostfs": False,
    "mount slave": True,
    "user bind control": True,
    "allow pid ns": True,
    "config passwd": True,
    "config group": True,
    "config resolv_conf": True,
    "always use nv": False,
    "always use rocm": False,
    "use nvidia-container-cli": True,
    "nvidia-container-cli path": "",
    "ldconfig path": "/sbin/ldconfig",
    "root default capabilities": "full",
    "allow net users": (),
    "allow net networks": (),
    "network bridge name": "singpy0",
    "network bridge subnet": "10.22.0.0/16",
    "network ptp subnet": "10.23.0.0/16",
    "unsquash": False,
    "unsquash in background": True,
    "unsquash in background max size": 4096,
    "allow kernel extfs": True,
    "allow kernel squashfs": True,
    "allow ipc ns": True,
    "allow uts ns": True,
    "allow net groups": (),
    "enable fusemount": True,
    "allow netns paths": (),
    "enable overlay": "yes",
    "enable underlay": "yes",
    "avoid kernel features": (),
    "sessiondir max size": 64,
    "max loop devices": 256,
    "memory fs type": "tmpfs",
    "limit container owners": (),
    "limit container groups": (),
    "limit container paths": (),
    "allow container sif": True,
    "allow container encrypted": True,
    "allow container squashfs": True,
    "allow container extfs": True,
    "allow container dir": True,
}
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


# --- Apptainer's apptainer.conf carries over -------------------------------------------------------------------------

# The directives of Apptainer 1.4.5's default apptainer.conf (pkg/util/apptainerconf/config.go, TemplateAsset rendered
# with the defaults), in its order; its comment lines are skipped like any other.
STOCK_APPTAINER_CONF = """\
# APPTAINER.CONF
allow setuid = yes
max loop devices = 256
allow ipc ns = yes
allow pid ns = yes
allow user ns = yes
allow uts ns = yes
config passwd = yes
config group = yes
config resolv_conf = yes
mount proc = yes
mount sys = yes
mount dev = yes
mount devpts = yes
mount home = yes
mount tmp = yes
mount hostfs = no
#bind path = /etc/apptainer/default-nsswitch.conf:/etc/nsswitch.conf
bind path = /etc/localtime
bind path = /etc/hosts
user bind control = yes
enable fusemount = yes
enable overlay = yes
enable underlay = yes
mount slave = yes
sessiondir max size = 64
#limit container owners = gmk, apptainer, nobody
allow container sif = yes
allow container encrypted = yes
allow container squashfs = yes
allow container extfs = yes
allow container dir = yes
# allow setuid-mount encrypted = yes
# allow setuid-mount squashfs = iflimited
# allow setuid-mount extfs = no
#allow net users = gmk, apptainer
always use nv = no
use nvidia-container-cli = no
always use rocm = no
root default capabilities = full
memory fs type = tmpfs
#cni configuration path =
mksquashfs procs = 0
shared loop devices = no
image driver =
download concurrency = 3
download part size = 5242880
download buffer size = 32768
systemd cgroups = yes
apptheus socket path = /run/apptheus/gateway.sock
allow monitoring = no
"""

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

IGNORED_IN_STOCK = ["allow setuid", "allow user ns",
                    "mksquashfs procs", "shared loop devices", "image driver", "download concurrency",
                    "download part size", "download buffer size", "systemd cgroups", "apptheus socket path",
                    "allow monitoring"]


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
