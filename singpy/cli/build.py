"""`singpy build TARGET SOURCE`: from a definition file, a sandbox, a SIF/squashfs image or an OCI image."""

from __future__ import annotations

import typer

from singpy import console
from singpy.cli.fastpull import SIF_URI_PREFIXES
from singpy.cli.flagvars import set_flag_variables
from singpy.cli.pull import (
    AUTHFILE,
    DOCKER_LOGIN,
    DOCKER_PASSWORD,
    DOCKER_USERNAME,
    NO_HTTPS,
    TMPDIR,
    pull_options,
    variables,
)

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from singpy.image.cryptkey import KeyInfo
    from singpy.oci.pull import PullOptions
    from singpy.recipe.engine import BuildRequest

BUILD_ARG = typer.Option([], "--build-arg", help="KEY=VALUE: a value for {{ KEY }} in the definition file "
                         "(repeatable)", metavar="KEY=VALUE")
# Apptainer's build reads BUILD_ARCH where pull reads PULL_ARCH
BUILD_ARCH = typer.Option("", "--arch", help="the platform of a docker:// or OCI source (amd64, arm64, arm64/v8...; "
                          "default: this host's)", metavar="ARCH", envvar=variables("BUILD_ARCH"), show_envvar=False)
BIND = typer.Option([], "--bind", "-B", help="a bind for %post and %test (src[:dest[:opts]], repeatable)",
                    metavar="SPEC")
MOUNT = typer.Option([], "--mount", help="a mount for %post and %test in docker's syntax: type=bind,src=PATH,"
                     "dst=PATH[,ro] (repeatable)", metavar="SPEC")  # $APPTAINER_MOUNT reaches %post as it is
SECTION = typer.Option([], "--section", help="only run these sections of the definition file (comma list): setup, "
                       "files, post, environment, runscript, startscript, test, help, labels, all, none",
                       metavar="SECTION", envvar=variables("SECTION"), show_envvar=False)

# Apptainer's hidden switches of its fakeroot modes (its tests force one with them; singpy.layers.fakeroot), and
# two of what singpy never runs (the fakeroot command; proot, around mksquashfs): taken, so such command lines work
IGNORE_SUBUID = typer.Option(False, "--ignore-subuid", envvar=variables("IGNORE_SUBUID"), show_envvar=False,
                             hidden=True)
IGNORE_USERNS = typer.Option(False, "--ignore-userns", envvar=variables("IGNORE_USERNS"), show_envvar=False,
                             hidden=True)
IGNORE_FAKEROOT_COMMAND = typer.Option(False, "--ignore-fakeroot-command", hidden=True, show_envvar=False,
                                       envvar=variables("IGNORE_FAKEROOT_COMMAND"))
IGNORE_PROOT = typer.Option(False, "--ignore-proot", envvar=variables("IGNORE_PROOT"), show_envvar=False,
                            hidden=True)


