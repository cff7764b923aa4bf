"""Bootstrap agents that make a root filesystem with a host tool: debootstrap, yum/dnf, zypper, arch, busybox.

As Apptainer's conveyor packers ([1] internal/pkg/build/sources/conveyorPacker_*.go), from the same
headers (`OSVersion`, `MirrorURL`, `Include`, `UpdateURL`, `Setopt`, `ConfURL`, keys in any case, with
`$INCLUDE` added to `Include`) and with the same command lines:

    debootstrap  debootstrap --variant=minbase --exclude=openssl,udev,debconf-i18n,e2fsprogs
                 --include=apt[,INCLUDE] --arch=ARCH OSVERSION ROOTFS MIRRORURL
    yum, dnf     dnf (else yum) --noplugins -c ROOTFS/etc/bootstrap-yum.conf --installroot ROOTFS
                 --releasever=OSVERSION -y [--setopt SETOPT] install /etc/redhat-release coreutils INCLUDE
                 (the configuration written first from MirrorURL and UpdateURL, %{OSVERSION} replaced)
    zypper       zypper --root ROOTFS ar MIRRORURL repo; zypper --root ROOTFS --gpg-auto-import-keys refresh;
                 [the same for UpdateURL, as `update`]; zypper --non-interactive -c ROOTFS/etc/zypp/zypp.conf
                 --root ROOTFS --releasever=OSVERSION -n install --auto-agree-with-licenses
                 --download-in-advance aaa_base INCLUDE
    arch         pacstrap -C PACMAN.CONF -c -G -M ROOTFS haveged INCLUDE|base (the configuration from
                 ConfURL), then in arch-chroot: pacman-key --init, --populate archlinux, haveged removed
    busybox      the binary at MirrorURL as /bin/busybox, `busybox --install /bin` run inside the new root

`check` refuses a stage before anything is fetched or written: a missing header, or a host tool that is
not installed (one FATAL line naming the Debian package that brings it). The tools run as root: real root,
or for a user root of the build's user namespace with the user's subordinate ids (the owners that dpkg
and rpm give must exist), always in a mount namespace of their own (singpy.recipe.osns), so that what
they mount (debootstrap mounts /proc in the new root) ends with them. The downloaded busybox is never run
on the host: it runs in the container being built, as %post does.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from singpy import console
from singpy.errors import ImageError
from singpy.plan import IdMap
from singpy.recipe.deffile import DefinitionError, Stage

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from singpy.recipe.sections import Runner

# The Debian package that brings each host tool, named when the tool is missing.
PACKAGES = {"debootstrap": "debootstrap", "dnf": "dnf", "rpm": "rpm", "zypper": "zypper",
            "pacstrap": "arch-install-scripts", "arch-chroot": "arch-install-scripts"}
_TOOLS = {"debootstrap": ("debootstrap",), "yum": ("dnf", "rpm"), "dnf": ("dnf", "rpm"), "zypper": ("zypper",),
          "arch": ("pacstrap", "arch-chroot"), "busybox": ()}
_REQUIRED = {"debootstrap": ("mirrorurl", "osversion"), "yum": ("mirrorurl",), "dnf": ("mirrorurl",),
             "zypper": ("mirrorurl",), "arch": (), "busybox": ("mirrorurl",)}
DEBIAN_ARCHS = {"amd64": "amd64", "arm64": "arm64", "386": "i386", "arm": "armhf", "ppc64le": "ppc64el",
                "s390x": "s390x", "riscv64": "riscv64", "mips64le": "mips64el", "loong64": "loong64"}
YUM_CONF = "/etc/bootstrap-yum.conf"
ZYPP_CONF = "/etc/zypp/zypp.conf"
PACMAN_CONF_URL = "https://gitlab.archlinux.org/archlinux/packaging/packages/pacman/-/raw/main/pacman.conf"
_OSVERSION = re.compile(r"%\{OSVERSION\}", re.IGNORECASE)
_RPM_DBPATHS = ("/var/lib/rpm", "/usr/lib/sysimage/rpm")
_MAX_DOWNLOAD = 256 << 20  # a busybox binary or a pacman.conf: far less
_TIMEOUT = 60.0
_DOWNLOAD_DEADLINE = 3600  # seconds for a whole download, however slowly the server sends it
SBIN = "/usr/sbin:/sbin"


def headers(stage: Stage, env: Mapping[str, str]) -> dict[str, str]:
    """The stage's header (lower-case keys, stripped values), `$INCLUDE` added to `Include` as Apptainer."""
    found = {key: value.strip() for key, value in stage.header}
    include = f"{found.get('include', '')} {env.get('INCLUDE', '')}".strip()
    found["include"] = " ".join(include.replace(",", " ").split())
    return found


