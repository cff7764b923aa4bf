"""--device with CDI specs that are wrong or hostile, as root and as a user: one FATAL line or a harmless effect.

A spec is written by someone else (a driver package, a tool, another user
with --cdi-dirs): its env names never reach shell code, its values reach
the container as written, a malformed file is one FATAL line naming it (no
traceback), a FIFO among the specs is refused rather than waited on, and a
create-symlinks link never binds a host file outside the spec's mounts.
No simulated GPU host is needed: these specs edit only env, mounts and hooks.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support.cdi_specs import cdi_spec_dir


def spec_dir(runner: Singpy, name: str, text: str, suffix: str = "json") -> Path:
    """A directory of this test's own, readable by the profile's user, holding one spec file."""
    return cdi_spec_dir(runner, f"untrusted-{name}", text, suffix)


def env_spec(*entries: str) -> str:
    return json.dumps({"cdiVersion": "0.6.0", "kind": "example.com/env",
                       "devices": [{"name": "x", "containerEdits": {"env": list(entries)}}]})


def launch(runner: Singpy, directory: Path, *args: str, device: str = "example.com/env=x"
           ) -> subprocess.CompletedProcess[str]:
    return runner.run("exec", "--device", device, "--cdi-dirs", str(directory), *args, timeout=60)


INJECTION = "a};id>&2;echo${IFS}PWNED>&2;:${b=1"


@pytest.mark.parametrize("entry", [INJECTION + "=x", "X$(echo)=2", "2X=1", "A=with\u0000nul"],
                         ids=["braces", "command", "digit-first", "nul-value"])
def test_an_env_entry_that_is_not_name_value_is_fatal(singpy: Singpy, env_image: Path, entry: str) -> None:
    """The image has env scripts, so the injected names would reach the container's shell (ACTION_SCRIPT)."""
    directory = spec_dir(singpy, "badname", env_spec(entry))
    result = launch(singpy, directory, str(env_image), "echo", "payload ran")
    assert_one_fatal(result, f"CDI spec {directory}/spec.json")
    assert "PWNED" not in result.stderr.splitlines() and "uid=" not in result.stderr  # no `id`, no `echo` ran


VALUES = ["$(id -u)-`echo ran`", "back\\slash\\", '"quoted" \\$HOME', "${HOME}", "plain"]


@pytest.mark.parametrize("flags", [[], ["--cleanenv"], ["--no-eval"]], ids=["default", "cleanenv", "no-eval"])
@pytest.mark.parametrize("with_scripts", [True, False], ids=["env-scripts", "no-env-scripts"])
def test_env_values_reach_the_container_as_written(singpy: Singpy, image: Path, env_image: Path,
                                                   flags: list[str], with_scripts: bool) -> None:
    """As CDI and OCI set them: the spec's text, never evaluated (the user's --env values alone are)."""
    entries = [f"CDI_V{index}={value}" for index, value in enumerate(VALUES)]
    directory = spec_dir(singpy, "values", env_spec(*entries))
    show = "".join(f'printf "%s|" "$CDI_V{index}"; ' for index in range(len(VALUES)))
    out = launch(singpy, directory, *flags, str(env_image if with_scripts else image), "sh", "-c", show)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("|")[:-1] == VALUES


def test_env_flag_still_evaluates_and_wins(singpy: Singpy, env_image: Path) -> None:
    directory = spec_dir(singpy, "flagwins", env_spec("CDI_A=$(echo spec)", "CDI_B=spec"))
    out = launch(singpy, directory, "--env", "CDI_B=$(echo flag)", str(env_image), "sh", "-c", 'echo "$CDI_A $CDI_B"')
    assert out.returncode == 0, out.stderr
    assert out.stdout == "$(echo spec) flag\n"


def test_home_from_a_spec_is_refused_naming_the_spec(singpy: Singpy, image: Path) -> None:
    directory = spec_dir(singpy, "home", env_spec("HOME=/from-cdi", "CDI_OK=yes"))
    out = launch(singpy, directory, str(image), "sh", "-c", 'echo "$HOME $CDI_OK"')
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"{singpy.home} yes\n"
    assert (f"WARNING: overriding HOME environment variable with the CDI spec {directory}/spec.json "
            "is not permitted") in out.stderr
    assert "--env" not in out.stderr


