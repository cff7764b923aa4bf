"""Version parsing for --nv (no `re`), and what --nv reads from a sandbox image."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from singpy.gpu.nvidia import gpu_index, image_cuda_version
from singpy.gpu.request import image_hints
from singpy.gpu.versions import after, dotted, driver_version_text, major_minor


@pytest.mark.parametrize("text, expected", [
    ("12.4", (12, 4)), ("12.4.1", (12, 4)), (" 2.36", (2, 36)), ("11.8 brand=tesla", (11, 8)),
    ("12", None), ("", None), ("v12.4", None), ("12.x", None), (".4", None),
    ("².0", None), ("12.²", None), ("1" * 5000 + ".0", None), ("12." + "4" * 5000, None),  # an image's odd digits
], ids=lambda value: repr(value)[:20])
def test_major_minor(text: str, expected: tuple[int, int] | None) -> None:
    assert major_minor(text) == expected


def test_after_and_dotted() -> None:
    assert after("cuda>=12.6 brand=tesla,driver>=470", "cuda>=") == (12, 6)
    assert after("brand=tesla", "cuda>=") is None
    assert dotted("550.54.14") == (550, 54, 14) and dotted("570.86") == (570, 86)
    assert dotted("x86_64") is None and dotted("1.2.3.4") is None
    assert dotted("550.²") is None and dotted("550." + "5" * 5000) is None and after("cuda>=².0", "cuda>=") is None


@pytest.mark.parametrize("text", ["²", "1²", "٣", "1" * 5000])
def test_odd_digits_are_no_gpu_index_or_requirement(text: str) -> None:
    """str.isdigit() takes '²' and '٣', which int() refuses or reads; int() refuses 4300 digits and more."""
    from singpy.gpu.mig import find
    from singpy.gpu.require import version

    assert gpu_index(f"nvidia{text}") is None
    assert version(text) is None and version(f"12.{text}") is None
    assert find(f"{text}:0", []) is None and find(f"0:{text}", []) is None


@pytest.mark.parametrize("name, index", [("nvidia0", 0), ("nvidia17", 17), ("nvidiactl", None),
                                         ("nvidia-uvm", None), ("nvidia-caps", None), ("nvidia", None)])
def test_gpu_index(name: str, index: int | None) -> None:
    assert gpu_index(name) == index


@pytest.mark.parametrize("line, version", [
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024", "550.54.14"),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  (dvs-builder@U16)",
     "570.86.15"),
    ("GCC version:  gcc version 12.2.0", None),
])
def test_driver_version_text(line: str, version: str | None, tmp_path: Path) -> None:
    path = tmp_path / "version"
    path.write_text(line + "\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
    assert driver_version_text(str(path)) == version


def test_image_cuda_version_prefers_the_requirement() -> None:
    assert image_cuda_version({"NVIDIA_REQUIRE_CUDA": "cuda>=12.6 brand=tesla", "CUDA_VERSION": "12.4.1"}) == (12, 6)
    assert image_cuda_version({"CUDA_VERSION": "12.4.1"}) == (12, 4)
    assert image_cuda_version({}) is None


def test_image_env_hints_read_env_scripts(tmp_path: Path) -> None:
    env = tmp_path / ".singularity.d" / "env"
    env.mkdir(parents=True)
    (env / "10-docker2singularity.sh").write_text(
        'export PATH="/usr/local/cuda/bin:$PATH"\nexport CUDA_VERSION="${CUDA_VERSION:-"12.4.1"}"\n')
    (env / "90-environment.sh").write_text("NVIDIA_REQUIRE_CUDA='cuda>=12.4 brand=tesla'\n")
    hints = image_hints(str(tmp_path)).env
    assert hints == {"CUDA_VERSION": "12.4.1", "NVIDIA_REQUIRE_CUDA": "cuda>=12.4 brand=tesla"}
    assert image_cuda_version(hints) == (12, 4)


def test_image_glibc_from_a_real_libc(tmp_path: Path) -> None:
    libc = Path("/lib/x86_64-linux-gnu/libc.so.6")
    if not libc.exists():
        pytest.skip("no x86-64 glibc on this host")
    target = tmp_path / "lib" / "x86_64-linux-gnu" / "libc.so.6"
    target.parent.mkdir(parents=True)
    shutil.copy(libc.resolve(), target)
    import platform

    assert image_hints(str(tmp_path)).glibc == ".".join(platform.libc_ver()[1].split(".")[:2])
    assert image_hints(str(tmp_path / "nothing")).glibc is None
