"""An OCI image config made Apptainer's /.singularity.d: the files Apptainer writes when it builds from OCI.

What `apptainer build|pull ... docker://X` puts in the image, from its
current source ([A] = github.com/apptainer/apptainer, main):

* the base environment of every build ([A] internal/pkg/build/sources/
  base_environment.go `makeBaseEnv(b, overwrite=true)`): the directories
  /.singularity.d/{libs,actions,env}, /dev, /proc, /root, /var/tmp, /tmp,
  /etc, /sys, /home (created when missing, anything already there left as
  it is), the links /singularity, /.run, /.exec, /.test, /.shell and
  /environment, empty /etc/hosts and /etc/resolv.conf, and the action and
  env scripts, whose text is embedded here as Apptainer embeds it (the
  files are Apptainer's, BSD-licensed: their copyright lines are kept);
* from the image config ([A] internal/pkg/build/sources/conveyorPacker_oci.go):
  /.singularity.d/runscript from Entrypoint and Cmd (`insertRunScript`, the
  `ociRunscript` template) and /.singularity.d/env/10-docker2singularity.sh
  from Env (`insertEnv`);
* /.singularity.d/labels.json: the image's Labels with the build's labels
  over them ([A] internal/pkg/build/metadata.go `insertLabelsJSON`), in the
  bytes Go's json.MarshalIndent writes;
* an empty /.singularity.d/env/94-appsbase.sh ([A] internal/pkg/build/apps/
  apps.go `createAllApps`, run for every build, with no apps here);
* with `deffile`, /.singularity.d/Singularity, an older one moved to
  /.singularity.d/bootstrap_history/ApptainerN ([A] metadata.go `insertDefinition`).

`install` writes them into an extracted tree, which is untrusted: every
path is resolved inside the tree as a process inside would see it
(singpy.mounts.rootpath.Tree: links followed, but never out of it), so an
image whose /.singularity.d, /etc or /tmp is a link to /etc of the host
gets its files written below the tree's own root. Where Apptainer's
os.Root refuses an absolute link, the tree's root is its "/" here; the
rest is as Apptainer does it, but for what Apptainer would hang on or
write through:

* a FIFO, device or socket where a file is written, or a regular file with
  other hard links, is replaced by a new file (Apptainer would open it and
  block, or write to the device or to every link); an existing file is
  otherwise truncated and rewritten in place, as Apptainer does, and given
  the mode Apptainer gives (0755 scripts, 0644 labels and /etc files);
* a directory where a file is written, or anything but a directory where
  /.singularity.d or one of its directories must be, is one ImageError
  (Apptainer's build fails there too);
* a file's or directory's missing parents are created, also where a link
  leads to something missing (Apptainer fails on those); every directory
  made is 0755 whatever the umask (Apptainer builds under umask 002).

`install` returns what it wrote, by resolved path, with its mode: an
unprivileged pull records those as root's (singpy.oci.layers.Ownership),
as Apptainer's files are root's in the images it builds.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Mapping
from typing import Any

from singpy.constants import RUNSCRIPT, SINGULARITY_D
from singpy.errors import ImageError, PathError
from singpy.hostfiles import write_all
from singpy.kernel.syscalls import fd_path
from singpy.mounts.rootpath import Lookup, Tree

__all__ = ["DEFFILE", "DOCKER_ENV", "HISTORY", "LABELS", "RUNSCRIPT", "SINGULARITY_D", "args_quoted", "deffile_for",
           "environment_script", "escape", "escape_single_quotes", "install", "labels_json", "render_template",
           "runscript", "singularity_files", "singularity_links", "skeleton_dirs", "base_files", "install_base"]
DOCKER_ENV = f"{SINGULARITY_D}/env/10-docker2singularity.sh"
LABELS = f"{SINGULARITY_D}/labels.json"
DEFFILE = f"{SINGULARITY_D}/Singularity"
HISTORY = f"{SINGULARITY_D}/bootstrap_history"
_SCRIPT, _DATA = 0o755, 0o644

# [A] conveyorPacker_oci.go `variableRegex`: names that are not shell names are skipped.
_VARIABLE = re.compile(r"[a-zA-Z_]+[a-zA-Z0-9_]*")


# The files of Apptainer's base environment, as [A] embeds them (go:embed) in base_environment.go.

# internal/pkg/build/sources/exec.sh
_EXEC = r'''#!/bin/sh
# Copyright (c) Contributors to the Apptainer project, established as
#   Apptainer a Series of LF Projects LLC.
#   For website terms of use, trademark policy, privacy policy and other
#   project policies see https://lfprojects.org/policies
# Copyright (c) 2018-2021, Sylabs Inc. All rights reserved.
# This software is licensed under a 3-clause BSD license. Please consult the
# LICENSE.md file distributed with the sources of this project regarding your
# rights to use or distribute this software.

for script in /.singularity.d/env/*.sh; do
    if [ -f "$script" ]; then
        . "$script"
    fi
done

exec "$@"
'''

# internal/pkg/build/sources/run.sh
_RUN = r'''#!/bin/sh
# Copyright (c) Contributors to the Apptainer project, established as
#   Apptainer a Series of LF Projects LLC.
#   For website terms of use, trademark policy, privacy policy and other
#   project policies see https://lfprojects.org/policies
# Copyright (c) 2018-2021, Sylabs Inc. All rights reserved.
# This software is licensed under a 3-clause BSD license. Please consult the
# LICENSE.md file distributed with the sources of this project regarding your
# rights to use or distribute this software.

for script in /.singularity.d/env/*.sh; do
    if [ -f "$script" ]; then
        . "$script"
    fi
done

if test -n "${SINGULARITY_APPNAME:-}"; then

    if test -x "/scif/apps/${SINGULARITY_APPNAME:-}/scif/runscript"; then
        exec "/scif/apps/${SINGULARITY_APPNAME:-}/scif/runscript" "$@"
    elif test -x "/scif/apps/singularity/scif/runscript"; then
        exec "/scif/apps/singularity/scif/runscript" "$@"
    else
        echo "No Apptainer runscript for contained app: ${SINGULARITY_APPNAME:-}"
        exit 1
    fi

elif test -x "/.singularity.d/runscript"; then
    exec "/.singularity.d/runscript" "$@"
else
    echo "No Apptainer runscript found, executing /bin/sh"
    exec /bin/sh "$@"
fi
'''

# internal/pkg/build/sources/shell.sh
_SHELL = r'''#!/bin/sh
# Copyright (c) Contributors to the Apptainer project, established as
#   Apptainer a Series of LF Projects LLC.
#   For website terms of use, trademark policy, privacy policy and other
#   project policies see https://lfprojects.org/policies
# Copyright (c) 2018-2021, Sylabs Inc. All rights reserved.
# This software is licensed under a 3-clause BSD license. Please consult the
# LICENSE.md file distributed with the sources of this project regarding your
# rights to use or distribute this software.

for script in /.singularity.d/env/*.sh; do
    if [ -f "$script" ]; then
        . "$script"
    fi
done

if test -n "$SINGULARITY_SHELL" -a -x "$SINGULARITY_SHELL"; then
    exec $SINGULARITY_SHELL "$@"

    echo "ERROR: Failed running shell as defined by '\$SINGULARITY_SHELL'" 1>&2
    exit 1

elif test -x /bin/bash; then
    SHELL=/bin/bash
    PS1="Apptainer $APPTAINER_NAME:\\w> "
    export SHELL PS1
    exec /bin/bash --norc "$@"
elif test -x /bin/sh; then
    SHELL=/bin/sh
    export SHELL
    exec /bin/sh "$@"
else
    echo "ERROR: /bin/sh does not exist in container" 1>&2
fi
exit 1
'''

# internal/pkg/build/sources/start.sh
_START = r'''#!/bin/sh
# Copyright (c) Contributors to the Apptainer project, established as
#   Apptainer a Series of LF Projects LLC.
#   For website terms of use, trademark policy, privacy policy and other
#   project policies see https://lfprojects.org/policies
# Copyright (c) 2018-2021, Sylabs Inc. All rights reserved.
# This software is licensed under a 3-clause BSD license. Please consult the
# LICENSE.md file distributed with the sources of this project regarding your
# rights to use or distribute this software.

# if we are here start notify PID 1 to continue
# DON'T REMOVE
kill -CONT 1

for script in /.singularity.d/env/*.sh; do
    if [ -f "$script" ]; then
        . "$script"
    fi
done

if test -x "/.singularity.d/startscript"; then
    exec "/.singularity.d/startscript"
fi
'''

# internal/pkg/build/sources/test.sh
_TEST = r'''#!/bin/sh
# Copyright (c) Contributors to the Apptainer project, established as
#   Apptainer a Series of LF Projects LLC.
#   For website terms of use, trademark policy, privacy policy and other
#   project policies see https://lfprojects.org/policies
# Copyright (c) 2018-2021, Sylabs Inc. All rights reserved.
# This software is licensed under a 3-clause BSD license. Please consult the
# LICENSE.md file distributed with the sources of this project regarding your
# rights to use or distribute this software.

for script in /.singularity.d/env/*.sh; do
    if [ -f "$script" ]; then
        . "$script"
    fi
done


if test -n "${SINGULARITY_APPNAME:-}"; then

    if test -x "/scif/apps/${SINGULARITY_APPNAME:-}/scif/test"; then
        exec "/scif/apps/${SINGULARITY_APPNAME:-}/scif/test" "$@"
    elif test -x "/scif/apps/singularity/scif/test"; then
        exec "/scif/apps/singularity/scif/test" "$@"
    else
        echo "No tests for contained app: ${SINGULARITY_APPNAME:-}"
        exit 1
    fi
elif test -x "/.singularity.d/test"; then
    exec "/.singularity.d/test" "$@"
else
    echo "No test found in container, executing /bin/sh -c true"
    exec /bin/sh -c true
fi
'''

# internal/pkg/build/sources/01-base.sh
_ENV_01_BASE = r'''#!/bin/sh
# Copyright (c) Contributors to the Apptainer project, established as
#   Apptainer a Series of LF Projects LLC.
#   For website terms of use, trademark policy, privacy policy and other
#   project policies see https://lfprojects.org/policies
# Copyright (c) 2018-2021, Sylabs Inc. All rights reserved.
# This software is licensed under a 3-clause BSD license. Please consult
# https://github.com/apptainer/apptainer/blob/main/LICENSE.md regarding your
# rights to use or distribute this software.
#
# Copyright (c) 2017, SingularityWare, LLC. All rights reserved.
# Copyright (c) 2015-2017, Gregory M. Kurtzer. All rights reserved.
#
# Copyright (c) 2016-2017, The Regents of the University of California,
# through Lawrence Berkeley National Laboratory (subject to receipt of any
# required approvals from the U.S. Dept. of Energy).  All rights reserved.
#
# NOTICE.  This Software was developed under funding from the U.S. Department of
# Energy and the U.S. Government consequently retains certain rights. As such,
# the U.S. Government has been granted for itself and others acting on its
# behalf a paid-up, nonexclusive, irrevocable, worldwide license in the Software
# to reproduce, distribute copies to the public, prepare derivative works, and
# perform publicly and display publicly, and to permit other to do so.
#
'''

# internal/pkg/build/sources/90-environment.sh
_ENV_90_ENVIRONMENT = r'''#!/bin/sh
# Copyright (c) Contributors to the Apptainer project, established as
#   Apptainer a Series of LF Projects LLC.
#   For website terms of use, trademark policy, privacy policy and other
#   project policies see https://lfprojects.org/policies
# Copyright (c) 2018-2021, Sylabs Inc. All rights reserved.
# This software is licensed under a 3-clause BSD license. Please consult
# https://github.com/apptainer/apptainer/blob/main/LICENSE.md regarding your
# rights to use or distribute this software.

# Custom environment shell code should follow
'''

# internal/pkg/build/sources/95-apps.sh (its tabs written \t)
_ENV_95_APPS = (
    '#!/bin/sh\n'
    '# Copyright (c) Contributors to the Apptainer project, established as\n'
    '#   Apptainer a Series of LF Projects LLC.\n'
    '#   For website terms of use, trademark policy, privacy policy and other\n'
    '#   project policies see https://lfprojects.org/policies\n'
    '# Copyright (c) 2018-2021, Sylabs Inc. All rights reserved.\n'
    '# This software is licensed under a 3-clause BSD license. Please consult\n'
    '# https://github.com/apptainer/apptainer/blob/main/LICENSE.md regarding your\n'
    '# rights to use or distribute this software.\n'
    '#\n'
    '# Copyright (c) 2017, SingularityWare, LLC. All rights reserved.\n'
    '#\n'
    '# See the COPYRIGHT.md file at the top-level directory of this distribution and at\n'
    '# https://github.com/apptainer/apptainer/blob/main/COPYRIGHT.md.\n'
    '#\n'
    '# This file is part of the Apptainer Linux container project. It is subject to the license\n'
    '# terms in the LICENSE.md file found in the top-level directory of this distribution and\n'
    '# at https://github.com/apptainer/apptainer/blob/main/LICENSE.md. No part\n'
    '# of Apptainer, including this file, may be copied, modified, propagated, or distributed\n'
    '# except according to the terms contained in the LICENSE.md file.\n'
    '\n'
    'if test -n "${SINGULARITY_APPNAME:-}"; then\n'
    '\n'
    '    # The active app should be exported\n'
    '    export SINGULARITY_APPNAME\n'
    '\n'
    '    if test -d "/scif/apps/${SINGULARITY_APPNAME:-}/"; then\n'
    '        SCIF_APPS="/scif/apps"\n'
    '        SCIF_APPROOT="/scif/apps/${SINGULARITY_APPNAME:-}"\n'
    '        export SCIF_APPROOT SCIF_APPS\n'
    '        PATH="/scif/apps/${SINGULARITY_APPNAME:-}:/scif/apps/singularity:$PATH"\n'
    '\n'
    '        # Automatically add application bin to path\n'
    '        if test -d "/scif/apps/${SINGULARITY_APPNAME:-}/bin"; then\n'
    '            PATH="/scif/apps/${SINGULARITY_APPNAME:-}/bin:$PATH"\n'
    '        elif test -d "/scif/apps/singularity/bin"; then\n'
    '            PATH="/scif/apps/singularity/bin:$PATH"\n'
    '        fi\n'
    '\n'
    '        # Automatically add application lib to LD_LIBRARY_PATH\n'
    '        if test -d "/scif/apps/${SINGULARITY_APPNAME:-}/lib"; then\n'
    '            LD_LIBRARY_PATH="/scif/apps/${SINGULARITY_APPNAME:-}/lib:$LD_LIBRARY_PATH"\n'
    '            export LD_LIBRARY_PATH\n'
    '        elif test -d "/scif/apps/singularity/lib"; then\n'
    '            LD_LIBRARY_PATH="/scif/apps/singularity/lib:$LD_LIBRARY_PATH"\n'
    '            export LD_LIBRARY_PATH\n'
    '        fi\n'
    '\n'
    '        # Automatically source environment\n'
    '        if [ -f "/scif/apps/${SINGULARITY_APPNAME:-}/scif/env/01-base.sh" ]; then\n'
    '            . "/scif/apps/${SINGULARITY_APPNAME:-}/scif/env/01-base.sh"\n'
    '\t\telif [ -f "/scif/apps/singularity/scif/env/01-base.sh" ]; then\n'
    '            . "/scif/apps/singularity/scif/env/01-base.sh" "$@"\n'
    '        fi\n'
    '        if [ -f "/scif/apps/${SINGULARITY_APPNAME:-}/scif/env/90-environment.sh" ]; then\n'
    '            . "/scif/apps/${SINGULARITY_APPNAME:-}/scif/env/90-environment.sh"\n'
    '\t\telif [ -f "/scif/apps/singularity/scif/env/90-environment.sh" ]; then\n'
    '            . "/scif/apps/singularity/scif/env/90-environment.sh" "$@"\n'
    '        fi\n'
    '\n'
    '        export PATH\n'
    '    else\n'
    '        echo "Could not locate the container application: ${SINGULARITY_APPNAME}"\n'
    '        exit 1\n'
    '    fi\n'
    'fi\n'
)

# internal/pkg/build/sources/99-base.sh
_ENV_99_BASE = r'''#!/bin/sh
# Copyright (c) Contributors to the Apptainer project, established as
#   Apptainer a Series of LF Projects LLC.
#   For website terms of use, trademark policy, privacy policy and other
#   project policies see https://lfprojects.org/policies
# Copyright (c) 2018-2021, Sylabs Inc. All rights reserved.
# This software is licensed under a 3-clause BSD license. Please consult
# https://github.com/apptainer/apptainer/blob/main/LICENSE.md regarding your
# rights to use or distribute this software.
#
# Copyright (c) 2017, SingularityWare, LLC. All rights reserved.
# Copyright (c) 2015-2017, Gregory M. Kurtzer. All rights reserved.
#
# Copyright (c) 2016-2017, The Regents of the University of California,
# through Lawrence Berkeley National Laboratory (subject to receipt of any
# required approvals from the U.S. Dept. of Energy).  All rights reserved.
#
# NOTICE.  This Software was developed under funding from the U.S. Department of
# Energy and the U.S. Government consequently retains certain rights. As such,
# the U.S. Government has been granted for itself and others acting on its
# behalf a paid-up, nonexclusive, irrevocable, worldwide license in the Software
# to reproduce, distribute copies to the public, prepare derivative works, and
# perform publicly and display publicly, and to permit other to do so.
#

if [ -z "${LD_LIBRARY_PATH:-}" ]; then
    LD_LIBRARY_PATH="/.singularity.d/libs"
else
    LD_LIBRARY_PATH="$LD_LIBRARY_PATH:/.singularity.d/libs"
fi

if [ -z "${PS1:-}" ]; then
    PS1="Apptainer> "
fi
export LD_LIBRARY_PATH PS1
'''

# internal/pkg/build/sources/99-runtimevars.sh (its tabs written \t)
_ENV_99_RUNTIMEVARS = (
    '#!/bin/sh\n'
    '# Copyright (c) Contributors to the Apptainer project, established as\n'
    '#   Apptainer a Series of LF Projects LLC.\n'
    '#   For website terms of use, trademark policy, privacy policy and other\n'
    '#   project policies see https://lfprojects.org/policies\n'
    '# Copyright (c) 2018-2021, Sylabs Inc. All rights reserved.\n'
    '# This software is licensed under a 3-clause BSD license. Please consult\n'
    '# https://github.com/apptainer/apptainer/blob/main/LICENSE.md regarding your\n'
    '# rights to use or distribute this software.\n'
    '#\n'
    '\n'
    'if [ -n "${SING_USER_DEFINED_PREPEND_PATH:-}" ]; then\n'
    '\tPATH="${SING_USER_DEFINED_PREPEND_PATH}:${PATH}"\n'
    'fi\n'
    '\n'
    'if [ -n "${SING_USER_DEFINED_APPEND_PATH:-}" ]; then\n'
    '\tPATH="${PATH}:${SING_USER_DEFINED_APPEND_PATH}"\n'
    'fi\n'
    '\n'
    'if [ -n "${SING_USER_DEFINED_PATH:-}" ]; then\n'
    '\tPATH="${SING_USER_DEFINED_PATH}"\n'
    'fi\n'
    '\n'
    'unset SING_USER_DEFINED_PREPEND_PATH \\\n'
    '\t  SING_USER_DEFINED_APPEND_PATH \\\n'
    '\t  SING_USER_DEFINED_PATH\n'
    '\n'
    'export PATH\n'
)

# internal/pkg/build/sources/startscript.sh
_STARTSCRIPT = r'''#!/bin/sh
# Copyright (c) Contributors to the Apptainer project, established as
#   Apptainer a Series of LF Projects LLC.
#   For website terms of use, trademark policy, privacy policy and other
#   project policies see https://lfprojects.org/policies
# Copyright (c) 2018-2021, Sylabs Inc. All rights reserved.
# This software is licensed under a 3-clause BSD license. Please consult the
# LICENSE.md file distributed with the sources of this project regarding your
# rights to use or distribute this software.
'''


# [A] internal/pkg/build/sources/conveyorPacker_oci.go `ociRunscript`, verbatim: a Go text/template.
_OCI_RUNSCRIPT_TEMPLATE = r'''
# When SINGULARITY_NO_EVAL set, use OCI compatible behavior that does
# not evaluate resolved CMD / ENTRYPOINT / ARGS through the shell, and
# does not modify expected quoting behavior of args.
if [ -n "$SINGULARITY_NO_EVAL" ]; then
    # ENTRYPOINT only - run entrypoint plus args
    if [ -z "$OCI_CMD" ] && [ -n "$OCI_ENTRYPOINT" ]; then
        {{ .PrependEntrypoint }}
        exec "$@"
    fi

    # CMD only - run CMD or override with args
    if [ -n "$OCI_CMD" ] && [ -z "$OCI_ENTRYPOINT" ]; then
        {{- if .PrependCmd }}
        if [ $# -eq 0 ]; then
            {{ .PrependCmd }}
        fi
        {{- end }}
        exec "$@"
    fi

    # ENTRYPOINT and CMD - run ENTRYPOINT with CMD as default args
    # override with user provided args
    {{- if .PrependEntrypoint }}
    if [ $# -gt 0 ]; then
        {{ .PrependEntrypoint }}
	else
        {{ .PrependCmd }}
        {{ .PrependEntrypoint }}
    fi
	{{- else if .PrependCmd }}
    if [ $# -eq 0 ]; then
        {{ .PrependCmd }}
    fi
    {{- end }}
    exec "$@"
fi

# Standard Apptainer behavior evaluates CMD / ENTRYPOINT / ARGS
# combination through shell before exec, and requires special quoting
# due to concatenation of CMDLINE_ARGS.
CMDLINE_ARGS=""
# prepare command line arguments for evaluation
for arg in "$@"; do
        CMDLINE_ARGS="${CMDLINE_ARGS} \"$arg\""
done

# ENTRYPOINT only - run entrypoint plus args
if [ -z "$OCI_CMD" ] && [ -n "$OCI_ENTRYPOINT" ]; then
    if [ $# -gt 0 ]; then
        SINGULARITY_OCI_RUN="${OCI_ENTRYPOINT} ${CMDLINE_ARGS}"
    else
        SINGULARITY_OCI_RUN="${OCI_ENTRYPOINT}"
    fi
fi

# CMD only - run CMD or override with args
if [ -n "$OCI_CMD" ] && [ -z "$OCI_ENTRYPOINT" ]; then
    if [ $# -gt 0 ]; then
        SINGULARITY_OCI_RUN="${CMDLINE_ARGS}"
    else
        SINGULARITY_OCI_RUN="${OCI_CMD}"
    fi
fi

# ENTRYPOINT and CMD - run ENTRYPOINT with CMD as default args
# override with user provided args
if [ $# -gt 0 ]; then
    SINGULARITY_OCI_RUN="${OCI_ENTRYPOINT} ${CMDLINE_ARGS}"
else
    SINGULARITY_OCI_RUN="${OCI_ENTRYPOINT} ${OCI_CMD}"
fi

# Evaluate shell expressions first and set arguments accordingly,
# then execute final command as first container process
eval "set ${SINGULARITY_OCI_RUN}"
exec "$@"
'''


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
        f"{SINGULARITY_D}/startscript": (_STARTSCRIPT.encode(), _SCRIPT),
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
        **{f"{SINGULARITY_D}/actions/{name}": (text.encode(), _SCRIPT) for name, text in _ACTIONS.items()},
        **{f"{SINGULARITY_D}/env/{name}": (text.encode(), _SCRIPT) for name, text in _ENV_SCRIPTS.items()},
        f"{SINGULARITY_D}/env/94-appsbase.sh": (b"", _SCRIPT),
    }


_ACTIONS = {"exec": _EXEC, "run": _RUN, "shell": _SHELL, "start": _START, "test": _TEST}
_ENV_SCRIPTS = {"01-base.sh": _ENV_01_BASE, "90-environment.sh": _ENV_90_ENVIRONMENT, "95-apps.sh": _ENV_95_APPS,
                "99-base.sh": _ENV_99_BASE, "99-runtimevars.sh": _ENV_99_RUNTIMEVARS}


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
    return head + render_template(_OCI_RUNSCRIPT_TEMPLATE, {"PrependCmd": prepend_cmd,
                                                            "PrependEntrypoint": prepend_entrypoint})


def render_template(template: str, data: Mapping[str, str]) -> str:
    """Go's text/template for what `ociRunscript` uses: {{ .Field }}, if / else if / else / end on string
    fields (true when not empty), and the `{{-` / `-}}` markers that trim the white space next to them."""
    items = _lex(template)
    output, position = _render(items, 0, data, emit=True)
    if position != len(items):
        raise ValueError("unbalanced template")
    return output


_ACTION = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.DOTALL)
_GO_SPACE = " \t\r\n"


def _lex(template: str) -> list[tuple[str, str]]:
    """[("text", ...), ("action", "if .X"), ...], with Go's trimming applied to the texts around actions."""
    items: list[tuple[str, str]] = []
    position, trim_next = 0, False
    for match in _ACTION.finditer(template):
        text = template[position:match.start()]
        if trim_next:
            text = text.lstrip(_GO_SPACE)
        if match.group(1):
            text = text.rstrip(_GO_SPACE)
        items.append(("text", text))
        items.append(("action", match.group(2)))
        position, trim_next = match.end(), bool(match.group(3))
    tail = template[position:]
    items.append(("text", tail.lstrip(_GO_SPACE) if trim_next else tail))
    return items


