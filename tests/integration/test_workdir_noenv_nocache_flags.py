"""Issue 28's action flags as a user sees them: -W/--workdir, -S/--scratch, --no-env, --no-pid, --no-nv/--no-rocm."""

from __future__ import annotations

import json
import os
import stat
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support.configs import readable_config
from tests.support.images import build_busybox_rootfs
from tests.support.leftovers import settled, traces
from tests.support.oci import busybox_image, file, write_layout
from tests.support.registry import RegistryServer


def _own_dir(singpy: Singpy, workdir: Path, name: str) -> Path:
    """A fresh directory of this profile's user under the session's workdir (the test user can't reach tmp_path)."""
    path = workdir / f"{name}-{singpy.profile}"
    path.mkdir()
    os.chown(path, singpy.uid, singpy.gid)
    return path


def _mode(path: Path) -> str:
    info = path.lstat()
    assert info.st_uid == os.lstat(path.parent).st_uid  # the user's own, as the workdir
    return oct(stat.S_IMODE(info.st_mode))


# -W/--workdir

@pytest.mark.parametrize("flag", ["--workdir", "-W", "APPTAINER_WORKDIR", "SINGULARITY_WORKDIR"])
def test_workdir_with_contain_holds_tmp_var_tmp_and_home(singpy: Singpy, image: Path, workdir: Path,
                                                         flag: str) -> None:
    work = _own_dir(singpy, workdir, f"wd-contain{flag.lower()}")
    args, env = ([flag, str(work)], singpy.env()) if flag.startswith("-") else ([], singpy.env(**{flag: str(work)}))
    out = singpy.ok("exec", "--contain", *args, str(image), "sh", "-c",
                    "echo t > /tmp/t && echo v > /var/tmp/v && echo h > $HOME/h && echo ok", env=env)
    assert out == "ok\n"
    assert (work / "tmp" / "t").read_text() == "t\n"
    assert (work / "var_tmp" / "v").read_text() == "v\n"
    assert (work / "home" / "h").read_text() == "h\n"
    assert (_mode(work / "tmp"), _mode(work / "var_tmp"), _mode(work / "home")) == ("0o1777", "0o1777", "0o700")
    # A second run finds what the first left (the point of a workdir: a job's files outlive one container).
    assert singpy.ok("exec", "--containall", "-W", str(work), str(image), "cat", "/tmp/t", "/var/tmp/v",
                     f"{singpy.home}/h") == "t\nv\nh\n"


def test_workdir_without_contain_keeps_the_hosts_tmp(singpy: Singpy, image: Path, workdir: Path) -> None:
    """As Apptainer: without --contain, /tmp and the home are the host's; the workdir is left untouched."""
    work = _own_dir(singpy, workdir, "wd-plain")
    mark = singpy.tmpdir / f"wd-plain-mark-{singpy.profile}"
    singpy.ok("exec", "-W", str(work), str(image), "touch", str(mark))
    assert mark.exists()
    mark.unlink()
    assert list(work.iterdir()) == []


def test_workdir_and_a_home_of_ones_own(singpy: Singpy, image: Path, workdir: Path) -> None:
    """--home names the home: the workdir serves /tmp only."""
    work, home = _own_dir(singpy, workdir, "wd-home-w"), _own_dir(singpy, workdir, "wd-home-h")
    singpy.ok("exec", "-c", "-W", str(work), "--home", f"{home}:/home/me", str(image), "touch", "/home/me/x")
    assert (home / "x").exists() and not (work / "home").exists()


@pytest.mark.parametrize("problem", ["missing", "file", "link", "foreign", "open"])
def test_bad_workdir_is_one_fatal_line(singpy: Singpy, image: Path, workdir: Path, problem: str,
                                       request: pytest.FixtureRequest) -> None:
    work = _own_dir(singpy, workdir, f"wd-bad-{problem}")
    target: Path = work
    expected = "--workdir"
    if problem == "missing":
        target = work / "nowhere"
    elif problem == "file":
        target = work / "file"
        target.write_text("")
    elif problem == "link":  # a link planted where the workdir's tmp goes: /tmp must not end up elsewhere
        (work / "tmp").symlink_to("/etc")
        expected = "symbolic link"
    elif problem == "foreign":  # another user made the home first (in a shared workdir): it must not get our files
        intruder = request.getfixturevalue("other_user")
        (work / "home").mkdir()
        os.chown(work / "home", intruder.pw_uid, intruder.pw_gid)
        (work / "home").chmod(0o777)
        expected = f"a directory of another user (uid {intruder.pw_uid})"
    else:  # writable by all, not sticky: anyone could swap its home for a link
        work.chmod(0o777)
        expected = "writable by everyone but not sticky"
    before = traces(work)
    result = singpy.run("exec", "-c", "-W", str(target), str(image), "true")
    assert_one_fatal(result, expected)
    assert settled(before, work) == before
    assert not (work / "var_tmp").exists()


