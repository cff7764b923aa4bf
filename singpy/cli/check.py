"""`singpy check` (alias `singpy doctor`): what works for this user on this host, and the fix for what does not.

Each check tries the real thing where it can (a user namespace, an overlay
mount in one: in a forked child, so this process changes nothing) and
otherwise reads what the host shows (singpy.host.hostcheck). The result is a
table on a terminal, plain lines in a pipe, or JSON (`--json`): a list of
{"check", "status", "detail", "fix"}, status one of ok, warn, fail, info.

`fail` is kept for what a plain `singpy exec` of a sandbox or SIF image
needs (a user namespace for a user, a supported kernel, some way to open a
squashfs image); the command then exits 1, else 0. `warn` is for what only
some features need (--fakeroot's subordinate ids, overlays, FUSE); `info`
reports without judging (GPU drivers, Slurm and MPI, a container around us).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable

import typer

from singpy.constants import FUSE_DEVICE, SYSTEM_PATH
from singpy.host import hostcheck
from singpy.host.hostfiles import which

OK, WARN, FAIL, INFO = "ok", "warn", "fail", "info"
Result = dict[str, str]


def _result(check: str, status: str, detail: str, fix: str = "") -> Result:
    return {"check": check, "status": status, "detail": detail, "fix": fix}


# --- probes: the real thing, in a forked child -----------------------------------------------------------------------


def _in_child(work: Callable[[], None]) -> str:
    """Run `work` in a forked child; "" when it returned, else the error it raised, as one line."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        report = ""
        try:
            work()
        except BaseException as error:  # a forked child must never unwind into typer
            report = getattr(error, "message", None) or str(error) or type(error).__name__
        try:
            os.write(write, report.encode())
        finally:
            os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 4096):
        chunks.append(chunk)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    report = b"".join(chunks).decode(errors="replace")
    if not report and status != 0:
        report = f"the probe ended with status {status}"
    return report


def _enter_userns() -> None:
    """unshare a user and a mount namespace, map ourselves, make the mounts private: what exec does first."""
    from singpy.kernel import syscalls as k
    from singpy.kernel.idmap import write_id_maps

    uid, gid = os.getuid(), os.getgid()
    k.unshare(k.CLONE_NEWUSER | k.CLONE_NEWNS if uid else k.CLONE_NEWNS)
    if uid:
        write_id_maps(uid, gid)
    k.mount(None, "/", None, k.MS_REC | k.MS_PRIVATE)


def _overlay(scratch: str) -> Callable[[], None]:
    def work() -> None:
        from singpy.kernel import syscalls as k

        _enter_userns()
        k.mount("singpy-check", scratch, "tmpfs", k.MS_NOSUID | k.MS_NODEV, "mode=0755")
        for name in ("lower", "upper", "work", "merged"):
            os.mkdir(os.path.join(scratch, name))
        options = f"lowerdir={scratch}/lower,upperdir={scratch}/upper,workdir={scratch}/work"
        try:
            k.mount("overlay", f"{scratch}/merged", "overlay", k.MS_NOSUID | k.MS_NODEV, options)
        except Exception:
            k.mount("overlay", f"{scratch}/merged", "overlay", k.MS_NOSUID | k.MS_NODEV, options + ",userxattr")
    return work


# --- the checks ------------------------------------------------------------------------------------------------------


def check_kernel() -> Result:
    version = hostcheck.kernel_version()
    release = os.uname().release
    if version < hostcheck.MIN_KERNEL:
        return _result("kernel", FAIL, f"Linux {release}, older than 4.18, the oldest singpy supports",
                       "run singpy on a host with Linux 4.18 or later (RHEL 8 and later, Debian 10 and later)")
    return _result("kernel", OK, f"Linux {release}")


def check_userns() -> Result:
    values = [f"{name} = {value}" for name in (hostcheck.MAX_USERNS, hostcheck.USERNS_CLONE,
                                               hostcheck.APPARMOR_USERNS)
              if (value := hostcheck.sysctl(name)) is not None]
    shown = f" ({', '.join(values)})" if values else ""
    if os.getuid() == 0:
        problem = _in_child(lambda: _probe_userns_as_root())
        status = WARN  # root's plain exec needs none: only --fakeroot and --userns do
    else:
        problem = _in_child(_enter_userns)
        status = FAIL
    if not problem:
        return _result("user namespaces", OK, f"a user namespace can be created{shown}")
    return _result("user namespaces", status, *_split(problem))


