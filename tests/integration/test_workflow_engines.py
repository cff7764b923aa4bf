"""The real clients of apptainer/singularity drive singpy: cwltool, Snakemake and spython (issue 25).

Each client runs as root and as the unprivileged test user, finds singpy under the names `singularity` and
`apptainer` first on PATH (tests.support.clients), reads its `--version`, pulls its image from the suite's
plain-HTTP registry (APPTAINER_NOHTTPS, since a client passes no `--no-https`) and runs it with the flags it
chooses itself (cwltool: `run --contain --ipc --cleanenv --no-eval --userns --home ... --mount ... --net
--network none`; Snakemake: `exec --home`; spython: `pull --name`, `exec`, `run`, `inspect -e -d ... --json`,
`instance start/list --json/stop`). Nextflow needs Java, which the suite does not install: its commands are run
as it writes them (`pull --name NAME.img.pulling.TIME URL` of a SIF on a web server, then `env - PATH=...
apptainer exec --no-home --pid -B WORKDIR ...`). What is checked is what a user of the client sees: the
outputs of the tool or rule, made by a command only the image has, and what the client's API returns.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support.clients import VENV_BIN, client_env, own_dir, run_client
from tests.support.leftovers import wait_until_gone
from tests.support.oci import busybox_image, directory, file
from tests.support.registry import RegistryServer

TOOL_PATH = "PATH=/opt/tool/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LABEL = ("org.example.engines", "singpy workflow engines")


class Images:
    """The module's two images in the registry: `tool` has a command no host has (`only-in-image`, on the
    image's PATH), `entry` an ENTRYPOINT with a default CMD."""

    def __init__(self, registry: RegistryServer) -> None:
        self.registry = registry
        self.tool = f"{registry.host}/engines/tool:latest"
        self.entry = f"{registry.host}/engines/entry:latest"
        self.missing = f"{registry.host}/engines/never-pushed:latest"


@pytest.fixture(scope="module")
def images(registry_plain: RegistryServer) -> Images:
    tool = busybox_image(extra=[directory("opt/tool/bin"), file("opt/tool/bin/only-in-image",
                                                                "#!/bin/sh\necho \"image tool: $*\"\n", mode=0o755)],
                         env=[TOOL_PATH], labels=dict([LABEL]))
    entry = busybox_image(extra=[file("usr/local/bin/greet", "#!/bin/sh\necho \"greet: $*\"\n", mode=0o755)],
                          entrypoint=["/usr/local/bin/greet"], cmd=["nobody"])
    registry_plain.upload(tool, "engines/tool")
    registry_plain.upload(entry, "engines/entry")
    return Images(registry_plain)


@pytest.fixture
def place(singpy: Singpy, workdir: Path, request: pytest.FixtureRequest) -> Path:
    """A fresh directory of the profile's user for one test (the clients write their files there)."""
    base = own_dir(singpy, workdir / "engines")
    base.chmod(0o755)
    return own_dir(singpy, base / f"{request.node.originalname}-{singpy.profile}-{uuid.uuid4().hex[:6]}")


# --- cwltool --------------------------------------------------------------------------------------------------------

TOOL_CWL = """\
cwlVersion: v1.2
class: CommandLineTool
requirements:
  DockerRequirement:
    dockerPull: {image}
  EnvVarRequirement:
    envDef:
      GREETING: hello from cwl
  InitialWorkDirRequirement:
    listing:
      - $(inputs.data)
      - $(inputs.folder)
inputs:
  data: File
  folder: Directory
baseCommand: [sh, -c]
arguments:
  - valueFrom: >-
      only-in-image "$GREETING" &&
      cat $(inputs.data.basename) &&
      ls $(inputs.folder.basename) &&
      echo "cwd $PWD home $HOME" &&
      echo written > made.txt
stdout: report.txt
outputs:
  report:
    type: stdout
  made:
    type: File
    outputBinding:
      glob: made.txt
"""

ENTRY_CWL = """\
cwlVersion: v1.2
class: CommandLineTool
requirements:
  DockerRequirement:
    dockerPull: {image}
inputs:
  who:
    type: string
    inputBinding: {{position: 1}}
stdout: greeting.txt
outputs:
  greeting: stdout
"""


