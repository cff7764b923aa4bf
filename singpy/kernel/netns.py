"""Network namespaces: the loopback, joining a namespace, and root's host side (bridge, veth, routes).

`--network none` needs only the loopback up, done with one ioctl: pyroute2
costs about 0.3 s to import, more than the rest of a launch, so it is
imported only by `attach`, for root's bridge and ptp networks.

`attach` (root, in the host's network namespace, before the container
exists) does all of the netlink work in the launcher, which then stays as the
container's supervisor (singpy.launch.launch) so that `detach` runs however the
container ends:

1. under an exclusive lock (/run/singpy/network.lock), so two launches never
   pick the same address: remove stale veths, list the addresses running
   containers hold, pick one (singpy.launch.network.pick_address);
2. create the container's network namespace without entering it (unshare,
   keep a descriptor, setns back); the child joins it with `join`;
3. create the bridge if missing, and the veth pair: the host end, named
   singpy-<launcher pid> and labelled "singpy <address>" in its ifalias (the
   allocation record: no state file to go stale), on the host side, the
   other end created directly inside the new namespace as eth0;
4. configure the inside through a netlink socket opened in it: loopback and
   eth0 up, the address, the default route.

pyroute2 0.9 starts no threads (checked), and the launcher never creates a
user namespace afterwards (its child does, being single-threaded after fork).

Leftovers: when the container's namespace dies, the kernel deletes the veth
pair with it; a killed launcher takes its child down (PR_SET_PDEATHSIG), so
its namespace dies too. What can remain is a veth whose launcher died before
the child joined, or a bridge it died before marking as singpy's (made as
singpyb-<pid>, renamed once marked), both removed by the next `attach` (their
pid is dead), and an empty bridge, removed by the next `detach`.
"""

from __future__ import annotations

import os

from singpy import console
from singpy.errors import KernelError, SingpyError
from singpy.kernel import syscalls as k
from singpy.launch import network
from singpy.plan import NetworkSpec
from singpy.record import Record

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from typing import Any

LOCK_DIR = "/run/singpy"
LOCK = f"{LOCK_DIR}/network.lock"
HOST_PREFIX = "singpy-"  # host veth ends: singpy-<pid of the launcher that owns it>
NEW_BRIDGE_PREFIX = "singpyb-"  # a bridge being made, not yet marked: singpyb-<pid> (15 bytes at most)
MARK = "singpy"  # ifalias of a bridge singpy created; host veth ends carry "singpy <address>"
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1

def loopback_up() -> None:
    """Called in a new network namespace: `lo` up (the kernel then adds 127.0.0.1 and ::1 itself)."""
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:  # struct ifreq: the name, then (for these two calls) the flags as a short; 40 bytes in all
            reply = fcntl.ioctl(sock, SIOCGIFFLAGS, struct.pack("16sH22x", b"lo", 0))
            flags = struct.unpack_from("16sH", reply)[1]
            fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))
        except OSError as error:
            raise KernelError(f"can't bring up the loopback interface: {error.strerror}") from None


def join(fd: int) -> None:
    """setns(2) into the network namespace `fd` refers to."""
    k.setns(fd, k.CLONE_NEWNET, "the container's network namespace")


class Attachment(Record):
    """What `attach` made, for the supervisor and for `detach`."""

    netns_fd: int  # the container's network namespace (the child joins it)
    host_link: str  # host end of the veth pair
    address: str  # the container's address
    spec: NetworkSpec


class Attached:
    """Context manager: `attach` on entry, `detach` on exit, whatever the exit."""

    def __init__(self, spec: NetworkSpec) -> None:
        self.spec = spec
        self.attachment: Attachment | None = None

    def __enter__(self) -> Attachment:
        self.attachment = attach(self.spec)
        return self.attachment

    def __exit__(self, *exc: object) -> None:
        if self.attachment is None:
            return
        try:
            detach(self.attachment)
        except SingpyError as error:  # the payload's status matters more; the next run sweeps the rest
            console.warning(f"{error.message}: the next bridge or ptp run will remove it")


def attach(spec: NetworkSpec) -> Attachment:
    """Root, in the host's network namespace: everything above; undone on failure."""
    from pyroute2 import IPRoute

    host_fd = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    host_link = f"{HOST_PREFIX}{os.getpid()}"
    netns_fd = -1
    try:
        with _Lock(), IPRoute() as ipr:
            sweep(ipr)
            address = network.pick_address(spec, taken_addresses(ipr))
            netns_fd = _new_netns(host_fd)
            attachment = Attachment(netns_fd=netns_fd, host_link=host_link, address=address, spec=spec)
            _create_host_side(ipr, attachment)
        _configure_inside(attachment, host_fd)
        return attachment
    except BaseException:  # KeyboardInterrupt too: nothing may stay behind
        if netns_fd >= 0:
            detach(Attachment(netns_fd=netns_fd, host_link=host_link, address="", spec=spec))
        raise
    finally:
        os.close(host_fd)


def detach(attachment: Attachment) -> None:
    """Delete the host end (the kernel deletes its peer) and the bridge if singpy made it and it is empty."""
    from pyroute2 import IPRoute

    try:
        with _Lock(), IPRoute() as ipr:
            _remove(ipr, attachment)
    finally:
        os.close(attachment.netns_fd)


