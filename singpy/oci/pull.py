"""Getting an image: docker://, oci:, oci-archive: and docker-archive: references made SIFs or sandboxes.

The one orchestrator of singpy.oci: it resolves a reference to the manifest
of one platform (ref, registry or local, platform), fetches the layers into
the cache (layercache, on store; its progress: progress.Steps), applies them
to a fresh tree (layers), writes Apptainer's /.singularity.d (convert) and
squashes the tree into a SIF in the cache.

`run`, `exec`, `shell` and `inspect` call `cached_image` before anything
else: the launch itself only ever sees a SIF file. A SIF is cached under the
digest of the platform's manifest, so a tag that moves gets a new SIF and an
unchanged one costs one HEAD request; a reference by digest, none.
"""

from __future__ import annotations

import os
import time

from singpy import __version__, console
from singpy.constants import SQUASH_MEMORY
from singpy.errors import ImageError
from singpy.image import cache, tools
from singpy.oci import lookedup, store
from singpy.oci.ref import Reference, parse
from singpy.record import Record

TYPE_CHECKING = False  # see singpy.record: `typing` is not loaded at run time (a cached image starts fast)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, Protocol

    class Source(Protocol):
        """A registry (singpy.oci.registry.Registry) or a local layout/archive (singpy.oci.local.LocalSource)."""

        def manifest(self, reference: str | None) -> Any: ...

        def blob_bytes(self, digest: str, limit: int = ...) -> bytes: ...

# gzip at level 6: the same size as level 9 (mksquashfs's default) on the images measured, at 2.6x the speed
# (docs/performance.md). gzip because every kernel and squashfuse reads it.
SQUASH_COMPRESSION = ("-comp", "gzip", "-Xcompression-level", "6")
_NOHTTPS = ("SINGPY_NOHTTPS", "APPTAINER_NOHTTPS", "SINGULARITY_NOHTTPS")


class PullOptions(Record):
    """How to reach the image: what `--arch`, `--no-https`, `--authfile` and `--docker-login` say."""

    arch: str = ""
    variant: str = ""  # --arch-variant: the variant of `arch` (or of this host's), as "v7" or "7"
    https: bool = True
    authfile: str = ""
    login: bool = False
    reproducible: bool = False  # --reproducible: the SIF dated by the image's creation (singpy.image.builddate)


class Resolved(Record):
    """A reference pinned to one platform's image manifest."""

    reference: Reference
    platform: str  # "linux/amd64"
    top: str  # the digest the reference names now (an index, or the manifest itself)
    manifest: Any  # singpy.oci.manifest.Manifest of the platform's image
    source: Any  # Source
    epoch: int | None = None  # the date of a reproducible SIF (singpy.image.builddate), None: a SIF of now
    config: dict[str, Any] | None = None  # the image config once read: a --reproducible pull's date, then its SIF


def nohttps(env: Mapping[str, str]) -> bool:
    """APPTAINER_NOHTTPS and its spellings, as --no-https."""
    return any(env.get(name, "").lower() in ("1", "true", "yes", "on") for name in _NOHTTPS)


def cached_image(text: str, options: PullOptions, env: Mapping[str, str], home: str) -> str:
    """The cached SIF of image reference `text`, pulled and converted first if needed.

    A reference by digest that was converted before is used without any
    request. A tag is checked with one HEAD request; if the registry cannot
    be reached, the SIF it last resolved to runs, with a warning.
    """
    ref = parse(text)
    location = store.location(env, home)
    want = _platform(options)
    if ref.transport == "docker":
        if ref.digest and store.usable_sif(location, ref.digest):
            return store.sif_path(location, ref.digest)  # the digest of an image's manifest: nothing to ask
        known, known_sif = lookedup.known(location, str(ref), str(want))  # as looked up by the check sent ahead
        if ref.digest and known_sif and known["top"] == ref.digest:
            return known_sif  # an index's digest, resolved for this platform before
        source, reference = None, ref.digest or ref.tag or "latest"
        try:
            top = _quick_top(ref, reference, options, env, home) if known_sif else None
            if top is None:  # nothing cached, or the quick check left it to the full client
                source = _registry(ref, options, env, home)
                top = source.head_digest(reference)
        except ImageError as error:
            if not (_unreachable(error) and known_sif):
                raise
            console.warning(f"{error.message}: running the cached image {ref} ({known['digest'][:19]})")
            return known_sif
        if known and top == known["top"] and known_sif:
            return known_sif
        return ensure_sif(resolve(ref, source or _registry(ref, options, env, home), want), location, env)
    return ensure_sif(resolve(ref, _local(ref), want), location, env)


