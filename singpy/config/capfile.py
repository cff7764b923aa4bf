"""capability.json: the capabilities granted to users and groups, as Apptainer keeps them, edited by
`singpy capability add|drop` and shown by `capability list` (Apptainer's pkg/util/capabilities Config:
`{"users": {NAME: ["CAP_..."]}, "groups": {NAME: [...]}}`, either part left out when empty).

What a launch reads of it is root's list (singpy.kernel.caps.read_capability_file, for `root default
capabilities = file`): singpy is never setuid, so a grant to another user or a group changes nothing
singpy runs; Apptainer's setuid installation, sharing the file, honours them.
"""

from __future__ import annotations

import json
import os

from singpy.errors import ConfigError

Grants = dict[str, dict[str, list[str]]]  # "users"/"groups" -> name -> capability names, in the order given
PARTS = ("users", "groups")


def load(path: str, *, missing_ok: bool) -> Grants:
    """The file's grants; an empty set for a missing one when `missing_ok` (`add` creates it), else ConfigError."""
    from singpy.host.hostfiles import read_text

    grants: Grants = {"users": {}, "groups": {}}
    if missing_ok and not os.path.lexists(path):
        return grants
    text = read_text(path, what="capability file", error=ConfigError)
    if not text.strip():  # Apptainer reads an empty file as no grants
        return grants
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise ConfigError(f"can't read {path}: not JSON ({error})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a JSON object")
    for part in PARTS:
        names = data.get(part) or {}
        if not isinstance(names, dict) or not all(isinstance(caps, list) and all(isinstance(cap, str) for cap in caps)
                                                  for caps in names.values()):
            raise ConfigError(f"{path}: {part} must map names to lists of capability names")
        grants[part] = {str(name): list(caps) for name, caps in names.items()}
    return grants


def save(path: str, grants: Grants) -> None:
    """Write the file whole or not at all, mode 0644 (every user's launch may read it), as Apptainer writes it."""
    from singpy.host.cachefiles import publish

    document = {part: grants[part] for part in PARTS if grants[part]}
    try:
        publish(path, json.dumps(document, indent="\t").encode(), mode=0o644, durable=True)
    except OSError as error:
        raise ConfigError(f"can't write the capability file {path}: {error.strerror}") from None