def check(stage: Stage, where: str, env: Mapping[str, str]) -> None:
    """A missing header or host tool, one error before anything is fetched (`where`: file:line of the stage)."""
    agent = stage.get("bootstrap").strip().lower()
    found = headers(stage, env)
    for key in _REQUIRED[agent]:
        if not found.get(key):
            raise DefinitionError(f"{where}: Bootstrap: {agent} needs a {_HEADER_NAMES[key]}: header")
    if agent in ("yum", "dnf", "zypper") and _uses_osversion(found) and not found.get("osversion"):
        raise DefinitionError(f"{where}: Bootstrap: {agent}: %{{OSVERSION}} in a URL but no OSVersion: header")
    if agent == "arch" and _machine() != "amd64":
        raise ImageError(f"Bootstrap: arch: {_machine()} is not supported (pacstrap builds amd64 only)")
    if agent == "debootstrap" and _machine() not in DEBIAN_ARCHS:
        raise ImageError(f"Bootstrap: debootstrap: no Debian architecture is known for {_machine()}")
    tools(agent, env)


_HEADER_NAMES = {"mirrorurl": "MirrorURL", "osversion": "OSVersion"}


def check_ids(stages: tuple[Stage, ...], idmap: IdMap | None) -> None:
    """A package manager gives files to other users: as a user, only with a subordinate id range."""
    if idmap is None or idmap.helper:
        return
    for stage in stages:
        agent = stage.get("bootstrap").strip().lower()
        if agent in _TOOLS and agent != "busybox":
            raise ImageError(f"Bootstrap: {agent} as a user needs a subordinate id range (the packages' files "
                             "belong to other users): ask the administrator for one in /etc/subuid and "
                             "/etc/subgid, or build as root")


def _uses_osversion(found: Mapping[str, str]) -> bool:
    return any(_OSVERSION.search(found.get(key, "")) for key in ("mirrorurl", "updateurl"))


def tools(agent: str, env: Mapping[str, str], *, sbin: str = SBIN) -> dict[str, str]:
    """The host programs the agent runs, found on PATH then `sbin` (debootstrap lives there, and a user's
    PATH often lacks it): one error naming the Debian package of a missing one."""
    from singpy.host.hostfiles import which

    path = ":".join(part for part in (env.get("PATH", "") or "/usr/bin:/bin", sbin) if part)
    found = {}
    for name in _TOOLS[agent]:
        program = which(name, path) or (which("yum", path) if name == "dnf" else None)
        if program is None:
            what = "dnf or yum" if name == "dnf" else name
            raise ImageError(f"Bootstrap: {agent} needs {what} on this host, which is not installed: install "
                             f"the {PACKAGES[name]} package (apt-get install {PACKAGES[name]})")
        found[name] = program
    return found


def _machine() -> str:
    from singpy.image.detect import host_arch

    return host_arch()


# --- the command lines (pure) ----------------------------------------------------------------------------------------


def debootstrap_argv(program: str, found: Mapping[str, str], rootfs: str, arch: str) -> list[str]:
    include = ",".join(["apt", *found["include"].split()])
    return [program, "--variant=minbase", "--exclude=openssl,udev,debconf-i18n,e2fsprogs", f"--include={include}",
            f"--arch={DEBIAN_ARCHS[arch]}", found["osversion"], rootfs, found["mirrorurl"]]


def yum_config(found: Mapping[str, str], gpg: bool) -> str:
    """Apptainer's generated yum/dnf configuration: the base repository, and `updates` with UpdateURL."""
    check = f"gpgcheck={int(gpg)}\n"
    text = ("[main]\ncachedir=/var/cache/yum-bootstrap\nkeepcache=0\ndebuglevel=2\nlogfile=/var/log/yum.log\n"
            f"syslog_device=/dev/null\nexactarch=1\nobsoletes=1\n{check}plugins=1\nreposdir=0\ndeltarpm=0\n\n"
            f"[base]\nname=Linux $releasever - $basearch\nbaseurl={_url(found, 'mirrorurl')}\nenabled=1\n{check}")
    if found.get("updateurl"):
        text += (f"[updates]\nname=Linux $releasever - $basearch updates\nbaseurl={_url(found, 'updateurl')}\n"
                 f"enabled=1\n{check}\n")
    return text


def yum_argv(program: str, found: Mapping[str, str], rootfs: str) -> list[str]:
    argv = [program, "--noplugins", "-c", f"{rootfs}{YUM_CONF}", "--installroot", rootfs,
            f"--releasever={found.get('osversion', '')}", "-y"]
    if found.get("setopt"):
        argv += ["--setopt", found["setopt"]]
    return [*argv, "install", "/etc/redhat-release", "coreutils", *found["include"].split()]


