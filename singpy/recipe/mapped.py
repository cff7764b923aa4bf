"""Host programs run as root of the build's fakeroot user namespace.

After an unprivileged %post with subordinate ids, the stage's files belong
to host ids the user cannot act on as themselves (a 0700 directory of uid
100000+99, say). The user can, as root of a user namespace with the same
mapping: so removing a work directory, copying `%files from` another stage
and squashing the result run through `python -m singpy.recipe.mapped`,
which enters such a namespace and execs the program. Owners then read as
the ids inside (0, 4242...), which is what the image must record.
"""

from __future__ import annotations

import sys

from singpy.plan import IdMap

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from typing import NoReturn


def command(idmap: IdMap) -> list[str]:
    """The argv prefix that runs what follows it as root of a namespace mapped by `idmap`."""
    return [sys.executable, "-P", "-m", "singpy.recipe.mapped", "--helper" if idmap.helper else "--self",
            encode(idmap.uids), encode(idmap.gids), "--"]


def encode(lines: tuple[tuple[int, int, int], ...]) -> str:
    return ",".join(":".join(str(number) for number in line) for line in lines)


def decode(text: str) -> tuple[tuple[int, int, int], ...]:
    lines = []
    for item in text.split(","):
        inside, outside, count = (int(number) for number in item.split(":"))
        lines.append((inside, outside, count))
    return tuple(lines)


def main(argv: list[str]) -> NoReturn:
    from singpy.kernel import syscalls as k
    from singpy.layers import fakeroot
    from singpy.recipe.entry import exec_or_report

    mode, uids, gids, separator, *program = argv
    if separator != "--" or not program:
        raise SystemExit("usage: python -m singpy.recipe.mapped --helper|--self UIDS GIDS -- PROGRAM [ARGS...]")
    idmap = IdMap(uids=decode(uids), gids=decode(gids), helper=mode == "--helper", note="")
    exec_or_report(lambda: fakeroot.enter_user_namespace(idmap, k.CLONE_NEWUSER), program, search_path=True)


if __name__ == "__main__":
    main(sys.argv[1:])
