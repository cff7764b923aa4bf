"""The sections that run: %setup on the host, %post and %test in the container being built.

%post and %test run through singpy's own launcher, as Apptainer runs them
through its own ([1] Apptainer internal/pkg/build/stage.go):
`singpy --build-config exec --writable --pwd / --cleanenv ... ROOTFS /bin/sh -ex /.post.script`
(%test without --writable and --cleanenv)
as real root, or with --fakeroot for a user; the host's network; no home
directory; --bind values of the build. Also --pid, which Apptainer does
not use: when the build is interrupted, the container's PID 1 is killed
and the kernel ends everything %post started, daemons included.

Their output goes straight to the build's stdout and stderr, as it comes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence

from singpy import console
from singpy.constants import SINGULARITY_D
from singpy.env.environ import RUNTIME_PREFIXES
from singpy.errors import ImageError
from singpy.plan import IdMap
from singpy.recipe.deffile import Stage

ENV_SCRIPT = f"{SINGULARITY_D}/env/91-environment.sh"  # $APPTAINER_ENVIRONMENT in %post
LABELS_FILE = "/.build.labels"  # $APPTAINER_LABELS in %post: "NAME value" lines, labels of the image
POST_SCRIPT = "/.post.script"
# Of the caller's SINGPY_/APPTAINER_/SINGULARITY_ variables, those the nested launcher may see (as Apptainer's).
_PASSED = ("DEBUG", "NV", "NVCCLI", "ROCM", "BINDPATH", "MOUNT")


class Runner:
    """How %post and %test start the container: the user's ids, the build's binds, the environment."""

    def __init__(self, *, idmap: IdMap | None, binds: Sequence[str], env: Mapping[str, str],
                 flags: Sequence[str] = (), test_flags: Sequence[str] = ()) -> None:
        self.idmap = idmap  # None as root: real root inside
        self.flags = tuple(flags)  # the build's --nv, --rocm, --mount: for %post and %test
        self.test_flags = tuple(test_flags)  # --writable-tmpfs: for %test only, as Apptainer
        # The build process is root of the build's user namespace already (singpy.recipe.layered): the
        # nested launcher runs as that root, without --fakeroot (which would nest a single mapping in it).
        self.in_namespace = False
        self.binds = tuple(binds)
        self.env = {name: value for name, value in env.items() if _passed(name)}

    def launcher(self, rootfs: str, *, writable: bool) -> list[str]:
        # -P: no working directory on sys.path (a `singpy/` planted where the build runs would run as its root)
        argv = [sys.executable, "-P", "-m", "singpy", "--build-config", "exec", "--pid", "--pwd", "/"]
        if writable:  # %post; %test sees the caller's environment, as in Apptainer
            argv += ["--writable", "--cleanenv"]
        else:
            argv += self.test_flags
        argv += self.flags
        if self.idmap is not None and not self.in_namespace:
            argv.append("--fakeroot")
        for bind in self.binds:
            argv += ["--bind", bind]
        return argv


def _passed(name: str) -> bool:
    prefix = next((prefix for prefix in RUNTIME_PREFIXES if name.startswith(prefix)), None)
    return prefix is None or name.removeprefix(prefix) in _PASSED


Command = Callable[[list[str]], None]  # runs a host program to its end, or raises ImageError

# What `build --section` selects (Apptainer's names); %files covers `%files from` too. %app* sections and
# %arguments are not selectable: apps follow every selection but "none".
SELECTABLE = ("setup", "files", "post", "environment", "runscript", "startscript", "test", "help", "labels")


def selected(stage: Stage, wanted: Sequence[str]) -> Stage:
    """The stage with only the sections `build --section` asks for (all of them for "all")."""
    if "all" in wanted:
        return stage
    kept = tuple(section for section in stage.sections if "none" not in wanted and
                 (section.name in wanted or (section.name not in SELECTABLE and section.name != "pre")))
    return stage.replace(sections=kept)


def run_setup(stage: Stage, rootfs: str, workdir: str, idmap: IdMap | None) -> None:
    """%setup, on the host, with $APPTAINER_ROOTFS naming the stage's root.

    As root, as root; for anyone else, as root of the build's user namespace
    (singpy.recipe.mapped), as Apptainer runs its whole fakeroot build: the
    user's own files read as root's, the rest of the host as nobody's.

    Repeated %setup sections are one script, their bodies joined in order
    (a variable the first sets is still set in the second), run with the args
    of the last section line that has some: Apptainer's parser keeps one
    script per section name (Apptainer pkg/build/types/parser/deffile.go).
    """
    body = stage.script("setup")
    if not body.strip():
        return
    script = f"{workdir}/setup"
    _write_script(script, body)
    try:
        console.info("Running setup scriptlet")
        env = {**os.environ, "APPTAINER_ROOTFS": rootfs, "SINGULARITY_ROOTFS": rootfs,
               "APPTAINER_ENVIRONMENT": ENV_SCRIPT, "SINGULARITY_ENVIRONMENT": ENV_SCRIPT}
        _run([*_prefix(idmap), *shell_argv("setup", script, stage.args("setup"))], env=env, what="%setup")
    finally:
        os.unlink(script)


def run_host(argv: list[str], *, what: str, idmap: IdMap | None = None) -> None:
    """A host program (cp between stages), as root or as root of the build's user namespace."""
    _run([*_prefix(idmap), *argv], env=os.environ, what=what)


def _prefix(idmap: IdMap | None) -> list[str]:
    from singpy.recipe import mapped

    return mapped.command(idmap) if idmap is not None else []


