"""Find host GPU files: libraries through `ldconfig -p`, binaries through $PATH.

This is Apptainer main's legacy `--nv`/`--rocm` lookup
(`internal/pkg/util/paths/resolve.go`, `internal/pkg/util/gpu/paths.go`):

* `ldconfig -p` is parsed into name -> every path listed for that name, in
  the printed order (SingularityCE keeps only the first; Apptainer 1.6 keeps
  all so that a multiarch host whose first entry is the i386 copy still
  finds the x86-64 one);
* a bare liblist entry ("libcuda.so") matches every cache name it is a
  prefix of ("libcuda.so", "libcuda.so.1"); each name is taken once, from the
  first path whose ELF class and machine are the host's (the 32-bit filter);
* an absolute ".so" entry is taken as-is when its ELF matches, plus every
  symlink beside it that resolves to it (`soLinks`);
* binaries are looked up on a PATH string (Go's exec.LookPath there).

Nothing here mounts anything: the result is `HostFiles`, which turns itself
into `MountSpec`s.
"""

from __future__ import annotations

import _struct as struct  # the C module itself: `struct`, its wrapper, cost ~0.4 ms of an --nv launch
import os

from singpy.constants import SYSTEM_PATH
from singpy.errors import GpuError
from singpy.gpu import GpuHost, binding_note
from singpy.gpu.libsdir import libs_dir_mounts, link_notes, link_target
from singpy.gpu.versions import major_minor
from singpy.host.hostfiles import which
from singpy.plan import MountOp, MountSpec, Stage
from singpy.record import Record

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from singpy.config.liblist import LibList
    from singpy.gpu.elf import ElfIdentity

    LdCache = Mapping[str, tuple[str, ...]]  # library name -> host paths, in `ldconfig -p` order

# "\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1"; the flags may
# carry ", hwcap: 0x..." or ", OS ABI: Linux 3.2.0", and are "(ELF)" for libs without libc.


def parse_ldconfig_output(text: str) -> dict[str, tuple[str, ...]]:
    """`ldconfig -p` text -> name -> paths; header and trailer lines are ignored."""
    import re  # only for this fallback: the cache file is normally read directly

    line_pattern = re.compile(r"^\s*(?P<name>\S+)\s+\((?P<flags>[^)]*)\)\s+=>\s+(?P<path>\S.*?)\s*$")
    cache: dict[str, list[str]] = {}
    for line in text.splitlines():
        match = line_pattern.match(line)
        if match is None:
            continue
        paths = cache.setdefault(match["name"], [])
        if match["path"] not in paths:
            paths.append(match["path"])
    return {name: tuple(paths) for name, paths in cache.items()}


SYSTEM_LD_CACHE = "/etc/ld.so.cache"
# glibc's elf/dl-cache.h: the "new" format alone (glibc >= 2.32 writes nothing else): a 48-byte
# header (magic, version, nlibs, len_strings, flags, extension offset), then 24-byte entries
# (flags, key, value, osversion, hwcap); key and value are offsets of strings from the file start.
_NEW_CACHE_MAGIC = b"glibc-ld.so.cache1.1"
_NEW_HEADER = struct.Struct("<20sII")
_NEW_ENTRY = struct.Struct("<iIIIQ")
_NEW_HEADER_SIZE = 48


def read_ld_cache(ldconfig: str = "/sbin/ldconfig", cache_file: str | None = None,
                  prefixes: tuple[str, ...] | None = None) -> dict[str, tuple[str, ...]]:
    """The host's library cache, name -> paths, in `ldconfig -p` order.

    The cache file is read directly when it is in glibc's current format
    (what `ldconfig -p` prints, without a fork and exec on every --nv run);
    any other format goes through `ldconfig -p` itself. `prefixes`: only the
    names starting with one of them are needed (others may be left out).
    """
    parsed = parse_ld_so_cache(cache_file or SYSTEM_LD_CACHE, prefixes)
    return parsed if parsed is not None else run_ldconfig(ldconfig, cache_file)


