"""--security: a seccomp filter, the payload's ids, its AppArmor profile or SELinux context (Apptainer's flag).

Each value is FEATURE:ARG, comma lists allowed as in Apptainer (a string
slice): `seccomp:PROFILE.json`, `uid:N`, `gid:N[:N...]`, `apparmor:PROFILE`,
`selinux:CONTEXT`; the first value of a feature wins, as Apptainer's
GetParam ([1] internal/pkg/security/security.go).

* seccomp: the profile is an OCI/Docker seccomp profile ([2] containers/
  common seccomp.json; Apptainer reads it with containers-golang):
  `defaultAction`, `architectures` (or `archMap`), `syscalls` with `names`
  (or `name`), `action`, `errnoRet`, `args` and the `includes`/`excludes`
  of `arches` and `caps`. It is read here, at plan time, into the plan
  (`SeccompFilter`), compiled to BPF on the host by libseccomp
  (singpy.kernel.seccomp, `prepare`) and installed as the very last step
  before execve (`apply`), so that it filters the payload and nothing of
  singpy's own start-up. Unlike Apptainer, which returns EPERM for every
  SCMP_ACT_ERRNO, a rule's `errnoRet` is honoured (Docker's profile returns
  ENOSYS for clone3 that way: glibc then falls back to clone).
* uid / gid: root only. singpy is never setuid, and a user's namespace maps
  only their own id, so there is nothing else a user could become. The
  container's /etc/passwd and /etc/group then get the target's entries, as
  Apptainer writes them (`target_identity`).
* apparmor / selinux: only where the host's kernel has them enabled, else one
  FATAL line (Apptainer's words); both at once are refused, as in Apptainer.
"""

from __future__ import annotations

import os

from singpy.errors import SingpyError, UsageError
from singpy.host.hostfiles import shown
from singpy.plan import SeccompFilter, SeccompRule, SecuritySpec

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from singpy.host.host import HostInfo

FEATURES = ("seccomp", "apparmor", "selinux", "uid", "gid")
ACTIONS = ("SCMP_ACT_KILL", "SCMP_ACT_KILL_THREAD", "SCMP_ACT_KILL_PROCESS", "SCMP_ACT_TRAP", "SCMP_ACT_ERRNO",
           "SCMP_ACT_TRACE", "SCMP_ACT_ALLOW", "SCMP_ACT_LOG")
OPERATORS = ("SCMP_CMP_NE", "SCMP_CMP_LT", "SCMP_CMP_LE", "SCMP_CMP_EQ", "SCMP_CMP_GE", "SCMP_CMP_GT",
             "SCMP_CMP_MASKED_EQ")
EPERM = 1
_APPARMOR_ENABLED = "/sys/module/apparmor/parameters/enabled"
_SELINUX_FS = "/sys/fs/selinux"
_PROFILE_LIMIT = 4 << 20  # bytes: Docker's default profile is 20 KiB


class SecurityError(SingpyError):
    """A --security feature that cannot be honoured here."""


def plan_security(values: tuple[str, ...], *, uid: int, kept_caps: tuple[str, ...] | None) -> SecuritySpec | None:
    """The --security values as a SecuritySpec (None without any); `kept_caps`: the payload's (None: all)."""
    if not values:
        return None
    params = _params(values)
    spec = SecuritySpec(apparmor=params.get("apparmor", ""), selinux=params.get("selinux", ""))
    if "uid" in params or "gid" in params:
        if uid != 0:
            feature = "uid" if "uid" in params else "gid"
            raise SecurityError(f"--security {feature}: needs root: singpy is never setuid, and your user namespace "
                                "maps only your own ids", hint="run it as root, or use --fakeroot to be root inside")
        spec = spec.replace(uid=_ids(params["uid"], "uid")[0] if "uid" in params else None,
                            gids=_ids(params["gid"], "gid") if "gid" in params else ())
    if spec.apparmor and spec.selinux:
        raise SecurityError("you can't specify both an apparmor profile and a selinux label")
    if spec.apparmor and not _apparmor_enabled():
        raise SecurityError("apparmor requested, but is not enabled or supported on this system",
                            hint=f"{_APPARMOR_ENABLED} does not say Y: this kernel runs without AppArmor")
    if spec.selinux and not _selinux_on():
        raise SecurityError("selinux requested, but is not enabled or supported on this system",
                            hint=f"no SELinux file system at {_SELINUX_FS}: this kernel runs without SELinux")
    if "seccomp" in params:
        spec = spec.replace(seccomp=read_profile(os.path.abspath(params["seccomp"]), uid=uid, kept_caps=kept_caps))
    return spec


