"""Where a `singpy exec SANDBOX true` spends its milliseconds, phase by phase (issue 31).

    .venv/bin/python benchmarks/startup_phases.py [--rounds N] [--as-root] [--no-site] [SANDBOX]

The instrument lives here, not in singpy: it costs a real launch nothing. Each
round spawns the venv's Python on this file in `--child` mode, which wraps the
launcher's phase functions (by name, where their callers look them up) with
clock marks, then runs `singpy.cli.main.main` as the console script does. The
marks go to a file opened before the launch (the container cannot see it by
path after the pivot) and are written just before `execve`, the last thing the
launcher does. Times are wall clock (CLOCK_REALTIME, ns) since the parent's
spawn, so the interpreter's own start counts too; the tail ("execve, `true`,
exit, wait") is the parent's wait minus the last mark. The hot-path modules
are imported first, as one "imports" phase: they are all imported before the
first container syscall anyway (launch.py imports them at its top), so this
moves time without adding any.

`--no-site` starts the child with `-S` (the tuned launcher script's shebang,
singpy/cli/launcher.py) and puts the repository on sys.path by hand.
"""

from __future__ import annotations

import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

PHASES = (  # (module, attribute, phase): the attribute is wrapped where its caller looks it up
    ("singpy.cli.parse", "split_global", "parse"),
    ("singpy.cli.actions", "parse_action", "parse"),
    ("singpy.host.host", "capture", "host facts"),
    ("singpy.config.sysconf", "load", "config (singpy.conf)"),
    ("singpy.cli.actions", "build_request", "request"),
    ("singpy.launch.launch", "prepare_image", "image detect"),
    ("singpy.launch.launch", "build_plan", "plan"),
    ("singpy.launch.launch", "enter_namespaces", "namespaces"),
    ("singpy.layers.rootfs", "enter_staging", "staging tmpfs + first pivot"),
    ("singpy.launch.launch", "attach_image", "attach image"),
    ("singpy.launch.launch", "prepare_root", "survey + image on /newroot"),
    ("singpy.launch.launch", "build_container", "binds + second pivot"),
)
HOT_MODULES = ("singpy.cli.main", "singpy.cli.actions", "singpy.launch.launch", "singpy.config.sysconf",
               "singpy.host.host")


def child(out_path: str, spawned_ns: int, argv: list[str]) -> None:
    """In the spawned interpreter: the marks around a real launch, written at execve."""
    started = time.time_ns()
    import importlib
    import os

    marks: list[tuple[str, int, int]] = [("interpreter start", spawned_ns, started)]
    out = os.open(out_path, os.O_WRONLY | os.O_TRUNC)
    for name in HOT_MODULES:
        importlib.import_module(name)
    marks.append(("imports", started, time.time_ns()))
    for module_name, attribute, phase in PHASES:
        module = sys.modules[module_name]
        setattr(module, attribute, _timed(getattr(module, attribute), phase, marks))
    real_execve = os.execve

    def execve(path: str, args: list[str], env: dict[str, str]) -> None:
        marks.append(("execve", time.time_ns(), 0))
        os.write(out, "".join(f"{name}\t{start}\t{end}\n" for name, start, end in marks).encode())
        real_execve(path, args, env)

    os.execve = execve  # type: ignore[assignment]
    sys.argv = ["singpy", *argv]
    from singpy.cli.main import main

    sys.exit(main())


def _timed(function: Callable[..., object], phase: str, marks: list[tuple[str, int, int]]) -> Callable[..., object]:
    def wrapper(*args: object, **kwargs: object) -> object:
        start = time.time_ns()
        try:
            return function(*args, **kwargs)
        finally:
            marks.append((phase, start, time.time_ns()))
    return wrapper


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    if sys.argv[4:5] == ["--path"]:  # -S: the repository by hand, as the tuned launcher script does
        sys.path.insert(0, sys.argv[5])
        del sys.argv[4:6]
    child(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
elif __name__ == "__main__":
    from startup_phases_report import main

    main()
