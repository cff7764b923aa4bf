"""`cache clean --dry-run` counts what the clean itself removes (issue 26: it listed 7 entries, the clean
reported 8: the layer blobs were one line of the dry run and one entry each for the clean)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from singpy.oci import store


def test_dry_run_counts_what_the_clean_removes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from singpy.cli.main import main

    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    (cache / store.BLOBS).mkdir(parents=True)
    (cache / store.SIFS).mkdir(parents=True)
    for number in range(3):  # three layers of one pulled image
        (cache / store.BLOBS / f"{number:064x}").write_bytes(b"layer")
    digest = "ab" * 32
    (cache / store.SIFS / f"{digest}.sif").write_bytes(b"sif")
    (cache / store.SIFS / f"{digest}.json").write_text(json.dumps({"created": 1, "source": "docker://x"}))
    monkeypatch.setenv("SINGPY_CACHEDIR", str(cache))
    monkeypatch.setenv("HOME", str(tmp_path))

    assert main(["cache", "clean", "--dry-run"]) == 0
    planned = capsys.readouterr().out
    assert f"would remove 4 cache entries from {cache}\n" in planned, planned
    assert "would remove 3 layer blob(s)" in planned
    assert main(["cache", "clean", "--force"]) == 0
    done = capsys.readouterr().out
    assert re.search(r"^removed (\d+) cache entries", done, re.M).group(1) == "4", done  # type: ignore[union-attr]
    assert os.listdir(cache / store.BLOBS) == []
