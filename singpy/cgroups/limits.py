"""The limits as asked: Apptainer's flags, or its TOML file (the OCI LinuxResources layout), as one dict.

Both come from the user and the file may come from anyone: every key is
checked against the layout (`SCHEMA`), every number against its range, and
every string that ends up in a cgroup file against the characters it may
hold, before anything is written (singpy.cgroups.files turns the dict into
writes). The flags follow Apptainer's cmd/internal/cli/cgroups.go: the same
ranges, units and messages.
"""

from __future__ import annotations

import os
import re
import stat

from singpy.errors import SingpyError, UsageError

Limits = dict[str, object]  # the OCI LinuxResources layout, with Apptainer's TOML key names

_U16, _U32, _U64 = (0, 1 << 16), (0, 1 << 32), (0, 1 << 64)
_I64 = (-(1 << 63), 1 << 63)
_CPU_LIST = re.compile(r"[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*")  # cpuset lists: 0-3,7
_PAGE_SIZE = re.compile(r"[0-9]+[KMG]B")  # hugetlb.<size>: 2MB, 1GB
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")  # an interface or RDMA device name
_UNIFIED_KEY = re.compile(r"[a-z0-9_]+\.[a-z0-9_.]+")  # a cgroup v2 file: no path, no dot-dot
# Of the core `cgroup.*` files, the limits only: cgroup.procs would move any process into the container's cgroup
# (where removing it kills it); cgroup.kill, cgroup.subtree_control, cgroup.type... are not limits either.
_CORE_LIMITS = frozenset(("cgroup.max.depth", "cgroup.max.descendants"))
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?) ?([kKmMgGtTpP])?[iI]?[bB]?")  # docker's go-units RAMInBytes
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}

_DEVICE = {"major": _I64, "minor": _I64, "weight": _U16, "leafWeight": _U16}
_THROTTLE = {"major": _I64, "minor": _I64, "rate": _U64}
# key: a range (an integer), bool, str, a regex (a string matching it), a dict (a table), [dict] (an array of tables),
# ("map", spec) (a table of any keys, each value matching spec)
SCHEMA: dict[str, object] = {
    "memory": {"limit": _I64, "reservation": _I64, "swap": _I64, "kernel": _I64, "kernelTCP": _I64,
               "swappiness": _U64, "disableOOMKiller": bool},
    "cpu": {"shares": _U64, "quota": _I64, "period": _U64, "realtimeRuntime": _I64, "realtimePeriod": _U64,
            "cpus": _CPU_LIST, "mems": _CPU_LIST},
    "pids": {"limit": _I64},
    "blockIO": {"weight": _U16, "leafWeight": _U16, "weightDevice": [_DEVICE],
                "throttleReadBpsDevice": [_THROTTLE], "throttleWriteBpsDevice": [_THROTTLE],
                "throttleReadIOPSDevice": [_THROTTLE], "throttleWriteIOPSDevice": [_THROTTLE]},
    "hugepageLimits": [{"pageSize": _PAGE_SIZE, "limit": _U64}],
    "network": {"classID": _U32, "priorities": [{"name": _NAME, "priority": _U32}]},
    "devices": [{"allow": bool, "type": re.compile("[abc]"), "major": _I64, "minor": _I64,
                 "access": re.compile("[rwm]{1,3}")}],
    "rdma": ("map", {"hcaHandles": _U32, "hcaObjects": _U32}),
    "unified": ("map", re.compile(r"[ -~]{0,4096}")),
}


def requested(limits: tuple[tuple[str, object], ...]) -> tuple[Limits, str]:
    """The limits of a launch's flags (singpy.launch.request.LIMIT_OPTIONS) and where they come from."""
    values = dict(limits)
    toml_file = values.pop("apply_cgroups", None)
    asked = from_flags(values)
    if asked and toml_file:
        raise UsageError("cannot apply a cgroups TOML file while using limit flags")
    if isinstance(toml_file, str):
        return load_toml(toml_file), f"--apply-cgroups {toml_file}"
    return asked, "the limit flags"


def load_toml(path: str) -> Limits:
    """Apptainer's cgroups TOML file, checked key by key (an unknown key is an error, not ignored)."""
    import tomllib

    from singpy.host.hostfiles import read_text

    text = read_text(path, what="cgroups file", error=SingpyError)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise SingpyError(f"cgroups file {path}: {error}") from None
    except RecursionError:  # arrays or inline tables nested thousands deep
        raise SingpyError(f"cgroups file {path}: nested too deeply") from None
    check(data, SCHEMA, "")
    return data


def _core_file(key: str) -> bool:
    return key.startswith("cgroup.") and key not in _CORE_LIMITS


def check(value: object, spec: object, where: str) -> None:
    """`value` as `spec` (SCHEMA's notation) wants it; one SingpyError naming the key otherwise."""
    what = where or "the file"
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            raise SingpyError(f"cgroups: {what} must be a table")
        for key, item in value.items():
            if key not in spec:
                raise SingpyError(f"cgroups: unknown key {_key(where, key)!r}")
            check(item, spec[key], _key(where, key))
    elif isinstance(spec, list):
        if not isinstance(value, list):
            raise SingpyError(f"cgroups: {what} must be an array of tables ([[{what}]])")
        for item in value:
            check(item, spec[0], where)
    elif isinstance(spec, tuple) and spec[0] == "map":
        if not isinstance(value, dict):
            raise SingpyError(f"cgroups: {what} must be a table")
        for key, item in value.items():
            if not (_UNIFIED_KEY if where == "unified" else _NAME).fullmatch(key) or _core_file(key):
                raise SingpyError(f"cgroups: bad name {key!r} in {what}")
            check(item, spec[1], _key(where, key))
    else:
        _check_scalar(value, spec, what)


