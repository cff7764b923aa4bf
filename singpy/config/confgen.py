"""`singpy confgen [OLD] NEW`: a whole singpy.conf, with OLD's settings (Apptainer's hidden `confgen`).

Apptainer's (internal/pkg/confgen) writes its template with every directive
at the value OLD gives it, or at its default where OLD does not set it or
does not exist. Its packages run it to carry an administrator's settings into
a new release's file; here it moves them from Apptainer to singpy:

    singpy confgen /etc/apptainer/apptainer.conf /etc/singpy/singpy.conf

The template is the singpy.conf singpy ships (every directive at its default,
with its comment). OLD is read as singpy reads a configuration: a mistake in
it is the same one line, naming its file and line. Apptainer's directives
that mean nothing to singpy are not carried over (an INFO line names them),
just as a directive Apptainer's newer template lacks is dropped.

NEW is written whole or not at all by singpy.config.edit.rewrite, as `config
global` writes: a temporary file beside it, renamed over it. An existing NEW
keeps its mode and owner; a new one is made 0644 less the umask, as Apptainer's.
A NEW that is a symbolic link is refused: the rename would replace the link,
and writing through it would write a file the command was not given.
"""

from __future__ import annotations

import os

from singpy import console
from singpy.config import edit, sysconf
from singpy.errors import ConfigError
from singpy.host.hostfiles import shown


def generate(old: str | None) -> tuple[str, list[str]]:
    """The new file's text from OLD (None: every default), and the directives of OLD left out, in file order."""
    template_path = sysconf.shipped_path()
    if not template_path:
        raise ConfigError("the singpy.conf shipped with singpy is missing: no template to write the new file from")
    template = edit.ConfigFile(template_path)
    if old is None:
        return template.text(), []
    given = edit.ConfigFile(old)
    sysconf.parse("\n".join(given.lines), old)  # a mistake in OLD: its own line, before anything is written
    dropped: list[str] = []
    for name in given.names():
        directive = edit.known_directive(name)
        if directive is None:  # an Apptainer directive singpy ignores
            dropped.append(name)
        elif directive.kind == sysconf.LIST:
            template.replace(name, given.values(name), one_per_line=True)
        else:  # the first line counts, as when singpy reads OLD
            template.replace(name, [given.first(name)], one_per_line=False)
    text = template.text()
    sysconf.parse(text, "the generated file")  # what singpy writes, it reads back
    return text, dropped


def confgen(paths: list[str]) -> str:
    """`confgen [OLD] NEW`: NEW written; the closing line."""
    *before, new = paths
    old = before[0] if before else None
    if old is not None and not os.path.lexists(old):  # Apptainer's rule: an absent OLD means the defaults
        console.info(f"{shown(old)} does not exist: every directive at its default")
        old = None
    text, dropped = generate(old)
    edit.rewrite(new, text, create_mode=0o644)  # a symbolic link is refused there
    if dropped:
        console.info(f"not carried over (Apptainer directives singpy ignores): {', '.join(dropped)}")
    return f"wrote {shown(new)}" + (f" with the settings of {shown(old)}" if old else "")
