"""`singpy build OUT RECIPE.def`: the stages in Apptainer's order, then the output.

For each stage ([1] Apptainer internal/pkg/build/build.go, Full): the base
root filesystem (bootstrap), `%files from` earlier stages, %setup on the
host, %files from the host, %post in the container, the metadata of
/.singularity.d, %test in the container. The last stage becomes OUT: a
sandbox directory renamed into place, or a SIF squashed from it with the
definition file as its Def.FILE object. Everything happens in one work
directory (singpy.recipe.workdir), removed at the end whatever happens.
Every stage's base is fetched first; for a SIF output, a squashfs base is
not unpacked there but lies under an overlay (singpy.recipe.layered).

As root, %post runs as real root. Anyone else builds with --fakeroot: root
in a user namespace, with the user's subordinate ids when /etc/subuid and
/etc/subgid give a range (singpy.layers.fakeroot). Files %post gives to those ids
are then out of the user's own reach on the host, so what the build does
with the tree afterwards (copies between stages, squashing, removing it)
runs as root of a namespace with the same mapping (singpy.recipe.mapped).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from singpy import console
from singpy.errors import ImageError
from singpy.host.hostfiles import path_problem, shown
from singpy.plan import IdMap
from singpy.recipe import apps, bootstrap, layered, osbootstrap, sections, workdir
from singpy.recipe.deffile import Definition, DefinitionError, Section, Stage, files_entries
from singpy.record import Record

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from singpy.oci.pull import PullOptions

_MAX_RECIPE = 4 << 20  # a definition file is text; refuse to read a huge file into memory


class BuildRequest(Record):
    """What `singpy build OUT RECIPE.def` was asked."""

    target: str  # OUT, absolute
    recipe: str  # the definition file, absolute
    sandbox: bool = False  # --sandbox: OUT is a directory
    force: bool = False  # --force: replace OUT; %labels override labels already in the image
    notest: bool = False  # --notest: %test does not run
    fakeroot: bool = False  # --fakeroot (what an unprivileged build does anyway)
    build_args: tuple[tuple[str, str], ...] = ()  # --build-arg and --build-arg-file, in order (last wins)
    warn_unused: bool = False  # --warn-unused-build-args: a build arg no stage uses is a warning, not an error
    binds: tuple[str, ...] = ()  # --bind values, for %post and %test
    mounts: tuple[str, ...] = ()  # --mount values, for %post and %test
    nv: bool = False  # --nv in %post and %test
    nvccli: bool = False  # --nvccli in %post and %test (--nv, its library list from nvidia-container-cli)
    squash_args: tuple[str, ...] = ()  # --mksquashfs-args, after mksquashfs's own flags
    library: str = ""  # --library: the library of `Bootstrap: library` stages, over their `Library:` header
    rocm: bool = False  # --rocm in %post and %test
    compat32: bool = False  # --compat32 (with --nv/--rocm) in %post and %test
    writable_tmpfs: bool = False  # --writable-tmpfs: %test may write (in memory)
    sections: tuple[str, ...] = ("all",)  # --section: the sections that run ("all", "none" or names)
    update: bool = False  # --update: the last stage starts from the existing sandbox OUT, not its bootstrap
    fix_perms: bool = False  # --fix-perms: owner rwX on everything the bootstrap brought
    disable_cache: bool = False  # --disable-cache: base images pulled into the work directory, not the cache
    no_cleanup: bool = False  # --no-cleanup: the work directory (the stages' trees) kept, whatever the outcome
    reproducible: bool = False  # --reproducible: dated by the last stage's OCI base (singpy.image.builddate)
    ignore_subuid: bool = False  # --ignore-subuid (hidden): a user's build has the single mapping
    ignore_userns: bool = False  # --ignore-userns (hidden): a user's build is refused (singpy.layers.fakeroot)


def read_definition(request: BuildRequest) -> tuple[str, Definition]:
    """The definition file's text and its stages, checked before anything is fetched or written."""
    from singpy.recipe.deffile import parse

    text = _read_recipe(request.recipe).replace("\r\n", "\n")  # a file saved on Windows: no \r in the scripts
    definition = parse(text, request.recipe, dict(request.build_args))
    unused = sorted({name for name, _ in request.build_args} - set(definition.consumed))
    if unused and request.warn_unused:
        console.warning(f"Unused build args: {' '.join(unused)}")
    elif unused:  # Apptainer's rule and words: most likely a typo in a name
        raise DefinitionError(f"unused build args: {' '.join(unused)}. Use option --warn-unused-build-args to show a "
                         "warning instead of a fatal message")
    for section in (section for stage in definition.stages for section in stage.sections if section.name == "pre"):
        if section.body.strip():  # the %pre line itself, not the stage's first line
            console.warning(f"{request.recipe}:{section.line}: %pre is not supported (Apptainer deprecated it); "
                            "ignored: use %setup")
    names: list[str] = []
    for number, stage in enumerate(definition.stages):
        if not (request.update and not request.force and number == len(definition.stages) - 1):
            bootstrap.check(stage, request.recipe)  # --update skips the header of the stage it updates
        apps.app_names(stage, request.recipe)
        for section in stage.sections:
            source = _from_stage(section)
            if source and source not in names:
                raise DefinitionError(f"{request.recipe}:{section.line}: %files from {source}: no earlier stage "
                                      f"has Stage: {source}")
        names.append(stage.get("stage").strip())
    return text, definition


