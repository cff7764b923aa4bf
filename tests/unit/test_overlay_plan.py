"""singpy.layers.overlay: which layers go over the image, in which order, and what is refused (Apptainer's rules)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from singpy.errors import SingpyError
from singpy.layers.overlay import OverlayChoice, plan_overlays, split_values
from singpy.plan import ImageSpec


def sandbox(tmp_path: Path) -> ImageSpec:
    return ImageSpec(kind="sandbox", path=str(tmp_path / "image"), rootfs=str(tmp_path / "image"))


def plan(tmp_path: Path, *overlays: str, writable: bool = False, writable_tmpfs: bool = False,
         enable: str = "yes", image: ImageSpec | None = None, path: str = "/usr/bin:/bin") -> OverlayChoice:
    return plan_overlays(image=image or sandbox(tmp_path), writable=writable, overlays=overlays,
                         writable_tmpfs=writable_tmpfs, enable=enable, uid=os.getuid(), user_namespace=False,
                         cwd=str(tmp_path), env={"PATH": path}, partition=None)


@pytest.fixture
def dirs(tmp_path: Path) -> list[Path]:
    paths = [tmp_path / name for name in ("image", "a", "b", "c")]
    for path in paths:
        path.mkdir()
    return paths[1:]


def test_comma_lists_split() -> None:
    assert split_values(("a,b:ro", "c", "")) == ["a", "b:ro", "c"]


def test_writable_overlay_goes_on_top_read_only_ones_in_order(tmp_path: Path, dirs: list[Path]) -> None:
    a, b, c = dirs
    choice = plan(tmp_path, f"{a}:ro", "b", f"{c}:ro")  # a relative path is taken from the cwd
    assert [(spec.path, spec.readonly) for spec in choice.overlays] == [(str(a), True), (str(c), True),
                                                                          (str(b), False)]
    assert {spec.kind for spec in choice.overlays} == {"dir"}


@pytest.mark.parametrize("args, kwargs, message", [
    (("a", "b"), {}, "only one writable overlay can be used"),
    (("a",), {"writable_tmpfs": True}, "--writable-tmpfs can't be used with the writable overlay"),
    (("a:ro",), {"writable": True}, "--overlay can't be used with --writable"),
    (("a:ro",), {"enable": "no"}, "--overlay needs overlays, but `enable overlay = no`"),
    ((), {"writable_tmpfs": True, "enable": "no"}, "--writable-tmpfs needs overlays"),
    (("nowhere",), {}, "does not exist"),
    ((":ro",), {}, "expected PATH[:ro]"),
], ids=["two-writable", "writable-tmpfs", "with-writable", "disabled", "tmpfs-disabled", "missing", "no-path"])
def test_refused(tmp_path: Path, dirs: list[Path], args: tuple[str, ...], kwargs: dict[str, object],
                 message: str) -> None:
    with pytest.raises(SingpyError) as caught:
        plan(tmp_path, *args, **kwargs)  # type: ignore[arg-type]
    assert message in caught.value.message


def test_writable_drops_writable_tmpfs_with_a_warning(tmp_path: Path, dirs: list[Path]) -> None:
    choice = plan(tmp_path, writable=True, writable_tmpfs=True)
    assert not choice.writable_tmpfs
    assert choice.warnings == ["--writable-tmpfs is ignored: it can't be used with --writable"]


@pytest.mark.parametrize("kind", ["sif", "squashfs"])
def test_writable_needs_a_sandbox_or_a_partition(tmp_path: Path, kind: str) -> None:
    image = ImageSpec(kind=kind, path=str(tmp_path / "image"))
    with pytest.raises(SingpyError, match="no writable overlay partition" if kind == "sif" else "can't be written"):
        plan(tmp_path, writable=True, image=image)


def test_driver_needs_fuse_overlayfs(tmp_path: Path, dirs: list[Path]) -> None:
    with pytest.raises(SingpyError, match="the overlay needs fuse-overlayfs .* but fuse-overlayfs is not installed"):
        plan(tmp_path, "a:ro", enable="driver", path=str(tmp_path))


def test_kernel_by_default_fuse_overlayfs_named_as_fallback(tmp_path: Path, dirs: list[Path]) -> None:
    fake = tmp_path / "bin" / "fuse-overlayfs"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    choice = plan(tmp_path, "a:ro", path=str(fake.parent))
    assert choice.driver == "kernel"
    usable = os.getuid() == 0 or os.access("/dev/fuse", os.R_OK | os.W_OK)
    assert choice.tool == (str(fake) if usable else "")
    if usable:
        assert plan(tmp_path, "a:ro", enable="driver", path=str(fake.parent)).driver == "fuse"
