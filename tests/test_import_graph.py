"""Import-graph checks: no import circles in the repository, and planning code stays torch-free.

The graph is read with `ast` only (nothing is imported). Every import statement counts,
at module level, inside a function or under `if TYPE_CHECKING:`: a function-level import back is
still a circle. An import names the most specific repository module it reaches (`from pkg import
mod` is an edge to pkg.mod, `from pkg.mod import name` to pkg.mod); the parent packages that Python
also initialises on the way are not edges. Scripts in a directory without __init__.py (tools/) import
their siblings by bare name, as they put their own directory on sys.path.
"""

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED_DIRS = ("megatron_auto", "patches", "benchmarks", "validation", "tools")
# Planning code, plus the dependency-free leaf modules it shares (errors, kernels, limits, serde).
PLANNING_MODULES = (
    "megatron_auto.specs", "megatron_auto.cost", "megatron_auto.search", "megatron_auto.plan",
    "megatron_auto.errors", "megatron_auto.kernel_choice", "megatron_auto.limits", "megatron_auto.serde",
    "megatron_auto.parallel_dims",
)
PLANNING_THIRD_PARTY = frozenset({"numpy"})


def module_name(path: Path, root: Path) -> str:
    """Dotted module name of a .py file under root (a package's __init__ names the package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files(root: Path, dirs=SCANNED_DIRS) -> dict[str, Path]:
    """Map each module name to its file, for every .py file under the scanned directories."""
    files = {}
    for top in dirs:
        for path in sorted((root / top).rglob("*.py")):
            if "__pycache__" not in path.parts:
                files[module_name(path, root)] = path
    return files


def imported_names(tree: ast.AST, module: str, is_package: bool) -> list[tuple[str, list[str]]]:
    """Each import in the tree as (absolute base name, names imported from it), relative ones resolved."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".") if package else []
                anchor = anchor[: len(anchor) - (node.level - 1)] if node.level > 1 else anchor
                base = ".".join(anchor + ([base] if base else []))
            found.append((base, [alias.name for alias in node.names]))
    return found


def resolve(name: str, known: set[str], script_dir: str | None) -> str | None:
    """The most specific known module that an absolute import name refers to, or None."""
    candidates = [name] + ([f"{script_dir}.{name}"] if script_dir else [])
    for candidate in candidates:
        parts = candidate.split(".")
        for end in range(len(parts), 0, -1):
            prefix = ".".join(parts[:end])
            if prefix in known:
                return prefix
    return None


def module_imports(path: Path, module: str, known: set[str], root: Path) -> set[str]:
    """The repository modules one file imports (sibling scripts count for non-package directories)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    script_dir = None
    if not (path.parent / "__init__.py").exists():
        script_dir = module_name(path.parent / "__init__.py", root)
    targets = set()
    for base, names in imported_names(tree, module, is_package):
        for name in names or [None]:
            full = f"{base}.{name}" if name and name != "*" else base
            target = resolve(full, known, script_dir)
            if target is not None:
                targets.add(target)
    return targets


def import_graph(root: Path = ROOT, dirs=SCANNED_DIRS) -> dict[str, set[str]]:
    """Module → set of repository modules it imports, for every scanned file."""
    files = source_files(root, dirs)
    known = set(files)
    return {module: module_imports(path, module, known, root) for module, path in files.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module, or a module importing itself (Tarjan)."""
    index, low, on_stack, stack, cycles = {}, {}, set(), [], []

    def visit(start):
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            child = next(edges, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


def cycle_edges(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """The import edges inside one component, as 'a -> b' lines for the failure message."""
    members = set(component)
    return [f"{a} -> {b}" for a in component for b in sorted(graph[a] & members)]


def test_cycle_finder_finds_a_two_module_circle():
    """A synthetic a <-> b circle is found; a chain and a self-import are told apart correctly."""
    graph = {"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a", "pkg.c"}, "pkg.c": set()}
    assert import_cycles(graph) == [["pkg.a", "pkg.b"]]
    assert import_cycles({"pkg.a": {"pkg.b"}, "pkg.b": set()}) == []
    assert import_cycles({"pkg.a": {"pkg.a"}}) == [["pkg.a"]]


def test_relative_and_submodule_imports_are_resolved(tmp_path):
    """`from . import x`, `from ..p import y` and sibling scripts resolve to repository modules."""
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "tools").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("def f():\n    from .sub import b\n")
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub" / "b.py").write_text("from ..a import f\nimport os\n")
    (tmp_path / "tools" / "run.py").write_text("import helper\nfrom pkg import sub\n")
    (tmp_path / "tools" / "helper.py").write_text("import run\n")
    graph = import_graph(tmp_path, ("pkg", "tools"))
    assert graph["pkg.a"] == {"pkg.sub.b"}
    assert graph["pkg.sub.b"] == {"pkg.a"}
    assert graph["tools.run"] == {"tools.helper", "pkg.sub"}
    assert import_cycles(graph) == [["pkg.a", "pkg.sub.b"], ["tools.helper", "tools.run"]]


