"""A pulled image squashed from one merged tar stream, with no tree on disk (issue 31, "Big pulls").

The tree path (singpy.oci.pull: layers applied to a directory, then
mksquashfs) writes every file of the image twice and keeps mksquashfs's
cache in memory. Here, instead:

1. every layer's headers are read (data skipped) into singpy.oci.tarmerge's
   `Index`: the image's final tree, as the tree path would make it, each
   regular file naming the layer entry that holds its data;
2. Apptainer's /.singularity.d is laid over it (singpy.oci.streaminstall);
3. `tar2sqfs` (squashfs-tools-ng) reads one tar stream: every directory,
   link and special file first, then the surviving files' data as the
   layers are read a second time (a layer with none is not read; the
   byte ranges the first pass found, singpy.oci.streamdata), then
   the hard links. Each path is sent once (tar2sqfs refuses duplicates).

Anything the stream can't express exactly (tarmerge.Unsupported), or no
`tar2sqfs` on the PATH, leaves the image to the tree path: `squash` then
returns None, having killed tar2sqfs and removed what it wrote.
`SINGPY_PULL_TREE=1` forces the tree path (a debugging aid: both give the
same content).
"""

from __future__ import annotations

import contextlib
import os
import signal
import tarfile
import time
from collections.abc import Mapping
from typing import Any

from singpy import console
from singpy.errors import ImageError
from singpy.host.hostfiles import current_umask
from singpy.image.tools import start_thread
from singpy.oci.layertree import EntryError, sparse_regions
from singpy.oci.streamdata import Offsets, copy_data, header, send_ranges, send_sparse
from singpy.oci.streams import drain
from singpy.oci.tarmerge import Dir, File, Index, Node, Unsupported

_BLOCK = 512
_CHUNK = 1 << 20
_TAR_BUFFER = 1 << 16
_MAX_PSEUDO = 7998  # bytes of a path the tree path can give mksquashfs: "/PATH" escaped under 16000 (owners.py)
# squashfs-tools-ng with the tree path's compression (pull.SQUASH_COMPRESSION: gzip level 6); two block
# compressors: the machines measured have two cores; a backlog of 200 blocks (25 MiB, default 10 per job)
# keeps both busy through runs of small files: 179% -> 194% of the two cores (docs/pull.md, "Big images")
COMPRESSION = ("-c", "gzip", "-X", "level=6", "-j", "2", "-Q", "200")


class Squashed:
    """The squashfs written, and the image metadata read from its /.singularity.d."""

    def __init__(self, path: str, attributes: dict[str, Any]) -> None:
        self.path, self.attributes = path, attributes


def forced_tree(env: Mapping[str, str]) -> bool:
    return env.get("SINGPY_PULL_TREE", "") not in ("", "0")


def squash(blobs: Any, steps: Any, descriptors: list[dict[str, Any]], what: str, work: str, *,
           config: Mapping[str, Any], labels: Mapping[str, str], deffile: bytes,
           epoch: int | None = None) -> Squashed | None:
    """The image of layers `descriptors` (opened through `blobs`, a layercache.Blobs) as a squashfs in `work`;
    None where the tree path must make it. `what` names the image in messages; `epoch`: no file's time later
    (a reproducible SIF's, as mksquashfs clamps them to SOURCE_DATE_EPOCH), else the layers' own."""
    from singpy.image import tools

    tar2sqfs = tools.find_tool("tar2sqfs", os.environ)
    if tar2sqfs is None:
        console.debug("tar2sqfs is not installed: the image is converted through a tree")
        return None
    as_root = os.getuid() == 0
    umask = current_umask()
    scratch, output = f"{work}/skeleton", f"{work}/rootfs.squashfs"
    try:
        if as_root and umask & 0o755:
            raise Unsupported(f"umask {umask:03o}: the tree path's directories get other modes")
        started = time.monotonic()
        index = Index(as_root=as_root, root_mode=0o755)
        offsets = Offsets()
        _merge_headers(index, offsets, blobs, descriptors, what, steps)
        from singpy.oci.streaminstall import install_over

        attributes = install_over(index, scratch, config, labels, deffile)
        console.debug(f"the layers' headers merged in {time.monotonic() - started:.1f} s")
        if epoch is not None:
            clamp_times(index.root, epoch)
        _stream(index, offsets, tar2sqfs, output, blobs, descriptors, what, steps)
        console.debug(f"the merged stream squashed in {time.monotonic() - started:.1f} s in all")
    except Unsupported as why:
        console.debug(f"{what} is converted through a tree: the merged stream can't hold it ({why})")
        return None
    finally:
        from singpy.image import cache

        cache.remove_tree(scratch)
    return Squashed(output, attributes)


