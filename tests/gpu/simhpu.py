"""A simulated Intel Gaudi host in a directory, for --intel-hpu: real device nodes, a sysfs-shaped tree.

`build_hpu_host(root, accelerators=N)` makes, under `root`:

* ``dev/accel/accel0..N-1``: character devices on the kernel's accel major
  (drivers/accel, Linux 6.2+), as the habanalabs driver creates them;
* ``dev/infiniband/uverbsM``: the RDMA verbs nodes (ib_uverbs' major 231,
  minors from 192), numbered in the reverse order of the accelerators, so
  that a test sees the node each port names, never one guessed from N;
* ``sys/class/infiniband/hbl_N/device/infiniband_verbs/uverbsM``
  (``hlib_N`` with `legacy`, the older driver's name): what Apptainer reads
  to find accelerator N's verbs node. Directories here, where the kernel has
  a link into /sys/devices: only the names are read.

tests/gpu/simrun.py puts ``dev`` in place of /dev and ``sys/class`` over
/sys/class in a private mount namespace. mknod needs CAP_MKNOD (root).
"""

from __future__ import annotations

from pathlib import Path

from tests.gpu.simhost import char_device

ACCEL_MAJOR = 261  # the accel subsystem's (include/drm/drm_accel.h: ACCEL_MAJOR)
UVERBS_MAJOR, UVERBS_MINOR_BASE = 231, 192  # ib_uverbs' (IB_UVERBS_MAJOR, IB_UVERBS_BASE_MINOR)


def verbs_node(index: int, accelerators: int) -> str:
    """The verbs node accelerator `index`'s port names on a host of `accelerators`."""
    return f"uverbs{accelerators - 1 - index}"


def build_hpu_host(root: Path, *, accelerators: int = 2, ports: bool = True, legacy: bool = False) -> Path:
    """The host above under `root` (returned); `ports=False`: accelerators without RDMA devices."""
    for index in range(accelerators):
        char_device(root / f"dev/accel/accel{index}", ACCEL_MAJOR, index)
        if not ports:
            continue
        node = verbs_node(index, accelerators)
        char_device(root / f"dev/infiniband/{node}", UVERBS_MAJOR, UVERBS_MINOR_BASE + accelerators - 1 - index)
        port = root / "sys/class/infiniband" / f"{'hlib' if legacy else 'hbl'}_{index}"
        (port / "device/infiniband_verbs" / node).mkdir(parents=True)
    (root / "dev").mkdir(parents=True, exist_ok=True)
    for path in [root, *root.rglob("*")]:  # readable by the test user too
        if path.is_dir():
            path.chmod(0o755)
    return root