def test_repository_has_no_import_cycles():
    """No module of the repository reaches itself through imports (function-level ones included)."""
    graph = import_graph()
    cycles = import_cycles(graph)
    message = "\n\n".join("circle:\n  " + "\n  ".join(cycle_edges(graph, c)) for c in cycles)
    assert not cycles, message


def is_planning_module(module: str) -> bool:
    """Whether a module is planning code, held to the stdlib-and-numpy import rule."""
    return any(module == p or module.startswith(p + ".") for p in PLANNING_MODULES)


def forbidden_planning_imports(module: str, path: Path) -> list[str]:
    """Imports of one planning module that are neither stdlib, numpy nor megatron_auto planning code."""
    tree = ast.parse(path.read_text(), filename=str(path))
    bad = []
    for base, names in imported_names(tree, module, path.name == "__init__.py"):
        top = base.split(".")[0]
        if top == "megatron_auto":
            fulls = [f"{base}.{name}" for name in names] or [base]
            bad.extend(full for full in fulls if not (is_planning_module(full) or is_planning_module(base)))
        elif top not in sys.stdlib_module_names and top not in PLANNING_THIRD_PARTY:
            bad.append(base)
    return bad


def test_planning_code_imports_only_stdlib_numpy_and_planning_modules():
    """specs, cost, search, plan.py (and the leaf modules they share) never import torch, megatron or runtime."""
    files = source_files(ROOT, ("megatron_auto",))
    assert all(m in files for m in PLANNING_MODULES), "a planning module named here no longer exists"
    offenders = {
        module: bad
        for module, path in files.items()
        if is_planning_module(module) and (bad := forbidden_planning_imports(module, path))
    }
    assert not offenders, offenders


def test_layering_check_catches_a_torch_import(tmp_path):
    """The layering check flags torch, megatron and megatron_auto.runtime imports in planning code."""
    path = tmp_path / "bad.py"
    path.write_text("import numpy\nimport torch\nfrom megatron.core import parallel_state\n"
                    "def f():\n    from megatron_auto.runtime import launch\n    from . import grid\n")
    bad = forbidden_planning_imports("megatron_auto.search.bad", path)
    assert bad == ["torch", "megatron.core", "megatron_auto.runtime.launch"]
    path.write_text("from megatron_auto import runtime, plan\nfrom ..specs.model import ModelSpec\n")
    assert forbidden_planning_imports("megatron_auto.search.bad", path) == ["megatron_auto.runtime"]


def test_entry_points_and_harnesses_leave_the_import_path_alone():
    """tools/, benchmarks/ and validation/ import the repository by package name (`python -m`, or PYTHONPATH
    for the ranks the launcher forks), never by editing sys.path (issue 38)."""
    edits = [f"{path.relative_to(ROOT)}:{number}" for top in ("tools", "benchmarks", "validation")
             for path in sorted((ROOT / top).rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if "sys.path" in line]
    assert not edits, edits


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
