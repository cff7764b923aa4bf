"""The package's layout (issue 27): no import cycle in singpy/, no module over 500 lines, no test module
(tests/**/test_*.py) imported by another module of tests/ (what tests share lives in tests/support/).

The graph is read from the source with `ast`, every import statement
counted wherever it is (module level, inside a function, under
TYPE_CHECKING): lazy imports are the norm here, and a cycle through one is
still a cycle in the design. `from singpy.x import y` is an edge to
`singpy.x.y` when y is a module, else to `singpy.x`.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "singpy"
MAX_LINES = 500


def modules(package: str = PACKAGE) -> dict[str, Path]:
    found = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _known(name: str, known: dict[str, Path]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(_known(alias.name, known) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                targets.add(full if full in known else _known(base, known))
    return {target for target in targets if target is not None and target != name}


def import_graph(package: str = PACKAGE) -> dict[str, set[str]]:
    known = modules(package)
    return {name: imports_of(name, path, known) for name, path in known.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle (its modules, the first repeated at the end), or None; iterative depth-first search."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if start in state:
            continue
        path = [start]
        stack = [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            following = next(stack[-1], None)
            if following is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(following) == 1:
                return [*path[path.index(following):], following]
            elif following not in state:
                state[following] = 1
                path.append(following)
                stack.append(iter(sorted(graph[following])))
    return None


def test_the_graph_sees_lazy_and_module_imports() -> None:
    graph = import_graph()
    assert "singpy.launch.planner" in graph["singpy.launch.launch"]  # module level
    assert "singpy.launch.shared" in graph["singpy.launch.launch"]  # inside a function
    assert "singpy.launch.process" in graph["singpy.launch.pidns"]  # `from singpy.launch import process`


def test_find_cycle_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def test_no_module_over_500_lines() -> None:
    long = {str(path.relative_to(ROOT)): lines for folder in ("singpy", "benchmarks", "tests")
            for path in sorted((ROOT / folder).rglob("*.py"))
            if (lines := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"modules over {MAX_LINES} lines: {long}"


def only_test_modules(known: dict[str, Path]) -> set[str]:
    """The test modules (test_*.py) among `known`."""
    return {name for name in known if name.rpartition(".")[2].startswith("test_")}


def test_test_module_imports_are_seen(tmp_path: Path) -> None:
    """`from PACKAGE import test_x`, `import PACKAGE.test_x` and a relative `from .test_x import y` all count."""
    source = tmp_path / "test_user.py"
    source.write_text("from suite.integration import test_oras as oras\nimport suite.unit.test_jobs\n"
                      "from .test_cdi import spec\nfrom suite.support import sifs\n")
    known = {name: source for name in ("suite.integration.test_oras", "suite.unit.test_jobs", "suite.gpu.test_cdi",
                                       "suite.gpu.test_user", "suite.support.sifs")}
    imported = imports_of("suite.gpu.test_user", source, known)
    assert imported == {"suite.integration.test_oras", "suite.unit.test_jobs", "suite.gpu.test_cdi",
                        "suite.support.sifs"}
    assert imported & only_test_modules(known) == {"suite.integration.test_oras", "suite.unit.test_jobs",
                                                   "suite.gpu.test_cdi"}


def test_no_test_module_imports_another() -> None:
    """Test modules share only through tests/support/: one imported by another ties the two together (the importer
    breaks when the other is split or renamed), and a test imported by name runs in both.
    Importers left out: tests/support/ and conftest.py; tests/data holds third-party scripts."""
    known = {name: path for name, path in modules("tests").items()
             if path.relative_to(ROOT).parts[:2] != ("tests", "data")}
    targets = only_test_modules(known)
    found = {name: sorted(imports_of(name, path, known) & targets) for name, path in known.items()
             if path.relative_to(ROOT).parts[:2] != ("tests", "support") and path.name != "conftest.py"}
    offenders = {name: imported for name, imported in found.items() if imported}
    assert offenders == {}, f"test modules imported by other modules (move what they share to tests/support/): " \
                            f"{offenders}"