def _render(items: list[tuple[str, str]], position: int, data: Mapping[str, str], *, emit: bool) -> tuple[str, int]:
    """Output from `position` up to the else/end that closes the current block (its index returned)."""
    output: list[str] = []
    while position < len(items):
        kind, value = items[position]
        if kind == "text":
            output.append(value if emit else "")
            position += 1
        elif value.startswith("if "):
            text, position = _render_if(items, position, data, emit=emit)
            output.append(text)
        elif value == "end" or value == "else" or value.startswith("else if "):
            break
        elif value.startswith("."):
            output.append(data[value[1:]] if emit else "")
            position += 1
        else:
            raise ValueError(f"unsupported template action {value!r}")
    return "".join(output), position


def _render_if(items: list[tuple[str, str]], position: int, data: Mapping[str, str],
               *, emit: bool) -> tuple[str, int]:
    """An if/else if/else/end chain starting at `position`; returns its output and the index after `end`."""
    chosen = ""
    taken = False
    condition: str | None = items[position][1][len("if "):]
    position += 1
    while True:
        active = emit and not taken and (condition is None or bool(data[condition.lstrip(".")]))
        text, position = _render(items, position, data, emit=active)
        if active:
            chosen, taken = text, True
        action = items[position][1]
        position += 1
        if action == "end":
            return chosen, position
        condition = action[len("else if "):] if action.startswith("else if ") else None


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


