"""Hosts that refuse user namespaces, mounts or FUSE: one FATAL line naming the cause and the fix.

The restriction is built for each singpy run by tests/support/seccomp.py: a
seccomp filter makes unshare(CLONE_NEWUSER) or mount(2) fail with the errno a
restricted kernel gives, and the sysctl values that explain it (RHEL 7's
user.max_user_namespaces = 0, Debian's kernel.unprivileged_userns_clone = 0,
Ubuntu's kernel.apparmor_restrict_unprivileged_userns = 1) are shown in
/proc/sys in a private mount namespace. Nothing on the host changes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from singpy.constants import SYSTEM_PATH
from singpy.host import hostcheck
from tests.conftest import SINGPY, Singpy, assert_one_fatal
from tests.support import hostsim, seccomp, sifs
from tests.support.leftovers import settled, traces


@pytest.fixture(scope="module", autouse=True)
def _seccomp_available() -> None:
    problem = seccomp.available()
    if problem:
        pytest.skip(problem)


def needs_root() -> None:
    """Simulating a sysctl or /dev/fuse binds files in a mount namespace made as root."""
    if os.geteuid() != 0:
        pytest.skip("simulating host settings needs root (the suite is not running as root)")


def restricted(runner: Singpy, workdir: Path, *args: str, env: dict[str, str] | None = None,
               deny: dict[str, str] | None = None, sysctls: dict[str, str] | None = None,
               fuse: str | None = None, binds: dict[str, str] | None = None,
               nnp: bool = False) -> subprocess.CompletedProcess[str]:
    """`singpy ARGS` as the profile's user, on the host the wrapper emulates."""
    scratch = workdir / f".seccomp-{uuid.uuid4().hex[:12]}"
    scratch.mkdir(mode=0o755)
    try:
        prefix = seccomp.wrapper(runner.uid, runner.gid, str(scratch), deny=deny, sysctls=sysctls, fuse=fuse,
                                 binds=binds, nnp=nnp)
        return subprocess.run([*prefix, SINGPY, *args], env=runner.env() if env is None else env,
                              cwd=str(workdir), capture_output=True, text=True, timeout=60, check=False)
    finally:
        scratch.rmdir()  # its tmpfs went with the wrapper's mount namespace


def assert_fails_cleanly(runner: Singpy, workdir: Path, image: Path, message: str, *flags: str,
                         env: dict[str, str] | None = None, deny: dict[str, str] | None = None,
                         sysctls: dict[str, str] | None = None, fuse: str | None = None,
                         binds: dict[str, str] | None = None, nnp: bool = False) -> subprocess.CompletedProcess[str]:
    """`singpy exec FLAGS IMAGE true` on the emulated host: one FATAL line holding `message`, nothing left."""
    before = traces(image, workdir)
    result = restricted(runner, workdir, "exec", *flags, str(image), "true", env=env, deny=deny, sysctls=sysctls,
                        fuse=fuse, binds=binds, nnp=nnp)
    assert_one_fatal(result, message)
    assert settled(before, image, workdir) == before
    return result


NO_USERNS = {"unshare": "ENOSPC"}
USERNS_REFUSED = {"unshare": "EPERM"}


def test_max_user_namespaces_zero(as_user: Singpy, image: Path, workdir: Path) -> None:
    """RHEL 7's default: the sysctl is 0 and unshare says "No space left on device"."""
    needs_root()
    result = assert_fails_cleanly(as_user, workdir, image, "can't create a user namespace: user namespaces are "
                                  "disabled on this host (user.max_user_namespaces = 0)",
                                  deny=NO_USERNS, sysctls={"user.max_user_namespaces": "0"})
    assert "sysctl -w user.max_user_namespaces=15000" in result.stderr
    assert "/etc/sysctl.d" in result.stderr
    assert "No space left on device" not in result.stderr


