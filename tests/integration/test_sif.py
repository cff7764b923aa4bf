"""SIF and squashfs images through every mount strategy, as root and unprivileged.

Strategies (singpy.image.squashfs): `loop` (root only), `fuse` (root with
`allow kernel squashfs = no`; a user once /dev/fuse is open to them) and
`extract` (--unsquash, or a user without FUSE). Each run must print what the
image holds and leave nothing behind: no mount, loop device or process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import Singpy
from tests.support import sifs
from tests.support.leftovers import traces, wait_for_descendants, wait_until_gone
from tests.support.sifs import MAKERS, assert_restored, entries, snapshot, split_flags, strategy_args

STRATEGY_NOTE = {
    "loop": "mounting it with the kernel's squashfs on a loop device",
    "fuse": "mounting it with squashfuse_ll (FUSE)",
    "extract": "extracting the image, as asked",
}


# --- fixtures (fuse, fuse_open, fuse_closed: tests/conftest.py) -----------------------------------------------------


@pytest.fixture(scope="session")
def images(workdir: Path) -> dict[str, Path]:
    return sifs.all_images(workdir)


@pytest.fixture
def cachedir(singpy: Singpy, workdir: Path, request: pytest.FixtureRequest) -> Path:
    return sifs.new_cache(singpy, workdir, request.node.name)


# --- every strategy, every maker, every profile ----------------------------------------------------------------------


@pytest.mark.parametrize("maker", list(MAKERS))
@pytest.mark.parametrize("strategy", ["loop", "fuse", "extract"])
def test_image_runs(singpy: Singpy, images: dict[str, Path], workdir: Path, cachedir: Path, fuse_open: str,
                    strategy: str, maker: str) -> None:
    if strategy == "loop" and singpy.uid != 0:
        pytest.skip("loop devices are for root only (a user gets fuse or extract)")
    before = snapshot(workdir)
    global_flags, flags = split_flags(strategy_args(singpy, strategy, workdir))
    result = singpy.run(*global_flags, "-v", "exec", *flags, str(images[maker]), "sh", "-c",
                        "cat /etc/marker; id -u; test -x /bin/busybox && echo ok",
                        env=singpy.env(SINGPY_CACHEDIR=str(cachedir)))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [sifs.MARKER, str(singpy.uid), "ok"]
    assert STRATEGY_NOTE[strategy] in result.stderr
    assert_restored(before, workdir)
    assert bool(entries(cachedir)) == (strategy == "extract")


@pytest.mark.parametrize("strategy", ["loop", "fuse", "extract"])
def test_core_flags(singpy: Singpy, images: dict[str, Path], workdir: Path, cachedir: Path, fuse_open: str,
                    strategy: str) -> None:
    """--pid, --contain, --writable-tmpfs, --hostname and a bind on a SIF, through each strategy."""
    if strategy == "loop" and singpy.uid != 0:
        pytest.skip("loop devices are for root only")
    before = snapshot(workdir)
    global_flags, flags = split_flags(strategy_args(singpy, strategy, workdir))
    script = ("test $$ -lt 10 && echo pidns; hostname; echo x > /new-file && cat /new-file; "
              "ls /data/busybox-singpy.sif; test -z \"$(ls -A /tmp)\" && echo empty-tmp")
    out = singpy.ok(*global_flags, "exec", *flags, "--pid", "--contain", "--writable-tmpfs", "--hostname", "box",
                    "-B", f"{workdir}:/data:ro", str(images["singpy"]), "sh", "-c", script,
                    env=singpy.env(SINGPY_CACHEDIR=str(cachedir)))
    assert out.split() == ["pidns", "box", "x", "/data/busybox-singpy.sif", "empty-tmp"]
    assert_restored(before, workdir)


@pytest.mark.parametrize("strategy", ["loop", "fuse", "extract"])
def test_run_shell_and_exit_status(singpy: Singpy, images: dict[str, Path], workdir: Path, cachedir: Path,
                                   fuse_open: str, strategy: str) -> None:
    if strategy == "loop" and singpy.uid != 0:
        pytest.skip("loop devices are for root only")
    global_flags, flags = split_flags(strategy_args(singpy, strategy, workdir))
    env = singpy.env(SINGPY_CACHEDIR=str(cachedir))
    image = str(images["siftool"])
    assert "Hello from a singpy container" in singpy.ok(*global_flags, "run", *flags, image, env=env)
    assert singpy.ok(*global_flags, "shell", *flags, image, env=env, input="echo from-shell\n") == "from-shell\n"
    assert singpy.run(*global_flags, "exec", *flags, image, "sh", "-c", "exit 7", env=env).returncode == 7
    killed = singpy.run(*global_flags, "exec", *flags, image, "sh", "-c", "kill -TERM $$", env=env)
    # killed by the payload's signal, whether the payload replaced the launcher or a supervisor (FUSE) re-raised it
    assert killed.returncode == -signal.SIGTERM


def test_user_without_fuse_falls_back_to_extraction(as_user: Singpy, images: dict[str, Path], workdir: Path,
                                                    fuse_closed: str) -> None:
    cache = workdir / "caches" / "fallback"
    cache.mkdir(parents=True, exist_ok=True)
    os.chown(cache, as_user.uid, as_user.gid)
    result = as_user.run("-v", "exec", str(images["singpy"]), "cat", "/etc/marker",
                         env=as_user.env(SINGPY_CACHEDIR=str(cache)))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == sifs.MARKER
    assert "can't use FUSE (/dev/fuse is not readable and writable by you): extracting" in result.stderr


def test_fuse_state_decides_for_users(as_user: Singpy, images: dict[str, Path], workdir: Path, fuse: str) -> None:
    """The same command, with /dev/fuse open or closed: squashfuse or extraction, same result."""
    cache = workdir / "caches" / f"state-{fuse}"
    cache.mkdir(parents=True, exist_ok=True)
    os.chown(cache, as_user.uid, as_user.gid)
    result = as_user.run("-v", "exec", str(images["squashfs"]), "cat", "/etc/marker",
                         env=as_user.env(SINGPY_CACHEDIR=str(cache)))
    assert result.returncode == 0, result.stderr
    expected = STRATEGY_NOTE["fuse"] if fuse == "open" else "extracting the image into the cache instead"
    assert expected in result.stderr


def test_missing_squashfuse_falls_back(as_user: Singpy, images: dict[str, Path], workdir: Path,
                                       fuse_open: str) -> None:
    bin_dir = workdir / "only-unsquashfs"
    bin_dir.mkdir(exist_ok=True)
    if not (bin_dir / "unsquashfs").exists():
        (bin_dir / "unsquashfs").symlink_to("/usr/bin/unsquashfs")
    cache = workdir / "caches" / "no-squashfuse"
    cache.mkdir(parents=True, exist_ok=True)
    os.chown(cache, as_user.uid, as_user.gid)
    result = as_user.run("-v", "exec", str(images["singpy"]), "true",
                         env=as_user.env(SINGPY_CACHEDIR=str(cache), PATH=str(bin_dir)))
    assert result.returncode == 0, result.stderr
    assert "can't use FUSE (squashfuse is not installed): extracting" in result.stderr


# --- the supervisor of squashfuse ------------------------------------------------------------------------------------


def squashfuse_processes(image: Path) -> list[str]:
    """squashfuse serving `image` (its command line names the image: never another suite's)."""
    return [line for line in traces(image).processes if "squashfuse" in line]


def wait_for(predicate: object, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.05)
    assert predicate(), "timed out"  # type: ignore[operator]


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_killed_launcher_leaves_nothing(as_user: Singpy, images: dict[str, Path], workdir: Path, fuse_open: str,
                                        how: str) -> None:
    """Whatever way the supervisor ends, squashfuse and the payload end with it."""
    image = workdir / f"killed-{how}.sif"
    if not image.exists():
        sifs.patched(images["singpy"], image, [])
    before = snapshot(workdir)
    process = as_user.popen(["--config", str(sifs.conf_fuse_only(workdir)), "exec", str(image), "sleep", "300"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: squashfuse_processes(image))
    payload = wait_for_descendants(process.pid, "sleep 300")
    assert payload
    process.send_signal(getattr(__import__("signal"), how))
    process.communicate(timeout=20)
    assert process.returncode == (-9 if how == "SIGKILL" else -15)  # SIGTERM forwarded, the payload's death re-raised
    wait_for(lambda: not squashfuse_processes(image))
    assert wait_until_gone(payload, "sleep 300") == []
    assert_restored(before, workdir)


# --- the cache ------------------------------------------------------------------------------------------------------


def test_cache_is_reused_without_hashing(singpy: Singpy, images: dict[str, Path], workdir: Path,
                                         cachedir: Path) -> None:
    env = singpy.env(SINGPY_CACHEDIR=str(cachedir))
    first = singpy.run("-v", "exec", "--unsquash", str(images["siftool"]), "true", env=env)
    assert "computing the digest" in first.stderr and "unpacking" in first.stderr
    again = singpy.run("-v", "exec", "--unsquash", str(images["siftool"]), "true", env=env)
    assert again.returncode == 0 and "computing the digest" not in again.stderr
    assert "using the unpacked image from the cache" in again.stderr
    # Another file with the same partition: hashed (a new file), but not unpacked again.
    copy = workdir / f"copy-{singpy.profile}.sif"
    sifs.patched(images["siftool"], copy, [])
    third = singpy.run("-v", "exec", "--unsquash", str(copy), "true", env=env)
    assert "computing the digest" in third.stderr and "unpacking" not in third.stderr
    assert len([name for name in entries(cachedir) if not name.endswith(".json")]) == 1


def test_unsquash_from_the_environment_and_the_conf(singpy: Singpy, images: dict[str, Path], workdir: Path,
                                                    cachedir: Path, fuse_open: str) -> None:
    env = singpy.env(SINGPY_CACHEDIR=str(cachedir), APPTAINER_UNSQUASH="1")
    assert "extracting the image, as asked" in singpy.run("-v", "exec", str(images["singpy"]), "true", env=env).stderr
    conf = workdir / "unsquash.conf"
    conf.write_text("unsquash = yes\n")
    env = singpy.env(SINGPY_CACHEDIR=str(cachedir))
    result = singpy.run("--config", str(conf), "-v", "exec", str(images["singpy"]), "true", env=env)
    assert "extracting the image, as asked" in result.stderr


def unsquashfs_wrapper(directory: Path, body: str) -> Path:
    """A directory whose `unsquashfs` runs `body` (a shell snippet) around the real one."""
    directory.mkdir(exist_ok=True)
    os.chmod(directory, 0o777)
    wrapper = directory / "unsquashfs"
    wrapper.write_text(f"#!/bin/sh\n{body}\n")
    wrapper.chmod(0o755)
    return directory


def test_concurrent_first_runs_extract_once(singpy: Singpy, images: dict[str, Path], workdir: Path,
                                            cachedir: Path) -> None:
    tools = unsquashfs_wrapper(workdir / f"slow-unsquashfs-{singpy.profile}",
                               'echo run >> "$(dirname "$0")/marker"; sleep 1; exec /usr/bin/unsquashfs "$@"')
    marker = tools / "marker"
    marker.unlink(missing_ok=True)
    env = singpy.env(SINGPY_CACHEDIR=str(cachedir), PATH=f"{tools}:/usr/bin:/bin")
    runs = [singpy.popen(["exec", "--unsquash", str(images["squashfs"]), "cat", "/etc/marker"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(4)]
    outputs = [run.communicate(timeout=60) for run in runs]
    for run, (out, err) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, err
        assert out.strip() == sifs.MARKER
    assert marker.read_text().splitlines() == ["run"]
    assert any("waiting for another singpy" in err for _, err in outputs)
    assert len([name for name in entries(cachedir) if not name.endswith(".json")]) == 1


def test_crash_mid_extraction(singpy: Singpy, images: dict[str, Path], workdir: Path, cachedir: Path) -> None:
    """A launcher killed while unpacking leaves no usable entry; the next run unpacks again and tidies up."""
    tools = unsquashfs_wrapper(workdir / f"stalling-unsquashfs-{singpy.profile}",
                               '/usr/bin/unsquashfs "$@" && echo unpacked >> "$(dirname "$0")/marker" '
                               "&& exec sleep 301")
    marker = tools / "marker"
    marker.unlink(missing_ok=True)
    env = singpy.env(SINGPY_CACHEDIR=str(cachedir), PATH=f"{tools}:/usr/bin:/bin")
    process = singpy.popen(["exec", "--unsquash", str(images["singpy"]), "true"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(marker.exists, timeout=30)
    stalled = wait_for_descendants(process.pid, "sleep 301")
    assert stalled
    partial = entries(cachedir)
    assert all(name.startswith(".") for name in partial)  # hidden: the lock and the unfinished tree
    assert any(".tmp-" in name for name in partial)
    process.kill()
    process.communicate(timeout=20)
    assert wait_until_gone(stalled, "sleep 301") == []
    listing = singpy.ok("cache", "list", env=singpy.env(SINGPY_CACHEDIR=str(cachedir)))
    assert listing.startswith("no unpacked images")
    result = singpy.run("-v", "exec", "--unsquash", str(images["singpy"]), "cat", "/etc/marker",
                        env=singpy.env(SINGPY_CACHEDIR=str(cachedir)))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == sifs.MARKER
    assert "removing an interrupted extraction" in result.stderr
    assert [name for name in entries(cachedir) if name.startswith(".")] == []


def test_progress_bar_on_a_terminal(as_user: Singpy, images: dict[str, Path], workdir: Path) -> None:
    cache = workdir / "caches" / "tty"
    cache.mkdir(parents=True, exist_ok=True)
    os.chown(cache, as_user.uid, as_user.gid)
    command = f"{sifs.SINGPY} exec --unsquash {images['squashfs']} cat /etc/marker"
    env = as_user.env(SINGPY_CACHEDIR=str(cache), TERM="xterm")
    result = subprocess.run(["script", "-qec", command, "/dev/null"], env=env,
                            cwd=workdir, **as_user.switch(),  # type: ignore[call-overload]
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sifs.MARKER in result.stdout
    assert "Unpacking" in result.stdout  # rich drew its bar on the terminal


@pytest.mark.parametrize("strategy", ["fuse", "extract"])
def test_fakeroot(as_user: Singpy, images: dict[str, Path], workdir: Path, fuse_open: str, strategy: str) -> None:
    """Root inside: the FUSE mount must serve the ids of the user namespace, where the user is 0."""
    cache = sifs.new_cache(as_user, workdir, f"fakeroot-{strategy}")
    flags = ["--unsquash"] if strategy == "extract" else []
    out = as_user.ok("exec", "--fakeroot", *flags, str(images["singpy"]), "sh", "-c", "id -u; cat /etc/marker",
                     env=as_user.env(SINGPY_CACHEDIR=str(cache)))
    assert out.split() == ["0", sifs.MARKER]


HEAVY = ("typer", "click", "rich", "dataclasses", "typing", "json", "hashlib", "subprocess", "singpy.image.sif",
         "singpy.image.sifwrite")


@pytest.mark.parametrize("strategy", ["loop", "extract"])
def test_hot_path_stays_light(as_root: Singpy, images: dict[str, Path], workdir: Path, strategy: str) -> None:
    """A SIF from the cache (or on a loop device) must cost about what a sandbox costs: no hashing, no tools."""
    cache = sifs.new_cache(as_root, workdir, f"hot-{strategy}")
    env = {**as_root.env(SINGPY_CACHEDIR=str(cache)), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    flags = ["--unsquash"] if strategy == "extract" else []
    as_root.ok("exec", *flags, str(images["singpy"]), "true", env=env)  # populates the cache
    entry = "import sys; from singpy.cli.main import main; sys.argv[0] = 'singpy'; sys.exit(main())"
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", entry, "exec", *flags, str(images["singpy"]),
                           "echo", "light"], capture_output=True, text=True, env=env, cwd=workdir, timeout=60)
    assert done.returncode == 0 and done.stdout == "light\n", done.stderr[-2000:]
    modules = {line.split("|")[2].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "singpy.image.squashfs" in modules
    assert sorted(name for name in modules for bad in HEAVY if name == bad or name.startswith(bad + ".")) == []
