"""An OCI image converted as Apptainer converts it, run: the environment and `run` are Apptainer's.

Each sandbox is a busybox root filesystem (tests/support/images.py) into
which singpy.oci.convert.install wrote /.singularity.d from an image config,
as a pull does. What the container sees is what Apptainer gives
([A] = github.com/apptainer/apptainer):

* environment: [A] internal/pkg/build/sources/conveyorPacker_oci.go
  `insertEnv` writes each Env entry as `export NAME="${NAME:-"value"}"`, PATH
  as `export PATH="value"`; [A] internal/pkg/util/fs/files/action_script.sh
  unsets the host's variables before the env scripts are sourced
  (`clear_env`, keeping HOME) and restores only those the image did not set
  (`restore_env`). So an image's ENV wins over a host variable of the same
  name ("Dockerfile ENV vars will not be overridden by host environment
  variables of the same name", apptainer-userdocs environment_and_metadata.rst),
  the default yields to what is set before the scripts run (HOME), and
  --env / *ENV_ values, injected after them, win (same page, "Environment
  Variable Precedence"); 99-base.sh appends /.singularity.d/libs to
  LD_LIBRARY_PATH, and with --nv the action script prepends ldconfig's
  directories only when LD_LIBRARY_PATH is exactly /.singularity.d/libs and
  the image has a glibc ldconfig (busybox has none).
* `run`: the `ociRunscript` template of conveyorPacker_oci.go; the expected
  outputs are those of [A] e2e/docker/docker.go (testDockerCMD,
  testDockerENTRYPOINT, testDockerCMDENTRYPOINT), whose images are
  CMD ["echo", "CMD", QUOTED...], ENTRYPOINT ["echo", "ENTRYPOINT", QUOTED...]
  and ENTRYPOINT [...] + CMD ["CMD", QUOTED...].
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from singpy.oci import convert
from tests.conftest import SINGPY, Singpy
from tests.gpu import simhost
from tests.support.images import build_busybox_rootfs

REPO = Path(__file__).resolve().parents[2]
CUDA_PATH = "/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TRICKY = "a b \"double\" 'single' $HOME ${HOME} `id -u` $(id -u) \\ back } brace"
NGC_ENV = {
    "PATH": CUDA_PATH,
    "NVARCH": "x86_64",
    "NVIDIA_REQUIRE_CUDA": "cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=470",
    "NV_CUDA_CUDART_VERSION": "12.4.127-1",
    "CUDA_VERSION": "12.4.1",
    "LD_LIBRARY_PATH": "/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
    "NVIDIA_VISIBLE_DEVICES": "all",
    "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
    "TRICKY": TRICKY,
    "EMPTY": "",
    "HOME": "/root",
}
LABELS = {"org.label-schema.schema-version": "1.0", "org.label-schema.build-arch": "amd64"}
QUOTED = ["'quotes'", '"quotes"', "$DOLLAR", "s p a c e s"]
SHOWN = "'quotes' \"quotes\" $DOLLAR s p a c e s"


def oci_sandbox(path: Path, **settings: Any) -> Path:
    """A busybox tree converted as a pull converts it, readable by the test user."""
    root = build_busybox_rootfs(path, runscript=None)
    convert.install(str(root), {"architecture": "amd64", "os": "linux", "config": settings}, LABELS)
    return root


@pytest.fixture(scope="session")
def ngc(workdir: Path) -> Path:
    return oci_sandbox(workdir / "oci-ngc", Env=[f"{name}={value}" for name, value in NGC_ENV.items()]
                       + ["NO_VALUE", "1NVALID=x"], Cmd=["/bin/sh"])


@pytest.fixture(scope="session")
def images(workdir: Path) -> dict[str, Path]:
    """The images of Apptainer's e2e tests, plus one with neither ENTRYPOINT nor CMD and one that prints
    its arguments one by one."""
    return {
        "cmd": oci_sandbox(workdir / "oci-cmd", Cmd=["echo", "CMD", *QUOTED]),
        "entrypoint": oci_sandbox(workdir / "oci-entrypoint", Entrypoint=["echo", "ENTRYPOINT", *QUOTED]),
        "both": oci_sandbox(workdir / "oci-both", Entrypoint=["echo", "ENTRYPOINT", *QUOTED], Cmd=["CMD", *QUOTED]),
        "neither": oci_sandbox(workdir / "oci-neither", Env=["PATH=/usr/bin:/bin"]),
        "printf": oci_sandbox(workdir / "oci-printf", Entrypoint=["printf", "<%s>"], Cmd=["default arg", "it's"]),
    }


def env_inside(singpy: Singpy, image: Path, *flags: str, **host: str) -> dict[str, str]:
    out = singpy.ok("exec", *flags, str(image), "env", "-0", env=singpy.env(**host))
    return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)


# --- environment ---------------------------------------------------------------------------------------------------


def test_ngc_environment_is_apptainers(singpy: Singpy, ngc: Path) -> None:
    env = env_inside(singpy, ngc)
    for name, value in NGC_ENV.items():
        if name not in ("LD_LIBRARY_PATH", "HOME"):
            assert env[name] == value, name
    assert env["LD_LIBRARY_PATH"] == "/usr/local/nvidia/lib:/usr/local/nvidia/lib64:/.singularity.d/libs"
    assert env["NO_VALUE"] == ""  # an Env entry without '=': `${NO_VALUE:-}`
    assert "1NVALID" not in env  # not a shell name: skipped, as Apptainer skips it


def test_image_env_is_not_overridden_by_the_host(singpy: Singpy, ngc: Path) -> None:
    env = env_inside(singpy, ngc, NVIDIA_VISIBLE_DEVICES="0", CUDA_VERSION="11.8", TRICKY="host",
                     LD_LIBRARY_PATH="/host/lib", HOST_ONLY="passes")
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["CUDA_VERSION"], env["TRICKY"]) == ("all", "12.4.1", TRICKY)
    assert env["LD_LIBRARY_PATH"] == "/usr/local/nvidia/lib:/usr/local/nvidia/lib64:/.singularity.d/libs"
    assert env["PATH"] == CUDA_PATH
    assert env["HOST_ONLY"] == "passes"


def test_image_defaults_yield_to_what_is_set_before_them(singpy: Singpy, ngc: Path) -> None:
    """ENV HOME=/root is a default: the action script keeps HOME, so the user's home stays."""
    assert env_inside(singpy, ngc)["HOME"] == singpy.home


