"""Just enough ELF reading to filter host libraries the way Apptainer does.

Apptainer binds a host library only when its ELF machine and class match the
launcher's own executable (`elfMachine` in `internal/pkg/util/gpu/paths.go`,
class added on main for multiarch hosts).  That is what keeps the i386 copies
in /usr/lib/i386-linux-gnu out of a 64-bit container's /.singularity.d/libs.

`required_glibc` reads the version-needs table (`.gnu.version_r`) to find the
newest GLIBC_x.y symbol version a host library needs: a host library built
against a newer glibc than the image's fails inside the container with
"GLIBC_2.34 not found" (apptainer/apptainer#598, #2421).
"""

from __future__ import annotations

import os
import sys

from singpy.record import Record

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    import mmap
    import struct  # the same names, typed (typeshed's _struct lacks `error`)
    from collections.abc import Callable
else:  # the C module itself: `struct`, its wrapper, cost ~0.4 ms of an --nv launch
    import _struct as struct

_MAGIC = b"\x7fELF"
_SHT_GNU_VERNEED = 0x6FFFFFFE
_SHT_DYNAMIC = 6
_DT_SONAME = 14


class ElfIdentity(Record, kw_only=False):
    """What must match between the host executable and a library."""

    elf_class: int  # EI_CLASS: 1 = 32-bit, 2 = 64-bit
    machine: int  # e_machine: 3 = i386, 62 = x86-64, 183 = AArch64, ...


def elf_identity(path: str | os.PathLike[str]) -> ElfIdentity | None:
    """Class and machine from the first 20 bytes; None if not a readable ELF file."""
    try:  # os.read: a buffered file object would read 8 KiB of each of ~70 libraries for 20 bytes
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            header = os.read(fd, 20)
        finally:
            os.close(fd)
    except OSError:
        return None
    if len(header) < 20 or header[:4] != _MAGIC or header[5] not in (1, 2):
        return None
    order = "<" if header[5] == 1 else ">"  # EI_DATA: 1 little, 2 big endian
    (machine,) = struct.unpack_from(order + "H", header, 18)
    return ElfIdentity(elf_class=header[4], machine=machine)


def host_elf_identity(exe: str = "/proc/self/exe") -> ElfIdentity:
    """The running interpreter's identity (what Apptainer reads from its own binary)."""
    for candidate in (exe, sys.executable):
        identity = elf_identity(candidate)
        if identity is not None:
            return identity
    # A Python that is not an ELF executable is not a Linux host we launch on;
    # x86-64 keeps the filter meaningful rather than letting everything through.
    return ElfIdentity(elf_class=2, machine=62)


def required_glibc(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """Newest GLIBC_2.x version the file needs, or None if it needs none.

    Walks the section headers to `.gnu.version_r` (Elf*_Verneed / Elf*_Vernaux
    records, see elf(5)); falls back to a byte scan when there is no section
    table (stripped of section headers).  The file is memory-mapped, so a
    60 MB libcuda costs only the pages touched.
    """
    import mmap  # only when an image's glibc is known: not on every --nv run

    try:
        with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, prot=mmap.PROT_READ) as data:
            names = _verneed_names(data)
            if names is None:
                names = _glibc_names_by_scan(data)
    except (OSError, ValueError, struct.error):
        return None
    versions = [_version(name) for name in names if name.startswith("GLIBC_2.")]
    found = [version for version in versions if version is not None]
    return max(found) if found else None


def _version(name: str) -> tuple[int, int] | None:
    """(2, 34) from "GLIBC_2.34" (or "GLIBC_2.3.4"); None for any other name."""
    parts = name[len("GLIBC_"):].split(".") if name.startswith("GLIBC_") else []
    if len(parts) not in (2, 3) or not all(part.isascii() and part.isdigit() and len(part) <= 18 for part in parts):
        return None
    return int(parts[0]), int(parts[1])


def _glibc_names_by_scan(data: mmap.mmap) -> list[str]:
    """The GLIBC_2.x names in a file without a section table (rare: only then is `re` loaded)."""
    import re

    return [match.group(0).decode() for match in re.finditer(rb"GLIBC_(2\.[0-9]+)(?![0-9.])", data)]


