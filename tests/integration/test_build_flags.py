"""`singpy build` flags of Apptainer 1.5 (issue 28): --fix-perms, --update, --section, --nv, --rocm,
--mount, --writable-tmpfs, --userns, --disable-cache, as root and as the unprivileged test user.

Real builds from the busybox base sandbox (tests.support.recipes) and the local registry; what is checked
is what the user sees: files and modes of the sandbox, what %post and %test saw, the cache left untouched,
one FATAL line for a bad flag with nothing left behind.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support import oci, sifs
from tests.support.recipes import base_oci_image, base_sandbox, build_dirs, out_dir, sif_owners, write_recipe
from tests.support.registry import RegistryServer

BUILD_TIMEOUT = 120


def build(singpy: Singpy, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    result = singpy.run("build", *args, env=env, timeout=BUILD_TIMEOUT)
    assert result.returncode == 0, f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    return result


def read_only_base(workdir: Path) -> Path:
    """The busybox base with a read-only tree in it (a 0555 directory holding a 0444 file and a 0555 one),
    as Go's module cache or some wheels leave: its owner can't empty it."""
    root = workdir / "flags-read-only-base"
    if not root.exists():
        shutil.copytree(base_sandbox(workdir), root, symlinks=True)
        locked = root / "opt" / "locked"
        (locked / "inner").mkdir(parents=True)
        (locked / "inner" / "data").write_text("data\n")
        (locked / "inner" / "data").chmod(0o444)
        (locked / "inner").chmod(0o555)
        locked.chmod(0o555)
    return root


def remove_as(singpy: Singpy, path: Path) -> subprocess.CompletedProcess[str]:
    """`rm -rf PATH` as the profile's user."""
    result: subprocess.CompletedProcess[str] = subprocess.run(  # type: ignore[call-overload]
        ["rm", "-rf", str(path)], capture_output=True, text=True, check=False, **singpy.switch())
    return result


FIXED = """
    Bootstrap: localimage
    From: {base}

    %post
        echo post > /post-made
    """


def test_fix_perms_gives_the_owner_rwx_so_the_sandbox_can_be_removed(singpy: Singpy, workdir: Path) -> None:
    out = out_dir(singpy, workdir, "fix-perms")
    recipe = write_recipe(out, FIXED.format(base=read_only_base(workdir)))
    fixed = out / "fixed"
    build(singpy, "--fix-perms", "--sandbox", str(fixed), str(recipe))
    modes = {name: stat.S_IMODE((fixed / name).stat().st_mode)
             for name in ("opt/locked", "opt/locked/inner", "opt/locked/inner/data")}
    assert modes == {"opt/locked": 0o755, "opt/locked/inner": 0o755, "opt/locked/inner/data": 0o644}
    assert (fixed / "post-made").read_text() == "post\n"
    assert remove_as(singpy, fixed).returncode == 0 and not fixed.exists()


def test_fix_perms_reaches_a_sif_built_on_a_sif_base(singpy: Singpy, workdir: Path) -> None:
    """A SIF base lies under an overlay (not unpacked) for a SIF output: the modes are fixed there too."""
    out = out_dir(singpy, workdir, "fix-perms-sif")
    base = out / "base.sif"
    build(singpy, str(base), str(read_only_base(workdir)))
    recipe = write_recipe(out, FIXED.format(base=base))
    build(singpy, "--fix-perms", str(out / "fixed.sif"), str(recipe))
    build(singpy, str(out / "kept.sif"), str(recipe))
    fixed, kept = sif_owners(out / "fixed.sif"), sif_owners(out / "kept.sif")
    assert fixed["/opt/locked/inner"].split()[0] == "drwxr-xr-x"
    assert fixed["/opt/locked/inner/data"].split()[0] == "-rw-r--r--"
    assert kept["/opt/locked/inner"].split()[0] == "dr-xr-xr-x"


