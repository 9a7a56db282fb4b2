"""Adapters for control flow: If, Loop and Scan across their versions, and the operators that a
Loop or a Scan computes before they exist (Range, CumSum).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from torchscan.onnx._export._convert._blocks import range_by_loop
from torchscan.onnx._export._convert._context import (
    Builder,
    Context,
    attribute,
    np_dtype,
    required,
    set_attribute,
    static_shape,
)
from torchscan.onnx._export._convert._registry import adapters

_INT64 = ir.DataType.INT64


@adapters("If")
class If:
    """If: branches that return different shapes at opset 11."""

    @staticmethod
    def below_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """If-11 lets the branches return tensors of different shapes; If-1 says the outputs of the
        two branches "must be of the same shape". The node is kept unless the shapes known for an
        output differ."""
        then_branch, else_branch = attribute(node, "then_branch"), attribute(node, "else_branch")
        for i, (then_output, else_output) in enumerate(
            zip(then_branch.outputs, else_branch.outputs, strict=True)
        ):
            if _shapes_differ(then_output, else_output):
                raise ctx.refuse(
                    node, boundary, f"its branches return output {i} in different shapes, which "
                    "If-1 does not allow"
                )  # fmt: skip
        return [node]


def _shapes_differ(a: ir.Value, b: ir.Value) -> bool:
    if a.shape is None or b.shape is None:
        return False
    if len(a.shape) != len(b.shape):
        return True
    return any(
        isinstance(x, int) and isinstance(y, int) and x != y
        for x, y in zip(a.shape.dims, b.shape.dims, strict=True)
    )


@adapters("Loop")
class Loop:
    """Loop: no carried value at opset 11."""

    @staticmethod
    def below_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """Loop-11 allows a loop without carried values; Loop-1 needs at least one, so an unused
        one is added to the node and its body."""
        if len(node.inputs) > 2:
            return [node]
        body = attribute(node, "body")
        carried = ctx.value("unused", _INT64, [])
        steps = Builder(ctx)
        passed = steps.op("Identity", [carried], _INT64, [])
        passed.name = ctx.fresh("unused_out")
        body.inputs.append(carried)
        body.extend(steps.nodes)
        body.outputs.insert(1, passed)
        inputs = [*node.inputs, None, None][:2]
        attributes: dict[str, Any] = dict(node.attributes)
        b = Builder(ctx)
        b.node(
            "Loop", [*inputs, ctx.add_const(np.int64(0), "unused")],
            ["unused_final", *node.outputs], name=node.name or "", **attributes,
        )  # fmt: skip
        return b.nodes


@adapters("Scan")
class Scan:
    """Scan: Scan-9 without batch axis, with scan axes and directions; axes that count from the
    back at opset 11."""

    @staticmethod
    def below_9(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """Scan-8 has a leading batch axis on every carried value and sequence, scans sequences
        along axis 1, takes ``sequence_lens`` first, and has no scan axes nor output directions;
        Scan-9 has none of that. Every input gets a batch axis of 1 (after moving its scan axis to
        the front), every output loses it; an output that Scan-9 prepends is reversed by a second
        Scan-8 whose body passes each element through, as its input is scanned backwards. The body
        stays as it is."""
        scanned = attribute(node, "num_scan_inputs")
        carried = len(node.inputs) - scanned
        outputs = len(node.outputs) - carried
        input_axes = attribute(node, "scan_input_axes") or [0] * scanned
        output_axes = attribute(node, "scan_output_axes") or [0] * outputs
        output_directions = attribute(node, "scan_output_directions") or [0] * outputs
        b = Builder(ctx)
        inputs: list[ir.Value | None] = [None]  # no sequence_lens: every sequence is scanned whole
        for i, x in enumerate(node.inputs):
            assert x is not None  # Scan-9 has no optional input
            elem, shape = ctx.elem_type(x), ctx.shape(x)
            axis = input_axes[i - carried] if i >= carried else 0
            if axis:
                rank = ctx.require_rank(node, boundary, x)
                perm = [axis, *(d for d in range(rank) if d != axis)]
                shape = [shape[p] for p in perm] if shape else None
                x = b.op("Transpose", [x], elem, shape, perm=perm)
            batched = b.op(
                "Unsqueeze", [x], elem, [1, *shape] if shape is not None else None, axes=[0]
            )
            inputs.append(batched)
        scan = b.node(
            "Scan", inputs, [f"{y.name}_batched" for y in node.outputs], name=node.name or "",
            num_scan_inputs=ir.AttrInt64("num_scan_inputs", scanned),
            body=ir.AttrGraph("body", attribute(node, "body")),
        )  # fmt: skip
        input_directions = attribute(node, "scan_input_directions")
        if input_directions and any(input_directions):
            set_attribute(scan, "directions", input_directions)
        for j, (y, batched) in enumerate(zip(node.outputs, scan.outputs, strict=True)):
            elem, shape = ctx.elem_type(y), ctx.shape(y)
            if j < carried:
                ctx.set_type(batched, elem, [1, *shape] if shape is not None else None)
                b.op("Squeeze", [batched], None, output=y, axes=[0])
                continue
            axis = output_axes[j - carried]
            rank = len(shape) if shape is not None else None
            if axis and rank is None:
                raise ctx.refuse(node, boundary, f"the rank of its output '{y.name}' is unknown")
            perm = [axis, *(d for d in range(rank) if d != axis)] if rank is not None else []
            stacked = [shape[p] for p in perm] if shape is not None else None
            ctx.set_type(batched, elem, [1, *stacked] if stacked is not None else None)
            current = batched
            if output_directions[j - carried]:
                current = _reversed(b, node, boundary, batched, elem, stacked)
            unbatched = b.op(
                "Squeeze", [current], elem, stacked, output=None if axis else y, axes=[0]
            )
            if axis:
                assert rank is not None  # refused above otherwise
                inverse = [perm.index(d) for d in range(rank)]
                b.op("Transpose", [unbatched], None, output=y, perm=inverse)
        return b.nodes

    @staticmethod
    def below_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """Scan-11 lets ``scan_input_axes`` and ``scan_output_axes`` count from the back; they are
        counted from the front. A scanned output has one axis more than the body's output."""
        scanned = attribute(node, "num_scan_inputs")
        carried = len(node.inputs) - scanned
        input_axes = attribute(node, "scan_input_axes")
        output_axes = attribute(node, "scan_output_axes")
        if input_axes and any(a < 0 for a in input_axes):
            ranks = [
                ctx.require_rank(node, boundary, required(node, i))
                for i in range(carried, len(node.inputs))
            ]
            counted = [a + r if a < 0 else a for a, r in zip(input_axes, ranks, strict=True)]
            set_attribute(node, "scan_input_axes", counted)
        if output_axes and any(a < 0 for a in output_axes):
            body = attribute(node, "body")
            counted = []
            for axis, emitted in zip(output_axes, body.outputs[carried:], strict=True):
                if axis < 0:
                    if emitted.shape is None:
                        raise ctx.refuse(node, boundary, f"the rank of '{emitted.name}' is unknown")
                    axis += len(emitted.shape) + 1
                counted.append(axis)
            set_attribute(node, "scan_output_axes", counted)
        return [node]


