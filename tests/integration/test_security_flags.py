"""--security: seccomp profiles (OCI/Docker JSON), uid:/gid: (root), apparmor:/selinux: where the host has them.

The filter is the payload's alone: a profile that denies unshare(2) and
mount(2) leaves singpy's own start-up (namespaces, dozens of mounts)
untouched, and the container then cannot do either. Cases that write use
--contain: /tmp is then the container's own tmpfs. Every case runs as root
and as the test user.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support.seccomp_profiles import deny, profile_file


def test_seccomp_errno_rule(singpy: Singpy, image: Path, workdir: Path) -> None:
    profile = profile_file(workdir, "no-mkdir", deny(["mkdir", "mkdirat"], errnoRet=13))  # EACCES
    result = singpy.run("exec", "--contain", "--security", f"seccomp:{profile}", str(image),
                        "sh", "-c", "mkdir /tmp/seccomp-$$; echo status=$?; touch /tmp/seccomp-$$; echo touched=$?; "
                        "rm -f /tmp/seccomp-$$")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "status=1\ntouched=0\n"
    assert "Permission denied" in result.stderr  # the profile's errnoRet, not EPERM


def test_seccomp_argument_conditions(singpy: Singpy, image: Path, workdir: Path) -> None:
    """Apptainer's own test profile: fchmod with mode 0777 denied, any other mode allowed."""
    profile = profile_file(workdir, "no-777", deny(["chmod", "fchmod", "fchmodat"],
                                                   args=[{"index": 1, "value": 0o777, "op": "SCMP_CMP_EQ"}]))
    out = singpy.ok("exec", "--contain", "--security", f"seccomp:{profile}", str(image), "sh", "-c",
                    "f=/tmp/seccomp-$$; touch $f; chmod 777 $f; echo a=$?; chmod 700 $f; echo b=$?; rm -f $f")
    assert out == "a=1\nb=0\n"


def test_seccomp_kill_process(singpy: Singpy, image: Path, workdir: Path) -> None:
    profile = profile_file(workdir, "kill-mkdir", {"defaultAction": "SCMP_ACT_ALLOW",
                                                   "syscalls": [{"names": ["mkdir", "mkdirat"],
                                                                 "action": "SCMP_ACT_KILL_PROCESS"}]})
    out = singpy.ok("exec", "--contain", "--security", f"seccomp:{profile}", str(image), "sh", "-c",
                    "mkdir /tmp/seccomp-$$ 2>/dev/null; echo status=$?")
    assert out == "status=159\n"  # 128 + SIGSYS


def test_seccomp_filters_the_payload_not_the_start_up(singpy: Singpy, image: Path, workdir: Path) -> None:
    """singpy mounts /proc, /dev, binds and pivots under the same profile: only the payload is filtered."""
    profile = profile_file(workdir, "no-mount", deny(["mount", "umount2", "pivot_root", "unshare"]))
    out = singpy.ok("exec", "--pid", "--security", f"seccomp:{profile}", str(image), "sh", "-c",
                    "unshare -m true 2>/dev/null; echo unshare=$?; "
                    "grep -c Seccomp:.*2 /proc/self/status")
    assert out == "unshare=1\n1\n"  # unshare(2) denied; the filter mode (2) is the payload's, inherited


def test_seccomp_from_the_environment(singpy: Singpy, image: Path, workdir: Path) -> None:
    profile = profile_file(workdir, "no-mkdir-env", deny(["mkdir", "mkdirat"]))
    env = singpy.env(APPTAINER_SECURITY=f"seccomp:{profile}")
    out = singpy.ok("exec", "--contain", str(image), "sh", "-c", "mkdir /tmp/seccomp-$$ 2>/dev/null; echo status=$?",
                    env=env)
    assert out == "status=1\n"


def test_seccomp_includes_and_excludes(singpy: Singpy, image: Path, workdir: Path) -> None:
    """Docker's profile keys: a rule for another architecture, or for capabilities the payload lacks, is left out."""
    profile = profile_file(workdir, "conditional", {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
        {"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO", "includes": {"arches": ["s390x"]}},
        {"names": ["rmdir"], "action": "SCMP_ACT_ERRNO", "excludes": {"caps": ["CAP_SYS_ADMIN"]}},
    ]})
    out = singpy.ok("exec", "--contain", "--security", f"seccomp:{profile}", str(image), "sh", "-c",
                    "d=/tmp/seccomp-$$; mkdir $d; echo mkdir=$?; rmdir $d 2>/dev/null; echo rmdir=$?")  # /tmp: a tmpfs
    rmdir = "0" if singpy.uid == 0 else "1"  # root holds CAP_SYS_ADMIN: the rule is excluded for it
    assert out == f"mkdir=0\nrmdir={rmdir}\n"


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "not JSON"),
    ({"syscalls": []}, "a defaultAction must be provided"),
    ({"defaultAction": "SCMP_ACT_MAYBE"}, "invalid action 'SCMP_ACT_MAYBE' specified"),
    ({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"action": "SCMP_ACT_ERRNO"}]},
     "no syscall specified for the rule"),
    ({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["chmod"], "action": "SCMP_ACT_ERRNO",
                                                       "args": [{"index": 7, "value": 1, "op": "SCMP_CMP_EQ"}]}]},
     "the maximum index of syscall arguments is 6"),
    ({"defaultAction": "SCMP_ACT_ALLOW", "architectures": ["SCMP_ARCH_NOPE"]}, "invalid architecture"),
])
def test_bad_profiles_are_one_fatal_line(singpy: Singpy, image: Path, workdir: Path, content: object,
                                         message: str) -> None:
    profile = profile_file(workdir, f"bad-{abs(hash(str(content)))}", content)
    result = singpy.run("exec", "--contain", "--security", f"seccomp:{profile}", str(image), "true")
    assert_one_fatal(result, message)