def build_command(
    target: str = typer.Argument(..., help="the image to write: a SIF file, or a directory (sandbox)"),
    source: str = typer.Argument(..., help="a definition file, a sandbox directory, a SIF/squashfs image, or "
                                 "docker://REF, oci:DIR, oci-archive:FILE, docker-archive:FILE, library://REF, "
                                 "oras://REF"),
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
    mount: list[str] = MOUNT,
    section: list[str] = SECTION,
    update: bool = typer.Option(False, "--update", "-u", help="run the definition file over the existing sandbox "
                                "TARGET (no bootstrap; needs --sandbox)", envvar=variables("UPDATE"),
                                show_envvar=False),
    fix_perms: bool = typer.Option(False, "--fix-perms", help="give the owner rwX on every file and directory of "
                                   "the image (so that a sandbox can be removed)", envvar=variables("FIXPERMS"),
                                   show_envvar=False),
    nv: bool = typer.Option(False, "--nv", help="the host's NVIDIA libraries and devices in %post and %test"),
    nvccli: bool = typer.Option(False, "--nvccli", help="--nv with the library list from nvidia-container-cli "
                                "(which must be there) in %post and %test", envvar=variables("NVCCLI"),
                                show_envvar=False),
    rocm: bool = typer.Option(False, "--rocm", help="the host's ROCm libraries and devices in %post and %test"),
    compat32: bool = typer.Option(False, "--compat32", help="with --nv or --rocm, the host's 32-bit driver libraries "
                                  "too (in /.singularity.d/libs32)"),
    writable_tmpfs: bool = typer.Option(False, "--writable-tmpfs", help="%test may write, changes kept in memory",
                                        envvar=variables("WRITABLE_TMPFS"), show_envvar=False),
    userns: bool = typer.Option(False, "--userns", help="build without setuid (what singpy always does)",
                                envvar=variables("USERNS"), show_envvar=False),
    disable_cache: bool = typer.Option(False, "--disable-cache", help="neither use nor fill the cache: base "
                                       "images are pulled into the build's work directory",
                                       envvar=variables("DISABLE_CACHE"), show_envvar=False),
    reproducible: bool = typer.Option(False, "--reproducible", help="a SIF of the same bytes each time, dated by "
                                      "the creation of the OCI image (the source, or the last stage's base); "
                                      "SOURCE_DATE_EPOCH without it", envvar=variables("REPRODUCIBLE"),
                                      show_envvar=False),
    no_cleanup: bool = typer.Option(False, "--no-cleanup", help="keep the work directory of a definition file's "
                                    "build (its stages' trees), even when it fails: for debugging",
                                    envvar=variables("NO_CLEANUP"), show_envvar=False),
    library: str = typer.Option("", "--library", help="the library of library:// sources and `Bootstrap: library` "
                                "stages (over their Library: header; default: the remote in use)", metavar="URL",
                                envvar=variables("LIBRARY"), show_envvar=False),
    mksquashfs_args: str = typer.Option("", "--mksquashfs-args", help="more arguments for mksquashfs as it makes "
                                        "the SIF, split at spaces (-comp zstd -b 1M: singpy's gzip then left out)",
                                        metavar="ARGS", envvar=variables("MKSQUASHFS_ARGS"), show_envvar=False),
    arch: str = BUILD_ARCH,
    arch_variant: str = typer.Option("", "--arch-variant", help="the variant of --arch (or of this host's) to build "
                                     "from: 7 or v7 for arm/v7", metavar="VARIANT",
                                     envvar=variables("BUILD_ARCH_VARIANT"), show_envvar=False),
    docker_login: bool = DOCKER_LOGIN,
    authfile: str = AUTHFILE,
    no_https: bool = NO_HTTPS,
    encrypt: bool = typer.Option(False, "--encrypt", "-e", help="build an image with an encrypted file system "
                                 "(gocryptfs; the key from the ENCRYPTION_ variables)"),
    passphrase: bool = typer.Option(False, "--passphrase", help="prompt for an encryption passphrase "
                                    "(implies --encrypt)"),
    pem_path: str = typer.Option("", "--pem-path", help="an RSA public key (PEM) to encrypt the image for "
                                 "(implies --encrypt)", metavar="PUBLIC.pem"),
    docker_username: str = DOCKER_USERNAME,
    docker_password: str = DOCKER_PASSWORD,
    tmpdir: str = TMPDIR,
    ignore_subuid: bool = IGNORE_SUBUID,
    ignore_userns: bool = IGNORE_USERNS,
    ignore_fakeroot_command: bool = IGNORE_FAKEROOT_COMMAND,
    ignore_proot: bool = IGNORE_PROOT,
) -> None:
    """Build a SIF or a sandbox from a definition file, a sandbox, a SIF/squashfs image, or an OCI image."""
    set_flag_variables(docker_username, docker_password, tmpdir)
    if not _ENCRYPTING:
        arguments = dict(locals())  # this call's arguments, for the plain build of an encrypted one
        key = _encryption_key(encrypt or passphrase or bool(pem_path), passphrase, pem_path, sandbox)
        if key is not None:
            _build_encrypted(key, arguments)
            return
    import os

    from singpy.image.detect import is_definition_file
    from singpy.oci.ref import is_image_uri

    options = pull_options(arch, docker_login, authfile, no_https or _nohttps_env(), arch_variant, reproducible)
    squash_args = tuple(mksquashfs_args.split())  # Apptainer's strings.Fields: no quoting
    if userns:  # Apptainer's "without setuid": singpy has no setuid part, it always builds this way
        console.verbose("--userns: singpy never uses setuid; the build runs as it would without the flag")
    if ignore_fakeroot_command or ignore_proot:  # nothing to leave out
        console.verbose("--ignore-fakeroot-command, --ignore-proot: singpy runs neither the fakeroot command nor proot")
    wanted = _sections(section)
    if no_cleanup and not is_definition_file(source):  # a build from an image converts it: no stage trees
        console.verbose("--no-cleanup: a build from an image keeps no work directory")
    if reproducible:
        _check_reproducible(source, through_tree=fix_perms or bool(squash_args))
    if update and not sandbox:
        from singpy.errors import UsageError

        raise UsageError("only sandbox update is supported: --sandbox flag is missing")
    if source.startswith(SIF_URI_PREFIXES):  # a SIF in a library or a registry: pulled, then built from
        _from_sif_uri(source, target, options, library, sandbox=sandbox, force=force, fix_perms=fix_perms,
                      disable_cache=disable_cache, squash_args=squash_args)
        return
    if not is_image_uri(source) and not os.path.lexists(source):  # not "image X does not exist": it may be a recipe
        from singpy.errors import ImageError
        from singpy.host.hostfiles import shown

        raise ImageError(f"{shown(source)} does not exist (the definition file or image to build from)")
    if is_image_uri(source):
        _from_uri(source, target, options, sandbox=sandbox, force=force, fix_perms=fix_perms,
                  disable_cache=disable_cache, squash_args=squash_args)
        return
    if is_definition_file(source):
        from singpy.host import host
        from singpy.recipe.engine import build

        info = host.capture()
        request = _request(target, source, force=force, sandbox=sandbox, fakeroot=fakeroot, notest=notest,
                           build_arg=build_arg, build_arg_file=build_arg_file, bind=bind, cwd=info.cwd,
                           warn_unused=warn_unused_build_args)
        request = request.replace(mounts=tuple(mount), sections=wanted, update=update, fix_perms=fix_perms,
                                  nv=nv, nvccli=nvccli, rocm=rocm, compat32=compat32, writable_tmpfs=writable_tmpfs,
                                  disable_cache=disable_cache, squash_args=squash_args, library=library,
                                  no_cleanup=no_cleanup, reproducible=reproducible, ignore_subuid=ignore_subuid,
                                  ignore_userns=ignore_userns)
        _check_specs(request, info.cwd)
        console.info(build(request, options=options, env=os.environ, home=info.home, cwd=info.cwd))
        return
    if update:
        from singpy.errors import UsageError

        raise UsageError("--update runs a definition file over a sandbox: SOURCE must be a definition file")
    from singpy.image.builder import build as build_image

    if fix_perms and not sandbox:
        _sif_via_tree(target, force, lambda tree, env: build_image(tree, source, force=False, env=env, sandbox=True),
                      squash_args=squash_args)
        return
    console.info(build_image(target, source, force=force, env=os.environ, sandbox=sandbox, squash_args=squash_args))
    if fix_perms:
        _fix_perms(os.path.abspath(target))