def test_workdir_and_user_bind_control_off(singpy: Singpy, image: Path, workdir: Path) -> None:
    """As Apptainer: no /tmp of a user's directory where the admin turned user binds off (a warning)."""
    work = _own_dir(singpy, workdir, "wd-control")
    config = readable_config(workdir, "no-bind-control-28", "user bind control = no\n")
    result = singpy.run("--config", str(config), "exec", "-c", "-W", str(work), str(image), "true")
    assert result.returncode == 0, result.stderr
    assert "user bind control" in result.stderr and not (work / "tmp").exists()


# -S/--scratch

@pytest.mark.parametrize("isolation", [[], ["--containall"]])
def test_scratch_is_an_empty_writable_directory(singpy: Singpy, image: Path, isolation: list[str]) -> None:
    out = singpy.ok("exec", *isolation, "-S", "/scratch/a", "--scratch", "/data1,/data2", str(image), "sh", "-c",
                    "ls -A /scratch/a /data1 && touch /scratch/a/x /data1/y /data2/z && stat -c %u /data2/z")
    assert out.splitlines()[-1] == str(singpy.uid)
    assert "x" not in out


def test_scratch_from_the_environment(singpy: Singpy, image: Path) -> None:
    env = singpy.env(APPTAINER_SCRATCH="/s1", SINGULARITY_SCRATCHDIR="/s2")
    assert singpy.ok("exec", str(image), "sh", "-c", "touch /s1/x && echo ok", env=env) == "ok\n"
    env = singpy.env(SINGULARITY_SCRATCHDIR="/s2")
    assert singpy.ok("exec", str(image), "sh", "-c", "touch /s2/x && echo ok", env=env) == "ok\n"


def test_scratch_under_workdir_outlives_the_container(singpy: Singpy, image: Path, workdir: Path) -> None:
    work = _own_dir(singpy, workdir, "wd-scratch")
    singpy.ok("exec", "-W", str(work), "-S", "/scratch/job", str(image), "sh", "-c", "echo kept > /scratch/job/out")
    assert (work / "scratch" / "scratch" / "job" / "out").read_text() == "kept\n"
    assert _mode(work / "scratch") == "0o750" and _mode(work / "scratch" / "scratch" / "job") == "0o750"
    assert singpy.ok("exec", "-W", str(work), "-S", "/scratch/job", str(image), "cat", "/scratch/job/out") == "kept\n"


@pytest.mark.parametrize(("value", "message"), [("relative/dir", "absolute path"), ("/", "root"),
                                                ("/a,", "empty path")])
def test_bad_scratch_is_a_usage_error(singpy: Singpy, image: Path, value: str, message: str) -> None:
    assert_one_fatal(singpy.run("exec", "-S", value, str(image), "true"), message, code=1)


def test_scratch_shows_in_the_dry_run(singpy: Singpy, image: Path, workdir: Path) -> None:
    work = _own_dir(singpy, workdir, "wd-dry")
    plan = json.loads(singpy.ok("exec", "--dry-run", "-c", "-W", str(work), "-S", "/s", str(image), "true"))["plan"]
    mounts = {spec["dest"]: spec for spec in plan["mounts"]}
    assert mounts["/tmp"]["source"] == f"{work}/tmp" and mounts["/s"]["source"] == f"{work}/scratch/s"
    assert [entry["path"] for entry in plan["host_dirs"]] == [
        f"{work}/tmp", f"{work}/var_tmp", f"{work}/home", f"{work}/scratch", f"{work}/scratch/s"]
    assert list(work.iterdir()) == []  # a dry run makes nothing


# --no-env

@pytest.mark.parametrize("how", ["--no-env", "APPTAINER_NOENV", "SINGULARITY_NOENV"])
def test_no_env_keeps_a_host_variable_out(singpy: Singpy, image: Path, how: str) -> None:
    """The named variables stay out; TERM passes all the same, as in Apptainer."""
    names = "DROP_ME,ALSO_DROP,TERM"
    args, env = ([how, names], singpy.env()) if how.startswith("-") else ([], singpy.env(**{how: names}))
    env.update(KEEP_ME="kept", DROP_ME="leak", ALSO_DROP="leak")
    out = singpy.ok("exec", *args, str(image), "sh", "-c",
                    'echo "${KEEP_ME:-unset} ${DROP_ME:-unset} ${ALSO_DROP:-unset} $TERM"', env=env)
    assert out == "kept unset unset dumb\n"