def test_missing_profile(singpy: Singpy, image: Path, workdir: Path) -> None:
    result = singpy.run("exec", "--security", f"seccomp:{workdir}/no-such-profile.json", str(image), "true")
    assert_one_fatal(result, "no-such-profile.json")


def test_dry_run_shows_the_profile(singpy: Singpy, image: Path, workdir: Path) -> None:
    profile = profile_file(workdir, "dry", deny(["mkdir"], errnoRet=13))
    plan = json.loads(singpy.ok("exec", "--dry-run", "--security", f"seccomp:{profile}", str(image), "true"))["plan"]
    assert plan["process"]["security"]["seccomp"] == {
        "profile": str(profile), "default_action": "SCMP_ACT_ALLOW", "default_errno": 1, "architectures": [],
        "rules": [{"names": ["mkdir"], "action": "SCMP_ACT_ERRNO", "errno": 13, "args": []}]}


def test_uid_and_gid_as_root(as_root: Singpy, image: Path) -> None:
    out = as_root.ok("exec", "--security", "uid:1234,gid:2345:27", str(image), "sh", "-c",
                     "id -u; id -g; id -G; grep CapEff /proc/self/status")
    uid, gid, groups, caps = out.splitlines()
    assert (uid, gid, sorted(groups.split())) == ("1234", "2345", ["2345", "27"])
    assert caps.split()[1] == "0000000000000000"  # no longer root: no capability left


def test_uid_alone_keeps_roots_group_as_apptainer(as_root: Singpy, image: Path) -> None:
    assert as_root.ok("exec", "--security", "uid:1234", str(image), "sh", "-c", "id -u; id -g") == "1234\n0\n"
    assert as_root.ok("exec", "--security", "gid:2345", str(image), "sh", "-c", "id -u; id -g") == "0\n2345\n"


def test_uid_as_a_user_is_refused(as_user: Singpy, image: Path) -> None:
    for spec, feature in (("uid:0", "uid"), ("gid:0", "gid")):
        result = as_user.run("exec", "--security", spec, str(image), "true")
        assert_one_fatal(result, f"--security {feature}: needs root: singpy is never setuid")


@pytest.mark.parametrize("spec", ["uid:abc", "uid:-1", "gid:1:x", "uid:1:2", "uid:4294967295"])
def test_bad_ids(as_root: Singpy, image: Path, spec: str) -> None:
    assert_one_fatal(as_root.run("exec", "--security", spec, str(image), "true"), "bad --security", code=1)


@pytest.mark.skipif(os.path.exists("/sys/module/apparmor/parameters/enabled"), reason="this host has AppArmor")
def test_apparmor_where_the_host_has_none(singpy: Singpy, image: Path) -> None:
    result = singpy.run("exec", "--security", "apparmor:docker-default", str(image), "true")
    assert_one_fatal(result, "apparmor requested, but is not enabled or supported on this system")


@pytest.mark.skipif(os.path.exists("/sys/fs/selinux/enforce"), reason="this host has SELinux")
def test_selinux_where_the_host_has_none(singpy: Singpy, image: Path) -> None:
    result = singpy.run("exec", "--security", "selinux:system_u:system_r:container_t:s0", str(image), "true")
    assert_one_fatal(result, "selinux requested, but is not enabled or supported on this system")


def test_apparmor_and_selinux_together(singpy: Singpy, image: Path) -> None:
    result = singpy.run("exec", "--security", "apparmor:a", "--security", "selinux:b", str(image), "true")
    assert_one_fatal(result, "you can't specify both an apparmor profile and a selinux label")


@pytest.mark.parametrize(("spec", "message"), [("bogus:1", "unknown --security feature 'bogus'"),
                                               ("seccomp", "bad --security 'seccomp': expected seccomp:VALUE")])
def test_bad_specs_are_usage_errors(singpy: Singpy, image: Path, spec: str, message: str) -> None:
    assert_one_fatal(singpy.run("exec", "--security", spec, str(image), "true"), message, code=1)
