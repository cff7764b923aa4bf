"""`singpy delete [--force] [--arch ARCH] library://REF | oras://REF`: an image removed from its library
(singpy.library.delete) or its OCI registry (singpy.oci.oraspush.delete), with Apptainer's flags and question
(cmd/internal/cli/delete.go)."""

from __future__ import annotations

import typer

from singpy.cli.pull import AUTHFILE, DOCKER_LOGIN, DOCKER_PASSWORD, DOCKER_USERNAME, NO_HTTPS, variables

REFERENCE = typer.Argument(..., metavar="library://REF|oras://REF", show_default=False,
                           help="the image: library://[HOST/]ENTITY/COLLECTION/CONTAINER[:TAG], or "
                           "oras://HOST/REPO[:TAG|@DIGEST]")


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
    docker_login: bool = DOCKER_LOGIN,
    authfile: str = AUTHFILE,
    no_https: bool = NO_HTTPS,
    docker_username: str = DOCKER_USERNAME,
    docker_password: str = DOCKER_PASSWORD,
) -> None:
    """Delete an image from a library (library://, with the token of its remote: `singpy remote login`) or from
    an OCI registry (oras://, with the credentials of `singpy registry login`)."""
    import os

    from singpy import console
    from singpy.cli.flagvars import set_flag_variables
    from singpy.errors import UsageError
    from singpy.host import host
    from singpy.image.sifscan import host_arch

    set_flag_variables(docker_username, docker_password, "")
    arch = arch or host_arch()
    if reference.startswith("oras://"):
        from singpy.cli.fastpull import pull_options
        from singpy.oci.oras import parse_ref, shown
        from singpy.oci.oraspush import delete as delete_from_registry

        shown_ref = shown(parse_ref(reference)).removeprefix("oras://")  # checked before anything is asked
        if force or _confirmed(f"Are you sure you want to delete {shown_ref} ({arch}) [y/N] "):
            console.info(delete_from_registry(reference, pull_options("", docker_login, authfile, no_https),
                                              os.environ, host.capture().home, arch=arch))
        return
    if not reference.startswith("library://"):
        raise UsageError(f"can't delete {reference[:100]!r}: singpy deletes library://... and oras://... images",
                         hint="Run 'singpy delete --help' for usage.")
    from singpy.library.delete import delete, target

    ref = target(reference)
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