def _reversed(
    b: Builder,
    node: ir.Node,
    boundary: int,
    stacked: ir.Value,
    elem: ir.DataType | None,
    shape: list[int | None] | None,
) -> ir.Value:
    """The batched sequence ``stacked`` in reverse order, returned by a Scan-8."""
    ctx = b.ctx
    if elem is None:
        raise ctx.refuse(node, boundary, f"the type of its output '{stacked.name}' is unknown")
    element_shape = shape[1:] if shape is not None else None
    element = ctx.value(f"{stacked.name}_element", elem, element_shape)
    steps = Builder(ctx)
    passed = steps.op("Identity", [element], elem, element_shape)
    passed.name = ctx.fresh(f"{stacked.name}_element_out")
    body = ir.Graph([element], [passed], nodes=steps.nodes, name=ctx.fresh("reverse_body"))
    reversed_shape = [1, *shape] if shape is not None else None
    return b.op(
        "Scan", [None, stacked], elem, reversed_shape, body=body, num_scan_inputs=1, directions=[1]
    )


@adapters("Range")
class Range:
    """Range, which opset 11 introduced."""

    @staticmethod
    def below_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """Range does not exist before opset 11. A Loop emits ``start + i * delta`` for
        ``i < ceil((limit - start) / delta)``, the definition of Range, computed in the type of its
        inputs; a negative count runs no iteration. For integers, the ceiling of the quotient is
        ``(limit - start + delta - sign(delta)) / delta`` with division truncating towards zero,
        which needs a constant ``delta``."""
        start, limit, delta = required(node, 0), required(node, 1), required(node, 2)
        b = Builder(ctx)
        range_by_loop(b, node, boundary, start, limit, delta, node.outputs[0])
        return b.nodes


@adapters("CumSum")
class CumSum:
    """CumSum, which opset 11 introduced."""

    @staticmethod
    def below_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """CumSum does not exist before opset 11. A Scan along ``axis`` adds one slice at a time to
        a running sum, in the order CumSum sums (backwards for ``reverse=1``), and emits the sum
        after each slice, or before it for ``exclusive=1``."""
        x = required(node, 0)
        axis_value = ctx.require_const(node, boundary, 1, "axis")
        rank = ctx.require_rank(node, boundary, x)
        elem = ctx.elem_type(x)
        if elem is None:
            raise ctx.refuse(node, boundary, "the type of its input is unknown")
        axis = int(axis_value.reshape(-1)[0]) % rank
        shape = ctx.shape(x) or [None] * rank
        slice_shape = shape[:axis] + shape[axis + 1 :]
        b = Builder(ctx)
        static = static_shape(slice_shape)
        if static is not None:
            zeros = ctx.add_const(np.zeros(static, np_dtype(elem)), "zeros")
        else:
            whole = b.op("Shape", [x], None)
            others = [d for d in range(rank) if d != axis]
            kept = b.op("Gather", [whole, ctx.add_const(np.array(others), "axes")], None)
            zeros = b.op(
                "ConstantOfShape", [kept], elem, slice_shape, value=np.zeros(1, np_dtype(elem))
            )
        running = ctx.value("running_sum", elem, slice_shape)
        piece = ctx.value(f"{x.name}_slice", elem, slice_shape)
        steps = Builder(ctx)
        total = steps.op("Add", [running, piece], elem, slice_shape)
        total.name = ctx.fresh("running_sum_next")
        exclusive = attribute(node, "exclusive", 0)
        emitted = steps.op("Identity", [running if exclusive else total], elem, slice_shape)
        emitted.name = ctx.fresh(f"{node.outputs[0].name}_slice")
        body = ir.Graph(
            [running, piece], [total, emitted], nodes=steps.nodes, name=ctx.fresh("cumsum_body")
        )
        reverse = attribute(node, "reverse", 0)
        scan = b.node(
            "Scan", [zeros, x], [None, node.outputs[0]], body=body,
            num_scan_inputs=1, scan_input_axes=[axis], scan_output_axes=[axis],
            scan_input_directions=[reverse], scan_output_directions=[reverse],
        )  # fmt: skip
        scan.outputs[0].name = ctx.fresh("running_sum_final")
        return b.nodes
