"""`singpy delete [--force] [--arch ARCH] library://REF`: an image removed from its library (singpy.library.delete),
with Apptainer's flags and question (cmd/internal/cli/delete.go). Apptainer also deletes an oras:// image from
its registry; singpy does not yet (a one-line refusal says so)."""

from __future__ import annotations

import typer

from singpy.cli.pull import NO_HTTPS, variables

REFERENCE = typer.Argument(..., metavar="library://REF", show_default=False,
                           help="the image: library://[HOST/]ENTITY/COLLECTION/CONTAINER[:TAG]")


def delete_command(
    reference: str = REFERENCE,
    force: bool = typer.Option(False, "--force", "-F", help="delete image without confirmation",
                               envvar=variables("FORCE"), show_envvar=False),
    arch: str = typer.Option("", "--arch", "-A", help="the architecture of the image to delete (default: this "
                             "host's)", metavar="ARCH", envvar=variables("ARCH"), show_envvar=False),
    timeout: int = typer.Option(15, "--timeout", "-T", min=1, help="seconds the library may take to answer",
                                metavar="SECONDS", envvar=variables("TIMEOUT"), show_envvar=False),
    library: str = typer.Option("", "--library", help="delete images from the provided library", metavar="URL",
                                envvar=variables("LIBRARY"), show_envvar=False),
    no_https: bool = NO_HTTPS,
) -> None:
    """Delete an image from a library (library://), with the token of its remote (`singpy remote login`)."""
    import os

    from singpy import console
    from singpy.errors import UsageError
    from singpy.host import host

    if not reference.startswith("library://"):
        raise UsageError(f"can't delete {reference[:100]!r}: singpy deletes library://... images only (not yet "
                         "oras://, which Apptainer deletes from its registry)",
                         hint="Run 'singpy delete --help' for usage.")
    from singpy.image.sifscan import host_arch
    from singpy.library.delete import delete, target

    ref = target(reference)
    arch = arch or host_arch()
    if not force and not _confirmed(f"Are you sure you want to delete {ref.name} ({arch}) [y/N] "):
        return  # as Apptainer: no is no error
    console.info(delete(ref, os.environ, host.capture().home, arch=arch, library=library, https=not no_https,
                        timeout=float(timeout)))


def _confirmed(question: str) -> bool:
    """Apptainer's yes/no question: only y or yes (any case) is yes; no answer (end of input) is no."""
    import sys

    sys.stdout.write(question)
    sys.stdout.flush()
    answer = sys.stdin.readline()
    return answer.strip().lower() in ("y", "yes")