def _check_reproducible(source: str, *, through_tree: bool) -> None:
    """--reproducible: a definition file, or an OCI image pulled to a SIF (singpy.image.builddate); not a SIF or
    a sandbox made again, nor an image squashed from a tree (--fix-perms, --mksquashfs-args)."""
    from singpy.image.detect import is_definition_file
    from singpy.oci.ref import is_image_uri

    oci = is_image_uri(source) and not source.startswith(SIF_URI_PREFIXES)
    if not (is_definition_file(source) or oci and not through_tree):
        from singpy.errors import UsageError

        raise UsageError("--reproducible builds from a definition file or an OCI image (docker://, oci:...), the "
                         "latter without --fix-perms or --mksquashfs-args")


_ENCRYPTING = False  # set while the plain image of an encrypted build is made (its own call of build_command)


def _encryption_key(encrypt: bool, prompt: bool, pem_path: str, sandbox: bool) -> KeyInfo | None:
    """The key of --encrypt (--passphrase and --pem-path imply it), as Apptainer's getEncryptionMaterial."""
    import os

    from singpy.image import cryptkey

    if not encrypt:
        if any(f"{prefix}ENCRYPTION_{name}" in os.environ for prefix in ("APPTAINER_", "SINGULARITY_", "SINGPY_")
               for name in ("PASSPHRASE", "PEM_PATH", "PEM_DATA")):
            console.warning("Encryption related env vars found, but --encrypt was not specified. NOT encrypting "
                            "container.")
        return None
    from singpy.errors import UsageError

    if sandbox:
        raise UsageError("an encrypted image must be a SIF file: --encrypt can't be used with --sandbox")
    key = cryptkey.material(os.environ, prompt=prompt, pem_path=pem_path, public=True)
    if key is None:
        raise UsageError("--encrypt needs a key: --passphrase, --pem-path, or APPTAINER_ENCRYPTION_PASSPHRASE / "
                         "APPTAINER_ENCRYPTION_PEM_PATH")
    return key


