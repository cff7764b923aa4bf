"""build_plan driven as the planner's unit tests drive it (tests/unit/test_planner*.py): real configuration
text, host facts (this host's, as for alice, uid 1000) and a sandbox image in, a LaunchPlan out; readings of
its mounts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from singpy.config import sysconf
from singpy.host import host as host_module
from singpy.host.host import HostInfo
from singpy.launch.planner import LaunchRequest, build_plan
from singpy.mounts.system import DEV_LINKS, MINIMAL_DEV_NODES
from singpy.plan import ImageSpec, LaunchPlan, MountSpec

if TYPE_CHECKING:
    from singpy.plan import MountOpName

CWD = "/srv/project"  # not under /tmp or the home, not a system directory: bound by default
HOST_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin", "LD_LIBRARY_PATH": "/opt/host/lib", "TERM": "xterm-256color",
    "LANG": "en_US.UTF-8", "http_proxy": "http://proxy:3128", "MYVAR": "mine", "SINGULARITY_BIND": "/x",
    "APPTAINER_CONTAIN": "1", "SINGPY_CONFIG": "/c.conf",
}


def home_dir(tmp_path: Path) -> str:
    """The user's home, made under `tmp_path`."""
    path = tmp_path / "home" / "alice"
    path.mkdir(parents=True)
    return str(path)


def sandbox_image(tmp_path: Path) -> ImageSpec:
    """A sandbox image (a rootfs with /bin) under `tmp_path`."""
    rootfs = tmp_path / "images" / "busybox.sandbox"
    (rootfs / "bin").mkdir(parents=True)
    return ImageSpec(kind="sandbox", path=str(rootfs), rootfs=str(rootfs))


def alice(home: str) -> HostInfo:
    """This host's facts as for alice (uid 1000), her home `home`, her working directory CWD."""
    captured = host_module.capture({**HOST_ENV, "HOME": home})
    return captured.replace(uid=1000, gid=1000, user="alice", group="users", gecos="Alice Liddell",
                            shell="/bin/bash", home=home, cwd=CWD)


def config(text: str = "") -> sysconf.SysConfig:
    return sysconf.parse(text, "test.conf")


def request(**fields: object) -> LaunchRequest:
    values: dict[str, object] = {"action": "exec", "image": "busybox.sandbox", "args": ("true",)}
    return LaunchRequest(**{**values, **fields})  # type: ignore[arg-type]


def plan(host: HostInfo, image: ImageSpec, conf: str = "", **fields: object) -> LaunchPlan:
    return build_plan(request(**fields), config(conf), host, image).plan


def summary(mounts: tuple[MountSpec, ...]) -> list[tuple[str, str, str | None]]:
    return [(spec.op, spec.dest, spec.source) for spec in mounts]


def dests(mounts: tuple[MountSpec, ...], op: MountOpName | None = None) -> list[str]:
    return [spec.dest for spec in mounts if op is None or spec.op == op]


def by_dest(mounts: tuple[MountSpec, ...], dest: str) -> MountSpec:
    found = [spec for spec in mounts if spec.dest == dest]
    assert len(found) == 1, (dest, found)
    return found[0]


MINIMAL_DEV = [("tmpfs", "/dev", None), *[("bind", f"/dev/{n}", f"/dev/{n}") for n in MINIMAL_DEV_NODES],
               ("devpts", "/dev/pts", None), ("tmpfs", "/dev/shm", None),
               *[("symlink", f"/dev/{name}", target) for name, target in DEV_LINKS]]
