"""`pull` of an image file by URL (http://, https://): Apptainer's net transport.

Nextflow pulls nf-core's images this way (`apptainer pull --name NAME.img.pulling.TIME
https://depot.galaxyproject.org/singularity/...`): the server holds finished SIF files, so nothing is
converted. The file is downloaded beside the target under a name no one can guess and renamed over it
only once it is whole and is a container image (SIF, squashfs, a Singularity 2.x image): an interrupted
or wrong download never leaves a file that looks like the image.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, BinaryIO

from singpy.console import escape
from singpy.errors import ImageError

if TYPE_CHECKING:  # the limits module is loaded only by a download
    from collections.abc import Mapping

    from singpy.oci.limits import Limits

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


def pull_url(url: str, target: str, *, force: bool, env: Mapping[str, str] | None = None) -> str:
    """Download `url` to `target` (default: its name in the working directory). Returns a summary."""
    from singpy.image.sifwrite import sif_mode
    from singpy.image.tools import Interruptible
    from singpy.oci.pull import check_target

    target = os.path.abspath(target or default_name(url))
    check_target(target, force=force)
    with Interruptible():  # SIGTERM, SIGHUP, SIGINT: the clean-up below runs (no temporary file left)
        temporary = download(url, target, env=os.environ if env is None else env)
        try:
            check_image(url, temporary)
            os.chmod(temporary, sif_mode())  # as Apptainer leaves a pulled image: executable (its launch line)
            os.replace(temporary, target)
        except BaseException:
            remove(temporary)
            raise
    return f"pulled {url} to {target}"


def download(url: str, target: str, *, env: Mapping[str, str], hasher: Any = None) -> str:
    """The body of `url` in a new file beside `target` (fed to `hasher` too, if given); one ImageError for any
    failure (nothing left). The caller holds singpy.image.tools.Interruptible, so that a signal removes the file."""
    import http.client
    import urllib.error

    from singpy.host.cachefiles import create_new
    from singpy.oci.limits import Limits

    limits = Limits.from_env(env)  # SINGPY_PULL_LOW_SPEED and SINGPY_PULL_STALL_TIMEOUT: a trickle ends the pull
    try:
        fd, temporary = create_new(target)
    except OSError as error:
        raise ImageError(f"can't write in {os.path.dirname(target)}: {error.strerror}") from None
    shown = escape(url)
    try:
        with os.fdopen(fd, "wb") as out:
            _receive(url, out, limits, hasher)
    except urllib.error.HTTPError as error:
        remove(temporary)
        raise ImageError(f"can't get {shown}: the server answered {error.code} {escape(str(error.reason))}") \
            from None
    except urllib.error.URLError as error:
        remove(temporary)
        raise ImageError(f"can't reach {shown}: {escape(str(error.reason))}") from None
    except (OSError, ValueError, http.client.HTTPException) as error:  # a reset connection, a full disk, a URL
        remove(temporary)  # urllib refuses, a malformed answer (BadStatusLine, LineTooLong...), a limit broken
        raise ImageError(f"can't download {shown}: {escape(_reason(error, limits))}") from None
    except BaseException:
        remove(temporary)
        raise
    return temporary


def _receive(url: str, out: BinaryIO, limits: Limits, hasher: Any) -> None:
    """The body of `url` written to `out`, every byte counted: fewer than the Content-Length announced (a
    connection closed early, which urllib reads as the end) or a trickle under the low-speed rule is an error."""
    from singpy.oci.limits import Meter

    response = open_url(url, "GET", limits)
    with response:
        expected = _announced_length(response)
        meter, received = Meter(limits, document=False), 0
        while chunk := response.read1(CHUNK):  # read1: one recv at a time, so that a trickle is counted as it comes
            meter.check(len(chunk))
            out.write(chunk)
            if hasher is not None:
                hasher.update(chunk)
            received += len(chunk)
    if expected is not None and received != expected:
        raise ValueError(f"the connection closed after {received} of the {expected} bytes announced")


def open_url(url: str, method: str, limits: Limits) -> Any:
    """The answer to `method url`, its headers read (urllib: redirects followed, proxies and CAs of the
    environment). A read waits at most TIMEOUT, or the low-speed rule's time when shorter: a silent server
    breaks that rule as a trickling one does. Connecting and the headers take at most the document deadline
    (SINGPY_PULL_DOCUMENT_TIMEOUT): a per-read timeout never ends a server that sends a byte now and then."""
    import http.client
    import urllib.request

    timeout = min(TIMEOUT, limits.stall_timeout) if limits.low_speed else TIMEOUT
    request = urllib.request.Request(url, method=method, headers={"User-Agent": USER_AGENT})
    watch = _HeaderWatch(limits.document_timeout)
    late = SlowHeaders(f"the server's answer did not come within {limits.document_timeout:g} s (the limit is "
                       "SINGPY_PULL_DOCUMENT_TIMEOUT)")
    try:
        response = _opener(watch).open(request, timeout=timeout)
    except (OSError, http.client.HTTPException):
        if watch.fired:  # what failed is the connection the watch shut down
            raise late from None
        raise
    if watch.fired:  # headers cut short by the watch can read as whole (a line ended by the end of the stream)
        response.close()
        raise late
    return response


class SlowHeaders(OSError):
    """The connection and the headers of an answer took longer than the document deadline."""


class _HeaderWatch:
    """Shuts a connection down when its answer's headers (the connection, a proxy's CONNECT and the TLS
    handshake included) have not all come within `seconds`; `fired` then says why the request failed."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.fired = seconds, False

    def start(self, connection: Any) -> Any:
        import threading

        from singpy.image.tools import start_thread

        timer = threading.Timer(self.seconds, self._cut, (connection,))
        timer.daemon = True
        start_thread(timer)
        return timer

    @staticmethod
    def stop(timer: Any) -> None:
        """The watch over: its thread is gone too (a launch unshares its user namespace single-threaded)."""
        if timer is not None:
            timer.cancel()
            timer.join()

    def _cut(self, connection: Any) -> None:
        import socket

        self.fired = True
        sock = connection.sock
        if sock is not None:  # the socket itself (an SSLSocket's shutdown would pull TLS from under the reader)
            try:  # noqa: SIM105 - contextlib is not imported for one call
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass


def _opener(watch: _HeaderWatch) -> Any:
    """urllib's opener, its connections watched by `watch` (classes made here: urllib is loaded by a download
    only, and `pull` imports this module for a default file name)."""
    import http.client
    import urllib.request

    class Watched(http.client.HTTPConnection):
        timer: Any = None

        def connect(self) -> None:
            self.timer = watch.start(self)
            super().connect()  # HTTPSConnection's in WatchedTLS: the TCP connection, a proxy's CONNECT, TLS

        def getresponse(self) -> http.client.HTTPResponse:
            try:
                return super().getresponse()
            finally:
                watch.stop(self.timer)

        def close(self) -> None:  # a request that failed before its answer: the watch ends with it
            watch.stop(self.timer)
            super().close()

    class WatchedTLS(Watched, http.client.HTTPSConnection):
        pass

    class Plain(urllib.request.HTTPHandler):
        def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            response: http.client.HTTPResponse = self.do_open(Watched, req)
            return response

    Redirects = _redirects()

    class Secure(urllib.request.HTTPSHandler):
        def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            context = self._context  # type: ignore[attr-defined]  # urllib's, as the default handler passes it
            response: http.client.HTTPResponse = self.do_open(WatchedTLS, req, context=context)
            return response

    return urllib.request.build_opener(Plain, Secure, Redirects)


def redirect_refusal(old: str, new: str) -> str | None:
    """Why urllib may not follow a redirect from `old` to `new`: never from https to plain http (an answer anyone
    on the path could forge, as the registry client refuses it), nor out of http(s) (urllib would go to ftp://)."""
    if not new.lower().startswith(("http://", "https://")):
        return "a redirect out of http(s) is refused"
    if old.lower().startswith("https://") and not new.lower().startswith("https://"):
        return "a redirect from https to plain http is refused"
    return None


def _redirects() -> Any:
    import urllib.error
    import urllib.request

    class Redirects(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
            why = redirect_refusal(req.full_url, newurl)
            if why is not None:
                raise urllib.error.HTTPError(newurl, code, f"{why} ({newurl[:100]})", headers, fp)
            return super().redirect_request(req, fp, code, msg, headers, newurl)

    return Redirects


def _announced_length(response: Any) -> int | None:
    """The Content-Length of a response that is not chunked (where it is meaningless), if a valid one."""
    text = str(response.headers.get("Content-Length") or "").strip()
    if getattr(response, "chunked", False) or not (text.isascii() and text.isdigit()):
        return None
    return int(text)


def _reason(error: BaseException, limits: Limits) -> str:
    import http.client

    if isinstance(error, http.client.IncompleteRead):
        return "the connection closed in the middle of the file"
    if isinstance(error, http.client.HTTPException):
        return f"the server's answer is not HTTP ({type(error).__name__}: {str(error)[:100]})"
    if isinstance(error, TimeoutError) and limits.low_speed:
        return (f"no data in {min(TIMEOUT, limits.stall_timeout):g} s (the limits are SINGPY_PULL_LOW_SPEED and "
                "SINGPY_PULL_STALL_TIMEOUT)")
    if isinstance(error, TimeoutError):
        return f"no data in {TIMEOUT:g} s"
    return str(getattr(error, "strerror", None) or error or type(error).__name__)


def check_image(url: str, path: str) -> None:
    from singpy.image.detect import classify

    try:
        kind = classify(path).kind
    except ImageError:
        kind = ""
    if kind not in ("sif", "squashfs", "ext3"):
        raise ImageError(f"{url} is not a container image (not a SIF, squashfs or Singularity 2.x file)")


def remove(path: str) -> None:
    try:  # noqa: SIM105 - contextlib is not imported for one call
        os.unlink(path)
    except OSError:
        pass
