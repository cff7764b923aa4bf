"""The OS bootstrap agents' headers, checks and command lines, as Apptainer's conveyor packers build them
(singpy.recipe.osbootstrap), `build --section` (singpy.recipe.sections.selected) and `--fix-perms`
(singpy.recipe.fixperms) on real trees."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from singpy.errors import ImageError
from singpy.recipe import fixperms, osbootstrap, sections
from singpy.recipe.bootstrap import check
from singpy.recipe.deffile import DefinitionError, Stage, parse


def stage(text: str) -> Stage:
    return parse(text, "/defs/app.def").stages[0]


def tool_dir(tmp_path: Path, *names: str) -> str:
    """A PATH directory with an executable of each name (what `which` finds), nothing else."""
    where = tmp_path / "bin"
    where.mkdir()
    for name in names:
        (where / name).write_text("#!/bin/sh\n")
        (where / name).chmod(0o755)
    return str(where)


DEBIAN = "Bootstrap: debootstrap\nOSVersion: bookworm\nMirrorURL: http://deb.debian.org/debian\nInclude: vim git\n"


def test_debootstrap_command_line_is_apptainers() -> None:
    found = osbootstrap.headers(stage(DEBIAN), {"INCLUDE": "curl"})
    assert osbootstrap.debootstrap_argv("/usr/sbin/debootstrap", found, "/w/stage0", "amd64") == [
        "/usr/sbin/debootstrap", "--variant=minbase", "--exclude=openssl,udev,debconf-i18n,e2fsprogs",
        "--include=apt,vim,git,curl", "--arch=amd64", "bookworm", "/w/stage0", "http://deb.debian.org/debian"]


@pytest.mark.parametrize(("arch", "debian"), [("arm64", "arm64"), ("386", "i386"), ("ppc64le", "ppc64el"),
                                              ("arm", "armhf")])
def test_debootstrap_names_architectures_as_debian(arch: str, debian: str) -> None:
    found = osbootstrap.headers(stage(DEBIAN.replace("Include: vim git\n", "")), {})
    argv = osbootstrap.debootstrap_argv("debootstrap", found, "/r", arch)
    assert f"--arch={debian}" in argv and "--include=apt" in argv


YUM = """Bootstrap: yum
OSVersion: 9
MirrorURL: http://dl.rockylinux.org/pub/rocky/%{OSVERSION}/BaseOS/x86_64/os/
UpdateURL: http://dl.rockylinux.org/pub/rocky/%{osversion}/AppStream/x86_64/os/
Include: dnf vim-minimal
Setopt: install_weak_deps=False
"""


def test_yum_command_line_and_configuration() -> None:
    found = osbootstrap.headers(stage(YUM), {})
    assert osbootstrap.yum_argv("/usr/bin/dnf", found, "/w/s") == [
        "/usr/bin/dnf", "--noplugins", "-c", "/w/s/etc/bootstrap-yum.conf", "--installroot", "/w/s",
        "--releasever=9", "-y", "--setopt", "install_weak_deps=False", "install", "/etc/redhat-release",
        "coreutils", "dnf", "vim-minimal"]
    config = osbootstrap.yum_config(found, gpg=False)
    assert "baseurl=http://dl.rockylinux.org/pub/rocky/9/BaseOS/x86_64/os/\n" in config
    assert "[updates]\n" in config and "rocky/9/AppStream" in config
    assert "gpgcheck=0\n" in config and "gpgcheck=1" not in config and "reposdir=0\n" in config


def test_zypper_command_lines() -> None:
    text = "Bootstrap: zypper\nOSVersion: 15.6\nMirrorURL: http://download.opensuse.org/distribution/leap/" \
           "%{OSVERSION}/repo/oss/\nInclude: zypper\n"
    argvs = osbootstrap.zypper_argvs("zypper", osbootstrap.headers(stage(text), {}), "/r")
    assert argvs == [
        ["zypper", "--root", "/r", "ar", "http://download.opensuse.org/distribution/leap/15.6/repo/oss/", "repo"],
        ["zypper", "--root", "/r", "--gpg-auto-import-keys", "refresh"],
        ["zypper", "--non-interactive", "-c", "/r/etc/zypp/zypp.conf", "--root", "/r", "--releasever=15.6", "-n",
         "install", "--auto-agree-with-licenses", "--download-in-advance", "aaa_base", "zypper"]]


def test_arch_command_lines_default_to_base() -> None:
    found = osbootstrap.headers(stage("Bootstrap: arch\n"), {})
    programs = {"pacstrap": "/usr/bin/pacstrap", "arch-chroot": "/usr/bin/arch-chroot"}
    first, keys, cleanup = osbootstrap.arch_argvs(found, programs, "/r", "/w/pacman.conf")
    assert first == ["/usr/bin/pacstrap", "-C", "/w/pacman.conf", "-c", "-G", "-M", "/r", "haveged", "base"]
    assert keys[:3] == ["/usr/bin/arch-chroot", "/r", "/bin/sh"] and "pacman-key --init" in keys[-1]
    assert cleanup == ["/usr/bin/arch-chroot", "/r", "pacman", "-Rs", "--noconfirm", "haveged"]


@pytest.mark.parametrize(("text", "message"), [
    ("Bootstrap: debootstrap\nOSVersion: bookworm\n", "Bootstrap: debootstrap needs a MirrorURL: header"),
    ("Bootstrap: debootstrap\nMirrorURL: http://x/\n", "Bootstrap: debootstrap needs a OSVersion: header"),
    ("Bootstrap: yum\nMirrorURL: http://x/%{OSVERSION}/\n", "%{OSVERSION} in a URL but no OSVersion"),
    ("Bootstrap: busybox\n", "Bootstrap: busybox needs a MirrorURL: header"),
])
def test_missing_headers_name_the_file_and_line(text: str, message: str) -> None:
    with pytest.raises(DefinitionError) as error:
        check(stage(text), "/defs/app.def", {"PATH": "/nonexistent"})
    assert error.value.message.startswith("/defs/app.def:1: ") and message in error.value.message


@pytest.mark.parametrize(("agent", "package"), [("debootstrap", "debootstrap"), ("yum", "dnf"), ("dnf", "dnf"),
                                              ("zypper", "zypper"), ("arch", "arch-install-scripts")])
def test_a_missing_host_tool_names_its_debian_package(tmp_path: Path, agent: str, package: str) -> None:
    with pytest.raises(ImageError) as error:
        osbootstrap.tools(agent, {"PATH": tool_dir(tmp_path)}, sbin="")
    assert f"install the {package} package (apt-get install {package})" in error.value.message
    assert error.value.message.startswith(f"Bootstrap: {agent} needs ")


def test_yum_agent_takes_yum_when_dnf_is_missing_and_needs_rpm(tmp_path: Path) -> None:
    only_yum = tool_dir(tmp_path, "yum", "rpm")
    assert osbootstrap.tools("yum", {"PATH": only_yum}, sbin="")["dnf"] == f"{only_yum}/yum"
    no_rpm = tmp_path / "norpm"
    no_rpm.mkdir()
    (no_rpm / "dnf").write_text("#!/bin/sh\n")
    (no_rpm / "dnf").chmod(0o755)
    with pytest.raises(ImageError, match="install the rpm package"):
        osbootstrap.tools("dnf", {"PATH": str(no_rpm)}, sbin="")


def test_tools_are_found_in_sbin_off_the_path(tmp_path: Path) -> None:
    sbin = tool_dir(tmp_path, "debootstrap")
    assert osbootstrap.tools("debootstrap", {"PATH": "/nonexistent"}, sbin=sbin) == \
        {"debootstrap": f"{sbin}/debootstrap"}


def test_unknown_agent_lists_the_os_agents() -> None:
    with pytest.raises(DefinitionError) as error:
        check(stage("Bootstrap: pacman\n"), "/defs/app.def")
    assert "debootstrap" in error.value.message and "zypper" in error.value.message


SECTIONS = """Bootstrap: scratch
%setup
    s
