"""What `--version` and `version` answer, as singpy or as the Apptainer it stands in for.

Workflow engines and clients (cwltool, Snakemake, spython, Nextflow) run
`singularity --version` or `apptainer --version` and parse `NAME version
X.Y.Z` to choose their command lines. Installed under either name, singpy
answers as the Apptainer release whose behaviour it implements (docs/hpc.md),
exactly as that release's `apptainer` (also when called as `singularity`,
which Apptainer installs as a link to itself); under its own name it answers
as singpy. singpy's own version stays visible: `singpy --version`, and the
verbose line of `-v --version`.
"""

from __future__ import annotations

import os
import sys

from singpy import APPTAINER_VERSION, __version__

DROP_IN_NAMES = ("apptainer", "singularity")


def is_drop_in(program: str | None = None) -> bool:
    """Whether singpy was started under one of Apptainer's names (a link or a copy named so)."""
    return os.path.basename(program if program is not None else sys.argv[0]) in DROP_IN_NAMES


def version_line() -> str:
    """The `--version` answer: `apptainer version 1.5.3` under Apptainer's names, else `singpy version ...`."""
    if not is_drop_in():
        return f"singpy version {__version__}"
    _say_own_version()
    return f"apptainer version {APPTAINER_VERSION}"


def version_number() -> str:
    """The `version` subcommand's answer: under Apptainer's names the bare number, as `apptainer version` prints
    it; under singpy's own, what `singpy --version` prints."""
    if not is_drop_in():
        return version_line()
    _say_own_version()
    return APPTAINER_VERSION


def _say_own_version() -> None:
    """Under Apptainer's names, singpy's own version at -v (under its own, the answer is that version)."""
    from singpy import console

    console.verbose(f"singpy {__version__}, answering as Apptainer {APPTAINER_VERSION} under the names "
                    f"{' and '.join(DROP_IN_NAMES)}")