def test_injected_values_win_over_the_image(singpy: Singpy, ngc: Path) -> None:
    env = env_inside(singpy, ngc, "--env", "NVIDIA_VISIBLE_DEVICES=none", SINGULARITYENV_CUDA_VERSION="12.0",
                     APPTAINERENV_LD_LIBRARY_PATH="/opt/lib")
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["CUDA_VERSION"]) == ("none", "12.0")
    assert env["LD_LIBRARY_PATH"] == "/opt/lib:/.singularity.d/libs"


def test_cleanenv_keeps_the_image_environment(singpy: Singpy, ngc: Path) -> None:
    env = env_inside(singpy, ngc, "--cleanenv", HOST_ONLY="dropped")
    assert "HOST_ONLY" not in env
    assert (env["CUDA_VERSION"], env["PATH"], env["TRICKY"]) == ("12.4.1", CUDA_PATH, TRICKY)


def test_image_path_gets_the_missing_default_parts(singpy: Singpy, images: dict[str, Path]) -> None:
    """[A] action_script.sh: after 10-docker2singularity.sh, `export PATH="$(fixpath)"` appends the parts of
    the default PATH the image's lacks (apptainer-userdocs: "If PATH is defined, add any missing path parts")."""
    env = env_inside(singpy, images["neither"])
    assert env["PATH"] == "/usr/bin:/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/sbin"


# --- --nv on the simulated GPU host --------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def gpu_host(workdir: Path) -> simhost.SimHost:
    if os.getuid() != 0:
        pytest.skip("the simulated GPU host needs root (mknod)")
    root = workdir / "sim-nvidia-oci"
    root.mkdir()
    host = simhost.build_nvidia_host(root)
    for path in [root, *root.rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)
    return host


