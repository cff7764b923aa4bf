"""Every error a user can cause: one clear line, the right exit code, nothing left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support.leftovers import settled, traces


def failing_cases(image: Path, workdir: Path) -> dict[str, tuple[list[str], int, str]]:
    escape = workdir / "escape-image"
    if not escape.exists():
        from tests.support.images import build_busybox_rootfs

        build_busybox_rootfs(escape)
        (escape / "evil").symlink_to("../../../../tmp")
    not_image = workdir / "not-an-image.txt"
    not_image.write_text("hello")
    missing = f"missing-{workdir.name}"  # in the host's /tmp, where no other program makes a file of this name
    return {
        "missing image": (["exec", str(workdir / "nope"), "true"], 255, "does not exist"),
        "not an image": (["exec", str(not_image), "true"], 255, "is not a container image"),
        # the text of a flag is wrong: a command-line mistake, exit 1 as for --env (docs/usage.md)
        "bad bind spec": (["exec", "-B", "/a:/b:/c:ro", str(image), "true"], 1, "bad bind specification"),
        "bad bind option": (["exec", "-B", "/tmp:/x:rx", str(image), "true"], 1, "unknown option 'rx'"),
        "missing bind source": (["exec", "-B", "/no/such/dir:/x", str(image), "true"], 255,
                                "bind source /no/such/dir does not exist"),
        # evil -> ../../../../tmp climbs no higher than the container's root, as inside: /tmp/MISSING, on the
        # host's /tmp bound there, where singpy makes nothing.
        "escaping destination": (["exec", "-B", f"{workdir}:/evil/{missing}", str(escape), "true"], 255,
                                 f"/evil/{missing}: /tmp/{missing} does not exist and can't be made"),
        "unknown flag": (["exec", "--no-such-flag", str(image), "true"], 1, "unknown flag: --no-such-flag"),
        "missing command": (["exec", str(image)], 1, "needs a COMMAND"),
        "command not found": (["exec", str(image), "no-such-command"], 255,
                              '"no-such-command": executable file not found in $PATH'),
        "bad env value": (["exec", "--env", "=x", str(image), "true"], 1, "bad --env value"),
    }


CASES = ["missing image", "not an image", "bad bind spec", "bad bind option", "missing bind source",
         "escaping destination", "unknown flag", "missing command", "command not found", "bad env value"]


@pytest.mark.parametrize("case", CASES)
def test_user_errors(singpy: Singpy, image: Path, workdir: Path, case: str) -> None:
    args, code, message = failing_cases(image, workdir)[case]
    before = traces(image, workdir)  # mounts, loop devices, processes and TMPDIR entries naming our paths
    result = singpy.run(*args)
    assert_one_fatal(result, message, code)
    assert settled(before, image, workdir) == before


def test_command_not_found_with_env_scripts(singpy: Singpy, env_image: Path) -> None:
    result = singpy.run("exec", str(env_image), "no-such-command")
    assert result.returncode == 255
    assert result.stderr.strip() == 'FATAL:   "no-such-command": executable file not found in $PATH'


def test_unreadable_image(as_user: Singpy, workdir: Path) -> None:
    private = workdir / "private"
    private.mkdir(exist_ok=True)
    private.chmod(0o000)  # unreadable by the test user, even when that is its owner (an unprivileged suite)
    result = as_user.run("exec", str(private), "true")
    assert result.returncode == 255
    assert result.stderr.startswith("FATAL:") and "permission denied" in result.stderr


_LONG_LABEL = "a" * 64 + ".example"  # a DNS label holds 63 characters: Python's IDNA codec refuses the name
_NOT_A_HOST = "not a valid host name"
_NOT_A_PORT = "is not a valid registry address (a port is a number up to 65535)"


@pytest.mark.parametrize(("command", "message"), [
    (["pull", "{out}", f"docker://{_LONG_LABEL}/x:1"], _NOT_A_HOST),
    (["exec", f"docker://{_LONG_LABEL}/x:1", "true"], _NOT_A_HOST),
    (["pull", "{out}", f"oras://{_LONG_LABEL}/x:1"], _NOT_A_HOST),
    (["push", "{image}", f"oras://{_LONG_LABEL}/x:1"], _NOT_A_HOST),
    (["pull", "--library", f"https://{_LONG_LABEL}", "{out}", "library://e/c/x:1"], _NOT_A_HOST),
    (["key", "search", "--url", f"https://{_LONG_LABEL}", "someone"], _NOT_A_HOST),
    (["pull", "{out}", "docker://127.0.0.1:99999/x:1"], _NOT_A_PORT),
    (["exec", "docker://[::1]:99999/x:1", "true"], _NOT_A_PORT),
    (["push", "{image}", "oras://127.0.0.1:99999/x:1"], _NOT_A_PORT),
], ids=["pull docker", "exec docker", "pull oras", "push oras", "pull library", "key search", "pull docker port",
        "exec docker port", "push oras port"])
def test_a_registry_address_no_url_can_hold_is_one_fatal_line(singpy: Singpy, workdir: Path, tmp_path: Path,
                                                              command: list[str], message: str) -> None:
    """A registry, library or keyserver named with a label over 63 characters was a UnicodeError traceback; a
    registry port over 65535 (which the reference grammar accepts) a TransportError traceback."""
    from tests.support import sifs

    tmp_path.chmod(0o777)  # the test user writes its --output here
    out = tmp_path / "out.sif"
    image = sifs.singpy_sif(workdir) if command[0] == "push" else ""
    argv = [part.format(out=out, image=image) for part in command]
    assert_one_fatal(singpy.run(*argv), message)
    assert not out.exists()


def test_debug_shows_a_traceback(singpy: Singpy, workdir: Path) -> None:
    result = singpy.run("-d", "exec", str(workdir / "nope"), "true")
    assert result.returncode == 255
    assert "Traceback" in result.stderr and "FATAL:" in result.stderr


def test_bad_configuration_names_file_and_line(singpy: Singpy, image: Path, workdir: Path) -> None:
    conf = workdir / "bad.conf"
    conf.write_text("mount home = yes\nmount tmp = maybe\n")
    result = singpy.run("--config", str(conf), "exec", str(image), "true")
    assert result.returncode == 255
    assert f"{conf}:2: mount tmp must be yes or no" in result.stderr


@pytest.mark.parametrize("closed", [0, 1, 2], ids=["stdin", "stdout", "stderr"])
def test_a_run_with_a_standard_descriptor_closed(singpy: Singpy, workdir: Path, closed: int) -> None:
    """With 0, 1 or 2 closed by the caller, the next file singpy opened took that number (/dev/fuse as 0), and
    the FUSE helper's standard descriptors covered it: the SIF failed to mount (or the run was silent)."""
    import os
    import subprocess

    from tests.conftest import default_signals
    from tests.support import sifs

    def close_one() -> None:
        default_signals()
        os.close(closed)

    place = workdir / f"closed-{closed}-{singpy.profile}"  # the test user reaches it (not tmp_path's parents)
    place.mkdir(mode=0o777, exist_ok=True)
    place.chmod(0o777)
    marker = place / "ran"
    process = singpy.popen(["exec", "--userns", "-B", str(place), str(sifs.singpy_sif(workdir)), "sh", "-c",
                            f"echo ran > {marker}"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, preexec_fn=close_one)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert marker.read_text() == "ran\n"
    assert "Traceback" not in err
