"""oras://: a SIF file kept as an OCI artifact in any registry, as Apptainer's ORAS transport stores it.

An `oras://HOST/REPO:TAG` reference names an OCI image manifest whose one layer
is the SIF file itself (media type `application/vnd.sylabs.sif.layer.v1.sif`,
or Singularity < 3.7's misspelt `appliciation/vnd.sylabs.sif.layer.tar`) and
whose config is the empty JSON `{}` typed `application/vnd.sylabs.sif.config.v1+json`
(Apptainer's internal/pkg/client/oras; the config type is not checked on pull,
as Apptainer does not: its older versions did not set it consistently).

The registry is spoken to by singpy.oci.registry exactly as for docker://
(the same credentials, tokens, TLS rules, mirrors and limits: pull.py's
`_registry`). The SIF is the blob: downloaded straight into the cache as
`sif/<layer hex>.sif` (resumed from its `.partial`, verified against the
layer digest, checked to be a SIF, then sealed by store.seal_sif), so a run
of a cached `oras://` image costs one HEAD request for a tag and none for a
digest, as a docker:// one does; `refs/` records what the reference resolved
to, so that a cached image runs while the registry is unreachable.
"""

from __future__ import annotations

import os
import time

from singpy import console
from singpy.errors import ImageError
from singpy.oci import lookedup, store
from singpy.oci.ref import Reference

TYPE_CHECKING = False  # see singpy.record: `typing` is not loaded at run time
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from singpy.oci.pull import PullOptions

PREFIX = "oras://"
SIF_LAYER = "application/vnd.sylabs.sif.layer.v1.sif"
SIF_LAYER_PROTO = "appliciation/vnd.sylabs.sif.layer.tar"  # Singularity < 3.7's typo, still pulled by Apptainer
SIF_CONFIG = "application/vnd.sylabs.sif.config.v1+json"
EMPTY_CONFIG = b"{}"  # the config Apptainer pushes (the OCI empty value)
TITLE = "org.opencontainers.image.title"
SIF_MAGIC = b"SIF_MAGIC\0"  # at offset 32 of every SIF (singpy.image.sif.MAGIC)


def is_oras(text: str) -> bool:
    return text.startswith(PREFIX)


def parse_ref(text: str) -> Reference:
    """oras://[HOST/]REPO[:TAG|@DIGEST], normalized as a docker:// reference (Apptainer parses it so)."""
    from singpy.oci.ref import parse

    if not is_oras(text):
        raise ImageError(f"{text[:100]!r} is not an oras:// reference")
    rest = text[len(PREFIX):]
    try:
        return parse(f"docker://{rest}")
    except ImageError as error:
        raise ImageError(error.message.replace(f"docker://{rest}", text), hint=error.hint) from None


def shown(ref: Reference) -> str:
    """The reference as the user names it: oras://HOST/REPO:TAG."""
    return PREFIX + str(ref).removeprefix("docker://")


def as_oras(error: ImageError, ref: Reference) -> ImageError:
    """`error` (from the registry client, which names docker:// images) naming the oras:// reference instead."""
    docker = f"docker://{ref.registry}/{ref.repository}"
    if docker not in error.message:
        return error
    return type(error)(error.message.replace(docker, f"{PREFIX}{ref.registry}/{ref.repository}"), hint=error.hint)


def sif_layer(manifest: Any, ref: Reference) -> dict[str, Any]:
    """The one SIF layer of an ORAS manifest; an ImageError when it is anything else."""
    layers = manifest.body.get("layers")
    if not isinstance(layers, list) or len(layers) != 1:
        count = len(layers) if isinstance(layers, list) else 0
        raise ImageError(f"{shown(ref)} is not a SIF stored with ORAS: its manifest has {count} layers, not one",
                         hint="an image pushed by docker, podman or skopeo is pulled with docker://")
    layer = layers[0]
    media_type = str(layer.get("mediaType", ""))
    if media_type not in (SIF_LAYER, SIF_LAYER_PROTO):
        raise ImageError(f"{shown(ref)} is not a SIF stored with ORAS: its layer is of type "
                         f"{media_type[:100]!r}, not {SIF_LAYER}",
                         hint="an image pushed by docker, podman or skopeo is pulled with docker://")
    store.hex_of(layer["digest"])  # a sha256 digest: it names the cached file
    return dict(layer)


def cached_sif(text: str, options: PullOptions, env: Mapping[str, str], home: str) -> str:
    """The cached SIF of `oras://...` (downloaded first if needed), as pull.cached_image is for docker://.

    A reference by digest that was pulled before runs without any request; a tag costs one HEAD request,
    and when the registry can't be reached the SIF it last resolved to runs, with a warning.
    """
    ref = parse_ref(text)
    location = store.location(env, home)
    platform = str(_platform(options))
    known, known_sif = lookedup.known(location, shown(ref), platform)  # as looked up by the check sent ahead
    if ref.digest and known_sif and known["top"] == ref.digest:
        return known_sif
    if not known_sif:  # nothing to compare a tag with: the pull itself, by the quick client where it can
        pulled = _quick_fetch(ref, options, location, env, home)
        if pulled:
            return pulled
    source = None
    try:
        top = _quick_top(ref, ref.manifest_reference, options, env, home) if known_sif else None
        if top is None:  # nothing cached, or the quick check left it to the full client
            source = _source(ref, options, env, home)
            top = source.head_digest(ref.manifest_reference)
    except ImageError as error:
        from singpy.oci.regerrors import Unreachable

        if not (isinstance(error, Unreachable) and known_sif):
            raise as_oras(error, ref) from None
        console.warning(f"{error.message}: running the cached image {shown(ref)} ({known['digest'][:19]})")
        return known_sif
    if known and top == known["top"] and known_sif:
        return known_sif
    return fetch_sif(ref, source or _source(ref, options, env, home), options, location)


