"""`python -m singpy.cli.launcher SCRIPT`: rewrite the `singpy` console script to start Python with `-S`.

A plain `python3` start runs `site`: the venv's site-packages and every `.pth`
file in it (setuptools' distutils shim, coloredlogs), plus Debian's
`sitecustomize`: about 4 ms of a 30 ms `singpy exec` (benchmarks/README.md,
"Where the time goes"), for modules the launch path never imports. The tuned
script starts the interpreter with `-S` (a shebang takes one argument: it is
that flag) and appends only the directory that holds the `singpy` package;
singpy.cli.main runs `site.main()` itself the moment anything else is needed
(every command but run/exec/shell/test at once, those four on the first
import the standard library and singpy cannot answer). `make setup` writes it;
pip writes the plain script, which works the same, only slower. The drop-in
names (singpy.cli.dropin) are links to this script, so they get it too.
"""

from __future__ import annotations

import os
import subprocess
import sys

from singpy.cli.bundle import bundle_path, hot_path_modules, image_path_modules, write_bundle

TEMPLATE = """#!{python} -S
# singpy's console script, tuned by `python -m singpy.cli.launcher` (make setup): -S skips site and its .pth
# files; singpy.cli.main runs site.main() as soon as something outside the standard library and singpy is needed.
# The launch path's modules come from one file (singpy.cli.bundle), each only while its source is unchanged.
import sys
sys.path.append({package_root!r})
from singpy.cli.bundle import install
install({bundle!r})
from singpy.cli.main import main
if __name__ == '__main__':
    sys.argv[0] = sys.argv[0].removesuffix('.exe')
    sys.exit(main())
"""


def script_text(python: str, package_root: str) -> str:
    """The tuned script for this interpreter and the directory holding the `singpy` package."""
    if any(character.isspace() for character in python) or len(python) > 200:  # a shebang splits on neither
        raise ValueError(f"{python!r}: not usable in a shebang line with an argument")
    bundle = bundle_path(os.path.join(package_root, "singpy"))
    return TEMPLATE.format(python=python, package_root=package_root, bundle=bundle)


def write(script: str, python: str, package_root: str) -> None:
    """Replace `script` atomically (a launch running it meanwhile reads the old or the new one, whole)."""
    text = script_text(python, package_root)
    partial = f"{script}.{os.getpid()}.tmp"
    with open(partial, "w", encoding="utf-8") as out:
        out.write(text)
    os.chmod(partial, 0o755)
    os.replace(partial, script)


def _interpreter(script: str) -> str | None:
    """The interpreter the installer wrote in the script's `#!` line, if it is a plain one."""
    try:
        with open(script, encoding="utf-8") as existing:
            first = existing.readline(300)
    except (OSError, UnicodeDecodeError):
        return None
    words = first.removeprefix("#!").split()
    return words[0] if first.startswith("#!/") and words[1:] in ([], ["-S"]) and "python" in words[0] else None


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m singpy.cli.launcher SCRIPT  (the singpy console script to rewrite)", file=sys.stderr)
        return 1
    import singpy

    package_root = os.path.dirname(os.path.dirname(os.path.abspath(singpy.__file__)))
    python = _interpreter(argv[0]) or sys.executable
    try:
        write(argv[0], python, package_root)
    except (OSError, ValueError) as error:
        print(f"{argv[0]}: {error}", file=sys.stderr)
        return 1
    bundle = bundle_path(os.path.join(package_root, "singpy"))
    try:
        write_bundle(bundle, hot_path_modules(package_root), image_path_modules(package_root))
    except (OSError, SyntaxError, subprocess.SubprocessError) as error:  # the script works without it, slower
        print(f"{bundle}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
