"""`singpy pull` without typer: the common command lines parsed by hand, the rest left to typer.

A pull of a large SIF is a download, and typer's start-up (the whole command tree registered: ~0.1 s,
`make bench`'s `singpy version` row) was most of what it cost beyond `curl` of the same blob. So
singpy.cli.main hands `pull`'s arguments here first: `parse` accepts only what it fully understands (the
flags of `pull --help`, each once or more, the last one winning as with click; OUT.sif and the reference;
Apptainer's variables of these flags, read as click reads them) and answers None for anything else
(`--help`, an unknown or misspelt flag, a missing value, a boolean variable click would refuse), which
typer then parses, with its own messages. Both paths run `pull_words`, the one body of the command,
so what they write and every error they raise are the same (tests/integration/test_pull_fastpath.py).
"""

from __future__ import annotations

from collections.abc import Mapping

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from typing import NoReturn

    from singpy.host.host import HostInfo
    from singpy.oci.pull import PullOptions

PREFIXES = ("SINGPY_", "APPTAINER_", "SINGULARITY_")  # singpy's precedence (docs/usage.md)
URL_PREFIXES = ("http://", "https://")  # singpy.oci.netpull.PREFIXES: not imported for other pulls (typing)
SIF_URI_PREFIXES = ("library://", "oras://")  # references of SIFs as stored (a library's, a registry's ORAS)

# Each flag of `singpy pull`: its destination, whether it takes a value, and Apptainer's EnvKeys (the typer
# options of singpy.cli.pull read the same keys from here).
FLAGS: dict[str, tuple[str, bool]] = {
    "--force": ("force", False), "-F": ("force", False),
    "--arch": ("arch", True),
    "--arch-variant": ("arch_variant", True),
    "--docker-login": ("docker_login", False),
    "--authfile": ("authfile", True),
    "--no-https": ("no_https", False), "--nohttps": ("no_https", False),
    "--name": ("name", True),
    "--dir": ("directory", True),
    "--library": ("library", True),
    "--disable-cache": ("disable_cache", False),
    "--sandbox": ("sandbox", False),
    "--reproducible": ("reproducible", False),
    "--docker-username": ("docker_username", True),  # Apptainer's hidden three (singpy.cli.flagvars)
    "--docker-password": ("docker_password", True),
    "--tmpdir": ("tmpdir", True),
}
BOOLEANS = tuple(sorted({dest for dest, takes_value in FLAGS.values() if not takes_value}))
TEXTS = tuple(sorted({dest for dest, takes_value in FLAGS.values() if takes_value}))
ENV_KEYS: dict[str, tuple[str, ...]] = {
    "force": ("FORCE",), "arch": ("PULL_ARCH",), "arch_variant": ("PULL_ARCH_VARIANT",),
    "docker_login": ("DOCKER_LOGIN",), "authfile": ("AUTH_FILE", "AUTHFILE"), "no_https": ("NOHTTPS", "NO_HTTPS"),
    "name": ("PULL_NAME",), "directory": ("PULLDIR", "PULLFOLDER"), "library": ("LIBRARY",),
    "disable_cache": ("DISABLE_CACHE",), "sandbox": ("SANDBOX",), "reproducible": ("REPRODUCIBLE",),
    # none read here: singpy.oci.auth and singpy.oci.store read them where they act (singpy.cli.flagvars)
    "docker_username": (), "docker_password": (), "tmpdir": (),
}
# click's boolean words (typer._click.types.BoolParamType); any other value is left to typer to refuse
_CLICK_WORDS = {"1": True, "yes": True, "true": True, "on": True, "t": True, "y": True,
             "0": False, "no": False, "false": False, "off": False, "f": False, "n": False}


def variables(*keys: str) -> list[str]:
    """Apptainer's EnvKeys as typer's envvar list, SINGPY_ first: click takes the first one set (not empty)."""
    return [prefix + key for key in keys for prefix in PREFIXES]


