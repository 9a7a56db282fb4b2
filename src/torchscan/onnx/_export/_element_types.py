"""The element types that each version of ``Scan`` and ``Loop`` allows: the one place where
torchscan refuses a loop for the type of a tensor it carries, scans or stacks.

Two checks apply the same rule (the version table of :mod:`torchscan.onnx._opsets`):
:func:`check_leaf_types` while the loop is traced, where the user's names are known (``carry['h']``,
``xs[1]``), and :func:`check_loop_types` on the finished model, in the words of the graph, for
exports that did not go through torchscan's wrapper of ``torch.onnx.export``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnx_ir as ir

from torchscan._errors import ExportError
from torchscan.onnx import _ir, _opsets


def check_leaf_types(
    api: str, target_opset: int, op: str, leaves: Sequence[tuple[str, Any]]
) -> None:
    """Refuse the first of ``leaves`` (``(name, tensor)``, named by their pytree paths) whose
    element type the ``op`` (``"Scan"`` or ``"Loop"``) in force at ``target_opset`` does not
    allow, in the words of ``api``: called while the loop is traced, where the user's names are
    known."""
    from onnx_ir.tensor_adapters import from_torch_dtype

    if not _opsets.MIN_OPSET <= target_opset <= _opsets.MAX_OPSET:
        return  # torch.onnx or the conversion refuses the opset itself
    versions, version = _versions(op, target_opset)
    for name, tensor in leaves:
        dtype = from_torch_dtype(tensor.dtype)
        if dtype in version.element_types:
            continue
        allowed, remedy = _remedy(versions, dtype, target_opset, f"cast {name}")
        raise ExportError(
            f"{api}: {name} has dtype {tensor.dtype}, which ONNX {op}-{version.since} (the "
            f"version in force at opset {target_opset}) does not allow; {allowed}. To export it, "
            f"{remedy}."
        )


def _versions(
    op: str, target_opset: int
) -> tuple[tuple[_opsets.OpVersion, ...], _opsets.OpVersion]:
    if op == "Scan":
        return _opsets.SCAN_VERSIONS, _opsets.scan_version(target_opset)
    return _opsets.LOOP_VERSIONS, _opsets.loop_version(target_opset)


def _remedy(
    versions: tuple[_opsets.OpVersion, ...], dtype: ir.DataType, target_opset: int, cast: str
) -> tuple[str, str]:
    """What allows ``dtype`` and what the user can do: a newer opset where there is one, a
    cast (``cast``, for instance ``cast carry['h']``) to a type ``target_opset`` allows."""
    first = _opsets.first_opset_allowing(versions, dtype)
    if first is None:
        return (
            f"no version of {versions[0].op} allows it",
            f"{cast} to a type that opset {target_opset} allows",
        )
    return (
        f"the first opset that allows it is {first}",
        f"export with opset_version={first} or newer, or {cast} to a type that opset "
        f"{target_opset} allows",
    )


def check_loop_types(graph: ir.Graph, target_opset: int) -> None:
    """Refuse a Scan or Loop, at any depth, whose tensors have an element type that its version
    at ``target_opset`` does not allow, naming the first opset that does."""
    for node in ir.traversal.RecursiveGraphIterator(graph):
        if node.domain not in _ir.DEFAULT_DOMAINS or node.op_type not in ("Scan", "Loop"):
            continue
        versions, version = _versions(node.op_type, target_opset)
        for role, value in _roles(node):
            dtype = value.dtype  # None where the value has no type
            if dtype is None or dtype in version.element_types:
                continue
            allowed, remedy = _remedy(versions, dtype, target_opset, "cast it")
            raise ExportError(
                f"torch.onnx.export: the {node.op_type} node {node.name!r} has {role}, tensor "
                f"{value.name!r}, of element type {dtype.name.lower()}, which "
                f"{node.op_type}-{version.since} (the version in force at opset "
                f"{target_opset}) does not allow; {allowed}. To export it, {remedy}."
            )


def _roles(node: ir.Node) -> list[tuple[str, ir.Value]]:
    """Every input and output of a Scan or Loop, with what it is to the loop."""
    inputs = [v for v in node.inputs if v is not None]
    if node.op_type == "Scan":
        n_carried = len(inputs) - node.attributes["num_scan_inputs"].as_int()
        named = [
            *((f"initial carried value {i}", v) for i, v in enumerate(inputs[:n_carried])),
            *((f"scanned sequence {i}", v) for i, v in enumerate(inputs[n_carried:])),
        ]
    else:
        n_carried = len(node.inputs) - 2
        named = []
        for i, v in enumerate(node.inputs[2:]):
            assert v is not None  # only M and cond, the first two, are optional
            named.append((f"initial carried value {i}", v))
    return [
        *named,
        *((f"final carried value {i}", v) for i, v in enumerate(node.outputs[:n_carried])),
        *((f"stacked output {i}", v) for i, v in enumerate(node.outputs[n_carried:])),
    ]
