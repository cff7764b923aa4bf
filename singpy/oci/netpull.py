"""`pull` of an image file by URL (http://, https://): Apptainer's net transport.

Nextflow pulls nf-core's images this way (`apptainer pull --name NAME.img.pulling.TIME
https://depot.galaxyproject.org/singularity/...`): the server holds finished SIF files, so nothing is
converted. The file is downloaded beside the target under a name no one can guess and renamed over it
only once it is whole and is a container image (SIF, squashfs, a Singularity 2.x image): an interrupted
or wrong download never leaves a file that looks like the image.
"""

from __future__ import annotations

import os
from typing import Any

from singpy.errors import ImageError

PREFIXES = ("http://", "https://")
CHUNK = 1 << 20
TIMEOUT = 60.0  # seconds without a byte from the server before giving up (urllib's socket timeout)
USER_AGENT = "singpy (apptainer-compatible)"


def is_url(reference: str) -> bool:
    return reference.startswith(PREFIXES)


def default_name(url: str) -> str:
    """The file a pull without a name writes: the URL path's last component, as Apptainer's."""
    from urllib.parse import unquote, urlsplit

    name = os.path.basename(unquote(urlsplit(url).path))
    if not name or name in (".", ".."):
        raise ImageError(f"{url} names no file: give the file to write (--name FILE)")
    return name


def pull_url(url: str, target: str, *, force: bool) -> str:
    """Download `url` to `target` (default: its name in the working directory). Returns a summary."""
    from singpy.oci.pull import check_target

    target = os.path.abspath(target or default_name(url))
    check_target(target, force=force)
    temporary = download(url, target)
    try:
        check_image(url, temporary)
        os.chmod(temporary, 0o755 & ~_umask())  # as Apptainer leaves a pulled image: executable (its launch line)
        os.replace(temporary, target)
    except BaseException:
        remove(temporary)
        raise
    return f"pulled {url} to {target}"


def download(url: str, target: str, *, hasher: Any = None) -> str:
    """The body of `url` in a new file beside `target` (fed to `hasher` too, if given); one ImageError for any
    failure (nothing left)."""
    import urllib.error
    import urllib.request

    from singpy.host.cachefiles import create_new

    try:
        fd, temporary = create_new(target)
    except OSError as error:
        raise ImageError(f"can't write in {os.path.dirname(target)}: {error.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as out:
            request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
            with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
                while chunk := response.read(CHUNK):
                    out.write(chunk)
                    if hasher is not None:
                        hasher.update(chunk)
    except urllib.error.HTTPError as error:
        remove(temporary)
        raise ImageError(f"can't get {url}: the server answered {error.code} {error.reason}") from None
    except urllib.error.URLError as error:
        remove(temporary)
        raise ImageError(f"can't reach {url}: {error.reason}") from None
    except (OSError, ValueError) as error:  # a reset connection, a full disk, a URL urllib refuses
        remove(temporary)
        raise ImageError(f"can't download {url}: {getattr(error, 'strerror', None) or error}") from None
    except BaseException:
        remove(temporary)
        raise
    return temporary


def check_image(url: str, path: str) -> None:
    from singpy.image.detect import classify

    try:
        kind = classify(path).kind
    except ImageError:
        kind = ""
    if kind not in ("sif", "squashfs", "ext3"):
        raise ImageError(f"{url} is not a container image (not a SIF, squashfs or Singularity 2.x file)")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def remove(path: str) -> None:
    try:  # noqa: SIM105 - contextlib is not imported for one call
        os.unlink(path)
    except OSError:
        pass