def cwltool(singpy: Singpy, workdir: Path, place: Path, tool: str,
            job: dict[str, object]) -> tuple[subprocess.CompletedProcess[str], Any]:
    """`cwltool --singularity TOOL JOB` in `place`: (the result, the output object it printed or None)."""
    (place / "tool.cwl").write_text(tool)
    (place / "job.json").write_text(json.dumps(job))
    cache = own_dir(singpy, place / "images")  # CWL_SINGULARITY_CACHE: where cwltool has `pull --name` write
    env = client_env(singpy, workdir, place / "xdg", CWL_SINGULARITY_CACHE=str(cache))
    result = run_client(singpy, [str(VENV_BIN / "cwltool"), "--singularity", "--outdir", str(place / "out"),
                                 "--tmpdir-prefix", f"{place}/tmp-", "--tmp-outdir-prefix", f"{place}/outtmp-",
                                 "tool.cwl", "job.json"], env=env, cwd=place)
    output = json.loads(result.stdout) if result.returncode == 0 else None
    return result, output


def test_cwltool_runs_a_tool_in_the_registry_image(singpy: Singpy, workdir: Path, place: Path,
                                                   images: Images) -> None:
    """dockerPull, a staged file and directory, an environment variable, stdout and a file in the output dir."""
    (place / "data.txt").write_text("the file's content\n")
    folder = own_dir(singpy, place / "folder")
    for name in ("one", "two"):
        (folder / name).write_text(name)
    result, output = cwltool(singpy, workdir, place, TOOL_CWL.format(image=images.tool),
                             {"data": {"class": "File", "path": "data.txt"},
                              "folder": {"class": "Directory", "path": "folder"}})
    assert result.returncode == 0, result.stderr
    report = Path(output["report"]["path"]).read_text().splitlines()
    assert report[:4] == ["image tool: hello from cwl", "the file's content", "one", "two"], result.stderr
    cwd, home = report[4].split()[1::2]
    assert cwd == home and cwd.startswith("/") and cwd != "/"  # cwltool's random output dir, also the home
    assert Path(output["made"]["path"]).read_text() == "written\n"
    assert list((place / "images").iterdir())  # the pulled SIF, where cwltool looks for it next time


def test_cwltool_runs_an_images_entrypoint_with_its_arguments_unevaluated(singpy: Singpy, workdir: Path,
                                                                          place: Path, images: Images) -> None:
    """cwltool runs `singularity run --no-eval IMAGE ARGS`: the ENTRYPOINT gets the argument as written."""
    words = "the 'quoted' world $HOME"
    result, output = cwltool(singpy, workdir, place, ENTRY_CWL.format(image=images.entry), {"who": words})
    assert result.returncode == 0, result.stderr
    assert Path(output["greeting"]["path"]).read_text() == f"greet: {words}\n"


def test_cwltool_shows_why_an_image_cannot_be_pulled(singpy: Singpy, workdir: Path, place: Path,
                                                     images: Images) -> None:
    result, output = cwltool(singpy, workdir, place, ENTRY_CWL.format(image=images.missing), {"who": "x"})
    assert result.returncode != 0 and output is None
    fatal = [line for line in result.stderr.splitlines() if "FATAL:" in line]
    assert len(fatal) == 1 and "engines/never-pushed" in fatal[0], result.stderr


# --- Snakemake ------------------------------------------------------------------------------------------------------

SNAKEFILE = """\
shell.executable("sh")  # the image is busybox: no bash, which Snakemake would run the rule with otherwise

rule all:
    input: "result.txt"

rule tool:
    output: "result.txt"
    container: "docker://{image}"
    shell: "only-in-image from snakemake > {{output}} && echo \\"cwd $PWD\\" >> {{output}}"
"""


def test_snakemake_runs_a_rule_in_its_container(singpy: Singpy, workdir: Path, place: Path, images: Images) -> None:
    (place / "Snakefile").write_text(SNAKEFILE.format(image=images.tool))
    result = run_client(singpy, [str(VENV_BIN / "snakemake"), "--cores", "1", "--software-deployment-method",
                                 "apptainer"], env=client_env(singpy, workdir, place / "xdg"), cwd=place)
    assert result.returncode == 0, result.stderr
    assert (place / "result.txt").read_text() == f"image tool: from snakemake\ncwd {place}\n"
    pulled = list((place / ".snakemake" / "singularity").glob("*.simg"))  # `pull --name HASH.simg`: a SIF
    assert len(pulled) == 1 and pulled[0].read_bytes()[:64].find(b"SIF_MAGIC") >= 0