def run_post(stage: Stage, rootfs: str, runner: Runner, *, apps: str = "") -> None:
    """%post inside the container, written to /.post.script there for the time it runs; `apps` follows it
    (the %appinstall sections, singpy.recipe.apps)."""
    body = stage.script("post") + apps
    if not body.strip():
        return
    args = stage.args("post")  # the last %post line's that has some, as Apptainer
    script = f"{rootfs}{POST_SCRIPT}"
    _write_script(script, body, in_image=True)
    env = {"APPTAINER_ENVIRONMENT": ENV_SCRIPT, "SINGULARITY_ENVIRONMENT": ENV_SCRIPT,
           "APPTAINER_LABELS": LABELS_FILE, "SINGULARITY_LABELS": LABELS_FILE}
    argv = runner.launcher(rootfs, writable=True)
    for name, value in env.items():
        argv += ["--env", f"{name}={value}"]
    argv += [rootfs, *shell_argv("post", POST_SCRIPT, args)]
    console.info("Running post scriptlet")
    try:
        _run(argv, env=runner.env, what="%post", idmap=runner.idmap)
    finally:
        if os.path.lexists(script):
            try:
                os.unlink(script)
            except OSError:  # %post made it a directory: the image keeps what %post made
                console.warning(f"%post replaced {POST_SCRIPT} with something singpy does not remove")


def run_test(rootfs: str, runner: Runner) -> None:
    """/.singularity.d/test (from %test) in the finished container, read-only."""
    console.info("Running testscript")
    argv = [*runner.launcher(rootfs, writable=False), rootfs, f"{SINGULARITY_D}/test"]
    _run(argv, env=runner.env, what="%test", idmap=runner.idmap)


def shell_argv(name: str, script: str, args: str) -> list[str]:
    """`/bin/sh -ex SCRIPT`, or with `-c SHELL...` in the section line `/bin/sh -ex -c "SHELL... SCRIPT"`.

    Apptainer's rule ([1] internal/pkg/build/util.go getSectionScriptArgs):
    what follows `#` on the section line is a comment; everything after -c
    is the command the script is handed to.
    """
    params = args.split("#", 1)[0].split()
    if "-c" in params:
        at = params.index("-c")
        rest = params[at + 1:]
        if not rest:
            raise ImageError(f"bad %{name} section '-c' parameter: missing arguments")
        return ["/bin/sh", "-ex", *params[:at], "-c", " ".join([*rest, script])]
    return ["/bin/sh", "-ex", *params, script]


def _write_script(path: str, body: str, *, in_image: bool = False) -> None:
    """A new script file, executable whatever the umask; a file or link of that name in the image goes first."""
    try:
        if in_image and os.path.lexists(path) and not os.path.isdir(path):
            os.unlink(path)  # the base image's own /.post.script, or a link there: never written through
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o755)
    except OSError as error:
        where = f"{os.path.basename(path)} in the image" if in_image else path
        raise ImageError(f"can't write {where}: {error.strerror}") from None
    with os.fdopen(fd, "w") as handle:
        os.fchmod(fd, 0o755)
        handle.write(body)


def run_program(argv: list[str], *, env: Mapping[str, str], what: str, ok: tuple[int, ...] = (0,)) -> int:
    """A host program run as a section is (a bootstrap agent's tool): its status, one of `ok`, or ImageError."""
    status = _wait(argv, env=env, what=what)
    if status not in ok:
        raise ImageError(_failure(what, status, None))
    return status


def run_in_container(rootfs: str, runner: Runner, command: list[str], *, what: str) -> None:
    """`command` in the container being built, as %post runs (writable, root, a clean environment)."""
    _run([*runner.launcher(rootfs, writable=True), rootfs, *command], env=runner.env, what=what,
         idmap=runner.idmap)


def _run(argv: list[str], *, env: Mapping[str, str], what: str, idmap: IdMap | None = None) -> None:
    """Run a section to its end, its output going to ours; a failure is one error naming its status."""
    status = _wait(argv, env=env, what=what)
    if status != 0:
        raise ImageError(_failure(what, status, idmap))


def _wait(argv: list[str], *, env: Mapping[str, str], what: str) -> int:
    """Start `argv` and wait for its end: its status (negative: the signal that killed it).

    It runs in a session of its own: Ctrl-C on the terminal reaches
    singpy build only, which (like SIGTERM, SIGHUP) kills the whole group;
    and it dies with singpy build (SIGKILL, the OOM killer), its container
    with it, rather than go on with the build's mounts in a namespace of its own.
    """
    from singpy.image.tools import die_with

    console.debug(f"running {argv}")
    sys.stdout.flush()
    sys.stderr.flush()
    parent, mask = os.getpid(), signal.pthread_sigmask(signal.SIG_BLOCK, ())
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, env=dict(env), start_new_session=True,
                                 preexec_fn=lambda: die_with(parent, mask))
    except OSError as error:
        raise ImageError(f"{what} can't start {argv[0]}: {error.strerror}") from None
    try:
        return child.wait()
    except BaseException:
        _kill_group(child)
        raise


def _kill_group(child: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()


def _failure(what: str, status: int, idmap: IdMap | None) -> str:
    said = f"killed by signal {-status}" if status < 0 else f"exit status {status}"
    message = f"{what} failed ({said})"
    if what == "%post" and idmap is not None and not idmap.helper:
        reason = idmap.note.removeprefix("fakeroot: ").split(": single mapping", 1)[0]
        remedy = "drop --ignore-subuid" if reason == "--ignore-subuid" else \
            "ask the administrator for a subordinate id range in /etc/subuid and /etc/subgid"
        message += (f"; it ran with a single id mapping ({reason}), "
                    f"so commands that give files to other users (chown, apt-get, dnf) fail: {remedy}")
    return message
