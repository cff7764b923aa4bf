"""Apptainer's hidden --docker-username, --docker-password and --tmpdir (singpy.cli.flagvars): pull, build, push,
delete and the actions take them as Apptainer does, each flag standing for its variable.

A real docker-registry with Basic auth (tests.support.registry's registry_basic: alice / wonderland), plain HTTP
on 127.0.0.1; a fresh cache per case. As root and as the unprivileged test user.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support.oci import busybox_image, file
from tests.support.pulling import cache_env, user_dir
from tests.support.registry import RegistryServer
from tests.support.sifs import siftool_sif


@pytest.fixture
def private(singpy: Singpy, registry_basic: RegistryServer) -> str:
    """docker://HOST/flags/PROFILE:latest, which only alice may pull."""
    image = busybox_image(extra=[file("etc/flag-marker", f"pulled with flags as {singpy.profile}\n")])
    registry_basic.upload(image, f"flags/{singpy.profile}")
    return f"docker://{registry_basic.host}/flags/{singpy.profile}:latest"


def credentials(registry: RegistryServer, password: str = "") -> list[str]:
    return ["--docker-username", registry.username, "--docker-password", password or registry.password]


def test_pull_takes_the_credentials_as_flags(singpy: Singpy, registry_basic: RegistryServer, private: str,
                                             workdir: Path) -> None:
    out = user_dir(singpy, workdir, "flags-pull")
    anonymous = singpy.run("pull", "--no-https", str(out / "anonymous.sif"), private,
                           env=cache_env(singpy, workdir, "flags-anonymous"))
    assert_one_fatal(anonymous, f"denied by {registry_basic.host}")
    wrong = singpy.run("pull", "--no-https", *credentials(registry_basic, "not-it"), str(out / "wrong.sif"), private,
                       env=cache_env(singpy, workdir, "flags-wrong"))
    assert_one_fatal(wrong, f"the password of '{registry_basic.username}' was refused")
    assert sorted(os.listdir(out)) == []
    singpy.ok("pull", "--no-https", *credentials(registry_basic), str(out / "right.sif"), private,
              env=cache_env(singpy, workdir, "flags-right"))
    assert singpy.ok("exec", str(out / "right.sif"), "cat", "/etc/flag-marker") == \
        f"pulled with flags as {singpy.profile}\n"


@pytest.mark.parametrize("variable", ["APPTAINER_DOCKER_PASSWORD", "SINGULARITY_DOCKER_PASSWORD"])
def test_a_flag_is_one_half_and_a_variable_the_other(singpy: Singpy, registry_basic: RegistryServer, private: str,
                                                     workdir: Path, variable: str) -> None:
    """--docker-username with the password in Apptainer's variable: alice with that password, as in Apptainer,
    where each flag is bound to its own variable."""
    out = user_dir(singpy, workdir, f"flags-half-{variable}")
    env = cache_env(singpy, workdir, f"flags-half-{variable}", **{variable: registry_basic.password})
    singpy.ok("pull", "--no-https", "--docker-username", registry_basic.username, str(out / "half.sif"), private,
              env=env)
    assert (out / "half.sif").stat().st_size > 0


def test_the_flag_wins_over_its_variable(singpy: Singpy, registry_basic: RegistryServer, private: str,
                                         workdir: Path) -> None:
    wrong = {"SINGPY_DOCKER_USERNAME": registry_basic.username, "SINGPY_DOCKER_PASSWORD": "not-it"}
    out = user_dir(singpy, workdir, "flags-win")
    refused = singpy.run("pull", "--no-https", str(out / "refused.sif"), private,
                         env=cache_env(singpy, workdir, "flags-refused", **wrong))
    assert_one_fatal(refused, f"the password of '{registry_basic.username}' was refused")
    singpy.ok("pull", "--no-https", "--docker-password", registry_basic.password, str(out / "won.sif"), private,
              env=cache_env(singpy, workdir, "flags-won", **wrong))


