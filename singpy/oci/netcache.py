"""`run|exec|shell|instance start|inspect http(s)://HOST/IMAGE.sif`: the image file cached, as Apptainer's net cache.

Apptainer keys a downloaded image by its URL and the server's `Last-Modified` date, asked with a HEAD request
on every run: a file replaced on the server is downloaded again, an unchanged one is not. singpy does the
same, and keeps the file like every pulled SIF (singpy.oci.store: `sif/HEX.sif` under its own sha256, sealed),
so that a record names only a digest and the file is used only if it is the one singpy wrote. A server that
gives no `Last-Modified` (nor `ETag`) gives nothing to recognise the file by: it is downloaded on every run, as
Apptainer does, but stored once per content. A server out of reach with a file known for that URL: the
cached file runs, with a warning.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from singpy import console
from singpy.errors import ImageError
from singpy.oci import netpull, store

if TYPE_CHECKING:  # loaded by cached_url_image
    from singpy.oci.limits import Limits

PLATFORM = "url"  # the refs/ record's platform word: a URL names one file whatever the machine


def cached_url_image(url: str, env: Mapping[str, str], home: str) -> str:
    """The cached image of `url`, downloaded first if the server's copy is new or unknown."""
    import hashlib

    from singpy.oci.limits import Limits

    limits = Limits.from_env(env)  # a bad SINGPY_PULL_* value is its own error, never taken for a server out of reach
    location = store.location(env, home)
    known = store.recall(location, _record_key(url, "*"), PLATFORM)
    known_sif = store.usable_sif(location, known["digest"]) if known else ""
    try:
        version = _server_version(url, limits)
    except ImageError:
        if not known_sif:
            raise
        console.warning(f"can't reach {console.escape(url)}: running the cached image ({known['digest'][:19]})")
        return known_sif
    if version:
        cached = store.recall(location, _record_key(url, version), PLATFORM)
        if cached and (sif := store.usable_sif(location, cached["digest"])):
            return sif
    store.ensure(location, store.SIFS)
    lock = f"{location}/{store.SIFS}/.url-{hashlib.sha256(url.encode('utf-8', 'surrogateescape')).hexdigest()}.lock"
    with store.locked(lock, waiting_for=f"another singpy to finish downloading {console.escape(url)}"):
        digest = _download(url, location, env)
    for key in (_record_key(url, version), _record_key(url, "*")) if version else (_record_key(url, "*"),):
        store.remember(location, key, PLATFORM, top=digest, digest=digest)
    return store.sif_path(location, digest)


def _record_key(url: str, version: str) -> str:
    """A fixed-length record name: the URL and the server's version, hashed (kept so since existing records are
    named by it; the store also names long references safely itself now, singpy.oci.store._ref_path)."""
    import hashlib

    # surrogateescape: bytes of the command line that are not UTF-8 (the download then says what is wrong)
    return "url:" + hashlib.sha256(f"{url}\n{version}".encode("utf-8", "surrogateescape")).hexdigest()


def _server_version(url: str, limits: Limits) -> str:
    """What the server says identifies its copy: `Last-Modified`, else `ETag`, else "" (nothing)."""
    import http.client
    import urllib.error

    try:
        with netpull.open_url(url, "HEAD", limits) as response:
            return str(response.headers.get("Last-Modified") or response.headers.get("ETag") or "")[:200]
    except urllib.error.HTTPError as error:
        raise ImageError(f"can't get {console.escape(url)}: the server answered {error.code} "
                         f"{console.escape(str(error.reason))}") from None
    except urllib.error.URLError as error:
        raise ImageError(f"can't reach {console.escape(url)}: {console.escape(str(error.reason))}") from None
    except http.client.HTTPException as error:  # BadStatusLine, LineTooLong...: the server does not speak HTTP
        raise ImageError(f"can't reach {console.escape(url)}: the server's answer is not HTTP "
                         f"({type(error).__name__}: {console.escape(str(error)[:100])})") from None
    except (OSError, ValueError) as error:
        raise ImageError(f"can't reach {console.escape(url)}: {console.escape(str(error))}") from None


def _download(url: str, location: str, env: Mapping[str, str]) -> str:
    """Download into the cache, check it is an image, store it under its sha256; returns that digest."""
    import hashlib
    import time

    from singpy.image.tools import Interruptible

    hasher = hashlib.sha256()
    with Interruptible():  # SIGTERM, SIGHUP, SIGINT: the partial file is removed
        temporary = netpull.download(url, f"{location}/{store.SIFS}/url.part", env=env, hasher=hasher)
        try:
            netpull.check_image(url, temporary)
            digest = f"sha256:{hasher.hexdigest()}"
            if store.usable_sif(location, digest):  # the same file under another URL or date: kept once
                os.unlink(temporary)
                return digest
            sif = store.sif_path(location, digest)
            os.replace(temporary, sif)
        except BaseException:
            netpull.remove(temporary)
            raise
    store.seal_sif(sif, digest, {"source": url, "platform": PLATFORM, "created": int(time.time())})
    return digest
