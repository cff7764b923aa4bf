"""The network plan: which network a container gets, who may ask for it, its address, its resolv.conf.

Pure: nothing here touches the kernel (singpy.kernel.netns does). Three types,
as Apptainer's CNI configurations are named ([1] apptainer.conf, `allow net
networks`; [2] etc/network/*.conflist):

* `none`: a network namespace with only the loopback up. Anyone may use it:
  it takes access away and needs no privilege outside the user namespace.
* `bridge` (root's default): a veth pair, one end on a host bridge, the other
  as eth0 in the container, with an address from the bridge's subnet and the
  default route through the bridge's address.
* `ptp`: a veth pair alone, the host end holding the gateway address, routes
  on both ends (CNI's ptp plugin).

`bridge` and `ptp` create interfaces in the host's network namespace, which
needs CAP_NET_ADMIN there: root only, since singpy is never setuid. So for an
unprivileged user they are refused; `allow net users`, `allow net groups` and
`allow net networks` (Apptainer's directives, comma lists, may repeat) say
whether the site meant to allow them, which only changes what the refusal says. No NAT and no
forwarding are set up: the host's firewall decides what lies beyond.
"""

from __future__ import annotations

from singpy.config.sysconf import SysConfig
from singpy.errors import SingpyError
from singpy.plan import MountOp, MountSpec, NetworkSpec, Stage

TYPES = ("bridge", "ptp", "none")
ARGS = ("IP",)  # --network-args keys singpy understands (CNI passes more to its plugins)


class NetworkError(SingpyError):
    """A network request that cannot be honoured: unknown type, bad subnet, no free address, not allowed."""


def plan_network(*, net: bool, network: str | None, network_args: tuple[str, ...], uid: int, user: str,
                 config: SysConfig) -> NetworkSpec | None:
    """The container's network, or None without --net (--network and --network-args imply it)."""
    if not (net or network or network_args):
        return None
    kind = (network or ("bridge" if uid == 0 else "none")).strip()
    if "," in kind:
        raise NetworkError(f"--network {kind}: singpy attaches one network per container")
    if kind not in TYPES:
        raise NetworkError(f"unknown network type {kind!r}: choose one of {', '.join(TYPES)}")
    if uid != 0 and kind != "none":
        raise NetworkError(_refusal(kind, uid, user, config), hint="--net alone (--network none) gives a private "
                           "network namespace with only the loopback")
    args = parse_network_args(network_args)
    if kind == "none":
        if args:
            raise NetworkError("--network-args needs a bridge or ptp network, not none")
        return NetworkSpec(type="none")
    subnet = config.text(f"network {kind} subnet")
    check_subnet(subnet, f"network {kind} subnet")
    address = args.get("IP", "")
    if address:
        check_requested(address, subnet)
    bridge = config.text("network bridge name") if kind == "bridge" else ""
    if kind == "bridge" and not _is_ifname(bridge):
        raise NetworkError(f"bad network bridge name {bridge!r}: 1 to 15 characters, no '/', ':' or space")
    return NetworkSpec(type=kind, bridge=bridge, subnet=subnet, address=address)


def _refusal(kind: str, uid: int, user: str, config: SysConfig) -> str:
    """Why a user may not have `kind`: not allowed by singpy.conf, or allowed but beyond what singpy can do.

    As in Apptainer, a user is allowed when `allow net users` names them (or
    their uid) or `allow net groups` one of their groups (name or gid), and
    `allow net networks` names the network.
    """
    if not allowed_net_user(uid, user, config) or kind not in _words(config.items("allow net networks")):
        return (f"network {kind} is not allowed for user {user}: unprivileged users may use --network none "
                "(allow net users / allow net groups / allow net networks in singpy.conf)")
    return (f"network {kind} needs root: singpy is never setuid, so it cannot create interfaces on the host "
            f"for user {user}, although singpy.conf allows it")


def allowed_net_user(uid: int, user: str, config: SysConfig) -> bool:
    """Whether `allow net users` names the user (or their uid) or `allow net groups` one of their groups."""
    users = _words(config.items("allow net users"))
    return user in users or str(uid) in users or _in_groups(uid, _words(config.items("allow net groups")))


