"""The package's shape: imports point down the pipeline and never in a circle, modules stay small,
the public names are listed once, and ``fxcost --help`` does not import torch.

The layers are those of ARCHITECTURE.md. A module may import anything of its own package or of a
package of a lower layer; an import of a higher layer, or a cycle, fails here and names the modules.
Imports inside functions count; those under ``if TYPE_CHECKING:`` do not (they never run).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fxcost"

# Bottom first: the shared vocabulary and the model builders, then the pipeline's stages, then what
# drives them. A module imports only from its own layer's package or from layers listed before it.
_VOCABULARY = {"_version", "_io", "_registry", "_progress", "_checks", "_threads", "precision", "execution"}
LAYERS: list[set[str]] = [
    _VOCABULARY | {"records", "zoo"},
    {"gpus"},
    {"bench"},
    {"lowering", "kernels_triton"},
    {"cost_models"},
    {"passes"},
    {"propagate"},
    {"report"},
    {"capture"},
    {"estimator"},
    {"sim"},
    {"sweeps"},
    {"data"},
    {"train"},
    {"cli", "__main__", "__init__"},
]
MAX_LINES = 400


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: Path) -> set[str]:
    """The fxcost modules ``path`` imports when it runs (``from a import b`` of a submodule ``b`` is
    an import of ``a.b``)."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for child in node.body for n in ast.walk(child))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("fxcost"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fxcost"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
    return found


GRAPH = {name: _imports(path) for name, path in MODULES.items()}


def _layer(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    for rank, layer in enumerate(LAYERS):
        if top in layer:
            return rank
    raise AssertionError(f"{module} belongs to no layer of tests/test_layout.py; add its package there")


def test_every_module_has_a_layer() -> None:
    for module in MODULES:
        _layer(module)


def test_imports_are_absolute() -> None:
    """A relative import would escape the graph below; the package writes none."""
    relative = [
        f"{name}: from {'.' * node.level}{node.module or ''}"
        for name, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level
    ]
    assert not relative, "\n".join(relative)


def test_imports_point_down_the_layers() -> None:
    upward = []
    for module, imported in GRAPH.items():
        for target in imported:
            same_package = module.split(".")[:2] == target.split(".")[:2]
            if not same_package and _layer(target) > _layer(module):
                upward.append(f"{module} imports {target}")
    assert not upward, "imports against the pipeline:\n" + "\n".join(sorted(upward))


def test_no_import_cycles() -> None:
    """Tarjan's strongly connected components: any component of more than one module is a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(GRAPH)))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH.get(v, ()):
            if w not in GRAPH:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_the_checks_catch_what_they_guard_against() -> None:
    """The graph sees lazy imports and submodule imports (else the tests above could not fail)."""
    assert "fxcost.cost_models.roofline" in GRAPH["fxcost.data.neusight"]  # inside a function
    assert "fxcost.cli.step_commands" in GRAPH["fxcost.cli.parser"]  # ``from fxcost.cli import x``
    assert _layer("fxcost.sim.plan") > _layer("fxcost.estimator.captured") > _layer("fxcost.capture.step")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_stay_small(module: str) -> None:
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines; split it along its concerns"


def test_public_names_are_listed_once() -> None:
    """``fxcost/__init__.py`` maps each public name to its module; the TYPE_CHECKING imports say the
    same to type checkers. They must agree, and every name must resolve."""
    import fxcost

    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    typed: dict[str, tuple[str, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.module is not None
                for alias in imp.names:
                    typed[alias.asname or alias.name] = (imp.module, alias.name)
    assert typed == fxcost._EXPORTS
    assert sorted(fxcost.__all__) == sorted(["__version__", *fxcost._EXPORTS])
    for name in fxcost._EXPORTS:
        assert getattr(fxcost, name) is not None


def test_importing_fxcost_and_its_help_import_no_torch() -> None:
    code = (
        "import sys\n"
        "import fxcost\n"
        "from fxcost.cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "simulate" in result.stdout
