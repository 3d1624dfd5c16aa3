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


def _loops(graph: dict) -> list[list[str]]:
    """The cycles a depth-first walk of `graph` (node → its successors) closes, each as its
    nodes from where it starts to that node again."""
    loops, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                loops.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return loops


def _cycles(package: Path = PACKAGE) -> list[list[str]]:
    modules = _modules(package)
    return _loops(
        {name: _import_time_imports(name, path, modules) for name, path in modules.items()}
    )


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


def _subpackage_imports(package: Path = PACKAGE) -> dict[str, dict[str, str]]:
    """Sub-package → {sub-package it imports: one module that does}, from every import in its
    modules, inside functions too (they run when the function is called), outside ``if
    TYPE_CHECKING:`` blocks; the private modules beside the folders (``_modes.py``...) are not
    a layer."""
    edges: dict[str, dict[str, str]] = {}
    for name, path in _modules(package).items():
        parts = name.split(".")
        if len(parts) < 3 and not (package / parts[-1]).is_dir():
            continue  # the root package and its private modules
        layer = parts[1]
        tree = ast.parse(path.read_text())
        skipped = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for inner in ast.walk(node)
        }
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            for target in targets:
                target_parts = target.split(".")
                if target_parts[0] != package.name or len(target_parts) < 2:
                    continue
                other = target_parts[1]
                if other != layer and (package / other).is_dir():
                    edges.setdefault(layer, {}).setdefault(other, name)
    return edges


def _layer_cycles(package: Path = PACKAGE) -> list[str]:
    """Each cycle of the layers, with a module that makes each of its imports."""
    edges = _subpackage_imports(package)
    cycles = []
    for loop in _loops(edges):
        steps = zip(loop[:-1], loop[1:], strict=True)
        cycles.append(" -> ".join(f"{a} ({edges[a][b]})" for a, b in steps) + f" -> {loop[-1]}")
    return cycles


def test_the_layers_import_downwards_only():
    """The sub-packages form an acyclic import graph, counting imports made inside functions:
    a lower layer never reaches up (backend registrations live in `backends/`, the Ops that
    count failures in `graph/`, below the backends that compile them; the deferred-import hook
    beside the folders)."""
    cycles = _layer_cycles()
    assert not cycles, "layers importing each other: " + "; ".join(cycles)


def test_the_layer_check_sees_an_import_inside_a_function(tmp_path):
    package = tmp_path / "pymc_optim"
    for layer in ("low", "high"):
        (package / layer).mkdir(parents=True)
        (package / layer / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "high" / "op.py").write_text("from pymc_optim.low import thing\n")
    (package / "low" / "thing.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pymc_optim.high import op\n"
    )
    assert _layer_cycles(package) == []
    (package / "low" / "thing.py").write_text("def f():\n    from pymc_optim.high import op\n")
    assert _layer_cycles(package) == [
        "high (pymc_optim.high.op) -> low (pymc_optim.low.thing) -> high"
    ]


def test_public_namespace_is_curated():
    for name in pymc_optim.__all__:
        assert not name.startswith("_") and hasattr(pymc_optim, name), name
    public_modules = [n for n in _modules() if not any(p.startswith("_") for p in n.split("."))]
    layers = {n.split(".")[1] for n in public_modules if n.count(".") >= 1}
    assert {"problems", "implicit", "linalg", "graph", "backends", "rewrites", "model"} <= layers
