"""singpy run on a simulated GPU host (tests/gpu/simhost.py, put in place of the real one by tests/gpu/simrun.py),
as the GPU tests and test_old_kernels.py run it: `sim_host` builds a host where the test user can read it,
`sim_run` gives a profile's runner on it (`SimHostRun`; `DriverRun` when the simulated driver's /proc/driver/nvidia
must show too), and `build_cuda_check_image` an image without CUDA whose program dlopen()s libcuda.so.1."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.conftest import SINGPY, Singpy
from tests.gpu import simhost
from tests.support.images import build_busybox_rootfs

REPO = Path(__file__).resolve().parent.parent.parent
CUDA_CHECK_C = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) { printf("dlopen failed: %s\n", dlerror()); return 1; }
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(lib, "cuInit");
    int (*version)(int *) = (int (*)(int *))dlsym(lib, "cuDriverGetVersion");
    int v = 0;
    int rc = init(0);
    version(&v);
    printf("cuInit=%d driver=%d\n", rc, v);
    return rc;
}
"""


class SimHostRun:
    """singpy on a simulated GPU host, as one profile's user."""

    def __init__(self, runner: Singpy, host: simhost.SimHost, confdir: Path) -> None:
        self.runner, self.host, self.confdir = runner, host, confdir

    def run(self, *args: str, conf: str = "", **env: str) -> subprocess.CompletedProcess[str]:
        conf_file = self.confdir / f"singpy-{abs(hash(conf))}.conf"
        conf_file.write_text(conf)
        command = [sys.executable, "-m", "tests.gpu.simrun", str(self.host.root), str(self.runner.uid),
                   str(self.runner.gid), "--", SINGPY, "--config", str(conf_file), *args]
        environment = self.runner.env(PATH=f"{self.host.bin_dir}:/usr/bin:/bin", PYTHONPATH=str(REPO), **env)
        return subprocess.run(command, env=environment, cwd=self.runner.workdir, capture_output=True, text=True,
                              timeout=60)

    def ok(self, *args: str, conf: str = "", **env: str) -> str:
        result = self.run(*args, conf=conf, **env)
        assert result.returncode == 0, f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
        return result.stdout


def _confdir(base: Path, liblist: Path, name: str) -> Path:
    confdir = base / name
    confdir.mkdir(exist_ok=True)
    shutil.copy(liblist, confdir / name)
    return confdir


def sim_host(workdir: Path, name: str, build: Callable[..., simhost.SimHost], **options: bool) -> simhost.SimHost:
    """A simulated host in workdir/name, readable by the test user too."""
    root = workdir / name
    root.mkdir()
    host = build(root, **options)
    for path in [root, *root.rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)
    return host


def build_cuda_check_image(directory: Path) -> Path:
    """A busybox image plus the host's glibc and a program that dlopen()s libcuda.so.1: no CUDA inside."""
    root = build_busybox_rootfs(directory)
    program = root / "usr" / "bin" / "cuda-check"
    subprocess.run(["gcc", "-O2", "-o", str(program), "-x", "c", "-", "-ldl"], input=CUDA_CHECK_C, text=True,
                   check=True)
    needed = subprocess.run(["ldd", str(program)], capture_output=True, text=True, check=True).stdout
    for line in needed.splitlines():
        path = line.split("=>")[-1].split("(")[0].strip()
        if path.startswith("/"):
            target = root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(os.path.realpath(path), target)
    assert not list(root.rglob("libcuda*"))
    return root


def sim_run(runner: Singpy, host: simhost.SimHost, parent: Path, liblist_name: str) -> SimHostRun:
    """`host` for `runner`, its conf directory in `parent` (made if missing, open to the test user)."""
    parent.mkdir(exist_ok=True)
    parent.chmod(0o777)
    confdir = _confdir(parent, host.liblist, liblist_name)
    confdir.chmod(0o777)
    (confdir / "singpy.conf").touch()
    return SimHostRun(runner, host, confdir)


# simrun, after a tmpfs over /proc/driver with the simulated driver's version file in nvidia/.
WITH_DRIVER = """
import os, shutil, sys
from singpy.kernel import syscalls as k
from tests.gpu import simrun
k.unshare(k.CLONE_NEWNS)
k.mount(None, "/", None, k.MS_REC | k.MS_PRIVATE)
k.mount("simproc", "/proc/driver", "tmpfs", k.MS_NOSUID | k.MS_NODEV | k.MS_NOEXEC, "mode=0755")
shutil.copytree(os.path.join(sys.argv[1], "proc/driver/nvidia"), "/proc/driver/nvidia")
simrun.main(sys.argv[1:])
"""


class DriverRun(SimHostRun):
    """singpy on the simulated host, its driver version visible at /proc/driver/nvidia/version."""

    def run(self, *args: str, conf: str = "", **env: str) -> subprocess.CompletedProcess[str]:
        conf_file = self.confdir / f"singpy-{abs(hash(conf))}.conf"
        conf_file.write_text(conf)
        command = [sys.executable, "-c", WITH_DRIVER, str(self.host.root), str(self.runner.uid),
                   str(self.runner.gid), "--", SINGPY, "--config", str(conf_file), *args]
        environment = self.runner.env(PATH=f"{self.host.bin_dir}:/usr/bin:/bin", PYTHONPATH=str(REPO), **env)
        return subprocess.run(command, env=environment, cwd=self.runner.workdir, capture_output=True, text=True,
                              timeout=120)
