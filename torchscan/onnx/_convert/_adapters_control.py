"""Adapters for control flow: Loop, Scan and If across their versions, and the operators that a
Loop or a Scan computes before they exist (Range, CumSum).

Each adapter is registered for ``("", op, b)`` and returns nodes valid at opset ``b - 1`` (see
``_adapters_attributes``); each docstring quotes the change of the specification it undoes.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from torchscan.onnx._convert._context import (
    FLOATS,
    Context,
    attribute,
    np_dtype,
    set_attribute,
)
from torchscan.onnx._convert._registry import register

_INT64, _BOOL = ir.DataType.INT64, ir.DataType.BOOL


@register("", "If", 11)
def _if_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
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


def range_nodes(
    ctx: Context,
    node: ir.Node,
    boundary: int,
    start: ir.Value,
    limit: ir.Value,
    delta: ir.Value,
    output: ir.Value | None = None,
) -> tuple[list[ir.Node], ir.Value]:
    """The nodes computing ``Range(start, limit, delta)`` with a Loop (see ``_range_11``), and
    their result, which replaces ``output`` where given; refusals name ``node``."""
    elem = ctx.elem_type(start)
    if elem is None:
        raise ctx.refuse(node, boundary, "the type of its inputs is unknown")
    difference = ctx.make_node("Sub", [limit, start])
    made = [difference]
    if elem in FLOATS:
        quotient = ctx.make_node("Div", [difference.outputs[0], delta])
        count = ctx.make_node("Ceil", [quotient.outputs[0]])
        made += [quotient, count]
    else:
        step = ctx.const(delta)
        if step is None:
            raise ctx.refuse(
                node, boundary, "counting the elements of an integer range needs the sign of "
                "delta, and its delta is computed at run time"
            )  # fmt: skip
        sign = ctx.add_const(np.sign(step).astype(step.dtype), "sign")
        widened = ctx.make_node("Add", [difference.outputs[0], delta])
        rounded = ctx.make_node("Sub", [widened.outputs[0], sign])
        count = ctx.make_node("Div", [rounded.outputs[0], delta])
        made += [widened, rounded, count]
    for m in made:
        ctx.set_type(m.outputs[0], elem, [])
    trip_count = ctx.make_node("Cast", [count.outputs[0]], to=_INT64)
    ctx.set_type(trip_count.outputs[0], _INT64, [])
    iteration = ctx.value("i", _INT64, [])
    condition = ctx.value("condition", _BOOL, [])
    carried = ctx.value("unused", _INT64, [])
    condition_out = ctx.make_node("Identity", [condition])
    condition_out.outputs[0].name = ctx.fresh("condition_out")
    ctx.set_type(condition_out.outputs[0], _BOOL, [])
    carried_out = ctx.make_node("Identity", [carried])
    carried_out.outputs[0].name = ctx.fresh("unused_out")
    ctx.set_type(carried_out.outputs[0], _INT64, [])
    index = ctx.make_node("Cast", [iteration], to=elem)
    scaled = ctx.make_node("Mul", [index.outputs[0], delta])
    value = ctx.make_node("Add", [start, scaled.outputs[0]])
    ctx.set_type(value.outputs[0], elem, [])
    body = ir.Graph(
        [iteration, condition, carried],
        [condition_out.outputs[0], carried_out.outputs[0], value.outputs[0]],
        nodes=[condition_out, carried_out, index, scaled, value],
        name=ctx.fresh("range_body"),
    )
    # Loop-1 needs a carried value: an unused one
    unused = ctx.add_const(np.int64(0), "unused")
    loop = ctx.make_node("Loop", [trip_count.outputs[0], None, unused], [None, output], body=body)
    loop.outputs[0].name = ctx.fresh("unused_final")
    return [*made, trip_count, loop], loop.outputs[1]


@register("", "Range", 11)
def _range_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """Range does not exist before opset 11. A Loop emits ``start + i * delta`` for
    ``i < ceil((limit - start) / delta)``, the definition of Range, computed in the type of its
    inputs; a negative count runs no iteration. For integers, the ceiling of the quotient is
    ``(limit - start + delta - sign(delta)) / delta`` with division truncating towards zero, which
    needs a constant ``delta``."""
    start, limit, delta = node.inputs
    made, _ = range_nodes(ctx, node, boundary, start, limit, delta, node.outputs[0])
    return made


@register("", "CumSum", 11)
def _cumsum_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """CumSum does not exist before opset 11. A Scan along ``axis`` adds one slice at a time to
    a running sum, in the order CumSum sums (backwards for ``reverse=1``), and emits the sum
    after each slice, or before it for ``exclusive=1``."""
    x = node.inputs[0]
    axis_value = ctx.require_const(node, boundary, 1, "axis")
    rank = ctx.require_rank(node, boundary, x)
    elem = ctx.elem_type(x)
    if elem is None:
        raise ctx.refuse(node, boundary, "the type of its input is unknown")
    axis = int(axis_value.reshape(-1)[0]) % rank
    shape = ctx.shape(x) or [None] * rank
    slice_shape = shape[:axis] + shape[axis + 1 :]
    made: list[ir.Node] = []
    if None not in slice_shape:
        zeros = ctx.add_const(np.zeros(slice_shape, np_dtype(elem)), "zeros")
    else:
        whole = ctx.make_node("Shape", [x])
        others = [d for d in range(rank) if d != axis]
        kept = ctx.make_node("Gather", [whole.outputs[0], ctx.add_const(np.array(others), "axes")])
        filled = ctx.make_node(
            "ConstantOfShape", [kept.outputs[0]], value=np.zeros(1, np_dtype(elem))
        )
        ctx.set_type(filled.outputs[0], elem, slice_shape)
        made += [whole, kept, filled]
        zeros = filled.outputs[0]
    running = ctx.value("running_sum", elem, slice_shape)
    piece = ctx.value(f"{x.name}_slice", elem, slice_shape)
    total = ctx.make_node("Add", [running, piece])
    total.outputs[0].name = ctx.fresh("running_sum_next")
    exclusive = attribute(node, "exclusive", 0)
    emitted = ctx.make_node("Identity", [running if exclusive else total.outputs[0]])
    emitted.outputs[0].name = ctx.fresh(f"{node.outputs[0].name}_slice")
    for made_node in (total, emitted):
        ctx.set_type(made_node.outputs[0], elem, slice_shape)
    body = ir.Graph(
        [running, piece],
        [total.outputs[0], emitted.outputs[0]],
        nodes=[total, emitted],
        name=ctx.fresh("cumsum_body"),
    )
    reverse = attribute(node, "reverse", 0)
    scan = ctx.make_node(
        "Scan", [zeros, x], [None, node.outputs[0]], body=body,
        num_scan_inputs=1, scan_input_axes=[axis], scan_output_axes=[axis],
        scan_input_directions=[reverse], scan_output_directions=[reverse],
    )  # fmt: skip
    scan.outputs[0].name = ctx.fresh("running_sum_final")
    return [*made, scan]


# -- Loop and Scan --------------------------------------------------------------------------------


@register("", "Loop", 11)
def _loop_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """Loop-11 allows a loop without carried values; Loop-1 needs at least one, so an unused
    one is added to the node and its body."""
    if len(node.inputs) > 2:
        return [node]
    body = attribute(node, "body")
    carried = ctx.value("unused", _INT64, [])
    passed = ctx.make_node("Identity", [carried])
    passed.outputs[0].name = ctx.fresh("unused_out")
    ctx.set_type(passed.outputs[0], _INT64, [])
    body.inputs.append(carried)
    body.append(passed)
    body.outputs.insert(1, passed.outputs[0])
    inputs = [*node.inputs, None, None][:2]
    loop = ir.Node(
        "", "Loop", [*inputs, ctx.add_const(np.int64(0), "unused")],
        attributes=list(node.attributes.values()), num_outputs=len(node.outputs) + 1,
        name=node.name,
    )  # fmt: skip
    loop.outputs[0].name = ctx.fresh("unused_final")
    for old, new in zip(node.outputs, loop.outputs[1:], strict=True):
        ctx.replace(old, new)
    return [loop]


@register("", "Scan", 11)
def _scan_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """Scan-11 lets ``scan_input_axes`` and ``scan_output_axes`` count from the back; they are
    counted from the front. A scanned output has one axis more than the body's output."""
    scanned = attribute(node, "num_scan_inputs")
    carried = len(node.inputs) - scanned
    input_axes = attribute(node, "scan_input_axes")
    output_axes = attribute(node, "scan_output_axes")
    if input_axes and any(a < 0 for a in input_axes):
        ranks = [ctx.require_rank(node, boundary, x) for x in node.inputs[carried:]]
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