def _layer_members(blobs: Any, digest: str, what: str, *, again: bool) -> Any:
    """The members of layer `digest` (with the tarfile they come from). A local source's blob is checked
    against its digest as it is read (every time); a registry's was when it was downloaded or found in the
    cache, and is checked `again` on the data pass, which must read what the headers' pass read."""
    from singpy.oci.streams import VerifyingReader, open_layer

    raw = blobs.open(digest)
    with raw if isinstance(raw, VerifyingReader) or not again else VerifyingReader(raw, digest, source=what) as blob:
        yield from _members(open_layer(blob, source=what))


def _members(stream: Any) -> Any:
    """The layer's members in order, read a chunk ahead on a thread; a tar it can't parse is Unsupported
    (the tree path then says what is wrong with it)."""
    from singpy.oci.readahead import ReadAhead
    from singpy.oci.streams import BoundedTarInfo

    try:
        with ReadAhead(stream) as ahead, tarfile.open(  # type: ignore[call-overload]
                fileobj=ahead, mode="r|", bufsize=_TAR_BUFFER, tarinfo=BoundedTarInfo) as archive:
            for member in archive:
                archive.members.clear()
                yield member, archive
            drain(ahead)  # a gzip trailer; the digest is checked on the compressed blob (_layer_members)
    except (tarfile.TarError, ValueError, OverflowError, EOFError, RecursionError) as error:
        raise Unsupported(f"a layer's tar: {error}") from None
    except OSError as error:  # the tree path reads it again, and says what is wrong
        raise Unsupported(f"reading a layer: {error.strerror or error}") from None


_AT_ONCE = 2  # layers whose headers are read at the same time: inflating releases the GIL, one core each


class _Stopped(Exception):
    """The merge stopped (an error, a signal): a layer still being read gives up."""


class _Reading:
    """One layer's headers read on a daemon thread (an interrupted pull must not wait for it to end)."""

    def __init__(self, blobs: Any, digest: str, what: str, stop: Any) -> None:
        import threading

        self.done = threading.Event()
        self.members: list[tarfile.TarInfo] = []
        self.error: BaseException | None = None
        start_thread(threading.Thread(target=self._read, args=(blobs, digest, what, stop), name="layer-headers",
                                      daemon=True))

    def _read(self, blobs: Any, digest: str, what: str, stop: Any) -> None:
        try:
            self.members = _headers(blobs, digest, what, stop)
        except BaseException as error:  # handed to the main thread, which raises it
            self.error = error
        finally:
            self.done.set()

    def result(self) -> list[tarfile.TarInfo]:
        while not self.done.wait(0.5):  # a timeout keeps the main thread open to signals
            pass
        if self.error is not None:
            raise self.error
        return self.members


def _merge_headers(index: Index, offsets: Offsets, blobs: Any, descriptors: list[dict[str, Any]], what: str,
                   steps: Any) -> None:
    """Every layer's headers applied to `index` in order, the next layer read on another thread meanwhile;
    where each file's data starts kept in `offsets` (the data pass parses no header again)."""
    import threading

    stop = threading.Event()
    pending: list[_Reading] = []
    try:
        for number, descriptor in enumerate(descriptors):
            while len(pending) < _AT_ONCE and number + len(pending) < len(descriptors):
                ahead = descriptors[number + len(pending)]["digest"]
                pending.append(_Reading(blobs, ahead, f"layer {ahead} of {what}", stop))
            steps.extracting(number + 1, len(descriptors), descriptor["digest"])
            members = pending.pop(0).result()
            for member in members:
                index.apply(member)
            index.end_layer()
            offsets.record(number, members)
    finally:
        stop.set()


def _headers(blobs: Any, digest: str, what: str, stop: Any) -> list[tarfile.TarInfo]:
    """The members of one layer, data skipped (on a worker thread)."""
    found = []
    for member, _ in _layer_members(blobs, digest, what, again=False):
        if stop.is_set():
            raise _Stopped
        found.append(member)
    return found


# -- the stream ------------------------------------------------------------------------------------------


