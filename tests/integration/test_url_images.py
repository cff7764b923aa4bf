"""`exec|run|inspect https://HOST/IMAGE.sif`: an image file on a web server, cached as Apptainer's net cache.

A real HTTP server (http.server, with the Last-Modified header it derives from the file's mtime) serves the
files; it logs every request, so the tests see what singpy asked: one HEAD per run, a GET only when the file
is new or changed on the server, or when the cached copy is not the one singpy wrote.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SINGPY, Singpy, assert_one_fatal
from tests.support.images import build_busybox_rootfs
from tests.support.pulling import user_dir
from tests.support.registry_http import Handler, serving


class _Logged(http.server.SimpleHTTPRequestHandler):
    requests: list[tuple[str, str]]

    def log_message(self, format: str, *args: Any) -> None:
        self.requests.append((self.command, self.path))


class WebServer:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.log: list[tuple[str, str]] = []
        handler = type("Handler", (_Logged,), {"requests": self.log})  # this server's own log
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def gets(self) -> int:
        return sum(1 for method, _ in self.log if method == "GET")

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def _sif(workdir: Path, marker: str) -> Path:
    """A busybox SIF whose runscript prints `marker` (two different files for a file replaced on the server)."""
    out = workdir / f"url-{marker}.sif"
    if not out.exists():
        root = build_busybox_rootfs(workdir / f"url-{marker}-root", runscript=f"#!/bin/sh\necho {marker}\n")
        subprocess.run([SINGPY, "-q", "build", str(out), str(root)], check=True)
        out.chmod(0o644)
    return out


@pytest.fixture
def web(workdir: Path) -> Iterator[WebServer]:
    root = workdir / f"web-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    root.chmod(0o755)
    server = WebServer(root)
    try:
        yield server
    finally:
        server.stop()


def _serve(web: WebServer, source: Path, name: str, mtime: int) -> str:
    shutil.copyfile(source, web.root / name)
    (web.root / name).chmod(0o644)
    os.utime(web.root / name, (mtime, mtime))
    return f"{web.url}/{name}"


def _cached_sifs(singpy: Singpy) -> list[Path]:
    return sorted((singpy.cachedir / "sif").glob("*.sif")) if (singpy.cachedir / "sif").is_dir() else []


def test_a_url_image_is_downloaded_once_and_again_when_the_server_changes_it(singpy: Singpy, workdir: Path,
                                                                             web: WebServer) -> None:
    url = _serve(web, _sif(workdir, "first"), f"img-{singpy.profile}.sif", 1_700_000_000)
    before = set(_cached_sifs(singpy))
    assert singpy.ok("run", url) == "first\n"
    assert singpy.ok("run", url) == "first\n"
    assert web.gets() == 1  # the second run asked HEAD only
    assert [method for method, _ in web.log].count("HEAD") == 2
    assert len(set(_cached_sifs(singpy)) - before) == 1
    _serve(web, _sif(workdir, "second"), f"img-{singpy.profile}.sif", 1_700_000_100)
    assert singpy.ok("run", url) == "second\n"
    assert web.gets() == 2


def test_a_cached_url_image_rewritten_in_the_cache_is_downloaded_again(singpy: Singpy, workdir: Path,
                                                                      web: WebServer) -> None:
    url = _serve(web, _sif(workdir, "first"), f"tamper-{singpy.profile}.sif", 1_700_000_000)
    before = set(_cached_sifs(singpy))
    singpy.ok("exec", url, "true")
    cached = [path for path in _cached_sifs(singpy) if path not in before] or _cached_sifs(singpy)
    for path in cached:  # a copy put in its place: not the file singpy sealed
        shutil.copyfile(_sif(workdir, "second"), f"{path}.new")
        os.chown(f"{path}.new", singpy.uid, singpy.gid)
        os.replace(f"{path}.new", path)
    assert singpy.ok("run", url) == "first\n"
    assert web.gets() == 2


def test_a_cached_url_image_runs_with_a_warning_when_the_server_is_gone(singpy: Singpy, workdir: Path,
                                                                       web: WebServer) -> None:
    url = _serve(web, _sif(workdir, "first"), f"offline-{singpy.profile}.sif", 1_700_000_000)
    singpy.ok("exec", url, "true")
    web.stop()
    result = singpy.run("run", url)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "first\n"
    assert "WARNING" in result.stderr and "running the cached image" in result.stderr
    web.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    web.thread = threading.Thread(target=web.server.serve_forever, daemon=True)
    web.thread.start()  # for the fixture's stop


@pytest.mark.parametrize(("name", "message"), [("missing.sif", "the server answered 404"),
                                               ("page.sif", "is not a container image"),
                                               ("\udcff.sif", "can't reach")],  # a byte that is not UTF-8
                         ids=["missing", "page", "not-utf8"])
def test_a_url_that_gives_no_image_is_one_fatal_and_leaves_nothing_in_the_cache(
        singpy: Singpy, web: WebServer, name: str, message: str) -> None:
    (web.root / "page.sif").write_text("<html>a login page</html>\n")
    (web.root / "page.sif").chmod(0o644)
    before = sorted((singpy.cachedir / "sif").iterdir()) if (singpy.cachedir / "sif").is_dir() else []
    assert_one_fatal(singpy.run("exec", f"{web.url}/{name}", "true"), message)
    after = sorted((singpy.cachedir / "sif").iterdir()) if (singpy.cachedir / "sif").is_dir() else []
    assert [path for path in after if path not in before and not path.name.startswith(".url-")] == []


def test_inspect_of_a_url_image_reads_the_cached_file(singpy: Singpy, workdir: Path, web: WebServer) -> None:
    url = _serve(web, _sif(workdir, "first"), f"inspect-{singpy.profile}.sif", 1_700_000_000)
    assert "echo first" in singpy.ok("inspect", "--runscript", url)
    tree = user_dir(singpy, workdir, "url-sandbox") / "tree"  # pull --sandbox: the cached file unpacked
    singpy.ok("pull", "--sandbox", str(tree), url)
    assert "echo first" in (tree / ".singularity.d" / "runscript").read_text()


# --- servers that misbehave: a file cut short, a trickle, an answer that is not HTTP, a pull interrupted --------

LAST_MODIFIED = "Mon, 01 Jan 2024 00:00:00 GMT"
SLOW_LIMITS = {"SINGPY_PULL_LOW_SPEED": "1024", "SINGPY_PULL_STALL_TIMEOUT": "1"}  # a trickle fails in a second


class _Site:
    """What the misbehaving server serves (`data`) and how (`mode`): "whole"; "cut" (the full Content-Length
    announced, a third sent, the connection closed); "trickle" (a byte every 0.5 s); "slow-headers" (the
    headers a byte every 0.5 s); "garbage" (no HTTP)."""

    def __init__(self, data: bytes, mode: str) -> None:
        self.data, self.mode = data, mode
        self.trickling = threading.Event()  # a GET is being answered a byte at a time
        self.done = threading.Event()  # the test is over: a trickle stops
        self.url = ""


class _Misbehaving(Handler):
    def do_HEAD(self) -> None:
        self._answer()

    def do_GET(self) -> None:
        self._answer()

    def _answer(self) -> None:
        site: _Site = self.server.owner
        self.close_connection = True
        try:
            if site.mode == "garbage":
                self.wfile.write(b"HELLO garbage\r\n\r\n")
                return
            if site.mode == "to-ftp":  # urllib follows a redirect to ftp:// on its own
                self.send_response(302)
                self.send_header("Location", "ftp://127.0.0.1/image.sif")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if site.mode == "slow-headers":  # a header line without end, a byte at a time
                self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                self._trickle(site)
                return
            self.send_response(200)
            for key, value in (("Content-Type", "application/octet-stream"), ("Last-Modified", LAST_MODIFIED),
                               ("Content-Length", str(len(site.data)))):
                self.send_header(key, value)
            self.end_headers()
            if self.command == "HEAD":
                return
            if site.mode == "trickle":
                self._trickle(site)
            else:
                self.wfile.write(site.data if site.mode == "whole" else site.data[:len(site.data) // 3])
        except OSError:  # the client gave up (as it should): nothing more to send
            pass

    def _trickle(self, site: _Site) -> None:
        site.trickling.set()
        for position in range(len(site.data)):
            self.wfile.write(site.data[position:position + 1])
            self.wfile.flush()
            if site.done.wait(0.5):
                return


@pytest.fixture
def site(workdir: Path) -> Iterator[_Site]:
    served = _Site(_sif(workdir, "first").read_bytes(), "whole")
    with serving(_Misbehaving, owner=served) as server:
        served.url = f"http://127.0.0.1:{server.server_address[1]}/image.sif"
        try:
            yield served
        finally:
            served.done.set()


def _out_dir(singpy: Singpy, workdir: Path) -> Path:
    """An empty directory the profile's user owns, for what `pull` writes."""
    parent = workdir / "url-out"
    parent.mkdir(exist_ok=True)
    parent.chmod(0o755)
    path = parent / f"{singpy.profile}-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    os.chown(path, singpy.uid, singpy.gid)
    return path


