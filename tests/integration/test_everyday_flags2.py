"""More flags Apptainer users type: --mount, --no-mount, --compat, --no-init, --no-umask, -u/--userns, --nvccli,
and the global -s/--silent (issue 11)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SINGPY, Singpy, assert_one_fatal, default_signals
from tests.support import sifs


def _own_dir(singpy: Singpy, workdir: Path, name: str, mark: str = "") -> Path:
    """A directory of this profile's user under the session's workdir, holding `mark` in a file `mark`."""
    path = workdir / f"{name}-{singpy.profile}"
    path.mkdir(exist_ok=True)
    os.chown(path, singpy.uid, singpy.gid)
    if mark:
        (path / "mark").write_text(mark)
    return path


def _conf(singpy: Singpy, workdir: Path, name: str, text: str) -> Path:
    conf = workdir / f"{name}-{singpy.profile}.conf"
    conf.write_text(text)
    return conf


# --- --mount --------------------------------------------------------------------------------------------------------


def test_mount_binds_read_write_and_read_only(singpy: Singpy, image: Path, workdir: Path) -> None:
    source = _own_dir(singpy, workdir, "mount-src", "mounted\n")
    script = "cat /mnt/rw/mark; touch /mnt/rw/new && echo rw-ok; touch /mnt/ro/other 2>/dev/null || echo ro-refused"
    out = singpy.ok("exec", "--mount", f"type=bind,source={source},destination=/mnt/rw",
                    "--mount", f"src={source},dst=/mnt/ro,ro", str(image), "sh", "-c", script)
    assert out == "mounted\nrw-ok\nro-refused\n"
    assert (source / "new").exists() and not (source / "other").exists()
    (source / "new").unlink()


def test_mount_quoted_field_keeps_its_comma(singpy: Singpy, image: Path, workdir: Path) -> None:
    source = _own_dir(singpy, workdir, "mount,comma", "comma\n")
    out = singpy.ok("exec", "--mount", f'type=bind,"src={source}",target=/mnt/c,readonly', str(image),
                    "sh", "-c", "cat /mnt/c/mark; touch /mnt/c/x 2>/dev/null || echo ro")
    assert out == "comma\nro\n"


@pytest.mark.parametrize("prefix", ["SINGULARITY_", "APPTAINER_", "SINGPY_"])
def test_mount_variable_adds_newline_separated_mounts(singpy: Singpy, image: Path, workdir: Path,
                                                      prefix: str) -> None:
    first = _own_dir(singpy, workdir, "mount-env-a", "a\n")
    second = _own_dir(singpy, workdir, "mount-env-b", "b\n")
    env = singpy.env(**{f"{prefix}MOUNT": f"src={first},dst=/mnt/a\nsrc={second},dst=/mnt/b"})
    out = singpy.ok("exec", "--mount", f"src={first},dst=/mnt/c", str(image), "cat", "/mnt/a/mark", "/mnt/b/mark",
                    "/mnt/c/mark", env=env)
    assert out == "a\nb\na\n"


@pytest.mark.parametrize(("spec", "message"), [
    ("type=volume,src=/etc,dst=/mnt", "unsupported mount type 'volume', only 'bind' is supported"),
    ("type=tmpfs,dst=/mnt", "unsupported mount type 'tmpfs'"),
    ("src=/etc,dst=/mnt,bind-propagation=rshared", "bind-propagation can't be set for one mount"),
    ("src=/etc,dst=/mnt,volume-nocopy", "unknown key 'volume-nocopy'"),
    ("src=/etc,dst=/mnt,image-src=/x", "image-src= (binding from inside an image file) is not supported"),
    ("src=/etc", "a mount needs a source and a destination"),
    ("src=,dst=/mnt", "src can't be empty"),
    ("src=/etc,dst=mnt", "destination 'mnt' is not absolute"),
    ('src=/e"tc,dst=/mnt', "inside a field that is not quoted"),
    ('"src=/etc,dst=/mnt', "a quoted field is not closed"),
    ("src=/etc,dst=/", "--mount can't replace the container's root directory /"),
    ("src=/no/such/path,dst=/mnt", "bind source /no/such/path does not exist"),
], ids=["volume", "tmpfs", "propagation", "unknown-key", "image-src", "no-dest", "empty-source", "relative-dest",
        "bare-quote", "open-quote", "onto-root", "missing-source"])
def test_bad_mount_is_one_fatal_line(singpy: Singpy, image: Path, spec: str, message: str) -> None:
    # a spec that does not parse is a command-line mistake (exit 1); a source missing on the host is not (255)
    code = 255 if message.endswith("does not exist") else 1
    assert_one_fatal(singpy.run("exec", "--mount", spec, str(image), "echo", "started"), message, code)


def test_mount_obeys_user_bind_control(singpy: Singpy, image: Path, workdir: Path) -> None:
    conf = _conf(singpy, workdir, "no-user-binds", "user bind control = no\n")
    result = singpy.run("--config", str(conf), "exec", "--mount", "src=/etc,dst=/mnt", str(image), "true")
    assert_one_fatal(result, "user binds are disabled by the system administrator")


# --- --no-mount -----------------------------------------------------------------------------------------------------


def test_no_mount_home(singpy: Singpy, image: Path) -> None:
    """Run from / so that the cwd bind does not bring the home back (as Apptainer's e2e test does)."""
    probe = ["sh", "-c", f"grep -c ' {singpy.home} ' /proc/self/mountinfo || true"]
    assert singpy.ok("exec", str(image), *probe, cwd="/") == "1\n"
    assert singpy.ok("exec", "--no-mount", "home", str(image), *probe, cwd="/") == "0\n"
    env = singpy.env(APPTAINER_NO_MOUNT="home")
    assert singpy.ok("exec", str(image), *probe, cwd="/", env=env) == "0\n"
    assert singpy.ok("exec", "--contain", "--no-mount", "home", str(image), *probe, cwd="/") == "0\n"


def test_no_mount_tmp_and_cwd(singpy: Singpy, image: Path, workdir: Path) -> None:
    """The session's workdir lives under the host's /tmp: it is seen through the /tmp bind or the cwd bind."""
    here = _own_dir(singpy, workdir, "no-mount-cwd", "here\n")
    show = ["sh", "-c", f"cat {here}/mark 2>/dev/null || echo hidden; pwd"]
    assert singpy.ok("exec", str(image), *show, cwd=here) == f"here\n{here}\n"
    assert singpy.ok("exec", "--no-mount", "tmp", str(image), *show, cwd=here) == f"here\n{here}\n"  # the cwd bind
    assert singpy.ok("exec", "--no-mount", "tmp", str(image), *show, cwd="/") == "hidden\n/\n"
    result = singpy.run("exec", "--no-mount", "tmp,cwd", str(image), *show, cwd=here)
    assert result.returncode == 0 and result.stdout.startswith("hidden\n"), result.stderr
    assert f"could not change to {here} in the container" in result.stderr


def test_no_mount_tmp_under_contain_leaves_the_image_tmp(singpy: Singpy, image: Path) -> None:
    probe = ["sh", "-c", "grep -c ' /tmp ' /proc/self/mountinfo || true"]
    assert singpy.ok("exec", "--contain", str(image), *probe) == "1\n"
    assert singpy.ok("exec", "--contain", "--no-mount", "tmp", str(image), *probe) == "0\n"


@pytest.mark.parametrize("contain", [[], ["--contain"]], ids=["default", "contain"])
def test_no_mount_dev_proc_sys(singpy: Singpy, image: Path, contain: list[str]) -> None:
    probe = ["sh", "-c", "ls -A /dev | wc -l; test -e /proc/self/status && echo proc; test -e /sys/kernel && echo sys; "
             "true"]
    full = singpy.ok("exec", *contain, str(image), *probe).split()
    assert int(full[0]) > 3 and full[1:] == ["proc", "sys"]
    assert singpy.ok("exec", *contain, "--no-mount", "dev,proc,sys", str(image), *probe).split() == ["0"]
    assert singpy.ok("exec", *contain, "--no-mount", "sys", "--no-mount", "proc", str(image), *probe).split()[1:] == []


def test_no_mount_devpts_under_contain(singpy: Singpy, image: Path) -> None:
    probe = ["sh", "-c", "grep -c ' /dev/pts ' /proc/self/mountinfo || true"]
    assert singpy.ok("exec", "--contain", str(image), *probe) == "1\n"
    assert singpy.ok("exec", "--contain", "--no-mount", "devpts", str(image), *probe) == "0\n"


def test_no_mount_bind_path_entries(singpy: Singpy, image: Path, workdir: Path) -> None:
    site = _own_dir(singpy, workdir, "no-mount-site", "site\n")
    other = _own_dir(singpy, workdir, "no-mount-other", "other\n")
    conf = _conf(singpy, workdir, "no-mount-binds", f"bind path = {site}:/site\nbind path = {other}:/other\n")
    show = ["sh", "-c", "cat /site/mark 2>/dev/null || echo no-site; cat /other/mark 2>/dev/null || echo no-other"]
    run = ["--config", str(conf), "exec"]
    assert singpy.ok(*run, str(image), *show) == "site\nother\n"
    assert singpy.ok(*run, "--no-mount", "/site", str(image), *show) == "no-site\nother\n"
    assert singpy.ok(*run, "--no-mount", "/other/", str(image), *show) == "site\nno-other\n"  # normalised
    assert singpy.ok(*run, "--no-mount", "bind-paths", str(image), *show) == "no-site\nno-other\n"


def test_no_mount_resolv_conf(singpy: Singpy, image: Path) -> None:
    probe = ["sh", "-c", "grep -c ' /etc/resolv.conf ' /proc/self/mountinfo || true"]
    if singpy.ok("exec", str(image), *probe) != "1\n":
        pytest.skip("this host has no /etc/resolv.conf to bind")
    assert singpy.ok("exec", "--no-mount", "/etc/resolv.conf", str(image), *probe) == "0\n"
    assert singpy.ok("exec", "--no-mount", "bind-paths", str(image), *probe) == "0\n"


@pytest.mark.parametrize("value", ["hmoe", "home,", "etc/hosts"])
def test_no_mount_unknown_name_is_one_fatal_line(singpy: Singpy, image: Path, value: str) -> None:
    result = singpy.run("exec", "--no-mount", value, str(image), "echo", "started")
    assert_one_fatal(result, "--no-mount: unknown mount", code=1)  # a command-line mistake (docs/usage.md)
    if value == "hmoe":
        assert "(did you mean home?)" in result.stderr


# --- --compat, --no-init, --no-umask ------------------------------------------------------------------------------


def _run_with_umask(singpy: Singpy, mask: int, *args: str, env: dict[str, str] | None = None,
                    ) -> subprocess.CompletedProcess[str]:
    def start() -> None:
        default_signals()
        os.umask(mask)

    process = singpy.popen(list(args), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=start)
    out, err = process.communicate(timeout=60)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def test_umask_is_the_callers_unless_no_umask(singpy: Singpy, image: Path) -> None:
    mine = _run_with_umask(singpy, 0o077, "exec", str(image), "sh", "-c", "umask")
    assert (mine.returncode, mine.stdout) == (0, "0077\n"), mine.stderr
    reset = _run_with_umask(singpy, 0o077, "exec", "--no-umask", str(image), "sh", "-c", "umask")
    assert (reset.returncode, reset.stdout) == (0, "0022\n"), reset.stderr
    env = singpy.env(SINGULARITY_NO_UMASK="1")
    from_env = _run_with_umask(singpy, 0o027, "exec", "--pid", str(image), "sh", "-c", "umask", env=env)
    assert (from_env.returncode, from_env.stdout) == (0, "0022\n"), from_env.stderr


def test_no_init_makes_the_payload_pid_1(singpy: Singpy, image: Path) -> None:
    show = ["sh", "-c", "echo $$; cat /proc/1/cmdline | tr '\\0' ' '; echo"]
    with_init = singpy.ok("exec", "--pid", str(image), *show).splitlines()
    assert with_init[0] != "1" and not with_init[1].startswith("sh ")
    without = singpy.ok("exec", "--pid", "--no-init", str(image), *show).splitlines()
    assert without[0] == "1" and without[1].startswith("sh -c echo $$")
    env = singpy.env(APPTAINER_NOSHIMINIT="1")
    assert singpy.ok("exec", "--pid", str(image), "sh", "-c", "echo $$", env=env) == "1\n"
    assert singpy.ok("exec", "--no-init", str(image), "sh", "-c", "test $$ != 1 && echo host-pids") == "host-pids\n"


def test_compat_is_containall_writable_tmpfs_no_init_no_umask_no_eval(singpy: Singpy, image: Path) -> None:
    script = ("ls -A $HOME | wc -l; touch /compat-file && echo written; echo $$; umask; echo \"$FROM_HOST\"; "
              "echo \"$LITERAL\"")
    env = singpy.env(FROM_HOST="leaks", APPTAINERENV_LITERAL="$(echo evaluated)")
    result = _run_with_umask(singpy, 0o077, "exec", "--compat", str(image), "sh", "-c", script, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["0", "written", "1", "0022", "", "$(echo evaluated)"]
    assert not (image / "compat-file").exists()
    env = singpy.env(SINGPY_COMPAT="1")
    assert singpy.ok("exec", str(image), "sh", "-c", "echo $$", env=env) == "1\n"


# --- -u/--userns --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["-u", "--userns"])
def test_userns(singpy: Singpy, image: Path, flag: str) -> None:
    out = singpy.ok("exec", flag, str(image), "sh", "-c", "id -u; readlink /proc/self/ns/user; cat /proc/self/uid_map")
    uid, userns, *uid_map = out.split()
    assert uid == str(singpy.uid)
    assert userns != os.readlink("/proc/self/ns/user")  # a user namespace: root's too
    assert uid_map == [str(singpy.uid), str(singpy.uid), "1"]  # the user mapped to themselves alone


def test_userns_from_the_environment(singpy: Singpy, image: Path) -> None:
    env = singpy.env(APPTAINER_UNSHARE_USERNS="1")
    userns = singpy.ok("exec", str(image), "readlink", "/proc/self/ns/user", env=env).strip()
    assert userns != os.readlink("/proc/self/ns/user")


def test_userns_runs_a_sif(singpy: Singpy, workdir: Path, fuse_open: str) -> None:
    """As root the kernel mounts no squashfs in a user namespace: the SIF goes through FUSE, as --fakeroot's."""
    image = sifs.singpy_sif(workdir)
    result = singpy.run("-v", "exec", "--userns", str(image), "cat", "/etc/marker")
    assert (result.returncode, result.stdout) == (0, sifs.MARKER + "\n"), result.stderr
    assert "loop device" not in result.stderr


# --- -s/--silent and -q/--quiet -------------------------------------------------------------------------------------


def test_quiet_keeps_warnings_silent_drops_them(singpy: Singpy, image: Path) -> None:
    """Apptainer's levels: --quiet hides normal output only, --silent everything but errors."""
    args = ["exec", "--env", "HOME=/elsewhere", str(image), "echo", "ran"]
    warning = "WARNING: overriding HOME environment variable with --env is not permitted"
    for front in ([], ["-q"], ["--quiet"]):
        result = singpy.run(*front, *args)
        assert (result.returncode, result.stdout) == (0, "ran\n") and warning in result.stderr, front
    for front in (["-s"], ["--silent"]):
        result = singpy.run(*front, *args)
        assert (result.returncode, result.stdout, result.stderr) == (0, "ran\n", ""), front
    assert singpy.run("exec", "--silent", *args[1:]).stderr == ""
    assert_one_fatal(singpy.run("-s", "exec", str(image / "nowhere"), "true"), "nowhere")


def test_short_s_after_shell_is_still_the_shell(singpy: Singpy, image: Path) -> None:
    assert singpy.ok("-s", "shell", "-s", "/bin/ash", str(image), input="echo $0\n") == "/bin/ash\n"


# --- --nvccli, on the simulated GPU host (tests/gpu) -------------------------------------------------------------


@pytest.fixture(scope="session")
def gpu_host(workdir: Path) -> object:
    if os.getuid() != 0:
        pytest.skip("the simulated GPU host needs root (mknod)")
    from tests.gpu import simhost

    root = workdir / "sim-nvidia-nvccli"
    root.mkdir(exist_ok=True)
    host = simhost.build_nvidia_host(root)
    for path in [root, *root.rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)
    return host


def _on_gpu_host(singpy: Singpy, host: object, workdir: Path, conf: str, *args: str,
                 path: str = "") -> subprocess.CompletedProcess[str]:
    conf_file = _conf(singpy, workdir, f"nvccli-{abs(hash(conf))}", conf)
    command = [sys.executable, "-m", "tests.gpu.simrun", str(host.root), str(singpy.uid),  # type: ignore[attr-defined]
               str(singpy.gid), "--", SINGPY, "--config", str(conf_file), *args]
    bin_dir = host.bin_dir  # type: ignore[attr-defined]
    env = singpy.env(PATH=path or f"{bin_dir}:/usr/bin:/bin", PYTHONPATH=str(Path(__file__).parents[2]))
    return subprocess.run(command, env=env, cwd=singpy.workdir, capture_output=True, text=True, timeout=60)


def test_nvccli_lists_libraries_with_the_tool_and_makes_the_image_writable(singpy: Singpy, gpu_host: object,
                                                                            image: Path, workdir: Path) -> None:
    result = _on_gpu_host(singpy, gpu_host, workdir, "use nvidia-container-cli = no\n", "-v", "exec", "--nvccli",
                          str(image), "sh", "-c", "ls /.singularity.d/libs; touch /nvccli && echo writable")
    assert result.returncode == 0, result.stderr
    assert "libcuda.so.1" in result.stdout.split() and result.stdout.endswith("writable\n")
    assert "libraries and binaries listed by" in result.stderr and "nvidia-container-cli" in result.stderr
    assert "INFO:    --nvccli: the image is writable in memory (--writable-tmpfs)" in result.stderr
    assert not (image / "nvccli").exists()


def test_nvccli_without_the_tool_is_one_fatal_line(singpy: Singpy, gpu_host: object, image: Path,
                                                   workdir: Path) -> None:
    result = _on_gpu_host(singpy, gpu_host, workdir, "", "exec", "--nvccli", str(image), "echo", "started",
                          path="/usr/bin:/bin")
    assert_one_fatal(result, "--nvccli: no executable nvidia-container-cli on PATH")
    failing = workdir / "failing-nvidia-container-cli"
    failing.write_text("#!/bin/sh\necho 'nvml error: driver not loaded' >&2\nexit 1\n")
    failing.chmod(0o755)
    result = _on_gpu_host(singpy, gpu_host, workdir, f"nvidia-container-cli path = {failing}\n", "exec", "--nvccli",
                          str(image), "echo", "started")
    assert_one_fatal(result, "list failed: nvml error: driver not loaded")
