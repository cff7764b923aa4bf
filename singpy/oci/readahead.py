"""A layer's stream read one step ahead on a thread: decompression and the digest overlap the tree's writes.

Applying a layer is two kinds of work in turn: inflating the blob (zlib or
zstd) and hashing it, then parsing tar headers and writing files. The first
releases the GIL, so a thread that reads ahead lets a second core inflate
the next megabytes while the main thread writes the last ones (issue 31,
"Big pulls": 1.3 s of the 3 s that a 300 MiB image's layers take to apply).
What is held is bounded (AHEAD chunks of CHUNK bytes); an error of the
stream (a corrupt layer, a digest mismatch) reaches the reader as it was
raised, where the data would have been.
"""

from __future__ import annotations

import queue
import threading

from singpy.image.tools import start_thread
from singpy.oci.streams import CHUNK, Readable

AHEAD = 4  # chunks read before the reader asks: 4 MiB at most, enough to keep the other core busy
_WAIT = 0.2  # seconds between checks that the reader still wants more (it may have stopped)


class ReadAhead:
    """`with ReadAhead(stream) as ahead:` ahead.read(n) returns what stream.read would have, read on a thread.

    Leaving the block stops the thread and waits for it, so nothing else
    reads `stream` (or closes it) while the thread still does.
    """

    def __init__(self, stream: Readable) -> None:
        self.stream = stream
        self.chunks: queue.Queue[bytes | BaseException] = queue.Queue(AHEAD)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._produce, name="layer-read-ahead", daemon=True)
        self.held = b""  # the last chunk; what the reader has not asked for yet starts at self.offset
        self.offset = 0
        self.ended: BaseException | None = None  # what the stream ended with, raised at every later read
        self.at_end = False

    def __enter__(self) -> ReadAhead:
        start_thread(self.thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join()

    def _produce(self) -> None:
        while not self.stopping.is_set():
            try:
                item: bytes | BaseException = self.stream.read(CHUNK)
            except BaseException as error:  # handed to the reader, which raises it
                item = error
            if not self._put(item) or not isinstance(item, bytes) or not item:
                return

    def _put(self, item: bytes | BaseException) -> bool:
        while not self.stopping.is_set():
            try:
                self.chunks.put(item, timeout=_WAIT)
                return True
            except queue.Full:
                continue
        return False

    def read(self, size: int = -1, /) -> bytes:
        if size < 0:
            parts = []
            while data := self.read(CHUNK):
                parts.append(data)
            return b"".join(parts)
        while self.offset == len(self.held) and size:
            if self.ended is not None:
                raise self.ended
            if self.at_end:
                return b""
            item = self.chunks.get()
            if isinstance(item, BaseException):
                self.ended = item
            elif not item:
                self.at_end = True
            else:
                self.held, self.offset = item, 0
        if self.offset == 0 and size >= len(self.held):  # a whole chunk: no copy
            data, self.offset = self.held, len(self.held)
            return data
        start, self.offset = self.offset, min(self.offset + size, len(self.held))
        return self.held[start:self.offset]