def _cache_entries(singpy: Singpy) -> set[str]:
    """The cache's SIF directory, but for the lock files of URL downloads (kept, empty, as every lock)."""
    where = singpy.cachedir / "sif"
    return {name for name in os.listdir(where) if not name.startswith(".url-")} if where.is_dir() else set()


def test_a_pull_cut_short_by_the_server_is_one_fatal_and_leaves_no_file(singpy: Singpy, workdir: Path,
                                                                        site: _Site) -> None:
    site.mode = "cut"
    out = _out_dir(singpy, workdir)
    assert_one_fatal(singpy.run("pull", "--name", str(out / "image.sif"), site.url), "bytes announced")
    assert os.listdir(out) == []
    site.mode = "whole"
    singpy.ok("pull", "--name", str(out / "image.sif"), site.url)
    assert (out / "image.sif").read_bytes() == site.data


def test_a_url_image_cut_short_is_not_cached_and_runs_once_the_server_sends_it_whole(singpy: Singpy, workdir: Path,
                                                                                     site: _Site) -> None:
    site.mode = "cut"
    before = _cache_entries(singpy)
    assert_one_fatal(singpy.run("exec", site.url, "true"), "bytes announced")
    assert_one_fatal(singpy.run("inspect", "--runscript", site.url), "bytes announced")
    assert _cache_entries(singpy) == before
    site.mode = "whole"  # the same Last-Modified: only a cache that kept nothing of the cut file downloads it
    assert singpy.ok("run", site.url) == "first\n"


