"""Capabilities: names, Apptainer's policy for root, and trimming the sets before execve.

Apptainer's model ([1] apptainer.conf, `root default capabilities`; [2]
`apptainer exec --help`): root keeps `full`, `file` (those granted in
capability.json) or `no` capabilities; `--keep-privs` and `--no-privs` replace
that default, then `--add-caps` and `--drop-caps` adjust it. An unprivileged
user gets none, and since singpy is never setuid there is no way to grant
one. `--fakeroot` starts from all of them, valid only in its user namespace.

Applying has two paths, so that a plain `singpy exec` never imports
python-prctl (the hot path, benchmarks/README.md):

* an unprivileged payload (uid != 0 inside) loses its permitted and effective
  sets at execve anyway (capabilities(7), "Transformation of capabilities
  during execve"); only the bounding set must be emptied so that
  /proc/self/status shows zeros: one prctl(PR_CAPBSET_DROP) per capability,
  through ctypes.
* a payload running as uid 0 gets P'(permitted) = P(inheritable) | P(bounding)
  at execve (file sets count as full for root), so both are trimmed, and the
  permitted and effective sets too, with python-prctl. The ambient set needs
  no call: the kernel drops from it whatever leaves the inheritable set.
  no_new_privs (set before) keeps a trimmed root from regaining anything.
"""

from __future__ import annotations

from singpy.errors import ConfigError, SingpyError
from singpy.kernel import syscalls as k
from singpy.plan import Privileges

# capability.h, in number order (CAP_CHOWN is 0, CAP_CHECKPOINT_RESTORE is 40).
NAMES = ("CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
         "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE",
         "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE",
         "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT",
         "CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
         "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG",
         "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF",
         "CAP_CHECKPOINT_RESTORE")
NUMBER = {name: number for number, name in enumerate(NAMES)}


class CapabilityError(SingpyError):
    """A capability name or request that cannot be honoured."""


def parse_names(values: tuple[str, ...] | list[str], flag: str) -> tuple[str, ...]:
    """`CAP_NET_RAW`, `net_raw` or `all`, in comma lists: canonical names in number order."""
    found: set[str] = set()
    for value in values:
        for word in value.split(","):
            word = word.strip()
            if not word:
                continue
            if word.lower() == "all":
                found.update(NAMES)
                continue
            name = word.upper() if word.upper().startswith("CAP_") else "CAP_" + word.upper()
            if name not in NUMBER:
                raise CapabilityError(f"{flag}: unknown capability {word!r}",
                                      hint="names are as in capabilities(7): CAP_NET_RAW or net_raw")
            found.add(name)
    return tuple(sorted(found, key=NUMBER.__getitem__))


def plan_privileges(*, uid: int, fakeroot: bool, keep_privs: bool, no_privs: bool, add: tuple[str, ...],
                    drop: tuple[str, ...], root_default: str, file_caps: tuple[str, ...] = ()) -> Privileges:
    """What the payload keeps; `add`/`drop` are parsed names, `file_caps` capability.json's grant for root."""
    if keep_privs and no_privs:
        raise CapabilityError("--keep-privs and --no-privs cannot be used together")
    if uid != 0 and not fakeroot:
        if keep_privs:
            raise CapabilityError("--keep-privs is for root only: an unprivileged payload has no capabilities")
        if add:
            raise CapabilityError("--add-caps is for root only: singpy is never setuid, so it cannot grant "
                                  "capabilities to an unprivileged user", hint="--fakeroot gives root's "
                                  "capabilities inside the container's user namespace")
        return Privileges(keep=(), as_root=False)
    if keep_privs or (fakeroot and not no_privs):
        base = set(NAMES)
    elif no_privs:
        base = set()
    else:
        base = {"full": set(NAMES), "file": set(file_caps), "no": set()}[root_default]
    keep = (base | set(add)) - set(drop)
    if keep == set(NAMES):
        return Privileges(keep=None, as_root=True)
    return Privileges(keep=tuple(sorted(keep, key=NUMBER.__getitem__)), as_root=True)


def read_capability_file(path: str, user: str) -> tuple[str, ...]:
    """Capabilities capability.json grants `user` (Apptainer's format: {"users": {"root": [...]}}).

    A missing file grants nothing, as in Apptainer before `capability add` is run.
    """
    import json
    import os.path

    from singpy.host.hostfiles import read_text

    if not os.path.lexists(path):
        return ()
    try:  # a regular UTF-8 file of at most 1 MiB (singpy.host.hostfiles), holding JSON
        data = json.loads(read_text(path, what="capability file", error=ConfigError))
    except (ValueError, RecursionError) as error:
        raise ConfigError(f"can't read {path}: not JSON ({error})") from None
    users = data.get("users", {}) if isinstance(data, dict) else None
    granted = users.get(user, []) if isinstance(users, dict) else None
    if not isinstance(granted, list) or not all(isinstance(name, str) for name in granted):
        raise ConfigError(f"{path}: users.{user} must be a list of capability names")
    try:
        return parse_names(granted, path)
    except CapabilityError as error:
        raise ConfigError(error.message) from None


def preload(privileges: Privileges) -> None:
    """Import python-prctl while the host's packages are reachable: `apply` runs after pivot_root."""
    if privileges.keep is not None and privileges.as_root:
        import prctl  # noqa: F401


def apply(privileges: Privileges) -> None:
    """Called in the container root as the last step before execve, after no_new_privs."""
    if privileges.keep is None:
        return
    if not privileges.as_root:
        _drop_bounding_set()
        return
    import prctl

    keep = {NUMBER[name] for name in privileges.keep}
    drop = [number for number in prctl.ALL_CAPS if number not in keep]
    try:
        prctl.capbset.drop(*drop)  # first: it needs CAP_SETPCAP, which the next call may remove
        prctl.set_caps((drop, (prctl.CAP_INHERITABLE, prctl.CAP_PERMITTED, prctl.CAP_EFFECTIVE), False))
    except OSError as error:
        raise SingpyError(f"can't drop capabilities: {error.strerror}") from None


def _drop_bounding_set() -> None:
    """Empty the bounding set; the first number past the kernel's last capability ends the loop."""
    for number in range(64):
        if not k.capbset_drop(number):
            return
