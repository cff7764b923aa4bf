"""Apptainer's base environment as it embeds it: the action, env and start scripts and the OCI runscript template.

The texts are [A] internal/pkg/build/sources/*.sh (go:embed in
base_environment.go) and conveyorPacker_oci.go `ociRunscript`, verbatim
([A] = github.com/apptainer/apptainer, main); the files are Apptainer's,
BSD-licensed: their copyright lines are kept.
"""


# internal/pkg/build/sources/exec.sh
EXEC = r'''#!/bin/sh
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
RUN = r'''#!/bin/sh
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
SHELL = r'''#!/bin/sh
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
START = r'''#!/bin/sh
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
TEST = r'''#!/bin/sh
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
ENV_01_BASE = r'''#!/bin/sh
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
ENV_90_ENVIRONMENT = r'''#!/bin/sh
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
ENV_95_APPS = (
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
ENV_99_BASE = r'''#!/bin/sh
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
ENV_99_RUNTIMEVARS = (
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
STARTSCRIPT = r'''#!/bin/sh
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
OCI_RUNSCRIPT_TEMPLATE = r'''
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


ACTIONS = {"exec": EXEC, "run": RUN, "shell": SHELL, "start": START, "test": TEST}
ENV_SCRIPTS = {"01-base.sh": ENV_01_BASE, "90-environment.sh": ENV_90_ENVIRONMENT, "95-apps.sh": ENV_95_APPS,
                "99-base.sh": ENV_99_BASE, "99-runtimevars.sh": ENV_99_RUNTIMEVARS}
