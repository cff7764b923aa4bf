"""Default mounts, binds, --contain, --writable-tmpfs: what the container sees."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support.images import tree_digest


def test_system_mounts_present(singpy: Singpy, image: Path) -> None:
    out = singpy.ok("exec", str(image), "sh", "-c", "ls /proc/self/status /sys/kernel /dev/null >/dev/null && echo ok")
    assert out.strip() == "ok"


def test_host_dev_is_bound_by_default(singpy: Singpy, image: Path) -> None:
    host_nodes = {name for name in os.listdir("/dev") if not name.startswith(".")}
    inside = set(singpy.ok("exec", str(image), "ls", "/dev").split())
    assert host_nodes <= inside


def test_home_cwd_and_tmp_are_shared_with_the_host(singpy: Singpy, image: Path, workdir: Path) -> None:
    session = Path("/tmp", workdir.relative_to("/tmp").parts[0])  # the workdir, or a pytest-xdist worker's parent
    out = singpy.ok("exec", str(image), "sh", "-c", f"echo $HOME; pwd; ls -d {session}")
    home, cwd, tmp = out.split()
    assert (home, cwd) == (singpy.home, str(workdir))
    assert tmp == str(session)


def test_file_written_in_home_appears_on_host(singpy: Singpy, image: Path) -> None:
    name = f"written-by-{singpy.profile}-{os.getpid()}"  # the home is shared with other runs of the suite
    singpy.ok("exec", str(image), "sh", "-c", f"echo hello > $HOME/{name}")
    written = Path(singpy.home) / name
    try:
        assert written.read_text() == "hello\n"
        assert written.stat().st_uid == singpy.uid
    finally:
        written.unlink()


def test_image_root_is_read_only(singpy: Singpy, image: Path) -> None:
    result = singpy.run("exec", str(image), "touch", "/bin/new-file")
    assert result.returncode != 0
    assert "Read-only file system" in result.stderr
    assert not (image / "bin" / "new-file").exists()


def test_writable_tmpfs_allows_writes_that_vanish(singpy: Singpy, workdir: Path) -> None:
    from tests.support.images import build_busybox_rootfs

    # Overlayfs copies a file up with its owner, which a user namespace can only
    # do for ids it maps: an unprivileged user can change the parts of an image
    # they own (an image they built or unpacked), as with Apptainer.
    image = workdir / f"writable-{singpy.profile}"
    if not image.exists():
        build_busybox_rootfs(image)
        os.chown(image / "opt", singpy.uid, singpy.gid)
    before = tree_digest(image)
    out = singpy.ok("exec", "--writable-tmpfs", str(image), "sh", "-c",
                    "mkdir -p /opt/scratch && echo data > /opt/scratch/f && cat /opt/scratch/f")
    assert out == "data\n"
    assert tree_digest(image) == before
    second = singpy.run("exec", str(image), "ls", "/opt/scratch")
    assert second.returncode != 0


def test_runs_never_write_the_image(singpy: Singpy, image: Path, workdir: Path) -> None:
    before = tree_digest(image)
    target = workdir / "bind-target"
    target.mkdir(exist_ok=True)
    singpy.ok("exec", "-B", f"{target}:/new/mount/point", "--hostname", "h", str(image), "true")
    singpy.ok("exec", "--contain", "--pid", str(image), "true")
    assert tree_digest(image) == before


@pytest.mark.parametrize("spec_suffix, writable", [("", True), (":rw", True), (":ro", False)],
                         ids=["default", "rw", "ro"])
def test_bind_modes(singpy: Singpy, image: Path, workdir: Path, spec_suffix: str, writable: bool) -> None:
    source = workdir / f"bind-{singpy.profile}-{writable}-{spec_suffix.strip(':') or 'default'}"
    source.mkdir(exist_ok=True)
    source.chmod(0o777)
    (source / "hello").write_text("from host\n")
    result = singpy.run("exec", "--bind", f"{source}:/data{spec_suffix}", str(image), "sh", "-c",
                        "cat /data/hello; touch /data/new")
    assert result.stdout == "from host\n"
    assert (source / "new").exists() == writable
    assert (result.returncode == 0) == writable


def test_bind_comma_list_and_env_variable(singpy: Singpy, image: Path, workdir: Path) -> None:
    first, second, third = (workdir / f"multi-{n}" for n in ("a", "b", "c"))
    for path in (first, second, third):
        path.mkdir(exist_ok=True)
        (path / "name").write_text(path.name)
    env = singpy.env(SINGULARITY_BIND=f"{third}:/c")
    out = singpy.ok("exec", "-B", f"{first}:/a,{second}:/b:ro", str(image), "cat", "/a/name", "/b/name", "/c/name",
                    env=env)
    assert out == "multi-amulti-bmulti-c"


def test_bind_a_single_file(singpy: Singpy, image: Path, workdir: Path) -> None:
    source = workdir / "single-file"
    source.write_text("one file\n")
    assert singpy.ok("exec", "-B", f"{source}:/etc/motd", str(image), "cat", "/etc/motd") == "one file\n"


def test_bind_destination_through_image_symlink(singpy: Singpy, workdir: Path) -> None:
    from tests.support.images import build_busybox_rootfs

    root = workdir / f"linked-{singpy.profile}"
    if not root.exists():
        build_busybox_rootfs(root)
        (root / "data-link").symlink_to("/opt")
    source = workdir / "link-source"
    source.mkdir(exist_ok=True)
    (source / "x").write_text("via link\n")
    assert singpy.ok("exec", "-B", f"{source}:/data-link", str(root), "cat", "/opt/x") == "via link\n"


def test_contain_gives_minimal_dev_and_empty_tmp_and_home(singpy: Singpy, image: Path) -> None:
    out = singpy.ok("exec", "--contain", str(image), "sh", "-c",
                    "ls /dev; echo ---; ls -A /tmp; echo ---; ls -A $HOME; echo ---; pwd")
    dev, tmp, home, cwd = (part.split() for part in out.split("---"))
    assert {"null", "zero", "random", "urandom", "tty", "pts", "shm", "ptmx", "fd"} <= set(dev)
    assert "vda" not in dev and "loop0" not in dev
    assert tmp == [] and home == []
    assert cwd == [singpy.home]


def test_contain_tmp_is_writable(singpy: Singpy, image: Path) -> None:
    assert singpy.ok("exec", "-c", str(image), "sh", "-c", "echo x > /tmp/f && cat /tmp/f") == "x\n"


def test_no_home(singpy: Singpy, image: Path) -> None:
    if singpy.uid == 0:
        pytest.skip("/root exists in the image, so --no-home is not observable for root")
    result = singpy.run("exec", "--no-home", str(image), "ls", singpy.home)
    assert result.returncode != 0


def test_custom_home(singpy: Singpy, image: Path, workdir: Path) -> None:
    custom = workdir / f"home-{singpy.profile}"
    custom.mkdir(exist_ok=True)
    custom.chmod(0o777)
    (custom / "marker").write_text("custom home\n")
    out = singpy.ok("exec", "-H", f"{custom}:/home/elsewhere", str(image), "sh", "-c",
                    "echo $HOME; cat $HOME/marker; grep elsewhere /etc/passwd | cut -d: -f6")
    assert out.split("\n")[:3] == ["/home/elsewhere", "custom home", "/home/elsewhere"]


def test_pwd(singpy: Singpy, image: Path) -> None:
    assert singpy.ok("exec", "--pwd", "/etc", str(image), "pwd") == "/etc\n"


def test_fresh_proc_with_pid_namespace(singpy: Singpy, image: Path) -> None:
    out = singpy.ok("exec", "--pid", str(image), "ls", "/proc")
    pids = [name for name in out.split() if name.isdigit()]
    assert len(pids) <= 4


def _owned_dir(singpy: Singpy, path: Path) -> Path:
    path.mkdir(parents=True)
    os.chown(path, singpy.uid, singpy.gid)
    return path


def test_bind_inside_a_bind_gets_its_mount_point_as_cwltool_expects(singpy: Singpy, image: Path,
                                                                    workdir: Path) -> None:
    """cwltool: `--home OUT:/W --mount type=bind,source=IN,target=/W/IN,readonly`. The mount points are made in
    OUT (as the user, a file for a file, a directory for a directory) and stay there, as with Apptainer."""
    base = workdir / f"nested-binds-{singpy.profile}"
    out, inputs = _owned_dir(singpy, base / "out"), _owned_dir(singpy, base / "inputs")
    (inputs / "ref.fasta").write_text(">seq\nACGT\n")
    (inputs / "dir").mkdir()
    (inputs / "dir" / "inner").write_text("inner\n")
    shown = singpy.ok("exec", "--home", f"{out}:/W", "--mount",
                      f"type=bind,source={inputs / 'ref.fasta'},target=/W/ref.fasta,readonly",
                      "-B", f"{inputs / 'dir'}:/W/staged/dir:ro", "--pwd", "/W", str(image), "sh", "-c",
                      "cat ref.fasta staged/dir/inner; echo made > result; echo x >> ref.fasta || echo read-only")
    assert shown == ">seq\nACGT\ninner\nread-only\n"
    assert (out / "result").read_text() == "made\n"
    assert (out / "ref.fasta").is_file() and (out / "ref.fasta").stat().st_size == 0  # the mount point, left
    assert (out / "staged" / "dir").is_dir() and not any((out / "staged" / "dir").iterdir())
    assert (out / "ref.fasta").stat().st_uid == singpy.uid
    assert (inputs / "ref.fasta").read_text() == ">seq\nACGT\n"


def test_bind_inside_a_default_bind_is_still_refused(singpy: Singpy, image: Path, workdir: Path) -> None:
    """Only binds the user named make mount points in each other: a host directory singpy binds by default (the
    working directory here) gets nothing made in it, and the error names the destination."""
    base = workdir / f"nested-default-{singpy.profile}"
    cwd, source = _owned_dir(singpy, base / "cwd"), _owned_dir(singpy, base / "source")
    result = singpy.run("exec", "-B", f"{source}:{cwd}/new", str(image), "true", cwd=cwd)
    assert result.returncode == 255 and f"can't bind {source} on {cwd}/new" in result.stderr
    assert not (cwd / "new").exists()


def test_bind_inside_a_bind_never_follows_an_image_link(singpy: Singpy, workdir: Path) -> None:
    """The image's /data -> /scratch link does not choose where a mount point is made in the user's bind."""
    from tests.support.images import build_busybox_rootfs

    root = workdir / f"nested-linked-{singpy.profile}"
    build_busybox_rootfs(root)
    (root / "data").symlink_to("/scratch")
    base = workdir / f"nested-link-binds-{singpy.profile}"
    scratch, source = _owned_dir(singpy, base / "scratch"), _owned_dir(singpy, base / "source")
    result = singpy.run("exec", "-B", f"{scratch}:/scratch", "-B", f"{source}:/data/new", str(root), "true")
    assert result.returncode == 255 and "can't bind" in result.stderr and "/data/new" in result.stderr
    assert not (scratch / "new").exists()


def test_a_bound_runscript_or_env_script_is_the_users_choice(singpy: Singpy, env_image: Path, workdir: Path) -> None:
    """`run --bind rs.sh:/.singularity.d/runscript IMG`: run runs what the user bound, as in Apptainer; a bind over
    an env script is sourced in its place."""
    base = _owned_dir(singpy, workdir / f"bound-scripts-{singpy.profile}")
    runscript, env_script = base / "rs.sh", base / "env.sh"
    runscript.write_text('#!/bin/sh\necho "my runscript: $* $FROM_IMAGE $MINE"\n')
    runscript.chmod(0o755)
    env_script.write_text("export MINE=mine\nexport FROM_IMAGE=replaced\n")
    out = singpy.ok("run", "--bind", f"{runscript}:/.singularity.d/runscript", "--bind",
                    f"{env_script}:/.singularity.d/env/90-environment.sh", str(env_image), "a", "b")
    assert out == "my runscript: a b replaced mine\n"


def test_the_binds_in_effect_are_in_apptainer_bind(singpy: Singpy, image: Path, workdir: Path) -> None:
    """As Apptainer sets them: the destinations of --bind, APPTAINER_BIND and --mount, for a nested container."""
    source = _owned_dir(singpy, workdir / f"bind-variable-{singpy.profile}")
    env = singpy.env(APPTAINER_BIND=f"{source}:/from-env")
    out = singpy.ok("exec", "-B", f"{source}:/x,{source}:/y:ro", "--mount", f"type=bind,source={source},target=/z",
                    str(image), "sh", "-c", 'echo "$APPTAINER_BIND|$SINGULARITY_BIND"', env=env)
    assert out == "/x,/y,/from-env,/z|/x,/y,/from-env,/z\n"  # --bind, then the variable's, then --mount
    bare = singpy.ok("exec", str(image), "sh", "-c", 'echo "${APPTAINER_BIND-unset}|${SINGULARITY_BIND-unset}"')
    assert bare == "|\n"


def test_a_bind_of_the_wrong_kind_is_said_in_the_users_words(singpy: Singpy, image: Path, workdir: Path) -> None:
    """`-B ~/f.txt:/usr`: the user's paths in one line (never the staging root's /oldroot/...)."""
    base = _owned_dir(singpy, workdir / f"wrong-kind-{singpy.profile}")
    (base / "f.txt").write_text("x\n")
    result = singpy.run("exec", "-B", f"{base}/f.txt:/usr", str(image), "true")
    assert_one_fatal(result, f"can't bind {base}/f.txt on /usr: {base}/f.txt is not a directory, and /usr is a "
                             "directory in the container")
    result = singpy.run("exec", "-B", f"{base}:/bin/sh", str(image), "true")
    assert_one_fatal(result, f"can't bind {base} on /bin/sh: {base} is a directory, and /bin/sh is not a directory")
    assert "/oldroot" not in result.stderr
