"""The files Apptainer writes for an OCI image config: their paths, contents and modes, as data.

The runscript from Entrypoint and Cmd, the env script from Env, labels.json,
the recorded definition, and the base environment (singpy.oci.basefiles), as
[A] internal/pkg/build/sources/conveyorPacker_oci.go, base_environment.go
and metadata.go make them ([A] = github.com/apptainer/apptainer, main).
singpy.oci.convert writes them into a tree.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from singpy.constants import RUNSCRIPT, SINGULARITY_D
from singpy.errors import ImageError
from singpy.oci.basefiles import ACTIONS, ENV_SCRIPTS, OCI_RUNSCRIPT_TEMPLATE, STARTSCRIPT
from singpy.oci.gotemplate import render_template

__all__ = ["DEFFILE", "DOCKER_ENV", "HISTORY", "LABELS", "RUNSCRIPT", "SINGULARITY_D", "args_quoted", "base_files",
           "deffile_for", "environment_script", "escape", "escape_single_quotes", "labels_json", "runscript",
           "singularity_files", "singularity_links", "skeleton_dirs"]
DOCKER_ENV = f"{SINGULARITY_D}/env/10-docker2singularity.sh"
LABELS = f"{SINGULARITY_D}/labels.json"
DEFFILE = f"{SINGULARITY_D}/Singularity"
HISTORY = f"{SINGULARITY_D}/bootstrap_history"
_SCRIPT, _DATA = 0o755, 0o644

# [A] conveyorPacker_oci.go `variableRegex`: names that are not shell names are skipped.
_VARIABLE = re.compile(r"[a-zA-Z_]+[a-zA-Z0-9_]*")


def skeleton_dirs() -> list[str]:
    """The directories Apptainer makes in every image ([A] base_environment.go `makeDirs`), in its order."""
    return [f"{SINGULARITY_D}/libs", f"{SINGULARITY_D}/actions", f"{SINGULARITY_D}/env", "/dev", "/proc", "/root",
            "/var/tmp", "/tmp", "/etc", "/sys", "/home"]


def singularity_links() -> dict[str, str]:
    """Link (guest path) -> target, as [A] base_environment.go `makeSymlinks` makes them."""
    return {"/singularity": ".singularity.d/runscript", "/.run": ".singularity.d/actions/run",
            "/.exec": ".singularity.d/actions/exec", "/.test": ".singularity.d/actions/test",
            "/.shell": ".singularity.d/actions/shell", "/environment": ".singularity.d/env/90-environment.sh"}


def singularity_files(config: Mapping[str, Any], *, labels: Mapping[str, str],
                      deffile: bytes | None = None) -> dict[str, tuple[bytes, int]]:
    """Guest path -> (content, mode) of every file Apptainer writes for an image with this config.

    `config` is the image configuration (the config blob: {"architecture",
    "os", "config": {"Env", "Entrypoint", "Cmd", "Labels", ...}, ...});
    `labels` are the build's own (org.label-schema.*), which win over the
    image's; `deffile` the definition Apptainer records for the build
    ("bootstrap: docker\\nfrom: alpine\\n\\n"), written when given.
    """
    settings = _settings(config)
    files: dict[str, tuple[bytes, int]] = {
        **base_files(),
        RUNSCRIPT: (runscript(settings.get("Entrypoint"), settings.get("Cmd")).encode(), _SCRIPT),
        f"{SINGULARITY_D}/startscript": (STARTSCRIPT.encode(), _SCRIPT),
        DOCKER_ENV: (environment_script(settings.get("Env")).encode(), _SCRIPT),
        LABELS: (labels_json({**(settings.get("Labels") or {}), **labels}), _DATA),
    }
    if deffile is not None:
        files[DEFFILE] = (deffile, _DATA)
    return files


def base_files() -> dict[str, tuple[bytes, int]]:
    """Guest path -> (content, mode) of the files of Apptainer's base environment ([A] makeFiles): empty
    /etc/hosts and /etc/resolv.conf, the action scripts, the env scripts, an empty 94-appsbase.sh."""
    return {
        "/etc/hosts": (b"", _DATA),
        "/etc/resolv.conf": (b"", _DATA),
        **{f"{SINGULARITY_D}/actions/{name}": (text.encode(), _SCRIPT) for name, text in ACTIONS.items()},
        **{f"{SINGULARITY_D}/env/{name}": (text.encode(), _SCRIPT) for name, text in ENV_SCRIPTS.items()},
        f"{SINGULARITY_D}/env/94-appsbase.sh": (b"", _SCRIPT),
    }


def _settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The image config's `config` object, its fields of the types Apptainer's Go structs hold."""
    if not isinstance(config, Mapping):
        raise ImageError("malformed image config: not a JSON object")
    settings = config.get("config")
    if settings is None:
        return {}
    if not isinstance(settings, dict):
        raise ImageError("malformed image config: \"config\" must be an object")
    for field in ("Env", "Entrypoint", "Cmd"):
        value = settings.get(field)
        if value is not None and not (isinstance(value, list) and all(isinstance(item, str) for item in value)):
            raise ImageError(f"malformed image config: {field} must be a list of strings")
    found = settings.get("Labels")
    if found is not None and not (isinstance(found, dict) and all(isinstance(value, str)
                                                                  for value in found.values())):
        raise ImageError("malformed image config: Labels must map names to strings")
    return settings


