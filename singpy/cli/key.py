"""`singpy key newpair|list|import|export|remove|search|pull|push`: Apptainer's OpenPGP keyrings
(cmd/internal/cli/key*.go) on singpy.signing.keystore, and its keyservers on singpy.signing.hkp.

Passphrases are read from the terminal, or from standard input when it is not one (one line each, as a script
pipes them); `--password` works but is visible to every user of the host, and says so.
"""

from __future__ import annotations

import sys

import typer

from singpy.cli.keysource import choose_keyserver

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from pysequoia import Cert

    from singpy.signing.keystore import Keyring

key_app = typer.Typer(name="key", help="Manage OpenPGP keys: your keyrings and the global one, and keyservers.",
                      no_args_is_help=True)

GLOBAL = typer.Option(False, "--global", "-g", help="manage global public keys (import/pull/remove are "
                      "restricted to the root user)")
KEYSDIR = typer.Option("", "--keysdir", "-d", metavar="DIR", help="set local keyring dir path, an alternative "
                       "way is to set environment variable 'APPTAINER_KEYSDIR'")
URL = typer.Option("", "--url", "-u", metavar="URL", help="specify the key server URL",
                   envvar=["SINGPY_URL", "APPTAINER_URL", "SINGULARITY_URL"], show_envvar=False)


def _keyring(global_: bool, keysdir: str, *, writing: bool = False) -> Keyring:
    import os

    from singpy.signing import keystore

    if global_:
        if writing and os.geteuid() != 0:
            raise keystore.KeystoreError("the global keyring can only be changed by root")
        return keystore.global_keyring(os.environ)
    return keystore.user_keyring(os.environ, keysdir)


def _ask(question: str) -> str:
    """One answer: from the terminal, or the next line of standard input."""
    sys.stderr.write(question)
    sys.stderr.flush()
    return sys.stdin.readline().rstrip("\r\n")


def ask_passphrase(prompt: str, *, confirm: bool = False) -> str:
    """A passphrase, never echoed: the terminal's (asked twice when `confirm`), or a line of standard input."""
    from singpy.errors import UsageError

    if not sys.stdin.isatty():
        return sys.stdin.readline().rstrip("\r\n")
    import getpass

    try:
        first = getpass.getpass(prompt, stream=sys.stderr)
        if confirm and getpass.getpass("Retype your passphrase : ", stream=sys.stderr) != first:
            raise UsageError("passphrases do not match")
    except EOFError:
        return ""
    return first


def warn_argv_password(value: str) -> None:
    if value:
        from singpy import console

        console.warning("a passphrase given on the command line is visible to other users of this host (ps, "
                        "/proc): leave --password out to be asked for it, or pipe it on standard input")


@key_app.command("newpair")
def newpair_command(
    name: str = typer.Option(None, "--name", "-N", help="key owner name"),
    email: str = typer.Option(None, "--email", "-E", help="key owner email"),
    comment: str = typer.Option(None, "--comment", "-C", help="key comment"),
    password: str = typer.Option(None, "--password", "-P", help="key password (visible to other users: prefer "
                                 "to be asked)"),
    push: bool = typer.Option(False, "--push", "-U", help="specify to push the public key to the remote keystore"),
    bit_length: int = typer.Option(4096, "--bit-length", "-b", help="specify key bit length"),
    keysdir: str = KEYSDIR) -> None:
    """Create a new key pair."""
    from singpy.signing import keystore

    keyring = _keyring(False, keysdir, writing=True)
    if bit_length not in keystore.BITS:
        raise keystore.KeystoreError(f"unsupported key bit length {bit_length}: choose 2048, 3072 or 4096")
    secrets, publics = keystore.load_secret(keyring), keystore.load_public(keyring)  # a bad keyring fails first
    name = _ask("Enter your name (e.g., John Doe) : ") if name is None else name
    email = _ask("Enter your email address (e.g., john.doe@example.com) : ") if email is None else email
    comment = _ask("Enter optional comment (e.g., development keys) : ") if comment is None else comment
    if password is None:
        password = ask_passphrase("Enter a passphrase : ", confirm=True)
    else:
        warn_argv_password(password)
    user_id = name.strip() + (f" ({comment.strip()})" if comment.strip() else "") + \
        (f" <{email.strip()}>" if email.strip() else "")
    if not user_id.strip():
        raise keystore.KeystoreError("a key needs a name or an email address")
    print("Generating Entity and OpenPGP Key Pair... ", end="", flush=True)
    key = keystore.generate(user_id, bit_length, password)
    keystore.store_secret(keyring, [*secrets, key])
    keystore.store_public(keyring, keystore.merged(publics, [key.extract_certificate()]))
    print("done")
    print(f"Key fingerprint: {keystore.fingerprint(key)}")
    if push:
        _push(key.extract_certificate(), "")