def test_fix_perms_of_images_built_from_a_registry(singpy: Singpy, workdir: Path,
                                                   registry_plain: RegistryServer) -> None:
    """docker:// straight to a sandbox or a SIF: the image's read-only tree gets the owner's rwX."""
    registry_plain.upload(oci.busybox_image(extra=[oci.directory("opt/locked", mode=0o555),
                                                   oci.file("opt/locked/data", "data\n", mode=0o444)]),
                          "flags/locked")
    ref = f"docker://{registry_plain.host}/flags/locked:latest"
    out = out_dir(singpy, workdir, "fix-perms-registry")
    build(singpy, "--no-https", "--fix-perms", "--sandbox", str(out / "sandbox"), ref)
    assert stat.S_IMODE((out / "sandbox" / "opt" / "locked").stat().st_mode) == 0o755
    assert remove_as(singpy, out / "sandbox").returncode == 0
    build(singpy, "--no-https", "--fix-perms", str(out / "fixed.sif"), ref)
    build(singpy, "--no-https", str(out / "kept.sif"), ref)
    fixed, kept = sif_owners(out / "fixed.sif"), sif_owners(out / "kept.sif")
    assert (fixed["/opt/locked"].split()[0], fixed["/opt/locked/data"].split()[0]) == ("drwxr-xr-x", "-rw-r--r--")
    assert (kept["/opt/locked"].split()[0], kept["/opt/locked/data"].split()[0]) == ("dr-xr-xr-x", "-r--r--r--")
    assert singpy.ok("exec", str(out / "fixed.sif"), "cat", "/opt/locked/data") == "data\n"
    assert sorted(os.listdir(out)) == ["fixed.sif", "kept.sif"]


def squash_settings(sif: Path) -> str:
    """What `unsquashfs -s` says of the SIF's root filesystem (its compressor, its block size)."""
    return subprocess.run(["unsquashfs", "-s", "-o", str(sifs.primary_offset(sif)), str(sif)],
                          capture_output=True, text=True, check=True).stdout


def test_mksquashfs_args_reach_each_squash(singpy: Singpy, workdir: Path, registry_plain: RegistryServer) -> None:
    """--mksquashfs-args (APPTAINER_MKSQUASHFS_ARGS) for a sandbox, a definition file and a docker:// image, as
    Apptainer passes them to its assembler's mksquashfs: another -comp replaces singpy's gzip (with its note)."""
    registry_plain.upload(base_oci_image(), "flags/squashargs")
    out = out_dir(singpy, workdir, "mksquashfs-args")
    recipe = write_recipe(out, FIXED.format(base=base_sandbox(workdir)))
    sources = {"sandbox": str(base_sandbox(workdir)), "recipe": str(recipe),
               "registry": f"docker://{registry_plain.host}/flags/squashargs:latest"}
    for name, source in sources.items():
        made = build(singpy, "--no-https", "--mksquashfs-args", "-comp xz -b 65536", str(out / f"{name}.sif"), source)
        assert "INFO:    Non-gzip squashfs compression might not work with some installations" in made.stderr
        settings = squash_settings(out / f"{name}.sif")
        assert "Compression xz" in settings and "Block size 65536" in settings, (name, settings)
        assert singpy.ok("exec", str(out / f"{name}.sif"), "cat", "/etc/base-marker") in ("sandbox base\n",
                                                                                          "oci base\n")
    build(singpy, str(out / "variable.sif"), str(base_sandbox(workdir)),
          env=singpy.env(APPTAINER_MKSQUASHFS_ARGS="-b 262144"))
    assert "Compression gzip" in squash_settings(out / "variable.sif")  # no -comp: singpy's gzip stays
    assert "Block size 262144" in squash_settings(out / "variable.sif")
    refused = singpy.run("build", "--mksquashfs-args", "-no-such-option", str(out / "refused.sif"),
                         str(base_sandbox(workdir)), timeout=BUILD_TIMEOUT)
    assert_one_fatal(refused, f"can't build {out / 'refused.sif'}")
    assert sorted(os.listdir(out)) == ["recipe.def", "recipe.sif", "registry.sif", "sandbox.sif", "variable.sif"]


def test_without_fix_perms_the_modes_of_the_base_are_kept(as_user: Singpy, workdir: Path) -> None:
    out = out_dir(as_user, workdir, "no-fix-perms")
    recipe = write_recipe(out, FIXED.format(base=read_only_base(workdir)))
    kept = out / "kept"
    build(as_user, "--sandbox", str(kept), str(recipe))
    assert stat.S_IMODE((kept / "opt" / "locked").stat().st_mode) == 0o555
    assert remove_as(as_user, kept).returncode != 0  # what --fix-perms is for
    subprocess.run(["chmod", "-R", "u+rwX", str(kept)], check=True, **as_user.switch())  # type: ignore[call-overload]


