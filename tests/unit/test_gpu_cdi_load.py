"""singpy.gpu.cdiload: any YAML a CDI spec may be written in, and the three things it refuses (with the line)."""

from __future__ import annotations

import pytest

from singpy.gpu import cdiload

# As the CDI project's own examples write specs: flow sequences and mappings, block scalars, comments.
FLOW = """cdiVersion: "0.6.0"
kind: "vendor.com/device"
devices:
  - name: "myDevice"
    containerEdits:
      deviceNodes:
        - {path: "/dev/card1", type: "c", major: 25, minor: 25, fileMode: 384, permissions: "rw", uid: 1000}
      mounts: [{hostPath: /bin/vendorBin, containerPath: /bin/vendorBin, options: [ro, nosuid, nodev, bind]}]
containerEdits:
  env: [FOO=VALID_SPEC, BAR=BARVALUE1]
  hooks:
    - hookName: createContainer
      path: >-
        /bin/vendor-hook
"""


def test_flow_collections_and_block_scalars() -> None:
    data = cdiload.loads(FLOW)
    assert isinstance(data, dict)
    device = data["devices"][0]["containerEdits"]
    assert device["deviceNodes"] == [{"path": "/dev/card1", "type": "c", "major": 25, "minor": 25, "fileMode": 384,
                                      "permissions": "rw", "uid": 1000}]
    assert device["mounts"][0]["options"] == ["ro", "nosuid", "nodev", "bind"]
    assert data["containerEdits"]["env"] == ["FOO=VALID_SPEC", "BAR=BARVALUE1"]
    assert data["containerEdits"]["hooks"][0]["path"] == "/bin/vendor-hook"
    assert cdiload.loads("") is None


@pytest.mark.parametrize(("text", "line", "message"), [
    ("a: 1\nb: 2\na: 3\n", 3, "the key 'a' is given twice"),
    ("a:\n  - {x: 1, x: 2}\n", 2, "the key 'x' is given twice"),
    ("a: &anchor [1]\nb: *anchor\n", 1, "anchors and aliases"),
    ("a: " + "[" * 65 + "]" * 65 + "\n", 1, "nested deeper than 64 levels"),
    ("a: !!python/object:os.system {}\n", 1, "could not determine a constructor"),
    ("a: 1\n---\nb: 2\n", 2, "expected a single document"),
    ("a: [1, 2\n", 2, "expected ',' or ']'"),
], ids=["duplicate", "duplicate-flow", "alias", "deep", "python-tag", "two-documents", "unclosed"])
def test_refused_with_line(text: str, line: int, message: str) -> None:
    with pytest.raises(cdiload.SpecError) as caught:
        cdiload.loads(text)
    assert caught.value.line == line and message in caught.value.message