def clamp_times(root: Dir, epoch: int) -> None:
    """No time in the tree later than `epoch` (SOURCE_DATE_EPOCH: mksquashfs's rule); a loop, not a recursion:
    an image's directories may nest deeper than Python's stack."""
    pending: list[Node] = [root]
    while pending:
        node = pending.pop()
        node.mtime = min(node.mtime, epoch)
        if isinstance(node, Dir):
            pending.extend(node.children.values())


def _stream(index: Index, offsets: Offsets, tar2sqfs: str, output: str, blobs: Any,
            descriptors: list[dict[str, Any]], what: str, steps: Any) -> None:
    """`index` as one tar stream into tar2sqfs writing `output`; on any failure, tar2sqfs killed and `output`
    removed before the error goes on."""
    from singpy.image.tools import ToolError

    plan = _plan(index)
    advance = _progress(steps, f"Squashing {what}", 1 + len(plan.early) + plan.count + len(plan.hard_links))
    child, messages = _start(tar2sqfs, output)
    try:
        assert child.stdin is not None
        out = child.stdin
        try:
            out.write(header(".", index.root, None))
            for path, node in plan.early:
                out.write(header(path, node, None))
                if isinstance(node, File) and node.content:
                    out.write(node.content + _padding(len(node.content)))
            advance(1 + len(plan.early))
            for number, descriptor in enumerate(descriptors):
                wanted = plan.files.get(number)
                if wanted:
                    layer = f"layer {descriptor['digest']} of {what}"
                    ranges = offsets.ranges(number, wanted)
                    if ranges is None:  # a sparse file: tarfile reads that layer again
                        _send_layer(out, wanted, blobs, descriptor["digest"], layer)
                    else:
                        _send_ranges(out, ranges, blobs, descriptor["digest"], layer)
                    advance(len(wanted))
            for path, target in plan.hard_links:
                info = tarfile.TarInfo(path)
                info.type, info.linkname = tarfile.LNKTYPE, target
                out.write(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
            out.write(b"\0" * (_BLOCK * 2))
            out.close()
        except BrokenPipeError:  # tar2sqfs stopped reading: its status and message say why
            _close_quietly(out)
        status = child.wait()
        messages.join()
        if status != 0:
            said = b"".join(messages.kept).decode(errors="replace")
            if _nearly_full(os.path.dirname(output)):  # tar2sqfs says "I/O error" for ENOSPC: say it here
                said += "\nNo space left on device"
            raise ToolError(f"can't convert {what} to SIF: {_reason(said, status)}", output=said)
        advance(len(plan.hard_links))
    except BaseException:
        if child.poll() is None:
            child.kill()
        _close_quietly(child.stdin)
        child.wait()
        if os.path.lexists(output):
            os.unlink(output)
        raise


class _Plan:
    """What to send: `early` (path, node) with no layer data, `files` per layer: entry number -> (path, File),
    `hard_links` (path, first path) last."""

    def __init__(self) -> None:
        self.early: list[tuple[str, Node]] = []
        self.files: dict[int, dict[int, tuple[str, File]]] = {}
        self.hard_links: list[tuple[str, str]] = []
        self.count = 0  # of the files in `files`


def _plan(index: Index) -> _Plan:
    plan = _Plan()
    first: dict[int, str] = {}  # id of a File -> the first path it was sent under
    for path, node in index.walk():
        if not index.as_root and ("\n" in path or len(os.fsencode(path)) > _MAX_PSEUDO):
            raise Unsupported("a path the tree path can't give mksquashfs an owner for")
        if isinstance(node, File):
            if id(node) in first:
                plan.hard_links.append((path, first[id(node)]))
                continue
            first[id(node)] = path
            if node.source is not None:
                plan.files.setdefault(node.source[0], {})[node.source[1]] = (path, node)
                plan.count += 1
                continue
        plan.early.append((path, node))
    return plan


def _send_ranges(out: Any, ranges: list[tuple[int, str, File]], blobs: Any, digest: str, what: str) -> None:
    """The data of layer `digest`'s entries that the image keeps, copied from where the headers pass found it."""
    from singpy.oci.readahead import ReadAhead
    from singpy.oci.streams import VerifyingReader, open_layer

    raw = blobs.open(digest)
    try:
        with raw if isinstance(raw, VerifyingReader) else VerifyingReader(raw, digest, source=what) as blob, \
                ReadAhead(open_layer(blob, source=what)) as layer:
            send_ranges(out, ranges, layer)
    except OSError as error:  # not the pipe (BrokenPipeError, its own handling): the tree path says what is wrong
        if isinstance(error, BrokenPipeError):
            raise
        raise Unsupported(f"reading a layer: {error.strerror or error}") from None


def _send_layer(out: Any, wanted: dict[int, tuple[str, File]], blobs: Any, digest: str, what: str) -> None:
    """The data of layer `digest`'s entries that the image keeps, each under its final path (a sparse file's
    map forwarded: tar2sqfs makes its holes, a small layer claiming terabytes sends only what it holds)."""
    for ordinal, (member, archive) in enumerate(_layer_members(blobs, digest, what, again=True)):
        found = wanted.get(ordinal)
        if found is None:
            continue
        path, node = found
        if not member.isreg() or member.size != node.size:
            raise ImageError(f"can't convert {what}: it changed while it was read")
        if member.sparse is None:
            out.write(header(path, node, member.size))
            copy_data(out, archive.fileobj, member.size)
            continue
        try:
            regions = sparse_regions(member.sparse, member.size)
        except EntryError as error:  # the tree path refuses it, and says why
            raise Unsupported(f"a sparse file: {error}") from None
        send_sparse(out, path, node, regions, archive.fileobj)


def _nearly_full(directory: str) -> bool:
    """Less room in `directory` than a few blocks tar2sqfs writes at once (its partial output still there)."""
    try:
        info = os.statvfs(directory)
    except OSError:
        return False
    return info.f_bavail * info.f_frsize < _CHUNK or (info.f_files > 0 and info.f_favail == 0)


def _close_quietly(out: Any) -> None:
    """Close the pipe to a tar2sqfs that is gone, dropping what it did not read (no flush error later)."""
    with contextlib.suppress(OSError):
        out.close()


def _padding(size: int) -> bytes:
    return b"\0" * (-size % _BLOCK)


def _progress(steps: Any, description: str, total: int) -> Any:
    """A callback advancing a counted bar of the entries sent (a line without a terminal)."""
    if steps.bar is None:
        steps.step(description)
        return lambda count: None
    task = steps.bar.add_task(console.escape(description), total=total, counted=True)
    return lambda count: steps.bar.update(task, advance=count)


class _Messages:
    """What tar2sqfs writes on stderr, read on a thread (a full pipe must never stop it); the first 64 KiB kept."""

    def __init__(self, stream: Any) -> None:
        import threading

        self.stream, self.size = stream, 0
        self.kept: list[bytes] = []
        self.thread = threading.Thread(target=self._read, name="tar2sqfs-stderr", daemon=True)
        start_thread(self.thread)

    def _read(self) -> None:
        try:
            with self.stream:
                while chunk := self.stream.read1(1 << 16):
                    if self.size < 1 << 16:
                        self.kept.append(chunk)
                        self.size += len(chunk)
        except (OSError, ValueError):  # the pipe closed under the read (a pull torn down by a signal): the
            pass  # messages end here; tar2sqfs's status says the rest (no thread traceback on the terminal)

    def join(self) -> None:
        self.thread.join()


def _start(tar2sqfs: str, output: str) -> tuple[Any, _Messages]:
    """tar2sqfs reading the stream on a pipe; it dies with us (PR_SET_PDEATHSIG)."""
    import subprocess

    from singpy.kernel import syscalls as k

    argv = [tar2sqfs, "-q", "-s", "-e", *COMPRESSION, output]
    console.debug(f"running {argv}")
    parent = os.getpid()
    signals = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, signals)

    def die_with_us() -> None:
        k.prctl(k.PR_SET_PDEATHSIG, 9)
        if os.getppid() != parent:
            os._exit(1)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    try:
        child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 preexec_fn=die_with_us, bufsize=_CHUNK)
    except OSError as error:
        raise Unsupported(f"can't run {tar2sqfs}: {error.strerror}") from None
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return child, _Messages(child.stderr)


def _reason(said: str, status: int) -> str:
    """tar2sqfs's last line (its error), or its status: killed by a signal, or exited."""
    lines = [line.strip() for line in said.splitlines() if line.strip()]
    if lines:
        return console.escape(lines[-1])
    if -status in signal.valid_signals():
        return f"tar2sqfs was killed by {signal.Signals(-status).name}"
    return f"tar2sqfs exited with status {status}"
