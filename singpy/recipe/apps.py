"""SCIF apps of a definition file: `%appinstall NAME`, `%apprun NAME`... into /scif/apps/NAME.

As Apptainer's build lays them out ([1] Apptainer internal/pkg/build/apps/
apps.go), in the order the apps first appear:

    /scif/apps/NAME/{bin,lib}          the app's programs and libraries (on PATH / LD_LIBRARY_PATH under --app)
    /scif/apps/NAME/scif/env/01-base.sh   SCIF_APPNAME, SCIF_APPROOT... ; 90-environment.sh from %appenv
    /scif/apps/NAME/scif/{runscript,startscript,test,runscript.help,labels.json}
    /scif/data/NAME/{input,output}
    /.singularity.d/env/94-appsbase.sh    SCIF_APPROOT_NAME... of every app, for all of them to find each other

%appfiles copies from the host into /scif/apps/NAME; %appinstall runs at
the end of %post, in /scif/apps/NAME with its 01-base.sh sourced.
`singpy run --app NAME` runs the app's runscript (singpy.image.scripts).
"""

from __future__ import annotations

import re

from singpy.recipe.deffile import DefinitionError, Stage, files_entries, labels

APPS_DIR = "/scif/apps"
DATA_DIR = "/scif/data"
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # a name that stays one directory of /scif/apps
_UNSAFE = re.compile(r"[^a-zA-Z0-9_]")  # what Apptainer replaces by _ in variable names

_BASE_ENV = """#!/bin/sh

SCIF_APPNAME={name}
SCIF_APPROOT="/scif/apps/{name}"
SCIF_APPMETA="/scif/apps/{name}/scif"
SCIF_DATA="/scif/data"
SCIF_APPDATA="/scif/data/{name}"
SCIF_APPINPUT="/scif/data/{name}/input"
SCIF_APPOUTPUT="/scif/data/{name}/output"
export SCIF_APPDATA SCIF_APPNAME SCIF_APPROOT SCIF_APPMETA SCIF_APPINPUT SCIF_APPOUTPUT SCIF_DATA
"""
_GLOBAL_ENV = """## App Global Exports For: {var}

SCIF_APPDATA_{var}=/scif/data/{name}
SCIF_APPMETA_{var}=/scif/apps/{name}/scif
SCIF_APPROOT_{var}=/scif/apps/{name}
SCIF_APPBIN_{var}=/scif/apps/{name}/bin
SCIF_APPLIB_{var}=/scif/apps/{name}/lib

export SCIF_APPDATA_{var} SCIF_APPMETA_{var} SCIF_APPROOT_{var} SCIF_APPBIN_{var} SCIF_APPLIB_{var}
"""
_GLOBAL_FILES = (("90-environment.sh", "env/90-environment.sh", "APPENV"), ("labels.json", "labels.json", "APPLABELS"),
                 ("runscript", "runscript", "APPRUN"), ("startscript", "startscript", "APPSTART"))
_SCRIPTS = (("apprun", "runscript"), ("appstart", "startscript"), ("apptest", "test"))
_INSTALL = """
cd /
. {root}/scif/env/01-base.sh

cd {root}
{script}

cd /
"""


def app_names(stage: Stage, origin: str) -> list[str]:
    """The stage's apps, in the order they first appear; a name that is not one plain word is an error."""
    names: list[str] = []
    for section in stage.sections:
        if not section.name.startswith("app"):
            continue
        words = section.args.split()
        if not words or not _NAME.fullmatch(words[0]):
            raise DefinitionError(f"{origin}:{section.line}: %{section.name} needs an app name (letters, digits, "
                                  f"_ . -), not {section.args.strip()!r}")
        if words[0] not in names:
            names.append(words[0])
    return names


def app_script(stage: Stage, section: str, name: str) -> str:
    """The body of every `%SECTION NAME` of the stage, joined."""
    return "".join(item.body for item in stage.sections if item.name == section and item.args.split()[:1] == [name])


def post_script(stage: Stage, names: list[str]) -> str:
    """What %post runs after its own body: every app's %appinstall, in its app's directory."""
    return "".join(_INSTALL.format(root=f"{APPS_DIR}/{name}", script=app_script(stage, "appinstall", name))
                   for name in names)


def install(rootfs: str, stage: Stage, names: list[str], *, cwd: str) -> None:
    """The apps' directories, scripts, labels and files, and 94-appsbase.sh, written into `rootfs`."""
    from singpy.mounts.rootpath import Tree
    from singpy.recipe import files, metadata

    global_env = ""
    with Tree(rootfs) as image:
        for name in names:
            root, meta = f"{APPS_DIR}/{name}", f"{APPS_DIR}/{name}/scif"
            for guest in (f"{root}/bin", f"{root}/lib", f"{meta}/env", f"{DATA_DIR}/{name}/input",
                          f"{DATA_DIR}/{name}/output"):
                metadata.make_directory(image, guest)
            metadata.write_file(image, f"{meta}/env/01-base.sh", _BASE_ENV.format(name=name).encode(), 0o755)
            environment = app_script(stage, "appenv", name)
            if environment:
                metadata.write_file(image, f"{meta}/env/90-environment.sh", environment.encode(), 0o755)
            for section, file in _SCRIPTS:
                body = app_script(stage, section, name)
                if body:
                    metadata.write_file(image, f"{meta}/{file}", f"#!/bin/sh\n\n{body}\n".encode(), 0o755)
            help_text = app_script(stage, "apphelp", name)
            if help_text:
                metadata.write_file(image, f"{meta}/runscript.help", help_text.encode(), 0o644)
            metadata.write_file(image, f"{meta}/labels.json", _labels_json(stage, name), 0o644)
            global_env += _global_env(stage, name)
        metadata.write_file(image, "/.singularity.d/env/94-appsbase.sh", global_env.encode(), 0o755)
    for name in names:
        entries = [(source, f"{APPS_DIR}/{name}/{destination or source}".replace("//", "/"))
                   for section in stage.sections if section.name == "appfiles" and section.args.split()[:1] == [name]
                   for source, destination in files_entries(section)]
        if entries:
            files.copy_from_host(entries, rootfs, cwd=cwd)


def _labels_json(stage: Stage, name: str) -> bytes:
    import json

    found = {"SCIF_APP_NAME": name}
    for section in stage.sections:
        if section.name == "applabels" and section.args.split()[:1] == [name]:
            found.update(labels(section))
    return json.dumps(found, indent="\t").encode()


def _global_env(stage: Stage, name: str) -> str:
    """This app's part of 94-appsbase.sh: its directories, and the scripts it has."""
    var = _UNSAFE.sub("_", name)
    text = _GLOBAL_ENV.format(var=var, name=name)
    present = {"90-environment.sh": bool(app_script(stage, "appenv", name)), "labels.json": True,
               "runscript": bool(app_script(stage, "apprun", name)),
               "startscript": bool(app_script(stage, "appstart", name))}
    for key, file, variable in _GLOBAL_FILES:
        if present[key]:
            text += f'export SCIF_{variable}_{var}="/scif/apps/{name}/scif/{file}"\n'
    return text
