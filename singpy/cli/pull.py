"""`singpy pull [OUT.sif] REF`: a docker://, oci:, oci-archive: or docker-archive: image as a SIF file, or an
image file by URL (http://, https://) as it is."""

from __future__ import annotations

import typer

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from singpy.oci.pull import PullOptions



def variables(*keys: str) -> list[str]:
    """Apptainer's EnvKeys as typer's envvar list, SINGPY_ first: click takes the first one set, and
    singpy's rule is SINGPY_ over APPTAINER_ over SINGULARITY_ (docs/usage.md)."""
    return [prefix + key for key in keys for prefix in ("SINGPY_", "APPTAINER_", "SINGULARITY_")]


ARCH = typer.Option("", "--arch", help="the platform to pull from a multi-architecture image (amd64, arm64, "
                    "arm64/v8, linux/arm/v7...; default: this host's)", metavar="ARCH",
                    envvar=variables("PULL_ARCH"), show_envvar=False)
# Shared by pull, build and inspect, with Apptainer's EnvKeys (and AUTHFILE, which singpy read before)
DOCKER_LOGIN = typer.Option(False, "--docker-login", help="ask for the registry's username and password",
                            envvar=variables("DOCKER_LOGIN"), show_envvar=False)
AUTHFILE = typer.Option("", "--authfile", help="registry credentials in docker's config.json format",
                        metavar="FILE", envvar=variables("AUTH_FILE", "AUTHFILE"), show_envvar=False)
WORDS = typer.Argument(..., metavar="[OUT.sif] REF", show_default=False,
                       help="the file to write (default: NAME_TAG.sif), then the image")
# --nohttps: Apptainer's deprecated spelling, still passed by scripts written for Singularity 3. Its variables
# matter: a workflow engine (cwltool, Snakemake, spython) runs `pull` without flags of the user's.
NO_HTTPS = typer.Option(False, "--no-https", "--nohttps", help="talk to the registry over plain HTTP (a local "
                        "registry)", envvar=variables("NOHTTPS", "NO_HTTPS"), show_envvar=False)
NAME = typer.Option("", "--name", help="the file to write (as Apptainer's --name; the same as giving OUT.sif)",
                    metavar="FILE", envvar=variables("PULL_NAME"), show_envvar=False)
DIR = typer.Option("", "--dir", help="write the file into this directory", metavar="DIR",
                   envvar=variables("PULLDIR", "PULLFOLDER"), show_envvar=False)


def pull_options(arch: str, docker_login: bool, authfile: str, no_https: bool) -> PullOptions:
    """The PullOptions of these flags (their variables are read by typer: envvar= above)."""
    from singpy.oci.pull import PullOptions

    return PullOptions(arch=arch, login=docker_login, authfile=authfile, https=not no_https)


def pull_command(
    words: list[str] = WORDS,
    force: bool = typer.Option(False, "--force", "-F", help="overwrite OUT.sif if it exists",
                               envvar=variables("FORCE"), show_envvar=False),
    arch: str = ARCH,
    docker_login: bool = DOCKER_LOGIN,
    authfile: str = AUTHFILE,
    no_https: bool = NO_HTTPS,
    name: str = NAME,
    directory: str = DIR,
    library: str = typer.Option("", "--library", help="the library to pull from (library:// images; default: "
                                "the remote in use)", metavar="URL", envvar=variables("LIBRARY"), show_envvar=False),
) -> None:
    """Pull an image from a registry (docker://) or an OCI layout/archive and write it as a SIF file; download
    a SIF stored in an OCI registry (oras://), or an image file (SIF) from an http:// or https:// URL."""
    import os

    from singpy import console
    from singpy.host import host
    from singpy.oci import netpull
    from singpy.oci.pull import pull

    target, reference = pull_target(words, name, directory)
    if netpull.is_url(reference):  # a finished image file on a web server (Nextflow's nf-core images)
        console.info(netpull.pull_url(reference, target, force=force))
        return
    info = host.capture()
    options = pull_options(arch, docker_login, authfile, no_https)
    if reference.startswith("library://"):  # a SIF in a Sylabs library (singpy.library.pull)
        from singpy.library.pull import LibraryOptions
        from singpy.library.pull import pull as pull_library

        library_options = LibraryOptions(arch=arch, library=library, https=not no_https)
        console.info(pull_library(reference, target, library_options, os.environ, info.home, force=force))
        return
    if reference.startswith("oras://"):  # a SIF stored as an OCI artifact: downloaded as it is
        from singpy.oci import oras

        console.info(oras.pull(reference, target, options, os.environ, info.home, force=force))
        return
    console.info(pull(reference, target, options, os.environ, info.home, force=force))


def pull_target(words: list[str], name: str, directory: str) -> tuple[str, str]:
    """The file to write ("" for the default name in the working directory) and the reference, as Apptainer
    reads them: `--name` wins over OUT.sif, and `--dir` is the directory of either (or of the default name)."""
    import os

    from singpy.errors import UsageError

    if len(words) > 2:
        raise UsageError(f"singpy pull takes [OUT.sif] REF, not {len(words)} arguments",
                         hint="Run 'singpy pull --help' for usage.")
    reference = words[-1]
    target = name or (words[0] if len(words) == 2 else "")
    if directory:
        if not target:
            from singpy.oci import netpull
            from singpy.oci.pull import default_name
            from singpy.oci.ref import parse

            if netpull.is_url(reference):
                target = netpull.default_name(reference)
            elif reference.startswith("library://"):
                from singpy.library import ref as library_ref

                target = library_ref.default_name(library_ref.parse(reference))
            elif reference.startswith("oras://"):
                from singpy.oci.oras import parse_ref

                target = default_name(parse_ref(reference))
            else:
                target = default_name(parse(reference))
        target = os.path.join(directory, target)
    return target, reference
