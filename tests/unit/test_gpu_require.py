"""NVIDIA_REQUIRE_* parsing and evaluation (singpy.gpu.require), and the capability tables."""

from __future__ import annotations

from typing import Any

import pytest

from singpy.gpu import capabilities
from singpy.gpu.require import Condition, Facts, describe, disabled, parse, requirements, satisfied, unmet

NGC_12_6 = ("cuda>=12.6 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=470,driver<471 "
            "brand=tesla,driver>=535,driver<536 brand=nvidia,driver>=535,driver<536")


def facts(cuda: tuple[int, ...] | None = (12, 4), driver: tuple[int, ...] | None = (550, 54, 14),
          archs: tuple[tuple[int, ...], ...] | None = ((9, 0),), brands: tuple[str, ...] | None = ("NVIDIA",),
          asked: list[str] | None = None) -> Facts:
    def answer(name: str, value: Any) -> Any:
        if asked is not None:
            asked.append(name)
        return value

    return Facts(cuda=lambda: answer("cuda", cuda), driver=lambda: answer("driver", driver),
                 archs=lambda: answer("archs", archs), brands=lambda: answer("brands", brands))


def test_parse_or_of_ands() -> None:
    assert parse("cuda>=12.4 brand=tesla,driver>=470,driver<471") == (
        (Condition("cuda", ">=", "12.4"),),
        (Condition("brand", "=", "tesla"), Condition("driver", ">=", "470"), Condition("driver", "<", "471")),
    )
    assert parse("  ") == ()
    assert str(Condition("arch", "!=", "8.0")) == "arch!=8.0"


@pytest.mark.parametrize("text", ["cuda", "gpu>=1", "cuda>=twelve", "brand>=tesla", "cuda>=", ">=12"])
def test_parse_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse(text)


@pytest.mark.parametrize(("text", "met"), [
    ("cuda>=12.4", True), ("cuda>=12.5", False), ("cuda>12.4", False), ("cuda=12.4.0", True),
    ("cuda<13", True), ("cuda!=12.4", False), ("cuda<=12.3", False),
    ("driver>=550", True), ("driver>=550.54.15", False), ("driver<551", True),
    ("arch>=8.0", True), ("arch>=9.0", True), ("arch>9.0", False),
    ("brand=nvidia", True), ("brand=NVIDIA", True), ("brand=tesla", False), ("brand!=geforce", True),
    ("cuda>=12.6 driver>=550", True),  # OR
    ("cuda>=12.4,driver>=551", False),  # AND
    (NGC_12_6, False),  # 12.6 needs a newer driver; 550 is in no forward-compatibility branch
    (NGC_12_6.replace("brand=nvidia,driver>=535,driver<536", "brand=nvidia,driver>=550,driver<551"), True),
])  # fmt: skip
def test_satisfied(text: str, met: bool) -> None:
    assert satisfied(parse(text), facts()) is met


def test_every_gpu_must_match() -> None:
    two = facts(archs=((9, 0), (7, 0)), brands=("NVIDIA", "GeForce"))
    assert not satisfied(parse("arch>=8.0"), two)
    assert not satisfied(parse("brand=nvidia"), two)
    assert satisfied(parse("arch>=7.0"), two)


def test_unknown_facts_do_not_refuse() -> None:
    unknown = facts(cuda=None, driver=None, archs=None, brands=None)
    assert satisfied(parse("cuda>=99.0,arch>=10.0,brand=tesla,driver>=999"), unknown)


def test_cheap_conditions_first_and_lazily() -> None:
    asked: list[str] = []
    assert satisfied(parse("cuda>=12.0 brand=tesla,arch>=8.0"), facts(asked=asked))
    assert asked == ["cuda"]  # the first constraint held: nvidia-smi is never run
    asked.clear()
    assert not satisfied(parse("brand=tesla,driver>=470,driver<471"), facts(asked=asked))
    assert "brands" not in asked  # the driver condition failed first


def test_requirements_and_legacy_cuda_version() -> None:
    assert requirements({"CUDA_VERSION": "12.4.1"}) == (("CUDA_VERSION", "cuda>=12.4"),)
    assert requirements({"CUDA_VERSION": "12.4.1", "NVIDIA_REQUIRE_CUDA": "cuda>=11.0"}) == (
        ("NVIDIA_REQUIRE_CUDA", "cuda>=11.0"),)
    assert requirements({"NVIDIA_REQUIRE_ARCH": "arch>=8.0", "NVIDIA_REQUIRE_CUDA": "cuda>=12"}) == (
        ("NVIDIA_REQUIRE_ARCH", "arch>=8.0"), ("NVIDIA_REQUIRE_CUDA", "cuda>=12"))
    assert requirements({"CUDA_VERSION": "garbage"}) == ()


