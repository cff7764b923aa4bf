"""Platforms: which image of a multi-architecture index runs here, or on the machine `--arch` names.

Names are Go's (GOOS/GOARCH plus a variant), as OCI indexes and Docker
manifest lists write them: "linux/amd64", "linux/arm64/v8", "linux/arm/v7".
The aliases users type are normalised as Apptainer does ([1]
internal/pkg/ociplatform/database.go `normalizeArch`; [2]
internal/pkg/build/oci/oci.go `archMap`, the `--arch` values of `build`):
x86_64 is amd64, aarch64 is arm64, armhf is arm/v7, armel is arm/v6,
arm32v7 is arm/v7, arm64v8 is arm64/v8.

arm64 has one variant in practice, v8, and indexes write it or not: an
entry "arm64" and an entry "arm64/v8" are the same platform here. A 32-bit
arm machine also runs the older arm variants, as containerd's matcher
(platforms.Only) allows: arm/v7 takes v7, else v6, else v5.

Attestation entries (BuildKit's provenance/SBOM manifests: platform
"unknown/unknown" and the annotation vnd.docker.reference.type) are never
chosen nor listed. An entry without a platform is taken only when no entry
names this one, as containers/image does for indexes written without
platforms.
"""

from __future__ import annotations

import os
import sys

from singpy.errors import ImageError
from singpy.record import Record

TYPE_CHECKING = False  # see singpy.record: `typing` is not loaded at run time
if TYPE_CHECKING:
    from typing import Any

# GOARCH names of the platforms Apptainer knows ([2], plus mips64le as in singpy.constants.ARCHES).
ARCHITECTURES = ("amd64", "arm64", "arm", "386", "ppc64le", "s390x", "riscv64", "mips64le", "loong64")
ARM_VARIANTS = ("v5", "v6", "v7")
_ALIASES: dict[str, tuple[str, str]] = {  # what users type -> (GOARCH, variant)
    "x86_64": ("amd64", ""), "x86-64": ("amd64", ""), "i386": ("386", ""), "i686": ("386", ""),
    "aarch64": ("arm64", ""), "armhf": ("arm", "v7"), "armel": ("arm", "v6"),
    "arm32v5": ("arm", "v5"), "arm32v6": ("arm", "v6"), "arm32v7": ("arm", "v7"), "arm64v8": ("arm64", "v8"),
    "ppc64el": ("ppc64le", ""), "loongarch64": ("loong64", ""),
}
_ATTESTATION = "attestation-manifest"
_MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json",
                   "application/vnd.docker.distribution.manifest.v2+json")


class Platform(Record):
    """An OS, a GOARCH and a variant ("" when none), normalised: arm64 always carries v8."""

    os: str = "linux"
    architecture: str
    variant: str = ""

    def __str__(self) -> str:
        return "/".join(part for part in (self.os, self.architecture, self.variant) if part)


def normalize(architecture: str, variant: str = "", os_name: str = "linux") -> Platform:
    """The platform these names mean, aliases resolved (no check that singpy knows it)."""
    architecture, variant = architecture.lower(), variant.lower()
    architecture, implied = _ALIASES.get(architecture, (architecture, ""))
    variant = variant or implied
    if architecture in ("arm", "arm64") and variant.isdigit():
        variant = f"v{variant}"
    if architecture == "arm64" and variant in ("", "v8"):
        variant = "v8"
    return Platform(os=os_name.lower(), architecture=architecture, variant=variant)


def host_platform() -> Platform:
    """This machine's platform, from the kernel's machine name (os.uname)."""
    machine = os.uname().machine.lower()
    if machine.startswith("armv"):  # armv7l, armv6l, armv5tel, armv8l (a 32-bit process on arm64)
        digits = "".join(char for char in machine[4:6] if char.isdigit())
        return normalize("arm", f"v{digits}" if digits else "")
    if machine == "mips64":  # the kernel does not say the endianness; this Python does
        return normalize("mips64le" if sys.byteorder == "little" else "mips64")
    return normalize(machine)


def parse_arch(text: str) -> Platform:
    """The platform a `--arch` value names: "amd64", "arm64", "arm64/v8", "linux/arm/v7", "aarch64", "x86_64"..."""
    parts = text.strip().split("/")
    if parts and parts[0].lower() == "linux" and len(parts) > 1:
        parts = parts[1:]
    elif parts and len(parts) == 3:  # "windows/amd64/v1": an OS singpy cannot run
        raise ImageError(f"unsupported platform {text!r}: singpy runs linux images only")
    if not 1 <= len(parts) <= 2 or not all(parts):
        raise _bad_arch(text)
    if len(parts) == 2 and parts[0].lower() in ("windows", "darwin", "freebsd"):
        raise ImageError(f"unsupported platform {text!r}: singpy runs linux images only")
    found = normalize(parts[0], parts[1] if len(parts) == 2 else "")
    if found.architecture not in ARCHITECTURES:
        raise _bad_arch(text)
    if found.architecture == "arm" and found.variant not in ("", *ARM_VARIANTS):
        raise _bad_arch(text)
    if found.architecture == "arm64" and found.variant != "v8":
        raise _bad_arch(text)
    if found.architecture not in ("arm", "arm64") and found.variant and not _plain_variant(found.variant):
        raise _bad_arch(text)
    return found