def parse_ld_so_cache(path: str, prefixes: tuple[str, ...] | None = None) -> dict[str, tuple[str, ...]] | None:
    """Parse a new-format ld.so.cache; None when the file is absent or in another format.

    With `prefixes`, only names starting with one of them are decoded: a
    host's cache has ~1000 names, --nv asks about ~70 stems, and decoding
    every name cost more than the rest of the lookup.
    """
    wanted = tuple(prefix.encode() for prefix in prefixes) if prefixes is not None else None
    # The names' first bytes, looked up in a set before the prefixes are compared one by one: startswith with
    # ~70 prefixes cost ~1.4 us per cache entry, ~1 ms of every --nv run through the ld cache
    width = min(map(len, wanted), default=0) if wanted is not None else 0
    heads = {prefix[:width] for prefix in wanted} if wanted is not None else set()
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    if len(data) < _NEW_HEADER_SIZE or not data.startswith(_NEW_CACHE_MAGIC):
        return None
    count = _NEW_HEADER.unpack_from(data)[1]
    if _NEW_HEADER_SIZE + count * _NEW_ENTRY.size > len(data):
        return None
    cache: dict[str, list[str]] = {}
    strings: dict[int, str | None] = {}  # offset -> string: a library's path is often the value of several names
    entries = memoryview(data)[_NEW_HEADER_SIZE:_NEW_HEADER_SIZE + count * _NEW_ENTRY.size]
    for _, key, value, _, _ in _NEW_ENTRY.iter_unpack(entries):
        if wanted is not None and (data[key:key + width] not in heads or not data.startswith(wanted, key)):
            continue
        name = _cstring(data, key)
        library = strings[value] if value in strings else strings.setdefault(value, _cstring(data, value))
        if name is None or library is None:
            return None
        paths = cache.setdefault(name, [])
        if library not in paths:
            paths.append(library)
    return {name: tuple(paths) for name, paths in cache.items()}


def _cstring(data: bytes, offset: int) -> str | None:
    end = data.find(b"\0", offset)
    return data[offset:end].decode("utf-8", "surrogateescape") if 0 <= offset < end else None


def run_ldconfig(ldconfig: str, cache_file: str | None) -> dict[str, tuple[str, ...]]:
    """Run `ldconfig [-C cache_file] -p` and parse it; GpuError if that fails.

    `-C` makes glibc's ldconfig print another cache (tests build one with
    `ldconfig -C FILE -f CONF`).  LC_ALL=C keeps the output untranslated.
    """
    import subprocess

    argv = [ldconfig, *(("-C", cache_file) if cache_file else ()), "-p"]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, errors="replace", timeout=30,
            env={"LC_ALL": "C", "PATH": SYSTEM_PATH}, check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GpuError(f"could not retrieve ld cache: {' '.join(argv)}: {exc}") from exc
    if done.returncode != 0:
        detail = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        raise GpuError(f"could not retrieve ld cache: {' '.join(argv)}: {detail[0]}")
    return parse_ldconfig_output(done.stdout)


def so_links(path: str, directories: dict[str, dict[str, list[str]]] | None = None) -> tuple[str, ...]:
    """Symlinks beside `path` named like it ("libcuda.so*") that resolve to it (Apptainer `soLinks`).

    `directories` caches each directory's symlinks by target, for callers that
    ask about many libraries of one directory (nvidia-container-cli lists ~60).
    """
    directory, name = os.path.split(path)
    stem = name[: name.index(".so") + 3] if ".so" in name else name
    cache = {} if directories is None else directories
    if directory not in cache:
        cache[directory] = _symlinks_by_target(directory)
    return tuple(link for link in cache[directory].get(link_target(path), ())
                 if os.path.basename(link).startswith(stem) and link != path)