def test_no_env_lets_an_injected_value_through(singpy: Singpy, env_image: Path) -> None:
    """As Apptainer: --no-env blocks the host's value only; APPTAINERENV_X and --env still set X."""
    env = singpy.env(DROP_ME="host", APPTAINERENV_DROP_ME="injected", OTHER="host")
    out = singpy.ok("exec", "--no-env", "DROP_ME,OTHER", "--env", "THIRD=flag", str(env_image), "sh", "-c",
                    'echo "$DROP_ME ${OTHER:-unset} $THIRD"', env=env)
    assert out == "injected unset flag\n"


# --no-pid

@pytest.mark.parametrize("flag", ["--no-pid", "APPTAINER_NO_PID"])
def test_no_pid_cancels_the_pid_namespace_of_containall(singpy: Singpy, image: Path, flag: str) -> None:
    assert singpy.ok("exec", "--containall", "--no-init", str(image), "sh", "-c", "echo $$") == "1\n"
    args, env = ([flag], singpy.env()) if flag.startswith("-") else ([], singpy.env(**{flag: "1"}))
    out = singpy.ok("exec", "--containall", "--no-init", *args, str(image), "sh", "-c", "echo $$", env=env)
    assert out != "1\n"
    assert singpy.ok("exec", "--pid", "--no-pid", str(image), "sh", "-c", "echo $$") != "1\n"


# --no-nv / --no-rocm

@pytest.mark.parametrize(("directive", "flag", "variable"), [("always use nv", "--no-nv", "APPTAINER_NV_OFF"),
                                                             ("always use rocm", "--no-rocm", "APPTAINER_NO_ROCM")])
def test_no_gpu_flag_cancels_always_use(singpy: Singpy, image: Path, workdir: Path, directive: str, flag: str,
                                        variable: str) -> None:
    """`always use nv|rocm = yes` asks for GPU discovery on every run (on this GPU-less host: a warning that
    nothing was found); --no-nv/--no-rocm, or their variables, turn it off for one run."""
    config = readable_config(workdir, directive.replace(" ", "-"), f"{directive} = yes\n")
    always = singpy.run("--config", str(config), "exec", str(image), "true")
    assert always.returncode == 0, always.stderr
    vendor = "nv" if "nv" in flag else "rocm"
    assert f"--{vendor}" in always.stderr or "GPU" in always.stderr or "NVIDIA" in always.stderr \
        or "ROCm" in always.stderr, always.stderr
    for args, env in (([flag], singpy.env()), ([], singpy.env(**{variable: "1"}))):
        result = singpy.run("--config", str(config), "exec", *args, str(image), "true", env=env)
        assert (result.returncode, result.stderr) == (0, "")


# --disable-cache

@pytest.fixture(scope="module")
def nocache_ref(registry_plain: RegistryServer, workdir: Path) -> str:
    """A busybox image in registry_plain, pushed once for this module."""
    image = busybox_image(extra=[file("etc/image-marker", "uncached\n")])
    registry_plain.push(write_layout(workdir / "nocache-28-layout", {"latest": image}), "nocache28/img")
    return registry_plain.ref("nocache28/img")


@pytest.mark.parametrize("how", ["--disable-cache", "APPTAINER_DISABLE_CACHE"])
def test_disable_cache_pulls_runs_and_leaves_nothing(singpy: Singpy, workdir: Path, nocache_ref: str, fuse: str,
                                                     how: str) -> None:
    """As a user with /dev/fuse closed the SIF is extracted (in the temporary directory too): every way, the
    cache stays empty and the temporary directory is gone once the container ends."""
    cache = _own_dir(singpy, workdir, f"nocache-{fuse}-{how}")
    tmp = _own_dir(singpy, workdir, f"nocache-tmp-{fuse}-{how}")
    env = singpy.env(SINGPY_CACHEDIR=str(cache), TMPDIR=str(tmp))
    args = [how] if how.startswith("-") else []
    if not args:
        env[how] = "1"
    result = singpy.run("exec", *args, "--no-https", nocache_ref, "sh", "-c", "cat /etc/image-marker; exit 3", env=env)
    assert (result.returncode, result.stdout) == (3, "uncached\n"), result.stderr
    assert list(cache.iterdir()) == [] and list(tmp.iterdir()) == []
    # Without the flag, the same run fills the cache: the check above could fail.
    singpy.ok("exec", "--no-https", nocache_ref, "true", env=singpy.env(SINGPY_CACHEDIR=str(cache), TMPDIR=str(tmp)))
    assert list(cache.iterdir()) != []


