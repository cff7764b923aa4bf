"""`singpy verify IMAGE.sif`: check a SIF's signatures, as Apptainer's `verify` (its flags, output and JSON).

Key material, as Apptainer chooses it: `--certificate` (with `--certificate-intermediates`,
`--certificate-roots`), else `--key PUBLIC.pem`, else the OpenPGP keyrings (the user's
`pgp-public` and the global `global-pgp-public`) and, unless `--local`, the keyserver (`--url`,
else the first of the remote in use) asked for a signer no keyring holds: its key serves that
verification only ([REMOTE]), it is not imported. Each signature's outcome is printed as it is
checked; the first bad one is a `FATAL:` line and exit status 255.
"""

from __future__ import annotations

import typer

from singpy.cli.keysource import from_keyserver
from singpy.cli.pull import variables

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from singpy.signing.verify import KeyMaterial, SignatureResult

IMAGE = typer.Argument(..., metavar="IMAGE.sif", show_default=False, help="the SIF image to verify")
GROUP_ID = typer.Option(0, "--group-id", "-g", min=0, max=0x0FFFFFFF, metavar="N", show_default=False,
                        help="verify objects with the specified group ID")
SIF_ID = typer.Option(0, "--sif-id", "-i", min=0, max=0xFFFFFFFF, metavar="N", show_default=False,
                      help="verify object with the specified ID")


def verify_command(
    image: str = IMAGE,
    group_id: int = GROUP_ID,
    sif_id: int = SIF_ID,
    url: str = typer.Option("", "--url", "-u", metavar="URL", envvar=variables("URL"), show_envvar=False,
                            help="specify a URL for a key server"),
    certificate: str = typer.Option("", "--certificate", metavar="FILE", envvar=variables("VERIFY_CERTIFICATE"),
                                    show_envvar=False, help="path to the certificate"),
    intermediates: str = typer.Option("", "--certificate-intermediates", metavar="FILE",
                                      envvar=variables("VERIFY_INTERMEDIATES"), show_envvar=False,
                                      help="path to pool of intermediate certificates"),
    roots: str = typer.Option("", "--certificate-roots", metavar="FILE", envvar=variables("VERIFY_ROOTS"),
                              show_envvar=False, help="path to pool of root certificates"),
    ocsp: bool = typer.Option(False, "--ocsp-verify", envvar=variables("VERIFY_OCSP"), show_envvar=False,
                              help="enable online revocation check for certificates"),
    key: str = typer.Option("", "--key", metavar="FILE", envvar=variables("VERIFY_KEY"), show_envvar=False,
                            help="path to the public key file"),
    local: bool = typer.Option(False, "--local", "-l", envvar=variables("LOCAL_VERIFY"), show_envvar=False,
                               help="only verify with local key(s) in keyring"),
    as_json: bool = typer.Option(False, "--json", "-j", help="output json"),
    verify_all: bool = typer.Option(False, "--all", "-a", help="verify all objects"),
    legacy: bool = typer.Option(False, "--legacy-insecure", help="enable verification of (insecure) legacy signatures"),
    old_group_id: int = typer.Option(0, "--groupid", min=0, max=0x0FFFFFFF, hidden=True),
    old_sif_id: int = typer.Option(0, "--id", min=0, max=0xFFFFFFFF, hidden=True),
) -> None:
    """Verify the cryptographic signatures of a SIF image (OpenPGP keys, public keys or X.509 certificates)."""
    from singpy import console
    from singpy.signing import verify

    group_id, sif_id = deprecated_ids(group_id, sif_id, old_group_id, old_sif_id)
    material = _material(certificate, intermediates, roots, ocsp, key)
    if material.local_certs is not None and not local:
        _check_url(url)
        material = material._replace(fetch=from_keyserver(url))
    options = {"groups": [group_id] if group_id else [], "objects": [sif_id] if sif_id else [],
               "legacy": legacy, "all_objects": verify_all}
    if as_json:
        _verify_json(image, material, options)
        return
    try:
        verify.verify(image, material, on_result=_print_result, **options)  # type: ignore[arg-type]
    except Exception as e:
        _fail(e)
    console.info(f"Verified signature(s) from image '{image}'")


def deprecated_ids(group_id: int, sif_id: int, old_group_id: int, old_sif_id: int) -> tuple[int, int]:
    """Apptainer's deprecated `--groupid` and `--id`, still accepted with its warning."""
    from singpy import console

    if old_group_id:
        console.warning("--groupid is deprecated, use '--group-id'")
    if old_sif_id:
        console.warning("--id is deprecated, use '--sif-id'")
    return group_id or old_group_id, sif_id or old_sif_id


def _fail(error: Exception) -> None:
    from singpy.errors import SingpyError

    if isinstance(error, SingpyError):
        raise SingpyError(f"Failed to verify container: {error.message}") from None
    if isinstance(error, OSError):
        raise SingpyError(f"Failed to verify container: {error.strerror}: {error.filename}") from None
    raise error


