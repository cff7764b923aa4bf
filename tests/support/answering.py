"""A server on 127.0.0.1 that answers every connection with the same bytes, as slowly as a case needs.

For the tests of a cached tag's check (tests/unit/test_quickhead.py, tests/integration/test_tag_check.py): a
registry that answers one thing, trickles it, falls silent, or (with `tls`) presents a certificate the case
chose. Each connection is served on its own thread, so a held one does not keep a retry from being answered.
"""

from __future__ import annotations

import socket
import ssl
import threading


class Answering:
    """Answers every connection's first read with `answer`, sent `step` bytes at a time `interval` apart, then
    closes it (or, with `hold`, keeps it open and silent until stop). `port` 0: a free one (see .port).

    `tls`: a server context; the connection is wrapped in it first, and a client that refuses the handshake
    is not counted. `requests` holds what each counted connection sent first.
    """

    def __init__(self, answer: bytes, *, step: int = 1 << 20, interval: float = 0.0, hold: bool = False,
                 port: int = 0, tls: ssl.SSLContext | None = None) -> None:
        self.listener = socket.create_server(("127.0.0.1", port))
        self.port = self.listener.getsockname()[1]
        self.answer, self.step, self.interval, self.hold, self.tls = answer, step, interval, hold, tls
        self.requests: list[bytes] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.listener.settimeout(0.1)
        threads = []
        while not self.stopping.is_set():
            try:
                connection, _ = self.listener.accept()
            except TimeoutError:
                continue
            thread = threading.Thread(target=self._answer, args=(connection,), daemon=True)
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join(5)

    def _answer(self, connection: socket.socket) -> None:
        try:
            with connection:
                connection.settimeout(10)
                with self.tls.wrap_socket(connection, server_side=True) if self.tls else connection as stream:
                    self.requests.append(stream.recv(65536))
                    for start in range(0, len(self.answer), self.step):
                        if self.stopping.wait(self.interval):
                            return
                        stream.sendall(self.answer[start:start + self.step])
                    if self.hold:  # the connection stays open, silent
                        self.stopping.wait()
        except OSError:
            return  # the client went away, or refused the certificate (as it must, where a case says so)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(10)
        self.listener.close()
