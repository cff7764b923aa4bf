"""`singpy pull [OUT.sif] REF`: a docker://, oci:, oci-archive: or docker-archive: image as a SIF file."""

from __future__ import annotations

import typer

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from singpy.oci.pull import PullOptions

ARCH = typer.Option("", "--arch", help="the platform to pull from a multi-architecture image (amd64, arm64, "
                    "arm64/v8, linux/arm/v7...; default: this host's)", metavar="ARCH")
DOCKER_LOGIN = typer.Option(False, "--docker-login", help="ask for the registry's username and password")
AUTHFILE = typer.Option("", "--authfile", help="registry credentials in docker's config.json format",
                        metavar="FILE")
WORDS = typer.Argument(..., metavar="[OUT.sif] REF", show_default=False,
                       help="the file to write (default: NAME_TAG.sif), then the image")
NO_HTTPS = typer.Option(False, "--no-https", help="talk to the registry over plain HTTP (a local registry)")


def pull_options(arch: str, docker_login: bool, authfile: str, no_https: bool) -> PullOptions:
    """The PullOptions of these flags, the environment's spellings (APPTAINER_AUTHFILE...) filling in."""
    import os

    from singpy.oci.pull import PullOptions

    env = os.environ
    authfile = authfile or next((env[f"{prefix}AUTHFILE"] for prefix in ("SINGPY_", "APPTAINER_", "SINGULARITY_")
                                 if env.get(f"{prefix}AUTHFILE")), "")
    return PullOptions(arch=arch, login=docker_login, authfile=authfile, https=not no_https)


def pull_command(
    words: list[str] = WORDS,
    force: bool = typer.Option(False, "--force", "-F", help="overwrite OUT.sif if it exists"),
    arch: str = ARCH,
    docker_login: bool = DOCKER_LOGIN,
    authfile: str = AUTHFILE,
    no_https: bool = NO_HTTPS,
) -> None:
    """Pull an image from a registry (docker://) or an OCI layout/archive and write it as a SIF file."""
    import os

    from singpy import console, host
    from singpy.errors import UsageError
    from singpy.oci.pull import pull

    if len(words) > 2:
        raise UsageError(f"singpy pull takes [OUT.sif] REF, not {len(words)} arguments",
                         hint="Run 'singpy pull --help' for usage.")
    target, reference = (words[0], words[1]) if len(words) == 2 else ("", words[0])
    info = host.capture()
    options = pull_options(arch, docker_login, authfile, no_https)
    console.info(pull(reference, target, options, os.environ, info.home, force=force))
