"""A/B of `singpy exec SANDBOX true` between source trees, interleaved, in CPU time (issue 31).

    .venv/bin/python benchmarks/startup_ab.py --rounds 60 /tmp/base /work/main   # as root: runs as singpy-test
    SINGPY_CACHEDIR=DIR .venv/bin/python benchmarks/startup_ab.py --image /tmp/bbx --image D.sif \
        --image docker://127.0.0.1:PORT/dsmall:latest --flag=--no-https /tmp/base /work/main

With several `--image`s, every tree runs each of them (a docker:// or oras:// one cached beforehand, once, by the
warm-up run; `--flag` adds an option before the image). The environment is passed on (SINGPY_CACHEDIR).

Each tree runs the way its own tuned console script starts it: the script its singpy.cli.launcher's TEMPLATE
makes for it, written to a scratch directory and run as `python -S SCRIPT` (a tree without one: BUNDLED or
SCRIPT, `python -S -c`, the tree appended to sys.path); `python3 -c pass` and `python3 -S -c pass` run beside
them. Every round runs each command once, in a shuffled order, so the machine's load hits all of them alike.
CPU time (user + system of the child, from wait4) moves much less with that load than wall time, so both are
printed (benchmarks/README.md, "Where the time goes").
"""

from __future__ import annotations

import argparse
import ast
import os
import pwd
import random
import shutil
import statistics
import sys
import tempfile
import time

import startup_repo  # noqa: F401  (the repository on sys.path, for singpy)

from singpy.cli.bundle import bundle_path

SCRIPT = ("import sys; sys.path.append({root!r}); from singpy.cli.main import main; "
          "sys.argv[0] = 'singpy'; sys.exit(main())")
# A tree with singpy.cli.bundle but no launcher TEMPLATE runs as its tuned script did: the bundle installed first.
BUNDLED = ("import sys; sys.path.append({root!r}); from singpy.cli.bundle import install, bundle_path; "
           "install(bundle_path({root!r} + '/singpy')); from singpy.cli.main import main; "
           "sys.argv[0] = 'singpy'; sys.exit(main())")


def _tree_script(root: str, python: str, scratch: str) -> list[str] | None:
    """The argv that runs the tuned console script that tree's launcher writes (its TEMPLATE, read without
    importing the tree), or None if it has none."""
    try:
        with open(f"{root}/singpy/cli/launcher.py", encoding="utf-8") as file:
            module = ast.parse(file.read())
    except (OSError, SyntaxError):
        return None
    for node in module.body:
        if (isinstance(node, ast.Assign) and [getattr(target, "id", None) for target in node.targets] == ["TEMPLATE"]
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            text = node.value.value.format(python=python, package_root=root, bundle=bundle_path(f"{root}/singpy"))
            directory = tempfile.mkdtemp(dir=scratch)
            script = os.path.join(directory, "singpy")  # named as installed: sys.argv[0], sys.path[0] alike
            with open(script, "w", encoding="utf-8") as out:
                out.write(text)
            os.chmod(script, 0o755)
            os.chmod(directory, 0o755)
            return [python, "-S", script]
    return None


def _spawn(argv: list[str], account: pwd.struct_passwd | None) -> tuple[float, float]:
    """Wall and CPU seconds of one run of argv (as `account` when given), its output discarded."""
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: become the account, silence the output, exec
        try:
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 1)
            if account is not None:
                os.setgroups([])
                os.setgid(account.pw_gid)
                os.setuid(account.pw_uid)
                os.environ["HOME"] = account.pw_dir
                os.environ["USER"] = os.environ["LOGNAME"] = account.pw_name
            os.chdir("/")
            os.execv(argv[0], argv)
        finally:
            os._exit(127)
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv}: exit status {os.waitstatus_to_exitcode(status)}")
    return wall, usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", help="source trees (each holds the singpy package)")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--image", action="append", help="an image with /bin/true (default /tmp/bbx); repeatable")
    parser.add_argument("--flag", action="append", default=[], help="an option of `exec` (e.g. --no-https)")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--user", default="singpy-test", help="account to run as when root")
    options = parser.parse_args(argv)
    account = pwd.getpwnam(options.user) if os.getuid() == 0 else None
    commands = {"python3 -c pass": [options.python, "-c", "pass"],
                "python3 -S -c pass": [options.python, "-S", "-c", "pass"]}
    images = options.image or ["/tmp/bbx"]
    scratch = tempfile.mkdtemp(prefix="startup-ab-")
    os.chmod(scratch, 0o755)  # the account reaches the scripts
    try:
        return _measure(options, account, commands, images, scratch)
    finally:
        shutil.rmtree(scratch)


def _measure(options: argparse.Namespace, account: pwd.struct_passwd | None, commands: dict[str, list[str]],
             images: list[str], scratch: str) -> int:
    starts = {}
    for tree in options.trees:
        root = os.path.abspath(tree)
        script = BUNDLED if os.path.exists(f"{root}/singpy/cli/bundle.py") else SCRIPT
        starts[tree] = (_tree_script(root, options.python, scratch)
                        or [options.python, "-S", "-c", script.format(root=root)])
    for image in images:
        for tree in options.trees:
            name = tree if len(images) == 1 else f"{tree} {image.rsplit('/', 1)[-1]}"
            commands[name] = [*starts[tree], "exec", *options.flag, image, "/bin/true"]
    for command in commands.values():  # warm-up, and a failing command stops here
        _spawn(command, account)
    walls: dict[str, list[float]] = {name: [] for name in commands}
    cpus: dict[str, list[float]] = {name: [] for name in commands}
    order = list(commands)
    for _ in range(options.rounds):
        random.shuffle(order)
        for name in order:
            wall, cpu = _spawn(commands[name], account)
            walls[name].append(wall * 1000)
            cpus[name].append(cpu * 1000)
    base_wall = statistics.median(walls["python3 -c pass"])
    base_cpu = statistics.median(cpus["python3 -c pass"])
    print(f"{options.rounds} rounds, load {os.getloadavg()[0]:.1f}")
    print(f"{'command':<44} {'wall ms':>8} {'ratio':>6} {'cpu ms':>8} {'ratio':>6}")
    for name in commands:
        wall, cpu = statistics.median(walls[name]), statistics.median(cpus[name])
        print(f"{name[-44:]:<44} {wall:8.2f} {wall / base_wall:5.2f}x {cpu:8.2f} {cpu / base_cpu:5.2f}x")
    # Each round ran every command once, close together: the median of the rounds' differences to the first tree
    # moves less with the machine's load than the difference of the medians above.
    trees = [name for name in commands if name not in ("python3 -c pass", "python3 -S -c pass")]
    for name in trees[1:]:
        wall = statistics.median(a - b for a, b in zip(walls[name], walls[trees[0]], strict=True))
        cpu = statistics.median(a - b for a, b in zip(cpus[name], cpus[trees[0]], strict=True))
        print(f"{name[-30:]} - {trees[0][-30:]}, per round: wall {wall:+.2f} ms, cpu {cpu:+.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