def zypper_argvs(program: str, found: Mapping[str, str], rootfs: str) -> list[list[str]]:
    argvs = [[program, "--root", rootfs, "ar", _url(found, "mirrorurl"), "repo"],
             [program, "--root", rootfs, "--gpg-auto-import-keys", "refresh"]]
    if found.get("updateurl"):
        argvs += [[program, "--root", rootfs, "ar", "-f", _url(found, "updateurl"), "update"],
                  [program, "--root", rootfs, "--gpg-auto-import-keys", "refresh", "-r", "update"]]
    return [*argvs, [program, "--non-interactive", "-c", f"{rootfs}{ZYPP_CONF}", "--root", rootfs,
                     f"--releasever={found.get('osversion', '')}", "-n", "install", "--auto-agree-with-licenses",
                     "--download-in-advance", "aaa_base", *found["include"].split()]]


def arch_argvs(found: Mapping[str, str], programs: Mapping[str, str], rootfs: str, conf: str) -> list[list[str]]:
    chroot = programs["arch-chroot"]
    return [[programs["pacstrap"], "-C", conf, "-c", "-G", "-M", rootfs, "haveged",
             *(found["include"].split() or ["base"])],
            [chroot, rootfs, "/bin/sh", "-c", "haveged -w 1024; pacman-key --init; pacman-key --populate archlinux"],
            [chroot, rootfs, "pacman", "-Rs", "--noconfirm", "haveged"]]


def _url(found: Mapping[str, str], key: str) -> str:
    return _OSVERSION.sub(found.get("osversion", ""), found.get(key, ""))


# --- running them ----------------------------------------------------------------------------------------------------


def bootstrap(stage: Stage, rootfs: str, *, env: Mapping[str, str], idmap: IdMap | None, work: str,
              runner: Runner) -> None:
    """Make the stage's root filesystem `rootfs` (which must not exist) with its agent."""
    agent = stage.get("bootstrap").strip().lower()
    found = headers(stage, env)
    programs = tools(agent, env)
    os.mkdir(rootfs, 0o755)
    console.info(f"Bootstrapping {agent} into the root filesystem")
    # a user's build (or one already in the build's user namespace) can't mount proc or make device nodes
    fake = "fake" if idmap is not None or runner.in_namespace else ""
    if agent == "debootstrap":
        _run(debootstrap_argv(programs["debootstrap"], found, rootfs, _machine()), rootfs, idmap, env, agent,
             setup=fake)
    elif agent in ("yum", "dnf"):
        _check_rpm_dbpath(programs["rpm"], env)
        _write(rootfs, YUM_CONF, yum_config(found, gpg=bool(env.get("GPG"))))
        _run(yum_argv(programs["dnf"], found, rootfs), rootfs, idmap, env, agent, setup="devices")
        _remove(rootfs, "var/cache/yum-bootstrap")
    elif agent == "zypper":
        _write(rootfs, ZYPP_CONF, "[main]\ncachedir=/var/cache/zypp-bootstrap\n\n")
        for argv in zypper_argvs(programs["zypper"], found, rootfs):
            _run(argv, rootfs, idmap, env, agent, setup="devices", ok=(107,) if "install" in argv else ())
    elif agent == "arch":
        conf = f"{work}/pacman-{os.path.basename(rootfs)}.conf"  # one per stage
        _download(found.get("confurl") or PACMAN_CONF_URL, conf)
        for argv in arch_argvs(found, programs, rootfs, conf):
            _run(argv, rootfs, idmap, env, agent, setup=fake)
    else:
        _busybox(found["mirrorurl"], rootfs, runner)
    os.chmod(rootfs, 0o755)


def _run(argv: list[str], rootfs: str, idmap: IdMap | None, env: Mapping[str, str], agent: str, *,
         setup: str = "", ok: tuple[int, ...] = ()) -> None:
    """One host command as root in a mount namespace of its own (singpy.recipe.osns); `setup` "fake": for a
    user, mount and mknod do nothing and the host's /dev nodes are bound in the new root, as Apptainer's
    fakeroot; "devices": those nodes alone."""
    import sys

    from singpy.recipe import osns, sections

    prefix = [sys.executable, "-P", "-m", "singpy.recipe.osns", *osns.arguments(idmap, rootfs, setup=setup), "--"]
    status = sections.run_program([*prefix, *argv], env=_tool_env(env), what=f"Bootstrap: {agent}",
                                  ok=(0, *ok))
    if status in ok and status != 0:
        console.warning(f"Bootstrap succeeded, some RPM scripts failed ({os.path.basename(argv[0])} exit {status})")


