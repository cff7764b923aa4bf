"""`singpy run-help [--app NAME] IMAGE`: the help text the image's author wrote (its %help section).

As Apptainer's run-help (which runs `inspect --helpfile [--app NAME]`): the
image's /.singularity.d/runscript.help, or the app's
/scif/apps/NAME/scif/runscript.help, followed by a newline; "No help sections
were defined for this image" when there is none. The text is the image's:
escaped for the terminal, its newlines and tabs kept (singpy.console.escape).
"""

from __future__ import annotations

import typer

from singpy.console import escape

NO_HELP = "No help sections were defined for this image"


def run_help_command(
    image: str = typer.Argument(..., help="a SIF, squashfs or sandbox image"),
    app: str = typer.Option("", "--app", help="show the help for an app", metavar="NAME"),
) -> None:
    """Show the user-defined help for an image (its %help section, or an app's %apphelp)."""
    import os

    from singpy.image.detect import classify

    spec = classify(image)
    if app:
        from singpy.image.apps import app_file

        text = app_file(spec, app, "runscript.help", os.environ) or ""
    else:
        from singpy.image.metadata import read_metadata

        text = str(read_metadata(spec, os.environ).get("helpfile") or "")
    print(escape(text, "\n\t") if text else NO_HELP)
