"""--intel-hpu: the host's Intel Gaudi accelerators and their RDMA verbs nodes, as data.

Apptainer 1.5's `--intel-hpu` (`internal/pkg/util/gpu/intelhpu.go`, read by
`addDevMount`): into a minimal /dev, the accelerators' nodes
`/dev/accel/accelN` and, for each accelerator's RDMA device
`/sys/class/infiniband/hbl_N` (`hlib_N` with older drivers), the verbs node
named by the first entry of its `device/infiniband_verbs` directory,
`/dev/infiniband/uverbsM` (Gaudi's scale-out links are RDMA ports). Which
accelerators: `HABANA_VISIBLE_DEVICES` as given to the container (--env,
--env-file, APPTAINERENV_X...), a comma list of indices N or `all`; all when
it is not given. No libraries and no variables: the Gaudi software lives in
the image (Habana's containers). Over the host's whole /dev (no --contain)
every node is there already and the binds are no-ops, as Apptainer adds none.
"""

from __future__ import annotations

import os

from singpy.errors import GpuError
from singpy.gpu import GpuContribution, GpuHost, binding_note
from singpy.plan import Missing, MountOp, MountSpec, Stage

SELECT_VAR = "HABANA_VISIBLE_DEVICES"
NO_DEVICES = "no Intel Gaudi accelerators found (no {dev}/accel/accel*): the container will run without HPU access"


def discover(host: GpuHost, *, contain: bool, selection: str = "all") -> GpuContribution:
    """The dev binds --intel-hpu makes for the accelerators `selection` names (HABANA_VISIBLE_DEVICES).

    GpuError when an accelerator's RDMA device can't be read, as Apptainer fails then.
    """
    accel_dir = os.path.join(host.dev_dir, "accel")
    accelerators = _names(accel_dir, "accel")
    warnings: list[str] = []
    if not accelerators:
        warnings.append(NO_DEVICES.format(dev=host.dev_dir))
    chosen = [os.path.join(accel_dir, name) for name in select(accelerators, selection, warnings)]
    verbs = _verbs_nodes(host, selection, warnings)
    mounts = tuple(MountSpec(op=MountOp.BIND, source=path, dest="/dev" + path[len(host.dev_dir):], dev=True,
                             missing=Missing.REQUIRED, stage=Stage.GPU) for path in chosen + verbs)
    notes = tuple(binding_note(spec) for spec in mounts)
    if not contain and mounts:
        notes += ("without --contain the whole host /dev is visible; the HPU device binds are no-ops",)
    return GpuContribution(mounts=mounts, warnings=tuple(warnings), notes=notes)


def select(names: list[str], selection: str, warnings: list[str]) -> list[str]:
    """The names whose index (their trailing digits) `selection` lists; all of them for `all` (any case).

    An empty selection lists nothing; a name with no index is left out with a warning (Apptainer's).
    """
    if selection.lower() == "all":
        return names
    asked = {part.strip() for part in selection.split(",")}
    chosen = []
    for name in names:
        index = device_index(name)
        if index is None:
            warnings.append(f"unable to parse HPU device path: couldn't find device ID in {name!r}")
        elif index in asked:
            chosen.append(name)
    return chosen


def device_index(name: str) -> str | None:
    """The digits that end `name` ("accel3" -> "3"); None when it ends otherwise."""
    return name[len(name.rstrip("0123456789")):] or None


def _verbs_nodes(host: GpuHost, selection: str, warnings: list[str]) -> list[str]:
    """/dev/infiniband/uverbsM of each selected accelerator's RDMA device (hbl_N, else the older hlib_N)."""
    class_dir = os.path.join(host.sys_dir, "class", "infiniband")
    ports = _names(class_dir, "hbl_") or _names(class_dir, "hlib_")
    nodes = []
    for port in select(ports, selection, warnings):
        verbs_dir = os.path.join(class_dir, port, "device", "infiniband_verbs")
        try:
            entries = sorted(os.listdir(verbs_dir))
        except OSError as error:
            raise GpuError(f"failed to get hpu devices: could not list uverb devices for HPU accelerators: "
                           f"unable to read {verbs_dir}: {error.strerror}") from None
        if not entries:
            warnings.append(f"no uverbs devices found for device: {os.path.join(class_dir, port)}")
            continue
        node = os.path.join(host.dev_dir, "infiniband", entries[0])
        if not os.path.exists(node):
            warnings.append(f"encountered invalid hlib to uverb mapping: {os.path.join(class_dir, port)} -> {node}")
            continue
        nodes.append(node)
    return nodes


def _names(directory: str, prefix: str) -> list[str]:
    """The entries of `directory` starting with `prefix`, sorted as Go's filepath.Glob returns them."""
    try:
        return sorted(name for name in os.listdir(directory) if name.startswith(prefix))
    except OSError:  # no such directory: no such device
        return []
