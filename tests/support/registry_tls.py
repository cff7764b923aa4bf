"""openssl for the test registries (a self-signed CA and server certificate, keys, signatures) and RegistryError."""

from __future__ import annotations

import subprocess
from pathlib import Path

OPENSSL = "/usr/bin/openssl"


class RegistryError(RuntimeError):
    """A server would not start, or a push failed (with what the tool said)."""


def openssl(*args: str, input: bytes | None = None) -> bytes:
    """openssl ARGS in a clean environment; its output (RegistryError with its message on failure)."""
    done = subprocess.run([OPENSSL, *args], input=input, capture_output=True, env={"PATH": "/usr/bin:/bin"})
    if done.returncode != 0:
        raise RegistryError(f"openssl {' '.join(args)} failed: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def make_tls(directory: Path) -> tuple[str, str, str]:
    """A self-signed CA and a server certificate for 127.0.0.1 / localhost signed by it (P-256 keys).

    Returns (ca_file, cert_file, key_file); ca_file is alone in directory/ca (skopeo's --cert-dir).
    """
    ca_dir = directory / "ca"
    ca_dir.mkdir(parents=True, exist_ok=True)
    for path in (directory, ca_dir):
        path.chmod(0o755)  # the CA certificate is for every client, the unprivileged test user's too
    ca_key, ca_file = directory / "ca.key", ca_dir / "ca.crt"
    key, csr, cert = directory / "server.key", directory / "server.csr", directory / "server.crt"
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(ca_key), "-out", str(ca_file), "-days", "7", "-subj", "/CN=singpy tests CA",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(key), "-out", str(csr), "-subj", "/CN=127.0.0.1")
    extensions = directory / "server.ext"
    extensions.write_text("basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                          "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n"
                          "authorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n")
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca_file), "-CAkey", str(ca_key), "-CAcreateserial",
             "-out", str(cert), "-days", "7", "-extfile", str(extensions))
    Path(ca_file).chmod(0o644)
    return str(ca_file), str(cert), str(key)
