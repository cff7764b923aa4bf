"""MIG instances for NVIDIA_VISIBLE_DEVICES: `GPU:GI:CI`, `GPU:MIG` and `MIG-<uuid>`, as device nodes.

A MIG device is a compute instance (CI) inside a GPU instance (GI) of one
GPU. A container reaches it through its GPU's /dev/nvidiaN node plus two
capability nodes, /dev/nvidia-caps/nvidia-capM, whose minors the driver
publishes in /proc/driver/nvidia/capabilities/gpuN/mig/giG/access and
.../giG/ciC/access ("DeviceFileMinor: M"); libnvidia-container binds the
same three (`mig_caps`).

nvidia-container-cli names a MIG device by its UUID or as `GPU:MIG` (the
MIG device's index on its GPU) and learns the GI and CI ids from NVML
(libnvidia-container `src/cli/common.c` select_mig_device, `src/driver.c`).
singpy loads no NVML into the launcher; it reads what nvidia-smi prints,
and only when such a name is asked for:

* `nvidia-smi -L` lists each GPU and, under it, its MIG devices with their
  index and UUID::

      GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d6-...)
        MIG 3g.20gb     Device  0: (UUID: MIG-c6d4f1ef-...)

* `nvidia-smi` (its summary) has a "MIG devices:" table whose first
  column holds, per MIG device, "GPU  GI ID  CI ID  MIG Dev"::

      |  0    1   0   0  |     11MiB / 20224MiB | 42      0 | ...

The two are joined on (GPU, MIG Dev). As for `GPU-` UUIDs, nvidia-smi's GPU
index is taken as the /dev/nvidiaN minor.
"""

from __future__ import annotations

import os

from singpy.gpu.versions import is_number
from singpy.record import Record


class MigDevice(Record, kw_only=False):
    """One MIG device as the host's tools describe it."""

    gpu: int  # its GPU's index (the /dev/nvidiaN minor)
    index: int  # its index among that GPU's MIG devices ("Device N" in nvidia-smi -L, "MIG Dev")
    gi: int  # GPU instance id
    ci: int  # compute instance id
    uuid: str  # "MIG-..." ("" when nvidia-smi -L did not list it)

    @property
    def name(self) -> str:
        """GPU:GI:CI, the form `mig_caps` takes."""
        return f"{self.gpu}:{self.gi}:{self.ci}"


def parse_listing(text: str) -> dict[tuple[int, int], str]:
    """`nvidia-smi -L` -> (GPU index, MIG device index) -> MIG UUID."""
    found: dict[tuple[int, int], str] = {}
    gpu: int | None = None
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "GPU" and is_number(words[1].rstrip(":")):
            gpu = int(words[1].rstrip(":"))
        elif gpu is not None and words[:1] == ["MIG"] and "Device" in words and "(UUID:" in line:
            index = words[words.index("Device") + 1].rstrip(":") if words[-1] != "Device" else ""
            uuid = line.partition("(UUID:")[2].partition(")")[0].strip()
            if is_number(index) and uuid.startswith("MIG-"):
                found[(gpu, int(index))] = uuid
    return found


def parse_table(text: str) -> list[tuple[int, int, int, int]]:
    """The "MIG devices:" table of `nvidia-smi`'s summary -> (GPU, GI, CI, MIG Dev) rows."""
    rows: list[tuple[int, int, int, int]] = []
    inside = False
    for line in text.splitlines():
        if "MIG devices:" in line:
            inside = True
            continue
        if inside and "Processes:" in line:
            break
        cells = line.strip().strip("|").split("|") if inside else []
        numbers = cells[0].split() if cells else []
        if len(numbers) == 4 and all(is_number(number) for number in numbers):
            gpu, gi, ci, index = (int(number) for number in numbers)
            rows.append((gpu, gi, ci, index))
    return rows


def mig_devices(listing: str, table: str) -> list[MigDevice]:
    """The host's MIG devices, from `nvidia-smi -L` and `nvidia-smi` (see the module docstring)."""
    uuids = parse_listing(listing)
    return [MigDevice(gpu, index, gi, ci, uuids.get((gpu, index), "")) for gpu, gi, ci, index in parse_table(table)]


def find(item: str, devices: list[MigDevice]) -> MigDevice | None:
    """The MIG device `item` names: a MIG UUID (any case, as nvidia-container-cli compares) or GPU:MIG."""
    if item[:4].upper() == "MIG-":
        return next((device for device in devices if device.uuid.lower() == item.lower()), None)
    gpu, _, index = item.partition(":")
    if is_number(gpu) and is_number(index):
        return next((d for d in devices if (d.gpu, d.index) == (int(gpu), int(index))), None)
    return None


def mig_caps(item: str, proc_dir: str, dev_dir: str, warnings: list[str]) -> tuple[int, tuple[str, ...]] | None:
    """(GPU minor, capability node names) for a MIG instance "GPU:GI:CI", as nvidia-container-cli finds them.

    The driver publishes, per instance, `capabilities/gpuN/mig/giG/access` and
    `.../giG/ciC/access` under /proc/driver/nvidia, each naming the minor of
    the /dev/nvidia-caps/nvidia-capM node that grants it ("DeviceFileMinor: M").
    """
    gpu, gi, ci = (part.strip() for part in item.split(":"))
    if not (is_number(gpu) and is_number(gi) and is_number(ci)):
        warnings.append(f"NVIDIA_VISIBLE_DEVICES: '{item}' is not GPU:GI:CI (three numbers); ignored")
        return None
    instance = os.path.join(proc_dir, "capabilities", f"gpu{int(gpu)}", "mig", f"gi{int(gi)}")
    caps = []
    for access in (os.path.join(instance, "access"), os.path.join(instance, f"ci{int(ci)}", "access")):
        minor = _device_file_minor(access)
        if minor is None or not os.path.exists(os.path.join(dev_dir, "nvidia-caps", f"nvidia-cap{minor}")):
            warnings.append(f"NVIDIA_VISIBLE_DEVICES: no MIG instance '{item}' on this host ({access} or its "
                            f"{dev_dir}/nvidia-caps node is missing); ignored")
            return None
        caps.append(f"nvidia-cap{minor}")
    return int(gpu), tuple(caps)


def _device_file_minor(path: str) -> int | None:
    """M from the "DeviceFileMinor: M" line of a /proc/driver/nvidia/capabilities access file."""
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            text = handle.read(4096)
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "DeviceFileMinor" and is_number(value.strip()):
            return int(value.strip())
    return None
