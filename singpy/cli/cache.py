"""`singpy cache list|clean`: the per-user cache of unpacked images (singpy.image.cache) and of pulled
images: their SIFs and layer blobs (singpy.oci.store)."""

from __future__ import annotations

import os
import time

import typer

from singpy.console import escape, human_size
from singpy.host import cachefiles
from singpy.image import cache

cache_app = typer.Typer(name="cache", help="Manage the cache of unpacked and pulled images.",
                        no_args_is_help=True)


def _location() -> str:
    """The user's cache, refused (one FATAL line) if it, a directory above it or one of its own directories
    fails cachefiles.check_owned: listing or cleaning what someone else could have put there is not done."""
    from singpy.host import host
    from singpy.oci import store
    from singpy.recipe.layered import BUILD_TREES

    info = host.capture()
    location = cachefiles.cache_dir(info.env, info.home)
    cachefiles.check_owned(location, below=(cache.ROOTFS, cache.INDEX, BUILD_TREES, store.SIFS, store.BLOBS,
                                            store.REFS, store.WORK))
    return location


# Apptainer's cache types (`cache list|clean -T`, comma lists), and singpy's own: its unpacked images and the bases
# unpacked for builds. `shub` is accepted and names nothing (singpy pulls no shub:// image).
TYPES = ("library", "oci", "shub", "blob", "blobs", "net", "oras", "unpacked", "all")
TYPE = typer.Option([], "--type", "-T", metavar="TYPE,...", show_default=False,
                    help="only these cache types: library, oci (docker://, oci:, archives), oras, net (http(s)://), "
                         "blob (layer blobs), unpacked (singpy's unpacked images), shub, all (the default)")


def _types(values: list[str]) -> set[str]:
    """The cache types `-T` names ("blobs" is "blob"), every one when none or `all` is named."""
    from singpy.errors import UsageError

    named = {word.strip() for value in values for word in value.split(",") if word.strip()}
    for word in sorted(named - set(TYPES)):
        raise UsageError(f"unknown cache type {escape(word)!r}: the types are {', '.join(TYPES)}")
    named = {"blob" if word == "blobs" else word for word in named}
    return set(TYPES) - {"blobs", "all"} if not named or "all" in named else named


def source_type(record: dict[str, object]) -> str:
    """The cache type of a pulled image, from the source its record names (oci for docker://, oci:, archives)."""
    source = str(record.get("source", ""))
    for prefix, kind in (("library://", "library"), ("oras://", "oras"), ("http://", "net"), ("https://", "net")):
        if source.startswith(prefix):
            return kind
    return "oci"


@cache_app.command("list")
def list_command(
    types: list[str] = TYPE,
    verbose: bool = typer.Option(False, "--verbose", "-v", help="list each entry (as singpy always does)"),
) -> None:
    """List the unpacked and pulled images in your cache: digest, size, when, from which image."""
    location = _location()
    chosen = _types(types)
    listed = _list_pulled(location, chosen)
    if "unpacked" not in chosen:
        if not listed:
            print(f"nothing of type {', '.join(sorted(chosen))} in {location}")
        return
    rows = []
    total = 0
    for digest in cache.entries(location):
        info = cache.entry_info(location, digest)
        size = _number(info.get("size")) or 0
        total += size
        rows.append((digest[:16], human_size(size), _when(info.get("created")), escape(str(info.get("source", "?")))))
    _list_build_trees(location)
    if not rows:
        print(f"no unpacked images in {location}")
        return
    rows.insert(0, ("DIGEST", "SIZE", "CREATED", "SOURCE"))
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[3])
    print(f"{len(rows) - 1} unpacked image(s), {human_size(total)}, in {location}")


@cache_app.command("clean")
def clean_command(
    types: list[str] = TYPE,
    force: bool = typer.Option(False, "--force", "-f", help="do not ask for confirmation"),
    days: int = typer.Option(0, "--days", help="only remove images unpacked or pulled more than DAYS days ago "
                             "(blobs stay)"),
    dry_run: bool = typer.Option(False, "--dry-run", "-n", help="only show what would be removed"),
) -> None:
    """Remove unpacked and pulled images, layer blobs and interrupted work from your cache."""
    from singpy import console
    from singpy.oci import store

    location = _location()
    chosen = _types(types)
    unpacked = "unpacked" in chosen
    doomed = _selected(location, days) if unpacked else []
    pulled = [digest for digest, info in store.pulled_images(location) if source_type(info) in chosen]
    trees = _old_build_trees(location, days) if unpacked else []
    blobs = "blob" in chosen and store.blobs_usage(location)[0]
    if not doomed and not pulled and not trees and not blobs:
        if not dry_run:  # a killed unpacking's lock, a failed one's marker: internal, removed unasked
            from singpy.image import warm

            warm.remove_stale_locks(location)
        print(f"nothing to remove in {location}")
        return
    if dry_run:  # the same entries, counted as the real clean counts them: its "removed N" is this N
        kept = [digest for digest in doomed if _in_use(location, digest)]
        for digest in doomed:
            print(f"would keep {digest}: in use by a running container" if digest in kept
                  else f"would remove {digest}")
        for name in trees:
            print(f"would remove the base unpacked for builds {name}")
        count = len(doomed) - len(kept) + len(trees) + _clean_pulled(location, days, chosen, dry_run=True)
        print(f"would remove {count} cache entries from {location}")
        return
    if not force and not _confirm(f"Remove the cached images from {location}?"):
        console.info("nothing removed")
        raise typer.Exit(1)
    removed = _clean_pulled(location, days, chosen, dry_run=False)
    from singpy.image import warm

    warm.remove_stale_locks(location)  # left by a killed background unpacking (singpy.image.warm)
    if trees:
        from singpy.recipe.layered import remove_build_trees

        removed += remove_build_trees(location, older_than=time.time() - days * 86400 if days else None)
    for digest in doomed:
        outcome = cache.remove_entry(location, digest)
        if outcome == cache.REMOVED:
            removed += 1
        elif outcome == cache.IN_USE:  # its tree is a running container's root (singpy.image.squashfs.hold)
            console.info(f"{digest[:16]} is in use by a running container: kept")
        else:
            console.warning(f"{digest[:16]} is being unpacked by another singpy: left alone")
    print(f"removed {removed} cache entries from {location}")


