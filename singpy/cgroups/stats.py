"""What an instance uses (`singpy instance stats`): CPU, memory, PIDs and block I/O.

From its cgroup when it has one (the counters of the whole cgroup, limits
included), else from /proc: the sums over the processes in the instance's
mount namespace (its holder, what it started, what joined it). The JSON keys are runc's (Apptainer prints its cgroup
Stats), for the part singpy measures: cpu_stats.cpu_usage.total_usage (ns),
memory_stats.usage.{usage,limit}, pids_stats.{current,limit},
blkio_stats.io_service_bytes_recursive (Read, Write).
"""

from __future__ import annotations

import os

Sample = dict[str, object]
_NO_LIMIT = 0  # runc's "no limit" in pids_stats.limit


def member_of(pid: int, dirs: tuple[str, ...]) -> bool:
    """Whether process `pid` is in every one of these cgroup directories (as /proc/PID/cgroup says).

    Each line's path is placed in its own hierarchy only (v1: the mount holding
    its controllers; v2, the `0::` line: the cgroup2 mount): a process in
    memory:/x is not in pids/x.
    """
    try:
        with open(f"/proc/{pid}/cgroup", encoding="ascii", errors="replace") as table:
            lines = [line.split(":", 2) for line in table.read().splitlines() if line.count(":") >= 2]
    except OSError:
        return False
    from singpy.cgroups.hierarchy import cgroup_mounts

    mounts = cgroup_mounts()
    places = set()
    for _, controllers, path in lines:
        wanted = frozenset(controllers.split(",")) if controllers else frozenset()
        for point, kind, options in mounts:
            if path != "/" and ((kind == "cgroup2" and not wanted) or (kind == "cgroup" and wanted and
                                                                       wanted <= options)):
                places.add(os.path.normpath(point + "/" + path.lstrip("/")))
    return bool(dirs) and all(directory in places for directory in dirs)


def sample(pid: int, dirs: tuple[str, ...], version: int) -> Sample:
    """The usage of the instance whose holder is `pid`, with its cgroup `dirs` (() for none)."""
    return _from_cgroup(dirs, version) if dirs else _from_proc(pid)


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as file:
            return file.read(1 << 16)
    except OSError:
        return ""


def _number(text: str) -> int:
    text = text.strip()
    return int(text) if text.isdigit() else 0


def _keyed(text: str) -> dict[str, int]:
    """`key value` lines (cpu.stat, memory.stat) as a dict."""
    found = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        found[key] = _number(value)
    return found


def _shaped(cpu_ns: int, memory: int, limit: int, pids: int, pids_limit: int, read: int, written: int,
            source: str) -> Sample:
    return {"cpu_stats": {"cpu_usage": {"total_usage": cpu_ns}},
            "memory_stats": {"usage": {"usage": memory, "limit": limit}},
            "pids_stats": {"current": pids, "limit": pids_limit},
            "blkio_stats": {"io_service_bytes_recursive": [{"op": "Read", "value": read},
                                                           {"op": "Write", "value": written}]},
            "source": source}