def parse(argv: list[str], env: Mapping[str, str]) -> tuple[list[str], dict[str, str | bool]] | None:
    """The words (OUT.sif, REF) and flag values of `pull ARGV`, or None: typer must parse this one."""
    values: dict[str, str | bool] = {}
    words: list[str] = []
    rest = list(argv)
    while rest:
        word = rest.pop(0)
        if word == "--":
            words.extend(rest)
            break
        if not word.startswith("-"):
            words.append(word)
            continue
        name, inline, value = word.partition("=") if word.startswith("--") else (word, "", "")
        known = FLAGS.get(name)
        if known is None:
            return None  # --help, -h, a flag of another command, a typo, -Fq...: typer's message
        dest, takes_value = known
        if not takes_value:
            if inline:
                return None
            values[dest] = True
            continue
        if not inline:
            if not rest or rest[0].startswith("-"):
                return None
            value = rest.pop(0)
        values[dest] = value
    if not words or "-" in words:
        return None
    if not _from_env(values, env):
        return None
    return words, values


def _from_env(values: dict[str, str | bool], env: Mapping[str, str]) -> bool:
    """Fill the flags not given from their variables; False when a boolean one holds a word click refuses."""
    for dest, keys in ENV_KEYS.items():
        if dest in values:
            continue
        raw = next((env[name] for name in variables(*keys) if env.get(name)), None)
        if raw is None:
            continue
        if dest in BOOLEANS:
            state = _CLICK_WORDS.get(raw.strip().lower())
            if state is None:
                return False
            values[dest] = state
        else:
            values[dest] = raw
    return True


def run(argv: list[str]) -> int | None:
    """`singpy pull ARGV` when `parse` understands it (the process exits when it is done; errors raise),
    else None."""
    import os

    parsed = parse(argv, os.environ)
    if parsed is None:
        return None
    words, values = parsed
    flags = {key: bool(values.get(key)) for key in BOOLEANS}
    pull_words(words, **flags, **{key: str(values.get(key, "")) for key in TEXTS})  # type: ignore[arg-type]
    _leave()


def _leave() -> NoReturn:
    """Exit 0 without the interpreter's finalization (module teardown, a last collection: ~12 ms of a pull, as
    singpy.cli.main._exit_now skips it for run/exec): the pull is done (its file renamed into place, its
    threads joined, its lock released), and the kernel closes what is left open. An error raised above
    never gets here: singpy.cli.main prints it."""
    import os
    import sys

    status = 0
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`singpy pull ... | head -1`)
            status = 1
    os._exit(status)


def pull_options(arch: str, docker_login: bool, authfile: str, no_https: bool, variant: str = "",
                 reproducible: bool = False) -> PullOptions:
    """The PullOptions of these flags."""
    from singpy.oci.pull import PullOptions

    return PullOptions(arch=arch, variant=variant, login=docker_login, authfile=authfile, https=not no_https,
                       reproducible=reproducible)


def pull_words(words: list[str], *, force: bool, arch: str, docker_login: bool, authfile: str, no_https: bool,
               name: str, directory: str, library: str, disable_cache: bool = False, arch_variant: str = "",
               sandbox: bool = False, reproducible: bool = False, docker_username: str = "", docker_password: str = "",
               tmpdir: str = "") -> None:
    """The body of `singpy pull`, whichever parser read the command line."""
    from singpy import console
    from singpy.cli.flagvars import set_flag_variables
    from singpy.host import host

    set_flag_variables(docker_username, docker_password, tmpdir)
    target, reference = pull_target(words, name, directory)
    if reference.startswith(URL_PREFIXES) and not sandbox:  # an image file on a web server (Nextflow's nf-core images)
        from singpy.oci import netpull

        console.info(netpull.pull_url(reference, target, force=force))
        return
    info = host.capture()
    options = pull_options(arch, docker_login, authfile, no_https, arch_variant, reproducible)

    def pulled(where: HostInfo) -> int:
        if sandbox:
            console.info(_pull_sandbox(reference, target, options, where, force=force, library=library))
        else:
            console.info(_pull(reference, target, options, where, force=force, library=library))
        return 0

    from singpy.image.builddate import wanted

    if disable_cache or (not sandbox and not reference.startswith(SIF_URI_PREFIXES) and wanted(reproducible)):
        # as Apptainer's: a temporary cache, removed after the pull (singpy.cli.nocache); a reproducible SIF too,
        # which the cache never shares (its date, nil UUID and file times are not those of another run's)
        from singpy.cli.nocache import in_temporary_cache

        in_temporary_cache(info, pulled)
    else:
        pulled(info)


