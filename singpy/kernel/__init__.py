"""The only package that calls libc directly: through the C extension `_native` (built by `make setup`), or
through ctypes (`_libcalls`) where it was not built; `syscalls` wraps either."""