def _probe_userns_as_root() -> None:
    from singpy.kernel import syscalls as k

    k.unshare(k.CLONE_NEWUSER | k.CLONE_NEWNS)


def _split(problem: str) -> tuple[str, str]:
    """A hostcheck message as (cause, fix): it says the fix after its last "; "."""
    cause, _, fix = problem.rpartition("; ")
    return (cause, fix) if cause else (problem, "see docs/troubleshooting.md")


def check_overlay() -> Result:
    base = os.environ.get("TMPDIR") or "/tmp"
    try:
        scratch = tempfile.mkdtemp(prefix="singpy-check-", dir=base)
    except OSError as error:
        return _result("overlay", WARN, f"can't make a scratch directory in {base}: {error.strerror}")
    try:
        problem = _in_child(_overlay(scratch))
    finally:
        os.rmdir(scratch)  # the tmpfs and what it held went with the child's mount namespace
    where = "in a user namespace" if os.getuid() else "in a mount namespace"
    if not problem:
        return _result("overlay", OK, f"the kernel's overlayfs mounts {where} (--overlay, --writable-tmpfs)")
    tool = which("fuse-overlayfs", os.environ.get("PATH", os.defpath))
    fix = "singpy uses fuse-overlayfs instead" if tool else \
        f"Linux 5.11 or later mounts overlayfs in a user namespace; or {hostcheck.package('fuse-overlayfs')}"
    return _result("overlay", WARN, f"the kernel's overlayfs can't be mounted {where}: {problem}", fix)


def check_fuse() -> Result:
    state = hostcheck.fuse_state(os.getuid())
    if state is None:
        return _result("FUSE", OK, f"{FUSE_DEVICE} is usable (squashfuse, fuse-overlayfs, fuse2fs)")
    return _result("FUSE", WARN, f"{state[0]}: SIF images are extracted instead of mounted, overlay images need "
                                 "root", state[1])


def check_tools() -> list[Result]:
    path = os.environ.get("PATH", os.defpath)
    results = []
    for names, purpose in ((("squashfuse_ll", "squashfuse"), "mounts SIF and squashfs images (FUSE)"),
                           (("unsquashfs",), "extracts SIF and squashfs images (--unsquash; without FUSE)"),
                           (("mksquashfs",), "builds SIF images (singpy build)"),
                           (("fuse-overlayfs",), "overlays where the kernel's refuses")):
        found = next((where for name in names if (where := which(name, path))), None)
        if found:
            results.append(_result(names[-1], OK, f"{found}: {purpose}"))
        else:
            results.append(_result(names[-1], WARN, f"not found in PATH: needed where singpy {purpose}",
                                   hostcheck.package(names[-1])))
    return results


def check_images() -> Result:
    """Whether a SIF image can be opened at all: the kernel (root), FUSE, or extraction."""
    path = os.environ.get("PATH", os.defpath)
    if os.getuid() == 0 and os.path.exists("/dev/loop-control"):
        return _result("SIF images", OK, "mounted with the kernel's squashfs on a loop device (root)")
    squashfuse = any(which(name, path) for name in ("squashfuse_ll", "squashfuse"))
    if squashfuse and hostcheck.fuse_problem(os.getuid()) is None:
        return _result("SIF images", OK, "mounted with squashfuse")
    if which("unsquashfs", path):
        return _result("SIF images", OK, "extracted into your cache with unsquashfs (FUSE is not usable)")
    return _result("SIF images", FAIL, "no way to open a SIF image: no squashfuse with a usable /dev/fuse, no "
                                       "unsquashfs", f"{hostcheck.package('unsquashfs')}, or "
                                                     f"{hostcheck.package('squashfuse')}")


def check_loop() -> Result:
    if os.getuid() != 0:
        return _result("loop devices", INFO, "used as root only (a user's images go through FUSE or extraction)")
    if os.path.exists("/dev/loop-control"):
        return _result("loop devices", OK, "/dev/loop-control exists")
    return _result("loop devices", WARN, "/dev/loop-control is missing: images are mounted with FUSE instead",
                   "load the loop module (`modprobe loop`)")


