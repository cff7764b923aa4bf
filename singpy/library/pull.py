"""library:// images into the cache, and out of it to a file (`singpy pull`).

A library image is a SIF file whose name in the library is the sha256 of its bytes (`sha256.HEX`). It is
kept with the SIFs that pulls make (singpy.oci.store: `sif/HEX.sif`, sealed by its `.id` record, listed and
cleaned by `singpy cache`), downloaded under a name no one can guess, hashed while it arrives and renamed
into place only when its hash is the one the library announced and it is a SIF for the architecture asked
for: a cut download, a wrong file or a wrong architecture leaves nothing in the cache. A reference by hash
already in the cache runs without a request; a tag costs one metadata request (the SIF it last resolved to
runs, with a warning, when the library can't be reached).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from singpy import console
from singpy.errors import ImageError
from singpy.library import client, endpoint, remotes
from singpy.library.ref import LibraryRef, parse
from singpy.library.remotes import RemoteError
from singpy.oci import store
from singpy.record import Record


class LibraryOptions(Record):
    arch: str = ""  # default: this host's
    library: str = ""  # --library URL
    https: bool = True  # False: library://HOST/ over http:// (--no-https)


def cached_image(text: str, options: LibraryOptions, env: Mapping[str, str], home: str, *,
                 offline_ok: bool = True) -> str:
    """The cached SIF of library reference `text`, downloaded first if needed."""
    from singpy.image.sifscan import host_arch

    ref = parse(text)
    arch = options.arch or host_arch()
    location = store.location(env, home)
    if ref.by_hash and store.usable_sif(location, _digest(ref.tag)):
        return store.sif_path(location, _digest(ref.tag))  # a file's own hash: nothing to ask
    view = remotes.user_view(env, home)
    key = f"{ref} {options.library or ref.host or 'remote:' + view.active}"
    known = store.recall(location, key, arch)
    known_sif = store.usable_sif(location, known["digest"]) if known else ""
    try:
        lib = endpoint.choose(view, env, host=ref.host, library=options.library, https=options.https)
        image = client.get_image(lib, ref, arch, env)
    except RemoteError as error:
        if not (offline_ok and known_sif and _unreachable(error)):
            raise
        console.warning(f"{error.message}: running the cached image {ref} ({known['digest'][:19]})")
        return known_sif
    digest = _digest(str(image["hash"]))
    size = image.get("size")
    sif = ensure(lib, ref, arch, digest, location, env, size=size if isinstance(size, int) and size > 0 else 0)
    store.remember(location, key, arch, top=digest, digest=digest)
    return sif


def pull(text: str, target: str, options: LibraryOptions, env: Mapping[str, str], home: str, *,
         force: bool) -> str:
    """`singpy pull [TARGET] library://...`: the image as the file `target`. Returns a summary."""
    from singpy.library.ref import default_name
    from singpy.oci.pull import _copy, check_target

    ref = parse(text)
    target = os.path.abspath(target or default_name(ref))
    check_target(target, force=force)
    sif = cached_image(text, options, env, home, offline_ok=False)
    _copy(sif, target)
    return f"pulled {ref} to {target}"


def ensure(lib: endpoint.Library, ref: LibraryRef, arch: str, digest: str, location: str,
           env: Mapping[str, str], *, size: int = 0) -> str:
    """The cached SIF with `digest`, downloaded once however many singpy runs ask at the same time."""
    sif = store.sif_path(location, digest)
    if not store.usable_sif(location, digest):
        store.ensure(location, store.SIFS)
        lock = f"{location}/{store.SIFS}/.{store.hex_of(digest)}.lock"
        with store.locked(lock, waiting_for=f"another singpy to finish downloading {ref}"):
            if not store.usable_sif(location, digest):
                _download(lib, ref, arch, digest, sif, env, size)
    return sif


def _download(lib: endpoint.Library, ref: LibraryRef, arch: str, digest: str, sif: str,
              env: Mapping[str, str], size: int) -> None:
    """`size`: the size the library announced (0: none); a file that grows past it is cut short."""
    import hashlib
    import time

    from singpy.host.cachefiles import create_new
    from singpy.image import tools

    try:
        fd, temporary = create_new(sif)
    except OSError as error:
        raise ImageError(f"can't write in the cache {os.path.dirname(sif)}: {error.strerror}") from None
    try:
        hasher = hashlib.sha256()
        with os.fdopen(fd, "wb") as out, tools.Interruptible():
            console.verbose(f"downloading the library image {ref}")
            try:
                client.download(lib, ref, arch, env, _Hashing(out, hasher, ref, size))
            except OSError as error:
                raise ImageError(f"can't write {sif}: {error.strerror}") from None
            except tools.Interrupted as interrupted:
                raise tools.Interrupted(f"pull of {ref} {interrupted.message}: nothing was kept") from None
        if f"sha256:{hasher.hexdigest()}" != digest:
            raise ImageError(f"the file the library sent for {ref} is not sha256.{store.hex_of(digest)}, the "
                             "hash it announced: nothing was kept; try again, or tell the library's administrator")
        _check_arch(ref, temporary, arch)
        os.replace(temporary, sif)
    except BaseException:
        _unlink(temporary)
        raise
    store.seal_sif(sif, digest, {"source": str(ref), "platform": arch, "library": lib.url,
                                 "created": int(time.time())})


class _Hashing:
    """A file that hashes what is written to it, and refuses more than `size` bytes (when known): a library
    or object store that sends without end can't fill the disk."""

    def __init__(self, out: Any, hasher: Any, ref: LibraryRef, size: int) -> None:
        self.out, self.hasher, self.ref, self.size, self.written = out, hasher, ref, size, 0

    def write(self, data: bytes) -> None:
        self.written += len(data)
        if self.size and self.written > self.size:
            raise ImageError(f"the library sent more than the {self.size} bytes it announced for {self.ref}: "
                             "nothing was kept")
        self.hasher.update(data)
        self.out.write(data)


def _check_arch(ref: LibraryRef, path: str, arch: str) -> None:
    """The file is a SIF whose system partition is for `arch` (the library's word is not taken for it)."""
    from singpy.errors import SifError
    from singpy.image.sif import read_sif

    try:
        found = read_sif(path).primary_partition().arch
    except SifError as error:
        raise ImageError(f"the file the library sent for {ref} is not a usable SIF ({error.message})") from None
    if found != arch:
        raise ImageError(f"the library sent a SIF for {found} as {ref} for {arch}: nothing was kept; pull it "
                         f"with --arch {found} if that is the architecture you want")


def _digest(tag: str) -> str:
    """sha256.HEX (the library's spelling) as a digest the cache takes; ImageError for any other hash."""
    digest = "sha256:" + tag.removeprefix("sha256.")
    if not tag.startswith("sha256.") or not store.is_hex(digest[7:]):
        raise ImageError(f"the library names the image by {tag[:80]!r}: singpy takes sha256 hashes only")
    return digest


def _unreachable(error: RemoteError) -> bool:
    from singpy.library.web import HTTPError

    return not isinstance(error, (HTTPError, client.NotFound)) and "can't reach" in error.message


def _unlink(path: str) -> None:
    try:  # noqa: SIM105 - one call
        os.unlink(path)
    except OSError:
        pass
