"""The environment where singpy differed from Apptainer 1.5's action script, seen from inside the container.

* the order around Apptainer's 99-base.sh: the image's env scripts up to it,
  then the injected variables (--env...) and LD_LIBRARY_PATH's default, then
  the later scripts (`99-zz.sh`), which see and may change all of that;
* `--env LD_LIBRARY_PATH=` leaves it empty (Apptainer appends
  /.singularity.d/libs only to a value that is not empty);
* `__SINGPY_` names, the action script's own, can't be injected: one warning,
  and the container starts as without them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from singpy.oci.basefiles import ENV_SCRIPTS
from tests.conftest import Singpy
from tests.support.images import build_busybox_rootfs

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LIBS = "/.singularity.d/libs"
LATE_SCRIPT = (  # sorts after 99-base.sh and 99-runtimevars.sh, as a user's `%environment` addition might
    'export LATE_SAW="${FROM_USER-unset}|$LD_LIBRARY_PATH|$PATH"\n'
    "export SHARED=late\n"
    'export LD_LIBRARY_PATH="/late${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"\n'
)


@pytest.fixture(scope="module")
def apptainer_image(workdir: Path) -> Path:
    """A busybox image with Apptainer's own env scripts (99-base.sh among them) and one after them."""
    return build_busybox_rootfs(workdir / "busybox-apptainer-env",
                                env_scripts={**ENV_SCRIPTS, "99-zz-late.sh": LATE_SCRIPT})


@pytest.fixture(params=["plain", "with-env-scripts", "apptainer-scripts"])
def any_image(request: pytest.FixtureRequest, image: Path, env_image: Path, apptainer_image: Path) -> Path:
    """The environment built in Python (no env script), by the action shell, and with 99-base.sh."""
    return {"plain": image, "with-env-scripts": env_image, "apptainer-scripts": apptainer_image}[request.param]


def shown(singpy: Singpy, image: Path, *flags: str, script: str, **host: str) -> str:
    out = singpy.run("exec", *flags, str(image), "/bin/sh", "-c", script, env=singpy.env(**host))
    assert out.returncode == 0, out.stderr
    return out.stdout.removesuffix("\n")


# --- the order around 99-base.sh -----------------------------------------------------------------------------------


def test_scripts_after_99_base_run_after_injection_and_the_libs_dir(singpy: Singpy, apptainer_image: Path) -> None:
    """Apptainer sources /.inject-apptainer-env.sh and sets LD_LIBRARY_PATH's default right after 99-base.sh:
    a later script sees --env's values and the final LD_LIBRARY_PATH, and what it sets stays."""
    script = 'printf "%s\\n" "$LATE_SAW" "$SHARED" "$LD_LIBRARY_PATH"'
    out = shown(singpy, apptainer_image, "--env", "FROM_USER=user", "--env", "SHARED=user", script=script)
    assert out.split("\n") == [f"user|{LIBS}|{DEFAULT_PATH}", "late", f"/late:{LIBS}"]


def test_path_rules_come_before_the_later_scripts(singpy: Singpy, apptainer_image: Path) -> None:
    """99-runtimevars.sh's place: --env PREPEND_PATH applies before a later script looks at PATH."""
    out = shown(singpy, apptainer_image, "--env", "PREPEND_PATH=/pre", script='echo "$LATE_SAW"')
    assert out == f"unset|{LIBS}|/pre:{DEFAULT_PATH}"


def test_prepend_ld_library_path_applies_after_the_later_scripts(singpy: Singpy, apptainer_image: Path) -> None:
    out = shown(singpy, apptainer_image, "--env", "PREPEND_LD_LIBRARY_PATH=/p", script='echo "$LD_LIBRARY_PATH"')
    assert out == f"/p:/late:{LIBS}"


# --- --env LD_LIBRARY_PATH= ----------------------------------------------------------------------------------------


def test_empty_ld_library_path_stays_empty(singpy: Singpy, any_image: Path) -> None:
    script = 'echo "[${LD_LIBRARY_PATH-unset}]"'
    expected = "[/late]" if "apptainer" in any_image.name else "[]"  # 99-zz-late.sh adds its own
    assert shown(singpy, any_image, "--env", "LD_LIBRARY_PATH=", script=script) == expected
    assert shown(singpy, any_image, script=script, APPTAINERENV_LD_LIBRARY_PATH="") == expected
    # Apptainer adds PREPEND_/APPEND_LD_LIBRARY_PATH only to one that is not empty
    assert shown(singpy, any_image, "--env", "LD_LIBRARY_PATH=,PREPEND_LD_LIBRARY_PATH=/p",
                 script=script) == expected.replace("[/", "[/p:/")


def test_ld_library_path_injected_gets_the_libs_dir(singpy: Singpy, any_image: Path) -> None:
    """Unchanged: a value that is not empty ends with /.singularity.d/libs."""
    expected = f"/mine:{LIBS}"
    expected = f"/late:{expected}" if "apptainer" in any_image.name else expected
    assert shown(singpy, any_image, "--env", "LD_LIBRARY_PATH=/mine", script='echo "$LD_LIBRARY_PATH"') == expected


# --- __SINGPY_ names -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["--env", "--env-file", "APPTAINERENV_", "SINGULARITYENV_"])
def test_internal_names_cannot_be_injected(singpy: Singpy, any_image: Path, how: str) -> None:
    """`__SINGPY_PATH` is the action script's own PATH rule: injected, it replaced the container's PATH and
    `sh` was not found. Refused as Apptainer refuses HOME: one warning, nothing else changes."""
    flags: list[str] = []
    host: dict[str, str] = {}
    if how == "--env":
        flags = ["--env", "__SINGPY_PATH=/nowhere"]
    elif how == "--env-file":
        path = singpy.workdir / f"env-order-{singpy.profile}.env"
        path.write_text("__SINGPY_PATH=/nowhere\n")
        flags = ["--env-file", str(path)]
    else:
        host = {f"{how}__SINGPY_PATH": "/nowhere"}
    out = singpy.run("exec", *flags, str(any_image), "sh", "-c", 'echo "$PATH"', env=singpy.env(**host))
    assert out.returncode == 0, out.stderr
    assert out.stdout.endswith(f"{DEFAULT_PATH}\n") and "/nowhere" not in out.stdout
    origin = how if how.startswith("--") else f"{how}__SINGPY_PATH"
    assert out.stderr.splitlines() == [
        f"WARNING: overriding __SINGPY_PATH environment variable with {origin} is not permitted"]


def test_internal_names_from_the_host_do_not_pass(singpy: Singpy, any_image: Path) -> None:
    """A host variable named like the script's own (`__SINGPY_INJECT`) neither passes nor changes anything."""
    out = singpy.run("exec", "--env", "MINE=1", str(any_image), "env",
                     env=singpy.env(__SINGPY_INJECT="PATH", __SINGPY_I_PATH="/nowhere", __SINGPY_OTHER="x"))
    assert out.returncode == 0, out.stderr
    assert "MINE=1" in out.stdout.splitlines()
    assert "__SINGPY" not in out.stdout
    assert "/nowhere" not in out.stdout