def pull(text: str, target: str, options: PullOptions, env: Mapping[str, str], home: str, *,
         force: bool) -> str:
    """`singpy pull [TARGET] REF`: the image as the SIF file `target` (default: NAME_TAG.sif). Returns a summary."""
    ref = parse(text)
    target = os.path.abspath(target or default_name(ref))
    check_target(target, force=force)
    location = store.location(env, home)
    source = _registry(ref, options, env, home) if ref.transport == "docker" else _local(ref)
    resolved = resolve(ref, source, _platform(options))
    from singpy.image import builddate

    if builddate.wanted(options.reproducible):  # made in a temporary cache then (singpy.cli)
        created = None
        if options.reproducible:  # dated by the image's config, kept for the conversion: one request for it
            config = _config(resolved)
            resolved, created = resolved.replace(config=config), builddate.of_config(config, str(ref))
        resolved = resolved.replace(epoch=builddate.chosen(options.reproducible, created, str(ref)))
    sif = ensure_sif(resolved, location, env)
    _copy(sif, target)
    return f"pulled {ref} to {target}"


def image_created(sif: str) -> int | None:
    """The creation date of the OCI image whose SIF `sif` is in the cache (as its record says), else None."""
    seconds = cache.read_record(sif.removesuffix(".sif") + ".json").get("image_created")
    return seconds if isinstance(seconds, int) and not isinstance(seconds, bool) else None


def build_from(text: str, target: str, options: PullOptions, env: Mapping[str, str], home: str, *,
               sandbox: bool, force: bool) -> str:
    """`singpy build [--sandbox] TARGET REF`: a SIF (through the cache, as pull) or a sandbox directory."""
    if not sandbox:
        return pull(text, target, options, env, home, force=force).replace("pulled", "built", 1)
    ref = parse(text)
    target = os.path.abspath(target)
    check_target(target, force=force)
    source = _registry(ref, options, env, home) if ref.transport == "docker" else _local(ref)
    resolved = resolve(ref, source, _platform(options))
    location = store.location(env, home)
    from singpy.image.builder import publish_tree, scratch_dir

    scratch = scratch_dir(target, ".singpy-build-")
    try:
        with tools.Interruptible():
            try:
                tree = f"{scratch}/root"
                _tree_of(resolved, tree, location)
                publish_tree(tree, target, f"{scratch}/old")
            except tools.Interrupted as interrupted:
                raise tools.Interrupted(f"build of {target} {interrupted.message}: nothing was written") from None
            except OSError as error:
                raise ImageError(f"can't write {target}: {error.strerror}") from None
            except ImageError as error:
                raise store.space_error(error, os.path.dirname(target), env) from None
    finally:
        cache.remove_tree(scratch)
    return f"built the sandbox {target} from {ref}"


def default_name(ref: Reference) -> str:
    """What Apptainer's pull names the file: the image's last name and its tag (alpine_latest.sif)."""
    if ref.transport == "docker":
        name = ref.repository.rsplit("/", 1)[-1]
        version = ref.tag if ref.tag and not ref.digest else (ref.digest or "").replace(":", ".")
    else:
        name = os.path.basename(ref.path.rstrip("/")).removesuffix(".tar") or "image"
        version = ref.tag or "latest"
    return f"{name}_{version}.sif"


def check_target(target: str, *, force: bool) -> None:
    """The file a pull writes: refused when it exists (unless `force`), is a directory or can't be a path."""
    from singpy.host.hostfiles import path_problem, shown

    problem = path_problem(target)
    if problem:
        raise ImageError(f"can't write {shown(target)}: {problem}")
    if os.path.lexists(target) and not force:
        raise ImageError(f"{target} already exists (use --force to overwrite it)")
    if os.path.isdir(target) and not os.path.islink(target):
        raise ImageError(f"{target} is a directory: give the name of the file to write")


def _platform(options: PullOptions) -> Any:
    from singpy.oci import platform

    wanted = platform.parse_arch(options.arch) if options.arch else platform.host_platform()
    if options.variant:  # Apptainer's --arch-variant: checked as --arch ARCH/VARIANT is, and wins over its variant
        wanted = platform.parse_arch(f"{wanted.architecture}/{options.variant}")
    return wanted


