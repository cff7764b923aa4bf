"""singpy.config.liblist: Apptainer's liblist format and classification."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from singpy.config.liblist import LibList, load_liblist, parse_liblist
from singpy.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("", LibList(binaries=(), libraries=(), files=()), id="empty"),
        pytest.param("# only\n   # comments\n\n\t\n", LibList(binaries=(), libraries=(), files=()),
                     id="comments-blanks"),
        pytest.param("nvidia-smi\nlibcuda.so\n/usr/share/x.json\n",
                     LibList(binaries=("nvidia-smi",), libraries=("libcuda.so",), files=("/usr/share/x.json",)),
                     id="one-of-each"),
        pytest.param("  libcuda.so  \n\tnvidia-smi\t\n", LibList(binaries=("nvidia-smi",), libraries=("libcuda.so",),
                     files=()), id="whitespace-stripped"),
        pytest.param("libnvoptix.so.1\nnvidia_drv.so\ntls_test_.so\n",
                     LibList(binaries=(), libraries=("libnvoptix.so.1", "nvidia_drv.so", "tls_test_.so"), files=()),
                     id="so-anywhere"),
        pytest.param("/opt/nvidia/lib64/libcuda.so.550.54.14\n",
                     LibList(binaries=(), libraries=("/opt/nvidia/lib64/libcuda.so.550.54.14",), files=()),
                     id="absolute-library"),
        pytest.param("/usr/share/nvidia/nvoptix.bin\n",
                     LibList(binaries=(), libraries=(), files=("/usr/share/nvidia/nvoptix.bin",)), id="absolute-file"),
        pytest.param("rocm-smi\nrocm-smi\nlibdrm.so\nlibdrm.so\n",
                     LibList(binaries=("rocm-smi",), libraries=("libdrm.so",), files=()), id="duplicates-dropped"),
        pytest.param("libcuda.so # inline\n",
                     LibList(binaries=(), libraries=("libcuda.so # inline",), files=()), id="no-inline-comments"),
        pytest.param("b\na\nlibz.so\nliba.so\n",
                     LibList(binaries=("b", "a"), libraries=("libz.so", "liba.so"), files=()), id="file-order-kept"),
        pytest.param("nvidia-smi\r\nlibcuda.so\r\n",
                     LibList(binaries=("nvidia-smi",), libraries=("libcuda.so",), files=()), id="crlf"),
    ],
)  # fmt: skip
def test_parse_liblist(text: str, expected: LibList) -> None:
    assert parse_liblist(text) == expected


def test_shipped_nvliblist_matches_apptainer_main() -> None:
    liblist = load_liblist(str(REPO / "etc/nvliblist.conf"))
    assert liblist.binaries == (
        "nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server",
    )  # fmt: skip
    assert len(liblist.libraries) == 61
    assert {"libcuda.so", "libcudadebugger.so", "libnvidia-nvvm.so", "libnvoptix.so", "libnvtegrahv.so"} <= set(
        liblist.libraries
    )
    assert "libnvoptix.so.1" not in liblist.libraries  # the typo fixed in Apptainer 1.4.0
    assert len(liblist.files) == 7
    assert "/usr/share/vulkan/icd.d/nvidia_icd.json" in liblist.files


def test_shipped_rocmliblist_matches_apptainer_main() -> None:
    liblist = load_liblist(str(REPO / "etc/rocmliblist.conf"))
    assert liblist.binaries == ("rocm-smi", "rocminfo")
    assert len(liblist.libraries) == 14 and liblist.files == ()
    assert "librocblas.so" not in liblist.libraries  # runtime libraries come from the image (Apptainer 1.4)


@pytest.mark.parametrize("name", [pytest.param("missing.conf", id="missing"), pytest.param("", id="directory")])
def test_unreadable_liblist_is_a_config_error(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    with pytest.raises(ConfigError) as info:
        load_liblist(str(path))
    assert str(path) in info.value.message


@given(st.lists(st.text(max_size=30), max_size=20))
def test_every_entry_lands_in_exactly_one_class(lines: list[str]) -> None:
    liblist = parse_liblist("\n".join(lines))
    entries = liblist.binaries + liblist.libraries + liblist.files
    assert len(entries) == len(set(entries))
    assert all(".so" in entry for entry in liblist.libraries)
    assert all(entry.startswith("/") and ".so" not in entry for entry in liblist.files)
    assert all(entry and not entry.startswith(("#", "/")) and ".so" not in entry for entry in liblist.binaries)
