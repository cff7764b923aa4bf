"""`singpy pull [OUT.sif] REF`: a docker://, oci:, oci-archive: or docker-archive: image as a SIF file, or an
image file by URL (http://, https://) as it is."""

from __future__ import annotations

import typer

from singpy.cli.fastpull import ENV_KEYS, pull_options, pull_target, pull_words, variables

__all__ = ["AUTHFILE", "DOCKER_LOGIN", "DOCKER_PASSWORD", "DOCKER_USERNAME", "NO_HTTPS", "TMPDIR", "pull_command",
           "pull_options", "pull_target", "variables"]

ARCH = typer.Option("", "--arch", help="the platform to pull from a multi-architecture image (amd64, arm64, "
                    "arm64/v8, linux/arm/v7...; default: this host's)", metavar="ARCH",
                    envvar=variables(*ENV_KEYS["arch"]), show_envvar=False)
# Shared by pull, build and inspect, with Apptainer's EnvKeys (and AUTHFILE, which singpy read before)
DOCKER_LOGIN = typer.Option(False, "--docker-login", help="ask for the registry's username and password",
                            envvar=variables(*ENV_KEYS["docker_login"]), show_envvar=False)
AUTHFILE = typer.Option("", "--authfile", help="registry credentials in docker's config.json format",
                        metavar="FILE", envvar=variables(*ENV_KEYS["authfile"]), show_envvar=False)
# Apptainer's hidden flags of pull, build, push and delete (singpy.cli.flagvars); --tmpdir: pull, build, overlay
# (no envvar: their variables are read where they act, fastpull.ENV_KEYS says)
DOCKER_USERNAME = typer.Option("", "--docker-username", metavar="NAME", hidden=True)
DOCKER_PASSWORD = typer.Option("", "--docker-password", metavar="PASSWORD", hidden=True)
TMPDIR = typer.Option("", "--tmpdir", metavar="DIR", hidden=True)
WORDS = typer.Argument(..., metavar="[OUT.sif] REF", show_default=False,
                       help="the file to write (default: NAME_TAG.sif), then the image")
# --nohttps: Apptainer's deprecated spelling, still passed by scripts written for Singularity 3. Its variables
# matter: a workflow engine (cwltool, Snakemake, spython) runs `pull` without flags of the user's.
NO_HTTPS = typer.Option(False, "--no-https", "--nohttps", help="talk to the registry over plain HTTP (a local "
                        "registry)", envvar=variables(*ENV_KEYS["no_https"]), show_envvar=False)
NAME = typer.Option("", "--name", help="the file to write (as Apptainer's --name; the same as giving OUT.sif)",
                    metavar="FILE", envvar=variables(*ENV_KEYS["name"]), show_envvar=False)
DIR = typer.Option("", "--dir", help="write the file into this directory", metavar="DIR",
                   envvar=variables(*ENV_KEYS["directory"]), show_envvar=False)


def pull_command(
    context: typer.Context,
    words: list[str] = WORDS,
    force: bool = typer.Option(False, "--force", "-F", help="overwrite OUT.sif if it exists",
                               envvar=variables(*ENV_KEYS["force"]), show_envvar=False),
    arch: str = ARCH,
    arch_variant: str = typer.Option("", "--arch-variant", help="the variant of --arch (or of this host's) to pull: "
                                     "7 or v7 for arm/v7 (docker://, oci:, archives)", metavar="VARIANT",
                                     envvar=variables(*ENV_KEYS["arch_variant"]), show_envvar=False),
    docker_login: bool = DOCKER_LOGIN,
    authfile: str = AUTHFILE,
    no_https: bool = NO_HTTPS,
    name: str = NAME,
    directory: str = DIR,
    library: str = typer.Option("", "--library", help="the library to pull from (library:// images; default: "
                                "the remote in use)", metavar="URL", envvar=variables(*ENV_KEYS["library"]),
                                show_envvar=False),
    disable_cache: bool = typer.Option(False, "--disable-cache", help="use a temporary cache for this pull, removed "
                                       "after it: nothing is read from or written to yours",
                                       envvar=variables(*ENV_KEYS["disable_cache"]), show_envvar=False),
    sandbox: bool = typer.Option(False, "--sandbox", help="write a sandbox directory instead of a SIF file",
                                 envvar=variables(*ENV_KEYS["sandbox"]), show_envvar=False),
    reproducible: bool = typer.Option(False, "--reproducible", help="a SIF of the same bytes each time: dated by "
                                      "the image's creation (docker://, oci:...; SOURCE_DATE_EPOCH without it)",
                                      envvar=variables(*ENV_KEYS["reproducible"]), show_envvar=False),
    allow_unsigned: bool = typer.Option(False, "--allow-unsigned", "-U", "--allow-unauthenticated", hidden=True,
                                        envvar=variables("ALLOW_UNSIGNED", "ALLOW_UNAUTHENTICATED")),
    docker_username: str = DOCKER_USERNAME,
    docker_password: str = DOCKER_PASSWORD,
    tmpdir: str = TMPDIR,
) -> None:
    """Pull an image from a registry (docker://) or an OCI layout/archive and write it as a SIF file; download
    a SIF stored in an OCI registry (oras://), or an image file (SIF) from an http:// or https:// URL."""
    if allow_unsigned:  # Apptainer's deprecated flags, accepted: its pull refuses no unsigned image either
        _deprecated_on_command_line(context)
    pull_words(words, force=force, arch=arch, docker_login=docker_login, authfile=authfile, no_https=no_https,
               name=name, directory=directory, library=library, disable_cache=disable_cache, arch_variant=arch_variant,
               sandbox=sandbox, reproducible=reproducible, docker_username=docker_username,
               docker_password=docker_password, tmpdir=tmpdir)


def _deprecated_on_command_line(context: typer.Context) -> None:
    """The warning of -U/--allow-unsigned/--allow-unauthenticated typed (a variable set for all pulls says nothing)."""
    from typer._click.core import ParameterSource

    if context.get_parameter_source("allow_unsigned") == ParameterSource.COMMANDLINE:
        from singpy import console

        console.warning("--allow-unsigned (--allow-unauthenticated) is deprecated and changes nothing: a pull "
                        "refuses no unsigned image")