def _from_cgroup(dirs: tuple[str, ...], version: int) -> Sample:
    def find(name: str) -> str:
        """The text of cgroup file `name` in whichever of the dirs (v1: one per controller) has it."""
        return next((text for directory in dirs if (text := _read(os.path.join(directory, name)))), "")

    total = _total_memory()
    if version == 2:
        reads = writes = 0
        for line in find("io.stat").splitlines():
            fields = dict(field.split("=", 1) for field in line.split()[1:] if "=" in field)
            reads, writes = reads + _number(fields.get("rbytes", "")), writes + _number(fields.get("wbytes", ""))
        limit = find("memory.max").strip()
        pids_limit = find("pids.max").strip()
        return _shaped(_keyed(find("cpu.stat")).get("usage_usec", 0) * 1000, _number(find("memory.current")),
                       _number(limit) if limit.isdigit() else total, _number(find("pids.current")),
                       _number(pids_limit) if pids_limit.isdigit() else _NO_LIMIT, reads, writes, "cgroup")
    reads = writes = 0
    for line in find("blkio.throttle.io_service_bytes_recursive").splitlines():
        words = line.split()
        if len(words) == 3:
            reads += _number(words[2]) if words[1] == "Read" else 0
            writes += _number(words[2]) if words[1] == "Write" else 0
    v1_limit = _number(find("memory.limit_in_bytes"))
    pids_limit = find("pids.max").strip()
    return _shaped(_number(find("cpuacct.usage")), _number(find("memory.usage_in_bytes")),
                   min(v1_limit or total, total),
                   _number(find("pids.current")), _number(pids_limit) if pids_limit.isdigit() else _NO_LIMIT,
                   reads, writes, "cgroup")


def _total_memory() -> int:
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            return _number(line.split()[1]) * 1024
    return 0


def _from_proc(pid: int) -> Sample:
    """The sums over the processes in the mount namespace of `pid` (the holder): the instance's startscript and
    what it started, and every process that joined it (exec instance://), which are not the holder's children."""
    try:
        namespace = os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return _shaped(0, 0, _total_memory(), 0, _NO_LIMIT, 0, 0, "proc")
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/mnt") == namespace:
                    members.append(int(entry))
            except OSError:  # gone, or not ours to look at
                continue
    page, hertz = os.sysconf("SC_PAGE_SIZE"), os.sysconf("SC_CLK_TCK")
    memory = reads = writes = ticks = 0
    for member in members:
        fields = _read(f"/proc/{member}/stat").rpartition(")")[2].split()
        ticks += int(fields[11]) + int(fields[12]) if len(fields) > 12 else 0  # utime + stime
        statm = _read(f"/proc/{member}/statm").split()
        memory += _number(statm[1]) * page if len(statm) > 1 else 0
        io = _keyed(_read(f"/proc/{member}/io").replace(":", ""))
        reads, writes = reads + io.get("read_bytes", 0), writes + io.get("write_bytes", 0)
    return _shaped(ticks * 1_000_000_000 // hertz, memory, _total_memory(), len(members), _NO_LIMIT, reads, writes,
                   "proc")


def bytes_size(count: float) -> str:
    """A size as docker's units.BytesSize prints it: 1.5MiB, 512B."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if count < 1024 or unit == "TiB":
            return f"{count:.4g}{unit}"
        count /= 1024
    return ""


def _at(sample: Sample, *keys: str) -> object:
    value: object = sample
    for key in keys:
        assert isinstance(value, dict)
        value = value[key]
    return value


def row(name: str, before: Sample, after: Sample, seconds: float) -> str:
    """One line of the stats table, the CPU share measured between two samples `seconds` apart."""
    cpu = [int(str(_at(sample, "cpu_stats", "cpu_usage", "total_usage"))) for sample in (before, after)]
    percent = (cpu[1] - cpu[0]) / (seconds * 1e9) * 100 if seconds > 0 else 0.0
    memory, limit = (int(str(_at(after, "memory_stats", "usage", key))) for key in ("usage", "limit"))
    items = _at(after, "blkio_stats", "io_service_bytes_recursive")
    assert isinstance(items, list)
    io = {item["op"]: int(item["value"]) for item in items}
    return (f"{name:<16}{percent:>8.2f}%    {bytes_size(memory)} / {bytes_size(limit):<12}"
            f"{(memory / limit * 100 if limit else 0.0):>6.2f}%    {bytes_size(io['Read'])} / "
            f"{bytes_size(io['Write']):<12}{_at(after, 'pids_stats', 'current')}")


HEADER = f"{'INSTANCE NAME':<16}{'CPU USAGE':>9}    MEM USAGE / LIMIT    MEM %    BLOCK I/O    PIDS"