def test_fix_perms_of_a_sandbox_or_sif_built_from_an_image(singpy: Singpy, workdir: Path) -> None:
    out = out_dir(singpy, workdir, "fix-perms-image")
    fixed = out / "fixed"
    build(singpy, "--fix-perms", "--sandbox", str(fixed), str(read_only_base(workdir)))
    assert stat.S_IMODE((fixed / "opt" / "locked" / "inner").stat().st_mode) == 0o755
    assert remove_as(singpy, fixed).returncode == 0
    build(singpy, "--fix-perms", str(out / "fixed.sif"), str(read_only_base(workdir)))
    assert sif_owners(out / "fixed.sif")["/opt/locked/inner/data"].split()[0] == "-rw-r--r--"
    assert sorted(os.listdir(out)) == ["fixed.sif"]


FIRST = """
    Bootstrap: localimage
    From: {base}

    %post
        echo first >> /log
    %runscript
        echo first runscript
    %labels
        Which first
    """

UPDATE = """
    %post
        echo update >> /log
    %runscript
        echo updated runscript
    %test
        echo update-test-ran
    """


def test_update_runs_the_sections_over_the_existing_sandbox(singpy: Singpy, workdir: Path) -> None:
    out = out_dir(singpy, workdir, "update")
    sandbox = out / "sandbox"
    build(singpy, "--sandbox", str(sandbox), str(write_recipe(out, FIRST.format(base=base_sandbox(workdir)))))
    update = write_recipe(out, UPDATE, "update.def")  # no header: --update skips the bootstrap
    result = build(singpy, "--update", "--sandbox", str(sandbox), str(update))
    assert f"Building into existing container: {sandbox}" in result.stderr
    assert "update-test-ran" in result.stdout
    assert (sandbox / "log").read_text() == "first\nupdate\n"
    assert singpy.ok("run", str(sandbox)) == "updated runscript\n"
    assert '"Which": "first"' in (sandbox / ".singularity.d" / "labels.json").read_text()
    assert build_dirs(out) == []


def test_update_with_section_runs_only_those_sections(singpy: Singpy, workdir: Path) -> None:
    out = out_dir(singpy, workdir, "update-section")
    sandbox = out / "sandbox"
    build(singpy, "--sandbox", str(sandbox), str(write_recipe(out, FIRST.format(base=base_sandbox(workdir)))))
    update = write_recipe(out, UPDATE, "update.def")
    result = build(singpy, "--update", "--section", "post", "--sandbox", str(sandbox), str(update))
    assert (sandbox / "log").read_text() == "first\nupdate\n"
    assert singpy.ok("run", str(sandbox)) == "first runscript\n"  # %runscript not selected
    assert "update-test-ran" not in result.stdout  # nor %test
    build(singpy, "--update", "--section", "runscript,test", "--sandbox", str(sandbox), str(update))
    assert (sandbox / "log").read_text() == "first\nupdate\n"  # %post not selected this time
    assert singpy.ok("run", str(sandbox)) == "updated runscript\n"


def test_section_none_builds_the_bare_base(singpy: Singpy, workdir: Path) -> None:
    out = out_dir(singpy, workdir, "section-none")
    recipe = write_recipe(out, FIRST.format(base=base_sandbox(workdir)))
    sandbox = out / "sandbox"
    build(singpy, "--section", "none", "--sandbox", str(sandbox), str(recipe))
    assert not (sandbox / "log").exists()
    assert (sandbox / "etc" / "base-marker").read_text() == "sandbox base\n"


