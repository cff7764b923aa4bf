"""seccomp profiles (OCI/Docker JSON) for --security tests (tests/integration/test_security_flags.py,
test_instance_security.py): a profile file the test user can read, and a profile that denies some calls."""

from __future__ import annotations

import json
from pathlib import Path


def profile_file(workdir: Path, name: str, data: object) -> Path:
    path = workdir / "seccomp" / f"{name}.json"
    path.parent.mkdir(exist_ok=True)
    path.parent.chmod(0o755)
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    path.chmod(0o644)
    return path


def deny(names: list[str], **rule: object) -> dict[str, object]:
    return {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": names, "action": "SCMP_ACT_ERRNO", **rule}]}