def _symlinks_by_target(directory: str) -> dict[str, list[str]]:
    links: dict[str, list[str]] = {}
    try:
        entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
    except OSError:
        return links
    for entry in entries:
        if entry.is_symlink():
            links.setdefault(link_target(entry.path), []).append(entry.path)
    return links


class HostFiles(Record):
    """Host files found for one GPU vendor, before they become mounts."""

    libraries: tuple[tuple[str, str], ...] = ()  # (file name in /.singularity.d/libs, host path)
    binaries: tuple[tuple[str, str], ...] = ()  # (name in /usr/bin, host path)
    files: tuple[str, ...] = ()  # plain files, bound at the same path
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # verbose-level messages
    glibc: tuple[tuple[str, str], ...] = ()  # (host path, newest GLIBC_2.x it needs, "2.34" or "") known ahead

    def mounts(self) -> tuple[MountSpec, ...]:
        """Read-only binds of binaries and files; the libraries in /.singularity.d/libs (`libs_dir_mounts`:
        a tmpfs, one bind per distinct file, links for its other names, then the seal) go first."""
        targets = [(path, f"/usr/bin/{name}") for name, path in self.binaries]
        targets += [(path, path) for path in self.files]
        return libs_dir_mounts(self.libraries) + tuple(
            MountSpec(op=MountOp.BIND, source=src, dest=dst, readonly=True, stage=Stage.GPU) for src, dst in targets
        )

    def bind_notes(self, mounts: tuple[MountSpec, ...] | None = None) -> tuple[str, ...]:
        """One "binding SRC -> DEST" line per bind and "linking DEST -> TARGET" per link, for -v."""
        specs = self.mounts() if mounts is None else mounts
        binds = tuple(binding_note(spec) for spec in specs if spec.op == MountOp.BIND)
        return binds + link_notes(specs)


def resolve_libraries(
    entries: Iterable[str], cache: LdCache, host: ElfIdentity, *, inherited: Iterable[tuple[str, str]] = ()
) -> tuple[list[tuple[str, str]], list[str], list[str]]:
    """Liblist library entries -> ([(dest name, host path)], missing entries, notes).

    `inherited` pairs (already in a parent container's /.singularity.d/libs)
    come first and win, as in Apptainer's nested-container handling.
    """
    from singpy.gpu.elf import elf_identity  # the ld cache path only: a kept listing reads no ELF header

    found: dict[str, str] = dict(inherited)
    missing: list[str] = []
    notes: list[str] = []
    names = sorted(cache)
    for entry in entries:
        candidates = _absolute_candidates(entry) if entry.startswith("/") else _cache_candidates(entry, cache, names)
        if not candidates:
            missing.append(entry)
        for paths in candidates:
            path = next((p for p in paths if elf_identity(p) == host), None)
            if path is None:
                notes.append(f"ignoring {', '.join(paths)}: not an ELF library of the host's architecture")
                continue
            found.setdefault(os.path.basename(path), path)
    return list(found.items()), missing, notes


def _cache_candidates(prefix: str, cache: LdCache, names: list[str]) -> list[tuple[str, ...]]:
    """Paths of every cache name starting with `prefix`: a bisection in the sorted names.

    A scan of the whole cache for each of the ~70 list entries cost more than
    everything else --nv does before mounting.
    """
    from _bisect import bisect_left  # the ld cache path only (the C module: `bisect` is its wrapper, ~0.2 ms)

    candidates = []
    for name in names[bisect_left(names, prefix):]:
        if not name.startswith(prefix):
            break
        candidates.append(cache[name])
    return candidates


def _absolute_candidates(path: str) -> list[tuple[str, ...]]:
    if not os.path.exists(path):
        return []
    return [(candidate,) for candidate in (path, *so_links(path))]