# --- writing into a tree -------------------------------------------------------------------------------------------


def install(root: str | Tree, config: Mapping[str, Any], labels: Mapping[str, str], *,
            deffile: bytes | None = None) -> dict[str, int]:
    """Write Apptainer's directories, links and files into the extracted image `root` (a path or a Tree).

    Returns what it wrote or created, by path inside the image with links
    resolved (as singpy.oci.layers.Ownership keys them) -> its mode: an
    unprivileged conversion records those as root's, with these modes,
    over whatever a layer had recorded there.
    """
    files = singularity_files(config, labels=labels, deffile=deffile)
    tree = Tree(root) if isinstance(root, str) else root
    written: dict[str, int] = {}
    try:
        _skeleton(tree, written)
        if deffile is not None:
            _keep_old_deffile(tree, written)
        for guest, (content, mode) in files.items():
            written[_write_file(tree, guest, content, mode, written)] = mode
    except PathError as error:
        raise ImageError(f"can't write Apptainer's files into the image: {error.message}") from None
    except OSError as error:
        raise ImageError(f"can't write Apptainer's files into the image at {tree.root}: {error.strerror}") from None
    finally:
        if isinstance(root, str):
            tree.close()
    return written


def install_base(root: str) -> None:
    """Apptainer's base environment where the image `root` lacks it ([A] makeBaseEnv, overwrite false): the
    skeleton directories, the links, and the base files that are missing (an existing one is kept)."""
    written: dict[str, int] = {}
    with Tree(root) as tree:
        try:
            _skeleton(tree, written)
            for guest, (content, mode) in base_files().items():
                found = tree.lookup(guest)
                if found.fd is not None:
                    os.close(found.fd)
                    continue
                _write_file(tree, guest, content, mode, written)
        except PathError as error:
            raise ImageError(f"can't write Apptainer's files into the image: {error.message}") from None
        except OSError as error:
            raise ImageError(f"can't write Apptainer's files into the image at {root}: {error.strerror}") from None


