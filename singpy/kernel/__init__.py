"""The only package that calls libc directly (through ctypes)."""