def _material(certificate: str, intermediates: str, roots: str, ocsp: bool, key: str) -> KeyMaterial:
    from singpy import console
    from singpy.errors import SingpyError
    from singpy.signing import dsse, verify

    if certificate:
        console.info(f"Verifying image with key material from certificate '{certificate}'")
        from singpy.signing.ocsp import OcspError
        from singpy.signing.x509chain import CertificateError

        try:
            public, chain = dsse.certificate_key(certificate, intermediates or None, roots or None, ocsp=ocsp)
        except (CertificateError, OcspError) as e:  # loaded, but no chain to a root: Apptainer fails verifying
            raise SingpyError(f"Failed to verify container: {e.message}") from None
        except SingpyError as e:
            raise SingpyError(f"Failed to load certificate: {e.message}") from None
        return verify.KeyMaterial(keys=(public,), key_kind="certificate", key_label=chain)
    if key:
        console.info(f"Verifying image with key material from '{key}'")
        try:
            return verify.KeyMaterial(keys=(dsse.load_public_key(key),))
        except SingpyError as e:
            raise SingpyError(f"Failed to load key material: {e.message}") from None
    console.info("Verifying image with PGP key material")
    return verify.pgp_material()


def _check_url(url: str) -> None:
    """A `--url` that names no keyserver fails before anything is verified, as Apptainer's client config does."""
    from singpy.errors import SingpyError
    from singpy.signing import hkp

    if url:
        try:
            hkp.normalize(url)
        except hkp.KeyserverError as e:
            raise SingpyError(f"Error while getting keyserver client config: {e.message}") from None


def _type_name(datatype: int) -> str:
    from singpy.image.sif import TYPE_NAMES

    return TYPE_NAMES.get(datatype, "Unknown")


def _print_result(result: SignatureResult) -> None:
    from singpy.console import escape
    from singpy.image.sif import GROUP_MASK, ID_MASK

    signer = result.signer
    if signer is not None and signer.kind == "pgp":
        prefix = f"[{signer.keyring or 'REMOTE'}]"
        print(f"{prefix:<18} Signing entity: {escape(signer.name)}")
        print(f"{prefix:<18} Fingerprint: {signer.fingerprint}")
    elif signer is not None:
        label = "[CERTIFICATE]" if signer.kind == "certificate" else "[KEY]"
        print(f"{label:<18} Signing {signer.kind}: {escape(signer.name)}")
        print(f"{label:<18} Key ID: {signer.fingerprint}")
    elif result.claimed_fingerprint:
        print(f"{'[UNKNOWN]':<18} Fingerprint: {result.claimed_fingerprint} (not in the keyrings)")
    if result.verified:
        print("Objects verified:")
        print(f"{'ID':<4}|{'GROUP':<8}|{'LINK':<8}|TYPE")
        print("------------------------------------------------")
    for raw in result.verified:
        group = str(raw.group_id & ID_MASK) if raw.group_id & ID_MASK else "NONE"
        link = "NONE"
        if raw.link:
            link = f"{raw.link & ID_MASK} (G)" if raw.link & GROUP_MASK == GROUP_MASK else str(raw.link)
        print(f"{raw.id:<4}|{group:<8}|{link:<8}|{_type_name(raw.datatype)}")
    if result.error is not None:
        print(f"\nError encountered during signature verification: {escape(result.error.message)}")


def _verify_json(image: str, material: KeyMaterial, options: dict[str, object]) -> None:
    """Apptainer's `--json`: {"Signatures": n, "SignerKeys": [{"Signer": {...}}, ...]}, then the failure if any."""
    import json

    from singpy.signing import sifsig, verify

    document: dict[str, object] = {"Signatures": 0, "SignerKeys": []}
    keys: list[dict[str, object]] = []

    def collect(result: SignatureResult) -> None:
        document["Signatures"] = int(str(document["Signatures"])) + 1
        signer = result.signer
        name, fingerprint, local, checked = "unknown", "", False, False
        if signer is not None and signer.kind == "pgp":
            name, fingerprint, local, checked = signer.name, signer.fingerprint.lower(), signer.keyring == "LOCAL", True
        entry = {"Name": name, "Fingerprint": fingerprint, "KeyLocal": local, "KeyCheck": checked}
        for raw in result.verified:
            keys.append({"Signer": {"Partition": _type_name(raw.datatype), **entry, "DataCheck": True}})
        error = result.error
        if isinstance(error, sifsig.IntegrityError) and error.object_id:
            datatype = next((d.datatype for d in sifsig.load(image).used if d.id == error.object_id), 0)
            keys.append({"Signer": {"Partition": _type_name(datatype), **entry, "DataCheck": False}})

    failure: Exception | None = None
    try:
        verify.verify(image, material, on_result=collect, **options)  # type: ignore[arg-type]
    except Exception as e:
        failure = e
    document["SignerKeys"] = keys or None
    print(json.dumps(document, indent=2))
    if failure is not None:
        _fail(failure)
