"""Hostile images: a link (or a special file) at every path singpy touches, for sandboxes and SIFs.

Each image is the busybox sandbox with one path replaced by something that
must never lead singpy out of the image: a link to a host directory that an
earlier mount makes visible inside (the host's /dev, the user's home, a
directory of ours under the host's /tmp, which the container sees through
its /tmp and cwd binds), a link to a device, a magic /proc link, a loop, a
climb above the root, a FIFO. singpy may run such a container or refuse it
with one FATAL line; it must never hang, never print a traceback, and never
create, write or read anything on the host. What the links point at is
checked before and after: our own witness directory byte for byte, and in
the host's /dev, /tmp and the user's home, every name singpy could create.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from singpy.image.sifwrite import build_sif_from_squashfs
from tests.conftest import Singpy
from tests.support.images import build_busybox_rootfs, tree_digest
from tests.support.leftovers import settled, traces

# Every path singpy touches in an image, and the flags that make it do so.
TOUCHED: dict[str, tuple[str, ...]] = {
    "/dev": (), "/dev-contained": ("--contain",), "/dev/shm": ("--contain",), "/dev/pts": ("--contain",),
    "/etc": (), "/etc/passwd": (), "/etc/group": (), "/etc/hosts": (), "/etc/resolv.conf": (),
    "/etc/localtime": (), "/tmp": (), "/var/tmp": (), "/var": (), "/home": (), "/root": (),
    "/proc": (), "/sys": (), "/.singularity.d": (), "/.singularity.d/env": (),
    "/.singularity.d/env/90-environment.sh": (), "/.singularity.d/runscript": (),
    "/data": ("--bind", "{witness}:/data/sub"), "/opt": ("--writable-tmpfs",),
}
# What the path becomes: a link target ("{witness}" and "{home}" are filled in), or a special file.
KINDS: dict[str, str] = {
    "host-dev": "/dev",
    "witness": "{witness}",
    "witness-file": "{witness}/canary",
    "home": "{home}",
    "magic": "/proc/self/cwd",
    "other-root": "/proc/1/root{witness}",  # another process's root: reading the link is EACCES for a user
    "zero": "/dev/zero",
    "climb": "../../../../../../../../..{witness}",
    "loop": "<loop>",
    "fifo": "<fifo>",
}
# Links that only matter where a file is read or executed go on the file paths; directories get those
# that redirect mounts. SIFs take the path through a different image strategy, so fewer kinds are enough.
FILE_PATHS = ("/etc/passwd", "/etc/group", "/etc/hosts", "/etc/resolv.conf", "/etc/localtime",
              "/.singularity.d/runscript", "/.singularity.d/env/90-environment.sh")
DIRECTORY_KINDS = ("host-dev", "witness", "home", "climb", "loop", "fifo")
SIF_KINDS = ("witness", "host-dev", "fifo")
ACTIONS = {"/.singularity.d/runscript": "run", "/.singularity.d": "run"}
# Names singpy could create in a host directory a link leads to (every basename above, and mount points).
CREATABLE = frozenset({*(Path(path).name for path in TOUCHED), "passwd", "group", "hosts", "resolv.conf",
                       "localtime", "shm", "pts", "sub", "fd", "stdin", "stdout", "stderr", "ptmx", "null", "zero",
                       "full", "random", "urandom", "tty", "libs", "singpy-test"})


def host_names(singpy: Singpy, witness: Path) -> dict[str, bool]:
    """Which of the names singpy could create exist in the host directories the links lead to.

    (The host's /tmp and /var/tmp, bound into the container, are where `/dev -> /tmp` would put
    /dev/null; only these names are looked at, never a listing.)"""
    return {f"{directory}/{name}": os.path.lexists(f"{directory}/{name}")
            for directory in ("/dev", "/tmp", "/var/tmp", singpy.home, str(witness)) for name in CREATABLE}


@pytest.fixture(scope="module")
def base(workdir: Path) -> Path:
    root = build_busybox_rootfs(workdir / "hostile-base", env_scripts={"90-environment.sh": "export FROM=image\n"})
    os.chmod(root, 0o755)
    return root


@pytest.fixture(scope="module")
def witness(workdir: Path) -> Path:
    """A host directory of ours that links point at: under the host's /tmp, so visible inside."""
    path = workdir / "witness"
    path.mkdir(exist_ok=True)
    (path / "canary").write_text("host data, never to be changed by singpy\n")
    path.chmod(0o777)  # as a user's own directory would be to them: writable, if singpy tried
    (path / "canary").chmod(0o666)
    return path