def resolve_binaries(names: Iterable[str], path_env: str) -> tuple[list[tuple[str, str]], list[str]]:
    """Binary names -> ([(name, host path)], missing names), looked up on `path_env`."""
    found: list[tuple[str, str]] = []
    missing: list[str] = []
    for name in names:
        path = which(name, path_env) if path_env else None
        if path is None:
            missing.append(name)
        else:
            found.append((os.path.basename(name), os.path.abspath(path)))
    return found, missing


def inherited_libraries(libs_dir: str) -> list[tuple[str, str]]:
    """Files already in /.singularity.d/libs when singpy itself runs inside a container."""
    try:
        return [(entry.name, entry.path) for entry in sorted(os.scandir(libs_dir), key=lambda e: e.name)]
    except OSError:
        return []


def drop_newer_glibc(files: HostFiles, image_glibc: str | None) -> HostFiles:
    """Skip host libraries/binaries that need a newer glibc than the image has, with a warning."""
    limit = _parse_glibc(image_glibc)
    if limit is None:
        return files
    warnings: list[str] = []
    known = {path: _parse_glibc(needs) for path, needs in files.glibc}  # a kept listing's: no file is read
    from singpy.gpu.elf import required_glibc

    def keep(path: str) -> bool:
        needed = known[path] if path in known else required_glibc(path)
        if needed is None or needed <= limit:
            return True
        want = f"GLIBC_{needed[0]}.{needed[1]}"
        warnings.append(
            f"skipping host file {path}: it needs {want} but the image has glibc {image_glibc} "
            f"(inside the container it would fail with '{want} not found')"
        )
        return False

    return files.replace(libraries=tuple(item for item in files.libraries if keep(item[1])),
        binaries=tuple(item for item in files.binaries if keep(item[1])),
        warnings=files.warnings + tuple(warnings),
    )


def glibc_needs(files: HostFiles) -> tuple[tuple[str, str], ...]:
    """(host path, "2.34" or "") for every library and binary: what `drop_newer_glibc` would read."""
    from singpy.gpu.elf import required_glibc

    paths = dict.fromkeys(path for _, path in files.libraries + files.binaries)
    return tuple((path, ".".join(map(str, needed)) if (needed := required_glibc(path)) else "") for path in paths)


def _parse_glibc(version: str | None) -> tuple[int, int] | None:
    return major_minor(version or "")


def find_host_files(wanted: LibList, platform: str, host: GpuHost, image_glibc: str | None) -> HostFiles:
    """The shared legacy lookup for --nv and --rocm (`platform` is "nv" or "rocm", as in warnings)."""
    notes: list[str] = []
    warnings: list[str] = []
    try:
        bare = tuple(entry for entry in wanted.libraries if not entry.startswith("/"))  # looked up by prefix
        cache: LdCache = read_ld_cache(host.ldconfig, host.ld_cache_file, bare) if bare else {}
    except GpuError as exc:
        warnings.append(f"while finding {platform} bind points: {exc.message}")
        cache = {}
    from singpy.gpu.elf import host_elf_identity

    found_libs, missing_libs, lib_notes = resolve_libraries(
        wanted.libraries, cache, host_elf_identity(), inherited=inherited_libraries(host.inherited_libs_dir)
    )
    notes += lib_notes + [f"{platform} library {name} not found on this host" for name in missing_libs]
    if wanted.libraries and not found_libs:
        warnings.append(f"could not find any {platform} libraries on this host")
    found_bins, missing_bins = resolve_binaries(wanted.binaries, host.path_env)
    notes += [f"{platform} binary {name} not found on PATH" for name in missing_bins]
    present = tuple(path for path in wanted.files if os.path.exists(path))
    notes += [f"{platform} file {path} not found" for path in wanted.files if path not in present]
    result = HostFiles(
        libraries=tuple(found_libs), binaries=tuple(found_bins), files=present,
        warnings=tuple(warnings), notes=tuple(notes),
    )
    return drop_newer_glibc(result, image_glibc)

