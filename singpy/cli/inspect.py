"""`singpy inspect IMAGE`: the image's metadata, as Apptainer's inspect shows it.

Without a selection flag the labels are shown, as in Apptainer; `--app NAME`
shows those of the app's own files (/scif/apps/NAME/scif) instead. `--list`
adds the SIF's data objects (a table like `siftool list`); `--json` prints
Apptainer's document (`{"data": {"attributes": ...}, "type": "container"}`)
with, for a SIF, the header and descriptors under "sif".

Everything shown comes from the image (or its build's definition file), so
it is escaped for the terminal (singpy.console.escape): a label, a path, a
table cell on one line; the scripts, the definition file and the help text
keep their newlines and tabs (they are texts meant to be read as such), any
other control character (ESC, CR, a bidi override) is shown as \\x1b, \\r,
\\u202e. `--json` needs nothing: json.dumps writes every control and
non-ASCII character as \\uXXXX.
"""

from __future__ import annotations

import json
from typing import Any

import typer

from singpy.cli.pull import AUTHFILE, DOCKER_LOGIN, NO_HTTPS
from singpy.console import escape
from singpy.image import metadata

_TEXT = "\n\t"  # what a multi-line section (a script, the definition file) keeps as it is

SECTIONS = ("labels", "deffile", "runscript", "startscript", "test", "helpfile", "environment")
# The order Apptainer prints them in when several are asked for (labels last).
_PRINTED = ("deffile", "runscript", "startscript", "test", "helpfile", "environment", "labels")


def inspect_command(
    image: str = typer.Argument(..., help="a SIF, squashfs or sandbox image, or docker://REF, oci:DIR..."),
    labels: bool = typer.Option(False, "--labels", "-l", help="show the labels (the default)"),
    deffile: bool = typer.Option(False, "--deffile", "-d", help="show the definition file"),
    runscript: bool = typer.Option(False, "--runscript", "-r", help="show the runscript"),
    startscript: bool = typer.Option(False, "--startscript", "-s", help="show the startscript"),
    test: bool = typer.Option(False, "--test", "-t", help="show the test script"),
    helpfile: bool = typer.Option(False, "--helpfile", "-H", help="show the help text"),
    environment: bool = typer.Option(False, "--environment", "-e", help="show the environment scripts"),
    all_: bool = typer.Option(False, "--all", help="show all available data (implies --json)"),
    list_: bool = typer.Option(False, "--list", help="list the SIF's data objects (descriptors)"),
    list_apps: bool = typer.Option(False, "--list-apps", help="list all apps in a container"),
    app: str = typer.Option("", "--app", help="inspect a specific app (its labels, scripts, help and environment)"),
    as_json: bool = typer.Option(False, "--json", "-j", help="print JSON (with the SIF descriptors)"),
    docker_login: bool = DOCKER_LOGIN,
    authfile: str = AUTHFILE,
    no_https: bool = NO_HTTPS,
) -> None:
    """Show an image's labels, definition file, scripts and environment."""
    import os

    from singpy.constants import PULLED_URI_PREFIXES
    from singpy.image.detect import classify

    if image.startswith(PULLED_URI_PREFIXES):  # pulled into the cache first, as by `run`
        from singpy.cli.actions import pulled
        from singpy.host import host

        image = pulled(image, {"docker_login": docker_login, "authfile": authfile, "no_https": no_https},
                       os.environ, host.capture().home)
    as_json = as_json or all_  # Apptainer: --all is JSON only, and every app's
    app = "" if all_ else app
    if app:
        from singpy.image.apps import check_app_name

        check_app_name(app)
    spec = classify(image)
    chosen = {"labels": labels, "deffile": deffile, "runscript": runscript, "startscript": startscript,
              "test": test, "helpfile": helpfile, "environment": environment}
    wanted = [name for name in SECTIONS if chosen[name] or all_]
    if not wanted and not list_ and not list_apps:  # Apptainer: labels unless another section is asked for
        wanted = ["labels"]
    if app:
        selected = _app_sections(spec, app, wanted)
    else:
        attributes = metadata.read_metadata(spec, os.environ) if wanted else {}
        selected = {name: attributes[name] for name in wanted if name in attributes}
    if as_json and (list_apps or all_):  # Apptainer's data.attributes.apps: each app with its attributes
        from singpy.image.apps import app_attributes

        apps = app_attributes(spec, os.environ)
        if apps:  # omitted when empty, as Go's omitempty
            selected["apps"] = apps
    if as_json:
        document: dict[str, Any] = {"data": {"attributes": selected}, "type": "container"}
        if spec.kind == "sif":
            document["sif"] = sif_document(spec.path)
        print(json.dumps(document, indent=2, sort_keys=True))
        return
    if list_apps:  # Apptainer prints the apps first, one name a line
        from singpy.image.apps import list_apps as apps_of

        print("".join(f"{escape(name)}\n" for name in apps_of(spec, os.environ)), end="")
    if list_:
        print(descriptor_table(spec.path) if spec.kind == "sif" else f"{escape(spec.path)} is a {spec.kind} "
              "image: it has no SIF data objects")
    sections = {**selected, **selected.get("apps", {}).get(app, {})} if app else selected
    for name in _PRINTED:
        if name in sections:
            print(render(name, sections[name]), end="")


