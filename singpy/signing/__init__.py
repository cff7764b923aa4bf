"""Signed images: OpenPGP keyrings and keys (`keyring.py` reads them, `keystore.py` writes them), keyservers
(`hkp.py`), signature verification (`verify.py`) and the execution control list (`ecl.py` its rules,
`eclfile.py` its file, `eclrecord.py` the verdicts recorded in the caller's cache).

Leaves that know nothing of the launch: may import `image/` (SIF reading), `host/`, `config/` and the root;
the launch reaches `eclrecord.py`, then `ecl.py` if no record allows the image, only when an ecl.toml exists
beside the configuration in use.
"""
