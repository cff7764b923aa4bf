"""What `python -X importtime` printed, read by the import guards (tests/unit/test_hot_path_imports.py,
tests/integration/test_privileges.py): the names of the modules the last interpreter started imported."""

from __future__ import annotations


def module_names(stderr: str) -> list[str]:
    """The modules importtime lists in `stderr`: those of the last interpreter started (each prints its header
    first; tests.support.hostsim's wrapper, when a test needs it, is Python too, and execs singpy)."""
    modules: list[str] = []
    for line in stderr.splitlines():
        if line.startswith("import time:") and "imported package" in line:
            modules = []
        parts = line.removeprefix("import time:").split("|")
        if line.startswith("import time:") and len(parts) == 3 and parts[0].strip().isdigit():
            modules.append(parts[2].strip())
    return modules