def test_unmet_names_the_first_failure_and_honours_disable() -> None:
    env = {"NVIDIA_REQUIRE_CUDA": "cuda>=99.0", "NVIDIA_REQUIRE_X": "cuda>=1"}
    assert unmet(env, facts()) == (("NVIDIA_REQUIRE_CUDA", "cuda>=99.0"), ())
    for value, off in (("1", True), ("true", True), ("TRUE", True), ("0", False), ("false", False), ("", False)):
        assert disabled({"NVIDIA_DISABLE_REQUIRE": value}) is off
        assert (unmet({**env, "NVIDIA_DISABLE_REQUIRE": value}, facts())[0] is None) is off


def test_unparsable_requirement_warns_and_is_skipped() -> None:
    failed, warnings = unmet({"NVIDIA_REQUIRE_CUDA": "cuda>=lots"}, facts())
    assert failed is None
    assert warnings and "NVIDIA_REQUIRE_CUDA" in warnings[0] and "not checked" in warnings[0]


def test_describe() -> None:
    assert describe(facts(), "cuda>=99.0") == "CUDA 12.4"
    assert describe(facts(), "brand=tesla,driver>=470") == "driver 550.54.14, GPU brand NVIDIA"
    assert describe(facts(archs=None), "arch>=8.0") == "GPU architecture unknown"


# --- capabilities ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "caps"), [
    ("libcuda.so.1", ("compute", "video")), ("libcuda.so", ("compute", "video")),
    ("libnvidia-ml.so.550.54.14", ("utility",)), ("nvidia-smi", ("utility",)),
    ("nvidia-cuda-mps-server", ("compute",)), ("libnvidia-glcore.so.550.54.14", ("graphics", "display")),
    ("libnvcuvid.so.1", ("video",)), ("libnvidia-wfb.so.1", ("display",)), ("libsomething-else.so", None),
])  # fmt: skip
def test_capabilities_of(name: str, caps: tuple[str, ...] | None) -> None:
    assert capabilities.capabilities_of(name) == caps


@pytest.mark.parametrize(("value", "image_env", "wanted", "warns"), [
    (None, {}, capabilities.EVERYTHING, False),  # an image not made for the toolkit: Apptainer's --nv
    (None, {"CUDA_VERSION": "12.4.1"}, {"utility", "compute"}, False),  # the toolkit's default
    ("compute", {}, {"compute"}, False),
    ("all", {}, capabilities.EVERYTHING, False),
    ("Utility, video", {}, {"utility", "video"}, False),
    ("compute,bogus", {}, {"compute"}, True),
    ("none", {}, set(), False),
])  # fmt: skip
def test_driver_capabilities(value: str | None, image_env: dict[str, str], wanted: set[str], warns: bool) -> None:
    env = {} if value is None else {"NVIDIA_DRIVER_CAPABILITIES": value}
    got, warnings = capabilities.driver_capabilities(env, image_env)
    assert got == wanted
    assert bool(warnings) is warns
    if warns:
        assert "unknown capability 'bogus'" in warnings[0]


def test_nvidia_env_precedence() -> None:
    image = {"NVIDIA_DRIVER_CAPABILITIES": "compute", "NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VERSION": "12.4.1",
             "PATH": "/usr/bin"}
    assert capabilities.nvidia_env(image, {}) == {k: v for k, v in image.items() if k != "PATH"}
    host = {"NVIDIA_VISIBLE_DEVICES": "1", "SINGULARITYENV_NVIDIA_DRIVER_CAPABILITIES": "utility",
            "APPTAINERENV_NVIDIA_DRIVER_CAPABILITIES": "graphics", "CUDA_VERSION": "1.0", "HOME": "/root"}
    merged = capabilities.nvidia_env(image, host)
    assert merged == {"NVIDIA_DRIVER_CAPABILITIES": "graphics", "NVIDIA_VISIBLE_DEVICES": "1",
                      "CUDA_VERSION": "12.4.1"}  # the host's own CUDA_VERSION says nothing about the image