def target_identity(spec: SecuritySpec, host: HostInfo) -> tuple[tuple[str, int, int, str, str],
                                                                 tuple[tuple[int, str], ...]] | None:
    """Whose entries the container's /etc/passwd and /etc/group get under uid:/gid: (root only), as Apptainer's
    setUserInfo(useTargetIDs) and addIdentityMount: uid N's host entry (name, uid, gid, gecos, shell), or root's
    own with gid: alone; the groups gid: names, else the entry's primary group, each where the host names it
    ((gid, name) pairs). None where uid N has no host entry: Apptainer then writes neither file (a warning)."""
    from singpy.host.host import account, group_names

    if spec.uid:
        found = account(spec.uid)
        if found is None:
            return None
        name, gid, gecos, shell = found
    else:  # gid: alone: the launcher's own entry, root's
        name, gid, gecos, shell = host.user, host.gid, host.gecos, host.shell
    wanted = list(dict.fromkeys(spec.gids)) or [gid]
    names = group_names(wanted)
    return (name, spec.uid or 0, gid, gecos, shell), tuple((number, names[number]) for number in wanted
                                                           if number in names)


def recorded(values: tuple[str, ...]) -> tuple[str, ...]:
    """The values as an instance's record keeps them for the commands that join it: one per feature, the
    seccomp profile's path made absolute (a join runs from another directory)."""
    params = _params(values)
    if "seccomp" in params:
        params["seccomp"] = os.path.abspath(params["seccomp"])
    return tuple(f"{feature}:{arg}" for feature, arg in params.items())


def _params(values: tuple[str, ...]) -> dict[str, str]:
    """FEATURE -> ARG, the first of each feature winning (Apptainer's GetParam); unknown features refused."""
    params: dict[str, str] = {}
    for value in values:
        for item in value.split(","):
            feature, sep, arg = item.strip().partition(":")
            if not item.strip():
                continue
            if feature not in FEATURES:
                raise UsageError(f"unknown --security feature {shown(feature)!r}: use {', '.join(FEATURES)}")
            if not sep or not arg:  # Apptainer warns and goes on with nothing; an empty value asks for nothing
                raise UsageError(f"bad --security {shown(item)!r}: expected {feature}:VALUE")
            params.setdefault(feature, arg)
    return params


def _ids(text: str, what: str) -> tuple[int, ...]:
    """`N` or `N:M:...`, each a 32-bit id (Apptainer's ParseUint(id, 10, 32)); (uid)_4294967295 is not an id."""
    ids = []
    for word in text.split(":"):
        if not word.isdigit() or not word.isascii() or int(word) >= 0xFFFFFFFF:
            raise UsageError(f"bad --security {what}:{shown(text)}: failed to parse provided {what.upper()}")
        ids.append(int(word))
    if what == "uid" and len(ids) > 1:
        raise UsageError(f"bad --security uid:{shown(text)}: one user id")
    return tuple(ids)


def _apparmor_enabled() -> bool:
    try:
        with open(_APPARMOR_ENABLED) as handle:
            return handle.read().strip() == "Y"
    except OSError:
        return False


def _selinux_on() -> bool:
    return os.path.exists(os.path.join(_SELINUX_FS, "enforce"))