@key_app.command("list")
def list_command(secret: bool = typer.Option(False, "--secret", "-s", help="list private keys instead of the "
                                             "default which displays public ones",
                                             envvar=["SINGPY_SECRET", "APPTAINER_SECRET", "SINGULARITY_SECRET"],
                                             show_envvar=False),
                 global_: bool = GLOBAL, keysdir: str = KEYSDIR) -> None:
    """List keys in your local or in the global keyring."""
    from singpy.errors import UsageError
    from singpy.signing import keystore

    if secret and global_:
        raise UsageError("the global keyring holds public keys only: --secret and --global can't go together")
    keyring = _keyring(global_, keysdir)
    if secret:
        certs = [key.extract_certificate() for key in keystore.load_secret(keyring)]
        print(f"Private key listing ({keyring.secret_path}):\n")
    else:
        certs = keystore.load_public(keyring)
        print(f"Public key listing ({keyring.public_path}):\n")
    for index, cert in enumerate(certs):
        print(keystore.describe(index, cert))


@key_app.command("import")
def import_command(input_key: str = typer.Argument(..., metavar="<input-key>"), global_: bool = GLOBAL,
                   keysdir: str = KEYSDIR,
                   new_password: bool = typer.Option(False, "--new-password", help="set a new password to the "
                                                     "private key")) -> None:
    """Import a local key into the local or global keyring."""
    from singpy.signing import keystore

    keyring = _keyring(global_, keysdir, writing=True)
    publics, secrets = keystore.parse(_read_input(input_key), input_key)
    if secrets and global_:
        raise keystore.KeystoreError(f"{input_key} holds a secret key: the global keyring holds public keys only")
    if new_password:
        raise keystore.KeystoreError("--new-password: the OpenPGP library singpy uses (pysequoia 0.1.35) can't "
                                     "re-encrypt a secret key; change its passphrase with gpg or Apptainer")
    for key in secrets:
        if keystore.needs_passphrase(key):  # Apptainer asks, so that a key nobody can unlock is not kept
            keystore.check_passphrase(key, ask_passphrase(f"Enter your key passphrase for "
                                                          f"{keystore.fingerprint(key)} : "))
    if secrets:
        kept = [old for old in keystore.load_secret(keyring)
                if keystore.fingerprint(old) not in {keystore.fingerprint(key) for key in secrets}]
        keystore.store_secret(keyring, [*kept, *secrets])
        for key in secrets:
            print(f"Key with fingerprint {keystore.fingerprint(key)} successfully added to the private keyring")
    keystore.store_public(keyring, keystore.merged(keystore.load_public(keyring), publics))
    for cert in publics:
        print(f"Key with fingerprint {keystore.fingerprint(cert)} successfully added to the public keyring")


def _read_input(path: str) -> bytes:
    from singpy.signing import keystore

    data = keystore.read_file(path)
    if not data:
        raise keystore.KeystoreError(f"unable to get entity from: {path}: no such file, or empty")
    return data


@key_app.command("export")
def export_command(output_file: str = typer.Argument(..., metavar="<output-file>"),
                   secret: bool = typer.Option(False, "--secret", "-s", help="export a secret key"),
                   armor: bool = typer.Option(False, "--armor", "-a", help="ascii armored format"),
                   global_: bool = GLOBAL, keysdir: str = KEYSDIR) -> None:
    """Export a public or private key into a specific file."""
    import os

    from singpy.signing import keystore

    keyring = _keyring(global_, keysdir)
    keys: list[object] = list(keystore.load_secret(keyring) if secret else keystore.load_public(keyring))
    if not keys:
        raise keystore.KeystoreError(f"no {'private' if secret else 'public'} keys in {keyring.directory} to "
                                     "export")
    key = keys[_choose(keys, "private" if secret else "public")]
    data = str(key).encode() if armor else bytes(key)  # type: ignore[call-overload]
    keystore.write(os.path.abspath(output_file), data, 0o600 if secret else 0o644)
    print(f"{'Private' if secret else 'Public'} key with fingerprint {keystore.fingerprint(key)} "  # type: ignore[arg-type]
          f"correctly exported to file: {output_file}")


def _choose(keys: list[object], kind: str) -> int:
    """Apptainer's selectPubKey: the only key, or the number the user types after the listing."""
    from singpy.errors import UsageError
    from singpy.signing import keystore

    if len(keys) == 1:
        return 0
    for index, key in enumerate(keys):
        cert = key.extract_certificate() if hasattr(key, "extract_certificate") else key
        sys.stderr.write(keystore.describe(index, cert) + "\n")  # type: ignore[arg-type]
    answer = _ask(f"Enter # of {kind} key to use : ").strip()
    if not (answer.isascii() and answer.isdigit()) or int(answer) >= len(keys):
        raise UsageError(f"invalid key number {answer!r}: choose 0 to {len(keys) - 1}")
    return int(answer)


