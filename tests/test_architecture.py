"""The layers of the package: no import cycles, an export that imports only what it uses, and
settings held per context rather than in module globals (docs/architecture.md)."""

from __future__ import annotations

import ast
import subprocess
import sys
import threading
from pathlib import Path

import torchscan
import torchscan.onnx

PACKAGE = Path(torchscan.__file__).parent

KNOWN_CYCLES: set[tuple[str, ...]] = set()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Every torchscan module and the torchscan modules it imports, at any depth of its code."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    imported.add(full if full in modules else node.module)
        graph[name] = {m for m in imported if m in modules and m != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    found = set()

    def walk(start: str, node: str, path: list[str]) -> None:
        for successor in graph[node]:
            if successor == start:
                found.add(tuple(sorted(path)))
            elif successor not in path and successor > start:
                walk(start, successor, [*path, successor])

    for module in graph:
        walk(module, module, [module])
    return found


def test_no_import_cycles() -> None:
    assert _cycles(_import_graph()) <= KNOWN_CYCLES


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == {("a", "b", "c")}


def _imports_onnx_helper(tree: ast.AST) -> bool:
    """Whether ``tree`` imports ``onnx.helper`` in any form, at any depth of its code."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            if any(
                a.name == "onnx.helper" or a.name.startswith("onnx.helper.") for a in node.names
            ):
                return True
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "onnx.helper" or node.module.startswith("onnx.helper."):
                return True
            if node.module == "onnx" and any(a.name == "helper" for a in node.names):
                return True
        elif (
            isinstance(node, ast.Attribute)
            and node.attr == "helper"
            and isinstance(node.value, ast.Name)
            and node.value.id == "onnx"
        ):
            return True
    return False


def test_no_module_uses_onnx_helper() -> None:
    """Models are built and read in onnx_ir; ``onnx.helper`` is for the tests' hand-built models."""
    used = sorted(
        _module_name(path)
        for path in PACKAGE.rglob("*.py")
        if _imports_onnx_helper(ast.parse(path.read_text()))
    )
    assert used == []


def test_the_onnx_helper_finder_finds_its_forms() -> None:
    for source in (
        "import onnx.helper",
        "import onnx.helper as oh",
        "from onnx import helper",
        "from onnx.helper import make_node",
        "def f():\n    import onnx\n    return onnx.helper.make_node",
    ):
        assert _imports_onnx_helper(ast.parse(source)), source
    for source in ("import onnx", "from onnx import numpy_helper", "import onnx.numpy_helper"):
        assert not _imports_onnx_helper(ast.parse(source)), source


EXPORT = """
import sys
import torch, torchscan

class Model(torch.nn.Module):
    def forward(self, xs):
        return torchscan.scan(lambda h, x: (h + x, h * 2), torch.zeros(3), xs)

torch.onnx.export(Model(), (torch.ones(4, 3),), dynamo=True, opset_version=18, verbose=False)
print(sorted(m for m in sys.modules if m == "rich" or m.startswith(("torchscan.", "rich."))))
"""


def test_an_export_imports_neither_the_check_tool_nor_rich() -> None:
    result = subprocess.run(
        [sys.executable, "-c", EXPORT], capture_output=True, text=True, check=True
    )
    loaded = set(eval(result.stdout.strip().splitlines()[-1]))
    assert "torchscan.onnx._export._hooks" in loaded  # the export did go through torchscan
    assert "rich" not in loaded
    assert not [m for m in loaded if m.startswith("torchscan.onnx._check")]


def test_lazy_names_of_the_onnx_package_resolve() -> None:
    from torchscan.onnx._check._compare import check
    from torchscan.onnx._export._convert import OpsetConversionError

    assert torchscan.onnx.check is check
    assert torchscan.onnx.OpsetConversionError is OpsetConversionError
    assert set(torchscan.onnx.__all__) <= set(dir(torchscan.onnx))


def test_export_options_belong_to_their_context() -> None:
    seen = []
    with torchscan.onnx.export_options(hoist_loop_invariants=False):
        thread = threading.Thread(
            target=lambda: seen.append(
                torchscan.onnx._export._options.current().hoist_loop_invariants
            )
        )
        thread.start()
        thread.join()
        assert not torchscan.onnx._export._options.current().hoist_loop_invariants
    assert seen == [True]
    assert torchscan.onnx._export._options.current().hoist_loop_invariants


ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def _layer_table() -> list[tuple[str, list[str]]]:
    """The rows of docs/architecture.md's table of layers, from the top: each layer's name and
    the paths (relative to the package) of its modules and folders."""
    text = ARCHITECTURE.read_text()
    section = text[text.index("## Layers") :]
    rows = []
    for line in section.splitlines()[1:]:
        if line.startswith("## "):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 2 or cells[0] in ("layer", "---") or not line.startswith("|"):
            continue
        paths = [p for p in cells[1].split("`")[1::2] if p.endswith((".py", "/"))]
        rows.append((cells[0], paths))
    return rows


def _layers_of(
    modules: dict[str, Path], table: list[tuple[str, list[str]]]
) -> dict[str, tuple[int, str]]:
    """Each module's layer (its row's position from the top, and its name): the row naming the
    module's file, else the row naming its innermost folder."""
    found = {}
    for name, path in modules.items():
        relative = path.relative_to(PACKAGE).as_posix()
        best: tuple[int, int, str] | None = None  # (length of the match, row, layer)
        for row, (layer, paths) in enumerate(table):
            for entry in paths:
                matches = relative == entry if entry.endswith(".py") else relative.startswith(entry)
                if matches and (best is None or len(entry) > best[0]):
                    best = (len(entry), row, layer)
        if best is not None:
            found[name] = (best[1], best[2])
    return found


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def test_the_layer_table_lists_every_module_once() -> None:
    table = _layer_table()
    assert len(table) >= 8
    layers = _layers_of(_modules(), table)
    assert sorted(set(_modules()) - set(layers)) == []
    listed = [entry for _, paths in table for entry in paths]
    assert len(listed) == len(set(listed))
    for entry in listed:  # no row names a module or folder that is not there
        assert (PACKAGE / entry).exists(), entry


def _upward_imports(graph: dict[str, set[str]], layers: dict[str, tuple[int, str]]) -> list[str]:
    return sorted(
        f"{module} ({layers[module][1]}) imports {imported} ({layers[imported][1]})"
        for module, imports in graph.items()
        for imported in imports
        if layers[imported][0] < layers[module][0]
    )


def test_no_module_imports_a_layer_above_its_own() -> None:
    assert _upward_imports(_import_graph(), _layers_of(_modules(), _layer_table())) == []


def test_the_layer_rule_finds_an_upward_import() -> None:
    layers = {"a": (0, "top"), "b": (1, "bottom")}
    assert _upward_imports({"a": {"b"}, "b": set()}, layers) == []
    assert _upward_imports({"a": set(), "b": {"a"}}, layers) == ["b (bottom) imports a (top)"]


EAGER_LAYERS = (
    "loop conversion",
    "plan and dispatch",
    "traced operators",
    "plan",
    "eager core",
    "foundation",
)


def test_the_eager_layers_import_neither_onnx_nor_onnxruntime() -> None:
    layers = _layers_of(_modules(), _layer_table())
    offenders = []
    for name, path in _modules().items():
        if layers[name][1] not in EAGER_LAYERS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else []
            )
            offenders += [
                f"{name}: {n}" for n in names if n.split(".")[0] in ("onnx", "onnxruntime")
            ]
    assert offenders == []


