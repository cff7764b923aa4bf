"""What the limits (singpy.cgroups.limits) become in a cgroup's files, on cgroup v1 and on v2.

Each is (controller, file, value), in the order they must be written
(memory.limit_in_bytes before memory.memsw.limit_in_bytes, the period before
the quota). v2 values are converted as runc converts them (cpu.weight from
shares, memory.swap.max without the memory, io.weight from the blkio
weight). A limit a version cannot express is one error saying so, never a
limit silently left out.
"""

from __future__ import annotations

from singpy.cgroups.limits import Limits
from singpy.errors import SingpyError

Write = tuple[str, str, str]  # (controller, file, value)
ACCOUNTING = ("cpuacct", "memory", "pids", "blkio")  # v1: made for `instance stats` even without their limits


def _table(limits: Limits, key: str) -> dict[str, object]:
    value = limits.get(key) or {}
    assert isinstance(value, dict)
    return value


def _tables(limits: Limits, key: str) -> list[dict[str, object]]:
    value = limits.get(key) or []
    assert isinstance(value, list)
    return value


def v1_writes(limits: Limits) -> list[Write]:
    if limits.get("unified"):
        raise SingpyError("cgroups: [unified] keys are cgroup v2 files, and this host runs cgroup v1")
    writes: list[Write] = []
    memory = _table(limits, "memory")
    for key, name in (("limit", "memory.limit_in_bytes"), ("reservation", "memory.soft_limit_in_bytes"),
                      ("swap", "memory.memsw.limit_in_bytes"), ("kernel", "memory.kmem.limit_in_bytes"),
                      ("kernelTCP", "memory.kmem.tcp.limit_in_bytes"), ("swappiness", "memory.swappiness")):
        if key in memory:
            writes.append(("memory", name, str(memory[key])))
    if memory.get("disableOOMKiller"):
        writes.append(("memory", "memory.oom_control", "1"))
    cpu = _table(limits, "cpu")
    for key, name in (("shares", "cpu.shares"), ("period", "cpu.cfs_period_us"), ("quota", "cpu.cfs_quota_us"),
                      ("realtimePeriod", "cpu.rt_period_us"), ("realtimeRuntime", "cpu.rt_runtime_us")):
        if key in cpu:
            writes.append(("cpu", name, str(cpu[key])))
    for key in ("cpus", "mems"):
        if key in cpu:
            writes.append(("cpuset", f"cpuset.{key}", str(cpu[key])))
    pids = _table(limits, "pids")
    if "limit" in pids:
        limit = pids["limit"]
        assert isinstance(limit, int)
        writes.append(("pids", "pids.max", str(limit) if limit > 0 else "max"))
    writes += _v1_blkio(_table(limits, "blockIO"))
    for page in _tables(limits, "hugepageLimits"):
        writes.append(("hugetlb", f"hugetlb.{page['pageSize']}.limit_in_bytes", str(page["limit"])))
    for rule in _tables(limits, "devices"):
        writes.append(("devices", "devices.allow" if rule.get("allow") else "devices.deny", device_rule(rule)))
    network = _table(limits, "network")
    if "classID" in network:
        writes.append(("net_cls", "net_cls.classid", str(network["classID"])))
    for priority in _list(network.get("priorities")):
        writes.append(("net_prio", "net_prio.ifpriomap", f"{priority['name']} {priority['priority']}"))
    writes += _rdma(limits)
    return writes


def _list(value: object) -> list[dict[str, object]]:
    assert value is None or isinstance(value, list)
    return value or []


def _v1_blkio(blkio: dict[str, object]) -> list[Write]:
    writes = [("blkio", f"blkio.{name}", str(blkio[key])) for key, name in (("weight", "weight"),
                                                                           ("leafWeight", "leaf_weight"))
              if key in blkio]
    for device in _list(blkio.get("weightDevice")):
        for key, name in (("weight", "blkio.weight_device"), ("leafWeight", "blkio.leaf_weight_device")):
            if key in device:
                writes.append(("blkio", name, f"{device['major']}:{device['minor']} {device[key]}"))
    for key, name in _THROTTLES:
        for device in _list(blkio.get(key)):
            writes.append(("blkio", f"blkio.throttle.{name}_device", f"{device['major']}:{device['minor']} "
                                                                     f"{device['rate']}"))
    return writes


_THROTTLES = (("throttleReadBpsDevice", "read_bps"), ("throttleWriteBpsDevice", "write_bps"),
              ("throttleReadIOPSDevice", "read_iops"), ("throttleWriteIOPSDevice", "write_iops"))


def device_rule(rule: dict[str, object]) -> str:
    """A devices.allow/deny line: `c 1:3 rw`, `*` for a number left out (or -1), as runc writes it."""
    numbers = [str(rule[key]) if isinstance(rule.get(key), int) and rule[key] != -1 else "*"
               for key in ("major", "minor")]
    return f"{rule.get('type') or 'a'} {numbers[0]}:{numbers[1]} {rule.get('access') or 'rwm'}"


