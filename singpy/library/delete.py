"""`singpy delete library://[HOST/]ENTITY/COLLECTION/CONTAINER[:TAG]`: an image removed from its library, as
Apptainer's `delete` does it (container-library-client's DeleteImage, with the token of the library's remote).

What goes is the image the tag names for one architecture (`--arch`, default this host's), with every tag
naming it; the library keeps the container and its other images.
"""

from __future__ import annotations

from collections.abc import Mapping

from singpy.library import client, endpoint, remotes
from singpy.library.ref import LibraryRef, parse
from singpy.library.remotes import RemoteError


def target(text: str) -> LibraryRef:
    """The reference a delete names (checked before anything is asked)."""
    return parse(text)


def delete(ref: LibraryRef, env: Mapping[str, str], home: str, *, arch: str, library: str, https: bool,
           timeout: float) -> str:
    """Remove `ref`'s image for `arch` from its library; the line that says so (Apptainer's words)."""
    lib = endpoint.choose(remotes.user_view(env, home), env, host=ref.host, library=library, https=https)
    if not lib.token:
        raise RemoteError(f"can't delete {ref}: no authentication token, log in with 'singpy remote login "
                          "--tokenfile FILE'")
    client.delete_image(lib, ref, arch, env, timeout)
    return f"Image {ref.name} ({arch}) deleted."