def test_max_user_namespaces_exhausted(as_user: Singpy, image: Path, workdir: Path) -> None:
    needs_root()
    result = assert_fails_cleanly(as_user, workdir, image, "the host's limit of user namespaces is reached "
                                  "(user.max_user_namespaces = 3)",
                                  deny=NO_USERNS, sysctls={"user.max_user_namespaces": "3"})
    assert "can raise it: `sysctl -w user.max_user_namespaces=15000`" in result.stderr


def test_unprivileged_userns_clone_zero(as_user: Singpy, image: Path, workdir: Path) -> None:
    """Older Debian and Ubuntu kernels: kernel.unprivileged_userns_clone = 0 and unshare says EPERM."""
    needs_root()
    result = assert_fails_cleanly(as_user, workdir, image, "unprivileged user namespaces are disabled on this "
                                  "host (kernel.unprivileged_userns_clone = 0)",
                                  deny=USERNS_REFUSED, sysctls={"kernel.unprivileged_userns_clone": "0"})
    assert "sysctl -w kernel.unprivileged_userns_clone=1" in result.stderr


def test_seccomp_refuses_unshare(as_user: Singpy, image: Path, workdir: Path) -> None:
    """Docker's default profile: a seccomp filter, said as such (and the container, where singpy runs in one)."""
    needs_root()
    result = assert_fails_cleanly(as_user, workdir, image, "can't create a user namespace: a seccomp filter "
                                  "refuses it", deny=USERNS_REFUSED,
                                  sysctls={"kernel.unprivileged_userns_clone": "1",
                                           "kernel.apparmor_restrict_unprivileged_userns": "0"})
    inside = hostcheck.container()
    if inside:
        assert f"inside a {inside} container" in result.stderr
        assert "--security-opt seccomp=unconfined" in result.stderr
    else:
        assert "Seccomp: 2 in /proc/self/status" in result.stderr


def test_fakeroot_says_the_same(as_user: Singpy, image: Path, workdir: Path) -> None:
    """--fakeroot unshares in its own code path (a newuidmap helper may be forked first): the same diagnosis."""
    needs_root()
    assert_fails_cleanly(as_user, workdir, image, "user namespaces are disabled on this host "
                         "(user.max_user_namespaces = 0)", "--fakeroot",
                         deny=NO_USERNS, sysctls={"user.max_user_namespaces": "0"})


def test_root_with_userns(as_root: Singpy, image: Path, workdir: Path) -> None:
    """Root makes no user namespace unless asked (--userns): then the same diagnosis."""
    needs_root()
    assert_fails_cleanly(as_root, workdir, image, "user namespaces are disabled on this host "
                         "(user.max_user_namespaces = 0)", "--userns",
                         deny=NO_USERNS, sysctls={"user.max_user_namespaces": "0"})
    ok = restricted(as_root, workdir, "exec", str(image), "true", deny=NO_USERNS,
                    sysctls={"user.max_user_namespaces": "0"})
    assert ok.returncode == 0, ok.stderr  # without --userns root needs none


@pytest.mark.parametrize("errno_name", ["EPERM", "EACCES"])
def test_apparmor_restriction(as_user: Singpy, image: Path, workdir: Path, errno_name: str) -> None:
    """Ubuntu 24.04: the namespace is made, then the first mount in it is refused; AppArmor is named."""
    needs_root()
    result = assert_fails_cleanly(as_user, workdir, image, "AppArmor restricts unprivileged user namespaces on "
                                  "this host (kernel.apparmor_restrict_unprivileged_userns = 1",
                                  deny={"mount": errno_name},
                                  sysctls={"kernel.apparmor_restrict_unprivileged_userns": "1"})
    assert f"granting `userns,` to {hostcheck.python_binary()}" in result.stderr
    assert "can't change the mount flags of /" in result.stderr


def test_refused_mount_without_apparmor(as_user: Singpy, image: Path, workdir: Path) -> None:
    """Without the AppArmor sysctl, a refused mount is not blamed on it."""
    needs_root()
    result = assert_fails_cleanly(as_user, workdir, image, "can't change the mount flags of /: Operation not "
                                  "permitted", deny={"mount": "EPERM"},
                                  sysctls={"kernel.apparmor_restrict_unprivileged_userns": "0"})
    assert "AppArmor" not in result.stderr