def _pull_or_exec(command: str, out: Path, url: str) -> list[str]:
    """The arguments of the case pair every misbehaving server is tried with: `pull` into `out`, or `exec`."""
    return ["pull", "--name", str(out / "image.sif"), url] if command == "pull" else ["exec", url, "true"]


# A per-read timeout never ends a server that sends a byte every 0.5 s ("slow-headers"): the deadline on
# headers does. Each case: the server's mode, the variables of the run, what its one FATAL line says.
_REFUSALS = {
    "trickle": ("trickle", SLOW_LIMITS, "SINGPY_PULL_LOW_SPEED"),
    "slow-headers": ("slow-headers", {"SINGPY_PULL_DOCUMENT_TIMEOUT": "2"},
                     "did not come within 2 s (the limit is SINGPY_PULL_DOCUMENT_TIMEOUT)"),
    "no-http": ("garbage", {}, "not HTTP"),
    "redirect-to-ftp": ("to-ftp", {}, "a redirect out of http(s) is refused"),
}


@pytest.mark.parametrize("command", ["pull", "exec"])
@pytest.mark.parametrize("case", list(_REFUSALS))
def test_a_misbehaving_server_is_one_fatal_and_leaves_no_file(singpy: Singpy, workdir: Path, site: _Site,
                                                               case: str, command: str) -> None:
    site.mode, limits, message = _REFUSALS[case]
    out = _out_dir(singpy, workdir)
    before = _cache_entries(singpy)
    result = singpy.run(*_pull_or_exec(command, out, site.url), env=singpy.env(**limits), timeout=30)
    assert_one_fatal(result, message)
    assert os.listdir(out) == [] and _cache_entries(singpy) == before


@pytest.mark.parametrize("command", ["pull", "exec"])
def test_sigterm_during_a_url_download_leaves_no_temporary_file(singpy: Singpy, workdir: Path, site: _Site,
                                                                command: str) -> None:
    site.mode = "trickle"
    out = _out_dir(singpy, workdir)
    before = _cache_entries(singpy)
    process = singpy.popen(_pull_or_exec(command, out, site.url), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert site.trickling.wait(30)
    deadline = time.monotonic() + 30
    while _cache_entries(singpy) == before and not os.listdir(out) and time.monotonic() < deadline:
        time.sleep(0.05)  # the temporary file is there: the download is under way
    assert time.monotonic() < deadline
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=30)
    assert_one_fatal(subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr), "SIGTERM")
    assert os.listdir(out) == [] and _cache_entries(singpy) == before


def test_a_redirect_from_https_to_http_is_refused() -> None:
    from singpy.oci.netpull import redirect_refusal

    assert redirect_refusal("https://a.example/x.sif", "http://a.example/x.sif") is not None
    assert redirect_refusal("https://a.example/x.sif", "HTTPS://b.example/x.sif") is None
    assert redirect_refusal("http://a.example/x.sif", "http://b.example/x.sif") is None
