"""`singpy build TARGET SOURCE`: SIF from a sandbox or an OCI image, sandbox from a SIF, squashfs or OCI image."""

from __future__ import annotations

import typer

from singpy.cli.pull import ARCH, AUTHFILE, DOCKER_LOGIN, NO_HTTPS, pull_options


def build_command(
    target: str = typer.Argument(..., help="the image to write: a SIF file, or a directory (sandbox)"),
    source: str = typer.Argument(..., help="a sandbox directory (-> SIF), a SIF/squashfs image (-> sandbox), "
                                 "or docker://REF, oci:DIR, oci-archive:FILE, docker-archive:FILE"),
    force: bool = typer.Option(False, "--force", "-F", help="overwrite TARGET if it exists"),
    sandbox: bool = typer.Option(False, "--sandbox", "-s", help="write a sandbox directory (docker:// and OCI "
                                 "sources; a SIF source always gives one)"),
    arch: str = ARCH,
    docker_login: bool = DOCKER_LOGIN,
    authfile: str = AUTHFILE,
    no_https: bool = NO_HTTPS,
) -> None:
    """Build a SIF or a sandbox from a sandbox, a SIF/squashfs image, or an OCI image (docker://, oci:...)."""
    import os

    from singpy import console
    from singpy.oci.ref import is_image_uri

    if is_image_uri(source):
        from singpy import host
        from singpy.oci.pull import build_from

        options = pull_options(arch, docker_login, authfile, no_https)
        console.info(build_from(source, target, options, os.environ, host.capture().home,
                                sandbox=sandbox, force=force))
        return
    from singpy.image.builder import build

    console.info(build(target, source, force=force, env=os.environ))
