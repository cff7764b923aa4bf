"""Apptainer's hidden --docker-username, --docker-password and --tmpdir (pull, build, push, delete, the actions,
`instance start|run`, `overlay create`), as the variables every image path of singpy already reads.

The credentials are SINGPY_DOCKER_USERNAME/_PASSWORD (singpy.oci.auth: the image's own registry, never a
mirror's), the work directory SINGPY_TMPDIR (singpy.oci.store.work_dir). Each flag stands for one half, as in
Apptainer, where each is bound to its own variable: `--docker-username alice` with APPTAINER_DOCKER_PASSWORD set
is alice with that password (singpy.oci.auth alone pairs the halves of one prefix). The parsers read no variable
for these flags: without a flag, auth and store read the variables themselves, and their messages name the one
that was set (APPTAINER_TMPDIR, say).
"""

from __future__ import annotations

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from collections.abc import Mapping


def flag_variables(env: Mapping[str, str], *, username: str = "", password: str = "",
                   tmpdir: str = "") -> dict[str, str]:
    """The variables these flags' values stand for (none for a flag not given); a half of the credentials
    not given is the variables' (`env`)."""
    found: dict[str, str] = {}
    if username or password:
        found["SINGPY_DOCKER_USERNAME"] = username or _first(env, "USERNAME")
        found["SINGPY_DOCKER_PASSWORD"] = password or _first(env, "PASSWORD")
    if tmpdir:
        found["SINGPY_TMPDIR"] = tmpdir
    return found


def set_flag_variables(username: str, password: str, tmpdir: str) -> None:
    """The flags of a command that only pulls, builds, pushes or deletes, as this process's variables, which each
    of its image paths reads (a container it runs never sees them: singpy.env.environ passes no SINGPY_ one)."""
    if username or password or tmpdir:
        import os

        os.environ.update(flag_variables(os.environ, username=username, password=password, tmpdir=tmpdir))


def _first(env: Mapping[str, str], half: str) -> str:
    from singpy.oci.auth import ENV_PREFIXES

    return next((env[prefix + half] for prefix in ENV_PREFIXES if env.get(prefix + half)), "")
