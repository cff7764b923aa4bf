"""Real container images for the tests and the demo, built from busybox-static.

`python -m tests.support.images DIR` builds the demo sandbox in DIR.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

BUSYBOX = "/bin/busybox"
DIRS = ("bin", "sbin", "usr/bin", "usr/sbin", "etc", "home", "root", "proc", "sys", "dev", "tmp", "var/tmp",
        "opt", ".singularity.d/env", ".singularity.d/libs")
RUNSCRIPT = """#!/bin/sh
echo "Hello from a singpy container"
echo "user:     $(id -un) (uid $(id -u), gid $(id -g))"
echo "hostname: $(hostname)"
echo "cwd:      $(pwd)"
echo "args:     $*"
"""


def build_busybox_rootfs(root: Path, *, runscript: str | None = RUNSCRIPT,
                         env_scripts: dict[str, str] | None = None) -> Path:
    """A minimal but real root filesystem: busybox-static and its applets, /etc files, /.singularity.d."""
    busybox = shutil.which("busybox") or BUSYBOX
    for name in DIRS:
        (root / name).mkdir(parents=True, exist_ok=True)
    shutil.copy2(busybox, root / "bin" / "busybox")
    applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True).stdout.split()
    for applet in applets:
        link = root / "bin" / applet
        if applet != "busybox" and not link.exists():
            link.symlink_to("busybox")
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n")
    (root / "etc" / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
    for name in ("hosts", "resolv.conf", "localtime"):
        (root / "etc" / name).touch()
    (root / "tmp").chmod(0o1777)
    (root / "var" / "tmp").chmod(0o1777)
    (root / "opt").chmod(0o1777)  # a directory an unprivileged user may write to under --writable-tmpfs
    if runscript is not None:
        script = root / ".singularity.d" / "runscript"
        script.write_text(runscript)
        script.chmod(0o755)
    for name, text in (env_scripts or {}).items():
        (root / ".singularity.d" / "env" / name).write_text(text)
    return root


def tree_digest(root: Path) -> str:
    """A digest of every path below `root`: its mode, owner, size, modification time and content.

    Symlinks are not followed. Byte for byte: a write that leaves the same content changes it too.
    """
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        digest.update(f"{path.relative_to(root)} {info.st_mode} {info.st_uid} {info.st_size} {info.st_mtime_ns}"
                      .encode())
        if path.is_file() and not path.is_symlink():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.support.images DIR", file=sys.stderr)
        return 1
    root = Path(argv[0])
    if root.exists():
        shutil.rmtree(root)
    build_busybox_rootfs(root)
    os.chmod(root, 0o755)
    print(f"built busybox sandbox image in {root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