def _skeleton(tree: Tree, written: dict[str, int]) -> None:
    """The root made writable by its owner, the skeleton directories and the links of [A] makeBaseEnv."""
    _owner_writable(tree)
    for guest in skeleton_dirs():
        _ensure_directory(tree, guest, keep_anything=not guest.startswith(SINGULARITY_D), written=written)
    for guest, target in singularity_links().items():
        _ensure_link(tree, guest.lstrip("/"), target)


def _owner_writable(tree: Tree) -> None:
    """[A] makeBaseEnv: a root directory its owner cannot write gets u+w."""
    mode = os.fstat(tree.fd).st_mode
    if not mode & stat.S_IWUSR:
        os.chmod(fd_path(tree.fd, tree.proc), stat.S_IMODE(mode) | stat.S_IWUSR)


def _ensure_directory(tree: Tree, guest: str, *, keep_anything: bool, written: dict[str, int]) -> None:
    """Create directory `guest` if missing. A mount point (keep_anything) is left as it is whatever it is, as
    Apptainer's Lstat check does; a directory of /.singularity.d must be one, to hold the files written next."""
    found = tree.lookup(guest, follow=not keep_anything)
    if found.fd is not None:
        is_directory = stat.S_ISDIR(os.fstat(found.fd).st_mode)
        os.close(found.fd)
        if keep_anything or is_directory:
            return
        raise ImageError(f"can't write Apptainer's files into the image: {guest}{_leads(guest, found)} is not a "
                         "directory")
    created = _created(found)
    os.close(tree.make(found, directory=True))
    _fix_directory_modes(tree, created, written)