def hostile(base: Path, target: Path, path: str, kind: str, fill: Callable[[str], str]) -> Path:
    """A copy of `base` whose `path` is replaced as `kind` says."""
    if not target.exists():
        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(base, tmp, symlinks=True, copy_function=os.link)  # busybox is hard-linked, not copied
        victim = tmp / path.removesuffix("-contained").lstrip("/")
        if victim.is_dir() and not victim.is_symlink():
            shutil.rmtree(victim)
        elif victim.exists() or victim.is_symlink():
            victim.unlink()
        victim.parent.mkdir(parents=True, exist_ok=True)
        if kind == "fifo":
            os.mkfifo(victim)
        elif kind == "loop":
            victim.symlink_to(victim.name)
        else:
            victim.symlink_to(fill(KINDS[kind]))
        tmp.rename(target)
    return target


def hostile_sif(sandbox: Path) -> Path:
    out = sandbox.with_suffix(".sif")
    if not out.exists():
        squashfs = sandbox.with_suffix(".squashfs")
        subprocess.run(["mksquashfs", str(sandbox), str(squashfs), "-noappend", "-noI", "-noD", "-noF", "-noX",
                        "-all-root", "-quiet", "-no-progress"], check=True, stdout=subprocess.DEVNULL)
        build_sif_from_squashfs(str(out), str(squashfs), arch="amd64", deffile="bootstrap: localimage\n",
                                inspect_metadata={"data": {"attributes": {}}, "type": "container"})
        squashfs.unlink()
        out.chmod(0o644)
    return out


def check_run(singpy: Singpy, image: Path, path: str, witness: Path, workdir: Path, *extra: str) -> None:
    fill = _filler(singpy, witness)
    flags = [fill(flag) for flag in TOUCHED[path]]
    action = ACTIONS.get(path, "exec")
    command = [] if action == "run" else ["sh", "-c", "echo payload-ran"]
    digest, names, before = tree_digest(witness), host_names(singpy, witness), traces(image, workdir)
    try:
        result = singpy.run(action, *extra, *flags, str(image), *command, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"singpy hung on a hostile image ({path})")
    assert "Traceback" not in result.stderr, result.stderr
    fatal = [line for line in result.stderr.splitlines() if line.startswith("FATAL:")]
    if result.returncode == 255:  # refused (or the payload not found): one line says why
        assert len(fatal) == 1 and result.stderr.startswith(("FATAL:", "WARNING:")), result.stderr
    else:  # it ran: whatever the image broke for itself (no /dev, no /tmp) is the payload's business
        assert not fatal, result.stderr
    assert tree_digest(witness) == digest, f"the host directory {witness} changed"
    assert host_names(singpy, witness) == names, "singpy created a file in a host directory"
    assert settled(before, image, workdir) == before


def _filler(singpy: Singpy, witness: Path) -> Callable[[str], str]:
    return lambda text: text.replace("{witness}", str(witness)).replace("{home}", singpy.home)


CASES = [(path, kind) for path in TOUCHED for kind in (KINDS if path in FILE_PATHS else DIRECTORY_KINDS)]


@pytest.mark.parametrize(("path", "kind"), CASES, ids=[f"{path.strip('/')}-{kind}" for path, kind in CASES])
def test_hostile_sandbox(singpy: Singpy, base: Path, witness: Path, workdir: Path, path: str, kind: str) -> None:
    name = f"hostile-{path.strip('/').replace('/', '_')}-{kind}-{singpy.profile}"
    image = hostile(base, workdir / name, path, kind, _filler(singpy, witness))
    check_run(singpy, image, path, witness, workdir)


SIF_CASES = [(path, kind) for path in TOUCHED for kind in SIF_KINDS]


@pytest.mark.parametrize("path", ["/tmp", "/home", "/dev"])  # the file paths: CASES
def test_a_link_through_another_process_root_is_no_traceback(singpy: Singpy, base: Path, witness: Path,
                                                            workdir: Path, path: str) -> None:
    """/proc/1/root is a magic link a user may not read: the walk's readlink failed with a traceback."""
    name = f"hostile-{path.strip('/').replace('/', '_')}-other-root-{singpy.profile}"
    image = hostile(base, workdir / name, path, "other-root", _filler(singpy, witness))
    check_run(singpy, image, path, witness, workdir)


@pytest.mark.parametrize(("path", "kind"), SIF_CASES, ids=[f"{path.strip('/')}-{kind}" for path, kind in SIF_CASES])
def test_hostile_sif(singpy: Singpy, base: Path, witness: Path, workdir: Path, path: str, kind: str) -> None:
    """Root mounts it on a loop device; the user unpacks it into the cache (the FUSE case is below)."""
    name = f"hostile-{path.strip('/').replace('/', '_')}-{kind}-{singpy.profile}"
    image = hostile_sif(hostile(base, workdir / name, path, kind, _filler(singpy, witness)))
    check_run(singpy, image, path, witness, workdir, *(() if singpy.uid == 0 else ("--unsquash",)))


