"""An OCI config made Apptainer's /.singularity.d: the files' text, what real shells make of it, and the
writing into an untrusted tree.

The expectations are Apptainer's ([A] = github.com/apptainer/apptainer):
internal/pkg/build/sources/conveyorPacker_oci.go (`insertEnv`, `insertRunScript`,
`ociRunscript`), internal/pkg/util/shell/escape.go, base_environment.go,
internal/pkg/build/metadata.go; e2e/docker/docker.go (the outputs of `run` for
ENTRYPOINT/CMD images); and a real image Singularity 3.8.1 built from
docker://busybox:1.33.1 (tests/data/sif-golden/real/busybox_arm64.sif).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from singpy.errors import ImageError
from singpy.image import sif
from singpy.oci import convert, gotemplate, singularityd

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "sif-golden" / "real" / "busybox_arm64.sif"
SHELLS = [shell for shell in (["dash"], ["busybox", "sh"], ["bash", "--posix"]) if shutil.which(shell[0])]
TRICKY = ["a b", 'double "quotes"', "single 'quotes'", "$HOME and ${HOME}", "`id -u` and $(id -u)", "back\\slash",
          "trailing backslash \\", "brace } and {", "new\nline", "tab\there", "*glob?[x]", "", "-n", "==x", "ünïcødé"]


def config(**settings: Any) -> dict[str, Any]:
    return {"architecture": "amd64", "os": "linux", "config": settings}


def sh(shell: list[str], script: str, *args: str, env: dict[str, str] | None = None) -> str:
    result = subprocess.run([*shell, "-c", script, "sh", *args], capture_output=True, text=True, timeout=30,
                            env={"PATH": "/usr/bin:/bin", **(env or {})})
    assert result.returncode == 0, result.stderr
    return result.stdout


# --- 10-docker2singularity.sh --------------------------------------------------------------------------------------


def test_env_script_text_is_apptainers() -> None:
    script = singularityd.environment_script(["PATH=/opt/bin:/usr/bin", "A=1", 'B=say "hi" $X `y` \\z', "ONLY_NAME",
                                         "EMPTY=", "1BAD=x", "BAD-NAME=x", "C=d=e"])
    assert script == ('#!/bin/sh\n'
                      'export PATH="/opt/bin:/usr/bin"\n'
                      'export A="${A:-"1"}"\n'
                      'export B="${B:-"say \\"hi\\" \\$X \\`y\\` \\\\z"}"\n'
                      'export ONLY_NAME="${ONLY_NAME:-}"\n'
                      'export EMPTY="${EMPTY:-""}"\n'
                      'export C="${C:-"d=e"}"\n')
    assert singularityd.environment_script(None) == "#!/bin/sh\n"


@pytest.mark.parametrize("shell", SHELLS, ids=[shell[0] for shell in SHELLS])
def test_env_values_survive_every_shell(shell: list[str], tmp_path: Path) -> None:
    """Sourced with nothing set, each variable is exactly the image's value, whatever characters it holds."""
    env = [f"V{position}={value}" for position, value in enumerate(TRICKY)]
    script = tmp_path / "10-docker2singularity.sh"
    script.write_text(singularityd.environment_script(["PATH=/usr/bin:/bin", *env]))
    names = " ".join(f"V{position}" for position in range(len(TRICKY)))
    out = sh(shell, f'. {script}; for n in {names}; do eval "v=\\"\\${{$n}}\\""; printf "%s<END>" "$v"; done')
    assert out.split("<END>")[:-1] == TRICKY


