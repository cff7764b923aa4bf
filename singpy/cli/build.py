"""`singpy build TARGET SOURCE`: SIF from a sandbox, sandbox from a SIF or squashfs."""

from __future__ import annotations

import typer


def build_command(
    target: str = typer.Argument(..., help="the image to write: a SIF file, or a directory (sandbox)"),
    source: str = typer.Argument(..., help="a sandbox directory (-> SIF), or a SIF/squashfs image (-> sandbox)"),
    force: bool = typer.Option(False, "--force", "-F", help="overwrite TARGET if it exists"),
) -> None:
    """Build a SIF image from a sandbox directory, or unpack a SIF/squashfs image into one."""
    import os

    from singpy import console
    from singpy.image.builder import build

    console.info(build(target, source, force=force, env=os.environ))
