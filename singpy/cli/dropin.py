"""`python -m singpy.cli.dropin [DIR]`: offer singpy as `apptainer` and `singularity` too.

Workflow engines run the command named `apptainer` or `singularity` found on
PATH (docs/hpc.md). This links both names, in DIR (default: the directory of
the `singpy` command on PATH, where pipx and pip put it), to the `singpy`
command of the installation running this module; under those names singpy
answers as Apptainer (singpy.cli.version). A name that exists and is not
already such a link is left alone: a real Apptainer is never replaced.
`make install DROP_IN=yes` does the same for a clone.
"""

from __future__ import annotations

import os
import shutil
import sys

from singpy.cli.version import DROP_IN_NAMES


def install(directory: str, command: str) -> list[str]:
    """Link each of DROP_IN_NAMES in `directory` to `command`; the lines to print. OSError/ValueError on failure."""
    done = []
    for name in DROP_IN_NAMES:
        link = os.path.join(directory, name)
        if os.path.lexists(link):
            if not (os.path.islink(link) and os.readlink(link) == command):
                raise ValueError(f"{link} exists and is not singpy: left as it is")
            done.append(f"{link} -> {command} (already there)")
            continue
        os.symlink(command, link)
        done.append(f"installed {link} -> {command}")
    return done


def main(argv: list[str]) -> int:
    command = os.path.join(os.path.dirname(sys.executable), "singpy")  # this installation's, not another on PATH
    if not os.path.isfile(command):
        print(f"no singpy command beside {sys.executable}", file=sys.stderr)
        return 1
    on_path = shutil.which("singpy")
    directory = argv[0] if argv else os.path.dirname(on_path) if on_path else ""
    if len(argv) > 1 or not directory:
        print("usage: python -m singpy.cli.dropin [DIR]  (DIR: where to link apptainer and singularity; default: "
              "the directory of the singpy command on PATH)", file=sys.stderr)
        return 1
    try:
        for line in install(os.path.abspath(directory), command):
            print(line)
    except (OSError, ValueError) as error:
        print(error.strerror if isinstance(error, OSError) and error.strerror else str(error), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
