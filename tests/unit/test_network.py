"""singpy.launch.network: types, policy, subnets, address allocation, --dns; and what the planner makes of them."""

from __future__ import annotations

from typing import Any

import pytest

from singpy.config import sysconf
from singpy.host import host as host_module
from singpy.launch.network import (
    NetworkError,
    check_subnet,
    gateway,
    parse_dns,
    parse_network_args,
    pick_address,
    plan_network,
)
from singpy.launch.planner import LaunchRequest, build_plan
from singpy.plan import ImageSpec, MountOp, NetworkSpec


def config(text: str = "") -> sysconf.SysConfig:
    return sysconf.parse(text, "test.conf")


def network(uid: int = 0, conf: str = "", user: str = "alice", **fields: object) -> NetworkSpec | None:
    values: dict[str, object] = {"net": True, "network": None, "network_args": ()}
    values.update(fields)
    return plan_network(uid=uid, user=user, config=config(conf), **values)  # type: ignore[arg-type]


@pytest.mark.parametrize(("uid", "fields", "expected"), [
    (0, {"net": False}, None),
    (0, {}, NetworkSpec(type="bridge", bridge="singpy0", subnet="10.22.0.0/16")),
    (1000, {}, NetworkSpec(type="none")),
    (0, {"network": "none"}, NetworkSpec(type="none")),
    (0, {"network": "ptp"}, NetworkSpec(type="ptp", subnet="10.23.0.0/16")),
    (0, {"net": False, "network": "ptp"}, NetworkSpec(type="ptp", subnet="10.23.0.0/16")),
    (1000, {"network": "none"}, NetworkSpec(type="none")),
    (0, {"network_args": ("IP=10.22.3.4",)}, NetworkSpec(type="bridge", bridge="singpy0",
                                                         subnet="10.22.0.0/16", address="10.22.3.4")),
], ids=["no --net", "root default", "user default", "root none", "root ptp", "--network implies --net",
        "user none", "IP argument"])
def test_plan_network(uid: int, fields: dict[str, Any], expected: NetworkSpec | None) -> None:
    assert network(uid, **fields) == expected


def test_bridge_name_and_subnets_come_from_the_conf() -> None:
    conf = "network bridge name = br9\nnetwork bridge subnet = 192.168.7.0/24\nnetwork ptp subnet = 10.5.0.0/30\n"
    assert network(0, conf) == NetworkSpec(type="bridge", bridge="br9", subnet="192.168.7.0/24")
    assert network(0, conf, network="ptp") == NetworkSpec(type="ptp", subnet="10.5.0.0/30")


@pytest.mark.parametrize(("uid", "conf", "fields", "message"), [
    (0, "", {"network": "macvlan"}, "unknown network type 'macvlan': choose one of bridge, ptp, none"),
    (0, "", {"network": "bridge,ptp"}, "one network per container"),
    (0, "network bridge subnet = 10.22.0.0/33\n", {}, "bad network bridge subnet '10.22.0.0/33'"),
    (0, "network bridge subnet = 10.22.0.1/16\n", {}, "has host bits set"),
    (0, "network bridge subnet = fd00::/64\n", {}, "bad network bridge subnet"),
    (0, "network ptp subnet = 10.0.0.0/31\n", {"network": "ptp"}, "network ptp subnet 10.0.0.0/31 is full"),
    (0, "network bridge name = a/b\n", {}, "bad network bridge name 'a/b'"),
    (0, "", {"network_args": ("portmap=80:80/tcp",)}, "unsupported --network-args 'portmap=80:80/tcp'"),
    (0, "", {"network_args": ("IP=10.99.0.2",)}, "IP=10.99.0.2 is not a container address of 10.22.0.0/16"),
    (0, "", {"network_args": ("IP=10.22.0.1",)}, "the gateway is 10.22.0.1"),
    (0, "", {"network_args": ("IP=nope",)}, "bad --network-args IP=nope: not an IPv4 address"),
    (0, "", {"network": "none", "network_args": ("IP=10.22.0.2",)}, "--network-args needs a bridge or ptp"),
    (1000, "", {"network": "bridge"}, "network bridge is not allowed for user alice"),
    (1000, "allow net users = bob\nallow net networks = bridge\n", {"network": "bridge"},
     "network bridge is not allowed for user alice"),
    (1000, "allow net users = bob, alice\nallow net networks = bridge\n", {"network": "ptp"},
     "network ptp is not allowed for user alice"),
    (1000, "allow net users = bob, alice\nallow net networks = ptp,bridge\n", {"network": "bridge"},
     "network bridge needs root: singpy is never setuid"),
    (1000, "allow net users = alice\nallow net users = carol\nallow net networks = ptp\n", {"network": "ptp"},
     "network ptp needs root"),
], ids=["unknown type", "list", "bad prefix", "host bits", "ipv6", "too small", "bad bridge name", "portmap",
        "IP outside", "IP is gateway", "IP malformed", "args with none", "user bridge", "user not listed",
        "network not listed", "allowed but unprivileged", "repeated directive"])
