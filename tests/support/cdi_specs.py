"""CDI spec files where a test's singpy reads them (--cdi-dirs), for the --device tests (tests/gpu/test_cdi.py,
test_cdi_untrusted.py): a directory of the test's own, named for it and the profile, holding one spec."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import Singpy


def cdi_spec_dir(singpy: Singpy, name: str, text: str, suffix: str = "yaml") -> Path:
    """A directory of this test's own with one spec file."""
    directory = singpy.workdir / f"cdi-{name}-{singpy.profile}"
    directory.mkdir(exist_ok=True)
    directory.chmod(0o755)
    (directory / f"spec.{suffix}").write_text(text)
    return directory