@register("", "Scan", 9)
def _scan_9(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
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
    before: list[ir.Node] = []
    after: list[ir.Node] = []
    inputs: list[ir.Value | None] = [None]  # no sequence_lens: every sequence is scanned whole
    for i, x in enumerate(node.inputs):
        elem, shape = ctx.elem_type(x), ctx.shape(x)
        axis = input_axes[i - carried] if i >= carried else 0
        if axis:
            rank = ctx.require_rank(node, boundary, x)
            perm = [axis, *(d for d in range(rank) if d != axis)]
            moved = ctx.make_node("Transpose", [x], perm=perm)
            shape = [shape[p] for p in perm] if shape else None
            ctx.set_type(moved.outputs[0], elem, shape)
            before.append(moved)
            x = moved.outputs[0]
        batched = ctx.make_node("Unsqueeze", [x], axes=[0])
        ctx.set_type(batched.outputs[0], elem, [1, *shape] if shape is not None else None)
        before.append(batched)
        inputs.append(batched.outputs[0])
    scan = ir.Node(
        "", "Scan", inputs, num_outputs=len(node.outputs), name=node.name,
        attributes=[
            ir.AttrInt64("num_scan_inputs", scanned), ir.AttrGraph("body", attribute(node, "body"))
        ],
    )  # fmt: skip
    input_directions = attribute(node, "scan_input_directions")
    if input_directions and any(input_directions):
        set_attribute(scan, "directions", input_directions)
    for j, (y, batched) in enumerate(zip(node.outputs, scan.outputs, strict=True)):
        elem, shape = ctx.elem_type(y), ctx.shape(y)
        batched.name = ctx.fresh(f"{y.name}_batched")
        if j < carried:
            ctx.set_type(batched, elem, [1, *shape] if shape is not None else None)
            after.append(ctx.make_node("Squeeze", [batched], [y], axes=[0]))
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
            reversed_ = _reversed(ctx, node, boundary, batched, elem, stacked)
            after.append(reversed_)
            current = reversed_.outputs[0]
        unbatched = ctx.make_node("Squeeze", [current], [y] if not axis else None, axes=[0])
        if axis:
            ctx.set_type(unbatched.outputs[0], elem, stacked)
        after.append(unbatched)
        if axis:
            inverse = [perm.index(d) for d in range(rank)]
            after.append(ctx.make_node("Transpose", [unbatched.outputs[0]], [y], perm=inverse))
    return [*before, scan, *after]


def _reversed(
    ctx: Context,
    node: ir.Node,
    boundary: int,
    stacked: ir.Value,
    elem: ir.DataType | None,
    shape: list[int | None] | None,
) -> ir.Node:
    """A Scan-8 that returns the batched sequence ``stacked`` in reverse order."""
    if elem is None:
        raise ctx.refuse(node, boundary, f"the type of its output '{stacked.name}' is unknown")
    element_shape = shape[1:] if shape is not None else None
    element = ctx.value(f"{stacked.name}_element", elem, element_shape)
    passed = ctx.make_node("Identity", [element])
    passed.outputs[0].name = ctx.fresh(f"{stacked.name}_element_out")
    ctx.set_type(passed.outputs[0], elem, element_shape)
    body = ir.Graph([element], [passed.outputs[0]], nodes=[passed], name=ctx.fresh("reverse_body"))
    reversed_ = ctx.make_node("Scan", [None, stacked], body=body, num_scan_inputs=1, directions=[1])
    ctx.set_type(reversed_.outputs[0], elem, [1, *shape] if shape is not None else None)
    return reversed_