@pytest.mark.parametrize("action", ["exec", "run"])
def test_actions_take_the_credentials_and_the_container_never_sees_them(
        singpy: Singpy, registry_basic: RegistryServer, private: str, workdir: Path, action: str) -> None:
    env = cache_env(singpy, workdir, f"flags-{action}")
    denied = singpy.run(action, "--no-https", private, "true", env=env)
    assert_one_fatal(denied, f"denied by {registry_basic.host}")
    command = ["cat", "/etc/flag-marker"] if action == "exec" else []
    ran = singpy.run(action, "--no-https", *credentials(registry_basic), private, *command, env=env)
    assert ran.returncode == 0, ran.stderr
    if action == "exec":
        assert ran.stdout == f"pulled with flags as {singpy.profile}\n"
    seen = singpy.ok("exec", "--no-https", *credentials(registry_basic), private, "env", env=env)
    assert registry_basic.password not in seen and "DOCKER_" not in seen


def test_build_push_and_delete_take_the_credentials(singpy: Singpy, registry_basic: RegistryServer, private: str,
                                                    workdir: Path) -> None:
    out = user_dir(singpy, workdir, "flags-build")
    built = out / "built.sif"
    env = cache_env(singpy, workdir, "flags-build")
    assert_one_fatal(singpy.run("build", "--no-https", str(built), private, env=env), "denied")
    singpy.ok("build", "--no-https", *credentials(registry_basic), str(built), private, env=env)
    assert singpy.ok("exec", str(built), "cat", "/etc/flag-marker") == f"pulled with flags as {singpy.profile}\n"
    sif = out / "small.sif"
    sif.write_bytes(siftool_sif(workdir).read_bytes())
    reference = f"oras://{registry_basic.host}/flags/pushed-{singpy.profile}:v1"
    assert_one_fatal(singpy.run("push", "--no-https", str(sif), reference, env=env), "denied")
    singpy.ok("push", "--no-https", *credentials(registry_basic), str(sif), reference, env=env)
    fetched = out / "fetched.sif"
    singpy.ok("pull", "--no-https", *credentials(registry_basic), str(fetched), reference, env=env)
    assert fetched.read_bytes() == sif.read_bytes()
    # Debian's docker-registry deletes by digest only (tests/integration/test_oras.py): with the credentials, the
    # delete of a tag gets that far, and no further
    anonymous = singpy.run("delete", "--force", "--no-https", reference, env=env)
    assert_one_fatal(anonymous, f"access to oras://{registry_basic.host}/flags/pushed-{singpy.profile}")
    by_tag = singpy.run("delete", "--force", "--no-https", *credentials(registry_basic), reference, env=env)
    assert_one_fatal(by_tag, f"registry {registry_basic.host} answered HTTP 400 to the delete of")


def test_tmpdir_is_where_the_image_is_converted(singpy: Singpy, registry_basic: RegistryServer, private: str,
                                               workdir: Path) -> None:
    """--tmpdir is SINGPY_TMPDIR: its rules too (a directory another user owns is refused), and the conversion's
    work directory is gone afterwards."""
    mine = user_dir(singpy, workdir, "flags-tmpdir")
    theirs = workdir / f"flags-tmpdir-theirs-{singpy.profile}"
    theirs.mkdir()
    os.chown(theirs, 65534 if singpy.profile == "root" else 0, 65534 if singpy.profile == "root" else 0)
    for action in (["pull", "--no-https", "--tmpdir", str(theirs), str(mine / "refused.sif")],
                   ["exec", "--no-https", "--tmpdir", str(theirs)]):
        command = [*action, *credentials(registry_basic), private, *(["true"] if action[0] == "exec" else [])]
        refused = singpy.run(*command, env=cache_env(singpy, workdir, f"flags-theirs-{action[0]}"))
        assert_one_fatal(refused, str(theirs))
        assert os.listdir(theirs) == []
    singpy.ok("pull", "--no-https", "--tmpdir", str(mine), *credentials(registry_basic), str(mine / "image.sif"),
              private, env=cache_env(singpy, workdir, "flags-mine"))
    assert os.listdir(mine) == ["image.sif"]


def test_overlay_create_lays_out_its_tree_in_tmpdir(singpy: Singpy, workdir: Path) -> None:
    out = user_dir(singpy, workdir, "flags-overlay")
    missing = out / "missing"
    refused = singpy.run("overlay", "create", "--tmpdir", str(missing), str(out / "refused.img"))
    assert_one_fatal(refused, f"can't create a staging directory in {missing}")
    staging = user_dir(singpy, workdir, "flags-overlay-staging")
    singpy.ok("overlay", "create", "--tmpdir", str(staging), "--create-dir", "/data", str(out / "made.img"))
    assert sorted(os.listdir(out)) == ["made.img"] and os.listdir(staging) == []
