"""The C part of singpy: singpy.kernel._native, the launch path's system calls (singpy/kernel/_native.c), and
singpy.oci._tlscheck, a cached tag's check over TLS on a thread of its own (singpy/oci/_tlscheck.c).

Everything else is declared in pyproject.toml. `optional=True`: where it can't be compiled (no compiler,
no Python or OpenSSL headers) the install goes on: singpy.kernel.syscalls makes the same calls through ctypes,
singpy.oci.quickhead the same check through `_ssl`.
"""

import json

from setuptools import Extension, setup

_FLAGS = ["-O2", "-Wall", "-Werror=implicit-function-declaration"]


def _python_ciphers() -> list[tuple[str, str]]:
    """The cipher string this interpreter's `_ssl` gives its contexts, for _tlscheck to give its own the same."""
    try:
        import _ssl
    except ImportError:
        return []  # no _ssl: the extension's build fails (#error), and quickhead has nothing to be faster than
    return [("PY_CIPHERS", json.dumps(_ssl._DEFAULT_CIPHERS))]  # a C string literal (ASCII)


setup(ext_modules=[Extension("singpy.kernel._native", ["singpy/kernel/_native.c"], optional=True,
                             extra_compile_args=_FLAGS),
                   # OpenSSL's headers only (libssl-dev): it links nothing, libssl is loaded on the check's thread.
                   Extension("singpy.oci._tlscheck", ["singpy/oci/_tlscheck.c", "singpy/oci/_tlscheck_tls.c"],
                             depends=["singpy/oci/_tlscheck.h"], optional=True,
                             extra_compile_args=[*_FLAGS, "-fvisibility=hidden"], define_macros=_python_ciphers())])