def _registry(ref: Reference, options: PullOptions, env: Mapping[str, str], home: str) -> Any:
    """The client of `ref`'s registry, or of its mirrors and location from registries.conf (singpy.oci.mirrors)."""
    from singpy.oci import auth, mirrors

    login = auth.prompt_credentials(ref.registry) if options.login else None

    def credentials(endpoint: Reference, endpoint_env: Mapping[str, str]) -> Any:
        if login is not None and endpoint.registry == ref.registry:  # typed for this registry: never a mirror's
            return login
        return auth.find_credentials(endpoint.registry, endpoint_env, authfile=options.authfile or None, home=home)

    return mirrors.registry_for(ref, env=env, home=home, https=options.https and not nohttps(env),
                                credentials=credentials)


def _quick_top(ref: Reference, reference: str, options: PullOptions, env: Mapping[str, str], home: str) -> Any:
    """The digest `reference` names now, by singpy.oci.quickhead's one request (no http.client); None: ask
    the full client (a challenge, a redirect, a proxy, registries.conf...). Only a cached image gains by it."""
    from singpy.oci import quickhead

    return quickhead.cached_top(ref, reference, login=options.login, https=options.https and not nohttps(env),
                                env=env, home=home)


def _local(ref: Reference) -> Any:
    from singpy.oci import local

    return local.open_source(ref)


def _unreachable(error: ImageError) -> bool:
    """Whether `error` says the registry could not be reached at all (not: it refused or lacks the image)."""
    from singpy.oci.regerrors import Unreachable

    return isinstance(error, Unreachable)


def resolve(ref: Reference, source: Source, want: Any) -> Resolved:
    """The manifest of platform `want` that `ref` names (through an index if it is one)."""
    from singpy.oci import platform

    top = source.manifest(ref.digest or ref.tag)
    manifest = top
    if "manifests" in top.body:
        chosen = platform.choose(top.body, want, source=str(ref))
        manifest = source.manifest(str(chosen.get("digest", "")))
        if "manifests" in manifest.body:
            raise ImageError(f"{ref}: the index entry for {want} is itself an index: not supported")
    elif not isinstance(top.body.get("layers"), list):
        raise ImageError(f"{ref}: not an image manifest (no layers)")
    return Resolved(reference=ref, platform=str(want), top=top.digest, manifest=manifest, source=source)


def ensure_sif(resolved: Resolved, location: str, env: Mapping[str, str]) -> str:
    """The SIF of `resolved` in the cache, made once however many singpy runs ask at the same time."""
    sif = store.sif_path(location, resolved.manifest.digest)
    if not store.usable_sif(location, resolved.manifest.digest):  # missing, or not the one singpy made there
        store.ensure(location, store.SIFS)
        lock = f"{location}/{store.SIFS}/.{store.hex_of(resolved.manifest.digest)}.lock"
        with store.locked(lock, waiting_for=f"another singpy to finish converting {resolved.reference}"):
            if not store.usable_sif(location, resolved.manifest.digest):  # the run we waited for may have made it
                _convert(resolved, sif, location, env)
    if resolved.reference.transport == "docker":
        store.remember(location, str(resolved.reference), resolved.platform, top=resolved.top,
                       digest=resolved.manifest.digest)
    return sif


def _convert(resolved: Resolved, sif: str, location: str, env: Mapping[str, str]) -> None:
    """Layers -> tree -> /.singularity.d -> squashfs -> SIF at `sif`, in a work directory removed after."""
    work = store.work_dir(location, env, purpose="convert")
    held = store.hold_work_dir(work)
    try:
        with tools.Interruptible():
            try:
                config = _make_sif(resolved, work, sif, location, env)
            except tools.Interrupted as interrupted:
                raise tools.Interrupted(f"pull of {resolved.reference} {interrupted.message}") from None
            except OSError as error:
                raise store.space_error(ImageError(f"can't convert {resolved.reference} in {work}: "
                                                   f"{error.strerror}"), os.path.dirname(work), env,
                                        cache=location) from None
            except ImageError as error:
                raise store.space_error(error, os.path.dirname(work), env, cache=location) from None
        from singpy.image.builddate import created_seconds

        store.seal_sif(sif, resolved.manifest.digest, {
            "source": str(resolved.reference), "platform": resolved.platform, "created": int(time.time()),
            "image_created": created_seconds(config)})  # for a reproducible build on this image
    finally:
        cache.remove_tree(work)
        os.close(held)


