"""/.singularity.d/libs as mounts (singpy.gpu.libsdir): one bind per host file, links for its other names."""

from __future__ import annotations

import os
from pathlib import Path

from singpy.gpu.libsdir import bound_name, libs_dir_mounts, link_target
from singpy.plan import MountOp

LIBS = "/.singularity.d/libs"


def driver_dir(tmp_path: Path) -> Path:
    """libcuda.so -> libcuda.so.1 -> libcuda.so.550.54.14, and a plain libnvidia-ml.so.1, as installers make them."""
    (tmp_path / "libcuda.so.550.54.14").write_bytes(b"cuda")
    (tmp_path / "libcuda.so.1").symlink_to("libcuda.so.550.54.14")
    (tmp_path / "libcuda.so").symlink_to("libcuda.so.1")
    (tmp_path / "libnvidia-ml.so.1").write_bytes(b"nvml")
    return tmp_path


def test_one_bind_per_file_and_relative_links(tmp_path: Path) -> None:
    lib = driver_dir(tmp_path)
    mounts = libs_dir_mounts([("libcuda.so", str(lib / "libcuda.so")), ("libcuda.so.1", str(lib / "libcuda.so.1")),
                              ("libnvidia-ml.so.1", str(lib / "libnvidia-ml.so.1"))])
    ops = [(m.op, m.dest, m.source) for m in mounts]
    assert ops == [
        (MountOp.TMPFS, LIBS, None),
        (MountOp.BIND, f"{LIBS}/libcuda.so.1", str(lib / "libcuda.so.550.54.14")),
        (MountOp.BIND, f"{LIBS}/libnvidia-ml.so.1", str(lib / "libnvidia-ml.so.1")),
        (MountOp.SYMLINK, f"{LIBS}/libcuda.so", "libcuda.so.1"),
        (MountOp.SEAL, LIBS, None),
    ]
    assert all(m.readonly for m in mounts if m.op == MountOp.BIND)


def test_the_file_s_own_name_is_bound_when_listed(tmp_path: Path) -> None:
    lib = driver_dir(tmp_path)
    names = ["libcuda.so.550.54.14", "libcuda.so.1", "libcuda.so"]
    mounts = libs_dir_mounts([(name, str(lib / name)) for name in names])
    assert [(m.op, m.dest.rsplit("/", 1)[-1], m.source) for m in mounts[1:-1]] == [
        (MountOp.BIND, "libcuda.so.550.54.14", str(lib / "libcuda.so.550.54.14")),
        (MountOp.SYMLINK, "libcuda.so.1", "libcuda.so.550.54.14"),
        (MountOp.SYMLINK, "libcuda.so", "libcuda.so.550.54.14"),
    ]


def test_first_entry_for_a_name_wins_and_extra_links(tmp_path: Path) -> None:
    lib = driver_dir(tmp_path)
    mounts = libs_dir_mounts([("libnvidia-ml.so.1", str(lib / "libnvidia-ml.so.1")),
                              ("libnvidia-ml.so.1", str(lib / "libcuda.so.1"))],
                             [("libnvidia-ml.so", "libnvidia-ml.so.1"), ("libnvidia-ml.so.1", "elsewhere"),
                              ("libGL.so.1", "/usr/lib/x86_64-linux-gnu/libGL.so.1")])
    assert [(m.op, m.dest, m.source) for m in mounts[1:-1]] == [
        (MountOp.BIND, f"{LIBS}/libnvidia-ml.so.1", str(lib / "libnvidia-ml.so.1")),
        (MountOp.SYMLINK, f"{LIBS}/libnvidia-ml.so", "libnvidia-ml.so.1"),
        (MountOp.SYMLINK, f"{LIBS}/libGL.so.1", "/usr/lib/x86_64-linux-gnu/libGL.so.1"),
    ]


def test_nothing_to_bind_is_no_tmpfs() -> None:
    assert libs_dir_mounts([]) == ()


def test_bound_name_and_link_target(tmp_path: Path) -> None:
    lib = driver_dir(tmp_path)
    assert link_target(str(lib / "libcuda.so")) == str(lib / "libcuda.so.550.54.14")
    assert link_target(str(lib / "absent")) == str(lib / "absent")
    (lib / "loop").symlink_to("loop")
    assert link_target(str(lib / "loop")) == str(lib / "loop")  # a loop ends, it does not hang
    assert bound_name("/x/libcuda.so.550", ["libcuda.so", "libcuda.so.1"]) == "libcuda.so.1"
    assert bound_name("/x/libcuda.so.550", ["libcuda.so.1", "libcuda.so.550"]) == "libcuda.so.550"
    assert os.path.islink(lib / "libcuda.so")