def read_profile(path: str, *, uid: int, kept_caps: tuple[str, ...] | None) -> SeccompFilter:
    """An OCI/Docker seccomp profile (untrusted JSON) as a SeccompFilter; a bad one is one FATAL line."""
    import json

    from singpy.host.hostfiles import read_text

    where = f"seccomp profile {shown(path)}"
    try:
        data = json.loads(read_text(path, what="seccomp profile", error=SecurityError, limit=_PROFILE_LIMIT))
    except (ValueError, RecursionError) as error:
        raise SecurityError(f"can't read {where}: not JSON ({error})") from None
    if not isinstance(data, dict):
        raise SecurityError(f"{where}: not a JSON object")
    default, default_errno = _action(data, "defaultAction", "defaultErrnoRet", where)
    architectures = _architectures(data, where)
    rules = []
    for index, entry in enumerate(_list(data.get("syscalls"), f"{where}: syscalls")):
        rule = _rule(entry, f"{where}: syscalls[{index}]", uid=uid, kept_caps=kept_caps)
        if rule is not None:
            rules.append(rule)
    return SeccompFilter(profile=path, default_action=default, default_errno=default_errno,
                         architectures=architectures, rules=tuple(rules))


def _action(entry: dict[str, object], key: str, errno_key: str, where: str) -> tuple[str, int]:
    action = entry.get(key)
    if not isinstance(action, str) or not action:
        raise SecurityError(f"{where}: a {key} must be provided")
    if action not in ACTIONS:
        raise SecurityError(f"{where}: invalid action {shown(action)!r} specified")
    errno = entry.get(errno_key, EPERM)
    if errno is None:
        errno = EPERM
    if not isinstance(errno, int) or isinstance(errno, bool) or not 0 <= errno <= 0xFFFF:
        raise SecurityError(f"{where}: {errno_key} must be an error number")
    return action, errno


def _architectures(data: dict[str, object], where: str) -> tuple[str, ...]:
    names = [*_list(data.get("architectures"), f"{where}: architectures")]
    for entry in _list(data.get("archMap"), f"{where}: archMap"):
        if isinstance(entry, dict):
            names += [entry.get("architecture"), *_list(entry.get("subArchitectures"), f"{where}: archMap")]
    if not all(isinstance(name, str) and name.isascii() and name.startswith("SCMP_ARCH_") for name in names):
        raise SecurityError(f"{where}: architectures are SCMP_ARCH_ names")
    return tuple(dict.fromkeys(name for name in names if isinstance(name, str)))


def _rule(entry: object, where: str, *, uid: int, kept_caps: tuple[str, ...] | None) -> SeccompRule | None:
    """One entry of `syscalls`, or None when its includes/excludes leave it out for this payload."""
    if not isinstance(entry, dict):
        raise SecurityError(f"{where}: not a JSON object")
    names = [*_list(entry.get("names"), f"{where}: names")]
    if isinstance(entry.get("name"), str):
        names.append(entry["name"])
    if not names or not all(isinstance(name, str) and name for name in names):
        raise SecurityError(f"{where}: no syscall specified for the rule")
    if not all(isinstance(name, str) and name.isascii() and name.isprintable() for name in names):  # C strings
        raise SecurityError(f"{where}: a syscall name is not printable ASCII")
    action, errno = _action(entry, "action", "errnoRet", where)
    if not _applies(entry, uid=uid, kept_caps=kept_caps, where=where):
        return None
    args = []
    for arg in _list(entry.get("args"), f"{where}: args"):
        if not isinstance(arg, dict):
            raise SecurityError(f"{where}: args: not JSON objects")
        index, value, value_two, op = arg.get("index"), arg.get("value", 0), arg.get("valueTwo", 0), arg.get("op")
        if not (isinstance(index, int) and 0 <= index < 6):
            raise SecurityError(f"{where}: the maximum index of syscall arguments is 6: given {index}")
        if op not in OPERATORS:
            raise SecurityError(f"{where}: invalid operator encountered {shown(str(op))}")
        if not all(isinstance(number, int) and 0 <= number < 1 << 64 for number in (value, value_two)):
            raise SecurityError(f"{where}: argument values are 64-bit unsigned numbers")
        assert isinstance(value, int) and isinstance(value_two, int)  # checked just above
        args.append((index, str(op), value, value_two))
    return SeccompRule(names=tuple(str(name) for name in names), action=action, errno=errno, args=tuple(args))