@pytest.mark.parametrize("shell", SHELLS, ids=[shell[0] for shell in SHELLS])
def test_env_values_are_defaults_and_path_is_set(shell: list[str], tmp_path: Path) -> None:
    """`${NAME:-value}`: a value already set stays (an empty one does not), PATH is the image's."""
    script = tmp_path / "env.sh"
    script.write_text(singularityd.environment_script(["PATH=/image/bin", "KEPT=image", "EMPTIED=image", "NEW=image"]))
    out = sh(shell, f'. {script}; printf "%s|%s|%s|%s" "$PATH" "$KEPT" "$EMPTIED" "$NEW"',
             env={"KEPT": "before", "EMPTIED": ""})
    assert out == "/image/bin|before|image|image"


def _golden_tree(tmp_path: Path) -> Path:
    """/.singularity.d of the real Singularity 3.8.1 image, unpacked (unsquashfs reads it at its offset)."""
    if not shutil.which("unsquashfs"):
        pytest.skip("unsquashfs is not installed")
    part = sif.read_sif(str(GOLDEN)).primary_partition()
    target = tmp_path / "golden"
    subprocess.run(["unsquashfs", "-o", str(part.offset), "-d", str(target), "-no-xattrs", "-q", str(GOLDEN),
                    ".singularity.d"], check=True, capture_output=True)
    return target / ".singularity.d"


def _golden_config() -> dict[str, Any]:
    image = sif.read_sif(str(GOLDEN))
    (found,) = image.find(sif.DATA_GENERIC_JSON, "oci-config.json")
    return {"config": json.loads(image.read_object(found))}


def test_same_files_as_a_real_singularity_build(tmp_path: Path) -> None:
    golden = _golden_tree(tmp_path)
    files = singularityd.singularity_files(_golden_config(), labels={})
    # The env script and runscript head are written by the same code today as in 3.8.1.
    assert files[singularityd.DOCKER_ENV][0] == (golden / "env" / "10-docker2singularity.sh").read_bytes()
    head = b"#!/bin/sh\nOCI_ENTRYPOINT=''\nOCI_CMD='\"sh\"'\n"
    assert files[singularityd.RUNSCRIPT][0].startswith(head) and (golden / "runscript").read_bytes().startswith(head)
    assert files[singularityd.RUNSCRIPT][0].endswith(b'eval "set ${SINGULARITY_OCI_RUN}"\nexec "$@"\n')
    # labels.json: Go's MarshalIndent bytes, reproduced from the same map.
    labels = json.loads((golden / "labels.json").read_bytes())
    assert singularityd.labels_json(labels) == (golden / "labels.json").read_bytes()
    # The scripts Apptainer has not changed since have the same code (Apptainer added license comments).
    for name in ("actions/exec", "actions/start", "env/01-base.sh", "env/90-environment.sh", "env/99-runtimevars.sh",
                 "startscript"):
        ours = files[f"/.singularity.d/{name}"][0].decode()
        assert _code(ours) == _code((golden / name).read_text()), name
    # Every file 3.8.1 wrote is written, with the same mode.
    for path in golden.rglob("*"):
        guest = "/" + str(path.relative_to(golden.parent))
        if path.is_file() and path.name != "Singularity":
            assert guest in files, guest
            assert stat.S_IMODE(path.stat().st_mode) == files[guest][1], guest
    assert (golden / "env" / "94-appsbase.sh").read_bytes() == files["/.singularity.d/env/94-appsbase.sh"][0] == b""


