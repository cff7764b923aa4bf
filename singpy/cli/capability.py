"""`singpy capability avail|list|add|drop`: Apptainer's commands over capability.json (singpy.config.capfile),
with its flags, words and output (cmd/internal/cli/capability_linux.go, internal/app/apptainer/capability_*).

Only root edits the file. singpy itself is never setuid: of the grants, it applies root's alone (`root default
capabilities = file`); `add` for anyone else says so, since Apptainer's setuid installation applies them.
"""

from __future__ import annotations

import typer

capability_app = typer.Typer(name="capability", help="Manage the capabilities granted to users and groups "
                             "(capability.json).", no_args_is_help=True)

USER = typer.Option("", "--user", "-u", help="the user to grant the capabilities to (or take them from)",
                    metavar="USER")
GROUP = typer.Option("", "--group", "-g", help="the group to grant the capabilities to (or take them from)",
                     metavar="GROUP")
CAPABILITIES = typer.Argument(..., metavar="CAPABILITIES", help="a comma list: CAP_NET_RAW,sys_admin or all")

# What each capability lets its holder do (capabilities(7), in short).
DESCRIPTIONS = {
    "CAP_CHOWN": "change the owner and group of any file",
    "CAP_DAC_OVERRIDE": "read, write and execute any file, whatever its permissions",
    "CAP_DAC_READ_SEARCH": "read any file and search any directory, whatever their permissions",
    "CAP_FOWNER": "act as the owner of any file (chmod, utimes, ACLs...)",
    "CAP_FSETID": "keep set-user-ID and set-group-ID bits when changing a file",
    "CAP_KILL": "send signals to any process",
    "CAP_SETGID": "change group IDs and supplementary groups",
    "CAP_SETUID": "change user IDs",
    "CAP_SETPCAP": "change capability sets and the bounding set",
    "CAP_LINUX_IMMUTABLE": "set the immutable and append-only file attributes",
    "CAP_NET_BIND_SERVICE": "bind sockets to ports below 1024",
    "CAP_NET_BROADCAST": "broadcast and listen to multicast",
    "CAP_NET_ADMIN": "configure network interfaces, routes and firewalls",
    "CAP_NET_RAW": "use raw and packet sockets (ping, tcpdump)",
    "CAP_IPC_LOCK": "lock memory (mlock, huge pages)",
    "CAP_IPC_OWNER": "bypass the permissions of System V IPC objects",
    "CAP_SYS_MODULE": "load and unload kernel modules",
    "CAP_SYS_RAWIO": "do raw I/O (ioperm, /dev/mem, /dev/kmem)",
    "CAP_SYS_CHROOT": "call chroot and change mount namespaces",
    "CAP_SYS_PTRACE": "trace and inspect any process",
    "CAP_SYS_PACCT": "switch process accounting on and off",
    "CAP_SYS_ADMIN": "administer the system: mount, sethostname, namespaces and much more",
    "CAP_SYS_BOOT": "reboot the host and load a new kernel",
    "CAP_SYS_NICE": "raise priorities and set scheduling policies of any process",
    "CAP_SYS_RESOURCE": "override resource limits and quotas",
    "CAP_SYS_TIME": "set the system clock",
    "CAP_SYS_TTY_CONFIG": "configure terminals (vhangup)",
    "CAP_MKNOD": "create device nodes",
    "CAP_LEASE": "take leases on any file",
    "CAP_AUDIT_WRITE": "write records to the kernel audit log",
    "CAP_AUDIT_CONTROL": "configure kernel auditing",
    "CAP_SETFCAP": "set file capabilities",
    "CAP_MAC_OVERRIDE": "override mandatory access control (Smack)",
    "CAP_MAC_ADMIN": "configure mandatory access control (Smack)",
    "CAP_SYSLOG": "use privileged syslog operations and read kernel addresses",
    "CAP_WAKE_ALARM": "set alarms that wake the system",
    "CAP_BLOCK_SUSPEND": "block system suspend",
    "CAP_AUDIT_READ": "read the audit log through netlink",
    "CAP_PERFMON": "use performance monitoring (perf_event_open)",
    "CAP_BPF": "use privileged BPF operations",
    "CAP_CHECKPOINT_RESTORE": "use checkpoint and restore operations (set_tid, /proc/PID/map_files)",
}


def _path() -> str:
    """capability.json beside the configuration in use, where the launch reads root's grants."""
    import os

    from singpy.config import sysconf

    return os.path.join(sysconf.confdir(sysconf.load(sysconf.default_path(os.environ))), "capability.json")