def test_disable_cache_failed_pull_leaves_nothing(singpy: Singpy, workdir: Path, nocache_ref: str) -> None:
    tmp = _own_dir(singpy, workdir, "nocache-fail")
    env = singpy.env(TMPDIR=str(tmp))
    result = singpy.run("exec", "--disable-cache", "--no-https", nocache_ref.replace("img", "nothing"), "true",
                        env=env)
    assert_one_fatal(result, "nothing")
    assert list(tmp.iterdir()) == []


# --runscript-timeout

def _env_image(workdir: Path, seconds: str) -> Path:
    """A busybox image whose env script sleeps `seconds` before it sets SLOWED (env scripts see no host variable,
    so the time is the image's)."""
    return build_busybox_rootfs(workdir / f"busybox-sleep-{seconds}-28", runscript="#!/bin/sh\nexec \"$@\"\n",
                                env_scripts={"91-slow.sh": f"sleep {seconds}\nexport SLOWED=yes\n"})


@pytest.fixture(scope="module")
def slow_env_image(workdir: Path) -> Path:
    return _env_image(workdir, "30")


@pytest.fixture(scope="module")
def quick_env_image(workdir: Path) -> Path:
    return _env_image(workdir, "0.3")


@pytest.mark.parametrize("isolation", [[], ["--pid"], ["--containall", "--no-init"]])
def test_runscript_timeout_kills_a_slow_env_script(singpy: Singpy, slow_env_image: Path,
                                                   isolation: list[str]) -> None:
    """As Apptainer's e2e test: one FATAL line naming the command and the duration, exit 255, at the deadline."""
    started = time.monotonic()
    result = singpy.run("run", *isolation, "--runscript-timeout", "1s", str(slow_env_image), "echo", "ran")
    assert_one_fatal(result, 'command "sleep 30" was killed after 1s timeout')
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("how", ["--runscript-timeout", "APPTAINER_RUNSCRIPT_TIMEOUT"])
def test_runscript_timeout_spares_fast_scripts_and_the_payload(singpy: Singpy, quick_env_image: Path,
                                                               how: str) -> None:
    """Env scripts within the deadline run to their end; the payload (the runscript's exec) is never limited."""
    args, env = ([how, "1500ms"], singpy.env()) if how.startswith("-") else ([], singpy.env(**{how: "1500ms"}))
    started = time.monotonic()
    result = singpy.run("run", *args, str(quick_env_image), "sh", "-c", 'sleep 2; echo "$SLOWED"; exit 3', env=env)
    assert (result.returncode, result.stdout, result.stderr) == (3, "yes\n", "")
    assert time.monotonic() - started >= 2


def test_runscript_timeout_is_runs_alone(singpy: Singpy, quick_env_image: Path) -> None:
    """Apptainer gives the flag to `run` alone: exec's env scripts take the time they take."""
    env = singpy.env(APPTAINER_RUNSCRIPT_TIMEOUT="100ms")
    assert singpy.ok("exec", str(quick_env_image), "sh", "-c", 'echo "$SLOWED"', env=env) == "yes\n"


@pytest.mark.parametrize("value", ["1x", "0s", "-1s", "s", "10"])
def test_bad_runscript_timeout_is_a_usage_error(singpy: Singpy, slow_env_image: Path, value: str) -> None:
    assert_one_fatal(singpy.run("run", "--runscript-timeout", value, str(slow_env_image), "true"),
                     "--runscript-timeout", code=1)


# instance start takes the action flags

def test_instance_with_workdir_and_scratch(singpy: Singpy, image: Path, workdir: Path) -> None:
    work = _own_dir(singpy, workdir, "wd-instance")
    name = f"wd28-{uuid.uuid4().hex[:8]}"
    try:
        started = singpy.run("instance", "start", "-c", "-W", str(work), "-S", "/s28", str(image), name)
        assert started.returncode == 0, started.stderr
        out = singpy.ok("exec", f"instance://{name}", "sh", "-c", "echo t > /tmp/t && touch /s28/y && ls /s28")
        assert out == "y\n"
        assert (work / "tmp" / "t").read_text() == "t\n" and (work / "scratch" / "s28" / "y").exists()
    finally:
        singpy.run("instance", "stop", "--force", name)
        logs = Path(singpy.home, ".singpy", "instances", "logs", os.uname().nodename, singpy.user)
        for suffix in (".out", ".err"):
            (logs / f"{name}{suffix}").unlink(missing_ok=True)
