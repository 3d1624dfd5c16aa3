"""The package's layers, as the folders show them: no import cycles, one curated namespace."""

import ast
from pathlib import Path

import pymc_optim

PACKAGE = Path(pymc_optim.__file__).parent


def _module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(package: Path = PACKAGE) -> dict[str, Path]:
    return {_module_name(p, package): p for p in package.rglob("*.py")}


def _import_time_imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules `path` imports when it is imported: module-level imports, outside
    ``if TYPE_CHECKING:`` blocks (imports inside functions run later, and break no cycle)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()

    def visit(statements):
        for node in statements:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.If | ast.Try):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)

    visit(tree.body)
    # Importing a.b.c first imports the packages a.b. The packages holding `name` are already
    # being imported when `name` is (they come first), and the root package is imported before
    # anything of it: neither closes a cycle.
    own_packages = {".".join(name.split(".")[:k]) for k in range(1, name.count(".") + 2)}
    imported = set()
    for target in found & set(modules):
        parts = target.split(".")
        imported.update(".".join(parts[:k]) for k in range(2, len(parts) + 1))
    return (imported & set(modules)) - own_packages


def _cycles(package: Path = PACKAGE) -> list[list[str]]:
    modules = _modules(package)
    graph = {name: _import_time_imports(name, path, modules) for name, path in modules.items()}
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return cycles


def test_no_import_cycles():
    cycles = _cycles()
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_cycle_check_sees_a_cycle(tmp_path):
    """The checker itself can fail: a module importing a sibling through a package whose
    ``__init__`` imports the first module back, as constrained/ did before it was split."""
    package = tmp_path / "pymc_optim"
    (package / "a").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a" / "__init__.py").write_text("from pymc_optim.a.x import f\n")
    (package / "a" / "x.py").write_text("from pymc_optim.b import g\n")
    (package / "b.py").write_text("from pymc_optim.a.y import h\n")
    (package / "a" / "y.py").write_text("")
    assert _cycles(package) == [["pymc_optim.a", "pymc_optim.a.x", "pymc_optim.b", "pymc_optim.a"]]


def test_public_namespace_is_curated():
    for name in pymc_optim.__all__:
        assert not name.startswith("_") and hasattr(pymc_optim, name), name
    public_modules = [n for n in _modules() if not any(p.startswith("_") for p in n.split("."))]
    layers = {n.split(".")[1] for n in public_modules if n.count(".") >= 1}
    assert {"problems", "implicit", "linalg", "graph", "backends", "rewrites", "model"} <= layers
