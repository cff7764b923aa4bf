"""NVIDIA_REQUIRE_* constraints, checked against the host driver as the NVIDIA Container Toolkit does.

Syntax (libnvidia-container `src/cli/dsl.c`): a value is constraints
separated by spaces, any one of which may hold (OR); a constraint is
conditions separated by commas, all of which must hold (AND); a condition is
KEY OP VALUE with OP one of = != < <= > >= and KEY one of `cuda` (the CUDA
version the driver supports), `driver` (its version), `arch` (each GPU's
compute capability) and `brand` (each GPU's product brand, = and != only):

    cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=tesla,driver>=535,driver<536

Each `NVIDIA_REQUIRE_*` variable must hold. A fact that cannot be learnt on
this host (no nvidia-smi for `arch`) does not fail its condition: the check
exists to explain a failure in advance, never to refuse a run that might work.
The facts are asked for lazily, so a `cuda>=` that holds runs no tool.
"""

from __future__ import annotations

from singpy.gpu.versions import is_number
from singpy.record import Record

TYPE_CHECKING = False  # see singpy.record: `collections.abc` is not loaded at run time
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

KEYS = ("cuda", "driver", "arch", "brand")
_OPERATORS = ("<=", ">=", "!=", "=", "<", ">")  # two-character ones first


class Condition(Record, kw_only=False):
    key: str
    op: str
    value: str

    def __str__(self) -> str:
        return f"{self.key}{self.op}{self.value}"


Constraint = tuple[Condition, ...]  # all must hold


class Facts(Record):
    """Lazily learnt facts about the host: each callable returns None when it cannot tell."""

    cuda: Callable[[], tuple[int, ...] | None]
    driver: Callable[[], tuple[int, ...] | None]
    archs: Callable[[], tuple[tuple[int, ...], ...] | None]  # one per GPU
    brands: Callable[[], tuple[str, ...] | None]  # one per GPU


def parse(text: str) -> tuple[Constraint, ...]:
    """The constraints of one variable's value; ValueError naming the bad part."""
    constraints = []
    for word in text.split():
        constraints.append(tuple(_condition(part) for part in word.split(",") if part))
    return tuple(constraint for constraint in constraints if constraint)


def _condition(text: str) -> Condition:
    position = min((i for op in _OPERATORS if (i := text.find(op)) > 0), default=-1)
    if position < 0:
        raise ValueError(f"'{text}' is not KEY OP VALUE")
    op = next(op for op in _OPERATORS if text.startswith(op, position))
    key, value = text[:position].strip().lower(), text[position + len(op):].strip()
    if key not in KEYS:
        raise ValueError(f"'{text}': unknown key '{key}' (known: {', '.join(KEYS)})")
    if not value:
        raise ValueError(f"'{text}' has no value")
    if key == "brand":
        if op not in ("=", "!="):
            raise ValueError(f"'{text}': brand takes = or != only")
    elif version(value) is None:
        raise ValueError(f"'{text}': '{value}' is not a version")
    return Condition(key, op, value)


def version(text: str) -> tuple[int, ...] | None:
    """(12, 4) from "12.4", (550, 54, 14) from "550.54.14", (12,) from "12"; None for anything else."""
    parts = text.split(".")
    if not 1 <= len(parts) <= 4 or not all(is_number(part) for part in parts):
        return None
    return tuple(int(part) for part in parts)


def _compare(have: tuple[int, ...], op: str, want: tuple[int, ...]) -> bool:
    width = max(len(have), len(want))  # 12.4 == 12.4.0
    left, right = have + (0,) * (width - len(have)), want + (0,) * (width - len(want))
    return {"=": left == right, "!=": left != right, "<": left < right, "<=": left <= right,
            ">": left > right, ">=": left >= right}[op]


def holds(condition: Condition, facts: Facts) -> bool:
    """Whether one condition holds; an unknown fact lets it hold (see the module doc)."""
    if condition.key == "brand":
        brands = facts.brands()
        want = condition.value.lower()
        return brands is None or all((brand.lower() == want) is (condition.op == "=") for brand in brands)
    want_version = version(condition.value)
    assert want_version is not None  # parse() checked it
    if condition.key == "arch":
        archs = facts.archs()
        return archs is None or all(_compare(arch, condition.op, want_version) for arch in archs)
    have = facts.cuda() if condition.key == "cuda" else facts.driver()
    return have is None or _compare(have, condition.op, want_version)


def satisfied(constraints: tuple[Constraint, ...], facts: Facts) -> bool:
    """Any constraint whose conditions all hold; cuda/driver conditions are tried before arch/brand."""
    return not constraints or any(all(holds(c, facts) for c in sorted(constraint, key=_cost))
                                  for constraint in constraints)


def _cost(condition: Condition) -> int:
    return 0 if condition.key in ("cuda", "driver") else 1  # arch and brand run nvidia-smi


def disabled(env: Mapping[str, str]) -> bool:
    """NVIDIA_DISABLE_REQUIRE set to a true value (1, true, yes, on), as the toolkit's ParseBool."""
    return env.get("NVIDIA_DISABLE_REQUIRE", "").strip().lower() in ("1", "true", "t", "yes", "y", "on")


def requirements(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """(variable, value) for each NVIDIA_REQUIRE_*; a legacy image (CUDA_VERSION alone) implies cuda>=M.m."""
    found = tuple(sorted((name, value) for name, value in env.items()
                         if name.startswith("NVIDIA_REQUIRE_") and value.strip()))
    if "NVIDIA_REQUIRE_CUDA" not in env:
        legacy = version(".".join(env.get("CUDA_VERSION", "").strip().split(".")[:2]))
        if legacy is not None and len(legacy) == 2:
            found += (("CUDA_VERSION", f"cuda>={legacy[0]}.{legacy[1]}"),)
    return found


def unmet(env: Mapping[str, str], facts: Facts) -> tuple[tuple[str, str] | None, tuple[str, ...]]:
    """The first (variable, value) that does not hold (None: all hold), and warnings for unparsable ones."""
    warnings: list[str] = []
    if disabled(env):
        return None, ()
    for name, value in requirements(env):
        try:
            constraints = parse(value)
        except ValueError as exc:
            warnings.append(f"{name}: {exc}; this requirement is not checked")
            continue
        if not satisfied(constraints, facts):
            return (name, value), tuple(warnings)
    return None, tuple(warnings)


def describe(facts: Facts, value: str) -> str:
    """What was found, for the keys `value` mentions: "CUDA 12.4, driver 550.54.14"."""
    found = []
    if "cuda" in value:
        found.append(f"CUDA {_dotted(facts.cuda())}")
    if "driver" in value:
        found.append(f"driver {_dotted(facts.driver())}")
    if "arch" in value:
        archs = facts.archs()
        found.append(f"GPU architecture {', '.join(_dotted(a) for a in archs) if archs else 'unknown'}")
    if "brand" in value:
        brands = facts.brands()
        found.append(f"GPU brand {', '.join(brands) if brands else 'unknown'}")
    return ", ".join(found)


def _dotted(numbers: tuple[int, ...] | None) -> str:
    return ".".join(str(n) for n in numbers) if numbers else "unknown"