def test_snakemake_shows_why_an_image_cannot_be_pulled(singpy: Singpy, workdir: Path, place: Path,
                                                       images: Images) -> None:
    (place / "Snakefile").write_text(SNAKEFILE.format(image=images.missing))
    result = run_client(singpy, [str(VENV_BIN / "snakemake"), "--cores", "1", "--software-deployment-method",
                                 "apptainer"], env=client_env(singpy, workdir, place / "xdg"), cwd=place)
    assert result.returncode != 0
    assert "Failed to pull singularity image" in result.stderr
    fatal = [line for line in result.stderr.splitlines() if line.startswith("FATAL:")]
    assert len(fatal) == 1 and "engines/never-pushed" in fatal[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not (place / "result.txt").exists()


# --- spython --------------------------------------------------------------------------------------------------------

SPYTHON = """\
import json, os, sys
from spython.main import Client

tool, entry, name, folder = sys.argv[1:]
seen = {"version": Client.version()}
image = Client.pull("docker://" + tool, name="tool.sif", pull_folder=folder)
seen["pulled"] = [image, os.path.isfile(image)]
seen["execute"] = Client.execute(image, ["only-in-image", "a  b"])
seen["failing"] = Client.execute(image, ["sh", "-c", "echo to stderr >&2; exit 3"], return_result=True)
seen["execute_docker"] = Client.execute("docker://" + tool, ["only-in-image", "direct"])
seen["run"] = Client.run("docker://" + entry, ["from spython"], return_result=True)
seen["inspect"] = Client.inspect(image, quiet=True)
instance = Client.instance(image, name=name)
try:
    listed = Client.instances(quiet=True)
    seen["listed"] = [[str(each), each.name, each.pid] for each in listed]
    seen["instance"] = [instance.name, instance.pid]
    with open(f"/proc/{instance.pid}/cmdline", "rb") as handle:
        seen["holder"] = " ".join(handle.read().decode(errors="replace").split(chr(0))[:-1])
    seen["in_instance"] = Client.execute(instance, ["only-in-image", "inside"])
finally:
    seen["stopped"] = instance.stop()
seen["after"] = [each.name for each in Client.instances(quiet=True) or []]
print(json.dumps(seen))
"""


def test_spython_pulls_runs_inspects_and_manages_instances(singpy: Singpy, workdir: Path, place: Path,
                                                           images: Images) -> None:
    from singpy import APPTAINER_VERSION

    (place / "client.py").write_text(SPYTHON)
    name = f"engines-{os.getpid()}-{uuid.uuid4().hex[:6]}"  # unique: ~/.singpy/instances is shared
    logs = Path(singpy.home, ".singpy", "instances", "logs", os.uname().nodename, singpy.user)
    try:
        result = run_client(singpy, [str(VENV_BIN / "python"), "client.py", images.tool, images.entry, name,
                                     str(place)], env=client_env(singpy, workdir, place / "xdg"), cwd=place)
    finally:
        singpy.run("instance", "stop", "--force", name)  # only if the client failed to: its errors don't count
        for suffix in (".out", ".err"):
            (logs / f"{name}{suffix}").unlink(missing_ok=True)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.splitlines()[-1])
    assert seen["version"] == f"apptainer version {APPTAINER_VERSION}"
    assert seen["pulled"] == [str(place / "tool.sif"), True]
    assert seen["execute"] == "image tool: a  b\n"
    assert seen["failing"] == {"message": "to stderr\n", "return_code": 3}
    assert seen["execute_docker"] == "image tool: direct\n"
    # spython gives [stdout, stderr] when both have something: the INFO lines of a first pull of `entry` by this
    # user (whether this test pulls it first depends on which tests ran before), as with Apptainer
    message = seen["run"]["message"]
    output, notes = (message, "") if isinstance(message, str) else (message[0], "".join(message[1:]))
    assert seen["run"]["return_code"] == 0 and output == "greet: from spython\n"
    assert all(line.startswith("INFO:") for line in notes.splitlines())
    attributes = seen["inspect"]["attributes"]
    assert attributes["labels"][LABEL[0]] == LABEL[1]
    assert "org.label-schema.usage.singpy.version" in attributes["labels"]  # singpy made it, not an Apptainer
    assert "only-in-image" not in attributes["runscript"] and attributes["runscript"].startswith("#!/bin/sh")
    path = TOOL_PATH.split("=", 1)[1]  # the image's ENV, converted into a file of the image's environment
    assert f'export PATH="{path}"' in attributes["environment"]["/.singularity.d/env/10-docker2singularity.sh"]
    instance_name, pid = seen["instance"]
    assert instance_name == name and isinstance(pid, int) and pid > 0
    assert [f"instance://{name}", name, pid] in seen["listed"]
    assert seen["in_instance"] == "image tool: inside\n"
    assert seen["stopped"] == 0
    assert name not in seen["after"]
    assert wait_until_gone([pid], seen["holder"]) == []