def _pull(reference: str, target: str, options: PullOptions, info: HostInfo, *, force: bool, library: str) -> str:
    """The image `reference` to the file `target` through the cache of `info.env`; the line that says so."""
    if reference.startswith("library://"):  # a SIF in a Sylabs library (singpy.library.pull)
        from singpy.library.pull import LibraryOptions
        from singpy.library.pull import pull as pull_library

        library_options = LibraryOptions(arch=options.arch, library=library, https=options.https)
        summary = pull_library(reference, target, library_options, info.env, info.home, force=force)
        _verify_library_image(target or _default_name(reference))
        return summary
    if reference.startswith("oras://"):  # a SIF stored as an OCI artifact: downloaded as it is
        from singpy.oci import oras

        return oras.pull(reference, target, options, info.env, info.home, force=force)
    from singpy.oci.pull import pull

    return pull(reference, target, options, info.env, info.home, force=force)


def _verify_library_image(path: str) -> None:
    """As Apptainer's pull from a library: the file's signatures checked against the user's and the global
    keyrings and the keyserver of the remote in use; a failure (an unsigned image) is its two warnings, never
    an error (Apptainer no longer refuses one: --allow-unsigned is deprecated)."""
    from singpy import console
    from singpy.cli.keysource import from_keyserver
    from singpy.errors import SingpyError
    from singpy.signing import verify

    try:
        verify.verify(path, verify.pgp_material()._replace(fetch=from_keyserver("")))
    except SingpyError as error:
        console.warning(error.message)
        console.warning("Skipping container verification")


def _pull_sandbox(reference: str, target: str, options: PullOptions, info: HostInfo, *, force: bool,
                  library: str) -> str:
    """pull --sandbox (Apptainer 1.5's): a docker://, oci:... image made a directory as `build --sandbox` makes
    it; a SIF of a library, a registry (oras://) or a URL pulled into the cache first, then unpacked."""
    import os

    from singpy.errors import ImageError
    from singpy.image.builder import build as build_image

    target = target or _default_name(reference)  # NAME_TAG.sif, a directory all the same (as Apptainer's)
    if not reference.startswith((*SIF_URI_PREFIXES, *URL_PREFIXES)):
        from singpy.oci.pull import build_from

        return build_from(reference, target, options, info.env, info.home, sandbox=True, force=force)
    if os.path.lexists(target) and not force:  # before anything is downloaded
        raise ImageError(f"{os.path.abspath(target)} already exists (use --force to overwrite it)")
    if reference.startswith(URL_PREFIXES):
        from singpy.oci.netcache import cached_url_image

        sif = cached_url_image(reference, info.env, info.home)
    else:
        from singpy.recipe.bootstrap import resolve

        sif = resolve(reference, options=options, env=info.env, home=info.home, library=library)
    return build_image(target, sif, force=force, env=info.env, sandbox=True).replace(sif, reference)


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
            target = _default_name(reference)
        target = os.path.join(directory, target)
    return target, reference


def _default_name(reference: str) -> str:
    """NAME_TAG.sif (or the URL's file name) of `reference`, as a pull without OUT.sif writes it."""
    from singpy.oci import netpull
    from singpy.oci.pull import default_name

    if netpull.is_url(reference):
        return netpull.default_name(reference)
    if reference.startswith("library://"):
        from singpy.library import ref as library_ref

        return library_ref.default_name(library_ref.parse(reference))
    if reference.startswith("oras://"):
        from singpy.oci.oras import parse_ref

        return default_name(parse_ref(reference))
    from singpy.oci.ref import parse as parse_docker

    return default_name(parse_docker(reference))
