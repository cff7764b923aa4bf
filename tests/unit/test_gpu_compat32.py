"""--compat32's pieces: the 32-bit identity, the multiarch choice per class, LD_LIBRARY_PATH (issue 28).

Real ELF files (gcc, `-m32` for i386) and a real shell running the action
script; the `ldconfig -p` listing is a script's output, so that the order of
the two architectures under one name is the test's choice.
"""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

import pytest

from singpy.config.liblist import load_liblist
from singpy.constants import LIBS32_DIR, LIBS_DIR
from singpy.env.environ import ACTION_SCRIPT, EnvPlan, final_env, shell_env
from singpy.errors import GpuError
from singpy.gpu import GpuHost
from singpy.gpu.compat32 import UNSUPPORTED, compat32_identity, discover
from singpy.gpu.elf import ElfIdentity, elf_identity
from singpy.gpu.ldcache import find_host_files
from singpy.plan import MountOp
from tests.gpu.simhost import build_elf_library

X86_64, I386, AARCH64 = ElfIdentity(2, 62), ElfIdentity(1, 3), ElfIdentity(2, 183)
LIBS = "/.singularity.d/libs"


@pytest.fixture
def multiarch(tmp_path: Path) -> dict[str, Path]:
    """libfoo.so.1 built for x86-64 and for i386 (skipped where gcc -m32 cannot link)."""
    found = {"64": build_elf_library(tmp_path / "x86_64-linux-gnu", "libfoo.so.1")}
    with contextlib.suppress(subprocess.CalledProcessError):
        found["32"] = build_elf_library(tmp_path / "i386-linux-gnu", "libfoo.so.1", m32=True)
    if "32" not in found:
        pytest.skip("gcc -m32 cannot link here")
    return found


def _host(tmp_path: Path, listed_first: Path, listed_second: Path, flags: tuple[str, str]) -> GpuHost:
    """A host whose `ldconfig -p` lists libfoo.so.1 twice, in this order, and whose liblists name it."""
    ldconfig = tmp_path / "ldconfig"
    ldconfig.write_text("#!/bin/sh\ncat <<'EOF'\n2 libs found in cache `/etc/ld.so.cache'\n"
                        f"\tlibfoo.so.1 ({flags[0]}) => {listed_first}\n"
                        f"\tlibfoo.so.1 ({flags[1]}) => {listed_second}\nEOF\n")
    ldconfig.chmod(0o755)
    liblist = tmp_path / "liblist.conf"
    liblist.write_text("libfoo.so\n")
    return GpuHost(env={}, path_env="", nvliblist=str(liblist), rocmliblist=str(liblist), ldconfig=str(ldconfig),
                   ld_cache_file=str(tmp_path / "no-such-cache"), inherited_libs_dir=str(tmp_path / "none"))


def test_the_32bit_identity_exists_for_x86_64_alone() -> None:
    assert compat32_identity(X86_64) == I386
    assert compat32_identity(AARCH64) is None
    assert compat32_identity(I386) is None


@pytest.mark.parametrize("i386_first", [True, False], ids=["i386-listed-first", "x86-64-listed-first"])
@pytest.mark.parametrize("platform", ["nv", "rocm"])
def test_each_class_finds_its_own_build_whatever_the_order(tmp_path: Path, multiarch: dict[str, Path],
                                                           i386_first: bool, platform: str) -> None:
    order = (multiarch["32"], multiarch["64"]) if i386_first else (multiarch["64"], multiarch["32"])
    flags = ("libc6", "libc6,x86-64") if i386_first else ("libc6,x86-64", "libc6")
    host = _host(tmp_path, *order, flags)
    found = discover(host, platform, native=X86_64)
    binds = [(spec.source, spec.dest) for spec in found.mounts if spec.op == MountOp.BIND]
    assert binds == [(str(multiarch["32"]), f"{LIBS32_DIR}/libfoo.so.1")]
    assert found.mounts[0].op == MountOp.TMPFS and found.mounts[0].dest == LIBS32_DIR
    assert found.mounts[-1].op == MountOp.SEAL and found.mounts[-1].dest == LIBS32_DIR
    assert elf_identity(str(binds[0][0])) == I386
    files = find_host_files(load_liblist(host.nvliblist), platform, host, None)  # the 64-bit pass, same cache
    assert files.libraries == (("libfoo.so.1", str(multiarch["64"])),)


