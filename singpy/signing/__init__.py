"""Signed images: OpenPGP keyrings and keys (`keyring.py` reads them, `keystore.py` writes them), keyservers
(`hkp.py`), signature verification (`verify.py`) and the execution control list (`ecl.py`).

Leaves that know nothing of the launch: may import `image/` (SIF reading), `host/`, `config/` and the root;
the launch reaches `ecl.py` only when an ecl.toml exists beside the configuration in use.
"""