def check_fakeroot() -> list[Result]:
    import pwd

    from singpy.layers import fakeroot

    uid = os.getuid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    results = []
    for path in (fakeroot.SUBUID, fakeroot.SUBGID):
        ranges = fakeroot.read_ranges(fakeroot._read(path), user, uid)
        if ranges:
            shown = ", ".join(f"{first}-{first + count - 1}" for first, count in ranges)
            results.append(_result(f"--fakeroot {os.path.basename(path)}", OK, f"{path}: {user} has {shown}"))
        else:
            results.append(_result(f"--fakeroot {os.path.basename(path)}", WARN,
                                   f"{path} has no range for {user}: --fakeroot maps uid 0 alone",
                                   f"an administrator adds `{user}:100000:65536` to {path} "
                                   f"(or `usermod --add-subuids/--add-subgids`)"))
    for tool in ("newuidmap", "newgidmap"):
        found = fakeroot.find_tool(tool)
        if found is None:
            results.append(_result(f"--fakeroot {tool}", WARN, f"not found in {SYSTEM_PATH}: --fakeroot maps uid "
                                                               "0 alone", hostcheck.package(tool)))
            continue
        problem = hostcheck.map_tool_failure(tool, found)
        results.append(_result(f"--fakeroot {tool}", WARN, *_split(problem)) if problem else
                       _result(f"--fakeroot {tool}", OK, found))
    return results


def check_gpus() -> list[Result]:
    path = os.environ.get("PATH", os.defpath)
    results = []
    try:
        with open("/proc/driver/nvidia/version") as handle:
            driver = handle.readline().strip()
    except OSError:
        driver = ""
    smi = which("nvidia-smi", path)
    if driver or smi:
        results.append(_result("NVIDIA GPU", INFO, "; ".join(part for part in (driver, smi and f"nvidia-smi: {smi}")
                                                          if part) + " (--nv)"))
    else:
        results.append(_result("NVIDIA GPU", INFO, "no NVIDIA driver loaded"))
    rocm = os.path.exists("/dev/kfd")
    results.append(_result("AMD GPU", INFO, "/dev/kfd exists (--rocm)" if rocm else "no /dev/kfd (no ROCm driver)"))
    return results


def check_hpc() -> list[Result]:
    path = os.environ.get("PATH", os.defpath)
    tools = [f"{name}: {where}" for name in ("srun", "mpirun") if (where := which(name, path))]
    job = os.environ.get("SLURM_JOB_ID")
    detail = ", ".join(tools) if tools else "no srun or mpirun in PATH"
    detail += f"; in Slurm job {job}" if job else "; not in a Slurm job"
    return [_result("Slurm/MPI", INFO, detail)]


def check_confinement() -> Result:
    parts = []
    inside = hostcheck.container()
    if inside:
        parts.append(f"running inside a {inside} container")
    if hostcheck.seccomp_filtered():
        parts.append("a seccomp filter applies (Seccomp: 2)")
    if hostcheck.status_field("NoNewPrivs") == "1":
        parts.append("no_new_privs is set (setuid newuidmap can't work)")
    return _result("confinement", INFO, "; ".join(parts) if parts else "none seen (no container, no seccomp filter)")


def run_checks() -> list[Result]:
    return [check_kernel(), check_userns(), check_overlay(), check_fuse(), check_images(), *check_tools(),
            check_loop(), *check_fakeroot(), *check_gpus(), *check_hpc(), check_confinement()]


# --- output ----------------------------------------------------------------------------------------------------------


def _print_table(results: list[Result]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from singpy.console import escape

    colours = {OK: "green", WARN: "yellow", FAIL: "bold red", INFO: "blue"}
    table = Table("check", "status", "detail", "fix")
    for row in results:  # Text: a detail holding "[...]" is not rich markup; escaped: it may quote host files
        table.add_row(Text(row["check"]), Text(row["status"], style=colours[row["status"]]),
                      Text(escape(row["detail"])), Text(escape(row["fix"])))
    Console(highlight=False).print(table)


def _print_plain(results: list[Result]) -> None:
    from singpy.console import escape

    width = max(len(row["check"]) for row in results)
    for row in results:
        print(f"{row['status']:<4}  {row['check']:<{width}}  {escape(row['detail'])}")
        if row["fix"]:
            print(f"{'':<4}  {'':<{width}}  fix: {escape(row['fix'])}")


def check_command(as_json: bool = typer.Option(False, "--json", help="print a JSON list of "
                                                                        "{check, status, detail, fix}")) -> None:
    """Show what works for you on this host (user namespaces, overlay, FUSE, --fakeroot ids, GPUs, Slurm), with fixes.

    Exits 1 when something a plain `singpy exec` needs fails, else 0.
    """
    results = run_checks()
    if as_json:
        json.dump(results, sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif sys.stdout.isatty():
        _print_table(results)
    else:
        _print_plain(results)
    raise typer.Exit(1 if any(row["status"] == FAIL for row in results) else 0)
