"""CDI names and JSON specs read without `re` or `json` on the launch path (singpy.gpu.cdi)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from singpy.errors import GpuError
from singpy.gpu import cdi, cdiparse
from singpy.gpu.elf import soname

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param(["nvidia.com/gpu=all"], (("nvidia.com/gpu", "all"),), id="all"),
        pytest.param(["nvidia.com/gpu=0,nvidia.com/gpu=GPU-1a2b"], (("nvidia.com/gpu", "0"),
                                                                     ("nvidia.com/gpu", "GPU-1a2b")), id="list"),
        pytest.param(["nvidia.com/gpu=0:1", "nvidia.com/gpu=0:1"], (("nvidia.com/gpu", "0:1"),), id="mig-once"),
        pytest.param(["vendor-x.io/class_y.z=dev_1.a"], (("vendor-x.io/class_y.z", "dev_1.a"),), id="chars"),
    ],
)
def test_parse_names(values: list[str], expected: tuple[tuple[str, str], ...]) -> None:
    assert cdi.parse_names(values) == expected


@pytest.mark.parametrize("value", ["nvidia.com/gpu", "nvidia.com=0", "/gpu=0", "nvidia.com/=0", "nvidia.com/gpu=",
                                   "nvidia.com/gpu=a=b", "nvidia_com/gpu=0", "nvidia.com/g/pu=0", ".x/gpu=0",
                                   "nvidia.com/gpu=-0", "nvidiä.com/gpu=0", "nvidia.com/gpu=0 1"])
def test_bad_names(value: str) -> None:
    with pytest.raises(GpuError, match="bad --device"):
        cdi.parse_names([value])


def _spec(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_json_spec_as_json_reads_it(tmp_path: Path) -> None:
    spec = {"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu",
            "devices": [{"name": "0", "containerEdits": {"env": ["A=\u00e9\\n"], "deviceNodes": [{"path": "/dev/x",
                                                                                               "major": 195}]}}]}
    parsed = cdi.read_spec(str(_spec(tmp_path / "s.json", "\n " + json.dumps(spec, indent=2) + " \n")))
    assert parsed.kind == "nvidia.com/gpu" and parsed.devices["0"] == spec["devices"][0]["containerEdits"]  # type: ignore[index]


@pytest.mark.parametrize(("text", "line"), [("{\n\"cdiVersion\": \"0.6.0\",\n}", 3), ("{}\n{}", 2), ("", 1),
                                            ("\ufeff{}", 1)])
def test_malformed_json_names_the_line(tmp_path: Path, text: str, line: int) -> None:
    with pytest.raises(GpuError) as caught:
        cdi.read_spec(str(_spec(tmp_path / "bad.json", text)))
    assert caught.value.message.startswith(f"malformed CDI spec {tmp_path}/bad.json:{line}:")


def test_json_constants_are_left_to_json(tmp_path: Path) -> None:
    """NaN is not JSON the fast scanner takes: json.loads reads it, and the spec check refuses a list."""
    assert cdiparse.scan_json("[1, NaN]") is cdiparse.NOT_PARSED
    with pytest.raises(GpuError, match="the spec is not a mapping"):
        cdi.read_spec(str(_spec(tmp_path / "nan.json", "[1, NaN]")))


@pytest.mark.parametrize(("version", "ok"), [("0.5.0", True), ("0.8.1", True), ("0.9.0", False), ("1.0", False),
                                             ("0.٥.0", False), ("v0.5.0", False),
                                             ("0." + "9" * 5000 + ".0", False)])
def test_versions(tmp_path: Path, version: str, ok: bool) -> None:
    text = json.dumps({"cdiVersion": version, "kind": "a.b/c", "devices": [{"name": "x"}]})
    path = str(_spec(tmp_path / "v.json", text))
    if ok:
        assert cdi.read_spec(path).kind == "a.b/c"
    else:
        with pytest.raises(GpuError, match="cdiVersion"):
            cdi.read_spec(path)


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                           | st.text(), lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
                           max_leaves=20)


@given(JSON_VALUES)
def test_scanner_reads_what_json_reads(value: object) -> None:
    text = json.dumps(value)
    assert cdiparse.scan_json(text) == json.loads(text)


def test_a_json_spec_imports_neither_json_nor_re(tmp_path: Path) -> None:
    spec = _spec(tmp_path / "s.json", json.dumps({"cdiVersion": "0.5.0", "kind": "a.b/c", "devices": [{"name": "x"}]}))
    code = (f"import sys; from singpy.gpu import cdi; cdi.read_spec({str(spec)!r}); "
            "print(sorted(name for name in ('json', 're') if name in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.stdout.strip() == "[]"


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build shared objects")
@pytest.mark.parametrize("m32", [False, True], ids=["elf64", "elf32"])
def test_soname_of_built_libraries(tmp_path: Path, m32: bool) -> None:
    """DT_SONAME, what update-ldcache's links are named after, from the ELF file itself."""
    from tests.gpu.simhost import build_elf_library

    try:
        library = build_elf_library(tmp_path, "libdemo.so.3", m32=m32)
    except subprocess.CalledProcessError:
        pytest.skip("gcc -m32 cannot link here")
    renamed = library.rename(tmp_path / "libdemo.so.3.1.4")  # the file's name is not its soname
    assert soname(renamed) == "libdemo.so.3"
    assert soname(_spec(tmp_path / "script.so", "/* GNU ld script */\nGROUP ( libc.so.6 )\n")) is None
    assert soname(tmp_path / "absent.so") is None
    truncated = tmp_path / "truncated.so"
    truncated.write_bytes(renamed.read_bytes()[:200])
    assert soname(truncated) is None