def _code(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


# --- runscript -----------------------------------------------------------------------------------------------------

QUOTED = ["'quotes'", '"quotes"', "$DOLLAR", "s p a c e s"]  # [A] e2e/docker/docker.go's images


def run_script(shell: list[str], tmp_path: Path, entrypoint: list[str] | None, cmd: list[str] | None,
               *args: str, no_eval: bool = False) -> str:
    script = tmp_path / "runscript"
    script.write_text(singularityd.runscript(entrypoint, cmd))
    env = {"HOME": "/home/someone", **({"SINGULARITY_NO_EVAL": "1"} if no_eval else {})}
    return sh(shell, f". {script}", *args, env=env)


@pytest.mark.parametrize("shell", SHELLS, ids=[shell[0] for shell in SHELLS])
def test_runscript_as_apptainers_e2e_tests_expect(shell: list[str], tmp_path: Path) -> None:
    """[A] e2e/docker/docker.go testDockerCMD, testDockerENTRYPOINT, testDockerCMDENTRYPOINT."""
    # The images: CMD ["echo", "CMD", ...]; ENTRYPOINT ["echo", "ENTRYPOINT", ...]; both: CMD ["CMD", ...].
    cmd, entrypoint = ["echo", "CMD", *QUOTED], ["echo", "ENTRYPOINT", *QUOTED]
    shown_cmd, shown_entrypoint = "CMD 'quotes' \"quotes\" $DOLLAR s p a c e s", \
        "ENTRYPOINT 'quotes' \"quotes\" $DOLLAR s p a c e s"
    for no_eval in (False, True):
        assert run_script(shell, tmp_path, None, cmd, no_eval=no_eval) == f"{shown_cmd}\n"
        assert run_script(shell, tmp_path, None, cmd, "echo", "test", no_eval=no_eval) == "test\n"
        assert run_script(shell, tmp_path, entrypoint, None, no_eval=no_eval) == f"{shown_entrypoint}\n"
        assert run_script(shell, tmp_path, entrypoint, None, "echo", "test", no_eval=no_eval) == \
            f"{shown_entrypoint} echo test\n"
        assert run_script(shell, tmp_path, entrypoint, cmd[1:], no_eval=no_eval) == f"{shown_entrypoint} {shown_cmd}\n"
        assert run_script(shell, tmp_path, entrypoint, cmd[1:], "echo", "test", no_eval=no_eval) == \
            f"{shown_entrypoint} echo test\n"
    # Arguments are evaluated by the shell, unless SINGULARITY_NO_EVAL (--no-eval) is set.
    assert run_script(shell, tmp_path, None, cmd, "echo", "$HOME") == "/home/someone\n"
    assert run_script(shell, tmp_path, None, cmd, "echo", "$HOME", no_eval=True) == "$HOME\n"
    assert run_script(shell, tmp_path, entrypoint, cmd[1:], "echo", "$HOME") == \
        f"{shown_entrypoint} echo /home/someone\n"
    # "This looks very wrong, but is historic behavior" ([A] e2e): the quotes of an argument are consumed.
    assert run_script(shell, tmp_path, None, cmd, "sh", "-c", 'echo "hello there"') == "hello\n"
    assert run_script(shell, tmp_path, None, cmd, "sh", "-c", 'echo "hello there"', no_eval=True) == "hello there\n"


@pytest.mark.parametrize("shell", SHELLS, ids=[shell[0] for shell in SHELLS])
def test_runscript_argument_boundaries(shell: list[str], tmp_path: Path) -> None:
    """ENTRYPOINT/CMD items stay single arguments whatever they hold; `run` arguments are evaluated."""
    entrypoint = ["printf", "<%s>"]
    out = run_script(shell, tmp_path, entrypoint, ["a b", "it's", '"q"', "$HOME", "`x`"])
    assert out == "<a b><it's><\"q\"><$HOME><`x`>"
    out = run_script(shell, tmp_path, entrypoint, None, "a b", "it's", "$HOME", 'x"y"z')
    assert out == "<a b><it's></home/someone><xyz>"  # each argument put between double quotes, then evaluated
    out = run_script(shell, tmp_path, entrypoint, None, "a b", "it's", "$HOME", 'x"y"z', no_eval=True)
    assert out == "<a b><it's><$HOME><x\"y\"z>"


@pytest.mark.parametrize("shell", SHELLS, ids=[shell[0] for shell in SHELLS])
def test_runscript_without_entrypoint_or_cmd(shell: list[str], tmp_path: Path) -> None:
    """Apptainer's template then runs the arguments, and with none `eval "set "` lists the shell's variables."""
    assert run_script(shell, tmp_path, None, None, "echo", "hi there") == "hi there\n"
    assert run_script(shell, tmp_path, None, None, "echo", "hi there", no_eval=True) == "hi there\n"
    assert "SINGULARITY_OCI_RUN=" in run_script(shell, tmp_path, None, None)


def test_template_rendering_follows_go() -> None:
    """text/template: `{{-` eats the white space before it; an empty field leaves its line's indentation."""
    script = singularityd.runscript(["/bin/ep"], None)
    assert ("    if [ -z \"$OCI_CMD\" ] && [ -n \"$OCI_ENTRYPOINT\" ]; then\n"
            "        set -- '/bin/ep' \"$@\"\n\n"
            "        exec \"$@\"\n"
            "    fi\n\n"
            "    # CMD only - run CMD or override with args\n"
            "    if [ -n \"$OCI_CMD\" ] && [ -z \"$OCI_ENTRYPOINT\" ]; then\n"
            "        exec \"$@\"\n"
            "    fi\n\n"
            "    # ENTRYPOINT and CMD - run ENTRYPOINT with CMD as default args\n"
            "    # override with user provided args\n"
            "    if [ $# -gt 0 ]; then\n"
            "        set -- '/bin/ep' \"$@\"\n\n"
            "\telse\n"
            "        \n"
            "        set -- '/bin/ep' \"$@\"\n\n"
            "    fi\n"
            "    exec \"$@\"\nfi\n") in script
    assert script.startswith("#!/bin/sh\nOCI_ENTRYPOINT='\"/bin/ep\"'\nOCI_CMD=''\n\n# When SINGULARITY_NO_EVAL")
    neither = singularityd.runscript(None, None)
    assert "    # override with user provided args\n    exec \"$@\"\nfi\n" in neither
    assert gotemplate.render_template("a {{- if .X }} x {{- else if .Y }} y {{- else }} z {{- end }} b",
                                   {"X": "", "Y": "1"}) == "a y b"
    assert gotemplate.render_template("{{ .X -}}   \n c", {"X": "x"}) == "xc"


def test_quoting_helpers_are_apptainers() -> None:
    """[A] internal/pkg/util/shell/escape.go and its escape_test.go cases."""
    assert singularityd.escape('"$`\\') == '\\"\\$\\`\\\\'
    assert singularityd.escape_single_quotes("it's") == "it'\"'\"'s"
    assert singularityd.args_quoted(["a", "b c", 'd"e']) == '"a" "b c" "d\\"e"'
    assert singularityd.args_quoted([]) == ""


# --- labels.json ---------------------------------------------------------------------------------------------------


def test_labels_json_is_gos_marshal_indent() -> None:
    assert singularityd.labels_json({}) == b"{}"
    assert singularityd.labels_json({"b": "1", "a": "<x> & y", "c": "é\u2028\x01\n\t\"\\"}) == (
        b'{\n\t"a": "\\u003cx\\u003e \\u0026 y",\n\t"b": "1",\n'
        b'\t"c": "\xc3\xa9\\u2028\\u0001\\n\\t\\"\\\\"\n}')
    assert singularityd.labels_json({"bad": "\ud800"}) == '{\n\t"bad": "\ufffd"\n}'.encode()


def test_build_labels_win_over_the_images() -> None:
    files = singularityd.singularity_files(config(Labels={"maintainer": "me", "org.label-schema.build-arch": "x"}),
                                      labels={"org.label-schema.build-arch": "amd64"})
    assert json.loads(files[singularityd.LABELS][0]) == {"maintainer": "me", "org.label-schema.build-arch": "amd64"}
    assert files[singularityd.LABELS][1] == 0o644


@pytest.mark.parametrize("settings", [{"Env": "A=1"}, {"Env": [1]}, {"Cmd": "sh"}, {"Entrypoint": [None]},
                                      {"Labels": ["a"]}, {"Labels": {"a": 1}}])
def test_malformed_config_is_one_error(settings: dict[str, Any]) -> None:
    with pytest.raises(ImageError, match="malformed image config"):
        singularityd.singularity_files(config(**settings), labels={})
    with pytest.raises(ImageError, match="malformed image config"):
        singularityd.singularity_files({"config": "x"}, labels={})


def test_config_without_settings() -> None:
    files = singularityd.singularity_files({"architecture": "amd64"}, labels={})
    assert files[singularityd.DOCKER_ENV][0] == b"#!/bin/sh\n"
    assert b"OCI_ENTRYPOINT=''\nOCI_CMD=''\n" in files[singularityd.RUNSCRIPT][0]


def test_deffile_for() -> None:
    assert singularityd.deffile_for("docker://alpine") == b"bootstrap: docker\nfrom: alpine\n\n"
    assert singularityd.deffile_for("oci-archive:/x/y.tar") == b"bootstrap: oci-archive\nfrom: /x/y.tar\n\n"


# --- install -------------------------------------------------------------------------------------------------------

NGC = config(Env=["PATH=/usr/local/cuda/bin:/usr/bin:/bin", "CUDA_VERSION=12.4.1"], Cmd=["bash"],
             Labels={"com.nvidia.cuda.version": "12.4.1"})
BUILD_LABELS = {"org.label-schema.schema-version": "1.0"}


@pytest.fixture(autouse=True)
def _never_hang() -> Iterator[None]:
    """A FIFO opened for writing would block forever: fail the test instead."""
    def stop(number: int, frame: object) -> None:
        raise TimeoutError("install blocked")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def snapshot(root: Path) -> dict[str, tuple[str, int, str]]:
    """path -> (kind, mode, content or link target) of everything below `root`."""
    found: dict[str, tuple[str, int, str]] = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        name = str(path.relative_to(root))
        if stat.S_ISLNK(info.st_mode):
            found[name] = ("link", 0, os.readlink(path))
        elif stat.S_ISDIR(info.st_mode):
            found[name] = ("dir", stat.S_IMODE(info.st_mode), "")
        else:
            found[name] = ("file", stat.S_IMODE(info.st_mode), path.read_bytes().decode(errors="replace"))
    return found


def test_install_into_an_empty_tree(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    convert.install(str(root), NGC, BUILD_LABELS, deffile=b"bootstrap: docker\nfrom: nvcr.io/x\n\n")
    tree = snapshot(root)
    files = singularityd.singularity_files(NGC, labels=BUILD_LABELS, deffile=b"bootstrap: docker\nfrom: nvcr.io/x\n\n")
    for guest, (content, mode) in files.items():
        assert tree[guest.lstrip("/")] == ("file", mode, content.decode()), guest
    for guest, target in singularityd.singularity_links().items():
        assert tree[guest.lstrip("/")] == ("link", 0, target)
        assert (root / guest.lstrip("/")).exists()  # every link leads to a file just written
    for guest in singularityd.skeleton_dirs():
        assert tree[guest.lstrip("/")][0] == "dir"
    assert tree["etc/hosts"] == tree["etc/resolv.conf"] == ("file", 0o644, "")
    assert set(tree) == {*(g.lstrip("/") for g in files), *(g.lstrip("/") for g in singularityd.singularity_links()),
                         *(g.lstrip("/") for g in singularityd.skeleton_dirs()), ".singularity.d", "var"}
    convert.install(str(root), NGC, BUILD_LABELS, deffile=b"bootstrap: docker\nfrom: nvcr.io/x\n\n")
    again = snapshot(root)
    assert again.pop(".singularity.d/bootstrap_history/Apptainer0")[2] == "bootstrap: docker\nfrom: nvcr.io/x\n\n"
    assert again.pop(".singularity.d/bootstrap_history")[0] == "dir"
    assert again == tree


def test_existing_files_are_rewritten_in_place(tmp_path: Path) -> None:
    """As Apptainer's makeFile: an image's /etc/hosts is truncated (same inode, same owner) and made 0644;
    its own labels.json and runscript are replaced; its other files in /.singularity.d stay."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / ".singularity.d" / "env").mkdir(parents=True)
    hosts = root / "etc" / "hosts"
    hosts.write_text("127.0.0.1 image\n")
    hosts.chmod(0o400)
    inode = hosts.stat().st_ino
    (root / ".singularity.d" / "labels.json").write_text('{"old": "x"}')
    (root / ".singularity.d" / "env" / "50-image.sh").write_text("export MINE=1\n")
    (root / ".singularity.d" / "runscript.help").write_text("help\n")
    convert.install(str(root), NGC, BUILD_LABELS)
    assert hosts.read_text() == "" and hosts.stat().st_ino == inode and stat.S_IMODE(hosts.stat().st_mode) == 0o644
    assert json.loads((root / ".singularity.d" / "labels.json").read_text()) == {
        "com.nvidia.cuda.version": "12.4.1", **BUILD_LABELS}
    assert (root / ".singularity.d" / "env" / "50-image.sh").read_text() == "export MINE=1\n"
    assert (root / ".singularity.d" / "runscript.help").read_text() == "help\n"


def test_links_out_of_the_tree_lead_inside_it(tmp_path: Path) -> None:
    """/.singularity.d and /etc linked to host directories (absolute, or climbing with ..): written below the root."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / ".singularity.d").symlink_to(outside)  # absolute: from inside, `outside` below the root
    (root / "etc").symlink_to("../../../../../../../" + str(outside.relative_to("/")) + "/etc")
    convert.install(str(root), NGC, BUILD_LABELS)
    assert list(outside.iterdir()) == []
    inside = root / str(outside.relative_to("/"))
    assert (inside / "runscript").read_bytes() == (
        singularityd.singularity_files(NGC, labels={})[singularityd.RUNSCRIPT][0])
    assert (inside / "etc" / "hosts").read_text() == ""


def test_special_files_where_files_are_written_are_replaced(tmp_path: Path) -> None:
    """A FIFO would block Apptainer's open() forever, a hard link would be written through: new files instead."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "bin").mkdir()
    (root / ".singularity.d").mkdir()
    os.mkfifo(root / "etc" / "hosts")
    os.mkfifo(root / ".singularity.d" / "runscript")
    shell = root / "bin" / "sh"
    shell.write_text("#!/bin/busybox\n")
    os.link(shell, root / "etc" / "resolv.conf")
    convert.install(str(root), NGC, BUILD_LABELS)
    assert (root / "etc" / "hosts").read_text() == "" and (root / "etc" / "hosts").is_file()
    assert (root / ".singularity.d" / "runscript").read_text().startswith("#!/bin/sh\nOCI_ENTRYPOINT=''")
    assert shell.read_text() == "#!/bin/busybox\n" and shell.stat().st_nlink == 1
    assert (root / "etc" / "resolv.conf").read_text() == ""


def test_a_runscript_link_inside_the_image_is_followed(tmp_path: Path) -> None:
    """Apptainer's os.Root follows a link that stays inside: the file it leads to is written."""
    root = tmp_path / "root"
    (root / "usr" / "local" / "bin").mkdir(parents=True)
    (root / ".singularity.d").mkdir()
    (root / ".singularity.d" / "runscript").symlink_to("/usr/local/bin/entry")
    convert.install(str(root), NGC, BUILD_LABELS)
    assert os.readlink(root / ".singularity.d" / "runscript") == "/usr/local/bin/entry"
    assert (root / "usr" / "local" / "bin" / "entry").read_text().startswith("#!/bin/sh\nOCI_ENTRYPOINT")


def test_top_level_links(tmp_path: Path) -> None:
    """[A] makeSymlink: a link leading elsewhere is remade, anything else of that name is left alone."""
    root = tmp_path / "root"
    root.mkdir()
    (root / ".run").symlink_to("/bin/evil")
    (root / ".exec").write_text("mine\n")
    (root / "singularity").symlink_to(".singularity.d/runscript")
    convert.install(str(root), NGC, BUILD_LABELS)
    assert os.readlink(root / ".run") == ".singularity.d/actions/run"
    assert (root / ".exec").read_text() == "mine\n"
    assert os.readlink(root / "singularity") == ".singularity.d/runscript"


@pytest.mark.parametrize("make, message", [
    (lambda root: (root / ".singularity.d" / "runscript").mkdir(parents=True), "/.singularity.d/runscript"),
    (lambda root: (root / ".singularity.d").mkdir() or (root / ".singularity.d" / "env").write_text("x"),
     "/.singularity.d/env"),
    (lambda root: (root / ".singularity.d").write_text("x"), "/.singularity.d"),
    (lambda root: (root / "etc").write_text("x"), "/etc"),
])
def test_what_cannot_be_written_is_one_error(tmp_path: Path, make: Any, message: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    make(root)
    with pytest.raises(ImageError) as caught:
        convert.install(str(root), NGC, BUILD_LABELS)
    assert caught.value.message.startswith("can't write Apptainer's files into the image")
    assert message in caught.value.message


def test_a_read_only_root_is_made_writable(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    root.chmod(0o555)
    convert.install(str(root), NGC, BUILD_LABELS)
    assert stat.S_IMODE(root.stat().st_mode) == 0o755
    assert (root / ".singularity.d" / "runscript").is_file()


def test_mount_points_are_left_as_they_are(tmp_path: Path) -> None:
    """Anything at /proc, /dev, /var/tmp...: left (Apptainer checks with Lstat only); missing ones are made."""
    root = tmp_path / "root"
    (root / "var").mkdir(parents=True)
    (root / "proc").write_text("not a directory\n")
    (root / "var" / "tmp").symlink_to("/tmp")
    (root / "home").symlink_to("/nonexistent/home")  # dangling
    convert.install(str(root), NGC, BUILD_LABELS)
    assert (root / "proc").read_text() == "not a directory\n"
    assert os.readlink(root / "var" / "tmp") == "/tmp"
    assert os.readlink(root / "home") == "/nonexistent/home" and not (root / "nonexistent").exists()
    for name in ("dev", "sys", "root", "tmp"):
        assert (root / name).is_dir() and not (root / name).is_symlink()


def test_install_reports_what_it_wrote_whatever_the_umask(tmp_path: Path) -> None:
    """Paths as seen inside with links resolved -> mode: what an unprivileged pull records as root's."""
    root = tmp_path / "root"
    (root / "usr" / "meta").mkdir(parents=True)
    (root / ".singularity.d").symlink_to("/usr/meta")
    (root / "etc").mkdir()
    (root / "etc" / "hosts").write_text("x")
    previous = os.umask(0o077)
    try:
        written = convert.install(str(root), NGC, BUILD_LABELS)
    finally:
        os.umask(previous)
    assert written["/usr/meta/env/10-docker2singularity.sh"] == written["/usr/meta/runscript"] == 0o755
    assert written["/usr/meta/labels.json"] == written["/etc/hosts"] == written["/etc/resolv.conf"] == 0o644
    created = {"/usr/meta/env", "/usr/meta/libs", "/usr/meta/actions", "/dev", "/proc", "/root", "/var",
               "/var/tmp", "/tmp", "/sys", "/home"}
    assert {path for path, mode in written.items() if mode == 0o755 and (root / path[1:]).is_dir()} == created
    assert "/.singularity.d/runscript" not in written and "/etc" not in written and "/usr/meta" not in written
    for path, mode in written.items():
        assert stat.S_IMODE((root / path[1:]).lstat().st_mode) == mode, path
