"""Definition files parsed as Apptainer parses them, errors with file:line (singpy.recipe.deffile)."""

from __future__ import annotations

import pytest

from singpy.recipe.deffile import DefinitionError, files_entries, labels, parse

RECIPE = """\
# A CUDA application image
Bootstrap: docker
From: nvcr.io/nvidia/cuda:{{ CUDA }}-devel-ubuntu22.04   # the base
Stage: build

%arguments
    CUDA=12.4.1
    APP=solver

%files
    src/main.c /opt/src/main.c
    "my file.txt"
    build.sh /opt/{{ APP }}.sh

%post -c /bin/bash
    # comments stay in scripts: {{ APP }} not replaced here
    apt-get install -y gcc
    gcc -o /opt/{{ APP }} /opt/src/main.c

%labels
    Author someone@example.org
    Version\t2.0

Bootstrap: localimage
From: base.sif

%files from build
    /opt/solver /usr/local/bin/solver

%environment
    export OMP_NUM_THREADS=4

%runscript
    exec /usr/local/bin/solver "$@"

%apprun tool
    echo tool
"""


def test_stages_headers_and_sections() -> None:
    definition = parse(RECIPE, "app.def")
    build, final = definition.stages
    assert build.get("bootstrap") == "docker"
    assert build.get("from") == "nvcr.io/nvidia/cuda:12.4.1-devel-ubuntu22.04"
    assert build.get("stage") == "build"
    assert [section.name for section in build.sections] == ["arguments", "files", "post", "labels"]
    post = build.sections[2]
    assert post.args == "-c /bin/bash" and post.line == 15
    assert "# comments stay in scripts: {{ APP }} not replaced here\n" in post.body
    assert "gcc -o /opt/solver /opt/src/main.c\n" in post.body
    assert files_entries(build.sections[1]) == [("src/main.c", "/opt/src/main.c"), ("my file.txt", ""),
                                                ("build.sh", "/opt/solver.sh")]
    assert labels(build.sections[3]) == [("Author", "someone@example.org"), ("Version", "2.0")]
    assert final.get("bootstrap") == "localimage" and final.line == 24
    assert [(section.name, section.args) for section in final.sections] == [
        ("files", "from build"), ("environment", ""), ("runscript", ""), ("apprun", "tool")]
    assert final.script("runscript") == '    exec /usr/local/bin/solver "$@"\n\n'
    assert definition.consumed == ("APP", "CUDA")


def test_build_arguments_beat_defaults_and_defaults_may_refer_to_them() -> None:
    text = "Bootstrap: docker\nFrom: debian:{{ TAG }}\n%arguments\n TAG={{ SUITE }}-slim\n SUITE=bookworm\n"
    assert parse(text, "x.def").stages[0].get("from") == "debian:bookworm-slim"
    assert parse(text, "x.def", {"SUITE": "trixie"}).stages[0].get("from") == "debian:trixie-slim"
    assert parse(text, "x.def", {"TAG": "12"}).stages[0].get("from") == "debian:12"


def test_repeated_sections_add_up_and_header_continues() -> None:
    text = "Bootstrap: docker\nFrom: alpine:\\\n  3.20\n%post\necho one\n%post\necho two\n"
    stage = parse(text, "x.def").stages[0]
    assert stage.get("from") == "alpine:3.20"
    assert stage.script("post") == "echo one\necho two\n"


def test_repeated_sections_take_the_args_of_the_last_line_that_has_some() -> None:
    text = ("Bootstrap: docker\nFrom: alpine\n%post -c /bin/ash\necho one\n%post -c /bin/bash\necho two\n"
            "%post\necho three\n%setup\ntrue\n")
    stage = parse(text, "x.def").stages[0]
    assert stage.args("post") == "-c /bin/bash"
    assert stage.args("setup") == "" and stage.args("test") == ""


@pytest.mark.parametrize(("text", "message"), [
    ("", "x.def: empty definition file"),
    ("# only a comment\n\n", "x.def: empty definition file"),
    ("Bootstrap: docker\nFromm: alpine\n", "x.def:2: invalid header keyword 'fromm'"),
    ("Bootstrap: docker\nFrom alpine\n", "x.def:2: header line 'From alpine' has no value"),
    ("Bootstrap: docker\nFrom: alpine\n\n%postt\necho\n", "x.def:4: invalid section %postt"),
    ("Bootstrap: docker\nFrom: alpine\n%apprun\necho\n", "x.def:3: %apprun needs the name of an app"),
    ("Bootstrap: docker\nFrom: alpine:{{ TAG }}\n", "x.def:2: build argument TAG is not defined"),
    ("Bootstrap: docker\nFrom: a\n%arguments\n  not an assignment\n", "x.def:4: %arguments line 'not an assignment'"),
], ids=["empty", "comments-only", "bad-header", "no-colon", "bad-section", "app-without-name", "undefined-arg",
        "bad-argument"])
def test_errors_name_file_and_line(text: str, message: str) -> None:
    with pytest.raises(DefinitionError) as caught:
        parse(text, "x.def")
    assert caught.value.message.startswith(message), caught.value.message


def test_a_commented_build_argument_is_not_needed() -> None:
    text = ("Bootstrap: docker\n# From: {{ OLD }}\nFrom: alpine\n%arguments\n V=1\n%post\n    # echo {{ UNSET }}\n"
            "    echo {{ V }} #note {{ UNSET }}\n    #!/bin/{{ V }}\n")
    stage = parse(text, "x.def").stages[0]
    assert stage.get("from") == "alpine"
    assert stage.script("post") == "    # echo {{ UNSET }}\n    echo 1 #note {{ UNSET }}\n    #!/bin/1\n"


def test_numbered_otherurl_headers_are_accepted() -> None:
    stage = parse("Bootstrap: yum\nOtherURL0: http://a\notherurl12: http://b\n", "x.def").stages[0]
    assert stage.header == (("bootstrap", "yum"), ("otherurl0", "http://a"), ("otherurl12", "http://b"))
