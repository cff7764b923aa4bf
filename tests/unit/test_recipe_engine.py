"""The parts of `singpy build RECIPE.def` that decide before anything runs (singpy.recipe.engine and friends)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from singpy.cli.build import _arg_file, _key_value
from singpy.errors import ImageError, UsageError
from singpy.image.detect import is_definition_file
from singpy.plan import IdMap
from singpy.recipe import bootstrap, mapped, sections, workdir
from singpy.recipe.deffile import DefinitionError
from singpy.recipe.engine import BuildRequest, read_definition


def request(tmp_path: Path, text: str, **options: object) -> BuildRequest:
    recipe = tmp_path / "r.def"
    recipe.write_text(text)
    return BuildRequest(target=str(tmp_path / "out.sif"), recipe=str(recipe), **options)  # type: ignore[arg-type]


def test_post_runs_with_sh_ex_and_c_hands_the_script_to_the_shell() -> None:
    assert sections.shell_argv("post", "/.post.script", "") == ["/bin/sh", "-ex", "/.post.script"]
    assert sections.shell_argv("post", "/.post.script", "-c /bin/bash -l # login shell") == [
        "/bin/sh", "-ex", "-c", "/bin/bash -l /.post.script"]
    with pytest.raises(ImageError, match="missing arguments"):
        sections.shell_argv("post", "/.post.script", "-c")


def test_nested_launcher_sees_only_the_apptainer_variables_apptainer_passes() -> None:
    env = {"PATH": "/bin", "APPTAINER_BINDPATH": "/data", "SINGPY_CACHEDIR": "/c", "APPTAINER_NV": "1",
           "SINGULARITY_TMPDIR": "/t", "SINGULARITYENV_FOO": "kept"}
    runner = sections.Runner(idmap=None, binds=("/a:/b",), env=env)
    assert runner.env == {"PATH": "/bin", "APPTAINER_BINDPATH": "/data", "APPTAINER_NV": "1",
                          "SINGULARITYENV_FOO": "kept"}
    argv = runner.launcher("/work/stage0", writable=True)
    assert argv[argv.index("--build-config") + 1] == "exec"
    assert "--writable" in argv and "--fakeroot" not in argv and argv[-2:] == ["--bind", "/a:/b"]


def test_bootstrap_sources(tmp_path: Path) -> None:
    from singpy.recipe.deffile import parse

    def source(header: str) -> str:
        return bootstrap.source(parse(header, "r.def").stages[0], "/here")

    assert source("Bootstrap: docker\nFrom: 127.0.0.1:5000/base:1\n") == "docker://127.0.0.1:5000/base:1"
    assert source("Bootstrap: docker\nFrom: docker://busybox\n") == "docker://busybox"
    assert source("Bootstrap: oci\nFrom: layout:v1\n") == "oci:/here/layout:v1"
    assert source("Bootstrap: oci-archive\nFrom: /x/a.tar\n") == "oci-archive:/x/a.tar"
    assert source("Bootstrap: docker-archive\nFrom: a.tar\n") == "docker-archive:/here/a.tar"
    assert source("Bootstrap: localimage\nFrom: base.sif\n") == "/here/base.sif"
    assert source("Bootstrap: scratch\n") == ""


@pytest.mark.parametrize(("text", "message"), [
    ("Bootstrap: pacman\nFrom: x\n", "r.def:1: Bootstrap: pacman is not supported"),
    ("Bootstrap: docker\n\n%post\n  true\n", "r.def:1: Bootstrap: docker needs a From: header"),
    ("%post\n  true\n", "r.def:1: the stage has no Bootstrap: header"),
    ("Bootstrap: scratch\n\n%files from nowhere\n  /a\n", "r.def:3: %files from nowhere: no earlier stage"),
])
def test_definition_errors_name_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(DefinitionError) as raised:
        read_definition(request(tmp_path, text))
    assert raised.value.message.startswith(str(tmp_path / message.split(":", 1)[0]))
    assert message.split(":", 1)[1] in raised.value.message


def test_files_from_a_later_stage_is_refused_and_an_earlier_one_accepted(tmp_path: Path) -> None:
    two = "Bootstrap: scratch\nStage: one\n\nBootstrap: scratch\n\n%files from one\n  /a\n"
    assert len(read_definition(request(tmp_path, two))[1].stages) == 2
    with pytest.raises(DefinitionError, match="%files from two"):
        read_definition(request(tmp_path, "Bootstrap: scratch\n\n%files from two\n  /a\n\n"
                                          "Bootstrap: scratch\nStage: two\n"))


def test_unused_build_args_are_an_error_unless_warn_unused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = "Bootstrap: scratch\n\n%post\n  echo {{ A }}\n"
    with pytest.raises(DefinitionError, match="unused build args: B C. Use option --warn-unused-build-args"):
        read_definition(request(tmp_path, text, build_args=(("A", "1"), ("C", "3"), ("B", "2"))))
    read_definition(request(tmp_path, text, build_args=(("A", "1"), ("B", "2")), warn_unused=True))
    assert "Unused build args: B" in capsys.readouterr().err


def test_pre_is_ignored_with_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    read_definition(request(tmp_path, "Bootstrap: scratch\n\n%pre\n  echo before\n"))
    assert "r.def:3: %pre is not supported" in capsys.readouterr().err  # the %pre line, not the stage's first


def test_a_fifo_or_a_huge_file_is_no_definition(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    assert not is_definition_file(str(tmp_path / "fifo"))
    with pytest.raises(ImageError, match="not a regular file"):
        read_definition(BuildRequest(target=str(tmp_path / "o"), recipe=str(tmp_path / "fifo")))
    big = tmp_path / "big.def"
    with open(big, "wb") as handle:
        handle.truncate(5 << 20)
    with pytest.raises(ImageError, match="too large"):
        read_definition(BuildRequest(target=str(tmp_path / "o"), recipe=str(big)))


def test_an_image_is_no_definition_file(tmp_path: Path) -> None:
    (tmp_path / "r.def").write_text("Bootstrap: scratch\n")
    (tmp_path / "fake.sqfs").write_bytes(b"hsqs" + bytes(100))
    assert is_definition_file(str(tmp_path / "r.def"))
    assert not is_definition_file(str(tmp_path / "fake.sqfs"))
    assert not is_definition_file(str(tmp_path))
    assert not is_definition_file(str(tmp_path / "missing"))


def test_build_arg_file_and_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "args").write_text("A=1\nnot a pair\nB=x=y\n")
    assert _arg_file(str(tmp_path / "args")) == [("A", "1"), ("B", "x=y")]
    assert "Skipping 'not a pair' in build arg file" in capsys.readouterr().err
    assert _key_value("K=") == ("K", "")
    with pytest.raises(UsageError):
        _key_value("novalue")


def test_work_directory_goes_to_the_tmpdir_variables_else_next_to_the_output(tmp_path: Path) -> None:
    target = str(tmp_path / "out" / "x.sif")
    assert workdir.parent_dir(target, {}) == str(tmp_path / "out")
    assert workdir.parent_dir(target, {"APPTAINER_TMPDIR": str(tmp_path)}) == str(tmp_path)
    assert workdir.parent_dir(target, {"APPTAINER_TMPDIR": "/nonexistent", "SINGPY_TMPDIR": str(tmp_path)}) == str(
        tmp_path)
    with pytest.raises(ImageError, match="SINGULARITY_TMPDIR=/nonexistent is not a directory"):
        workdir.parent_dir(target, {"SINGULARITY_TMPDIR": "/nonexistent"})


def test_mapped_command_round_trips_the_id_map() -> None:
    idmap = IdMap(uids=((0, 1000, 1), (1, 100000, 65536)), gids=((0, 1000, 1),), helper=True, note="")
    assert mapped.command(idmap)[-4:] == ["--helper", "0:1000:1,1:100000:65536", "0:1000:1", "--"]


def test_mapped_command_runs_the_program_as_root_of_a_user_namespace() -> None:
    import subprocess

    idmap = IdMap(uids=((0, os.getuid(), 1),), gids=((0, os.getgid(), 1),), helper=False, note="")
    done = subprocess.run([*mapped.command(idmap), "sh", "-c", "id -u; readlink /proc/self/ns/user"],
                          capture_output=True, text=True, check=True)
    uid, namespace = done.stdout.split()
    assert uid == "0" and namespace != os.readlink("/proc/self/ns/user")


def test_a_definition_file_with_crlf_line_ends_gives_scripts_without_carriage_returns(tmp_path: Path) -> None:
    _, definition = read_definition(request(tmp_path, "Bootstrap: scratch\r\n\r\n%post\r\n  touch /x\r\n"))
    assert definition.stages[0].script("post") == "  touch /x\n"