def _make_sif(resolved: Resolved, work: str, sif: str, location: str, env: Mapping[str, str]) -> dict[str, Any]:
    """The SIF at `sif` made through the merged stream where it can hold the image, else through a tree for
    mksquashfs; returns the image's config. A fallback goes on with the same progress and the same blobs: it
    says nothing twice (Steps shows a line once) and downloads nothing again."""
    from singpy.oci.layercache import Blobs
    from singpy.oci.progress import Steps

    config = _config(resolved)
    descriptors = _layer_list(resolved)
    ownership = _ownership()
    with Steps(f"Getting {resolved.reference}") as steps:
        blobs = Blobs(resolved.source, descriptors, location, steps)
        if _streamed(resolved, config, descriptors, blobs, steps, work, sif, env):
            return config
        _assemble(resolved, config, descriptors, blobs, steps, f"{work}/rootfs", ownership=ownership)
    _squash(resolved, config, f"{work}/rootfs", work, sif, ownership)  # the Steps' bar gone: mksquashfs has its own
    return config


def _streamed(resolved: Resolved, config: dict[str, Any], descriptors: list[dict[str, Any]], blobs: Any, steps: Any,
              work: str, sif: str, env: Mapping[str, str]) -> bool:
    """The SIF made from the layers as one merged tar stream into tar2sqfs, with no tree (singpy.oci.streamsquash);
    False where the image needs the tree path (or SINGPY_PULL_TREE=1 asks for it)."""
    from singpy.oci import streamsquash

    if streamsquash.forced_tree(env):
        return False
    squashed = streamsquash.squash(blobs, steps, descriptors, str(resolved.reference), work, config=config,
                                   labels=_labels(resolved, config), deffile=_deffile(resolved.reference),
                                   epoch=resolved.epoch)
    if squashed is None:
        return False
    _write_sif(resolved, config, squashed.path, sif, squashed.attributes)
    return True


def _ownership() -> Any:
    """None as root (owners, modes and devices applied for real), else a record of what could not be."""
    from singpy.oci.owners import Ownership

    return None if os.getuid() == 0 else Ownership()


def _config(resolved: Resolved) -> dict[str, Any]:
    if resolved.config is not None:
        return resolved.config
    import json

    descriptor = resolved.manifest.body.get("config")
    digest = descriptor.get("digest") if isinstance(descriptor, dict) else None
    if not isinstance(digest, str):
        raise ImageError(f"{resolved.reference}: the manifest has no config digest")
    try:
        config = json.loads(resolved.source.blob_bytes(digest))
    except (ValueError, RecursionError):
        raise ImageError(f"{resolved.reference}: the image config is not valid JSON") from None
    if not isinstance(config, dict):
        raise ImageError(f"{resolved.reference}: the image config is not a JSON object")
    return config


def _layer_list(resolved: Resolved) -> list[dict[str, Any]]:
    found = resolved.manifest.body.get("layers")
    if not isinstance(found, list) or not all(isinstance(layer, dict) and isinstance(layer.get("digest"), str)
                                              for layer in found):
        raise ImageError(f"{resolved.reference}: the manifest's layers are malformed")
    for layer in found:
        store.hex_of(layer["digest"])
    return found


def _tree_of(resolved: Resolved, tree: str, location: str) -> None:
    """The image's root filesystem at `tree` (new), with Apptainer's /.singularity.d, for a sandbox."""
    from singpy.oci.layercache import Blobs
    from singpy.oci.progress import Steps

    config = _config(resolved)
    descriptors = _layer_list(resolved)
    with Steps(f"Getting {resolved.reference}") as steps:
        blobs = Blobs(resolved.source, descriptors, location, steps)
        _assemble(resolved, config, descriptors, blobs, steps, tree, ownership=_ownership())