def _in_use(location: str, digest: str) -> bool:
    """Whether a running container holds the entry's tree (its record locked: cache.in_use_path): what --dry-run
    keeps."""
    import fcntl

    try:
        fd = os.open(cache.in_use_path(location, digest), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # no record: no container can hold it
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _list_build_trees(location: str) -> None:
    """One line for the bases `singpy build` unpacked for a user's builds (singpy.recipe.layered)."""
    from singpy.recipe.layered import build_trees

    trees = build_trees(location)
    if trees:
        print(f"{len(trees)} base image(s) unpacked for builds, {human_size(sum(size for _, _, size in trees))}")
        print()


def _old_build_trees(location: str, days: int) -> list[str]:
    from singpy.recipe.layered import build_trees

    limit = time.time() - days * 86400 if days else None
    return [name for name, made, _ in build_trees(location) if limit is None or made < limit]


def _list_pulled(location: str, chosen: set[str]) -> bool:
    """The pulled images and layer blobs of the `chosen` types, listed; whether there were any."""
    from singpy.oci import store

    pulled = [(digest, info) for digest, info in store.pulled_images(location) if source_type(info) in chosen]
    count, size = store.blobs_usage(location) if "blob" in chosen else (0, 0)
    if not pulled and not count:
        return False
    if pulled:
        rows = [("DIGEST", "SIZE", "CREATED", "PLATFORM", "SOURCE")]
        for digest, info in pulled:
            rows.append((digest[:16], human_size(_number(info.get("size")) or 0), _when(info.get("created")),
                         escape(str(info.get("platform", "?"))), escape(str(info.get("source", "?")))))
        widths = [max(len(row[column]) for row in rows) for column in range(4)]
        for row in rows:
            print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[4])
    parts = [f"{len(pulled)} pulled image(s), {human_size(sum(int(info['size']) for _, info in pulled))}"] \
        if chosen - {"blob", "unpacked"} else []
    if "blob" in chosen:
        parts.append(f"{count} layer blob(s), {human_size(size)}")
    print("; ".join(parts))
    print()
    return True


def _clean_pulled(location: str, days: int, chosen: set[str], dry_run: bool) -> int:
    """Remove the pulled SIFs of the `chosen` types (older than `days` if given) and, without --days, the layer
    blobs if chosen: the count."""
    from singpy import console
    from singpy.oci import store

    limit = time.time() - days * 86400 if days else None
    doomed = [digest for digest, info in store.pulled_images(location)
              if source_type(info) in chosen and (limit is None or store.created(info) < limit)]
    blobs_too = limit is None and "blob" in chosen
    if dry_run:
        for digest in doomed:
            print(f"would remove the pulled image {digest}")
        blobs = _blob_count(location) if blobs_too else 0
        if blobs:
            print(f"would remove {blobs} layer blob(s)")
        return len(doomed) + blobs
    removed = 0
    for digest in doomed:
        if store.remove_pulled(location, digest):
            removed += 1
        else:
            console.warning(f"{digest[:16]} is being converted by another singpy: left alone")
    if blobs_too:
        removed += store.remove_blobs(location)
    return removed


def _blob_count(location: str) -> int:
    """The blobs store.remove_blobs would remove and count (one a file; a download in progress included)."""
    from singpy.oci import store

    try:
        names = os.listdir(f"{location}/{store.BLOBS}")
    except OSError:
        return 0
    return sum(1 for name in names if not name.startswith(".") and store.is_hex(name.split(".")[0]))


def _selected(location: str, days: int) -> list[str]:
    """Digests to remove: all those with anything in the cache, or complete entries older than `days`."""
    if days:
        limit = time.time() - days * 86400
        return [digest for digest in cache.entries(location)
                if int(str(cache.entry_info(location, digest, size=False).get("created", 0))) < limit]
    try:
        names = os.listdir(f"{location}/{cache.ROOTFS}")
    except FileNotFoundError:
        return []
    return sorted({name.lstrip(".")[:64] for name in names if len(name.lstrip(".")) >= 64})


def _confirm(question: str) -> bool:
    """Ask on the terminal; no answer (not a terminal, end of input) is no."""
    try:
        return typer.confirm(question)
    except typer.Abort:
        return False


def _number(value: object) -> int | None:
    """A record's number, or None where the record (hand-edited, damaged) holds no usable one."""
    try:
        return int(str(value))
    except ValueError:
        return None


def _when(created: object) -> str:
    """A record's creation time for the listing: "?" where it holds none a calendar can show."""
    seconds = _number(created)
    try:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds)) if seconds else "?"
    except (OverflowError, OSError, ValueError):  # beyond what time_t holds
        return "?"
