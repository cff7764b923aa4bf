"""`singpy pull` through its hand parser (singpy.cli.fastpull) and through typer: the same file, the same errors.

The real command takes the fast path for these command lines; the typer path is the same `main` with the
hand parser switched off (as it is for any command line it does not understand). Both run as the profile's
user, against the suite's registry, as root and as the unprivileged test user.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import Singpy, assert_one_fatal
from tests.support.leftovers import settled, traces
from tests.support.oras_sifs import sdk_pushed, user_dir
from tests.support.registry import RegistryServer
from tests.support.sifs import new_cache

THROUGH_TYPER = ("import sys\nfrom singpy.cli import fastpull\nfastpull.run = lambda argv: None\n"
                 "from singpy.cli.main import main\nsys.exit(main(sys.argv[1:]))\n")


def through_typer(singpy: Singpy, args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`singpy ARGS` as the profile's user, its `pull` parsed by typer."""
    result: subprocess.CompletedProcess[str] = subprocess.run(  # type: ignore[call-overload]
        [sys.executable, "-c", THROUGH_TYPER, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120,
        **singpy.switch())
    return result


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_both_paths_write_the_same_file(singpy: Singpy, registry_plain: RegistryServer, workdir: Path) -> None:
    sif, reference = sdk_pushed(singpy, registry_plain, workdir, "fastpath-src", f"fastpath/same-{singpy.profile}:1.0")
    folder = user_dir(singpy, workdir, "fastpath-same")
    outputs = {}
    for path in ("fast", "typer"):
        env = singpy.env(SINGPY_CACHEDIR=str(new_cache(singpy, workdir, f"fastpath-{path}")), APPTAINER_NOHTTPS="1")
        (folder / path).mkdir()
        os.chown(folder / path, singpy.uid, singpy.gid)
        args = ["pull", "--dir", str(folder / path), reference]
        result = singpy.run(*args, env=env, cwd=folder) if path == "fast" else through_typer(singpy, args, env, folder)
        assert result.returncode == 0, result.stderr
        outputs[path] = (result.stdout, result.stderr.replace(f"/{path}/", "/DIR/"))
    assert outputs["fast"] == outputs["typer"]
    fast, typer = (folder / path / f"same-{singpy.profile}_1.0.sif" for path in ("fast", "typer"))
    assert digest(fast) == digest(typer) == digest(sif)
    assert (fast.stat().st_mode, fast.stat().st_uid) == (typer.stat().st_mode, singpy.uid)


def test_both_paths_fail_alike_and_leave_nothing(singpy: Singpy, registry_plain: RegistryServer,
                                                 workdir: Path) -> None:
    repository = f"fastpath/err-{singpy.profile}"
    sdk_pushed(singpy, registry_plain, workdir, "fastpath-err", f"{repository}:v1")
    host = registry_plain.host
    folder = user_dir(singpy, workdir, "fastpath-errors")
    existing = folder / "existing.sif"
    existing.write_text("mine\n")
    cache = new_cache(singpy, workdir, "fastpath-errors")
    env = singpy.env(SINGPY_CACHEDIR=str(cache))
    cases = {
        "missing tag": (["pull", "--no-https", str(folder / "o.sif"), f"oras://{host}/{repository}:none"],
                        f"oras://{host}/{repository}:none not found in registry {host}", 255),
        "target exists": (["pull", "--nohttps", str(existing), f"oras://{host}/{repository}:v1"],
                          str(existing), 255),
        "three words": (["pull", "a.sif", "b.sif", f"oras://{host}/{repository}:v1"],
                        "singpy pull takes [OUT.sif] REF, not 3 arguments", 1),
        "bad reference": (["pull", "--no-https", str(folder / "o.sif"), f"oras://{host}/Bad/UPPER:v1"],
                          f"oras://{host}/Bad/UPPER:v1", 255),
        "unreachable": (["pull", "--no-https", str(folder / "o.sif"), "oras://127.0.0.1:1/x:v1"],
                        "127.0.0.1:1", 255),
    }
    before = traces(folder, cache)
    for name, (args, message, code) in cases.items():
        fast = singpy.run(*args, env=env, cwd=folder)
        typer = through_typer(singpy, args, env, folder)
        assert_one_fatal(fast, message, code)
        assert (fast.returncode, fast.stdout, fast.stderr) == (typer.returncode, typer.stdout, typer.stderr), name
    assert sorted(os.listdir(folder)) == ["existing.sif"]
    assert existing.read_text() == "mine\n"
    assert settled(before, folder, cache) == before


def test_help_and_unknown_flags_go_to_typer(singpy: Singpy, workdir: Path) -> None:
    """What the hand parser leaves alone still gets typer's answers: the help, and one FATAL for a typo."""
    assert "--docker-login" in singpy.ok("pull", "--help")
    typo = singpy.run("pull", "--forse", "oras://h.org/x:1")
    assert_one_fatal(typo, "--forse", code=1)
    refused = singpy.run("pull", "oras://h.org/x:1", env=singpy.env(APPTAINER_FORCE="maybe"))
    assert_one_fatal(refused, "maybe", code=1)


def test_disable_cache_pulls_through_a_temporary_cache(singpy: Singpy, registry_plain: RegistryServer,
                                                       workdir: Path) -> None:
    """--disable-cache (or APPTAINER_DISABLE_CACHE), as Apptainer's: the file is written, the user's cache is
    neither read nor written, and the temporary one is gone afterwards; through either parser."""
    sif, reference = sdk_pushed(singpy, registry_plain, workdir, "fastpath-nocache",
                                f"fastpath/nocache-{singpy.profile}:v1")
    folder = user_dir(singpy, workdir, "fastpath-nocache-out")
    cache = new_cache(singpy, workdir, "fastpath-nocache")
    env = singpy.env(SINGPY_CACHEDIR=str(cache))
    before = traces(folder, cache)
    temporary = set(os.listdir(singpy.tmpdir))
    fast = singpy.run("pull", "--no-https", "--disable-cache", str(folder / "fast.sif"), reference, env=env, cwd=folder)
    typer = through_typer(singpy, ["pull", "--no-https", str(folder / "typer.sif"), reference],
                          {**env, "APPTAINER_DISABLE_CACHE": "1"}, folder)
    assert (fast.returncode, typer.returncode) == (0, 0), fast.stderr + typer.stderr
    assert digest(folder / "fast.sif") == digest(folder / "typer.sif") == digest(sif)
    assert os.listdir(cache) == []
    assert set(os.listdir(singpy.tmpdir)) == temporary
    assert settled(before, folder, cache) == before
