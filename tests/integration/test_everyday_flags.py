"""Flags and variables Apptainer users type every day: --pwd/--cwd, *_BINDPATH, escaped commas, HOME, --home."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal


def _own_dir(singpy: Singpy, workdir: Path, name: str) -> Path:
    """A directory of this profile's user under the session's workdir (the test user can't reach tmp_path)."""
    path = workdir / f"{name}-{singpy.profile}"
    path.mkdir(exist_ok=True)
    os.chown(path, singpy.uid, singpy.gid)
    return path


@pytest.mark.parametrize("flag", ["--pwd", "--cwd"])
def test_pwd_and_cwd_choose_the_working_directory(singpy: Singpy, image: Path, flag: str) -> None:
    assert singpy.ok("exec", flag, "/etc", str(image), "pwd") == "/etc\n"


@pytest.mark.parametrize("flag", ["--pwd", "--cwd"])
@pytest.mark.parametrize("isolation", [[], ["--pid"], ["--containall"]])
def test_pwd_missing_in_the_container_is_fatal(singpy: Singpy, image: Path, flag: str, isolation: list[str]) -> None:
    result = singpy.run("exec", *isolation, flag, "/no/such/dir", str(image), "echo", "started")
    assert_one_fatal(result, "/no/such/dir")


@pytest.mark.parametrize(("variable", "where"), [("APPTAINER_PWD", "/etc"), ("SINGULARITY_CWD", "/bin"),
                                                 ("APPTAINER_TARGET_PWD", "/usr")])
def test_pwd_from_the_environment(singpy: Singpy, image: Path, variable: str, where: str) -> None:
    assert singpy.ok("exec", str(image), "pwd", env=singpy.env(**{variable: where})) == f"{where}\n"


@pytest.mark.parametrize("variable", ["APPTAINER_BINDPATH", "SINGULARITY_BINDPATH", "SINGPY_BINDPATH"])
def test_bindpath_variables_add_binds(singpy: Singpy, image: Path, workdir: Path, variable: str) -> None:
    first, second = _own_dir(singpy, workdir, "bindpath-a"), _own_dir(singpy, workdir, "bindpath-b")
    (first / "mark").write_text("first\n")
    (second / "mark").write_text("second\n")
    # As with Apptainer: the empty items of `X="$X,/more"` (X unset) skipped, `rw,ro` read-only.
    env = singpy.env(**{variable: f",{first}:/mnt/a,,{second}:/mnt/b:rw,ro"})
    out = singpy.ok("exec", "-B", f"{first}:/mnt/c", str(image), "cat", "/mnt/a/mark", "/mnt/b/mark", "/mnt/c/mark",
                    env=env)
    assert out == "first\nsecond\nfirst\n"
    assert singpy.run("exec", str(image), "touch", "/mnt/b/new", env=env).returncode != 0  # :ro kept
    assert not (second / "new").exists()


def test_bindpath_and_bind_variables_both_apply(singpy: Singpy, image: Path, workdir: Path) -> None:
    source = _own_dir(singpy, workdir, "bindpath-both")
    (source / "mark").write_text("both\n")
    env = singpy.env(APPTAINER_BIND=f"{source}:/mnt/one", SINGULARITY_BINDPATH=f"{source}:/mnt/two")
    assert singpy.ok("exec", str(image), "cat", "/mnt/one/mark", "/mnt/two/mark", env=env) == "both\nboth\n"


def test_escaped_comma_is_part_of_the_path(singpy: Singpy, image: Path, workdir: Path) -> None:
    source = _own_dir(singpy, workdir, "comma,dir")
    (source / "mark").write_text("comma\n")
    escaped = str(source).replace(",", "\\,")
    out = singpy.ok("exec", "-B", f"{escaped}:/mnt/x,/etc/hostname:/mnt/host", str(image),
                    "sh", "-c", "cat /mnt/x/mark; ls /mnt/host")
    assert out == "comma\n/mnt/host\n"
    env = singpy.env(APPTAINER_BINDPATH=f"{escaped}:/mnt/y")
    assert singpy.ok("exec", str(image), "cat", "/mnt/y/mark", env=env) == "comma\n"


def test_unescaped_comma_still_separates(singpy: Singpy, image: Path, workdir: Path) -> None:
    source = _own_dir(singpy, workdir, "comma,dir")
    result = singpy.run("exec", "-B", f"{source}:/mnt/x", str(image), "true")  # two specs: {workdir}/comma, dir-...
    assert_one_fatal(result, f"{workdir}/comma does not exist")


@pytest.mark.parametrize("contain", [[], ["--contain"]])
def test_home_comes_from_passwd_not_from_the_callers_home(singpy: Singpy, image: Path, workdir: Path,
                                                          contain: list[str]) -> None:
    elsewhere = workdir / "no-such-home"
    out = singpy.ok("exec", *contain, str(image), "sh", "-c", 'echo "$HOME"; grep "^$(id -un):" /etc/passwd',
                    env=singpy.env(HOME=str(elsewhere)))
    home, entry = out.splitlines()
    assert home == singpy.home
    assert entry.split(":")[5] == singpy.home
    assert not elsewhere.exists()


@pytest.mark.parametrize("custom_dest", [True, False])
def test_home_source_missing_on_the_host_is_an_empty_home(singpy: Singpy, image: Path, custom_dest: bool) -> None:
    missing = Path(f"/singpy-absent-home-{singpy.profile}-{os.getpid()}")  # not under a bound host directory
    dest = "/home/custom" if custom_dest else str(missing)
    spec = f"{missing}:{dest}" if custom_dest else str(missing)
    out = singpy.ok("exec", "--home", spec, str(image), "sh", "-c",
                    'echo "$HOME"; ls -A "$HOME" | wc -l; touch "$HOME/new" && echo writable')
    assert out.split() == [dest, "0", "writable"]
    assert not missing.exists()


def test_custom_home_is_mounted_under_contain(singpy: Singpy, image: Path, workdir: Path) -> None:
    home = _own_dir(singpy, workdir, "contained-home")
    (home / "mark").write_text("mine\n")
    out = singpy.ok("exec", "--contain", "--home", f"{home}:/home/me", str(image), "sh", "-c",
                    'echo "$HOME"; pwd; cat "$HOME/mark"')
    assert out == "/home/me\n/home/me\nmine\n"
    plain = singpy.ok("exec", "--contain", str(image), "sh", "-c", 'ls -A "$HOME" | wc -l')
    assert plain.strip() == "0"  # the default home stays empty under --contain
