"""`singpy sign IMAGE.sif`: add signatures to a SIF, as Apptainer's `sign`.

`--key PRIVATE.pem` signs with a PEM private key (RSA, ECDSA, Ed25519) in a DSSE envelope;
otherwise an OpenPGP key of the user's secret keyring (`pgp-secret`) signs a clear-signed
message: `--keyidx N` (the index of `singpy key list --secret`), else the only key, else the
user picks one. A passphrase (a locked OpenPGP key, an encrypted PEM file) is read as Apptainer
reads it: from the terminal without echo, or one line from standard input when that is not a
terminal; never from the command line.
"""

from __future__ import annotations

import typer

from singpy.cli.pull import variables

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from collections.abc import Callable

    from pysequoia import Cert

IMAGE = typer.Argument(..., metavar="IMAGE.sif", show_default=False, help="the SIF image to sign")


def sign_command(
    image: str = IMAGE,
    group_id: int = typer.Option(0, "--group-id", "-g", min=0, max=0x0FFFFFFF, metavar="N", show_default=False,
                                 help="sign objects with the specified group ID"),
    sif_id: int = typer.Option(0, "--sif-id", "-i", min=0, max=0xFFFFFFFF, metavar="N", show_default=False,
                               help="sign object with the specified ID"),
    key: str = typer.Option("", "--key", metavar="FILE", envvar=variables("SIGN_KEY"), show_envvar=False,
                            help="path to the private key file"),
    keyidx: int | None = typer.Option(None, "--keyidx", "-k", min=0, metavar="N", show_default=False,
                               help="PGP private key to use (index from 'key list --secret')"),
    sign_all: bool = typer.Option(False, "--all", "-a", help="sign all objects (the default: every object group)"),
    old_group_id: int = typer.Option(0, "--groupid", min=0, max=0x0FFFFFFF, hidden=True),
    old_sif_id: int = typer.Option(0, "--id", min=0, max=0xFFFFFFFF, hidden=True),
) -> None:
    """Add a cryptographic signature to a SIF image (an OpenPGP key of the keyring, or a PEM private key)."""
    from singpy import console
    from singpy.cli.verify import deprecated_ids
    from singpy.errors import SingpyError
    from singpy.signing import sign

    del sign_all  # every group is signed unless a group or an object is named, as Apptainer 1.5 does
    group_id, sif_id = deprecated_ids(group_id, sif_id, old_group_id, old_sif_id)
    groups = [group_id] if group_id else []
    objects = [sif_id] if sif_id else []
    try:
        if key:
            console.info(f"Signing image with key material from '{key}'")
            message, fingerprint = _pem_signer(key), b""
        else:
            console.info("Signing image with PGP key material")
            message, fingerprint = _pgp_signer(keyidx)
        sign.sign_image(image, message, fingerprint=fingerprint, groups=groups, objects=objects)
    except SingpyError as e:
        prefix = "Failed to load key material: " if key and "key material" not in e.message else ""
        raise SingpyError(f"Failed to sign container: {prefix}{e.message}") from None
    console.info(f"Signature created and applied to image '{image}'")


def read_passphrase(prompt: str) -> str:
    """From the terminal without echo, else one line of standard input (Apptainer's AskQuestionNoEcho)."""
    import sys

    if sys.stdin is not None and sys.stdin.isatty():
        import getpass

        return getpass.getpass(prompt)
    print(prompt, flush=True)  # Apptainer prints its question either way, on stdout
    line = sys.stdin.readline() if sys.stdin is not None else ""
    return line.rstrip("\r\n")


def _pem_signer(path: str) -> Callable[[bytes], bytes]:
    from singpy.signing import dsse

    private = dsse.load_private_key(path, lambda: read_passphrase("Enter password for private key: ").encode())
    return lambda metadata: dsse.sign_envelope(metadata, private)


def _pgp_signer(keyidx: int | None) -> tuple[Callable[[bytes], bytes], bytes]:
    from singpy.errors import SingpyError
    from singpy.signing import keyring, pgp

    certs = [c for c in keyring.secret_certs() if c.has_secret_keys]
    if not certs:
        raise SingpyError(f"keyring is empty (no secret key in {keyring.secret_path()}; see 'singpy key newpair')")
    if keyidx is not None:
        if keyidx >= len(certs):
            raise SingpyError("index out of range")
        cert = certs[keyidx]
    else:
        cert = certs[0] if len(certs) == 1 else _choose(certs)
    tsk = pgp.secret_part(cert)
    passphrase = read_passphrase("Enter key passphrase : ") if pgp.needs_passphrase(tsk) else None
    fingerprint = bytes.fromhex(keyring.fingerprint(cert))
    return (lambda metadata: pgp.clearsign(metadata, tsk, passphrase)), fingerprint


def _choose(certs: list[Cert]) -> Cert:
    """Apptainer's list of keys and question, answered on the terminal or standard input."""
    import sys

    from singpy.console import escape
    from singpy.errors import SingpyError
    from singpy.signing import keyring

    for i, cert in enumerate(certs):
        print(f"{i}) U: {escape(keyring.primary_name(cert))}")
        print(f"   F: {keyring.fingerprint(cert)}")
        print("   --------")
    print("Enter # of private key to use : ", end="", flush=True)
    answer = sys.stdin.readline().strip() if sys.stdin is not None else ""
    if not (answer.isascii() and answer.isdigit()) or int(answer) >= len(certs):
        raise SingpyError(f"invalid key number {answer[:20]!r}: enter a number from 0 to {len(certs) - 1}")
    return certs[int(answer)]