def _remove(ipr: Any, attachment: Attachment) -> None:
    _delete(ipr, attachment.host_link)
    bridge = attachment.spec.bridge
    if bridge and not _ports(ipr, bridge) and _alias(ipr, bridge) == MARK:
        _delete(ipr, bridge)


def sweep(ipr: Any) -> None:
    """Delete host veth ends and unmarked bridges whose launcher is dead (killed while making them)."""
    for link in ipr.get_links():
        name = link.get_attr("IFLA_IFNAME") or ""
        for prefix in (HOST_PREFIX, NEW_BRIDGE_PREFIX):
            owner = name.removeprefix(prefix)
            if name.startswith(prefix) and owner.isdigit() and not _alive(int(owner)):
                _delete(ipr, name)


def taken_addresses(ipr: Any) -> set[str]:
    """Addresses held by running containers, read from their host ends' ifalias."""
    taken = set()
    for link in ipr.get_links():
        alias = link.get_attr("IFLA_IFALIAS") or ""
        if alias.startswith(MARK + " "):
            taken.add(alias.split()[1])
    return taken


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _new_netns(host_fd: int) -> int:
    """A new network namespace, kept open by the returned descriptor; this process stays where it was."""
    k.unshare(k.CLONE_NEWNET)
    try:
        return os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        join(host_fd)


def _create_host_side(ipr: Any, attachment: Attachment) -> None:
    spec, gateway = attachment.spec, network.gateway(attachment.spec.subnet)
    ipr.link("add", ifname=attachment.host_link, kind="veth",
             peer={"ifname": "eth0", "net_ns_fd": attachment.netns_fd})
    host = _index(ipr, attachment.host_link)
    ipr.link("set", index=host, ifalias=f"{MARK} {attachment.address}")
    if spec.type == "bridge":
        ipr.link("set", index=host, master=_ensure_bridge(ipr, spec.bridge, gateway, spec.subnet), state="up")
    else:  # ptp: the gateway address on every host end, a host route to each container (as CNI's ptp)
        ipr.addr("add", index=host, address=gateway, prefixlen=32)
        ipr.link("set", index=host, state="up")
        ipr.route("add", dst=f"{attachment.address}/32", oif=host, scope=253)  # RT_SCOPE_LINK


def _ensure_bridge(ipr: Any, name: str, gateway: str, subnet: str) -> int:
    """The bridge's index; made (with the gateway address) and marked as singpy's if missing.

    A bridge an administrator made is used as it is, and never deleted.
    """
    found = ipr.link_lookup(ifname=name)
    if found:
        return int(found[0])
    # The kernel takes no alias at creation: made under a name of ours, a bridge we die before
    # marking is one `sweep` removes (its pid is dead); marked, it gets its real name.
    unmarked = f"{NEW_BRIDGE_PREFIX}{os.getpid()}"
    ipr.link("add", ifname=unmarked, kind="bridge")
    index = _index(ipr, unmarked)
    ipr.link("set", index=index, ifalias=MARK)
    ipr.link("set", index=index, ifname=name)
    ipr.addr("add", index=index, address=gateway, prefixlen=network.prefix_length(subnet))
    ipr.link("set", index=index, state="up")
    return index


def _configure_inside(attachment: Attachment, host_fd: int) -> None:
    """Through a socket opened inside: sockets stay in the namespace they were created in."""
    from pyroute2 import IPRoute

    spec, gateway = attachment.spec, network.gateway(attachment.spec.subnet)
    join(attachment.netns_fd)
    try:
        with IPRoute() as ipr:
            ipr.link("set", index=_index(ipr, "lo"), state="up")
            eth0 = _index(ipr, "eth0")
            prefix = network.prefix_length(spec.subnet) if spec.type == "bridge" else 32
            ipr.addr("add", index=eth0, address=attachment.address, prefixlen=prefix)
            ipr.link("set", index=eth0, state="up")
            if spec.type == "ptp":
                ipr.route("add", dst=f"{gateway}/32", oif=eth0, scope=253)
            ipr.route("add", dst="0.0.0.0/0", gateway=gateway)
    finally:
        join(host_fd)


def _index(ipr: Any, name: str) -> int:
    found = ipr.link_lookup(ifname=name)
    if not found:
        raise KernelError(f"can't find network interface {name}")
    return int(found[0])


def _ports(ipr: Any, bridge: str) -> list[str]:
    found = ipr.link_lookup(ifname=bridge)
    if not found:
        return []
    return [link.get_attr("IFLA_IFNAME") for link in ipr.get_links() if link.get_attr("IFLA_MASTER") == found[0]]


def _alias(ipr: Any, name: str) -> str:
    found = ipr.link_lookup(ifname=name)
    if not found:
        return ""
    return str(ipr.get_links(found[0])[0].get_attr("IFLA_IFALIAS") or "")


def _delete(ipr: Any, name: str) -> None:
    from pyroute2.netlink.exceptions import NetlinkError

    try:
        ipr.link("del", ifname=name)
    except NetlinkError as error:
        if error.code != 19:  # ENODEV: gone already (its namespace died)
            raise KernelError(f"can't delete network interface {name}: {os.strerror(error.code)}") from None


class _Lock:
    """flock on LOCK: allocation and creation (or removal) happen as one step."""

    def __enter__(self) -> None:
        import fcntl

        os.makedirs(LOCK_DIR, mode=0o755, exist_ok=True)
        self.fd = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)  # releases the lock

