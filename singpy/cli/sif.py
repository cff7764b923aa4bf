"""`singpy sif` (alias `siftool`): list, info, dump, header, new, add, del, setprim, as Apptainer's `sif`.

Apptainer embeds the reference siftool as `apptainer sif`; its arguments,
flags and output formats are kept (singpy.image.siftool formats them, on
singpy's reader singpy.image.sif; the edits are singpy.image.sifwrite's, which
writes byte for byte what the reference library writes).
"""

from __future__ import annotations

import typer

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from singpy.image.sif import Descriptor, SifImage

_SUMMARY = "Manipulate Singularity Image Format (SIF) images."
sif_app = typer.Typer(name="sif", help=_SUMMARY, no_args_is_help=True)
siftool_app = typer.Typer(name="siftool", help="The same as `singpy sif`.", no_args_is_help=True)

_ID = typer.Argument(..., metavar="ID", help="a data object's ID (see `sif list`)", min=1, max=0xFFFFFFFF)
_PATH = typer.Argument(..., metavar="SIF_PATH", help="the SIF image")


def _read(path: str) -> SifImage:
    from singpy.image.sif import read_sif

    return read_sif(path)


def header_command(path: str = _PATH) -> None:
    """Display the global header of a SIF image."""
    from singpy.image.siftool import header_text

    print(header_text(_read(path)), end="")


def list_command(path: str = _PATH) -> None:
    """List the data objects of a SIF image."""
    from singpy.image.siftool import list_text

    print(list_text(_read(path)), end="")


def info_command(object_id: int = _ID, path: str = _PATH) -> None:
    """Display the details of one data object of a SIF image."""
    from singpy.image.siftool import find_descriptor, info_text

    print(info_text(find_descriptor(_read(path), object_id)), end="")


def dump_command(object_id: int = _ID, path: str = _PATH) -> None:
    """Write a data object of a SIF image to standard output (escaped when that is a terminal)."""
    from singpy.image.siftool import find_descriptor

    image = _read(path)
    _copy_out(image.path, find_descriptor(image, object_id))


def _copy_out(path: str, desc: Descriptor) -> None:
    """The object's bytes, streamed; on a terminal as text with control characters escaped (they are the file's)."""
    import sys

    from singpy.console import escape
    from singpy.errors import SifError

    offset, left = desc.offset, desc.size
    terminal = sys.stdout.isatty()
    sys.stdout.flush()
    try:
        with open(path, "rb") as source:
            source.seek(offset)
            while left > 0:
                chunk = source.read(min(left, 1 << 20))
                if not chunk:
                    raise SifError(f"corrupt SIF {path}: object {desc.id} is truncated")
                left -= len(chunk)
                if terminal:
                    sys.stdout.write(escape(chunk.decode(errors="replace"), "\n\t"))
                else:
                    sys.stdout.buffer.write(chunk)
    except OSError as error:
        raise SifError(f"can't read {path}: {error.strerror}") from None
    sys.stdout.flush()


def new_command(path: str = _PATH) -> None:
    """Create a new, empty SIF image (a random ID, the current time, no launch script)."""
    from singpy.image.sifwrite import create_sif

    create_sif(path, [], launch_script="")  # the reference's CreateContainerAtPath sets none


def add_command(
    path: str = _PATH,
    source: str = typer.Argument(..., metavar="OBJECT_PATH", help="the file whose bytes become the object"),
    datatype: int = typer.Option(0, "--datatype", help="the type of data to add [NEEDED]: 1-Deffile, 2-EnvVar, "
                                 "3-Labels, 4-Partition, 5-Signature, 6-GenericJSON, 7-Generic, 8-CryptoMessage, "
                                 "9-SBOM"),
    parttype: int = typer.Option(0, "--parttype", help="with --datatype 4: 1-System, 2-PrimSys, 3-Data, 4-Overlay"),
    partfs: int = typer.Option(0, "--partfs", help="with --datatype 4: 1-Squash, 2-Ext3, 3-ImmuObj, 4-Raw"),
    partarch: int = typer.Option(0, "--partarch", help="with --datatype 4: 1-386, 2-amd64, 3-arm, 4-arm64, "
                                 "5-ppc64, 6-ppc64le, 7-mips, 8-mipsle, 9-mips64, 10-mips64le, 11-s390x, 12-riscv64"),
    signhash: int = typer.Option(0, "--signhash", help="with --datatype 5: 1-SHA256, 2-SHA384, 3-SHA512, "
                                 "4-BLAKE2s_256, 5-BLAKE2b_256"),
    signentity: str = typer.Option("", "--signentity", help="with --datatype 5: the signer's fingerprint (hex)"),
    sbomformat: str = typer.Option("", "--sbomformat", help="with --datatype 9: cyclonedx-json, cyclonedx-xml, "
                                   "github-json, spdx-json, spdx-rdf, spdx-tag-value, spdx-yaml, syft-json"),
    groupid: int = typer.Option(0, "--groupid", help="set groupid [default: 0]"),
    link: int = typer.Option(0, "--link", help="set link pointer [default: 0]"),
    alignment: int = typer.Option(0, "--alignment", help="set alignment [default: 4096 with --datatype "
                                  "4-Partition, 0 otherwise]"),
    filename: str = typer.Option("", "--filename", help="set logical filename/handle [default: input filename]"),
) -> None:
    """Add a data object to a SIF image."""
    from singpy.image.siftool import AddFlags, add_options
    from singpy.image.sifwrite import add_object

    flags = AddFlags(datatype=datatype, parttype=parttype, partfs=partfs, partarch=partarch, signhash=signhash,
                     signentity=signentity, sbomformat=sbomformat, groupid=groupid, link=link, alignment=alignment,
                     filename=filename)
    obj = add_options(flags, source)
    _read(path)  # a SIF at all, checked before its file is opened for writing
    add_object(path, obj)


def del_command(object_id: int = _ID, path: str = _PATH) -> None:
    """Delete a data object from a SIF image."""
    from singpy.image.sifwrite import delete_object

    delete_object(path, object_id)


def setprim_command(object_id: int = _ID, path: str = _PATH) -> None:
    """Set the primary system partition of a SIF image."""
    from singpy.image.sifwrite import set_primary_partition

    set_primary_partition(path, object_id)


for _group in (sif_app, siftool_app):
    _group.command("header")(header_command)
    _group.command("list")(list_command)
    _group.command("info")(info_command)
    _group.command("dump")(dump_command)
    _group.command("new")(new_command)
    _group.command("add")(add_command)
    _group.command("del")(del_command)
    _group.command("setprim")(setprim_command)
