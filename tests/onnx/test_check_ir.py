"""The check tool reads and compares models through onnx_ir, like the exporter: protobuf stays at
its boundary, where the model is loaded and shape inference runs (``_load``), where the
``test_data_set`` ``.pb`` files are read, and where the runtimes take protobuf or its bytes. So
does ``torchscan.onnx.to_torch``: protobuf where onnx.checker, shape inference and the inliner
run, and where the model is read into onnx_ir."""

from __future__ import annotations

import ast
from pathlib import Path

import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto
from onnx import helper as oh

import torchscan.onnx
from torchscan.onnx._check import _runtimes
from torchscan.onnx._lint import _load

CHECK = Path(torchscan.onnx.__file__).parent / "_check"

PROTO_CLASSES = frozenset(
    {
        "ModelProto",
        "GraphProto",
        "NodeProto",
        "TypeProto",
        "ValueInfoProto",
        "TensorShapeProto",
        "FunctionProto",
        "OperatorSetIdProto",
    }
)
"""The protobuf messages of a model that the analyses read in onnx_ir instead."""

PROTO_METHODS = frozenset(
    {"HasField", "WhichOneof", "SerializeToString", "FromString", "ParseFromString", "CopyFrom"}
)
"""Methods that only protobuf messages have: a call of one reads or writes a proto."""

BOUNDARY = {
    # the public API takes a ModelProto, and hands it to _lint._load
    "_compare.py": {"check", "_check"},
    # the test_data_set_* .pb files are protobuf by nature
    "_inputs.py": {"_read_proto"},
    # the runtime: onnx.reference hands its operators NodeProtos
    "_reference_ops.py": {"_empty_stacks"},
}
"""Where the check tool may refer to protobuf: module -> the functions and classes (at the top
level of the module) that may."""

LINT = CHECK.parent / "_lint"

LINT_BOUNDARY = {
    "_load.py": {
        # (the file, bytes or proto read by torchscan.onnx._files, which import shares)
        # shape inference (onnx's C++, on protobuf), and the one reading into onnx_ir
        "LoadedModel",
        "read_model",
        "typed_model",
        "_with_inferred_types",
        "_deserialize",
        "_mark_untyped_tensors",
    },
    # the lint of a proto, for callers that hold one: inferred and read by _load first
    "_driver.py": {"lint"},
}
"""Where the lint may refer to protobuf."""


def _protobuf_uses(source: str) -> list[tuple[str, int, str]]:
    """Every use of protobuf in ``source``: (the top-level function or class it is in, or ``""``
    at the module's level; its line; what it uses)."""
    found = []

    def visit(node: ast.AST, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = scope
            if not scope and isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
            ):
                inner = child.name
            used = _used(child)
            if used:
                found.append((inner, getattr(child, "lineno", 0), used))
            visit(child, inner)

    visit(ast.parse(source), "")
    return found


def _used(node: ast.AST) -> str | None:
    """What protobuf ``node`` itself uses, or None."""
    if isinstance(node, ast.Attribute):
        if node.attr in PROTO_CLASSES or node.attr in PROTO_METHODS:
            return node.attr
        if node.attr == "helper" and isinstance(node.value, ast.Name) and node.value.id == "onnx":
            return "onnx.helper"
    if isinstance(node, ast.Name) and node.id in PROTO_CLASSES:
        return node.id
    if isinstance(node, ast.Import) and any(
        a.name == "onnx.helper" or a.name.startswith("onnx.helper.") for a in node.names
    ):
        return "onnx.helper"
    if isinstance(node, ast.ImportFrom) and node.module:
        if node.module == "onnx.helper" or node.module.startswith("onnx.helper."):
            return "onnx.helper"
        names = {a.name for a in node.names}
        if node.module == "onnx" and names & (PROTO_CLASSES | {"helper"}):
            return f"from onnx import {', '.join(sorted(names))}"
    return None


@pytest.mark.parametrize("part", ["check", "lint", "import"])
def test_models_are_read_in_onnx_ir_outside_the_boundary(part: str) -> None:
    """The check tool (``_check``), the lint (``_lint``) and ``to_torch`` (``_import``), each
    within its own list."""
    folder, boundary = {
        "check": (CHECK, BOUNDARY),
        "lint": (LINT, LINT_BOUNDARY),
        "import": (IMPORT, IMPORT_BOUNDARY),
    }[part]
    outside = [
        f"{path.name}:{line}: {used} (in {scope or 'the module'})"
        for path in sorted(folder.glob("*.py"))
        for scope, line, used in _protobuf_uses(path.read_text())
        if scope not in boundary.get(path.name, set())
    ]
    assert outside == []