ONNX_TOP_LEVEL = {
    "__init__.py",
    "_ir.py",
    "_opsets.py",
    "_schema_diff.py",
    "_files.py",
    "_extra.py",
}
"""What ``onnx/`` keeps at its top level: the package's names and what export, check and import
share. Everything else is in the folder of its layer."""


def test_each_onnx_layer_is_one_folder() -> None:
    onnx_rows = {
        layer: paths
        for layer, paths in _layer_table()
        if any(p.startswith("onnx/") for p in paths) and layer not in ("package names",)
    }
    shared = "ONNX foundations"
    for layer, paths in onnx_rows.items():
        if layer == shared:
            assert {p.removeprefix("onnx/") for p in paths} == ONNX_TOP_LEVEL - {"__init__.py"}
        else:
            assert len(paths) == 1, (layer, paths)
            assert paths[0].endswith("/"), (layer, paths)
    top = {p.name for p in (PACKAGE / "onnx").iterdir() if p.suffix == ".py"}
    assert top == ONNX_TOP_LEVEL


def _edges_into(graph: dict[str, set[str]], sources: tuple[str, ...], target: str) -> list[str]:
    return sorted(
        f"{module} imports {imported}"
        for module, imports in graph.items()
        if module.startswith(sources)
        for imported in imports
        if imported.startswith(target)
    )