def _quick_fetch(ref: Reference, options: PullOptions, location: str, env: Mapping[str, str], home: str) -> str:
    """The SIF `ref` names, fetched by singpy.oci.quickget (no http.client) where the registry is asked
    directly and anonymously; "" where it is not, or where the quick client leaves the rest to the full
    one (its `.partial` download is resumed there)."""
    from singpy.oci import quickget
    from singpy.oci.pull import nohttps

    quick = quickget.open_quick(ref, https=options.https and not nohttps(env), login=options.login, env=env,
                                home=home)
    if quick is None:
        return ""
    try:
        sif = fetch_sif(ref, quick, options, location)
        console.debug(f"quick pull of {shown(ref)}: done without the full HTTP client")
        return sif
    except quickget.Fallback as reason:
        console.debug(f"quick pull of {shown(ref)}: {reason}; asking with the full client")
        return ""


def fetch_sif(ref: Reference, source: Any, options: PullOptions, location: str) -> str:
    """The SIF that `ref` names now, downloaded into the cache unless it is there already."""
    from singpy.oci.pull import resolve

    platform = _platform(options)
    try:
        resolved = resolve(ref, source, platform)
    except ImageError as error:
        raise as_oras(error, ref) from None
    layer = sif_layer(resolved.manifest, ref)
    digest = layer["digest"]
    if not store.usable_sif(location, digest):
        store.ensure(location, store.SIFS)
        lock = f"{location}/{store.SIFS}/.{store.hex_of(digest)}.lock"
        with store.locked(lock, waiting_for=f"another singpy to finish downloading {shown(ref)}"):
            if not store.usable_sif(location, digest):
                _download(ref, source, layer, store.sif_path(location, digest), str(platform))
    store.remember(location, shown(ref), str(platform), top=resolved.top, digest=digest)
    return store.sif_path(location, digest)


def _download(ref: Reference, source: Any, layer: dict[str, Any], sif: str, platform: str) -> None:
    """The SIF blob to `sif` (resumed, verified: singpy.oci.blobfetch), checked to be a SIF, then sealed."""
    from singpy.image import tools
    from singpy.oci.progress import Steps

    digest, size = layer["digest"], layer["size"]
    with Steps(f"Downloading {shown(ref)}") as steps:
        progress = steps.transfer(f"SIF {digest[:19]}", size)
        try:
            with tools.Interruptible():
                source.fetch_blob(digest, sif, size=size, progress=progress)
        except tools.Interrupted as interrupted:
            raise tools.Interrupted(f"pull of {shown(ref)} {interrupted.message}") from None
        except ImageError as error:
            raise as_oras(error, ref) from None
    if not _has_sif_magic(sif):
        os.unlink(sif)
        raise ImageError(f"{shown(ref)} is not a SIF file: its layer has the SIF media type but other content")
    record = {"source": shown(ref), "platform": platform, "created": int(time.time())}
    store.seal_sif(sif, digest, record, unsynced=not getattr(source, "durable", True))  # quickget's: no fsync


def pull(text: str, target: str, options: PullOptions, env: Mapping[str, str], home: str, *, force: bool) -> str:
    """`singpy pull [OUT.sif] oras://...`: the SIF through the cache to `target` (default: NAME_TAG.sif)."""
    from singpy.oci.pull import _copy, check_target, default_name

    ref = parse_ref(text)
    target = os.path.abspath(target or default_name(ref))
    check_target(target, force=force)
    sif = cached_sif(text, options, env, home)
    if not _linked(sif, target):
        _copy(sif, target)
    return f"pulled {shown(ref)} to {target}"


def _has_sif_magic(path: str) -> bool:
    """Whether the file starts as a SIF does (singpy.image.sif.is_sif's check, without loading that module and
    its dataclasses: a pull's start-up is part of what it costs)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return os.pread(fd, 42, 0)[32:42] == SIF_MAGIC
    finally:
        os.close(fd)


def _linked(sif: str, target: str) -> bool:
    """The cached SIF hard-linked at `target` (replaced whole), where both are on one filesystem: no copy of
    hundreds of MB. A later rewrite of either file changes the identity its seal records (store.usable_sif),
    so the cache never runs a SIF changed after its digest was checked: it downloads it again."""
    from singpy.host.cachefiles import create_new

    try:
        fd, temporary = create_new(target)  # a random name beside the target, made O_EXCL: then replaced
        os.close(fd)
        os.unlink(temporary)
        os.link(sif, temporary)
    except OSError:  # another filesystem (EXDEV), or links refused: the caller copies
        return False
    try:
        from singpy.image.sifwrite import sif_mode

        os.chmod(temporary, sif_mode())  # 0755 less the umask, as a copy would be; the mode is not part of the seal
        os.replace(temporary, target)
    except OSError as error:
        import contextlib  # here, not at the top: ~0.8 ms of every cached oras:// run (issue 31)

        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise ImageError(f"can't write {target}: {error.strerror}") from None
    return True


def _platform(options: PullOptions) -> Any:
    from singpy.oci.pull import _platform as platform_of

    return platform_of(options)


def _quick_top(ref: Reference, reference: str, options: PullOptions, env: Mapping[str, str], home: str) -> Any:
    from singpy.oci.pull import _quick_top as quick_top

    return quick_top(ref, reference, options, env, home)


def _source(ref: Reference, options: PullOptions, env: Mapping[str, str], home: str) -> Any:
    from singpy.oci.pull import _registry

    return _registry(ref, options, env, home)