@pytest.mark.parametrize("path", ["/dev", "/etc", "/etc/group", "/tmp", "/home", "/data"])
def test_hostile_sif_through_fuse(as_user: Singpy, base: Path, witness: Path, workdir: Path, fuse_open: str,
                                  path: str) -> None:
    name = f"hostile-{path.strip('/').replace('/', '_')}-witness-user"
    image = hostile_sif(hostile(base, workdir / name, path, "witness", _filler(as_user, witness)))
    check_run(as_user, image, path, witness, workdir)


# --- what a user is told ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_identity_file_that_is_not_a_file_is_left_with_a_warning(singpy: Singpy, base: Path, witness: Path,
                                                                 workdir: Path, kind: str) -> None:
    """Never read (a FIFO would block, the link leads out of the image): the image's own file is left as it is,
    with one warning, and the payload runs, as Apptainer skips an identity file that is no regular file."""
    image = hostile(base, workdir / f"hostile-etc_group-{kind}-{singpy.profile}", "/etc/group", kind,
                    _filler(singpy, witness))
    result = singpy.run("exec", str(image), "echo", "ran", timeout=30)
    expected = "is a FIFO, not a regular file" if kind == "fifo" else "a link to /dev/zero, which is not in the image"
    assert (result.returncode, result.stdout) == (0, "ran\n"), result.stderr
    assert result.stderr.startswith("WARNING: can't use the image's /etc/group (") and expected in result.stderr
    assert result.stderr.endswith("): not updating it\n") and len(result.stderr.splitlines()) == 1, result.stderr


def test_bind_below_a_link_to_a_host_directory_is_refused(singpy: Singpy, base: Path, witness: Path,
                                                          workdir: Path) -> None:
    image = hostile(base, workdir / f"hostile-data-witness-{singpy.profile}", "/data", "witness",
                    _filler(singpy, witness))
    result = singpy.run("exec", "--bind", f"{witness}:/data/new", str(image), "true", timeout=30)
    assert result.returncode == 255
    assert f"can't bind {witness} on /data/new: {witness}/new does not exist and can't be made" in result.stderr
    assert not (witness / "new").exists()


def test_default_mounts_the_image_redirects_to_the_host_are_left_out(singpy: Singpy, base: Path, witness: Path,
                                                                     workdir: Path) -> None:
    """/dev -> /etc: the host's /dev lands on /etc; /etc/passwd & co can't be made there and are left out."""
    image = workdir / f"hostile-dev-to-etc-{singpy.profile}"
    if not image.exists():
        tmp = hostile(base, workdir / f"hostile-dev-to-etc-{singpy.profile}.src", "/dev", "witness",
                      _filler(singpy, witness))
        (tmp / "dev").unlink()
        (tmp / "dev").symlink_to("/etc")
        tmp.rename(image)
    result = singpy.run("-v", "exec", str(image), "sh", "-c", "echo ran", timeout=30)
    assert result.returncode == 0 and result.stdout == "ran\n", result.stderr
    assert "can't write /etc/passwd (left out): /etc/passwd does not exist and can't be made (the host's /dev is " \
           "bound on /etc" in result.stderr
    assert not any(os.path.lexists(f"/dev/{name}") for name in ("passwd", "group", "hosts", "localtime",
                                                                "resolv.conf"))


@pytest.mark.parametrize("kind", ["witness-file", "fifo"])
def test_runscript_out_of_the_image_is_refused(singpy: Singpy, base: Path, witness: Path, workdir: Path,
                                               kind: str) -> None:
    image = hostile(base, workdir / f"hostile-_.singularity.d_runscript-{kind}-{singpy.profile}",
                    "/.singularity.d/runscript", kind, _filler(singpy, witness))
    result = singpy.run("run", str(image), timeout=30)
    assert result.returncode == 255 and "host data" not in result.stdout
    assert result.stderr.startswith("FATAL:") and "/.singularity.d/runscript" in result.stderr


# --- inspect and build read the image the same way ----------------------------------------------------------------


SECRET = "host-secret-never-in-an-image"


@pytest.fixture(scope="module")
def secret(witness: Path) -> Path:
    path = witness.parent / "secret"
    path.write_text(SECRET + "\n")
    path.chmod(0o644)
    return path