def _verneed_names(data: mmap.mmap) -> list[str] | None:
    """Every Vernaux name in the file, or None when there is no section table."""
    if data[:4] != _MAGIC:
        raise ValueError("not an ELF file")
    is64, order = data[4] == 2, "<" if data[5] == 1 else ">"
    shoff, shentsize, shnum = (
        struct.unpack_from(order + "Q", data, 0x28)[0] if is64 else struct.unpack_from(order + "I", data, 0x20)[0],
        *struct.unpack_from(order + "HH", data, 0x3A if is64 else 0x2E),
    )
    if shoff == 0 or shnum == 0:
        return None
    section = order + ("IIQQQQIIQQ" if is64 else "IIIIIIIIII")
    headers = [struct.unpack_from(section, data, shoff + i * shentsize) for i in range(shnum)]
    names: list[str] = []
    for header in headers:
        if header[1] != _SHT_GNU_VERNEED:
            continue
        strtab_offset = headers[header[6]][4]  # sh_link -> .dynstr, its sh_offset
        names.extend(_walk_verneed(data, order, header[4], header[7], strtab_offset))
    return names


def _walk_verneed(data: mmap.mmap, order: str, offset: int, count: int, strtab: int) -> list[str]:
    """Vernaux names of `count` Verneed records starting at `offset` (same layout in 32/64 bit)."""
    names: list[str] = []
    for _ in range(count):
        _, cnt, _, aux, next_need = struct.unpack_from(order + "HHIII", data, offset)
        aux_offset = offset + aux
        for _ in range(cnt):
            _, _, _, name, next_aux = struct.unpack_from(order + "IHHII", data, aux_offset)
            end = data.find(b"\0", strtab + name)
            names.append(data[strtab + name : end].decode("ascii", "replace"))
            if not next_aux:
                break
            aux_offset += next_aux
        if not next_need:
            break
        offset += next_need
    return names


def soname(path: str | os.PathLike[str]) -> str | None:
    """DT_SONAME of an ELF shared object (what ldconfig names its link after); None when it has none.

    Four small reads (os.pread: the ELF header, the section headers, the
    dynamic section, the name), not a mapping of the file: the CDI path asks
    about ~70 libraries on every launch.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO: no wait for a writer
    except OSError:
        return None
    try:
        return _read_soname(lambda offset, size: os.pread(fd, size, offset))
    except (OSError, ValueError, struct.error, IndexError):
        return None
    finally:
        os.close(fd)


def _read_soname(read: Callable[[int, int], bytes]) -> str | None:
    """The DT_SONAME string: the dynamic section's entry, an offset into the string table its sh_link names."""
    ident = read(0, 64)
    if ident[:4] != _MAGIC or ident[4] not in (1, 2) or ident[5] not in (1, 2):
        return None
    wide, order = ident[4] == 2, "<" if ident[5] == 1 else ">"
    shoff, shentsize, shnum = (
        struct.unpack_from(order + "Q", ident, 0x28)[0] if wide else struct.unpack_from(order + "I", ident, 0x20)[0],
        *struct.unpack_from(order + "HH", ident, 0x3A if wide else 0x2E),
    )
    header = struct.Struct(order + ("IIQQQQII" if wide else "IIIIIIII"))  # name type flags addr offset size link
    if shoff == 0 or shentsize < header.size:
        return None
    table = read(shoff, shnum * shentsize)
    sections = [header.unpack_from(table, index * shentsize) for index in range(shnum)]
    dynamic = next((section for section in sections if section[1] == _SHT_DYNAMIC), None)
    if dynamic is None:
        return None
    strtab = sections[dynamic[6]][4]
    entry = struct.Struct(order + ("qQ" if wide else "iI"))
    for tag, value in entry.iter_unpack(read(dynamic[4], dynamic[5] - dynamic[5] % entry.size)):
        if tag == 0:
            break
        if tag == _DT_SONAME:
            name = read(strtab + value, 4096)
            return name[:name.index(b"\0")].decode(errors="replace")
    return None
