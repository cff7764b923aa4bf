"""`singpy build TARGET SOURCE`: from a definition file, a sandbox, a SIF/squashfs image or an OCI image."""

from __future__ import annotations

import typer

from singpy.cli.pull import AUTHFILE, DOCKER_LOGIN, NO_HTTPS, pull_options, variables

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from singpy.recipe.engine import BuildRequest

BUILD_ARG = typer.Option([], "--build-arg", help="KEY=VALUE: a value for {{ KEY }} in the definition file "
                         "(repeatable)", metavar="KEY=VALUE")
# Apptainer's build reads BUILD_ARCH where pull reads PULL_ARCH
BUILD_ARCH = typer.Option("", "--arch", help="the platform of a docker:// or OCI source (amd64, arm64, arm64/v8...; "
                          "default: this host's)", metavar="ARCH", envvar=variables("BUILD_ARCH"), show_envvar=False)
BIND = typer.Option([], "--bind", "-B", help="a bind for %post and %test (src[:dest[:opts]], repeatable)",
                    metavar="SPEC")


def build_command(
    target: str = typer.Argument(..., help="the image to write: a SIF file, or a directory (sandbox)"),
    source: str = typer.Argument(..., help="a definition file, a sandbox directory, a SIF/squashfs image, or "
                                 "docker://REF, oci:DIR, oci-archive:FILE, docker-archive:FILE"),
    force: bool = typer.Option(False, "--force", "-F", help="overwrite TARGET if it exists",
                               envvar=variables("FORCE"), show_envvar=False),
    sandbox: bool = typer.Option(False, "--sandbox", "-s", help="write a sandbox directory instead of a SIF "
                                 "file, whatever the source",
                                 envvar=variables("SANDBOX"), show_envvar=False),
    fakeroot: bool = typer.Option(False, "--fakeroot", "-f", help="run %post as root of a user namespace (what "
                                  "an unprivileged build always does)",
                                  envvar=variables("FAKEROOT"), show_envvar=False),
    notest: bool = typer.Option(False, "--notest", "-T", help="do not run the %test section",
                                envvar=variables("NOTEST"), show_envvar=False),
    build_arg: list[str] = BUILD_ARG,
    build_arg_file: str = typer.Option("", "--build-arg-file", help="a file of KEY=VALUE lines, one per build "
                                       "argument (--build-arg wins)", metavar="FILE"),
    warn_unused_build_args: bool = typer.Option(False, "--warn-unused-build-args", help="a --build-arg the "
                                                "definition file does not use is a warning, not an error"),
    bind: list[str] = BIND,
    arch: str = BUILD_ARCH,
    docker_login: bool = DOCKER_LOGIN,
    authfile: str = AUTHFILE,
    no_https: bool = NO_HTTPS,
) -> None:
    """Build a SIF or a sandbox from a definition file, a sandbox, a SIF/squashfs image, or an OCI image."""
    import os

    from singpy import console
    from singpy.image.detect import is_definition_file
    from singpy.oci.ref import is_image_uri

    options = pull_options(arch, docker_login, authfile, no_https or _nohttps_env())
    if not is_image_uri(source) and not os.path.lexists(source):  # not "image X does not exist": it may be a recipe
        from singpy.errors import ImageError
        from singpy.host.hostfiles import shown

        raise ImageError(f"{shown(source)} does not exist (the definition file or image to build from)")
    if is_image_uri(source):
        from singpy.host import host
        from singpy.oci.pull import build_from

        console.info(build_from(source, target, options, os.environ, host.capture().home,
                                sandbox=sandbox, force=force))
        return
    if is_definition_file(source):
        from singpy.host import host
        from singpy.recipe.engine import build

        info = host.capture()
        request = _request(target, source, force=force, sandbox=sandbox, fakeroot=fakeroot, notest=notest,
                           build_arg=build_arg, build_arg_file=build_arg_file, bind=bind, cwd=info.cwd,
                           warn_unused=warn_unused_build_args)
        console.info(build(request, options=options, env=os.environ, home=info.home, cwd=info.cwd))
        return
    from singpy.image.builder import build as build_image

    console.info(build_image(target, source, force=force, env=os.environ, sandbox=sandbox))


def _nohttps_env() -> bool:
    import os

    from singpy.oci.pull import nohttps

    return nohttps(os.environ)


def _request(target: str, source: str, *, force: bool, sandbox: bool, fakeroot: bool, notest: bool,
             build_arg: list[str], build_arg_file: str, bind: list[str], cwd: str, warn_unused: bool) -> BuildRequest:
    import os

    from singpy.recipe.engine import BuildRequest

    # `OUT/` names the directory OUT, as for Apptainer: the slash must not make OUT's parent the OUT/ itself.
    target = os.path.join(cwd, target).rstrip("/") or "/"
    return BuildRequest(target=target, recipe=os.path.join(cwd, source), sandbox=sandbox,
                        force=force, notest=notest, fakeroot=fakeroot, warn_unused=warn_unused,
                        build_args=(*_arg_file(build_arg_file), *(_key_value(arg) for arg in build_arg)),
                        binds=tuple(bind))


def _key_value(text: str) -> tuple[str, str]:
    from singpy.errors import UsageError

    key, sep, value = text.partition("=")
    if not sep or not key:
        raise UsageError(f"--build-arg {text!r} is not KEY=VALUE")
    return key, value


def _arg_file(path: str) -> list[tuple[str, str]]:
    """KEY=VALUE lines of --build-arg-file; other lines are skipped with a warning (as Apptainer)."""
    if not path:
        return []
    from singpy import console
    from singpy.errors import UsageError
    from singpy.host.hostfiles import read_text

    text = read_text(path, what="the build arg file", error=UsageError)
    pairs = []
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep or not key:
            console.warning(f"Skipping {line!r} in build arg file: not a key=value pair")
            continue
        pairs.append((key, value))
    return pairs
