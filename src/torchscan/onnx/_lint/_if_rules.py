"""The rules of ``If`` nodes that the lint applies: the shapes its branches give its outputs.

An ``If`` whose branches give an output different shapes (``[?, 3]`` after a loop ran, a static
``[0, 3]`` after none) is a trap: before opset 11 the specification wants one shape, and shape
inference keeps one branch's for the output, which onnxruntime's graph optimizations then take as
the truth (a ``Shape`` of it folds to a constant that is wrong for the other branch). So before
opset 11 the branches must not disagree: another rank, two static sizes that differ, or a static
size against a named dimension (a size that varies from run to run) is reported; an unnamed
unknown size is not. From opset 11 the output may take either shape, and the shape given to it
must admit both: there only contradictions are reported, never a dimension unknown on either side.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx.defs
import onnx_ir as ir

from torchscan.onnx import _ir
from torchscan.onnx._lint._report import Finding
from torchscan.onnx._lint._rules import RULES
from torchscan.onnx._lint._site import Dims, _dims, _text


def if_nodes(graph: ir.Graph | ir.Function, prefix: str) -> Iterator[tuple[ir.Node, str]]:
    """Every ``If`` node under ``graph``, bodies included, with its path."""
    for index, node in enumerate(graph):
        label = f"{node.op_type} {node.name!r}" if node.name else f"{node.op_type} #{index}"
        path = prefix + label
        if _ir.is_default_domain(node.domain) and node.op_type == "If":
            yield node, path
        for attr in node.attributes.values():
            if attr.is_ref():
                continue
            if attr.type == ir.AttributeType.GRAPH:
                yield from if_nodes(attr.as_graph(), f"{path} > {attr.name} > ")
            elif attr.type == ir.AttributeType.GRAPHS:
                for i, body in enumerate(attr.as_graphs()):
                    yield from if_nodes(body, f"{path} > {attr.name}[{i}] > ")


def lint_if(node: ir.Node, path: str, opset: int, findings: list[Finding]) -> None:
    """Append to ``findings`` what ``node``, an ``If`` of a graph at ``opset``, breaks."""
    try:
        since = onnx.defs.get_schema("If", opset, "").since_version
    except onnx.defs.SchemaError:
        return
    branches = [node.attributes.get(name) for name in ("then_branch", "else_branch")]
    if any(b is None or b.is_ref() or b.type != ir.AttributeType.GRAPH for b in branches):
        return  # a broken If is onnx.checker's to report
    then_graph, else_graph = (b.as_graph() for b in branches)  # type: ignore[union-attr]
    op = f"If-{since}"
    for k, output in enumerate(node.outputs):
        if k >= len(then_graph.outputs) or k >= len(else_graph.outputs):
            return
        then_dims, else_dims = _dims(then_graph.outputs[k]), _dims(else_graph.outputs[k])
        name = output.name or f"#{k}"
        if since < 11 and _disagree(then_graph.outputs[k], else_graph.outputs[k]):
            # outputs whose shapes disagree have shapes: tensors
            assert then_dims is not None
            assert else_dims is not None
            _report(
                findings,
                path,
                op,
                "if-branch-shapes",
                f"output {name!r} is {_text(then_dims)} in then_branch but "
                f"{_text(else_dims)} in else_branch; shape inference keeps one of them for "
                f"the output, and a runtime may fold sizes read from it into constants. "
                f"Leave the dimensions that differ unknown in the branches' outputs, or "
                f"use opset 11 or later.",
            )
            continue
        declared = _dims(output)
        if declared is None:
            continue
        for branch, dims in (("then_branch", then_dims), ("else_branch", else_dims)):
            if dims is not None and not _compatible(declared, dims):
                rule = "if-output-shape" if since >= 11 else "if-branch-shapes"
                _report(
                    findings,
                    path,
                    op,
                    rule,
                    f"output {name!r} is given shape {_text(declared)}, but {branch} makes it "
                    f"{_text(dims)}; a runtime may take the given shape as the truth. Leave the "
                    f"dimensions the branches disagree on unknown.",
                )
                break


def _disagree(a: ir.Value, b: ir.Value) -> bool:
    """Whether two branch outputs have shapes that cannot be the same on every run: another
    rank, two static sizes that differ, or a static size against a named dimension (a size that
    varies from run to run); an unnamed unknown size says nothing."""
    if a.shape is None or b.shape is None:
        return False
    if a.shape.rank() != b.shape.rank():
        return True
    for x, y in zip(a.shape.dims, b.shape.dims, strict=True):
        if isinstance(x, int) and isinstance(y, int):
            if x != y:
                return True
        elif isinstance(x, int) or isinstance(y, int):
            symbolic = y if isinstance(x, int) else x
            name = getattr(symbolic, "value", None)
            if name and not name.startswith(INFERRED_NAME):
                return True
    return False


INFERRED_NAME = "unk__"
"""How ONNX shape inference names a dimension it does not know (``unk__0``): a name that says
nothing of the size, unlike one the model gives (``T``, ``s0``)."""


def _compatible(a: Dims, b: Dims) -> bool:
    """Whether one tensor could have both shapes: the same rank, and no static size that
    differs."""
    return len(a) == len(b) and all(
        x is None or y is None or x == y for x, y in zip(a, b, strict=False)
    )


def _report(findings: list[Finding], path: str, op: str, rule: str, message: str) -> None:
    known = RULES[rule]
    findings.append(Finding(path, op, rule, message, known.quote, known.source))