def _plain_variant(variant: str) -> bool:
    return variant.isascii() and variant.isalnum() and len(variant) <= 16


def _bad_arch(text: str) -> ImageError:
    shown = text if len(text) <= 40 else text[:37] + "..."
    return ImageError(f"unknown architecture {shown!r}: use one of amd64, arm64, arm/v7, arm/v6, arm/v5, 386, "
                      "ppc64le, s390x, riscv64, mips64le, loong64",
                      hint="x86_64, aarch64, armhf and OS/ARCH[/VARIANT] such as linux/arm64/v8 are accepted too")


def describe(platform: Any) -> Platform | None:
    """The platform an index entry's `platform` object declares; None when absent or malformed."""
    if not isinstance(platform, dict):
        return None
    os_name, architecture, variant = platform.get("os"), platform.get("architecture"), platform.get("variant", "")
    if not isinstance(os_name, str) or not isinstance(architecture, str) or not isinstance(variant, str):
        return None
    return normalize(architecture, variant, os_name)


def is_attestation(descriptor: dict[str, Any]) -> bool:
    """BuildKit's attestation manifests: "unknown/unknown", or annotated as such."""
    annotations = descriptor.get("annotations")
    if isinstance(annotations, dict) and annotations.get("vnd.docker.reference.type") == _ATTESTATION:
        return True
    found = describe(descriptor.get("platform"))
    return found is not None and (found.os, found.architecture) == ("unknown", "unknown")


def choose(index: dict[str, Any], want: Platform, *, source: str) -> dict[str, Any]:
    """The descriptor (an entry of `manifests`) of the image for `want`; ImageError listing what there is."""
    entries = index.get("manifests")
    if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
        raise ImageError(f"{source}: malformed image index (manifests must be a list of objects)")
    candidates: list[dict[str, Any]] = [entry for entry in entries if not is_attestation(entry)]
    declared = [(entry, found) for entry in candidates if (found := describe(entry.get("platform"))) is not None]
    for wanted in _acceptable(want):
        exact: list[dict[str, Any]] = [entry for entry, found in declared if found == wanted]
        loose = [entry for entry, found in declared if _matches(found, wanted)]
        if exact or loose:
            return (exact or loose)[0]
    for entry in candidates:  # containers/image: an entry that declares no platform is the fallback
        if "platform" not in entry and entry.get("mediaType", _MANIFEST_TYPES[0]) in _MANIFEST_TYPES:
            return entry
    available = list(dict.fromkeys(_listed(str(found)) for _, found in declared))
    if not available:
        raise ImageError(f"no {want} image in {source}: its index lists no platform")
    more = f" and {len(available) - _LISTED} more" if len(available) > _LISTED else ""
    raise ImageError(f"no {want} image in {source}: it has {', '.join(available[:_LISTED])}{more}",
                     hint="choose one of them with --arch")


_LISTED = 12  # platforms named in that message: an index may list thousands


def _listed(platform: str) -> str:
    """A platform of an index as the message names it: the index is the registry's text, not ours. A plain
    one as it is; one with anything else (a newline, an escape sequence) quoted, cut, and escaped by repr."""
    if platform.isprintable() and len(platform) <= 40 and "," not in platform:
        return platform
    return repr(platform if len(platform) <= 40 else platform[:37] + "...")


def _acceptable(want: Platform) -> list[Platform]:
    """The platforms that run on `want`, best first: the same variant, then (32-bit arm) older ones."""
    if want.architecture != "arm" or want.variant not in ARM_VARIANTS:
        return [want]
    older = ARM_VARIANTS[:ARM_VARIANTS.index(want.variant) + 1]
    return [want.replace(variant=variant) for variant in reversed(older)]


def _matches(found: Platform, wanted: Platform) -> bool:
    if (found.os, found.architecture) != (wanted.os, wanted.architecture):
        return False
    # No variant asked for (amd64, ppc64le, or plain "arm"): any variant the index offers.
    return not wanted.variant or found.variant == wanted.variant


def config_matches(config: dict[str, Any], want: Platform) -> bool:
    """Whether an image config's os/architecture/variant fit `want` (True when it declares none)."""
    architecture = config.get("architecture")
    if not isinstance(architecture, str) or not architecture:
        return True
    os_name = config.get("os") if isinstance(config.get("os"), str) else "linux"
    variant = config.get("variant") if isinstance(config.get("variant"), str) else ""
    found = normalize(architecture, str(variant), str(os_name or "linux"))
    if not found.variant:  # a config without a variant says nothing about it
        return (found.os, found.architecture) == (want.os, want.architecture)
    return any(_matches(found, wanted) for wanted in _acceptable(want))
