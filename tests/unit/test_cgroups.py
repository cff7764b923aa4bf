"""The limits as asked (flags, TOML) and what they become in cgroup v1 and v2 files (singpy.cgroups)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from singpy.cgroups import files, hierarchy, limits, stats
from singpy.errors import SingpyError, UsageError


@pytest.mark.parametrize(("text", "size"), [("512", 512), ("1k", 1024), ("1.5G", 3 << 29), ("2GiB", 2 << 30),
                                            ("64mb", 64 << 20), ("1 M", 1 << 20), ("3P", 3 << 50)])
def test_sizes_read_as_docker_reads_them(text: str, size: int) -> None:
    assert limits.ram_in_bytes(text, "memory") == size


@pytest.mark.parametrize("text", ["", "-1", "12X", "1e9", "G", "1.5.5G", "99999999P"])
def test_bad_sizes(text: str) -> None:
    with pytest.raises(UsageError, match="invalid memory value"):
        limits.ram_in_bytes(text, "memory")


def test_cpus_become_a_quota_of_a_100ms_period() -> None:
    assert limits.cpu_quota("0.5") == (100_000, 50_000)
    assert limits.cpu_quota("0.01") == (100_000, 1_000)
    assert limits.cpu_quota(str(len(os.sched_getaffinity(0)))) == (100_000, 100_000 * len(os.sched_getaffinity(0)))
    for bad in ("0", "0.001", "1000000", "nan", "inf"):
        with pytest.raises(UsageError, match="cpus value must be in range"):
            limits.cpu_quota(bad)


def test_flags_as_apptainer_makes_them() -> None:
    asked = limits.from_flags({"memory": "1G", "memory_swap": "-1", "oom_kill_disable": True, "pids_limit": "-1",
                               "cpu_shares": "512", "cpuset_cpus": "0-1", "blkio_weight": "100"})
    assert asked == {"memory": {"limit": 1 << 30, "swap": -1, "disableOOMKiller": True}, "pids": {"limit": -1},
                     "cpu": {"shares": 512, "cpus": "0-1"}, "blockIO": {"weight": 100}}
    assert limits.from_flags({"pids_limit": "0", "blkio_weight": "0"}) == {}  # 0: no limit, as Apptainer


def test_flags_and_a_file_together_are_refused() -> None:
    with pytest.raises(UsageError, match="cannot apply a cgroups TOML file while using limit flags"):
        limits.requested((("apply_cgroups", "/x.toml"), ("memory", "1G")))


def test_toml_is_read_and_checked(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text('[cpu]\nshares = 512\ncpus = "0"\n[[hugepageLimits]]\npageSize = "2MB"\nlimit = 0\n'
                    '[unified]\n"memory.high" = "1G"\n')
    assert limits.load_toml(str(good))["cpu"] == {"shares": 512, "cpus": "0"}
    for content, message in (("[cpu]\nshares = -1\n", "cpu.shares must be an integer"),
                             ("[pids]\nlimit = true\n", "pids.limit must be an integer"),
                             ("[cpus]\n", "unknown key 'cpus'"),
                             ("devices = 1\n", "must be an array of tables"),
                             ("[[devices]]\ntype = 'x'\n", "bad value 'x' for devices.type"),
                             ("[unified]\n'memory.max\\n' = '1'\n", "bad name"),
                             ('[unified]\n"memory.max" = "a\\nb"\n', "bad value"),
                             ("[network]\npriorities = [{name = '../x', priority = 1}]\n", "bad value")):
        bad = tmp_path / "bad.toml"
        bad.write_text(content)
        with pytest.raises(SingpyError, match=message):
            limits.load_toml(str(bad))


def test_v1_files() -> None:
    asked = {"memory": {"limit": 1 << 30, "swap": 2 << 30, "disableOOMKiller": True},
             "cpu": {"shares": 512, "quota": 50000, "period": 100000, "cpus": "0"}, "pids": {"limit": -1},
             "blockIO": {"weight": 100, "weightDevice": [{"major": 8, "minor": 0, "weight": 200}],
                         "throttleReadBpsDevice": [{"major": 8, "minor": 0, "rate": 1000}]},
             "devices": [{"allow": False, "type": "c", "major": 1, "minor": 3, "access": "rw"},
                         {"allow": True, "type": "a"}],
             "hugepageLimits": [{"pageSize": "2MB", "limit": 0}]}
    assert files.v1_writes(asked) == [
        ("memory", "memory.limit_in_bytes", str(1 << 30)), ("memory", "memory.memsw.limit_in_bytes", str(2 << 30)),
        ("memory", "memory.oom_control", "1"), ("cpu", "cpu.shares", "512"), ("cpu", "cpu.cfs_period_us", "100000"),
        ("cpu", "cpu.cfs_quota_us", "50000"), ("cpuset", "cpuset.cpus", "0"), ("pids", "pids.max", "max"),
        ("blkio", "blkio.weight", "100"), ("blkio", "blkio.weight_device", "8:0 200"),
        ("blkio", "blkio.throttle.read_bps_device", "8:0 1000"), ("hugetlb", "hugetlb.2MB.limit_in_bytes", "0"),
        ("devices", "devices.deny", "c 1:3 rw"), ("devices", "devices.allow", "a *:* rwm")]
    with pytest.raises(SingpyError, match="cgroup v2 files"):
        files.v1_writes({"unified": {"memory.high": "1"}})


def test_v2_files_converted_as_runc_converts_them() -> None:
    asked = {"memory": {"limit": 1 << 30, "reservation": 1 << 29, "swap": 3 << 30},
             "cpu": {"shares": 1024, "quota": 50000, "period": 100000, "mems": "0"}, "pids": {"limit": 10},
             "blockIO": {"weight": 1000, "weightDevice": [{"major": 8, "minor": 0, "weight": 10}],
                         "throttleWriteIOPSDevice": [{"major": 8, "minor": 0, "rate": 5}]},
             "devices": [{"allow": True, "type": "a", "access": "rwm"}], "unified": {"cgroup.max.depth": "2"}}
    assert files.v2_writes(asked) == [
        ("memory", "memory.max", str(1 << 30)), ("memory", "memory.low", str(1 << 29)),
        ("memory", "memory.swap.max", str(2 << 30)), ("cpu", "cpu.weight", "39"), ("cpu", "cpu.max", "50000 100000"),
        ("cpuset", "cpuset.mems", "0"), ("pids", "pids.max", "10"), ("io", "io.weight", "default 10000"),
        ("io", "io.weight", "8:0 1"), ("io", "io.max", "8:0 wiops=5"), ("", "cgroup.max.depth", "2")]
    assert files.v2_writes({"memory": {"swap": -1}}) == [("memory", "memory.swap.max", "max")]


@pytest.mark.parametrize(("asked", "message"), [
    ({"memory": {"disableOOMKiller": True}}, "--oom-kill-disable"),
    ({"memory": {"swappiness": 10}}, "memory.swappiness"),
    ({"devices": [{"allow": False, "type": "c", "major": 1, "minor": 3, "access": "rw"}]}, "devices"),
    ({"memory": {"swap": 1 << 30}}, "needs a memory limit"),
    ({"memory": {"limit": 2 << 30, "swap": 1 << 30}}, "at least the memory limit"),
])
def test_what_v2_cannot_limit_is_an_error(asked: dict[str, object], message: str) -> None:
    with pytest.raises(SingpyError, match=message):
        files.v2_writes(asked)


def test_version_of_a_host() -> None:
    hybrid = [("/sys/fs/cgroup/pids", "cgroup", frozenset({"pids"})),
              ("/sys/fs/cgroup/unified", "cgroup2", frozenset())]
    assert hierarchy.version(hybrid) == 1
    assert hierarchy.version([("/sys/fs/cgroup", "cgroup2", frozenset())]) == 2


def test_sizes_printed_as_docker_prints_them() -> None:
    assert [stats.bytes_size(size) for size in (0, 512, 1536, 64 << 20, 3 << 30)] == \
        ["0B", "512B", "1.5KiB", "64MiB", "3GiB"]


def test_a_table_row() -> None:
    def sample(cpu: int) -> stats.Sample:
        return stats._shaped(cpu, 32 << 20, 64 << 20, 3, 0, 1024, 0, "cgroup")

    row = stats.row("web", sample(0), sample(500_000_000), 1.0)
    assert row.split() == ["web", "50.00%", "32MiB", "/", "64MiB", "50.00%", "1KiB", "/", "0B", "3"]
