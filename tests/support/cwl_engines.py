"""The two container engines cwltool drives in the CWL conformance comparison, and the registry they share.

`registries_conf` gives docker.io a `location` that is a spy (`Spy`: a tiny HTTP server on 127.0.0.1 that
logs every request and answers 404) and, as its mirror, the suite's plain-HTTP registry holding the stand-in
images (tests.support.cwl_images): both engines get every image from the mirror, and an empty `Spy.seen`
proves that no other host was asked.

`podman_env` sets up rootless podman for the profile's user in a private directory: its own storage (the
kernel's overlay, since FUSE may be closed to users), run directory and XDG_RUNTIME_DIR, cgroupfs as cgroup
manager (cgroup v1, no systemd session), events in a file, runc (crun refuses a host with cgroup v1 and v2
controllers both mounted), and the host's network namespace unless the tool asks for none (cwltool passes
`--net=none` then): slirp4netns needs /dev/net/tun, which a container host may not give users. Nothing of the
user's ~/.config or ~/.local is used or written, so two sessions never share a podman store; `stop_podman`
ends the one process podman leaves running. The user's subordinate ids are the host's (/etc/subuid,
/etc/subgid, as for --fakeroot).

`singularity_env` is singpy under the names singularity/apptainer first on PATH (tests.support.clients),
its cache and cwltool's SIF cache in the same private directory.
"""

from __future__ import annotations

import http.server
import os
import shutil
import signal
import threading
from pathlib import Path

from tests.conftest import Singpy
from tests.support.clients import VENV_BIN, client_env, drop_in_names, own_dir

PODMAN = "/usr/bin/podman"
RUNC = "/usr/sbin/runc"


class Spy:
    """An HTTP server on 127.0.0.1 that logs every request (`seen`) and answers 404 to all but /v2/."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                owner.seen.append(f"{self.command} {self.path}")
                self.send_response(200 if self.path.rstrip("/") == "/v2" else 404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_HEAD = do_GET

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def registries_conf(path: Path, spy: Spy, mirror_host: str) -> Path:
    """docker.io located at the spy, mirrored by the suite's registry (plain HTTP); no other registry."""
    path.write_text('unqualified-search-registries = ["docker.io"]\n\n'
                    f'[[registry]]\nprefix = "docker.io"\nlocation = "{spy.host}"\ninsecure = true\n'
                    f'[[registry.mirror]]\nlocation = "{mirror_host}"\ninsecure = true\n')
    path.chmod(0o644)
    return path


def podman_missing() -> str:
    """Why rootless podman can't be compared with here ('' when it can)."""
    missing = [name for name in (PODMAN, RUNC) if shutil.which(name) is None]
    return f"{' and '.join(missing)} not installed (make test-packages)" if missing else ""


def podman_env(singpy: Singpy, place: Path, conf: Path) -> dict[str, str]:
    """The environment of `cwltool --podman` as the profile's user, podman's state all under `place`."""
    base = own_dir(singpy, place / "podman")
    runtime = own_dir(singpy, base / "xdg-runtime")
    runtime.chmod(0o700)
    storage = base / "storage.conf"
    storage.write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{own_dir(singpy, base / "graph")}"\n'
                       f'runroot = "{own_dir(singpy, base / "run")}"\n')
    containers = base / "containers.conf"
    containers.write_text('[engine]\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n'
                          f'events_logfile_path = "{base}/events.log"\nruntime = "runc"\n'
                          '[containers]\nlog_driver = "k8s-file"\nnetns = "host"\n')
    tmp = own_dir(singpy, base / "tmp")
    path = f"{VENV_BIN}:/usr/sbin:/usr/bin:/sbin:/bin"
    return singpy.env(PATH=path, XDG_RUNTIME_DIR=str(runtime), XDG_CONFIG_HOME=str(own_dir(singpy, base / "config")),
                      XDG_DATA_HOME=str(own_dir(singpy, base / "data")), TMPDIR=str(tmp),
                      CONTAINERS_STORAGE_CONF=str(storage), CONTAINERS_CONF=str(containers),
                      CONTAINERS_REGISTRIES_CONF=str(conf))


def stop_podman(place: Path) -> None:
    """End the pause process rootless podman leaves holding its user namespace (and the overlay mounts made in
    it), found by the pid file in the run directory of `podman_env`; nothing else of podman's stays running."""
    pid_file = place / "podman" / "xdg-runtime" / "libpod" / "tmp" / "pause.pid"
    try:
        pid = int(pid_file.read_text())
        with open(f"/proc/{pid}/comm") as comm:
            if comm.read().strip() != "catatonit":
                return
        os.kill(pid, signal.SIGKILL)
    except (FileNotFoundError, ProcessLookupError, ValueError):
        pass


def singularity_env(singpy: Singpy, workdir: Path, place: Path, conf: Path) -> dict[str, str]:
    """The environment of `cwltool --singularity` as the profile's user: singpy first on PATH as singularity."""
    base = own_dir(singpy, place / "singularity")
    drop_in_names(workdir)
    return client_env(singpy, workdir, own_dir(singpy, base / "xdg"),
                      CWL_SINGULARITY_CACHE=str(own_dir(singpy, base / "sif-cache")),
                      SINGPY_CACHEDIR=str(own_dir(singpy, base / "cache")),
                      CONTAINERS_REGISTRIES_CONF=str(conf))