def test_unsupported_architecture_warns(tmp_path: Path, multiarch: dict[str, Path]) -> None:
    found = discover(_host(tmp_path, multiarch["64"], multiarch["32"], ("x", "y")), "nv", native=AARCH64)
    assert found.mounts == ()
    assert found.warnings == (f"while finding 32-bit nv bind points: {UNSUPPORTED}",)


def test_no_32bit_build_warns(tmp_path: Path, multiarch: dict[str, Path]) -> None:
    found = discover(_host(tmp_path, multiarch["64"], multiarch["64"], ("libc6,x86-64", "libc6,x86-64")), "rocm",
                     native=X86_64)
    assert found.mounts == ()
    assert "could not find any 32-bit rocm libraries on this host" in found.warnings


BASE = (("HOME", "/h"), ("PATH", "/bin"))


@pytest.mark.parametrize(("image_value", "entries", "expected"), [
    ("", ["libcuda.so.1"], f"{LIBS}:{{libs32}}"),
    ("/opt/lib", ["libcuda.so.1"], f"/opt/lib:{LIBS}:{{libs32}}"),
    ("{libs32}:/opt/lib", ["libcuda.so.1"], f"{{libs32}}:/opt/lib:{LIBS}"),  # already there: not twice
    ("/opt/lib", [], f"/opt/lib:{LIBS}"),  # an empty directory: not added (Apptainer's test)
    ("/opt/lib", [".hidden"], f"/opt/lib:{LIBS}"),  # what `echo *` does not see either
    ("/opt/lib", None, f"/opt/lib:{LIBS}"),  # no directory
], ids=["unset", "image-path", "present", "empty", "dot-only", "missing"])
def test_ld_library_path_in_python_and_in_the_action_script(tmp_path: Path, image_value: str,
                                                           entries: list[str] | None, expected: str) -> None:
    """The container's libs32 (here a directory of the test's, put in its place) ends LD_LIBRARY_PATH when it has
    an entry: the same in final_env and in the shell's ACTION_SCRIPT."""
    libs32 = tmp_path / "libs32"
    if entries is not None:
        libs32.mkdir()
        for name in entries:
            (libs32 / name).touch()
    image_value, expected = image_value.format(libs32=libs32), expected.format(libs32=libs32)
    plan = EnvPlan(base=BASE, injected=())
    libs = tmp_path / "libs"  # an image's empty /.singularity.d/libs (not the host's missing one: ldconfig's rule)
    libs.mkdir()
    env = final_env(plan, {"LD_LIBRARY_PATH": image_value} if image_value else None, libs=str(libs),
                    libs32=str(libs32))
    assert env["LD_LIBRARY_PATH"] == expected
    # injected, the value is set before the script's LD_LIBRARY_PATH step, as an image's env script sets it
    shell = shell_env(plan.replace(injected=(("LD_LIBRARY_PATH", image_value),) if image_value else ()))
    script = ACTION_SCRIPT.replace(LIBS32_DIR, str(libs32)).replace(f"{LIBS_DIR}/", f"{libs}/")
    shown = subprocess.run(["/bin/sh", "-c", script, "singpy", "sh", "-c", 'echo "$LD_LIBRARY_PATH"'],
                           env=shell, capture_output=True, text=True, check=True).stdout
    assert shown == f"{expected}\n"


@pytest.mark.parametrize("nvccli", [True, False], ids=["nvccli", "configured"])
def test_a_failing_compat32_listing(tmp_path: Path, multiarch: dict[str, Path], nvccli: bool) -> None:
    """--nvccli: one GpuError (a FATAL line), never a quiet fall-back; a tool merely configured: nvliblist.conf,
    with a warning."""
    cli = tmp_path / "nvidia-container-cli"
    cli.write_text("#!/bin/sh\necho 'nvidia-container-cli: unrecognized option --compat32' >&2\nexit 64\n")
    cli.chmod(0o755)
    host = _host(tmp_path, multiarch["64"], multiarch["32"], ("libc6,x86-64", "libc6"))
    host = host.replace(nvidia_container_cli=str(cli), nvccli=nvccli)
    if nvccli:
        with pytest.raises(GpuError, match="--nvccli: .* list --compat32 failed: nvidia-container-cli: unrecognized"):
            discover(host, "nv", native=X86_64)
        return
    found = discover(host, "nv", native=X86_64)
    assert any("nvidia-container-cli list --compat32 failed" in text for text in found.warnings)
    assert [spec.source for spec in found.mounts if spec.op == MountOp.BIND] == [str(multiarch["32"])]
