"""`singpy overlay create`: a writable ext3 overlay image, or an overlay partition added to a SIF (Apptainer's)."""

from __future__ import annotations

import typer

from singpy.cli.pull import TMPDIR, variables

overlay_app = typer.Typer(name="overlay", help="Manage writable overlay images (ext3).", no_args_is_help=True)


@overlay_app.command("create")
def create_command(
    image: str = typer.Argument(..., metavar="FILE", help="the overlay image to create, or a SIF image to "
                                "add a writable overlay partition to"),
    size: int = typer.Option(64, "--size", "-s", metavar="MiB", help="size of the ext3 overlay in MiB (64 at least)"),
    sparse: bool = typer.Option(False, "--sparse", "-S", help="create a sparse file (blocks allocated when written)",
                                envvar=variables("SPARSE"), show_envvar=False),
    create_dir: list[str] = typer.Option([], "--create-dir", metavar="DIR",  # noqa: B008
                                         help="a directory to create in the overlay, writable by you (repeatable)"),
    fakeroot: bool = typer.Option(False, "--fakeroot", "-f", help="make the overlay layout root's, for "
                                  "containers run with --fakeroot", envvar=variables("FAKEROOT"), show_envvar=False),
    tmpdir: str = TMPDIR,  # Apptainer's hidden flag: where the overlay's tree is laid out
) -> None:
    """Create a writable ext3 overlay image (FILE.img), or add one as a partition to a SIF image.

    Use it with `singpy exec --overlay FILE.img IMAGE ...`, or `--writable` on
    the SIF. Example: `singpy overlay create --size 1024 overlay.img`.
    """
    import os
    import tempfile

    from singpy import console
    from singpy.image.overlaycreate import create
    from singpy.oci.store import TMPDIR_VARIABLES

    tmpdir = tmpdir or next((os.environ[name] for name in TMPDIR_VARIABLES if os.environ.get(name)),
                            tempfile.gettempdir())
    console.info(create(image, size_mb=size, sparse=sparse, dirs=list(create_dir), fakeroot=fakeroot,
                        env=os.environ, tmpdir=tmpdir))
