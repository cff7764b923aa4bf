"""The C part of singpy: singpy.kernel._native, the launch path's system calls (singpy/kernel/_native.c).

Everything else is declared in pyproject.toml. `optional=True`: where it can't be compiled (no compiler,
no Python headers) the install goes on and singpy.kernel.syscalls makes the same calls through ctypes.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("singpy.kernel._native", ["singpy/kernel/_native.c"], optional=True,
                             extra_compile_args=["-O2", "-Wall", "-Werror=implicit-function-declaration"])])
