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
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SINGPY, Singpy, assert_one_fatal
from tests.support.images import build_busybox_rootfs


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