@pytest.mark.parametrize(("flags", "message"), [
    (["--update"], "only sandbox update is supported: --sandbox flag is missing"),
    (["--update", "--sandbox", "{out}/missing"], "does not exist: --update builds into an existing sandbox"),
    (["--update", "--sandbox", "{out}/a-file"], "only sandbox update is supported: {out}/a-file is not a directory"),
    (["--section", "all,post"], "section specification error: cannot have all and any other option"),
    (["--section", "none", "--section", "post"], "cannot have none and any other option"),
    (["--section", "psot"], "--section 'psot': not a section singpy can select"),
    (["--mount", "type=tmpfs,dst=/x"], "--mount"),
    (["--bind", "relative/dest:not-absolute"], "not-absolute"),
])
def test_bad_flags_are_one_fatal_line_and_nothing_is_left(singpy: Singpy, workdir: Path, flags: list[str],
                                                          message: str) -> None:
    out = out_dir(singpy, workdir, f"bad-{'-'.join(flags)}")
    recipe = write_recipe(out, FIRST.format(base=base_sandbox(workdir)))
    (out / "a-file").write_text("not a sandbox\n")
    target = [] if any("{out}" in flag for flag in flags) else [str(out / "image.sif")]
    argv = [flag.format(out=out) for flag in flags]
    result = singpy.run("build", *argv, *target, str(recipe), timeout=BUILD_TIMEOUT)
    assert_one_fatal(result, message.format(out=out), code=result.returncode)
    assert result.returncode != 0
    assert sorted(os.listdir(out)) == ["a-file", "recipe.def"]


MOUNTS = """
    Bootstrap: localimage
    From: {base}

    %post
        cat /mnt/from-host > /copied
    %test
        cat /mnt/from-host
        echo scribble > /scribble && echo test-wrote
    """


def test_mount_and_writable_tmpfs_reach_post_and_test(singpy: Singpy, workdir: Path) -> None:
    out = out_dir(singpy, workdir, "mount-tmpfs")
    (out / "host").mkdir()
    (out / "host" / "from-host").write_text("host data\n")
    recipe = write_recipe(out, MOUNTS.format(base=base_sandbox(workdir)))
    sandbox = out / "sandbox"
    result = build(singpy, "--mount", f"type=bind,src={out / 'host'},dst=/mnt,ro", "--writable-tmpfs",
                   "--sandbox", str(sandbox), str(recipe))
    assert (sandbox / "copied").read_text() == "host data\n"
    assert "host data\ntest-wrote\n" in result.stdout
    assert not (sandbox / "scribble").exists()  # the tmpfs's changes are gone with %test
    assert not (sandbox / "mnt" / "from-host").exists()  # the mount is not part of the image


def test_mount_variable_reaches_post_and_test(singpy: Singpy, workdir: Path) -> None:
    """APPTAINER_MOUNT, build's variable for --mount, reaches %post and %test once (see PENDING in
    tests/support/envkeys.py)."""
    out = out_dir(singpy, workdir, "mount-variable")
    (out / "host").mkdir()
    (out / "host" / "from-host").write_text("host data\n")
    recipe = write_recipe(out, MOUNTS.format(base=base_sandbox(workdir)))
    sandbox = out / "sandbox"
    result = build(singpy, "--writable-tmpfs", "--sandbox", str(sandbox), str(recipe),
                   env=singpy.env(APPTAINER_MOUNT=f"type=bind,src={out / 'host'},dst=/mnt,ro"))
    assert (sandbox / "copied").read_text() == "host data\n"
    assert "host data\ntest-wrote\n" in result.stdout


def test_without_writable_tmpfs_test_is_read_only(singpy: Singpy, workdir: Path) -> None:
    out = out_dir(singpy, workdir, "no-tmpfs")
    (out / "host").mkdir()
    (out / "host" / "from-host").write_text("host data\n")
    recipe = write_recipe(out, MOUNTS.format(base=base_sandbox(workdir)))
    result = singpy.run("build", "--bind", f"{out / 'host'}:/mnt", "--sandbox", str(out / "sandbox"), str(recipe),
                        timeout=BUILD_TIMEOUT)
    assert result.returncode == 255 and "Read-only file system" in result.stderr
    assert "FATAL:   %test failed (exit status 1)" in result.stderr
    assert sorted(os.listdir(out)) == ["host", "recipe.def"]


GPU = """
    Bootstrap: localimage
    From: {base}

    %post
        if [ -e /dev/nvidiactl ]; then echo "post saw nvidia devices"; fi
        if [ -e /dev/kfd ]; then echo "post saw rocm devices"; fi
    """


def gpu_seen(result: subprocess.CompletedProcess[str], vendor: str, maker: str) -> bool:
    """%post saw the vendor's devices (a GPU host), or the nested launcher warned it found none (this one)."""
    return f"post saw {vendor} devices" in result.stdout or any(
        line.startswith("WARNING:") and f"no {maker} GPU devices found" in line for line in result.stderr.splitlines())


