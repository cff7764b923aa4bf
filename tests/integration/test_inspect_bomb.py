"""`inspect`, `run-help` and `inspect --list-apps` of a squashfs bomb unpack only what they read.

squashfs stores identical files once: a ~1 MB image holds a 300 MB
/.singularity.d/junk, a `test -> /usr` whose /usr holds another big file,
a `startscript -> /big.bin` over the 16 MiB a metadata file may have, and an
app whose scif/ holds a big junk file too. singpy runs with RLIMIT_FSIZE at
8 MiB (`ulimit -f`): unpacking any of the big files into TMPDIR kills its
unsquashfs (SIGXFSZ), which the old code did (unpacking all of /.singularity.d,
then all of /usr, then all of scif/apps/*/scif). As root and as the test user,
for the bare squashfs and for a SIF without an inspect-metadata.json object.
"""

from __future__ import annotations

import os
import resource
import subprocess
from pathlib import Path

import pytest

from singpy.image.sifwrite import build_sif_from_squashfs
from tests.conftest import Singpy, default_signals

FSIZE = 8 << 20  # the runs' RLIMIT_FSIZE: what a big file's extraction exceeds, what a metadata file does not
JUNK, BIG = 300_000_000, 20_000_000  # BIG: over singpy's 16 MiB limit for one metadata file
RUNSCRIPT, HELP, APP_HELP = "echo hello-from-bomb\n", "help text\n", "help of a\n"


def _filled(path: str, size: int, letter: str) -> str:
    """A mksquashfs pseudo definition: a file of `size` bytes of `letter`, made while squashing (none on disk)."""
    return f"{path} f 644 0 0 head -c {size} /dev/zero | tr '\\0' {letter}"


@pytest.fixture(scope="module")
def bombs(workdir: Path) -> dict[str, Path]:
    root, squashfs, sif = workdir / "bomb-root", workdir / "bomb.squashfs", workdir / "bomb.sif"
    if not sif.exists():
        meta = root / ".singularity.d"
        (meta / "env").mkdir(parents=True, exist_ok=True)
        (root / "usr").mkdir(exist_ok=True)
        (root / "opt").mkdir(exist_ok=True)
        (root / "scif" / "apps" / "a" / "scif").mkdir(parents=True, exist_ok=True)
        (meta / "runscript").write_text(RUNSCRIPT)
        (meta / "env" / "90-environment.sh").write_text("export FROM=bomb\n")
        (root / "opt" / "help.txt").write_text(HELP)
        (root / "scif" / "apps" / "a" / "scif" / "runscript.help").write_text(APP_HELP)
        for name, target in (("test", "/usr"), ("startscript", "/big.bin"), ("runscript.help", "/opt/help.txt")):
            (meta / name).unlink(missing_ok=True)
            (meta / name).symlink_to(target)
        pseudo = [_filled("/.singularity.d/junk", JUNK, "a"), _filled("/usr/big", JUNK, "a"),
                  _filled("/big.bin", BIG, "b"), _filled("/scif/apps/a/scif/junk", JUNK, "a")]
        subprocess.run(["mksquashfs", str(root), str(squashfs), "-noappend", "-all-root", "-quiet", "-no-progress",
                        *(arg for definition in pseudo for arg in ("-p", definition))],
                       check=True, stdout=subprocess.DEVNULL)
        assert squashfs.stat().st_size < 4 << 20  # the bomb: a few MB that unpack to a GB
        build_sif_from_squashfs(str(sif), str(squashfs), arch="amd64")  # no inspect-metadata.json: read the tree
        for image in (squashfs, sif):
            image.chmod(0o644)
    return {"squashfs": squashfs, "sif": sif}


@pytest.fixture(params=["squashfs", "sif"])
def bomb(request: pytest.FixtureRequest, bombs: dict[str, Path]) -> Path:
    return bombs[request.param]


def _limited_files() -> None:
    default_signals()
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE, FSIZE))


def run_limited(singpy: Singpy, tmpdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """singpy ARGS with RLIMIT_FSIZE at FSIZE and its own TMPDIR, which it must leave empty."""
    process = singpy.popen(list(args), env=singpy.env(TMPDIR=str(tmpdir)), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, preexec_fn=_limited_files)
    out, err = process.communicate(timeout=60)
    assert "Traceback" not in err and "FATAL" not in err, err
    assert os.listdir(tmpdir) == [], "singpy left its scratch directory in TMPDIR"
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


@pytest.fixture
def tmpdir_of(singpy: Singpy, workdir: Path) -> Path:
    path = workdir / f"bomb-tmp-{singpy.profile}"
    path.mkdir(exist_ok=True)
    os.chown(path, singpy.uid, singpy.gid)
    return path


def test_inspect_of_a_squashfs_bomb_unpacks_only_the_files_it_reads(singpy: Singpy, bomb: Path,
                                                                    tmpdir_of: Path) -> None:
    result = run_limited(singpy, tmpdir_of, "inspect", "--runscript", "--startscript", "--test", "--helpfile",
                         "--environment", str(bomb))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{RUNSCRIPT}{HELP}=== /.singularity.d/env/90-environment.sh ===\nexport FROM=bomb\n\n"
    warnings = result.stderr.splitlines()
    assert any(line.startswith("WARNING: left out the image's /.singularity.d/test: ") and "/usr" in line and
               line.endswith("is a directory, not a regular file") for line in warnings), result.stderr
    assert f"WARNING: left out the image's /.singularity.d/startscript: it is a link to /big.bin, which is too " \
           f"large ({BIG} bytes; at most {16 << 20} are read)" in warnings, result.stderr


def test_run_help_and_list_apps_of_a_squashfs_bomb(singpy: Singpy, bomb: Path, tmpdir_of: Path) -> None:
    def shown(*args: str) -> str:
        result = run_limited(singpy, tmpdir_of, *args, str(bomb))
        assert result.returncode == 0, result.stderr
        return result.stdout

    assert shown("run-help") == f"{HELP}\n"  # the text, then a newline (Apptainer's)
    assert shown("run-help", "--app", "a") == f"{APP_HELP}\n"
    assert shown("inspect", "--list-apps") == "a\n"