def _build_encrypted(key: KeyInfo, arguments: dict[str, object]) -> None:
    """The plain SIF built by this same command into a private directory, then encrypted into TARGET."""
    import os

    from singpy.image.cryptbuild import build_encrypted

    def build_plain(path: str) -> None:
        global _ENCRYPTING
        _ENCRYPTING, level = True, console.level()
        console.set_level(min(level, console.QUIET))  # its "Build complete" would name the private directory
        try:
            build_command(**{**arguments, "target": path, "force": True})  # type: ignore[arg-type]
        finally:
            _ENCRYPTING = False
            console.set_level(level)

    target = str(arguments["target"])
    build_encrypted(target, key, force=bool(arguments["force"]), env=os.environ, build_plain=build_plain)
    console.info(f"Build complete: {target}")


def _sif_via_tree(target: str, force: bool, make_tree: Callable[[str, dict[str, str]], object], *,
                  disable_cache: bool = False, fix: bool = True, squash_args: Sequence[str] = ()) -> None:
    """A SIF made as a sandbox in a private directory next to TARGET, fixed (--fix-perms, as Apptainer fixes the
    root filesystem before its assembler) unless not `fix`, squashed into TARGET (with --mksquashfs-args), the
    directory removed whatever happens. `make_tree(path, env)` writes the sandbox."""
    import os

    from singpy.errors import ImageError
    from singpy.image import cache
    from singpy.image.builder import build as build_image
    from singpy.image.builder import scratch_dir

    target = os.path.abspath(target)
    if os.path.lexists(target) and not force:  # before anything is pulled or unpacked
        raise ImageError(f"{target} already exists (use --force to overwrite it)")
    work = scratch_dir(target, ".singpy-build-")
    env = {**os.environ, "SINGPY_CACHEDIR": f"{work}/cache"} if disable_cache else dict(os.environ)
    try:
        make_tree(f"{work}/rootfs", env)
        if fix:
            _fix_perms(f"{work}/rootfs")
        console.info(build_image(target, f"{work}/rootfs", force=force, env=env, squash_args=squash_args))
    finally:
        cache.remove_tree(work)


def _fix_perms(tree: str) -> None:
    """--fix-perms on a sandbox built from an image (a definition file's build fixes each stage's base)."""
    from singpy.recipe import fixperms

    if fixperms.fix(tree):
        console.warning(f"--fix-perms: some entries of {tree} could not be changed")