# --- what the clients pass through the environment ------------------------------------------------------------------


@pytest.mark.parametrize(("variable", "flag"), [("APPTAINER_NOHTTPS", ""), ("SINGULARITY_NO_HTTPS", ""),
                                                ("APPTAINER_NO_HTTPS", ""), ("", "--nohttps")])
def test_every_spelling_of_no_https_reaches_a_plain_http_registry(singpy: Singpy, workdir: Path, place: Path,
                                                                  images: Images, variable: str, flag: str) -> None:
    """Apptainer's --no-https is also NOHTTPS and NO_HTTPS under each prefix, and --nohttps (deprecated)."""
    env = singpy.env(**({variable: "1"} if variable else {}))
    flags = [flag] if flag else []
    target = place / "pulled.sif"
    pulled = singpy.run("pull", *flags, "--name", str(target), f"docker://{images.entry}", env=env, cwd=place)
    assert pulled.returncode == 0 and target.is_file(), pulled.stderr
    ran = singpy.run("exec", *flags, f"docker://{images.tool}", "only-in-image", "over http", env=env, cwd=place)
    assert (ran.returncode, ran.stdout) == (0, "image tool: over http\n"), ran.stderr


def test_without_no_https_a_plain_http_registry_is_refused(singpy: Singpy, place: Path, images: Images) -> None:
    assert_one_fatal(singpy.run("exec", f"docker://{images.tool}", "true", cwd=place), "TLS")


# --- Nextflow's commands -------------------------------------------------------------------------------------------


class _Files(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # the test's output is the client's, not the server's
        pass


@pytest.fixture
def web_server(place: Path) -> Iterator[str]:
    """An HTTP server of `place`'s files (as depot.galaxyproject.org serves SIF files): its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Files, directory=str(place)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_nextflow_pulls_an_image_file_by_url_and_runs_a_task_with_only_path(
        singpy: Singpy, workdir: Path, place: Path, images: Images, web_server: str) -> None:
    """`apptainer pull --name NAME.img.pulling.TIME URL` in its cache directory, then
    `env - PATH=... apptainer exec --no-home --pid -B WORKDIR IMAGE sh -c "cd WORKDIR; ..."`."""
    served = place / "served.sif"
    singpy.ok("pull", "--no-https", "--name", str(served), f"docker://{images.tool}", cwd=place)
    cache = own_dir(singpy, place / "nxf-cache")
    env = client_env(singpy, workdir, place / "xdg")
    pulling = "tool.img.pulling.1764250000000"
    pulled = run_client(singpy, ["apptainer", "pull", "--name", pulling, f"{web_server}/served.sif"], env=env,
                        cwd=cache)
    assert pulled.returncode == 0, pulled.stderr
    assert (cache / pulling).read_bytes() == served.read_bytes()
    assert sorted(path.name for path in cache.iterdir()) == [pulling]
    # What Nextflow runs: an environment of PATH alone (the cache directory kept here: not the user's ~/.cache)
    task = ["env", "-", f"PATH={env['PATH']}", f"SINGPY_CACHEDIR={singpy.cachedir}", "APPTAINERENV_TASK=t1",
            "apptainer", "exec", "--no-home", "--pid", "-B", str(place), str(cache / pulling),
            "sh", "-c", f"cd {place} && only-in-image $TASK > task.out && echo $$ >> task.out"]
    ran = run_client(singpy, task, env=env, cwd=place)
    assert ran.returncode == 0, ran.stderr
    # --pid: a PID namespace whose PID 1 is the init process (as Apptainer's shim), the task's shell PID 2
    assert (place / "task.out").read_text() == "image tool: t1\n2\n"


@pytest.mark.parametrize(("path", "message"), [
    ("missing.sif", "the server answered 404"),
    ("not-an-image.sif", "is not a container image"),
])
def test_a_url_that_gives_no_image_is_one_error_and_leaves_nothing(singpy: Singpy, place: Path, web_server: str,
                                                                    path: str, message: str) -> None:
    (place / "not-an-image.sif").write_text("<html>a login page</html>\n")
    out = own_dir(singpy, place / "out")
    result = singpy.run("pull", "--name", "image.sif", f"{web_server}/{path}", cwd=out)
    assert_one_fatal(result, message)
    assert list(out.iterdir()) == []