def _read_recipe(path: str) -> str:
    from singpy.host.hostfiles import read_text

    return read_text(path, what="the definition file", error=ImageError, limit=_MAX_RECIPE)


def _from_stage(section: Section) -> str:
    """The STAGE of a `%files from STAGE` section line, else ''."""
    words = section.args.split("#", 1)[0].split()
    return words[1] if section.name == "files" and len(words) == 2 and words[0] == "from" else ""


def build(request: BuildRequest, *, options: PullOptions, env: Mapping[str, str], home: str, cwd: str) -> str:
    """Build OUT from the definition file; returns the closing line. Nothing is left behind on failure (but the
    work directory with --no-cleanup)."""
    from singpy.image import tools

    text, definition = read_definition(request)
    _check_target(request)
    idmap = _id_map(request)
    osbootstrap.check_ids(definition.stages, idmap)
    runner = sections.Runner(idmap=idmap, binds=request.binds, env=env, flags=_launch_flags(request),
                             test_flags=("--writable-tmpfs",) if request.writable_tmpfs else ())
    console.info("Starting build...")
    work = workdir.make(request.target, env)
    layers = None
    try:
        with tools.Interruptible():
            try:
                pull_env = {**env, "SINGPY_CACHEDIR": f"{work}/cache"} if request.disable_cache else env
                bases = _bases(definition, request, options=options, env=pull_env, home=home, cwd=cwd)
                _date(definition, request, bases[-1], cwd)
                layers = _enter_layers(request, bases, idmap, pull_env, home)
                if layers is not None:
                    idmap = None  # already root of the build's namespace: host programs need no mapping
                    runner.in_namespace = True
                rootfs = _build_stages(definition, text, request, work, runner, bases, layers, idmap, env=env,
                                       cwd=cwd)
                _write_output(rootfs, text, request, work, idmap, env)
            except tools.Interrupted as interrupted:
                raise tools.Interrupted(f"build of {request.target} {interrupted.message}: nothing was "
                                        "written") from None
    finally:
        if layers is not None:
            layers.release()
        if request.no_cleanup:  # Apptainer's words: its bundles are kept whatever the outcome too
            console.info(f"Build performed with no clean up option, build bundle(s) located at: {work}")
        else:
            workdir.remove(work, idmap)
    return f"Build complete: {request.target}"


def _launch_flags(request: BuildRequest) -> tuple[str, ...]:
    """The launcher's flags for %post and %test that the build's own flags ask for (as Apptainer's)."""
    flags = [flag for flag, wanted in (("--nv", request.nv), ("--nvccli", request.nvccli), ("--rocm", request.rocm),
                                       ("--compat32", request.compat32),
                                       ("--ignore-subuid", request.ignore_subuid)) if wanted]
    for mount in request.mounts:
        flags += ["--mount", mount]
    return tuple(flags)


def _bases(definition: Definition, request: BuildRequest, *, options: PullOptions, env: Mapping[str, str],
           home: str, cwd: str) -> list[str]:
    """Every stage's base, fetched first; with --update (and no --force), the last one is the sandbox OUT."""
    stages = list(definition.stages)
    updating = request.update and not request.force
    bases = [bootstrap.resolve(bootstrap.source(stage, cwd, library=request.library), options=options, env=env,
                               home=home, library=request.library) for stage in (stages[:-1] if updating else stages)]
    for stage, base in zip(stages, bases, strict=False):  # `Fingerprints:`: the base SIF's signers, before any %post
        if stage.get("fingerprints").strip() and base and not os.path.isdir(base):
            from singpy.signing import ecl

            ecl.require_signers(base, stage.get("fingerprints"))
    if updating:
        console.info(f"Building into existing container: {request.target}")
        bases.append(request.target)
    return bases