def _app_sections(spec: Any, app: str, wanted: list[str]) -> dict[str, Any]:
    """--app APP: the `wanted` sections of the app's own files (/scif/apps/APP/scif, read by Apptainer in place of
    /.singularity.d), as {"apps": {APP: ...}}, {} when the image has no such app; beside them the image's
    definition file when asked for and a SIF records one (Apptainer reads it from the SIF's object)."""
    import os

    from singpy.image.apps import app_attributes

    found = app_attributes(spec, os.environ)
    selected: dict[str, Any] = {}
    if "deffile" in wanted and spec.kind == "sif":
        definition = metadata.sif_definition(spec.path)
        if definition is not None:
            selected["deffile"] = definition
    if app in found:
        selected["apps"] = {app: {name: found[app][name] for name in wanted if name in found[app]}}
    return selected


def render(name: str, value: Any) -> str:
    """One section as Apptainer's inspect prints it."""
    if name == "labels":  # a label is one line: a newline in one is shown as \n, never as a forged label
        return "".join(f"{escape(str(key))}: {escape(str(value[key]))}\n" for key in sorted(value))
    if name == "environment":
        return "".join(f"=== {escape(str(path))} ===\n{escape(str(text).rstrip(), _TEXT)}\n\n"
                       for path, text in value.items())
    text = escape(str(value), _TEXT)
    return text if text.endswith("\n") else text + "\n"


def sif_document(path: str) -> dict[str, Any]:
    from singpy.image import sif

    image = sif.read_sif(path)
    header = {"launch_script": image.launch_script, "version": image.version, "arch": image.arch,
              "id": image.uuid, "created": image.created, "modified": image.modified,
              "descriptors_free": image.descriptors_free, "descriptors_total": image.descriptors_total,
              "data_offset": image.data_offset, "data_size": image.data_size}
    return {"header": header, "descriptors": [descriptor(d) for d in image.descriptors]}


def descriptor(desc: Any) -> dict[str, Any]:
    entry = {"id": desc.id, "group": desc.group_id, "link": desc.link, "link_is_group": desc.link_is_group,
             "offset": desc.offset, "size": desc.size, "type": desc.type_name, "name": desc.name}
    if desc.is_partition:
        entry["partition"] = {"fs": desc.fstype_name, "type": desc.parttype_name, "arch": desc.arch,
                              "primary": desc.is_primary}
    return entry


def descriptor_table(path: str) -> str:
    rows = [("ID", "GROUP", "LINK", "OFFSET", "SIZE", "TYPE", "NAME")]
    for entry in sif_document(path)["descriptors"]:
        link = "NONE" if not entry["link"] else f"{entry['link']}{' (G)' if entry['link_is_group'] else ''}"
        kind = entry["type"]
        if "partition" in entry:
            part = entry["partition"]
            kind += f" ({part['fs']}/{part['type']}/{part['arch']})"
        rows.append((str(entry["id"]), str(entry["group"] or "NONE"), link, str(entry["offset"]),
                     str(entry["size"]), kind, entry["name"]))
    cells = [[escape(str(cell)) for cell in row] for row in rows]  # a name or an arch is the file's own text
    widths = [max(len(row[column]) for row in cells) for column in range(len(cells[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                     for row in cells)