def _rdma(limits: Limits) -> list[Write]:
    writes = []
    for device, limit in _table(limits, "rdma").items():
        assert isinstance(limit, dict)
        parts = [f"{name}={limit[key]}" for key, name in (("hcaHandles", "hca_handle"), ("hcaObjects", "hca_object"))
                 if key in limit]
        if parts:
            writes.append(("rdma", "rdma.max", f"{device} {' '.join(parts)}"))
    return writes


def v2_writes(limits: Limits) -> list[Write]:
    _refuse_on_v2(limits)
    writes: list[Write] = []
    memory = _table(limits, "memory")
    limit, swap = memory.get("limit"), memory.get("swap")
    if isinstance(limit, int):
        writes.append(("memory", "memory.max", str(limit) if limit >= 0 else "max"))
    if "reservation" in memory:
        writes.append(("memory", "memory.low", str(memory["reservation"])))
    if isinstance(swap, int):
        writes.append(("memory", "memory.swap.max", _v2_swap(limit, swap)))
    cpu = _table(limits, "cpu")
    shares = cpu.get("shares")
    if isinstance(shares, int) and shares:
        writes.append(("cpu", "cpu.weight", str(1 + ((max(2, min(shares, 262144)) - 2) * 9999) // 262142)))
    quota, period = cpu.get("quota"), cpu.get("period")
    if quota is not None or period is not None:
        quota_text = str(quota) if isinstance(quota, int) and quota > 0 else "max"
        writes.append(("cpu", "cpu.max", f"{quota_text} {period or 100000}"))
    for key in ("cpus", "mems"):
        if key in cpu:
            writes.append(("cpuset", f"cpuset.{key}", str(cpu[key])))
    pids = _table(limits, "pids")
    if isinstance(pids.get("limit"), int):
        writes.append(("pids", "pids.max", str(pids["limit"]) if pids["limit"] > 0 else "max"))  # type: ignore
    writes += _v2_io(_table(limits, "blockIO"))
    for page in _tables(limits, "hugepageLimits"):
        writes.append(("hugetlb", f"hugetlb.{page['pageSize']}.max", str(page["limit"])))
    writes += _rdma(limits)
    for key, value in _table(limits, "unified").items():
        controller = key.partition(".")[0]
        writes.append(("" if controller == "cgroup" else controller, key, str(value)))
    return writes


def _refuse_on_v2(limits: Limits) -> None:
    """What cgroup v2 has no file for: one error naming it."""
    memory, cpu, blkio = _table(limits, "memory"), _table(limits, "cpu"), _table(limits, "blockIO")
    missing = [name for name, asked in (
        ("memory.kernel", "kernel" in memory), ("memory.kernelTCP", "kernelTCP" in memory),
        ("memory.swappiness", "swappiness" in memory),
        ("memory.disableOOMKiller (--oom-kill-disable)", bool(memory.get("disableOOMKiller"))),
        ("cpu.realtimeRuntime", "realtimeRuntime" in cpu), ("cpu.realtimePeriod", "realtimePeriod" in cpu),
        ("blockIO.leafWeight", "leafWeight" in blkio), ("network", bool(limits.get("network"))),
        ("devices", not _allows_all(_tables(limits, "devices")))) if asked]
    if missing:
        raise SingpyError(f"cgroups: {', '.join(missing)}: cgroup v2 has no such limit (devices would need an eBPF "
                          "program); run on a cgroup v1 host or leave it out")


def _allows_all(rules: list[dict[str, object]]) -> bool:
    """No device rule, or only `allow all` ones (Apptainer's example file has one): nothing to enforce."""
    return all(rule.get("allow") and device_rule(rule).startswith("a *:* rwm") for rule in rules)


def _v2_swap(limit: object, swap: int) -> str:
    """memory.swap.max is the swap alone; OCI's swap is memory plus swap."""
    if swap == -1:
        return "max"
    if not isinstance(limit, int) or limit < 0:
        raise SingpyError("cgroups: a memory-swap limit needs a memory limit on cgroup v2")
    if swap < limit:
        raise SingpyError("cgroups: the memory-swap limit must be at least the memory limit")
    return str(swap - limit)


def _v2_io(blkio: dict[str, object]) -> list[Write]:
    writes: list[Write] = []
    if isinstance(blkio.get("weight"), int):
        writes.append(("io", "io.weight", f"default {_io_weight(blkio['weight'])}"))  # type: ignore[arg-type]
    for device in _list(blkio.get("weightDevice")):
        if isinstance(device.get("weight"), int):
            writes.append(("io", "io.weight", f"{device['major']}:{device['minor']} "
                                              f"{_io_weight(device['weight'])}"))  # type: ignore[arg-type]
    for key, name in (("throttleReadBpsDevice", "rbps"), ("throttleWriteBpsDevice", "wbps"),
                      ("throttleReadIOPSDevice", "riops"), ("throttleWriteIOPSDevice", "wiops")):
        for device in _list(blkio.get(key)):
            writes.append(("io", "io.max", f"{device['major']}:{device['minor']} {name}={device['rate']}"))
    return writes


def _io_weight(weight: int) -> int:
    """blkio's 10-1000 as io.weight's 1-10000 (runc's ConvertBlkIOToIOWeightValue)."""
    return 1 + (max(10, weight) - 10) * 9999 // 990