def _check_scalar(value: object, spec: object, what: str) -> None:
    if spec is bool:
        if not isinstance(value, bool):
            raise SingpyError(f"cgroups: {what} must be true or false")
    elif isinstance(spec, re.Pattern):
        if not isinstance(value, str) or not spec.fullmatch(value):
            raise SingpyError(f"cgroups: bad value {value!r} for {what}")
    else:
        assert isinstance(spec, tuple)
        low, high = spec
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value < high:
            raise SingpyError(f"cgroups: {what} must be an integer in range {low} - {high - 1}")


def _key(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def from_flags(values: dict[str, object]) -> Limits:
    """The limits of --cpus, --memory... ({} with none), as Apptainer's getFlagLimits makes them."""
    limits: Limits = {}
    blkio = _blkio(values)
    if blkio:
        limits["blockIO"] = blkio
    cpu = _cpu(values)
    if cpu:
        limits["cpu"] = cpu
    memory = _memory(values)
    if memory:
        limits["memory"] = memory
    if values.get("pids_limit"):
        limit = _integer(values["pids_limit"], "pids-limit")
        if limit < -1:
            raise UsageError(f"invalid pids-limit: {limit}")
        if limit != 0:
            limits["pids"] = {"limit": limit}
    return limits


def _integer(value: object, flag: str) -> int:
    try:
        return int(str(value))
    except ValueError:
        raise UsageError(f"invalid {flag} value: {value!r} is not an integer") from None


def _blkio(values: dict[str, object]) -> Limits:
    blkio: Limits = {}
    weight = _integer(values.get("blkio_weight") or 0, "blkio-weight")
    if weight > 0:
        if not 10 <= weight <= 1000:
            raise UsageError("blkio-weight must be in range 10-1000")
        blkio["weight"] = weight
    devices = []
    specs = values.get("blkio_weight_device") or []
    assert isinstance(specs, list)
    for spec in specs:
        path, colon, text = str(spec).rpartition(":")
        if not colon or not path:
            raise UsageError("blkio-weight-device specifications must be in <device>:<weight> format")
        major, minor = device_numbers(path)
        device_weight = _integer(text, "blkio-weight-device")
        if not 10 <= device_weight <= 1000:
            raise UsageError("blkio-device-weight must be in range 10-1000")
        devices.append({"major": major, "minor": minor, "weight": device_weight})
    if devices:
        blkio["weightDevice"] = devices
    return blkio


def device_numbers(path: str) -> tuple[int, int]:
    """(major, minor) of a device node, as Apptainer's deviceMajorMinor (the node itself, not a link's target)."""
    try:
        info = os.lstat(path)
    except OSError as error:
        raise UsageError(f"while examining device: {path}: {error.strerror}") from None
    if not (stat.S_ISBLK(info.st_mode) or stat.S_ISCHR(info.st_mode)):
        raise UsageError(f"while examining device: {path} is not a device")
    return os.major(info.st_rdev), os.minor(info.st_rdev)


def _cpu(values: dict[str, object]) -> Limits:
    cpu: Limits = {}
    shares = _integer(values.get("cpu_shares") or -1, "cpu-shares")
    if shares > 0:
        cpu["shares"] = shares
    for flag, key in (("cpuset_cpus", "cpus"), ("cpuset_mems", "mems")):
        if values.get(flag):
            if not _CPU_LIST.fullmatch(str(values[flag])):
                raise UsageError(f"invalid --{flag.replace('_', '-')} value {str(values[flag])!r}: a list as 0-3,7")
            cpu[key] = str(values[flag])
    if values.get("cpus"):
        cpu["period"], cpu["quota"] = cpu_quota(str(values["cpus"]))
    return cpu


def cpu_quota(text: str) -> tuple[int, int]:
    """--cpus N as (period, quota) in microseconds: a period of 100ms, N of them, 0.01 to the CPUs we may use."""
    from decimal import Decimal, InvalidOperation

    try:
        cpus = Decimal(text)
    except InvalidOperation:
        raise UsageError(f"invalid cpus value: {text!r} is not a number") from None
    available = len(os.sched_getaffinity(0))
    if not cpus.is_finite() or not Decimal("0.01") <= cpus <= available:
        raise UsageError(f"cpus value must be in range 0.01 - {available}")
    period = 100_000
    nanos = int(cpus * 1_000_000_000)
    return period, nanos * period // 1_000_000_000


def _memory(values: dict[str, object]) -> Limits:
    memory: Limits = {}
    if values.get("memory"):
        memory["limit"] = ram_in_bytes(str(values["memory"]), "memory")
    if values.get("memory_reservation"):
        memory["reservation"] = ram_in_bytes(str(values["memory_reservation"]), "memory-reservation")
    swap = values.get("memory_swap")
    if swap:
        memory["swap"] = -1 if swap == "-1" else ram_in_bytes(str(swap), "memory-swap")
    if values.get("oom_kill_disable"):
        memory["disableOOMKiller"] = True
    return memory


def ram_in_bytes(text: str, flag: str) -> int:
    """A size as docker's RAMInBytes reads it: 512, 512k, 1.5G, 2GiB, 1gb (binary multiples)."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise UsageError(f"invalid {flag} value: invalid size: {text!r}")
    number, unit = match.groups()
    size = float(number) * _UNITS[(unit or "").lower()]
    if not size < 1 << 63:  # also infinity: a number of 400 digits
        from singpy.host.hostfiles import shown

        raise UsageError(f"invalid {flag} value: {shown(text)!r} is too large")
    return int(size)
