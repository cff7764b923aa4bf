"""Issue 25's target: with singpy as `singularity`, cwltool passes every CWL v1.2 conformance test with a
DockerRequirement that rootless podman passes on the same machine.

The tests are the conformance suite's DockerRequirement subset (tests/data/cwl-v1.2, PROVENANCE.md there),
run by cwltest as the unprivileged user (cwltool is a user's tool), `-j2`. Their images are Debian stand-ins
built by mmdebstrap once a session (tests.support.cwl_images), in the suite's plain-HTTP registry, which a
registries.conf mirror for docker.io names for both engines; docker.io itself is a spy that must never be
asked (tests.support.cwl_engines).

singpy runs the whole subset; rootless podman then runs the tests singpy failed (with one it is known to pass,
which shows that podman works here), and the test fails naming each one podman passes. The verdict is the same
as running podman on everything, at a fraction of the time.
Where podman is not installed, singpy's failures are compared with the baseline measured with podman
(tests/data/cwl-v1.2/podman-baseline.txt).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Singpy
from tests.support import cwl_engines, cwl_images, cwl_suite
from tests.support.clients import own_dir
from tests.support.registry import RegistryServer

WORKS_WITH_PODMAN = "cl_basic_generation"  # a test rootless podman passes (podman-baseline.txt), run with the others
# As root, a sample: an ENTRYPOINT, dockerOutputDirectory, staged files and directories (writable, literal,
# renamed, colons in names), stdin/stdout, $HOME/$TMPDIR, symlinks out of the output dir, secondary files,
# network access refused, a scattered workflow.
ROOT_SAMPLE = {"docker_entrypoint", "dockeroutputdir", "writable_stagedfiles", "initial_workdir_empty_writable_docker",
               "iwd-container-entryname1", "iwdr_dir_literal_real_file", "colon_in_paths", "stdinout_redirect_docker",
               "env_home_tmpdir_docker", "illegal_symlink", "legal_symlink", "filesarray_secondaryfiles",
               "networkaccess_disabled", "directory_input_docker", "wf_scatter_single_param"}


@pytest.fixture(scope="module")
def stand_ins(registry_plain: RegistryServer, workdir: Path) -> RegistryServer:
    """The suite's registry holding the stand-in images as library/NAME:TAG (built once a session)."""
    why = cwl_images.mmdebstrap_missing()
    if why:
        pytest.skip(why)
    cwl_images.push_all(registry_plain, workdir)
    return registry_plain


@pytest.fixture
def spy() -> Iterator[cwl_engines.Spy]:
    server = cwl_engines.Spy()
    yield server
    server.stop()


def place_for(singpy: Singpy, workdir: Path) -> Path:
    base = own_dir(singpy, workdir / "cwl-conformance")
    base.chmod(0o755)
    return own_dir(singpy, base / f"{singpy.profile}-{uuid.uuid4().hex[:6]}")


def report(names: set[str], results: cwl_suite.Results) -> str:
    return "\n".join(f"--- {name}: {results.failed.get(name, 'unsupported')}" for name in sorted(names))


def assert_podman_passes_no_more(runner: Singpy, as_user: Singpy, workdir: Path, registry: RegistryServer,
                                 spy: cwl_engines.Spy, tests: set[str]) -> None:
    """`tests` run by cwltool with singpy as `singularity` as runner's user; those it does not pass, run by
    cwltool with rootless podman as the unprivileged user: fails naming each one podman passes."""
    place = place_for(runner, workdir)
    conf = cwl_engines.registries_conf(place / "registries.conf", spy, registry.host)
    ours = cwl_suite.run_subset(runner, place, "singularity", cwl_engines.singularity_env(runner, workdir, place, conf),
                                only=tests)
    not_passed = tests - ours.passed
    assert ours.passed and not_passed == set(ours.failed) | ours.unsupported, ours  # every test has a verdict
    if cwl_engines.podman_missing():
        podman_passed, _ = cwl_suite.read_baseline()
        source = f"the baseline {cwl_suite.BASELINE.name} ({cwl_engines.podman_missing()})"
    elif not_passed:
        podman_place = place if runner.uid == as_user.uid else place_for(as_user, workdir)
        try:
            podman = cwl_suite.run_subset(as_user, podman_place, "podman",
                                          cwl_engines.podman_env(as_user, podman_place, conf),
                                          only=not_passed | {WORKS_WITH_PODMAN})
        finally:
            cwl_engines.stop_podman(podman_place)
        # a podman that runs nothing would pass over every failure of singpy
        assert WORKS_WITH_PODMAN in podman.passed, f"rootless podman fails here: {podman.failed.get(WORKS_WITH_PODMAN)}"
        podman_passed, source = podman.passed, "rootless podman"
    else:
        podman_passed, source = set(), "rootless podman"
    regressions = not_passed & podman_passed
    assert not regressions, (f"{len(regressions)} conformance tests pass with {source} but not with singpy as "
                             f"{runner.profile}: {sorted(regressions)}\n{report(regressions, ours)}")
    assert spy.seen == []  # every image came from the mirror: docker.io was never asked


def test_singpy_passes_every_conformance_test_rootless_podman_passes(as_user: Singpy, workdir: Path,
                                                                     stand_ins: RegistryServer,
                                                                     spy: cwl_engines.Spy) -> None:
    assert_podman_passes_no_more(as_user, as_user, workdir, stand_ins, spy, set(cwl_suite.subset_ids()))


def test_as_root_singpy_passes_a_sample_of_them_too(as_root: Singpy, as_user: Singpy, workdir: Path,
                                                    stand_ins: RegistryServer, spy: cwl_engines.Spy) -> None:
    """cwltool run by root (singpy without a user namespace): a sample that covers each way a tool meets its
    container (the whole subset as root passed 131 of 132 when measured, like podman; docs/hpc.md)."""
    assert_podman_passes_no_more(as_root, as_user, workdir, stand_ins, spy, ROOT_SAMPLE)
