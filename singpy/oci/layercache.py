"""The layers of one image from the cache: downloaded into it, several at once, while earlier ones are applied."""

from __future__ import annotations

import os

from singpy.image.tools import start_thread
from singpy.oci import store

TYPE_CHECKING = False  # see singpy.record: `typing` is not loaded at run time
if TYPE_CHECKING:
    import threading
    from typing import Any, BinaryIO

    from singpy.oci.progress import Steps

MAX_DOWNLOADS = 4  # layers fetched at once: enough to fill a link, few enough for a registry's limits


class Blobs:
    """The layers of one image, opened in order while the later ones still download.

    From a registry, up to MAX_DOWNLOADS blobs download at once into the
    cache (daemon threads: an interrupted pull ends at once, leaving
    `.partial` files the next pull resumes); a local source is read in place.
    """

    def __init__(self, source: Any, descriptors: list[dict[str, Any]], location: str, steps: Steps) -> None:
        self.source = source
        self.location = location
        self.steps = steps
        import threading

        self.remote = hasattr(source, "fetch_blob")
        self.done: dict[str, threading.Event] = {}
        self.errors: dict[str, BaseException] = {}
        self.verified: dict[str, BinaryIO] = {}  # cached blobs, opened as their bytes were checked
        if self.remote:
            store.ensure(location, store.BLOBS)
            pending = list({d["digest"]: d for d in descriptors}.values())
            self.done = {d["digest"]: threading.Event() for d in pending}
            self.queue = pending
            self.lock = threading.Lock()
            for _ in range(min(MAX_DOWNLOADS, len(pending))):
                start_thread(threading.Thread(target=self._work, daemon=True))

    def _work(self) -> None:
        while True:
            with self.lock:
                if not self.queue:
                    return
                descriptor = self.queue.pop(0)
            digest = descriptor["digest"]
            try:
                self._fetch(digest, descriptor.get("size"))
            except BaseException as error:  # handed to the main thread, which raises it
                self.errors[digest] = error
            self.done[digest].set()

    def _fetch(self, digest: str, size: object) -> None:
        path = store.blob_path(self.location, digest)
        if (handle := store.cached_blob(path, digest)) is not None:
            self.verified[digest] = handle
            self.steps.step(f"Using cached layer {digest[:19]}")
            return
        lock = f"{os.path.dirname(path)}/.{store.hex_of(digest)}.lock"
        with store.locked(lock, waiting_for=f"another singpy to finish downloading {digest[:19]}"):
            if (handle := store.cached_blob(path, digest)) is not None:
                self.verified[digest] = handle
                return
            total = size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None
            advance = self.steps.transfer(f"Downloading {digest[:19]}", total)
            self.source.fetch_blob(digest, path, size=total, progress=advance)

    def open(self, digest: str) -> BinaryIO:
        if not self.remote:
            from singpy.oci.streams import VerifyingReader

            return VerifyingReader(self.source.open_blob(digest), digest)  # type: ignore[return-value]
        while not self.done[digest].wait(0.5):  # a timeout keeps the main thread open to signals
            pass
        if digest in self.errors:
            raise self.errors[digest]
        return self.verified.pop(digest, None) or store.open_blob(self.location, digest)