def _assemble(resolved: Resolved, config: dict[str, Any], descriptors: list[dict[str, Any]], blobs: Any,
              steps: Any, tree: str, *, ownership: Any) -> None:
    """The image's root filesystem at `tree` (new), with Apptainer's /.singularity.d."""
    from singpy.oci import convert, layers
    from singpy.oci.streams import open_layer

    os.mkdir(tree, 0o755)
    for number, descriptor in enumerate(descriptors, 1):
        digest = descriptor["digest"]
        with blobs.open(digest) as stream:
            steps.extracting(number, len(descriptors), digest)
            what = f"layer {digest} of {resolved.reference}"
            layers.apply_layer(tree, open_layer(stream, source=what), ownership=ownership, source=what)
    written = convert.install(tree, config, _labels(resolved, config), deffile=_deffile(resolved.reference))
    for path, mode in written.items() if ownership is not None else ():
        ownership.record(path, mode, 0, 0)  # root's, over whatever a layer had recorded at that path


def _labels(resolved: Resolved, config: dict[str, Any]) -> dict[str, str]:
    """The labels Apptainer's build adds for an OCI source (convert merges the image's own)."""
    from singpy.image.builddate import label_time
    from singpy.image.detect import host_arch

    ref = resolved.reference
    arch = config.get("architecture") if isinstance(config.get("architecture"), str) else host_arch()
    return {
        "org.label-schema.build-arch": str(arch),
        "org.label-schema.build-date": time.strftime("%A_%-d_%B_%Y_%H:%M:%S_UTC", label_time(resolved.epoch)),
        "org.label-schema.schema-version": "1.0",
        "org.label-schema.usage.singularity.deffile.bootstrap": ref.transport,
        "org.label-schema.usage.singularity.deffile.from": _from(ref),
        "org.label-schema.usage.singpy.version": __version__,
    }


def _deffile(ref: Reference) -> bytes:
    from singpy.oci.singularityd import deffile_for

    return deffile_for(str(ref))


def _from(ref: Reference) -> str:
    return str(ref).split(":", 1)[1].removeprefix("//")


def _squash(resolved: Resolved, config: dict[str, Any], tree: str, work: str, sif: str, ownership: Any) -> None:
    from singpy.image.metadata import read_tree
    from singpy.oci.owners import squash_options

    mksquashfs = tools.require_tool("mksquashfs", env=os.environ, purpose="convert an image to SIF")
    squashfs = f"{work}/rootfs.squashfs"
    extra = squash_options(ownership, f"{work}/pseudo")
    tools.run_tool([mksquashfs, tree, squashfs, "-noappend", *SQUASH_COMPRESSION, *SQUASH_MEMORY, *extra],
                   label=f"Squashing {resolved.reference}", failure=f"can't convert {resolved.reference} to SIF")
    _write_sif(resolved, config, squashfs, sif, read_tree(tree))


def _write_sif(resolved: Resolved, config: dict[str, Any], squashfs: str, sif: str,
               attributes: dict[str, Any]) -> None:
    from singpy.constants import ARCHES
    from singpy.image.detect import host_arch
    from singpy.image.sifwrite import build_sif_from_squashfs

    arch = config.get("architecture")
    deffile = _deffile(resolved.reference)
    attributes.setdefault("deffile", deffile.decode())
    try:
        build_sif_from_squashfs(sif, squashfs, arch=arch if arch in ARCHES else host_arch(), deffile=deffile,
                                inspect_metadata={"data": {"attributes": attributes}, "type": "container"},
                                oci_config=config.get("config") if isinstance(config.get("config"), dict) else {},
                                deterministic=resolved.epoch is not None)
    except OSError as error:  # written in the cache, not in the work directory: the message says where
        raise ImageError(f"can't write the SIF {sif}: {error.strerror}") from None


def _copy(sif: str, target: str) -> None:
    """The cached SIF to `target`, whole or not at all (an existing target is replaced only by a full copy)."""
    import shutil
    import tempfile

    directory = os.path.dirname(target)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp", dir=directory)
    except OSError as error:
        raise ImageError(f"can't write {target}: {error.strerror}") from None
    os.close(fd)
    try:
        with tools.Interruptible():
            shutil.copyfile(sif, tmp)
            from singpy.image.sifwrite import sif_mode

            os.chmod(tmp, sif_mode())  # 0755 less the umask, as Apptainer's pull
            os.replace(tmp, target)
    except OSError as error:
        problem = ImageError(f"can't write {target}: {error.strerror}")
        if tools.out_of_space(problem, directory):
            problem = ImageError(f"can't write {target}: no space left on device in {directory}",
                                 hint="free some space there, or pull into another directory")
        raise problem from None
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
