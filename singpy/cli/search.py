"""`singpy search [--library URL] [--arch ARCH] [--signed] TEXT`: the images of a library whose names match,
printed as Apptainer's SearchLibrary prints them."""

from __future__ import annotations

import typer

from singpy.cli.pull import variables


def search_command(
    query: str = typer.Argument(..., metavar="TEXT", help="what to look for (at least 3 characters)"),
    library: str = typer.Option("", "--library", help="the library to search (default: the remote in use)",
                                metavar="URL", envvar=variables("LIBRARY"), show_envvar=False),
    arch: str = typer.Option("", "--arch", help="the architecture of the images (default: this host's)",
                             metavar="ARCH", envvar=variables("SEARCH_ARCH"), show_envvar=False),
    signed: bool = typer.Option(False, "--signed", help="signed images only", envvar=variables("SEARCH_SIGNED"),
                                show_envvar=False),
) -> None:
    """Search a library (library://) for container images whose names match TEXT."""
    from singpy.console import escape
    from singpy.errors import UsageError
    from singpy.host import host
    from singpy.image.sifscan import host_arch
    from singpy.library import client, endpoint, remotes

    if len(query) < 3:
        raise UsageError(f"bad query {query!r}: search for at least 3 characters")
    info = host.capture()
    arch = arch or host_arch()
    view = remotes.user_view(info.env, info.home)
    lib = endpoint.choose(view, info.env, host="", library=library, https=True)
    images = [image for image in client.search(lib, query, arch, signed, info.env).get("image") or []
              if isinstance(image, dict)]
    if not images:
        print(f"No container images found for {escape(arch)} matching {escape(query)!r}.\n")
        return
    items = sorted(_item(image) for image in images)
    print(f"Found {len(items)} container images for {escape(arch)} matching {escape(query)!r}:\n")
    print("\n\n".join(items))
    print()


def _item(image: dict[str, object]) -> str:
    """One image as Apptainer lists it; every field from the library escaped (a newline in it stays visible)."""
    from singpy.console import escape

    def field(key: str) -> str:
        return escape(str(image.get(key) or ""))

    tags = image.get("tags")
    spec = ",".join(escape(str(tag)) for tag in tags) if isinstance(tags, list) and tags else field("hash")
    item = f"\tlibrary://{field('entityName')}/{field('collectionName')}/{field('containerName')}:{spec}"
    if field("description") and field("description").lower() != "no description":
        item += f"\n\t\t{field('description')}"
    prints = image.get("fingerprints")
    if isinstance(prints, list) and prints:
        item += f"\n\t\tSigned by: {','.join(escape(str(one)) for one in prints)}"
    return item