def _sections(values: list[str]) -> tuple[str, ...]:
    """--section values (comma lists allowed) checked as Apptainer's checkSections: all or none stand alone."""
    from singpy.errors import UsageError
    from singpy.recipe.sections import SELECTABLE

    names = tuple(name.strip() for value in values for name in value.split(",") if name.strip()) or ("all",)
    unknown = [name for name in names if name not in (*SELECTABLE, "all", "none")]
    if unknown:
        raise UsageError(f"--section {unknown[0]!r}: not a section singpy can select (one of "
                         f"{', '.join((*SELECTABLE, 'all', 'none'))})")
    for alone in ("all", "none"):
        if alone in names and len(names) > 1:
            raise UsageError(f"section specification error: cannot have {alone} and any other option")
    return names


def _check_specs(request: BuildRequest, cwd: str) -> None:
    """A bad --bind or --mount is one error before anything is fetched, not a failed %post later."""
    from singpy.mounts.parse import parse_bind_list, parse_mount_list

    parse_bind_list(request.binds, cwd)
    parse_mount_list(request.mounts, cwd)


def _from_uri(source: str, target: str, options: PullOptions, *, sandbox: bool, force: bool, fix_perms: bool,
              disable_cache: bool, squash_args: Sequence[str]) -> None:
    """docker://, oci:... built into TARGET; --disable-cache pulls into a private directory next to TARGET,
    removed after. With --fix-perms or --mksquashfs-args a SIF is squashed from a sandbox of the image (a pull
    squashes its own way: singpy.oci.streamsquash)."""
    import os

    from singpy.host import host
    from singpy.oci.pull import build_from

    home = host.capture().home
    if (fix_perms or squash_args) and not sandbox:
        _sif_via_tree(target, force, lambda tree, env: build_from(source, tree, options, env, home, sandbox=True,
                                                                  force=False), disable_cache=disable_cache,
                      fix=fix_perms, squash_args=squash_args)
        return
    from singpy.image.builddate import wanted

    with _PullEnv(target, disable_cache or wanted(options.reproducible)) as env:  # a reproducible SIF: never cached
        console.info(build_from(source, target, options, env, home, sandbox=sandbox, force=force))
    if fix_perms:
        _fix_perms(os.path.abspath(target))


class _PullEnv:
    """The environment of a build's pull: this one, or with --disable-cache a private cache directory next to
    TARGET (SINGPY_CACHEDIR), removed as the block ends, whatever happens."""

    def __init__(self, target: str, disable_cache: bool) -> None:
        import os

        from singpy.image.builder import scratch_dir

        self.env = dict(os.environ)
        self.scratch = scratch_dir(os.path.abspath(target), ".singpy-nocache-") if disable_cache else ""
        if self.scratch:
            self.env["SINGPY_CACHEDIR"] = self.scratch

    def __enter__(self) -> dict[str, str]:
        return self.env

    def __exit__(self, *exc: object) -> None:
        if self.scratch:
            from singpy.image import cache

            cache.remove_tree(self.scratch)


def _from_sif_uri(source: str, target: str, options: PullOptions, library: str, *, sandbox: bool, force: bool,
                  fix_perms: bool, disable_cache: bool, squash_args: Sequence[str]) -> None:
    """library:// or oras:// built into TARGET: the SIF pulled into the cache (as a definition file's
    `Bootstrap: library`/`oras` base; --disable-cache: into a private directory next to TARGET, removed after),
    then built from as a local SIF is."""
    import os

    from singpy.errors import ImageError
    from singpy.host import host
    from singpy.image.builder import build as build_image
    from singpy.recipe.bootstrap import resolve

    if os.path.lexists(target) and not force:  # before anything is pulled
        raise ImageError(f"{os.path.abspath(target)} already exists (use --force to overwrite it)")
    with _PullEnv(target, disable_cache) as env:
        sif = resolve(source, options=options, env=env, home=host.capture().home, library=library)
        if fix_perms and not sandbox:
            _sif_via_tree(target, force, lambda tree, tree_env: build_image(tree, sif, force=False, env=tree_env,
                                                                           sandbox=True), squash_args=squash_args)
            return
        built = build_image(target, sif, force=force, env=env, sandbox=sandbox, squash_args=squash_args)
        console.info(built.replace(sif, source))  # the source as the user named it, not its place in the cache
    if fix_perms:
        _fix_perms(os.path.abspath(target))


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
