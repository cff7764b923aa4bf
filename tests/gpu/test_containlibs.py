"""--containlibs (Singularity 2's hidden flag, which Apptainer 1.5 still takes): host library files in
/.singularity.d/libs, where a container's programs load them from, as root and as a user.

The libraries are the simulated GPU host's gcc-built ones (tests/gpu/simhost.py): the image's program
dlopen()s libcuda.so.1 and calls into it, so a test sees the library work, not only a file appear.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.gpu import simhost
from tests.support.configs import readable_config
from tests.support.simhost_runs import sim_host, sim_run

LIBS = "/.singularity.d/libs"
LISTING = f"for f in {LIBS}/*; do echo \"$(basename $f) $(md5sum < $f | cut -c1-32)\"; done; echo \"$LD_LIBRARY_PATH\""


@pytest.fixture(scope="session")
def lib_host(workdir: Path) -> simhost.SimHost:
    return sim_host(workdir, "sim-nvidia-containlibs", simhost.build_nvidia_host)


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def listing(out: str) -> tuple[dict[str, str], str]:
    """LISTING's output -> ({name in the libraries directory: md5}, LD_LIBRARY_PATH)."""
    *entries, ld_path = out.splitlines()
    return dict(line.split() for line in entries), ld_path


def test_a_program_loads_the_library(singpy: Singpy, lib_host: simhost.SimHost, cuda_check_image: Path) -> None:
    libcuda = lib_host.libs["libcuda.so.1"]
    without = singpy.run("exec", str(cuda_check_image), "cuda-check")
    assert without.returncode != 0 and "cuInit" not in without.stdout
    out = singpy.ok("exec", "--containlibs", f"{libcuda}:libcuda.so.1", str(cuda_check_image), "cuda-check")
    assert out == "cuInit=0 driver=12040\n"


def test_comma_lists_names_and_the_variable(singpy: Singpy, lib_host: simhost.SimHost, image: Path) -> None:
    libcuda, libnvml = lib_host.libs["libcuda.so.1"], lib_host.libs["libnvidia-ml.so.1"]
    env = singpy.env(APPTAINER_CONTAINLIBS=f"{libnvml},{libcuda}:/any/dir/libcuda.so.1")
    seen, ld_path = listing(singpy.ok("exec", str(image), "sh", "-c", LISTING, env=env))
    assert seen == {libnvml.name: md5(libnvml), "libcuda.so.1": md5(libcuda)}
    assert ld_path.split(":")[-1] == LIBS
    flagged, _ = listing(singpy.ok("exec", "--containlibs", str(libnvml), str(image), "sh", "-c", LISTING))
    assert flagged == {libnvml.name: md5(libnvml)}
    twice, _ = listing(singpy.ok("exec", "--containlibs", f"{libnvml}:x.so", "--containlibs", f"{libcuda}:x.so",
                                 str(image), "sh", "-c", LISTING))
    assert twice == {"x.so": md5(libcuda)}  # the later one, as Apptainer binds it over the first


def test_the_libraries_are_read_only(singpy: Singpy, lib_host: simhost.SimHost, image: Path) -> None:
    libnvml = lib_host.libs["libnvidia-ml.so.1"]
    before = md5(libnvml)
    result = singpy.run("exec", "--writable-tmpfs", "--containlibs", str(libnvml), str(image), "sh", "-c",
                        f"echo x > {LIBS}/{libnvml.name} || echo refused; touch {LIBS}/new || echo refused")
    assert result.stdout == "refused\nrefused\n", result.stderr
    assert md5(libnvml) == before


def test_a_relative_path_is_from_the_working_directory(singpy: Singpy, lib_host: simhost.SimHost,
                                                       image: Path) -> None:
    libnvml = lib_host.libs["libnvidia-ml.so.1"]
    out = singpy.ok("exec", "--containlibs", libnvml.name, str(image), "ls", LIBS, cwd=libnvml.parent)
    assert out.split() == [libnvml.name]


def test_user_bind_control_off_leaves_them_out(singpy: Singpy, lib_host: simhost.SimHost, image: Path,
                                               workdir: Path) -> None:
    """As Apptainer: they are the user's binds, which the admin turned off (a warning, no error)."""
    config = readable_config(workdir, "containlibs-no-bind-control", "user bind control = no\n")
    result = singpy.run("--config", str(config), "exec", "--containlibs", str(lib_host.libs["libnvidia-ml.so.1"]),
                        str(image), "sh", "-c", f"ls -A {LIBS} 2>/dev/null; echo end")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "end\n"
    assert "WARNING: Ignoring libraries bind request: user bind control disabled by system administrator" \
        in result.stderr


@pytest.mark.parametrize(("value", "message"), [
    ("{workdir}/no-such-lib.so", "no-such-lib.so: can't use {workdir}/no-such-lib.so: No such file or directory"),
    ("{workdir}", "{workdir}: {workdir} is not a file"),
    ("{lib}:..", "the name '..' can't be a file of /.singularity.d/libs"),
    ("{lib}:dir/", "the name '' can't be a file of /.singularity.d/libs"),
])
def test_what_is_not_a_library_file_is_refused(singpy: Singpy, lib_host: simhost.SimHost, image: Path,
                                               workdir: Path, value: str, message: str) -> None:
    fields = {"workdir": workdir, "lib": lib_host.libs["libnvidia-ml.so.1"]}
    result = singpy.run("exec", "--containlibs", value.format(**fields), str(image), "true")
    assert_one_fatal(result, message.format(**fields))


@pytest.mark.skipif(os.getuid() != 0, reason="the simulated GPU host needs root (mknod)")
def test_a_gpu_library_of_the_same_name_wins(singpy: Singpy, lib_host: simhost.SimHost, image: Path,
                                             workdir: Path) -> None:
    """As Apptainer, which binds --nv's libraries after (over) these."""
    nv = sim_run(singpy, lib_host, workdir / f"conf-containlibs-{singpy.profile}", "nvliblist.conf")
    decoy = workdir / f"decoy-{singpy.profile}" / "libcuda.so.1"
    decoy.parent.mkdir(exist_ok=True)
    decoy.write_bytes(b"not the driver's\n")
    decoy.chmod(0o644)
    seen, _ = listing(nv.ok("exec", "--nv", "--containlibs", f"{decoy},{decoy}:mine.so", str(image), "sh", "-c",
                            LISTING, conf="use nvidia-container-cli = no\n"))
    assert seen["libcuda.so.1"] == md5(lib_host.libs["libcuda.so.1"]) != md5(decoy)
    assert seen["mine.so"] == md5(decoy)
    assert seen["libnvidia-ml.so.1"] == md5(lib_host.libs["libnvidia-ml.so.1"])  # --nv's others are all there


def test_the_flag_is_hidden(singpy: Singpy) -> None:
    assert "--containlibs" not in singpy.ok("exec", "--help")