@pytest.mark.parametrize(("flag", "vendor", "maker"), [("--nv", "nvidia", "NVIDIA"), ("--rocm", "rocm", "AMD")])
def test_gpu_flags_reach_post(singpy: Singpy, workdir: Path, flag: str, vendor: str, maker: str) -> None:
    out = out_dir(singpy, workdir, f"gpu{flag}")
    recipe = write_recipe(out, GPU.format(base=base_sandbox(workdir)))
    assert gpu_seen(build(singpy, flag, "--sandbox", str(out / "with"), str(recipe)), vendor, maker)
    assert not gpu_seen(build(singpy, "--sandbox", str(out / "without"), str(recipe)), vendor, maker)


def test_nvccli_reaches_post(singpy: Singpy, workdir: Path) -> None:
    """--nvccli is handed to the launcher of %post, which (no nvidia-container-cli on its PATH) says so: the build
    fails with that one line, and leaves no sandbox."""
    out = out_dir(singpy, workdir, "nvccli")
    recipe = write_recipe(out, GPU.format(base=base_sandbox(workdir)))
    if any(os.path.exists(f"{directory}/nvidia-container-cli") for directory in ("/usr/bin", "/bin")):
        pytest.skip("this host has nvidia-container-cli: --nvccli would work here")
    result = singpy.run("build", "--nvccli", "--sandbox", str(out / "with"), str(recipe),
                        env=singpy.env(PATH="/usr/bin:/bin"), timeout=BUILD_TIMEOUT)
    assert result.returncode != 0 and "--nvccli: no executable nvidia-container-cli on PATH" in result.stderr, result
    assert not (out / "with").exists()


def test_compat32_reaches_post(singpy: Singpy, workdir: Path) -> None:
    """--compat32 is handed to the launcher of %post, which (no --nv/--rocm here) says it ignores it."""
    out = out_dir(singpy, workdir, "compat32")
    recipe = write_recipe(out, GPU.format(base=base_sandbox(workdir)))
    warning = "ignoring --compat32, it requires a GPU option such as --nv or --rocm"
    assert warning in build(singpy, "--compat32", "--sandbox", str(out / "with"), str(recipe)).stderr
    assert warning not in build(singpy, "--sandbox", str(out / "without"), str(recipe)).stderr


def test_userns_is_accepted(singpy: Singpy, workdir: Path) -> None:
    out = out_dir(singpy, workdir, "userns")
    recipe = write_recipe(out, FIXED.format(base=base_sandbox(workdir)))
    build(singpy, "--userns", "--sandbox", str(out / "sandbox"), str(recipe))
    assert (out / "sandbox" / "post-made").read_text() == "post\n"


def test_disable_cache_leaves_the_cache_alone(singpy: Singpy, workdir: Path, registry_plain: RegistryServer) -> None:
    registry_plain.upload(base_oci_image(), "flags/nocache")
    out = out_dir(singpy, workdir, "disable-cache")
    cache = out / "cache"
    cache.mkdir(mode=0o700)
    os.chown(cache, singpy.uid, singpy.gid)
    recipe = write_recipe(out, f"""
        Bootstrap: docker
        From: {registry_plain.host}/flags/nocache:latest

        %post
            echo post > /post-made
        """)
    env = singpy.env(SINGPY_CACHEDIR=str(cache))
    build(singpy, "--no-https", "--disable-cache", str(out / "image.sif"), str(recipe), env=env)
    assert singpy.ok("exec", str(out / "image.sif"), "cat", "/etc/base-marker", "/post-made") == "oci base\npost\n"
    build(singpy, "--no-https", "--disable-cache", "--sandbox", str(out / "pulled"),
          f"docker://{registry_plain.host}/flags/nocache:latest", env=env)
    assert (out / "pulled" / "etc" / "base-marker").read_text() == "oci base\n"
    assert os.listdir(cache) == []
    assert sorted(os.listdir(out)) == ["cache", "image.sif", "pulled", "recipe.def"]
    build(singpy, "--no-https", str(out / "cached.sif"), str(recipe), env=env)
    assert os.listdir(cache) != []  # without the flag, the same build fills it