def _in_groups(uid: int, groups: set[str]) -> bool:
    """Whether the user is a member of one of `groups` (names or gids): their passwd group and those of /etc/group.

    The user and group databases are read only when `allow net groups` is set.
    """
    if not groups:
        return False
    import grp
    import os
    import pwd

    try:
        entry = pwd.getpwuid(uid)
        gids = os.getgrouplist(entry.pw_name, entry.pw_gid)
    except (KeyError, OSError):
        return False
    names = set()
    for gid in gids:
        try:
            names.add(grp.getgrgid(gid).gr_name)
        except KeyError:
            continue
    return bool(groups & ({str(gid) for gid in gids} | names))


def _words(values: tuple[str, ...]) -> set[str]:
    """Apptainer's list directives are comma lists; singpy's may also repeat."""
    return {word.strip() for value in values for word in value.split(",") if word.strip()}


def _is_ifname(name: str) -> bool:
    return 0 < len(name) < 16 and not any(char in name for char in "/: \t\n") and name not in (".", "..")


def parse_network_args(values: tuple[str, ...]) -> dict[str, str]:
    """`IP=10.22.0.5`, comma or semicolon separated, possibly repeated."""
    parsed: dict[str, str] = {}
    for value in values:
        for item in value.replace(";", ",").split(","):
            item = item.strip()
            if not item:
                continue
            key, sep, arg = item.partition("=")
            if not sep or key.strip().upper() not in ARGS:
                raise NetworkError(f"unsupported --network-args {item!r}: singpy understands IP=ADDRESS")
            parsed[key.strip().upper()] = arg.strip()
    return parsed


def check_subnet(subnet: str, what: str) -> None:
    """An IPv4 network with room for the gateway and at least one container."""
    import ipaddress

    try:
        network = ipaddress.IPv4Network(subnet, strict=True)
    except ValueError as error:
        raise NetworkError(f"bad {what} {subnet!r} in singpy.conf: {error}") from None
    if network.prefixlen > 30:
        raise NetworkError(f"{what} {subnet} is full: it has no address for a container beside the gateway "
                           "(a /30 or wider is needed)")


def check_requested(address: str, subnet: str) -> None:
    import ipaddress

    try:
        wanted = ipaddress.IPv4Address(address)
    except ValueError:
        raise NetworkError(f"bad --network-args IP={address}: not an IPv4 address") from None
    network = ipaddress.IPv4Network(subnet)
    if wanted not in network or wanted in (network.network_address, network.broadcast_address,
                                           network.network_address + 1):
        raise NetworkError(f"--network-args IP={address} is not a container address of {subnet} "
                           f"(the gateway is {network.network_address + 1})")


def gateway(subnet: str) -> str:
    """The subnet's first address: the bridge's (bridge) or the host veth's (ptp)."""
    import ipaddress

    return str(ipaddress.IPv4Network(subnet).network_address + 1)


def pick_address(spec: NetworkSpec, taken: set[str]) -> str:
    """The requested address if it is free, else the lowest free one; `taken` holds running containers'."""
    import ipaddress

    if spec.address:
        if spec.address in taken:
            raise NetworkError(f"address {spec.address} is held by a running container")
        return spec.address
    network = ipaddress.IPv4Network(spec.subnet)
    first = network.network_address + 1
    for candidate in network.hosts():
        if candidate != first and str(candidate) not in taken:
            return str(candidate)
    raise NetworkError(f"network {spec.type} subnet {spec.subnet} is full: every address is held by a "
                       "running container")


def prefix_length(subnet: str) -> int:
    return int(subnet.partition("/")[2])


def resolv_conf(servers: tuple[str, ...]) -> MountSpec:
    """--dns: the container's /etc/resolv.conf, naming these servers only."""
    content = "\n".join(f"nameserver {server}" for server in servers)  # the writer adds the last newline
    return MountSpec(op=MountOp.FILE, dest="/etc/resolv.conf", content=content, readonly=True, merge=False,
                     stage=Stage.SYSTEM_FILES)


def parse_dns(values: tuple[str, ...]) -> tuple[str, ...]:
    """`--dns 1.1.1.1,2606:4700::1111`: IPv4 or IPv6 addresses, in order, duplicates dropped."""
    import ipaddress

    servers: list[str] = []
    for value in values:
        for word in value.split(","):
            word = word.strip()
            if not word:
                continue
            try:
                server = str(ipaddress.ip_address(word))
            except ValueError:
                raise NetworkError(f"bad --dns server {word!r}: not an IP address") from None
            if server not in servers:
                servers.append(server)
    return tuple(servers)
