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

# What an export runs: everything but the check tool and the command line, which may build
# models with onnx.helper.
EXPORT_PATH_EXCLUDED = ("torchscan.onnx._check", "torchscan.onnx._import", "torchscan._cli")


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


def test_the_export_path_does_not_use_onnx_helper() -> None:
    used = sorted(
        _module_name(path)
        for path in PACKAGE.rglob("*.py")
        if not _module_name(path).startswith(EXPORT_PATH_EXCLUDED)
        and _imports_onnx_helper(ast.parse(path.read_text()))
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
    assert "torchscan.onnx._hooks" in loaded  # the export did go through torchscan
    assert "rich" not in loaded
    assert not [m for m in loaded if m.startswith("torchscan.onnx._check")]


def test_lazy_names_of_the_onnx_package_resolve() -> None:
    from torchscan.onnx._check._compare import check
    from torchscan.onnx._convert import OpsetConversionError

    assert torchscan.onnx.check is check
    assert torchscan.onnx.OpsetConversionError is OpsetConversionError
    assert set(torchscan.onnx.__all__) <= set(dir(torchscan.onnx))


def test_export_options_belong_to_their_context() -> None:
    seen = []
    with torchscan.onnx.export_options(hoist_loop_invariants=False):
        thread = threading.Thread(
            target=lambda: seen.append(torchscan.onnx._options.current().hoist_loop_invariants)
        )
        thread.start()
        thread.join()
        assert not torchscan.onnx._options.current().hoist_loop_invariants
    assert seen == [True]
    assert torchscan.onnx._options.current().hoist_loop_invariants


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