def _date(definition: Definition, request: BuildRequest, base: str, cwd: str) -> None:
    """SOURCE_DATE_EPOCH for the build's labels, its SIF and mksquashfs (singpy.image.builddate): with
    --reproducible, the creation date of the last stage's OCI base, as its cached conversion recorded it."""
    from singpy.image import builddate

    created, what = None, "the last stage's base (the sandbox --update builds into)"
    if request.reproducible and base != request.target:  # (--update's last stage may have no header)
        source = bootstrap.source(definition.stages[-1], cwd, library=request.library)
        what = f"the last stage's base ({source or 'scratch'})"
        if base and source.startswith(bootstrap.OCI_PREFIXES):
            from singpy.oci.pull import image_created

            created = image_created(base)
            what = f"the cached SIF of {source} (an older singpy's conversion: `singpy cache clean` makes it again)"
    builddate.chosen(request.reproducible, created, what)


def _check_target(request: BuildRequest) -> None:
    problem = path_problem(request.target)
    if problem:
        raise ImageError(f"can't write {shown(request.target)}: {problem}")
    if request.update:
        if os.path.lexists(request.target) and not os.path.isdir(request.target):
            raise ImageError(f"only sandbox update is supported: {request.target} is not a directory")
        if not os.path.lexists(request.target) and not request.force:
            raise ImageError(f"{request.target} does not exist: --update builds into an existing sandbox")
        return
    if os.path.lexists(request.target) and not request.force:
        raise ImageError(f"{request.target} already exists (use --force to overwrite it)")
    if not request.sandbox and os.path.isdir(request.target) and not os.path.islink(request.target):
        raise ImageError(f"{request.target} is a directory: a SIF needs a file name (or use --sandbox)")
    if not os.path.isdir(os.path.dirname(request.target)):
        raise ImageError(f"can't write {request.target}: {os.path.dirname(request.target)} is not a directory")


def _id_map(request: BuildRequest) -> IdMap | None:
    """None as root (real root in %post); the --fakeroot mapping for anyone else."""
    uid = os.getuid()
    if uid == 0:
        if request.fakeroot:
            console.verbose("--fakeroot: ignored as root, %post runs as real root")
        return None
    from singpy.layers import fakeroot

    idmap = fakeroot.own_id_map(ignore_subuid=request.ignore_subuid, ignore_userns=request.ignore_userns,
                                building=True)
    console.verbose(idmap.note)
    if not idmap.helper:
        console.info(f"{idmap.note.split(': ', 2)[1]}: %post runs as root with a single id mapping "
                     "(no other user or group exists inside)")
    return idmap


def _enter_layers(request: BuildRequest, bases: list[str], idmap: IdMap | None, env: Mapping[str, str],
                  home: str) -> layered.Layers | None:
    """Move into the build's own mount namespace when some stage's base can be mounted (singpy.recipe.layered).

    Not for --sandbox: its output is the whole tree, which must be written anyway.
    """
    if request.sandbox or not any(base and not os.path.isdir(base) for base in bases):
        return None
    layers = layered.plan(idmap, env, home)
    if layers is not None:
        layered.enter(idmap)
    return layers


def _build_stages(definition: Definition, text: str, request: BuildRequest, work: str, runner: sections.Runner,
                  bases: list[str], layers: layered.Layers | None, idmap: IdMap | None, *, env: Mapping[str, str],
                  cwd: str) -> str:
    """Every stage, in order; returns the last one's root filesystem.

    `idmap`: how host programs (cp, unsquashfs) run: None as root or inside
    the build's namespace already, where `runner.idmap` still says --fakeroot.
    """
    from singpy.image.builder import build_labels
    from singpy.image.detect import host_arch
    from singpy.recipe import files, metadata

    roots: dict[str, str] = {}
    rootfs = ""
    for number, stage in enumerate(definition.stages):
        name = stage.get("stage").strip()
        if name:
            console.info(f"Building stage {name}")
        rootfs = f"{work}/stage{number}"
        base = bases[number]
        if base == request.target:  # --update: the sandbox as it is, copied with its owners
            os.mkdir(rootfs, 0o755)
            _host_command(idmap)(["cp", "-a", "--", f"{base}/.", rootfs])
        elif not (layers is not None and base and layers.mount_stage(base, rootfs, work, number)):
            bootstrap.populate(base, rootfs, env=env, idmap=idmap, stage=stage, work=work, runner=runner)
        if request.fix_perms and base != request.target:
            _host_command(idmap)([sys.executable, "-P", "-m", "singpy.recipe.fixperms", rootfs])
        bootstrap.lay_out_base(rootfs)
        stage = sections.selected(stage, request.sections)
        app_names = apps.app_names(stage, request.recipe)
        if app_names:
            apps.install(rootfs, stage, app_names, cwd=cwd)
        for section in stage.sections:
            source = _from_stage(section)
            if source:
                files.copy_from_stage(files_entries(section), roots[source], rootfs, run=_host_command(idmap))
        sections.run_setup(stage, rootfs, work, idmap)
        host_files = _host_files(stage)
        if host_files:
            files.copy_from_host(host_files, rootfs, cwd=cwd)
        sections.run_post(stage, rootfs, runner, apps=apps.post_script(stage, app_names))
        metadata.write_metadata(rootfs, stage, definition=text, build_labels=build_labels(host_arch()),
                                force=request.force)
        if stage.script("test").strip() and not request.notest:
            sections.run_test(rootfs, runner)
        if name:  # `%files from NAME`: the first stage of that name (Apptainer's findStageIndex)
            roots.setdefault(name, rootfs)
    return rootfs