def metadata_links(base: Path, target: Path, secret: Path) -> Path:
    """Metadata files that are links out of the image: to a host file, to /proc, to a device; and a FIFO."""
    if not target.exists():
        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(base, tmp, symlinks=True, copy_function=os.link)
        meta = tmp / ".singularity.d"
        (meta / "runscript").unlink()
        (meta / "runscript").symlink_to(str(secret))
        (meta / "startscript").symlink_to("/proc/self/environ")
        (meta / "test").symlink_to("../usr/share/test.sh")  # inside the image: followed
        (tmp / "usr" / "share").mkdir(exist_ok=True)
        (tmp / "usr" / "share" / "test.sh").write_text("echo the image's own test\n")
        (meta / "labels.json").symlink_to("/dev/zero")
        os.mkfifo(meta / "runscript.help")
        tmp.rename(target)
    return target


def test_build_and_inspect_never_read_through_links_out_of_the_image(singpy: Singpy, base: Path, secret: Path,
                                                                     workdir: Path) -> None:
    sandbox = metadata_links(base, workdir / "hostile-metadata", secret)
    outdir = workdir / f"hostile-out-{singpy.profile}"  # the profile's own, as a build target is
    outdir.mkdir(exist_ok=True)
    os.chown(outdir, singpy.uid, singpy.gid)
    out = outdir / "metadata.sif"
    out.unlink(missing_ok=True)
    built = singpy.run("build", str(out), str(sandbox), timeout=60)
    assert built.returncode == 0, built.stderr
    assert f"/.singularity.d/runscript: it is a link to {secret}, which is not in the image" in built.stderr
    assert "runscript.help: /.singularity.d/runscript.help is a FIFO" in built.stderr
    assert SECRET.encode() not in out.read_bytes()
    shown = singpy.run("inspect", "--all", str(out), env=singpy.env(LEAK=SECRET), timeout=30)
    assert shown.returncode == 0, shown.stderr
    assert SECRET not in shown.stdout and "the image's own test" in shown.stdout


def test_inspect_of_a_sif_without_metadata_reads_links_inside_the_image(singpy: Singpy, base: Path, secret: Path,
                                                                         workdir: Path) -> None:
    """No inspect-metadata.json object: /.singularity.d is unpacked, and what its links lead to in the image."""
    sandbox = metadata_links(base, workdir / "hostile-metadata", secret)
    squashfs = workdir / "hostile-metadata.squashfs"
    if not squashfs.exists():
        subprocess.run(["mksquashfs", str(sandbox), str(squashfs), "-noappend", "-all-root", "-quiet",
                        "-no-progress"], check=True, stdout=subprocess.DEVNULL)
    shown = singpy.run("inspect", "--runscript", "--startscript", "--test", "--helpfile", str(squashfs),
                       env=singpy.env(LEAK=SECRET), timeout=30)
    assert shown.returncode == 0, shown.stderr
    assert SECRET not in shown.stdout and shown.stdout == "echo the image's own test\n"
    assert "startscript: it is a link to /proc/self/environ, which is not in the image" in shown.stderr


MALFORMED = {
    "attributes-a-list": b'{"data": {"attributes": []}, "type": "container"}',
    "data-a-string": b'{"data": "x"}',
    "document-a-list": b"[1, 2]",
    "runscript-a-number": b'{"data": {"attributes": {"runscript": 42}}}',
    "labels-nested": b'{"data": {"attributes": {"labels": {"a": {"b": 1}}}}}',
    "labels-a-list": b'{"data": {"attributes": {"labels": ["a"]}}}',
    "environment-a-number": b'{"data": {"attributes": {"environment": 1}}}',
    "deep-nesting": b"[" * 100_000 + b"]" * 100_000,
    "not-json": b"{not json",
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_inspect_metadata_is_one_fatal_line(singpy: Singpy, workdir: Path, base: Path, case: str) -> None:
    squashfs = workdir / "hostile-base.squashfs"
    if not squashfs.exists():
        subprocess.run(["mksquashfs", str(base), str(squashfs), "-noappend", "-all-root", "-quiet", "-no-progress"],
                       check=True, stdout=subprocess.DEVNULL)
    out = workdir / f"malformed-{case}.sif"
    if not out.exists():
        build_sif_from_squashfs(str(out), str(squashfs), arch="amd64", inspect_metadata=MALFORMED[case])
        out.chmod(0o644)
    result = singpy.run("inspect", "--all", str(out), timeout=30)
    assert result.returncode == 255, result.stderr
    assert result.stderr.startswith("FATAL:") and len(result.stderr.splitlines()) == 1, result.stderr
    assert "inspect-metadata.json" in result.stderr and result.stdout == ""