def test_neither_the_importer_nor_the_check_tool_imports_the_export() -> None:
    sources = ("torchscan.onnx._import", "torchscan.onnx._check", "torchscan.onnx._lint")
    assert _edges_into(_import_graph(), sources, "torchscan.onnx._export") == []


def test_the_edge_rule_finds_an_edge() -> None:
    graph = {"torchscan.onnx._check._x": {"torchscan.onnx._export._passes"}}
    assert _edges_into(graph, ("torchscan.onnx._check",), "torchscan.onnx._export") == [
        "torchscan.onnx._check._x imports torchscan.onnx._export._passes"
    ]


CONTEXT_RULES = {
    # what: (how it is found in a module's code, the modules allowed to)
    "creates a ContextVar": (
        lambda node: _called(node) == "ContextVar",
        {"_context.py", "onnx/_export/_options.py"},
    ),
    "reads torch.compiler.is_*": (
        lambda node: (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("is_")
            and ast.unparse(node.value) == "torch.compiler"
        ),
        {"_context.py"},
    ),
    # setattr on torch's objects: the hooks' installers, and what _compat lists; elsewhere, on
    # objects of torchscan's own or of the user's converted function
    "calls setattr": (
        lambda node: _called(node) == "setattr",
        {
            "_torch_onnx_hook.py",  # torch.onnx.export, wrapped
            "onnx/_export/_hooks.py",  # torch.onnx's exporter, hooked
            "_compat.py",  # TorchDynamo's config for one call; its mark on a function
            "_traced/_step_errors.py",  # the step kept with a body torchscan made
            "_autoloop/__init__.py",  # the converted function's attributes, as functools.wraps
            "_autoloop/_rewrite.py",  # an ast node of the rewritten source
            "onnx/_check/_ort.py",  # onnxruntime's RunOptions, to stop a run
        },
    ),
}
"""The context of a call is asked in one place (``_context.py``): no other module keeps state of
its own in a context variable or asks torch what traces it."""


def _called(node: ast.AST) -> str | None:
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def _context_offenders(sources: dict[str, str]) -> list[str]:
    return sorted(
        f"{name}:{node.lineno} {what}"
        for name, source in sources.items()
        for what, (finds, allowed) in CONTEXT_RULES.items()
        if name not in allowed
        for node in ast.walk(ast.parse(source))
        if finds(node)
    )


def test_only_the_context_module_asks_what_traces_a_call() -> None:
    sources = {
        path.relative_to(PACKAGE).as_posix(): path.read_text() for path in PACKAGE.rglob("*.py")
    }
    assert _context_offenders(sources) == []


def test_the_context_rules_find_their_forms() -> None:
    source = (
        "import contextvars\nv = contextvars.ContextVar('v')\n"
        "if torch.compiler.is_compiling():\n    setattr(torch, 'x', 1)\n"
    )
    assert _context_offenders({"_x.py": source}) == [
        "_x.py:2 creates a ContextVar",
        "_x.py:3 reads torch.compiler.is_*",
        "_x.py:4 calls setattr",
    ]


LONG_MODULES = {"_compat.py": "every private torch symbol, in one place"}
"""The modules over :data:`MODULE_LINES` lines, and why."""
MODULE_LINES = 900
FUNCTION_LINES = 80


def _sizes() -> tuple[set[str], list[str]]:
    """The modules over MODULE_LINES lines, and the functions over FUNCTION_LINES lines that
    have no docstring."""
    long_modules, undocumented = set(), []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        source = path.read_text()
        if len(source.splitlines()) > MODULE_LINES:
            long_modules.add(name)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > FUNCTION_LINES and ast.get_docstring(node) is None:
                    undocumented.append(f"{name}: {node.name} ({lines} lines)")
    return long_modules, undocumented


def test_modules_and_long_functions_stay_readable() -> None:
    long_modules, undocumented = _sizes()
    assert long_modules <= set(LONG_MODULES)
    assert undocumented == []