%files
    a /a
%files from build
    /b /b
%post
    p
%environment
    e
%runscript
    r
%test
    t
%labels
    L 1
%appinstall one
    i
"""


@pytest.mark.parametrize(("wanted", "kept"), [
    (("all",), ["setup", "files", "files", "post", "environment", "runscript", "test", "labels", "appinstall"]),
    (("none",), []),
    (("post", "labels"), ["post", "labels", "appinstall"]),
    (("files",), ["files", "files", "appinstall"]),
])
def test_section_selection(wanted: tuple[str, ...], kept: list[str]) -> None:
    chosen = sections.selected(stage(SECTIONS), wanted)
    assert [section.name for section in chosen.sections if section.body.strip()] == kept


def test_fix_perms_gives_the_owner_rwx_and_keeps_other_bits(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "locked" / "deeper").mkdir(parents=True)
    (root / "locked" / "deeper" / "file").write_text("x")
    (root / "locked" / "run").write_text("#!/bin/sh\n")
    (root / "link").symlink_to("/etc/passwd")
    (root / "locked" / "run").chmod(0o055)
    (root / "locked" / "deeper" / "file").chmod(0o044)
    (root / "locked" / "deeper").chmod(0o055)
    (root / "locked").chmod(0o000)
    before = os.stat("/etc/passwd").st_mode
    assert fixperms.fix(str(root)) == 0
    modes = {path.relative_to(root).as_posix(): stat.S_IMODE(path.lstat().st_mode) for path in root.rglob("*")
             if not path.is_symlink()}
    assert modes == {"locked": 0o700, "locked/deeper": 0o755, "locked/deeper/file": 0o644, "locked/run": 0o655}
    assert os.stat("/etc/passwd").st_mode == before  # a link is never followed