def test_hint_at_verbose(as_user: Singpy, image: Path, workdir: Path) -> None:
    needs_root()
    result = restricted(as_user, workdir, "-v", "exec", str(image), "true", deny=NO_USERNS,
                        sysctls={"user.max_user_namespaces": "0"})
    assert result.returncode == 255
    assert "HINT:    run `singpy check`" in result.stderr


# --- --fakeroot's newuidmap ----------------------------------------------------------------------------------------


def subids_for(runner: Singpy, workdir: Path) -> dict[str, str]:
    """Binds giving the user a subordinate range in private copies of /etc/subuid and /etc/subgid."""
    for public in hostsim.SUBID_FILES:
        if not os.path.exists(public):
            pytest.skip(f"{public} does not exist: nothing to bind over")
    subuid, subgid = hostsim.subid_copies(runner.user, runner.uid, f"{runner.user}:200000:65536",
                                          str(workdir / f"restricted-{uuid.uuid4().hex[:8]}"))
    return {"/etc/subuid": subuid, "/etc/subgid": subgid}


def newuidmap() -> str:
    found = shutil.which("newuidmap", path=SYSTEM_PATH)
    if found is None:
        pytest.skip("newuidmap is not installed (Debian package uidmap)")
    return found


def test_newuidmap_under_no_new_privs(as_user: Singpy, image: Path, workdir: Path) -> None:
    """A setuid newuidmap gains nothing under no_new_privs: said, instead of newuidmap's bare EPERM."""
    needs_root()
    newuidmap()
    assert_fails_cleanly(as_user, workdir, image, "newuidmap is setuid, and this process may not gain privileges "
                         "(NoNewPrivs: 1 in /proc/self/status", "--fakeroot", binds=subids_for(as_user, workdir),
                         nnp=True)


def test_newuidmap_not_setuid(as_user: Singpy, image: Path, workdir: Path) -> None:
    """A newuidmap that lost its setuid bit (a copy, an unpacked tarball): reinstall its package."""
    needs_root()
    real = newuidmap()
    plain = workdir / f"newuidmap-plain-{uuid.uuid4().hex[:8]}"
    shutil.copy(real, plain)
    plain.chmod(0o755)
    try:
        assert_fails_cleanly(as_user, workdir, image, f"{real} is neither setuid root nor has file capabilities; "
                             "reinstall it: install package uidmap (Debian, Ubuntu) or shadow-utils (RHEL, Fedora)",
                             "--fakeroot", binds={**subids_for(as_user, workdir), real: str(plain)})
    finally:
        plain.unlink()


# --- FUSE and the programs singpy runs ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sif(workdir: Path) -> Path:
    return sifs.singpy_sif(workdir)


def only_squashfuse(workdir: Path) -> Path:
    """A PATH directory holding squashfuse alone (no unsquashfs): FUSE is the only way left."""
    path = workdir / "path-squashfuse-only"
    if not path.exists():
        path.mkdir()
        for name in ("squashfuse_ll", "squashfuse"):
            found = subprocess.run(["sh", "-c", f"command -v {name}"], capture_output=True, text=True, check=False)
            if found.returncode == 0:
                (path / name).symlink_to(found.stdout.strip())
    if not any(path.iterdir()):
        pytest.skip("squashfuse is not installed (Debian package squashfuse)")
    return path


@pytest.mark.parametrize(("state", "message"), [("absent", "/dev/fuse does not exist"),
                                                ("600", "/dev/fuse is not readable and writable by you (its mode is "
                                                        "600)")])