def _host_files(stage: Stage) -> list[tuple[str, str]]:
    entries: list[tuple[str, str]] = []
    for section in stage.sections:
        if section.name == "files" and not section.args.split("#", 1)[0].strip():
            entries += files_entries(section)
    return entries


def _host_command(idmap: IdMap | None) -> sections.Command:
    """Runs a host program (cp) as the build runs %post: as root, or as root of the build's namespace."""

    def run(argv: list[str]) -> None:
        sections.run_host(argv, what=os.path.basename(argv[0]), idmap=idmap)

    return run


def _write_output(rootfs: str, text: str, request: BuildRequest, work: str, idmap: IdMap | None,
                  env: Mapping[str, str]) -> None:
    if request.sandbox:
        _publish_sandbox(rootfs, request.target, work, idmap)
        return
    _write_sif(rootfs, text, request, work, idmap, env)


def _publish_sandbox(rootfs: str, target: str, work: str, idmap: IdMap | None) -> None:
    """The stage's tree renamed into place; copied first when the work directory is on another filesystem."""
    console.info(f"Creating sandbox directory {target}")
    tree = rootfs
    if os.stat(work).st_dev != os.stat(os.path.dirname(target)).st_dev:
        from singpy.image.builder import scratch_dir

        holder = scratch_dir(target, workdir.PREFIX)
        tree = f"{holder}/root"
        try:
            _host_command(idmap)(["cp", "-a", "--", rootfs, tree])
            _publish(tree, target, f"{holder}/old")
        finally:
            workdir.remove(holder, idmap)
        return
    _publish(tree, target, f"{work}/old")


def _publish(tree: str, target: str, old: str) -> None:
    from singpy.image.builder import publish_tree

    try:
        publish_tree(tree, target, old)
    except OSError as error:
        raise ImageError(f"can't write {target}: {error.strerror}") from None


def _write_sif(rootfs: str, text: str, request: BuildRequest, work: str, idmap: IdMap | None,
               env: Mapping[str, str]) -> None:
    from singpy.constants import SQUASH_MEMORY
    from singpy.image import builddate, tools
    from singpy.image.builder import root_mode_options
    from singpy.image.detect import host_arch
    from singpy.image.metadata import read_tree
    from singpy.image.sifwrite import build_sif_from_squashfs
    from singpy.oci.pull import SQUASH_COMPRESSION
    from singpy.recipe import mapped

    mksquashfs = tools.require_tool("mksquashfs", env, "build a SIF image")
    squashfs = f"{work}/rootfs.squashfs"
    console.info("Creating SIF file...")
    prefix = mapped.command(idmap) if idmap is not None else []
    root_mode = root_mode_options(rootfs) if idmap is None and os.getuid() == 0 else []  # a private sandbox base
    target = request.target
    compression = tools.compression_flags(request.squash_args, SQUASH_COMPRESSION)
    tools.run_tool([mksquashfs, rootfs, squashfs, "-noappend", *compression, *SQUASH_MEMORY, *root_mode,
                    *request.squash_args], label="Squashing the image", failure=f"can't build {target}", prefix=prefix)
    attributes = read_tree(rootfs)
    attributes["deffile"] = text
    arch = host_arch()
    partial = f"{work}/image.sif"
    build_sif_from_squashfs(partial, squashfs, arch=arch, deffile=text,
                            inspect_metadata={"data": {"attributes": attributes}, "type": "container"},
                            deterministic=builddate.from_env(os.environ) is not None)
    _move(partial, target)


def _move(path: str, target: str) -> None:
    """Into place: a rename on the same filesystem, else a copy next to the target renamed over it."""
    try:
        os.replace(path, target)
        return
    except OSError as error:
        import errno

        if error.errno != errno.EXDEV:
            raise ImageError(f"can't write {target}: {error.strerror}") from None
    import shutil
    import tempfile

    fd, partial = tempfile.mkstemp(prefix=workdir.PREFIX, dir=os.path.dirname(target))
    try:
        with os.fdopen(fd, "wb") as out, open(path, "rb") as source:
            shutil.copyfileobj(source, out, 1 << 20)
        from singpy.image.sifwrite import sif_mode

        os.chmod(partial, sif_mode())  # 0755 less the umask, as a SIF the build writes itself
        os.replace(partial, target)
    except BaseException:
        os.unlink(partial)
        raise