def escape(text: str) -> str:
    """[A] internal/pkg/util/shell/escape.go `Escape`: safe between double quotes (backslash, quote, `, $)."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`").replace("$", "\\$")


def escape_single_quotes(text: str) -> str:
    """[A] escape.go `EscapeSingleQuotes`: a ' ends the quotes, is written "'", and they start again."""
    return text.replace("'", "'\"'\"'")


def args_quoted(args: list[str]) -> str:
    """[A] escape.go `ArgsQuoted`: each argument escaped between double quotes, separated by spaces."""
    return " ".join(f'"{escape(arg)}"' for arg in args)


def environment_script(env: list[str] | None) -> str:
    """/.singularity.d/env/10-docker2singularity.sh ([A] conveyorPacker_oci.go `insertEnv`).

    Each variable of the image is a default (`${NAME:-"value"}`): a value
    already set when the script is sourced stays (HOME, which the action
    script keeps; --env and *ENV_ values come later and win anyway); PATH
    is set as the image says. A name that is not a shell name is skipped.
    """
    lines = ["#!/bin/sh\n"]
    for element in env or []:
        name, has_value, value = element.partition("=")
        if not _VARIABLE.fullmatch(name):
            continue
        if not has_value:
            lines.append(f'export {name}="${{{name}:-}}"\n')
        elif name == "PATH":
            lines.append(f'export {name}="{escape(value)}"\n')
        else:
            lines.append(f'export {name}="${{{name}:-"{escape(value)}"}}"\n')
    return "".join(lines)


def runscript(entrypoint: list[str] | None, cmd: list[str] | None) -> str:
    """/.singularity.d/runscript ([A] conveyorPacker_oci.go `insertRunScript`).

    Without --no-eval (SINGULARITY_NO_EVAL unset) ENTRYPOINT, CMD and the
    arguments of `run` are joined and evaluated by the shell (`eval "set
    ..."`): an argument's $VAR and quotes are interpreted, as Apptainer has
    always done. With it, they are passed as they are, as Docker does.
    """
    entrypoint, cmd = entrypoint or [], cmd or []
    head = "#!/bin/sh\n"
    head += f"OCI_ENTRYPOINT='{escape_single_quotes(args_quoted(entrypoint))}'\n" if entrypoint else \
        "OCI_ENTRYPOINT=''\n"
    head += f"OCI_CMD='{escape_single_quotes(args_quoted(cmd))}'\n" if cmd else "OCI_CMD=''\n"
    prepend_cmd = "".join(f"set -- '{escape_single_quotes(arg)}' \"$@\"\n" for arg in reversed(cmd))
    prepend_entrypoint = "".join(f"set -- '{escape_single_quotes(arg)}' \"$@\"\n" for arg in reversed(entrypoint))
    return head + render_template(OCI_RUNSCRIPT_TEMPLATE, {"PrependCmd": prepend_cmd,
                                                            "PrependEntrypoint": prepend_entrypoint})


def labels_json(labels: Mapping[str, str]) -> bytes:
    """labels.json as Go's json.MarshalIndent(labels, "", "\\t") writes a map[string]string: keys sorted,
    tab-indented, <, > and & escaped as \\u003c, \\u003e, \\u0026 (Go's HTML-safe default), invalid UTF-8 as U+FFFD,
    no final newline ([A] metadata.go `insertLabelsJSON`)."""
    text = json.dumps(dict(labels), indent="\t", sort_keys=True, ensure_ascii=False, separators=(",", ": "))
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                          ("\u2029", "\\u2029")):
        text = text.replace(char, escaped)
    # A lone surrogate is what Python makes of JSON text that was not valid UTF-16: Go writes U+FFFD for it.
    return _SURROGATE.sub("\ufffd", text).encode()


_SURROGATE = re.compile("[\ud800-\udfff]")


def deffile_for(source: str) -> bytes:
    """The definition Apptainer records for `build|pull SOURCE` ([A] pkg/build/types/definition.go
    `NewDefinitionFromURI` + `populateRaw`): "docker://alpine" -> b"bootstrap: docker\\nfrom: alpine\\n\\n"."""
    bootstrap, separator, rest = source.partition("://")
    if not separator:
        bootstrap, _, rest = source.partition(":")
    return f"bootstrap: {bootstrap}\nfrom: {rest}\n\n".encode()
