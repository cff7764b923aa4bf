"""`singpy push IMAGE.sif oras://HOST/REPO:TAG`: a SIF uploaded to an OCI registry as Apptainer does (ORAS)."""

from __future__ import annotations

import typer

from singpy.cli.pull import AUTHFILE, DOCKER_LOGIN, DOCKER_PASSWORD, DOCKER_USERNAME, NO_HTTPS, variables

IMAGE = typer.Argument(..., metavar="IMAGE.sif", show_default=False, help="the SIF file to upload")
DESTINATION = typer.Argument(..., metavar="URI", show_default=False,
                             help="where to: oras://HOST/REPO:TAG")


def push_command(
    image: str = IMAGE,
    destination: str = DESTINATION,
    docker_login: bool = DOCKER_LOGIN,
    authfile: str = AUTHFILE,
    no_https: bool = NO_HTTPS,
    library: str = typer.Option("", "--library", help="the library to push to (library://)", metavar="URL",
                                envvar=variables("LIBRARY"), show_envvar=False),
    allow_unsigned: bool = typer.Option(False, "--allow-unsigned", "-U", help="do not require a signed container "
                                        "image (library://)", envvar=variables("ALLOW_UNSIGNED"), show_envvar=False),
    description: str = typer.Option("", "--description", "-D", help="description for container image (library:// "
                                    "only)", metavar="TEXT"),
    docker_username: str = DOCKER_USERNAME,
    docker_password: str = DOCKER_PASSWORD,
) -> None:
    """Upload a SIF image to an OCI registry (oras://), where `singpy pull oras://...` and Apptainer find it."""
    import os

    from singpy import console
    from singpy.cli.flagvars import set_flag_variables
    from singpy.cli.pull import pull_options
    from singpy.errors import UsageError
    from singpy.host import host

    set_flag_variables(docker_username, docker_password, "")
    options = pull_options("", docker_login, authfile, no_https)
    if destination.startswith("library://"):  # a Sylabs library (singpy.library.push)
        from singpy.library.push import push as push_library

        console.info(push_library(image, destination, os.environ, host.capture().home, library=library,
                                  https=not no_https, allow_unsigned=allow_unsigned, description=description))
        return
    if destination.startswith("oras://"):
        from singpy.oci.oraspush import push

        console.info(push(image, destination, options, os.environ, host.capture().home))
        return
    scheme = destination.partition("://")[0] if "://" in destination else ""
    raise UsageError(f"can't push to {destination[:100]!r}: "
                     + (f"singpy does not push to {scheme[:20]}:// " if scheme else "no transport ")
                     + "(singpy push takes oras://HOST/REPO:TAG)",
                     hint="Run 'singpy push --help' for usage.")