def test_every_boundary_function_exists_and_uses_protobuf() -> None:
    """The list of the boundary is no larger than it needs to be."""
    for folder, boundary in ((CHECK, BOUNDARY), (LINT, LINT_BOUNDARY), (IMPORT, IMPORT_BOUNDARY)):
        for module, allowed in boundary.items():
            uses = {scope for scope, _, _ in _protobuf_uses((folder / module).read_text())}
            assert allowed <= uses, (module, allowed - uses)


IMPORT = CHECK.parent / "_import"

IMPORT_BOUNDARY = {
    # the public API takes a ModelProto
    "__init__.py": {"to_torch"},
    "_graph.py": {
        # onnx.checker, shape inference for untyped outputs, the lint (which infers shapes
        # first), the inliner: onnx's own functions, on protobuf
        "compile_model",
        "_typed_outputs",
        "_lint",
        # the one reading into onnx_ir, and what onnx_ir cannot read, refused by name first
        "_read",
        "_graphs_of",
        "_unreadable",
    },
}
"""Where ``torchscan.onnx.to_torch`` may refer to protobuf: the model is read into onnx_ir once,
and compiled, weighed and checked from there."""


@pytest.mark.parametrize(
    ("source", "used"),
    [
        ("def f(m: onnx.ModelProto) -> None: ...", "ModelProto"),
        ("from onnx import GraphProto", "from onnx import GraphProto"),
        ("from onnx import helper as oh", "from onnx import helper"),
        ("import onnx.helper", "onnx.helper"),
        ("def f(t):\n    return onnx.helper.tensor_dtype_to_np_dtype(t)", "onnx.helper"),
        ("def f(t):\n    return t.WhichOneof('value')", "WhichOneof"),
        ("def f(d):\n    return d.HasField('dim_value')", "HasField"),
        ("class C:\n    def f(self, v: ValueInfoProto) -> None: ...", "ValueInfoProto"),
    ],
)
def test_the_rule_finds_protobuf(source: str, used: str) -> None:
    (found,) = _protobuf_uses(source)
    assert found[2] == used


def test_the_rule_names_the_top_level_function() -> None:
    source = "def outer():\n    def inner(t):\n        return t.WhichOneof('v')\n    return inner"
    assert _protobuf_uses(source) == [("outer", 3, "WhichOneof")]


def _scan_model() -> onnx.ModelProto:
    body = oh.make_graph(
        [oh.make_node("Add", ["h_in", "x_t"], ["h_out"]), oh.make_node("Neg", ["h_out"], ["y_t"])],
        "body",
        [oh.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("h_in", "x_t")],
        [oh.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("h_out", "y_t")],
    )
    scan = oh.make_node("Scan", ["h0", "xs"], ["hT", "ys"], body=body, num_scan_inputs=1)
    graph = oh.make_graph(
        [scan],
        "main",
        [
            oh.make_tensor_value_info("h0", TensorProto.FLOAT, [2]),
            oh.make_tensor_value_info("xs", TensorProto.FLOAT, ["T", 2]),
        ],
        [
            oh.make_tensor_value_info("hT", TensorProto.FLOAT, [2]),
            oh.make_tensor_value_info("ys", TensorProto.FLOAT, ["T", 2]),
        ],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 16)])


def test_check_reads_a_model_into_onnx_ir_once_and_serializes_it_once(monkeypatch) -> None:
    """Read once as given and once with the types shape inference adds (which the lint reads),
    whatever the runtimes; onnxruntime's two levels run the bytes of one serialization."""
    read: list[onnx.ModelProto] = []
    ran: list[bytes] = []
    deserialize, run = ir.serde.deserialize_model, _runtimes.run_onnxruntime

    def counted_deserialize(proto: onnx.ModelProto) -> ir.Model:
        read.append(proto)
        return deserialize(proto)

    def counted_run(data: bytes, *args: object) -> list:
        ran.append(data)
        return run(data, *args)

    monkeypatch.setattr(ir.serde, "deserialize_model", counted_deserialize)
    monkeypatch.setattr(_runtimes, "run_onnxruntime", counted_run)
    model = _scan_model()
    report = torchscan.onnx.check(model)
    assert report.ok, report
    assert len(read) == 2
    assert read[0] is not model  # inferred
    assert read[1] is model  # as given
    assert len(ran) == 2
    assert ran[0] is ran[1]


def test_the_runtimes_run_the_model_as_loaded() -> None:
    model = _scan_model()
    loaded = _load.load(model)
    assert loaded.proto is model
    assert isinstance(loaded.model, ir.Model)
    assert isinstance(loaded.typed, ir.Model)
    assert loaded.data == model.SerializeToString()
