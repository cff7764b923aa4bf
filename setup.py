"""The C part of singpy: singpy.kernel._native, the launch path's system calls (singpy/kernel/_native.c), and
singpy.oci._tlscheck, a cached tag's check over TLS in a helper process (singpy/oci/_tlscheck.c, the helper
program `_tlscheck_helper` beside it: singpy/oci/_tlscheck_helper.c and _tlscheck_tls.c).

Everything else is declared in pyproject.toml. All of it optional: where it can't be compiled (no compiler,
no Python or OpenSSL headers) the install goes on: singpy.kernel.syscalls makes the same calls through ctypes,
singpy.oci.quickhead the same check through `_ssl`.
"""

import json
import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError, LinkError

_FLAGS = ["-O2", "-Wall", "-Werror=implicit-function-declaration"]
_HELPER_SOURCES = ["singpy/oci/_tlscheck_helper.c", "singpy/oci/_tlscheck_tls.c"]


def _python_ciphers() -> list[tuple[str, str]]:
    """The cipher string this interpreter's `_ssl` gives its contexts, for the helper to give its own the same."""
    try:
        import _ssl
    except ImportError:
        return []  # no _ssl: the helper's build fails (#error), and quickhead has nothing to be faster than
    return [("PY_CIPHERS", json.dumps(_ssl._DEFAULT_CIPHERS))]  # a C string literal (ASCII)


class BuildExtAndHelper(build_ext):
    """build_ext, then the TLS check's helper program beside singpy.oci._tlscheck (optional, as the extensions:
    without it the module runs the check through `_ssl`)."""

    def run(self) -> None:
        super().run()
        directory = os.path.dirname(self.get_ext_fullpath("singpy.oci._tlscheck"))
        try:
            objects = self.compiler.compile(_HELPER_SOURCES, output_dir=self.build_temp, macros=_python_ciphers(),
                                            extra_postargs=_FLAGS, depends=["singpy/oci/_tlscheck.h"])
            self.compiler.link_executable(objects, "_tlscheck_helper", output_dir=directory,
                                          libraries=["ssl", "crypto"])
        except (CompileError, LinkError) as error:
            self.warn(f"singpy/oci/_tlscheck_helper not built ({error}): a cached tag's check over TLS runs "
                      "through _ssl, on the launcher's thread")


setup(cmdclass={"build_ext": BuildExtAndHelper},
      ext_modules=[Extension("singpy.kernel._native", ["singpy/kernel/_native.c"], optional=True,
                             extra_compile_args=_FLAGS),
                   # Nothing of OpenSSL: the helper program links libssl (libssl-dev).
                   Extension("singpy.oci._tlscheck", ["singpy/oci/_tlscheck.c"], depends=["singpy/oci/_tlscheck.h"],
                             optional=True, extra_compile_args=[*_FLAGS, "-fvisibility=hidden"])])