def _created(found: Lookup) -> list[str]:
    """The paths `Tree.make(found)` is about to create, parents first (links resolved)."""
    parts = found.path.rstrip("/").split("/")
    base = "/".join(parts[:len(parts) - len(found.missing)]) or ""
    return [f"{base}/{'/'.join(found.missing[:count])}" for count in range(1, len(found.missing) + 1)]


def _fix_directory_modes(tree: Tree, paths: list[str], written: dict[str, int]) -> None:
    """Directories just made get 0755 whatever the umask ([A] makes them 0755 under its build's umask 002)."""
    for path in paths:
        found = tree.lookup(path, follow=False)
        if found.fd is None:
            raise ImageError(f"can't write Apptainer's files into the image: {path} vanished while written")
        try:
            if stat.S_ISDIR(os.fstat(found.fd).st_mode):
                os.chmod(fd_path(found.fd, tree.proc), 0o755)
                written[path] = 0o755
        finally:
            os.close(found.fd)


def _ensure_link(tree: Tree, name: str, target: str) -> None:
    """[A] base_environment.go `makeSymlink`: made if missing, remade if it leads elsewhere, a non-link kept."""
    try:
        mode = os.stat(name, dir_fd=tree.fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        os.symlink(target, name, dir_fd=tree.fd)
        return
    if not stat.S_ISLNK(mode) or os.readlink(name, dir_fd=tree.fd) == target:
        return
    os.unlink(name, dir_fd=tree.fd)
    os.symlink(target, name, dir_fd=tree.fd)


def _keep_old_deffile(tree: Tree, written: dict[str, int]) -> None:
    """[A] metadata.go `insertDefinition`: an image's own definition goes to bootstrap_history/ApptainerN."""
    found = tree.lookup(DEFFILE, follow=False)
    if found.fd is None:
        return
    os.close(found.fd)
    history = tree.lookup(HISTORY)
    if history.fd is None:
        created = _created(history)
        history.fd = tree.make(history, directory=True)
        _fix_directory_modes(tree, created, written)
    try:
        if not stat.S_ISDIR(os.fstat(history.fd).st_mode):
            raise ImageError(f"can't write Apptainer's files into the image: {HISTORY} is not a directory")
        count = len(os.listdir(fd_path(history.fd, tree.proc)))
        found = tree.lookup(DEFFILE, follow=False)  # again: a Tree holds a lookup's parent until the next one
        if found.fd is not None:
            os.close(found.fd)
            os.rename(found.name, f"Apptainer{count}", src_dir_fd=found.parent, dst_dir_fd=history.fd)
    finally:
        os.close(history.fd)


_WRITE = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def _write_file(tree: Tree, guest: str, content: bytes, mode: int, written: dict[str, int]) -> str:
    """`guest` (links followed inside the tree) holding `content` with `mode`: see the module's docstring.
    Returns the path written, links resolved."""
    found = tree.lookup(guest)
    path = found.path
    if found.fd is None:
        parents = _created(found)[:-1]
        fd = tree.make(found, directory=False)
        try:
            _fix_directory_modes(tree, parents, written)
        except BaseException:
            os.close(fd)
            raise
    else:
        try:
            info = os.fstat(found.fd)
            if stat.S_ISDIR(info.st_mode):
                raise ImageError(f"can't write Apptainer's files into the image: {guest}{_leads(guest, found)} is "
                                 "a directory")
            if stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
                # As [A] makeFile: the mode first, so that a file its owner may not write can be rewritten.
                os.chmod(fd_path(found.fd, tree.proc), mode)
        finally:
            os.close(found.fd)
        fd = _reopen_or_replace(found, info)
    try:
        os.fchmod(fd, mode)
        write_all(fd, content)
    finally:
        os.close(fd)
    return path


def _reopen_or_replace(found: Lookup, info: os.stat_result) -> int:
    """A descriptor to write the existing file through: itself, truncated, when it is a regular file with no
    other link; else (a FIFO, a device, a socket, a file linked elsewhere) a new file in its place."""
    if stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
        fd = os.open(found.name, _WRITE | os.O_TRUNC, dir_fd=found.parent)
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) == (info.st_dev, info.st_ino) and stat.S_ISREG(now.st_mode):
            return fd
        os.close(fd)
        raise ImageError(f"can't write Apptainer's files into the image: {found.path} changed while written")
    os.unlink(found.name, dir_fd=found.parent)
    return os.open(found.name, _WRITE | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=found.parent)


def _leads(guest: str, found: Lookup) -> str:
    return "" if found.path == guest else f" (it leads to {found.path})"
