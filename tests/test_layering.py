"""The package layering of docs/architecture.md, checked on the source.

Every ``import partialfc.X`` / ``from partialfc.X import ...`` — at module level or inside a
function — must point to the importing package itself or to a package of a lower layer, and the
modules must not import each other in a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import partialfc

ROOT = Path(partialfc.__file__).resolve().parent

# lowest first; a package may import the packages of the layers below its own
LAYERS = [
    {"atomic", "autograd", "locking", "ranges", "onnx_layout"},
    {"models", "data", "losses"},
    {"classifier", "backbone", "detect"},
    {"eval"},
    {"train", "deploy"},
    {"tools"},
    {"cli"},
]
LAYER = {package: level for level, packages in enumerate(LAYERS) for package in packages}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _nodes(tree: ast.AST, typing_only: bool):
    """Every node, without the bodies of ``if TYPE_CHECKING:`` unless ``typing_only``."""
    for node in ast.iter_child_nodes(tree):
        guard = isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
        if guard and not typing_only:
            yield from (n for child in node.orelse for n in [child, *_nodes(child, False)])
            continue
        yield node
        yield from _nodes(node, typing_only)


def _imports(path: Path, typing_only: bool = True) -> list[tuple[int, str]]:
    """``(line, module)`` of every partialfc import in ``path`` (relative ones resolved);
    ``typing_only=False`` leaves out those made for type checkers only."""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    out = []
    for node in _nodes(ast.parse(path.read_text(), str(path)), typing_only):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            names = [name] + [f"{name}.{alias.name}" for alias in node.names]
            out += [(node.lineno, n) for n in names if n.startswith("partialfc")]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("partialfc")]
    return out


def _sources():
    return sorted(ROOT.rglob("*.py"))


def test_every_package_has_a_layer():
    packages = {_module_name(p).split(".")[1] for p in _sources() if _module_name(p) != "partialfc"}
    assert packages == set(LAYER)


def test_no_package_imports_a_higher_or_equal_layer():
    wrong = []
    for path in _sources():
        name = _module_name(path)
        if name == "partialfc":
            continue
        source = name.split(".")[1]
        for line, module in _imports(path):
            parts = module.split(".")
            if len(parts) < 2 or parts[1] == source or parts[1] not in LAYER:
                continue
            if LAYER[parts[1]] >= LAYER[source]:
                wrong.append(f"{path.relative_to(ROOT.parent)}:{line} imports {module}")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def _reexports(init: Path) -> dict[str, str]:
    """``{name: module}`` for every ``from partialfc.pkg.module import name`` in a package's
    ``__init__.py``: where ``from partialfc.pkg import name`` really points."""
    out = {}
    package = _module_name(init)
    for node in ast.parse(init.read_text(), str(init)).body:
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            module = ".".join((base if node.level else []) + [node.module or ""]).strip(".")
            out.update({f"{package}.{a.asname or a.name}": module for a in node.names})
    return out


def _import_graph(typing_only: bool, through_packages: bool) -> dict[str, set[str]]:
    """module -> the partialfc modules it imports (lazy ones included; ``typing_only``: also
    those made for type checkers only). A package's ``__init__`` re-exports its modules:
    ``through_packages`` follows ``from partialfc.pkg import Name`` to the module defining it,
    otherwise such arrows are left out."""
    modules = {_module_name(p): p for p in _sources()}
    packages = {n for n, p in modules.items() if p.name == "__init__.py"}
    reexports = {}
    for name in packages:
        reexports.update(_reexports(modules[name]))
    graph = {}
    for name, path in modules.items():
        targets = set()
        for _, module in _imports(path, typing_only=typing_only):
            if through_packages and module in reexports:
                module = reexports[module]
            while module and module not in modules:  # "pkg.mod.Name" -> "pkg.mod"
                module = module.rpartition(".")[0]
            if module and module != name and not name.startswith(module + "."):
                targets.add(module)
        graph[name] = {t for t in targets if t not in packages}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[str]:
    state, stack, cycles = {}, [], []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt) :] + [nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def test_modules_do_not_import_each_other_in_a_circle():
    cycles = _circles(_import_graph(typing_only=False, through_packages=False))
    assert not cycles, "import circles:\n" + "\n".join(cycles)


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_no_circle_inside_a_package():
    """Inside one package even a circle that only type checkers or a function body close (a
    lazy import, an import through the package's ``__init__``) is refused: the modules of a
    package form a hierarchy, a shared piece goes into a module of its own."""
    graph = _import_graph(typing_only=True, through_packages=True)
    inside = {n: {t for t in ts if _package(t) == _package(n)} for n, ts in graph.items()}
    cycles = _circles(inside)
    assert not cycles, "import circles inside a package:\n" + "\n".join(cycles)


def _write_package(tmp_path, monkeypatch, files: dict[str, str]):
    root = tmp_path / "partialfc"
    for relative, text in {"__init__.py": "", **files}.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    monkeypatch.setattr(f"{__name__}.ROOT", root)


@pytest.mark.parametrize(
    "closing_import",
    [
        "from partialfc.pkg.a import f\n",  # module level
        "def g():\n    from partialfc.pkg.a import f\n",  # lazy
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from partialfc.pkg.a import f\n",
        "from partialfc.pkg import f\n",  # through the package's __init__
    ],
)
def test_the_check_sees_a_circle_inside_a_package(tmp_path, monkeypatch, closing_import):
    files = {
        "pkg/__init__.py": "from partialfc.pkg.a import f\n",
        "pkg/a.py": "def f():\n    from partialfc.pkg.b import g\n",
        "pkg/b.py": closing_import,
        "other/__init__.py": "",
        "other/c.py": "from partialfc.pkg.a import f\n",  # one way across packages: fine
    }
    _write_package(tmp_path, monkeypatch, files)
    with pytest.raises(
        AssertionError, match="partialfc.pkg.a -> partialfc.pkg.b -> partialfc.pkg.a"
    ):
        test_no_circle_inside_a_package()
    files["pkg/b.py"] = "def g():\n    return 1\n"
    _write_package(tmp_path, monkeypatch, files)
    test_no_circle_inside_a_package()


def test_the_check_sees_a_wrong_arrow(tmp_path, monkeypatch):
    bad = tmp_path / "partialfc" / "data" / "bad.py"
    bad.parent.mkdir(parents=True)
    bad.write_text("def f():\n    from partialfc.train.engine import Trainer\n")
    (tmp_path / "partialfc" / "__init__.py").write_text("")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path / "partialfc")
    assert _imports(bad) == [(2, "partialfc.train.engine"), (2, "partialfc.train.engine.Trainer")]
    try:
        test_no_package_imports_a_higher_or_equal_layer()
    except AssertionError as err:
        assert "partialfc/data/bad.py:2 imports partialfc.train.engine" in str(err)
    else:
        raise AssertionError("the layering test did not flag data -> train")