_BASE = 'cdiVersion: "0.5.0"\nkind: example.com/env\ndevices:\n- name: x\n  containerEdits:\n'
_JSON = '{"cdiVersion": "0.5.0", "kind": "example.com/env", "devices": [{"name": "x", "containerEdits": %s}]}'
MALFORMED = [
    pytest.param(_BASE + "    5: x\n", "yaml", id="int-key"),
    pytest.param(_BASE + "    ~: x\n    foo: y\n", "yaml", id="null-key"),
    pytest.param(_BASE + "    deviceNodes:\n    - path: /dev/null\n      hostPath: 5\n", "yaml", id="hostpath-int"),
    pytest.param(_BASE + "    deviceNodes:\n    - path: /dev/null\n      hostPath: [a]\n", "yaml", id="hostpath-list"),
    pytest.param(_BASE + "    deviceNodes:\n    - path: /dev/null\n      hostPath: !!binary L2Rldi9udWxs\n", "yaml",
                 id="hostpath-binary"),
    pytest.param(_BASE + "    deviceNodes:\n    - path: /dev/null\n      type: [c]\n", "yaml", id="type-list"),
    pytest.param(_BASE + "    deviceNodes:\n    - path: /dev/null\n      major: " + "9" * 5000 + "\n", "yaml",
                 id="yaml-long-number"),
    pytest.param(_BASE + "    env: [A=1]\n  when: 2001-02-30\n", "yaml", id="yaml-bad-date"),
    pytest.param(_JSON % '{"mounts": [{"hostPath": "/etc\\u0000x", "containerPath": "/x"}]}', "json",
                 id="nul-hostpath"),
    pytest.param(_JSON % '{"mounts": [{"hostPath": "/etc\\ud800", "containerPath": "/x"}]}', "json",
                 id="surrogate-hostpath"),
    pytest.param(_JSON % '{"deviceNodes": [{"path": "/dev/null\\u0000"}]}', "json", id="nul-node"),
    pytest.param(_JSON % '{"env": ["A=\\ud800"]}', "json", id="surrogate-env"),
    pytest.param(_JSON % ('{"hooks": [{"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook", "args": '
                          '["nvidia-cdi-hook", "create-symlinks", "--link", "a::/x\\u0000y"]}]}'), "json",
                 id="nul-link"),
    pytest.param(_JSON % ('{"deviceNodes": [{"path": "/dev/null", "major": ' + "9" * 5000 + "}]}"), "json",
                 id="json-long-number"),
    pytest.param(_JSON % ("{}, " + '"x": ' + "[" * 100000 + "]" * 100000), "json", id="json-deep"),
    pytest.param(_JSON.replace('"0.5.0"', '"0.' + "5" * 5000 + '.0"') % "{}", "json", id="long-version"),
]


@pytest.mark.parametrize(("text", "suffix"), MALFORMED)
def test_a_malformed_spec_is_one_fatal_line_naming_it(singpy: Singpy, image: Path, text: str, suffix: str) -> None:
    directory = spec_dir(singpy, "malformed", text, suffix)
    for old in directory.iterdir():  # one spec at a time: the parameters share the directory
        if old.name != f"spec.{suffix}":
            old.unlink()
    assert_one_fatal(launch(singpy, directory, str(image), "echo", "payload ran"), f"{directory}/spec.{suffix}")


@pytest.mark.parametrize("odd", ["fifo", "link-to-fifo"])
def test_a_fifo_among_the_specs_is_refused_not_waited_on(singpy: Singpy, image: Path, odd: str) -> None:
    """Next to a valid spec; a link to one too (links are followed: /etc/cdi/nvidia.yaml is often one)."""
    directory = spec_dir(singpy, odd, env_spec("CDI_OK=yes"))
    other = directory / "other.yaml"
    if not (other.exists() or other.is_symlink()):
        fifo = other if odd == "fifo" else directory.parent / f"cdi-untrusted-fifo-target-{singpy.profile}"
        os.mkfifo(fifo, 0o666)
        if odd != "fifo":
            other.symlink_to(fifo)
    try:
        result = launch(singpy, directory, str(image), "echo", "payload ran")
    except subprocess.TimeoutExpired:
        pytest.fail(f"singpy waited on the {odd} {other}")
    assert_one_fatal(result, f"the CDI spec {other} is not a regular file")


def test_a_link_through_a_host_symlink_out_of_a_mount_binds_nothing_outside(singpy: Singpy, image: Path) -> None:
    """A mounted driver directory holding `sub -> OUTSIDE`: `--link /opt/drv/sub/secret::/usr/lib/libx.so` once
    bound OUTSIDE/secret (the host's /etc/shadow with `sub -> /etc`); now only a link is made, which leads into
    the container's own tree, where OUTSIDE is not."""
    base = singpy.workdir / f"cdi-untrusted-escape-{singpy.profile}"
    outside, drv = base / "outside", base / "drv"
    for path in (base, outside, drv):
        path.mkdir(exist_ok=True)
        path.chmod(0o755)
    (outside / "secret").write_text("HOST-SECRET\n")
    (outside / "secret").chmod(0o644)
    (drv / "libreal.so").write_text("driver\n")
    if not (drv / "sub").is_symlink():
        (drv / "sub").symlink_to(outside)
    spec = {"cdiVersion": "0.6.0", "kind": "example.com/drv", "devices": [{"name": "x", "containerEdits": {
        "mounts": [{"hostPath": str(drv), "containerPath": "/opt/drv", "options": ["ro", "bind"]}],
        "hooks": [{"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook",
                   "args": ["nvidia-cdi-hook", "create-symlinks", "--link", "/opt/drv/sub/secret::/usr/lib/libx.so",
                            "--link", "/opt/drv/libreal.so::/usr/lib/libreal.so"]}]}}]}
    directory = spec_dir(singpy, "escape", json.dumps(spec))
    args = ("exec", "--contain", "--device", "example.com/drv=x", "--cdi-dirs", str(directory), str(image))
    report = json.loads(singpy.ok(*args[:1], "--dry-run", *args[1:], "true"))
    binds = report["gpu"]["other_binds"]
    assert f"{drv}/libreal.so -> /usr/lib/libreal.so" in binds  # inside the mount: bound, as before
    assert not any(str(outside) in bind for bind in binds), binds
    out = singpy.run(*args, "sh", "-c", "cat /usr/lib/libreal.so; cat /usr/lib/libx.so 2>/dev/null; echo end")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "driver\nend\n"
