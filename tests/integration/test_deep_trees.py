"""Images whose trees are thousands of directories deep (issue 24, class 3).

A layer entry 1,100 directories deep, and a tree 3,000 deep (past PATH_MAX:
a link made the second half continue the first), pulled, converted, built
from a definition file: each either works or is one FATAL line, never a
traceback; nothing is left in the cache's work directory, and the next pull
into the same cache and `singpy cache clean` work. A killed conversion's deep
work directory is swept by the next pull.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from singpy.image import trees
from tests.conftest import Singpy
from tests.support import oci
from tests.support.oci import busybox_image, directory, file, symlink, write_oci_archive
from tests.support.recipes import build_dirs, out_dir, write_recipe
from tests.support.sifs import new_cache

TIMEOUT = 120


@pytest.fixture(autouse=True)
def _no_deep_tree_left(workdir: Path) -> Iterator[None]:
    """The session's clean-up (shutil.rmtree) can't remove a tree this deep: each test removes its own."""
    yield
    for parent in (workdir / "recipes", workdir / "caches"):
        for name in os.listdir(parent) if parent.exists() else ():
            if "deep-" in name:
                trees.remove(str(parent / name))


def chain(prefix: str, name: str, depth: int) -> list[oci.Entry]:
    """Directories prefix/name, prefix/name/name, ... `depth` of them, and a file at the bottom."""
    parts = [name] * depth
    entries = [directory(prefix + "/".join(parts[:count])) for count in range(1, depth + 1)]
    return [*entries, file(prefix + "/".join(parts) + "/bottom", "found\n")]


@pytest.fixture(scope="module")
def archives(workdir: Path) -> dict[str, Path]:
    where = workdir / "deep-trees"
    where.mkdir(mode=0o755, exist_ok=True)  # pytest may set a module fixture up again when the profiles alternate
    # 1,500 + 1,500 levels through the link: 3,000 directories, a path of 6,000 bytes (entry names stay short).
    beyond = [*chain("", "a", 1500)[:-1], symlink("s", "/" + "/".join(["a"] * 1500)), *chain("s/", "b", 1500)]
    found = {
        "deep-1100": write_oci_archive(where / "deep-1100.tar", {"latest": busybox_image(
            layers=[oci.Layer(chain("", "d", 1100))])}),
        "deep-3000": write_oci_archive(where / "deep-3000.tar", {"latest": busybox_image(
            layers=[oci.Layer(beyond)])}),
        "plain": write_oci_archive(where / "plain.tar", {"latest": busybox_image(
            extra=[file("etc/marker", "plain image\n")])}),
    }
    for path in found.values():
        path.chmod(0o644)
    return found


def works_or_one_fatal(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stderr and "RecursionError" not in result.stderr, result.stderr
    if result.returncode != 0:
        fatal = [line for line in result.stderr.splitlines() if line.startswith("FATAL:")]
        assert len(fatal) == 1 and result.returncode == 255, result.stderr


def work_left(cache: Path) -> list[str]:
    try:
        return os.listdir(cache / "tmp")
    except FileNotFoundError:
        return []


def the_cache_still_works(singpy: Singpy, env: dict[str, str], archives: dict[str, Path]) -> None:
    cache = Path(env["SINGPY_CACHEDIR"])
    assert singpy.ok("exec", f"oci-archive:{archives['plain']}", "cat", "/etc/marker", env=env) == "plain image\n"
    assert work_left(cache) == []
    singpy.ok("cache", "list", env=env)
    singpy.ok("cache", "clean", "--force", env=env)
    assert os.listdir(cache / "sif") == []


@pytest.mark.parametrize("name", ["deep-1100", "deep-3000"])
def test_pull_of_a_deep_tree_leaves_the_cache_usable(singpy: Singpy, workdir: Path, archives: dict[str, Path],
                                                     name: str) -> None:
    env = singpy.env(SINGPY_CACHEDIR=str(new_cache(singpy, workdir, f"deep-pull-{name}")))
    out = out_dir(singpy, workdir, f"deep-pull-{name}")
    result = singpy.run("pull", str(out / "deep.sif"), f"oci-archive:{archives[name]}", env=env, timeout=TIMEOUT)
    works_or_one_fatal(result)
    assert work_left(Path(env["SINGPY_CACHEDIR"])) == []
    if result.returncode == 0:
        assert os.listdir(out) == ["deep.sif"]
        if name == "deep-1100":  # the bottom reached through 1,100 directories inside the container
            bottom = "/" + "/".join(["d"] * 1100) + "/bottom"
            assert singpy.ok("exec", str(out / "deep.sif"), "cat", bottom, env=env) == "found\n"
    else:
        assert os.listdir(out) == []
    the_cache_still_works(singpy, env, archives)


def test_sandbox_of_a_deep_tree_is_written_or_nothing_is(singpy: Singpy, workdir: Path,
                                                         archives: dict[str, Path]) -> None:
    env = singpy.env(SINGPY_CACHEDIR=str(new_cache(singpy, workdir, "deep-sandbox")))
    out = out_dir(singpy, workdir, "deep-sandbox")
    result = singpy.run("build", "--sandbox", str(out / "sandbox"), f"oci-archive:{archives['deep-3000']}", env=env,
                        timeout=TIMEOUT)
    works_or_one_fatal(result)
    assert os.listdir(out) == (["sandbox"] if result.returncode == 0 else [])
    the_cache_still_works(singpy, env, archives)


def test_definition_build_on_a_deep_base_leaves_nothing_behind(singpy: Singpy, workdir: Path,
                                                               archives: dict[str, Path]) -> None:
    env = singpy.env(SINGPY_CACHEDIR=str(new_cache(singpy, workdir, "deep-recipe")))
    out = out_dir(singpy, workdir, "deep-recipe")
    recipe = write_recipe(out, f"""
        Bootstrap: oci-archive
        From: {archives['deep-1100']}

        %post
            echo built > /built
        """)
    result = singpy.run("build", str(out / "image.sif"), str(recipe), env=env, timeout=TIMEOUT)
    works_or_one_fatal(result)
    assert build_dirs(out) == [] and build_dirs(singpy.tmpdir) == []
    if result.returncode == 0:
        assert singpy.ok("exec", str(out / "image.sif"), "cat", "/built", env=env) == "built\n"
    the_cache_still_works(singpy, env, archives)


def test_a_killed_conversion_of_a_deep_tree_is_swept_by_the_next_pull(singpy: Singpy, workdir: Path,
                                                                      archives: dict[str, Path]) -> None:
    cache = new_cache(singpy, workdir, "deep-killed")
    env = singpy.env(SINGPY_CACHEDIR=str(cache))
    left = cache / "tmp" / "convert-killed"
    # What a killed pull leaves: its work directory, its lock file free, a tree past PATH_MAX in it, read-only
    # directories on the way (as images have). Made by the profile's user, whose cache it is.
    maker = ("import os, sys\n"
             "os.makedirs(sys.argv[1], mode=0o700); open(sys.argv[1] + '/.lock', 'w').close()\n"
             "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
             "for level in range(3000):\n"
             "    os.mkdir('dd', dir_fd=fd); below = os.open('dd', os.O_RDONLY, dir_fd=fd)\n"
             "    if level % 100 == 99: os.fchmod(fd, 0o500)\n"
             "    os.close(fd); fd = below\n")
    subprocess.run([sys.executable, "-c", maker, str(left)], check=True, **singpy.switch())  # type: ignore[call-overload]
    assert singpy.ok("exec", f"oci-archive:{archives['plain']}", "cat", "/etc/marker", env=env) == "plain image\n"
    assert work_left(cache) == []