@key_app.command("remove")
def remove_command(fingerprint: str = typer.Argument(..., metavar="<fingerprint>"), global_: bool = GLOBAL,
                   keysdir: str = KEYSDIR,
                   public: bool = typer.Option(False, "--public", "-p", help="remove public keys only"),
                   secret: bool = typer.Option(False, "--secret", "-s", help="remove secret keys only"),
                   both: bool = typer.Option(False, "--both", "-b", help="remove both public and private keys")
                   ) -> None:
    """Remove a local public key from your local or the global keyring."""
    from singpy.signing import keystore

    keyring = _keyring(global_, keysdir, writing=True)
    query = fingerprint.upper().removeprefix("0X")
    if len(query) != 40:
        raise keystore.KeystoreError("please provide a full fingerprint (40 hex digits)")
    removed = []
    if both or (public and secret) or not secret:
        certs = keystore.load_public(keyring)
        if any(keystore.matches(cert, query) for cert in certs):
            keystore.store_public(keyring, [cert for cert in certs if not keystore.matches(cert, query)])
            removed.append(keyring.public_path)
    if (both or secret) and not global_:
        secrets = keystore.load_secret(keyring)
        if any(keystore.matches(key, query) for key in secrets):
            keystore.store_secret(keyring, [key for key in secrets if not keystore.matches(key, query)])
            removed.append(keyring.secret_path)
    if not removed:
        raise keystore.KeystoreError(f"no key matching given fingerprint {query} found")
    for path in removed:
        print(f"Key with fingerprint {query} removed from {path}")


@key_app.command("search")
def search_command(search_string: str = typer.Argument(..., metavar="<search_string>"), url: str = URL,
                   long_list: bool = typer.Option(False, "--long-list", "-l", help="output long list when "
                                                  "searching for keys")) -> None:
    """Search for keys on a key server."""
    from singpy.console import escape
    from singpy.signing import hkp

    server, auth = choose_keyserver(url)
    entries = hkp.search(server, search_string, auth=auth)
    print(f"Showing {len(entries)} results\n")
    if long_list:
        for entry in entries:
            print(f"Type bits/keyID     Date\n{escape(entry.algorithm)} {escape(entry.bits)}/"
                  f"{escape(entry.fingerprint)} {_date(entry.created)}")
            print("".join(f"    {escape(user)}\n" for user in entry.user_ids))
        return
    rows = [("FINGERPRINT", "ALGORITHM", "BITS", "CREATION DATE", "NAME/EMAIL")]
    for entry in entries:
        rows.append((escape(entry.fingerprint), escape(entry.algorithm), escape(entry.bits), _date(entry.created),
                     escape(entry.user_ids[0]) if entry.user_ids else ""))
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def _date(seconds: str) -> str:
    import time

    if not (seconds.isascii() and seconds.isdigit()):
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(int(seconds)))


@key_app.command("pull")
def pull_command(fingerprint: str = typer.Argument(..., metavar="<fingerprint>"), url: str = URL,
                 global_: bool = GLOBAL, keysdir: str = KEYSDIR) -> None:
    """Download a public key from a key server."""
    from singpy.signing import hkp, keystore

    keyring = _keyring(global_, keysdir, writing=True)
    server, auth = choose_keyserver(url)
    publics, _ = keystore.parse(hkp.fetch(server, fingerprint, auth=auth), f"the keyserver {server}'s answer")
    wanted = [cert for cert in publics if keystore.matches(cert, fingerprint)]  # the server is not trusted
    if not wanted:
        raise keystore.KeystoreError(f"unable to pull key from server: it answered with no key matching "
                                     f"{fingerprint.upper()}")
    known = {keystore.fingerprint(cert) for cert in keystore.load_public(keyring)}
    keystore.store_public(keyring, keystore.merged(keystore.load_public(keyring), wanted))
    count = sum(keystore.fingerprint(cert) not in known for cert in wanted)
    print(f"{count} key(s) added to keyring of trust {keyring.public_path}")


@key_app.command("push")
def push_command(fingerprint: str = typer.Argument(..., metavar="<fingerprint>"), url: str = URL,
                 global_: bool = GLOBAL, keysdir: str = KEYSDIR) -> None:
    """Upload a public key to a key server."""
    from singpy.signing import keystore

    certs = keystore.load_public(_keyring(global_, keysdir))
    if not certs:
        raise keystore.KeystoreError("no public keys in local store to choose from")
    query = fingerprint.upper().removeprefix("0X")
    if len(query) not in (16, 40):
        raise keystore.KeystoreError("please provide a keyid(16 chars) or a full fingerprint(40 chars)")
    cert = next((cert for cert in certs if keystore.matches(cert, query)), None)
    if cert is None:
        raise keystore.KeystoreError("could not find the requested key")
    _push(cert, url)


def _push(cert: Cert, url: str) -> None:
    from singpy import console
    from singpy.signing import hkp, keystore

    server, auth = choose_keyserver(url)
    answer = hkp.publish(server, str(cert), auth=auth)
    if answer:
        console.info(f"Key server response: {console.escape(answer[:500])}")
    print(f"public key `{keystore.fingerprint(cert)}' pushed to server successfully")