def test_fuse_unusable_without_unsquashfs(as_user: Singpy, sif: Path, workdir: Path, state: str,
                                          message: str) -> None:
    needs_root()
    cache = sifs.new_cache(as_user, workdir, f"fuse-{state}")
    env = as_user.env(PATH=str(only_squashfuse(workdir)), SINGPY_CACHEDIR=str(cache))
    result = assert_fails_cleanly(as_user, workdir, sif, f"no way to open a squashfs image here: FUSE is not "
                                  f"usable: {message}", env=env, fuse=state)
    assert ", and unsquashfs is not installed (not found in PATH); " in result.stderr
    assert "install package squashfs-tools (Debian, Ubuntu, RHEL, Fedora) to extract images, or make FUSE " \
           "usable: " in result.stderr
    assert sifs.entries(cache) == []


def test_no_squashfs_tools(as_user: Singpy, sif: Path, workdir: Path) -> None:
    """Neither squashfuse nor unsquashfs: both packages are named."""
    empty = workdir / "path-empty"
    empty.mkdir(exist_ok=True)
    cache = sifs.new_cache(as_user, workdir, "no-tools-named")
    before = traces(sif, workdir)
    result = as_user.run("exec", str(sif), "true", env=as_user.env(PATH=str(empty), SINGPY_CACHEDIR=str(cache)))
    assert_one_fatal(result, "squashfuse and unsquashfs are not installed (not found in PATH)")
    assert "install package squashfs-tools (Debian, Ubuntu, RHEL, Fedora) to extract images, or install package " \
           "squashfuse" in result.stderr
    assert settled(before, sif, workdir) == before


def test_apparmor_on_the_uid_map_write(as_user: Singpy, workdir: Path) -> None:
    """The other step AppArmor's restriction breaks: the uid_map write after the unshare is named the same way.

    A map the kernel refuses (uid 0 to someone else's uid) stands for the refusal, through singpy's own code.
    """
    needs_root()
    script = ("import sys\nfrom singpy.errors import KernelError\nfrom singpy.kernel import syscalls as k\n"
              "from singpy.kernel.idmap import write_proc_file\nk.unshare(k.CLONE_NEWUSER)\n"
              "try:\n    write_proc_file('/proc/self/uid_map', '0 0 1\\n')\n"
              "except KernelError as error:\n    sys.exit(error.message)\n")
    scratch = workdir / f".seccomp-{uuid.uuid4().hex[:12]}"
    scratch.mkdir(mode=0o755)
    try:
        prefix = seccomp.wrapper(as_user.uid, as_user.gid, str(scratch),
                                 sysctls={"kernel.apparmor_restrict_unprivileged_userns": "1"})
        result = subprocess.run([*prefix, sys.executable, "-c", script], env=as_user.env(), cwd=str(workdir),
                                capture_output=True, text=True, timeout=60, check=False)
    finally:
        scratch.rmdir()
    assert result.returncode == 1
    assert result.stderr.startswith("can't write /proc/self/uid_map: Operation not permitted: AppArmor restricts "
                                    "unprivileged user namespaces on this host"), result.stderr


def test_build_says_it_once(as_user: Singpy, sif: Path, workdir: Path) -> None:
    """`singpy build` on a SIF base enters the build's user namespace itself (singpy.recipe.layered): the same
    diagnosis, one FATAL line, no output and no work directory."""
    needs_root()
    out = workdir / f"restricted-build-{uuid.uuid4().hex[:8]}"
    out.mkdir()
    os.chown(out, as_user.uid, as_user.gid)
    recipe = out / "recipe.def"
    recipe.write_text(f"Bootstrap: localimage\nFrom: {sif}\n\n%post\n    true\n")
    before = traces(sif, workdir)
    result = restricted(as_user, workdir, "-q", "build", str(out / "image.sif"), str(recipe), deny=NO_USERNS,
                        sysctls={"user.max_user_namespaces": "0"})
    assert_one_fatal(result, "user namespaces are disabled on this host (user.max_user_namespaces = 0)")
    assert sorted(os.listdir(out)) == ["recipe.def"]
    assert settled(before, sif, workdir) == before
