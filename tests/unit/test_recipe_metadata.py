"""singpy.recipe.metadata: a stage's /.singularity.d written into real root filesystems, hostile links included."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from singpy.errors import ImageError
from singpy.image.metadata import read_tree
from singpy.recipe.deffile import Stage, parse
from singpy.recipe.metadata import shebang_script, write_metadata

FULL = """\
Bootstrap: docker
From: alpine:3.20

%help
    Say hello.

%labels
    Author alice
    Version 1.2

%environment
    export GREETING=hello

%runscript
    echo "$GREETING" "$@"

%startscript
#!/bin/bash
exec sleep 100

%test
    test -n "$GREETING"
"""

BUILD_LABELS = {"org.label-schema.schema-version": "1.0", "org.label-schema.build-arch": "amd64"}


def stage_of(text: str) -> Stage:
    return parse(text, "test.def").stages[-1]


def write(rootfs: Path, text: str, *, force: bool = False, build_labels: dict[str, str] | None = None) -> None:
    write_metadata(str(rootfs), stage_of(text), definition=text,
                   build_labels=BUILD_LABELS if build_labels is None else build_labels, force=force)


def meta(rootfs: Path, name: str) -> Path:
    return rootfs / ".singularity.d" / name


def labels_of(rootfs: Path) -> dict[str, str]:
    loaded: dict[str, str] = json.loads(meta(rootfs, "labels.json").read_text())
    return loaded


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    root = tmp_path / "rootfs"
    root.mkdir()
    return root


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """Host files outside the rootfs that hostile links point at: they must stay as they are."""
    where = tmp_path / "host"
    (where / "etc").mkdir(parents=True)
    (where / "etc" / "passwd").write_text("host passwd\n")
    (where / "etc" / "labels.json").write_text('{"host": "label"}')
    return where


@pytest.fixture
def strict_umask() -> Iterator[None]:
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def test_a_full_stage_into_an_empty_rootfs(rootfs: Path, strict_umask: None) -> None:
    write(rootfs, FULL)
    assert meta(rootfs, "runscript.help").read_text() == "    Say hello.\n\n\n"
    assert meta(rootfs, "runscript").read_text() == '#!/bin/sh\n\n    echo "$GREETING" "$@"\n\n\n'
    assert meta(rootfs, "startscript").read_text() == "#!/bin/bash\n\nexec sleep 100\n\n\n"
    assert meta(rootfs, "test").read_text() == '#!/bin/sh\n\n    test -n "$GREETING"\n\n'
    assert meta(rootfs, "env/90-environment.sh").read_text() == "#!/bin/sh\n\n    export GREETING=hello\n\n\n"
    assert meta(rootfs, "Singularity").read_text() == FULL
    for name in ("runscript", "startscript", "test", "env/90-environment.sh"):
        assert mode(meta(rootfs, name)) == 0o755, name  # whatever the umask
    for name in ("runscript.help", "labels.json", "Singularity"):
        assert mode(meta(rootfs, name)) == 0o644, name
    assert mode(meta(rootfs, "")) == mode(meta(rootfs, "env")) == 0o755
    assert labels_of(rootfs) == {
        **BUILD_LABELS,
        "Author": "alice", "Version": "1.2",
        "org.label-schema.usage": "/.singularity.d/runscript.help",
        "org.label-schema.usage.apptainer.runscript.help": "/.singularity.d/runscript.help",
        "org.label-schema.usage.singularity.deffile.bootstrap": "docker",
        "org.label-schema.usage.singularity.deffile.from": "alpine:3.20",
    }


def test_labels_json_is_tab_indented_and_sorted_as_apptainer_writes_it(rootfs: Path) -> None:
    write(rootfs, "Bootstrap: scratch\n%labels\n  b 2\n  a 1\n", build_labels={})
    assert meta(rootfs, "labels.json").read_text() == (
        '{\n\t"a": "1",\n\t"b": "2",\n\t"org.label-schema.usage.singularity.deffile.bootstrap": "scratch"\n}')


def test_inspect_reads_back_what_was_written(rootfs: Path) -> None:
    write(rootfs, FULL)
    shown = read_tree(str(rootfs))
    assert shown["labels"]["Author"] == "alice"
    assert shown["deffile"] == FULL
    assert shown["runscript"].startswith("#!/bin/sh\n")
    assert shown["helpfile"].strip() == "Say hello."
    assert "export GREETING=hello" in shown["environment"]["/.singularity.d/env/90-environment.sh"]


@pytest.mark.parametrize(("body", "args", "expected"), [
    ("echo hi\n", "", "#!/bin/sh\n\necho hi\n\n"),
    ("#!/bin/bash\necho hi\n", "", "#!/bin/bash\n\necho hi\n\n"),
    ("  #!/usr/bin/env python3  \nprint(1)\n", "", "#!/usr/bin/env python3\n\nprint(1)\n\n"),
    ("\n\n#!/bin/bash\necho hi\n", "", "#!/bin/bash\n\necho hi\n\n"),  # blank lines before the #! line
    ("#!/bin/bash", "", "#!/bin/bash\n\n\n"),
    ("echo hi\n", "-e", "#!/bin/sh -e\n\necho hi\n\n"),
    ("#!/bin/bash\necho hi\n", "-x # trace it", "#!/bin/bash -x\n\necho hi\n\n"),
    ("echo hi\n", "# only a comment", "#!/bin/sh\n\necho hi\n\n"),
])
def test_shebang_script(body: str, args: str, expected: str) -> None:
    assert shebang_script(body, args) == expected


def test_section_args_go_on_the_shebang_line(rootfs: Path) -> None:
    write(rootfs, "Bootstrap: scratch\n%runscript -e\necho hi\n%test -x\n#!/bin/bash\ntrue\n")
    assert meta(rootfs, "runscript").read_text() == "#!/bin/sh -e\n\necho hi\n\n"
    assert meta(rootfs, "test").read_text() == "#!/bin/bash -x\n\ntrue\n\n"


def test_absent_sections_keep_the_base_images_files(rootfs: Path) -> None:
    meta(rootfs, "env").mkdir(parents=True)
    meta(rootfs, "runscript").write_text("#!/bin/sh\nbase runscript\n")
    meta(rootfs, "test").write_text("base test\n")
    meta(rootfs, "env/90-environment.sh").write_text("base env\n")
    write(rootfs, "Bootstrap: scratch\n%post\n  true\n")
    assert meta(rootfs, "runscript").read_text() == "#!/bin/sh\nbase runscript\n"
    assert meta(rootfs, "test").read_text() == "base test\n"
    assert meta(rootfs, "env/90-environment.sh").read_text() == "base env\n"
    assert not meta(rootfs, "startscript").exists()
    assert not meta(rootfs, "runscript.help").exists()
    assert "org.label-schema.usage" not in labels_of(rootfs)


def test_a_new_runscript_replaces_the_base_images(rootfs: Path) -> None:
    meta(rootfs, "").mkdir()
    meta(rootfs, "runscript").write_text("old\n")
    os.chmod(meta(rootfs, "runscript"), 0o600)
    write(rootfs, "Bootstrap: scratch\n%runscript\nnew\n")
    assert meta(rootfs, "runscript").read_text() == "#!/bin/sh\n\nnew\n\n"
    assert mode(meta(rootfs, "runscript")) == 0o755


def test_environment_is_appended_to_the_base_images_script(rootfs: Path) -> None:
    meta(rootfs, "env").mkdir(parents=True)
    meta(rootfs, "env/90-environment.sh").write_text("#!/bin/sh\nexport A=1\n")
    write(rootfs, "Bootstrap: scratch\n%environment\nexport B=2\n")
    assert meta(rootfs, "env/90-environment.sh").read_text() == "#!/bin/sh\nexport A=1\n\nexport B=2\n\n"


def test_labels_merge_in_apptainers_order(rootfs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    meta(rootfs, "").mkdir()
    meta(rootfs, "labels.json").write_text(json.dumps({"base": "1", "shared": "from base", "post": "base"}))
    (rootfs / ".build.labels").write_text("post from-post\n# a comment\n\nwith.spaces a b  c \nempty\n")
    text = "Bootstrap: scratch\n%labels\n  shared mine\n  fresh new\n  org.label-schema.build-arch mine\n"
    write(rootfs, text)
    assert labels_of(rootfs) == {
        **BUILD_LABELS,  # the build's own labels override the base image's and %post's
        "base": "1", "shared": "from base", "post": "from-post", "with.spaces": "a b  c", "empty": "",
        "fresh": "new", "org.label-schema.usage.singularity.deffile.bootstrap": "scratch",
    }
    assert not (rootfs / ".build.labels").exists()
    err = capsys.readouterr().err
    assert "WARNING: Label: shared already exists and force option is false, not overwriting" in err
    assert "Label: org.label-schema.build-arch already exists" in err
    assert "fresh" not in err


def test_force_lets_labels_override(rootfs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    meta(rootfs, "").mkdir()
    meta(rootfs, "labels.json").write_text(json.dumps({"shared": "from base"}))
    write(rootfs, "Bootstrap: scratch\n%labels\n  shared mine\n", force=True)
    assert labels_of(rootfs)["shared"] == "mine"
    assert "WARNING" not in capsys.readouterr().err


@pytest.mark.parametrize("content", ["{not json", '["a list"]', "{" * 100000])
def test_a_broken_labels_json_is_reported_and_replaced(rootfs: Path, content: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    meta(rootfs, "").mkdir()
    meta(rootfs, "labels.json").write_text(content)
    write(rootfs, "Bootstrap: scratch\n%labels\n  a 1\n", build_labels={})
    assert labels_of(rootfs) == {"a": "1", "org.label-schema.usage.singularity.deffile.bootstrap": "scratch"}
    assert "WARNING:" in capsys.readouterr().err


def test_non_string_labels_of_the_base_image(rootfs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    meta(rootfs, "").mkdir()
    meta(rootfs, "labels.json").write_text('{"n": 3, "b": true, "nested": {"x": 1}}')
    write(rootfs, "Bootstrap: scratch\n", build_labels={})
    found = labels_of(rootfs)
    assert (found["n"], found["b"]) == ("3", "true")
    assert "nested" not in found
    assert "label 'nested' is not a string" in capsys.readouterr().err


def test_an_existing_definition_goes_to_bootstrap_history(rootfs: Path) -> None:
    meta(rootfs, "").mkdir()
    meta(rootfs, "Singularity").write_text("first\n")
    write(rootfs, "Bootstrap: scratch\n# second\n")
    write(rootfs, "Bootstrap: scratch\n# third\n")
    history = meta(rootfs, "bootstrap_history")
    assert sorted(os.listdir(history)) == ["Apptainer0", "Apptainer1"]
    assert (history / "Apptainer0").read_text() == "first\n"
    assert (history / "Apptainer1").read_text() == "Bootstrap: scratch\n# second\n"
    assert meta(rootfs, "Singularity").read_text() == "Bootstrap: scratch\n# third\n"


def test_bootstrap_history_is_made_0755_with_its_parents(rootfs: Path, strict_umask: None) -> None:
    os.symlink("/meta/data", rootfs / ".singularity.d")  # made where the link leads, inside
    (rootfs / "meta").mkdir()
    write(rootfs, "Bootstrap: scratch\n")
    write(rootfs, "Bootstrap: scratch\n# again\n")
    assert mode(rootfs / "meta" / "data") == mode(rootfs / "meta" / "data" / "bootstrap_history") == 0o755
    assert (rootfs / "meta" / "data" / "bootstrap_history" / "Apptainer0").read_text() == "Bootstrap: scratch\n"


def test_bootstrap_history_takes_the_next_free_name(rootfs: Path) -> None:
    meta(rootfs, "bootstrap_history").mkdir(parents=True)
    (meta(rootfs, "bootstrap_history") / "Apptainer1").write_text("kept\n")
    meta(rootfs, "Singularity").write_text("older\n")
    write(rootfs, "Bootstrap: scratch\n")
    assert (meta(rootfs, "bootstrap_history") / "Apptainer1").read_text() == "kept\n"
    assert (meta(rootfs, "bootstrap_history") / "Apptainer2").read_text() == "older\n"


def test_an_existing_help_is_kept_unless_forced(rootfs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    meta(rootfs, "").mkdir()
    meta(rootfs, "runscript.help").write_text("base help\n")
    write(rootfs, "Bootstrap: scratch\n%help\nmine\n")
    assert meta(rootfs, "runscript.help").read_text() == "base help\n"
    assert "Help message already exists and force option is false" in capsys.readouterr().err
    write(rootfs, "Bootstrap: scratch\n%help\nmine\n", force=True)
    assert meta(rootfs, "runscript.help").read_text() == "mine\n\n"


# Hostile base images: links pointing at host paths, which must never be written through or read.

def host_untouched(host: Path) -> None:
    assert sorted(os.listdir(host)) == ["etc"]
    assert sorted(os.listdir(host / "etc")) == ["labels.json", "passwd"]
    assert (host / "etc" / "passwd").read_text() == "host passwd\n"
    assert (host / "etc" / "labels.json").read_text() == '{"host": "label"}'


def test_singularity_d_linked_to_a_host_directory(rootfs: Path, host: Path) -> None:
    os.symlink(host / "etc", rootfs / ".singularity.d")  # absolute: inside, it restarts at the rootfs
    write(rootfs, FULL)
    host_untouched(host)
    inside = rootfs / str(host / "etc").lstrip("/")  # where a process inside finds /.singularity.d
    assert (inside / "runscript").read_text().startswith("#!/bin/sh")
    assert "Author" in json.loads((inside / "labels.json").read_text())
    assert (inside / "env" / "90-environment.sh").exists()
    assert read_tree(str(rootfs))["labels"]["Author"] == "alice"


def test_singularity_d_climbing_out_with_dotdot(rootfs: Path, host: Path) -> None:
    os.symlink("../../../../../../..", rootfs / ".singularity.d")  # `..` stops at the root, inside
    write(rootfs, FULL)
    host_untouched(host)
    assert (rootfs / "runscript").read_text().startswith("#!/bin/sh")
    assert (rootfs / "labels.json").exists()
    assert not (rootfs.parent / "runscript").exists()


def test_metadata_files_linked_to_host_files_are_replaced(rootfs: Path, host: Path) -> None:
    meta(rootfs, "env").mkdir(parents=True)
    for name in ("runscript", "startscript", "test", "runscript.help", "Singularity",
                 "env/90-environment.sh"):
        os.symlink(host / "etc" / "passwd", meta(rootfs, name))
    os.symlink(host / "etc" / "labels.json", meta(rootfs, "labels.json"))
    os.symlink(host / "etc" / "passwd", rootfs / ".build.labels")
    write(rootfs, FULL)
    host_untouched(host)
    for name in ("runscript", "startscript", "test", "runscript.help", "labels.json", "env/90-environment.sh"):
        assert not meta(rootfs, name).is_symlink(), name
    assert "host" not in labels_of(rootfs)  # the link led to nothing inside: no labels from the host
    assert meta(rootfs, "env/90-environment.sh").read_text().startswith("#!/bin/sh\n\n")
    assert meta(rootfs, "Singularity").read_text() == FULL
    # The old definition (a link) went to the history as it was: moved, never read nor followed.
    assert os.readlink(meta(rootfs, "bootstrap_history/Apptainer0")) == str(host / "etc" / "passwd")


def test_links_to_files_inside_the_image_are_replaced_not_written_through(rootfs: Path) -> None:
    (rootfs / "etc").mkdir()
    (rootfs / "etc" / "passwd").write_text("image passwd\n")
    meta(rootfs, "").mkdir()
    os.symlink("/etc/passwd", meta(rootfs, "runscript"))
    write(rootfs, "Bootstrap: scratch\n%runscript\nnew\n")
    assert (rootfs / "etc" / "passwd").read_text() == "image passwd\n"
    assert meta(rootfs, "runscript").read_text() == "#!/bin/sh\n\nnew\n\n"


def test_an_env_script_linked_inside_the_image_is_appended_to_as_a_copy(rootfs: Path) -> None:
    (rootfs / "etc").mkdir()
    (rootfs / "etc" / "profile").write_text("export P=1\n")
    meta(rootfs, "env").mkdir(parents=True)
    os.symlink("/etc/profile", meta(rootfs, "env/90-environment.sh"))
    write(rootfs, "Bootstrap: scratch\n%environment\nexport Q=2\n")
    assert meta(rootfs, "env/90-environment.sh").read_text() == "export P=1\n\nexport Q=2\n\n"
    assert (rootfs / "etc" / "profile").read_text() == "export P=1\n"


def test_a_fifo_for_labels_never_blocks(rootfs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    meta(rootfs, "").mkdir()
    os.mkfifo(meta(rootfs, "labels.json"))
    write(rootfs, "Bootstrap: scratch\n%labels\n a 1\n", build_labels={})
    assert labels_of(rootfs)["a"] == "1"
    assert "labels are left out" in capsys.readouterr().err


def test_a_directory_in_the_way_is_an_image_error(rootfs: Path) -> None:
    meta(rootfs, "runscript").mkdir(parents=True)
    with pytest.raises(ImageError, match=r"can't write /\.singularity\.d/runscript in the image: it is a directory"):
        write(rootfs, "Bootstrap: scratch\n%runscript\nnew\n")


def test_singularity_d_as_a_file_is_an_image_error(rootfs: Path) -> None:
    (rootfs / ".singularity.d").write_text("not a directory")
    with pytest.raises(ImageError, match=r"can't write /\.singularity\.d/labels\.json in the image"):
        write(rootfs, "Bootstrap: scratch\n")