def _applies(entry: dict[str, object], *, uid: int, kept_caps: tuple[str, ...] | None, where: str) -> bool:
    """containers-golang's includes/excludes: `arches` against this machine, `caps` against the payload's."""
    from singpy.kernel.seccomp import native_arch_names

    arches = native_arch_names()
    held = _held_caps(uid, kept_caps)
    for key, wanted in (("includes", True), ("excludes", False)):
        section = entry.get(key) or {}
        if not isinstance(section, dict):
            raise SecurityError(f"{where}: {key} is not a JSON object")
        listed_arches = _list(section.get("arches"), f"{where}: {key}.arches")
        if listed_arches and bool(arches & set(map(str, listed_arches))) != wanted:
            return False
        listed_caps = _list(section.get("caps"), f"{where}: {key}.caps")
        if listed_caps:
            has = all(str(cap).upper() in held for cap in listed_caps) if wanted else \
                any(str(cap).upper() in held for cap in listed_caps)
            if has != wanted:
                return False
    return True


def _held_caps(uid: int, kept: tuple[str, ...] | None) -> set[str] | frozenset[str]:
    """The capabilities the payload has: none for a user; root's kept ones (None: all)."""
    if uid != 0:
        return set()
    if kept is None:
        from singpy.kernel.caps import NUMBER

        return frozenset(NUMBER)
    return set(kept)


def _list(value: object, where: str) -> list[object]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise SecurityError(f"{where} is not a JSON list")
    return value


def prepare(spec: SecuritySpec | None) -> None:
    """On the host, before any namespace: compile the seccomp filter (libseccomp is out of reach later)."""
    if spec is not None and spec.seccomp is not None:
        from singpy.kernel import seccomp

        seccomp.compile_filter(spec.seccomp)


def apply_ids(spec: SecuritySpec | None) -> bool:
    """In the container, before the capabilities are trimmed: gid:, uid:; whether the payload left root."""
    if spec is None or (spec.uid is None and not spec.gids):
        return False
    try:
        if spec.gids:  # as Apptainer's starter: the first is the group; several are the supplementary groups too
            os.setresgid(spec.gids[0], spec.gids[0], spec.gids[0])
            if len(spec.gids) > 1:
                os.setgroups(list(spec.gids))
        if spec.uid is not None:
            os.setresuid(spec.uid, spec.uid, spec.uid)
    except OSError as error:
        raise SecurityError(f"can't set the ids asked with --security: {error.strerror}") from None
    return spec.uid is not None and spec.uid != 0


def apply_last(spec: SecuritySpec | None) -> None:
    """The last step before execve: the AppArmor profile or SELinux context of the exec, then seccomp."""
    if spec is None:
        return
    if spec.apparmor:
        _write_attr(("/proc/self/attr/apparmor/exec", "/proc/self/attr/exec"), f"exec {spec.apparmor}",
                    f"apparmor profile {shown(spec.apparmor)}")
    if spec.selinux:
        _write_attr(("/proc/self/attr/exec",), spec.selinux, f"selinux context {shown(spec.selinux)}")
    if spec.seccomp is not None:
        from singpy.kernel import seccomp

        seccomp.install()


def _write_attr(paths: tuple[str, ...], value: str, what: str) -> None:
    """What the next execve runs under: the LSM's attribute file of this thread (the first that exists)."""
    error: OSError | None = None
    for path in paths:
        try:
            with open(path, "w") as handle:
                handle.write(value)
            return
        except FileNotFoundError as missing:
            error = error or missing
        except OSError as failure:
            error = failure
            break
    reason = error.strerror if error is not None else "no attribute file"
    raise SecurityError(f"can't apply the {what}: {reason}")