def test_a_singpy_package_where_the_build_runs_is_not_imported(singpy: Singpy, workdir: Path) -> None:
    """The build starts helpers with `python -m singpy...`: a `singpy/` in the working directory (a shared
    directory, /tmp) must not be the one run, as root least of all."""
    out = out_dir(singpy, workdir, "planted-package")
    planted = out / "singpy"
    planted.mkdir()
    marker = out / "imported"
    (planted / "__init__.py").write_text(f"open({str(marker)!r}, 'a').write('planted\\n')\n")
    (planted / "__main__.py").write_text("raise SystemExit(0)\n")
    recipe = write_recipe(out, FIXED.format(base=base_sandbox(workdir)))
    built = out / "built"
    result = singpy.run("build", "--sandbox", str(built), str(recipe), cwd=out, timeout=BUILD_TIMEOUT)
    assert result.returncode == 0, result.stderr
    assert (built / "post-made").read_text() == "post\n"  # %post ran, by the real singpy
    assert not marker.exists()


def test_a_sandbox_given_as_a_link_is_copied_and_post_may_replace_its_script(singpy: Singpy, workdir: Path) -> None:
    """`build --sandbox OUT LINK` copies the sandbox LINK names (not the link: OUT would then be the original);
    a %post that turns its own script into a directory ends the build with a warning, not a traceback."""
    out = out_dir(singpy, workdir, "link-base")
    link = out / "base-link"
    link.symlink_to(base_sandbox(workdir))
    copy = out / "copy"
    build(singpy, "--sandbox", str(copy), str(link))
    assert copy.is_dir() and not copy.is_symlink() and (copy / "bin").is_dir()
    recipe = write_recipe(out, FIXED.format(base=base_sandbox(workdir)).replace(
        "echo post > /post-made", "echo post > /post-made; rm /.post.script; mkdir /.post.script"))
    result = build(singpy, "--sandbox", str(out / "built"), str(recipe))
    assert "Traceback" not in result.stderr and "WARNING: %post replaced /.post.script" in result.stderr
    assert (out / "built" / "post-made").read_text() == "post\n"


KEPT = """
    Bootstrap: localimage
    From: {base}

    %post
        echo kept > /post-made
        exit {status}
    """


@pytest.mark.parametrize(("status", "how"), [(3, "flag"), (0, "variable")], ids=["failing", "succeeding"])
def test_no_cleanup_keeps_the_work_directory_and_says_where(singpy: Singpy, workdir: Path, status: int,
                                                            how: str) -> None:
    """`--no-cleanup` (or APPTAINER_NO_CLEANUP): the stages' trees stay for a look into %post, whatever the outcome,
    with Apptainer's line naming them; the user removes them as docs/build.md says."""
    out = out_dir(singpy, workdir, f"no-cleanup-{status}")
    recipe = write_recipe(out, KEPT.format(base=base_sandbox(workdir), status=status))
    flags, env = (["--no-cleanup"], None) if how == "flag" else ([], singpy.env(APPTAINER_NO_CLEANUP="1"))
    result = singpy.run("build", *flags, str(out / "image.sif"), str(recipe), env=env, timeout=BUILD_TIMEOUT)
    assert result.returncode == (255 if status else 0), result
    assert (out / "image.sif").exists() == (status == 0)
    [kept] = build_dirs(out)
    assert f"INFO:    Build performed with no clean up option, build bundle(s) located at: {out / kept}\n" \
        in result.stderr
    assert [path.read_text() for path in (out / kept).glob("stage*/post-made")] == ["kept\n"]
    removal = ["unshare", "--map-auto", "--map-root-user"] if singpy.uid else []
    subprocess.run([*removal, "rm", "-rf", str(out / kept)], check=True, **singpy.switch())  # type: ignore[call-overload]
    assert build_dirs(out) == []


def test_without_no_cleanup_nothing_is_kept(singpy: Singpy, workdir: Path) -> None:
    out = out_dir(singpy, workdir, "cleanup")
    recipe = write_recipe(out, KEPT.format(base=base_sandbox(workdir), status=3))
    result = singpy.run("build", str(out / "image.sif"), str(recipe), timeout=BUILD_TIMEOUT)
    assert result.returncode == 255 and "no clean up" not in result.stderr, result
    assert build_dirs(out) == []