def _names(text: str) -> tuple[list[str], list[str]]:
    """(known capability names, unknown words) of a comma list; `all` is every capability (Apptainer's Split)."""
    from singpy.kernel.caps import NAMES

    known: list[str] = []
    unknown: list[str] = []
    for word in (part.strip() for part in text.split(",")):
        if not word:
            continue
        if word.lower() == "all":
            known += [name for name in NAMES if name not in known]
            continue
        name = word.upper() if word.upper().startswith("CAP_") else f"CAP_{word.upper()}"
        if name in NAMES:
            known += [name] if name not in known else []
        else:
            unknown.append(word)
    return known, unknown


@capability_app.command("avail")
def avail_command(capabilities: str = typer.Argument("", metavar="[CAPABILITIES]")) -> None:
    """Show the capabilities there are (or those named) and what each lets its holder do."""
    from singpy.console import escape
    from singpy.errors import UsageError
    from singpy.kernel.caps import NAMES

    known, unknown = _names(capabilities)
    if unknown:
        raise UsageError(f"unknown capabilities found in: {escape(','.join(unknown))}")
    for name in known or NAMES:
        print(f"{name + ':':<22} {DESCRIPTIONS[name]}\n")


@capability_app.command("list")
def list_command(name: str = typer.Argument("", metavar="[USER|GROUP]")) -> None:
    """Show the capabilities granted to a user or group, or to all of them."""
    from singpy.config import capfile
    from singpy.console import escape
    from singpy.errors import ConfigError

    grants = capfile.load(_path(), missing_ok=False)
    shown = [(who, part, caps) for part in capfile.PARTS for who, caps in sorted(grants[part].items())
             if caps and (not name or who == name)]
    for who, part, caps in shown:  # a hand-edited file may hold anything: one line per grant, escaped
        print(escape(f"{who} [{part.removesuffix('s')}]: {','.join(caps)}"))
    if not shown:
        raise ConfigError(f"no capability set for user/group {escape(name)}" if name else
                          "no capability set for users or groups")


@capability_app.command("add")
def add_command(capabilities: str = CAPABILITIES, user: str = USER, group: str = GROUP) -> None:
    """Grant capabilities to a user or a group (root only)."""
    _manage(capabilities, user, group, adding=True)


@capability_app.command("drop")
def drop_command(capabilities: str = CAPABILITIES, user: str = USER, group: str = GROUP) -> None:
    """Take capabilities back from a user or a group (root only)."""
    _manage(capabilities, user, group, adding=False)


def _manage(capabilities: str, user: str, group: str, *, adding: bool) -> None:
    """Apptainer's manageCaps: root only, names checked, the user or group must exist, the file written whole."""
    import grp
    import os
    import pwd

    from singpy import console
    from singpy.config import capfile
    from singpy.console import escape
    from singpy.errors import ConfigError, UsageError

    if os.geteuid() != 0:
        raise ConfigError("while managing capability file: only root user can manage capabilities")
    path = _path()
    grants = capfile.load(path, missing_ok=True)
    caps, unknown = _names(capabilities)
    if unknown:
        console.warning(f"Ignoring unknown capabilities: {escape(','.join(unknown))}")
    if not user and not group:
        raise UsageError("no user or group specified")
    for part, who, lookup in (("users", user, pwd.getpwnam), ("groups", group, grp.getgrnam)):
        if not who:
            continue
        try:
            lookup(who)
        except KeyError:
            raise ConfigError(f"while setting capabilities for {part[:-1]} {escape(who)}: {part[:-1]} does not "
                              "exist") from None
        (_add if adding else _drop)(grants[part], who, caps, part[:-1])
    capfile.save(path, grants)
    if adding and user and user != "root" and caps:
        console.info(f"singpy grants capabilities to root alone (it is never setuid): this grant to {escape(user)} "
                     "is for Apptainer's setuid installation, which reads the same file")


def _add(granted: dict[str, list[str]], who: str, caps: list[str], kind: str) -> None:
    from singpy import console

    held = granted.setdefault(who, [])
    for cap in caps:
        if cap in held:
            console.warning(f"Won't add capability '{cap}', already assigned to {kind} {who}")
            continue
        held.append(cap)
        if kind == "user":  # Apptainer's warnings, word for word
            console.warning(f"Adding '{cap}' capability will likely allow user {who} to escalate privilege on the "
                            "host")
            console.warning(f"Use 'singpy capability drop --user {who} {cap}' to reverse this action if necessary")


def _drop(granted: dict[str, list[str]], who: str, caps: list[str], kind: str) -> None:
    from singpy import console
    from singpy.errors import ConfigError

    if who not in granted:
        raise ConfigError(f"while setting capabilities for {kind} {who}: {kind} '{who}' doesn't have any "
                          "capability assigned")
    for cap in caps:
        if cap in granted[who]:
            granted[who].remove(cap)
        else:
            console.warning(f"Won't drop capability '{cap}', not assigned to {kind} {who}")
    if not granted[who]:
        del granted[who]