def run_nv(singpy: Singpy, host: simhost.SimHost, workdir: Path, *args: str, **env: str) -> str:
    """singpy on the simulated host (tests/gpu/simrun.py), as tests/gpu/test_nv_launch.py runs it."""
    confdir = workdir / f"conf-nv-oci-{singpy.profile}"
    confdir.mkdir(exist_ok=True)
    confdir.chmod(0o755)
    shutil.copy(host.liblist, confdir / "nvliblist.conf")
    (confdir / "singpy.conf").write_text("")
    command = [sys.executable, "-m", "tests.gpu.simrun", str(host.root), str(singpy.uid), str(singpy.gid), "--",
               SINGPY, "--config", str(confdir / "singpy.conf"), *args]
    environment = singpy.env(PATH=f"{host.bin_dir}:/usr/bin:/bin", PYTHONPATH=str(REPO), **env)
    result = subprocess.run(command, env=environment, cwd=singpy.workdir, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_nv_environment_is_apptainers(singpy: Singpy, gpu_host: simhost.SimHost, workdir: Path, ngc: Path,
                                      images: dict[str, Path]) -> None:
    show = ["sh", "-c", 'ls /.singularity.d/libs; echo "ldp=$LD_LIBRARY_PATH nvd=$NVIDIA_VISIBLE_DEVICES"']
    out = run_nv(singpy, gpu_host, workdir, "exec", "--nv", str(ngc), *show, NVIDIA_VISIBLE_DEVICES="1")
    assert "libcuda.so.1" in out.split()  # --nv did bind the host's driver
    assert out.splitlines()[-1] == "ldp=/usr/local/nvidia/lib:/usr/local/nvidia/lib64:/.singularity.d/libs nvd=all"
    out = run_nv(singpy, gpu_host, workdir, "exec", "--nv", str(images["cmd"]), *show)
    assert out.splitlines()[-1] == "ldp=/.singularity.d/libs nvd="


# --- run: ENTRYPOINT and CMD ---------------------------------------------------------------------------------------


def run(singpy: Singpy, image: Path, *args: str, flags: tuple[str, ...] = ()) -> str:
    return singpy.ok("run", *flags, str(image), *args)


def test_cmd_only(singpy: Singpy, images: dict[str, Path]) -> None:
    assert run(singpy, images["cmd"]) == f"CMD {SHOWN}\n"
    assert run(singpy, images["cmd"], "echo", "test") == "test\n"
    assert run(singpy, images["cmd"], "echo", "$HOME") == f"{singpy.home}\n"
    assert run(singpy, images["cmd"], "sh", "-c", 'echo "hello there"') == "hello\n"  # [A]: "historic behavior"


def test_entrypoint_only(singpy: Singpy, images: dict[str, Path]) -> None:
    assert run(singpy, images["entrypoint"]) == f"ENTRYPOINT {SHOWN}\n"
    assert run(singpy, images["entrypoint"], "echo", "test") == f"ENTRYPOINT {SHOWN} echo test\n"
    assert run(singpy, images["entrypoint"], "echo", "$HOME") == f"ENTRYPOINT {SHOWN} echo {singpy.home}\n"


def test_entrypoint_and_cmd(singpy: Singpy, images: dict[str, Path]) -> None:
    assert run(singpy, images["both"]) == f"ENTRYPOINT {SHOWN} CMD {SHOWN}\n"
    assert run(singpy, images["both"], "echo", "test") == f"ENTRYPOINT {SHOWN} echo test\n"
    assert run(singpy, images["both"], "echo", "$HOME") == f"ENTRYPOINT {SHOWN} echo {singpy.home}\n"


def test_neither_entrypoint_nor_cmd(singpy: Singpy, images: dict[str, Path]) -> None:
    """The template then runs the arguments; with none, its `eval "set "` lists the shell's variables."""
    assert run(singpy, images["neither"], "echo", "a  b") == "a  b\n"
    assert "SINGULARITY_OCI_RUN=" in run(singpy, images["neither"])


def test_arguments_with_spaces_and_quotes(singpy: Singpy, images: dict[str, Path]) -> None:
    """CMD items stay whole; `run` arguments are put between double quotes and evaluated by the shell."""
    assert run(singpy, images["printf"]) == "<default arg><it's>"
    assert run(singpy, images["printf"], "a  b", "it's", 'x"y"z', "$HOME") == f"<a  b><it's><xyz><{singpy.home}>"


def test_no_eval_passes_arguments_as_they_are(singpy: Singpy, images: dict[str, Path]) -> None:
    """[A] e2e/docker/docker.go "no-eval/override env var": `run --no-eval IMG echo '$HOME'` prints $HOME."""
    assert run(singpy, images["cmd"], "echo", "$HOME", flags=("--no-eval",)) == "$HOME\n"
    assert run(singpy, images["printf"], "a  b", 'x"y"z', "$HOME", flags=("--no-eval",)) == \
        '<a  b><x"y"z><$HOME>'