def _tool_env(env: Mapping[str, str]) -> dict[str, str]:
    """The caller's environment, PATH with sbin (where the tools and the programs they call live)."""
    path = env.get("PATH", "") or "/usr/bin:/bin"
    return {**env, "PATH": f"{path}:{SBIN}", "LC_ALL": "C"}


def _check_rpm_dbpath(rpm: str, env: Mapping[str, str]) -> None:
    """Apptainer's check: the host's rpm must keep its database where the new root's will be."""
    import subprocess

    said = subprocess.run([rpm, "--eval", "%{_dbpath}"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          check=False, env=_tool_env(env))
    dbpath = said.stdout.strip()
    if said.returncode != 0 or dbpath not in _RPM_DBPATHS:
        from singpy.console import escape

        raise ImageError(f"the host's rpm database is using a non-standard path: {escape(dbpath) or '(none)'} "
                         "(a Debian or Ubuntu host): put the lines '%_var /var' and '%_dbpath %{_var}/lib/rpm' "
                         "in ~/.rpmmacros and build again")
    if dbpath != "/var/lib/rpm":
        console.warning(f"the host's rpm uses the database path {dbpath}: bootstrapping older distributions, "
                        "which use /var/lib/rpm, will fail")


def _write(rootfs: str, guest: str, text: str) -> None:
    """A configuration file in the new (still empty) root, made by the build itself."""
    path = f"{rootfs}{guest}"
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    with open(path, "x") as handle:
        handle.write(text)


def _remove(rootfs: str, relative: str) -> None:
    from singpy.image import trees

    try:
        trees.remove(f"{rootfs}/{relative}")
    except OSError as error:
        console.verbose(f"can't remove /{relative} from the new root: {error.strerror}")


def _busybox(url: str, rootfs: str, runner: Runner) -> None:
    """Apptainer's busybox agent: /etc/passwd, /etc/group and /etc/hosts, the binary, its applets in /bin."""
    from singpy.oci.convert import install_base
    from singpy.recipe import sections

    for guest, text in (("/etc/passwd", "root:!:0:0:root:/root:/bin/sh"), ("/etc/group", " root:x:0:"),
                        ("/etc/hosts", "127.0.0.1   localhost localhost.localdomain localhost4 "
                         "localhost4.localdomain4")):
        _write(rootfs, guest, text)
    os.mkdir(f"{rootfs}/bin", 0o755)
    _download(url, f"{rootfs}/bin/busybox")
    os.chmod(f"{rootfs}/bin/busybox", 0o755)
    os.symlink("busybox", f"{rootfs}/bin/sh")  # the launcher's /bin/sh, until the applets are installed
    install_base(rootfs)  # the launcher's mount points and scripts (Apptainer's base environment)
    console.info("Installing the busybox applets (busybox --install /bin, inside the container)")
    sections.run_in_container(rootfs, runner, ["/bin/busybox", "--install", "/bin"], what="Bootstrap: busybox")


def _download(url: str, path: str) -> None:
    """`url` to the new file `path`: one ImageError for any failure, the partial file removed."""
    import http.client
    import time
    import urllib.error
    import urllib.request

    from singpy.console import escape

    if not url.startswith(("http://", "https://")):
        raise ImageError(f"{escape(url)}: MirrorURL/ConfURL must be an http:// or https:// URL")
    console.info(f"Downloading {escape(url)}")
    try:
        with open(path, "xb") as out:
            request = urllib.request.Request(url, headers={"User-Agent": "singpy (apptainer-compatible)"})
            with urllib.request.urlopen(request, timeout=_TIMEOUT) as response:
                expected = int(response.headers.get("Content-Length") or -1)
                written, deadline = 0, time.monotonic() + _DOWNLOAD_DEADLINE
                while chunk := response.read(1 << 20):
                    written += len(chunk)
                    if written > _MAX_DOWNLOAD:
                        raise ValueError(f"more than {_MAX_DOWNLOAD >> 20} MiB")
                    if time.monotonic() > deadline:  # a server trickling bytes: each read within the timeout
                        raise ValueError(f"not received in {_DOWNLOAD_DEADLINE // 60} minutes")
                    out.write(chunk)
        if expected >= 0 and written != expected:
            raise ValueError(f"the file received is {written} bytes, not the {expected} announced")
    except urllib.error.HTTPError as error:
        _unlink(path)
        raise ImageError(f"can't get {escape(url)}: the server answered {error.code} {escape(str(error.reason))}") \
            from None
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as error:  # a malformed answer
        _unlink(path)
        reason = error.reason if isinstance(error, urllib.error.URLError) else getattr(error, "strerror", "") or error
        raise ImageError(f"can't download {escape(url)}: {escape(str(reason))}") from None


def _unlink(path: str) -> None:
    import contextlib

    with contextlib.suppress(OSError):
        os.unlink(path)