def test_network_errors(uid: int, conf: str, fields: dict[str, Any], message: str) -> None:
    with pytest.raises(NetworkError) as raised:
        network(uid, conf, **fields)
    assert message in raised.value.message


def test_network_args_forms() -> None:
    assert parse_network_args(("IP=10.0.0.5",)) == {"IP": "10.0.0.5"}
    assert parse_network_args(("ip=10.0.0.5; ",)) == {"IP": "10.0.0.5"}
    assert parse_network_args(()) == {}


def test_subnets() -> None:
    check_subnet("10.22.0.0/30", "x")  # gateway .1, one container .2
    assert gateway("10.22.0.0/16") == "10.22.0.1"
    assert gateway("192.168.7.0/24") == "192.168.7.1"


def test_pick_address() -> None:
    spec = NetworkSpec(type="bridge", bridge="b", subnet="10.9.0.0/29")
    assert pick_address(spec, set()) == "10.9.0.2"
    assert pick_address(spec, {"10.9.0.2", "10.9.0.3"}) == "10.9.0.4"
    assert pick_address(spec, {"10.9.0.3", "10.200.0.2"}) == "10.9.0.2"
    full = {f"10.9.0.{n}" for n in range(2, 7)}
    with pytest.raises(NetworkError, match="subnet 10.9.0.0/29 is full"):
        pick_address(spec, full)
    wanted = spec.replace(address="10.9.0.5")
    assert pick_address(wanted, {"10.9.0.2"}) == "10.9.0.5"
    with pytest.raises(NetworkError, match="10.9.0.5 is held by a running container"):
        pick_address(wanted, {"10.9.0.5"})


def test_dns() -> None:
    assert parse_dns(("1.1.1.1,2606:4700:4700::1111", "8.8.8.8", "1.1.1.1")) == (
        "1.1.1.1", "2606:4700:4700::1111", "8.8.8.8")
    with pytest.raises(NetworkError, match="bad --dns server 'dns.example'"):
        parse_dns(("dns.example",))


# --- the planner ----------------------------------------------------------------------------------------------


def plan(uid: int, **fields: object):  # type: ignore[no-untyped-def]
    host = host_module.capture({"HOME": "/", "PATH": "/bin"}).replace(uid=uid, gid=uid, home="/", cwd="/")
    image = ImageSpec(kind="sandbox", path="/img", rootfs="/img")
    request = LaunchRequest(action="exec", image="/img", args=("true",), **fields)  # type: ignore[arg-type]
    return build_plan(request, config(), host, image).plan


def test_planner_network_namespace() -> None:
    assert plan(1000).namespaces.net is False and plan(1000).network is None
    user = plan(1000, net=True)
    assert user.namespaces.net and user.network == NetworkSpec(type="none")
    root = plan(0, network="ptp")
    assert root.namespaces.net and root.network is not None and root.network.type == "ptp"


def test_planner_dns_replaces_resolv_conf() -> None:
    mounts = plan(1000, dns=("10.0.0.53,fd00::53",)).mounts
    resolv = [spec for spec in mounts if spec.dest == "/etc/resolv.conf"]
    assert len(resolv) == 1 and resolv[0].op == MountOp.FILE
    assert resolv[0].content == "nameserver 10.0.0.53\nnameserver fd00::53" and not resolv[0].merge
    default = [spec for spec in plan(1000).mounts if spec.dest == "/etc/resolv.conf"]
    assert len(default) == 1 and default[0].op == MountOp.BIND and default[0].source == "/etc/resolv.conf"
