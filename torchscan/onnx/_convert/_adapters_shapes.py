"""Adapters for slicing, gathering and axes: Slice's inputs and strides, negative axes and
indices (opset 11), padding of convolutions and pools, and the selecting operators that older
opsets lack (Where, ConstantOfShape; the gathering ones are in ``_adapters_gather``).

Each adapter is registered for ``("", op, b)`` and returns nodes valid at opset ``b - 1`` (see
``_adapters_attributes``); each docstring quotes the change of the specification it undoes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from torchscan.onnx._convert._adapters_attributes import REDUCE_18, truncate_inputs
from torchscan.onnx._convert._adapters_control import range_nodes
from torchscan.onnx._convert._context import (
    Context,
    attribute,
    np_dtype,
    present_inputs,
    set_attribute,
)
from torchscan.onnx._convert._registry import register

_INT64 = ir.DataType.INT64


@register("", "Slice", 10)
def _slice_10(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """Slice-10 takes ``starts``, ``ends``, ``axes`` and ``steps`` as inputs; Slice-1 takes the
    first three as attributes and has no steps. The axes with constant bounds and step 1 are
    sliced by one Slice-1. Every other axis is gathered at the indices its bounds and step
    select: found now where the bounds are constants and the axis length is known, else at run
    time (`_runtime_slice_indices`)."""
    inputs = [*present_inputs(node), None, None, None, None, None]
    starts = ctx.const(inputs[1])
    ends = ctx.const(inputs[2])
    count = _slice_axis_count(node, ctx, boundary, starts, ends)
    axes = (
        ctx.require_const(node, boundary, 3, "axes").reshape(-1) if inputs[3] is not None else None
    )
    steps = (
        ctx.require_const(node, boundary, 4, "steps").reshape(-1) if inputs[4] is not None else None
    )
    given_axes = axes is not None
    if axes is None:
        axes = np.arange(count)
    if steps is None:
        steps = np.ones(count, np.int64)
    starts = None if starts is None else starts.reshape(-1)
    ends = None if ends is None else ends.reshape(-1)
    data, output = node.inputs[0], node.outputs[0]
    constant = starts is not None and ends is not None
    unit = (steps == 1) & constant
    if unit.all():
        truncate_inputs(node, 1)
        set_attribute(node, "starts", [int(s) for s in starts])
        set_attribute(node, "ends", [int(e) for e in ends])
        if given_axes:
            set_attribute(node, "axes", [int(a) for a in axes])
        return [node]
    rank = ctx.require_rank(node, boundary, data)
    shape = list(ctx.shape(data) or [None] * rank)
    elem = ctx.elem_type(data)
    lowered: list[ir.Node] = []
    current = data
    if unit.any():
        sliced = ctx.make_node(
            "Slice", [data], starts=[int(s) for s in starts[unit]],
            ends=[int(e) for e in ends[unit]], axes=[int(a) % rank for a in axes[unit]],
        )  # fmt: skip
        sliced.outputs[0].name = ctx.fresh(f"{output.name}_sliced")
        lowered.append(sliced)
        current = sliced.outputs[0]
        for axis in axes[unit]:
            shape[int(axis) % rank] = None
    gathered = [j for j in range(count) if not unit[j]]
    for done, j in enumerate(gathered, start=1):
        axis, step = int(axes[j]) % rank, int(steps[j])
        if constant and shape[axis] is not None:
            picked = np.arange(shape[axis])[slice(int(starts[j]), int(ends[j]), step)]
            indices = ctx.add_const(picked.astype(np.int64), "indices")
            shape[axis] = len(picked)
        else:
            bounds = [
                _slice_bound(ctx, lowered, value, values, j) for value, values in
                ((inputs[1], starts), (inputs[2], ends))
            ]  # fmt: skip
            indices = _runtime_slice_indices(ctx, node, lowered, current, axis, step, *bounds)
            shape[axis] = None
        last = done == len(gathered)
        gather = ctx.make_node("Gather", [current, indices], [output] if last else None, axis=axis)
        if not last:
            gather.outputs[0].name = ctx.fresh(f"{output.name}_strided")
            ctx.set_type(gather.outputs[0], elem, shape)
        lowered.append(gather)
        current = gather.outputs[0]
    return lowered


def _slice_axis_count(
    node: ir.Node,
    ctx: Context,
    boundary: int,
    starts: np.ndarray | None,
    ends: np.ndarray | None,
) -> int:
    """How many axes a Slice slices: the length of its ``starts``, known before run time."""
    for known in (starts, ends):
        if known is not None:
            return int(known.size)
    shape = ctx.shape(node.inputs[1])
    if shape is None or len(shape) != 1 or shape[0] is None:
        raise ctx.refuse(node, boundary, "the number of axes it slices is not known")
    return shape[0]


def _slice_bound(
    ctx: Context, made: list[ir.Node], bound: ir.Value, values: np.ndarray | None, j: int
) -> ir.Value:
    """Entry ``j`` of a Slice's ``starts`` or ``ends`` as an int64 scalar."""
    if values is not None:
        return ctx.add_const(np.int64(values[j]), "bound")
    picked = _scalar_op(ctx, made, "Gather", [bound, ctx.add_const(np.int64(j), "entry")])
    if ctx.elem_type(bound) == _INT64:
        return picked
    return _scalar_op(ctx, made, "Cast", [picked], to=_INT64)


def _scalar_op(
    ctx: Context,
    made: list[ir.Node],
    op: str,
    inputs: Sequence[ir.Value],
    elem: ir.DataType = _INT64,
    **attributes: Any,
) -> ir.Value:
    node = ctx.make_node(op, inputs, **attributes)
    ctx.set_type(node.outputs[0], elem, [])
    made.append(node)
    return node.outputs[0]


def _runtime_slice_indices(
    ctx: Context,
    node: ir.Node,
    made: list[ir.Node],
    data: ir.Value,
    axis: int,
    step: int,
    start: ir.Value,
    end: ir.Value,
) -> ir.Value:
    """The indices that Slice-10 selects on ``axis`` of ``data`` with the int64 scalars
    ``start`` and ``end`` and the constant ``step``, computed when the model runs.

    The bounds are clamped as the specification says: a negative bound counts from the back,
    then both are clamped to ``[0, dim]`` for a positive step and to ``[0, dim - 1]`` (start)
    and ``[-1, dim - 1]`` (end) for a negative one. Comparisons are made in double, which is
    exact in sign for any int64 compared with an axis length, and selections by adding a
    multiple of 0 or 1, so that nothing here needs an operator that opset 8 lacks. The indices
    are then ``Range(start, end, step)``, which a Loop computes before opset 11
    (``_adapters_control.range_nodes``).
    """
    shape = ctx.shape(data)
    length = shape[axis] if shape is not None else None
    if length is not None:
        dim = ctx.add_const(np.int64(length), "dim")
    else:
        whole = ctx.make_node("Shape", [data])
        ctx.set_type(whole.outputs[0], _INT64, [len(shape) if shape else None])
        made.append(whole)
        dim = _scalar_op(
            ctx, made, "Gather", [whole.outputs[0], ctx.add_const(np.int64(axis), "axis")]
        )

    def is_less(a: ir.Value, b: ir.Value) -> ir.Value:
        a_, b_ = (
            _scalar_op(ctx, made, "Cast", [v], ir.DataType.DOUBLE, to=ir.DataType.DOUBLE)
            for v in (a, b)
        )
        less = _scalar_op(ctx, made, "Less", [a_, b_], ir.DataType.BOOL)
        return _scalar_op(ctx, made, "Cast", [less], to=_INT64)

    def select(flag: ir.Value, offset: ir.Value, base: ir.Value) -> ir.Value:
        moved = _scalar_op(ctx, made, "Mul", [offset, flag])
        return _scalar_op(ctx, made, "Add", [base, moved])

    def clamp(value: ir.Value, low: ir.Value, high: ir.Value) -> ir.Value:
        zero = ctx.add_const(np.int64(0), "zero")
        counted = select(is_less(value, zero), dim, value)
        raised = select(
            is_less(counted, low), _scalar_op(ctx, made, "Sub", [low, counted]), counted
        )
        excess = _scalar_op(ctx, made, "Sub", [high, raised])
        return select(is_less(high, raised), excess, raised)

    if step > 0:
        start = clamp(start, ctx.add_const(np.int64(0), "low"), dim)
        end = clamp(end, ctx.add_const(np.int64(0), "low"), dim)
    else:
        last = _scalar_op(ctx, made, "Sub", [dim, ctx.add_const(np.int64(1), "one")])
        start = clamp(start, ctx.add_const(np.int64(0), "low"), last)
        end = clamp(end, ctx.add_const(np.int64(-1), "low"), last)
    nodes, indices = range_nodes(ctx, node, 11, start, end, ctx.add_const(np.int64(step), "step"))
    indices.name = ctx.fresh("slice_indices")
    ctx.set_type(indices, _INT64, [None])
    made.extend(nodes)
    return indices


@register("", "Slice", 11)
def _slice_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """Slice-11 lets ``axes`` count from the back; they are counted from the front."""
    if len(present_inputs(node)) > 3:
        axes = ctx.require_const(node, boundary, 3, "axes")
        if (axes < 0).any():
            rank = ctx.require_rank(node, boundary, node.inputs[0])
            node.replace_input_with(3, ctx.add_const(np.where(axes < 0, axes + rank, axes), "axes"))
    return [node]


# -- opset 11: negative axes and indices ----------------------------------------------------------

# Each operator whose axis attribute may count from the back at opset 11, with the attribute and
# how the rank it counts in follows from the input's: an axis of Flatten may be r, of Unsqueeze
# the rank of the result, of OneHot the rank of the result too.
_AXIS_ATTRIBUTE_11 = {
    "ArgMax": ("axis", 0), "ArgMin": ("axis", 0), "Compress": ("axis", 0), "Concat": ("axis", 0),
    "Flatten": ("axis", 0), "Gather": ("axis", 0), "Hardmax": ("axis", 0),
    "LogSoftmax": ("axis", 0), "OneHot": ("axis", 1), "Scatter": ("axis", 0),
    "Softmax": ("axis", 0), "Split": ("axis", 0), "Squeeze": ("axes", 0),
    "Unsqueeze": ("axes", None), **dict.fromkeys([*REDUCE_18, "ReduceSum"], ("axes", 0)),
}  # fmt: skip


@register("", list(_AXIS_ATTRIBUTE_11), 11)
def _negative_axes_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """Opset 11 lets axes count from the back ("negative value means counting dimensions from
    the back"); they are counted from the front. Gather and Scatter also take negative indices
    from opset 11 on, and OneHot indices in [-depth, -1]: those are made non-negative too."""
    name, extra = _AXIS_ATTRIBUTE_11[node.op_type]
    value = attribute(node, name)
    values = value if isinstance(value, list) else [] if value is None else [value]
    if any(v < 0 for v in values):
        rank = ctx.require_rank(node, boundary, node.inputs[0])
        rank += len(values) if extra is None else extra
        counted = [v + rank if v < 0 else v for v in values]
        if node.op_type == "Unsqueeze":
            counted.sort()
        set_attribute(node, name, counted if isinstance(value, list) else counted[0])
    prefix: list[ir.Node] = []
    if node.op_type in ("Gather", "Scatter"):
        axis = attribute(node, "axis", 0)
        prefix, counted_indices = _indices_from_front(ctx, node, boundary, node.inputs[0], axis)
        node.replace_input_with(1, counted_indices)
    elif node.op_type == "OneHot":
        prefix, counted_indices = _one_hot_indices(ctx, node)
        node.replace_input_with(0, counted_indices)
    return [*prefix, node]


def _indices_from_front(
    ctx: Context,
    node: ir.Node,
    boundary: int,
    data: ir.Value,
    axis: int,
    indices: ir.Value | None = None,
) -> tuple[list[ir.Node], ir.Value]:
    """The nodes that count the indices of ``node`` (its input 1, or ``indices``) into axis
    ``axis`` of ``data`` from the front, and the result."""
    if indices is None:
        indices = node.inputs[1]
    value = ctx.const(indices)
    shape = ctx.shape(data)
    length = shape[axis] if shape is not None else None
    if value is not None and not (value < 0).any():
        return [], indices
    if value is not None and length is not None:
        return [], ctx.add_const(np.where(value < 0, value + length, value), "indices")
    elem = ctx.elem_type(indices)
    if elem not in (ir.DataType.INT32, _INT64):
        raise ctx.refuse(node, boundary, f"the type of its indices '{indices.name}' is unknown")
    nodes: list[ir.Node] = []
    if length is not None:
        size = ctx.add_const(np.array(length, np_dtype(elem)), "length")
    else:
        whole = ctx.make_node("Shape", [data])
        picked = ctx.make_node(
            "Gather", [whole.outputs[0], ctx.add_const(np.array(axis, np.int64), "axis")]
        )
        picked.outputs[0].name = ctx.fresh("length")
        nodes += [whole, picked]
        size = picked.outputs[0]
        if elem != _INT64:
            cast = ctx.make_node("Cast", [size], to=elem)
            nodes.append(cast)
            size = cast.outputs[0]
    # ONNX integer division truncates towards zero, so for an index i in [-n, n - 1] the
    # quotient (i - n + 1) / n is -1 where i is negative and 0 otherwise.
    one = ctx.add_const(np.array(1, np_dtype(elem)), "one")
    length_less_one = ctx.make_node("Sub", [size, one])
    shifted = ctx.make_node("Sub", [indices, length_less_one.outputs[0]])
    quotient = ctx.make_node("Div", [shifted.outputs[0], size])
    offset = ctx.make_node("Mul", [quotient.outputs[0], size])
    counted = ctx.make_node("Sub", [indices, offset.outputs[0]])
    for made in (shifted, quotient, offset, counted):
        ctx.set_type(made.outputs[0], elem, ctx.shape(indices))
    return [*nodes, length_less_one, shifted, quotient, offset, counted], counted.outputs[0]


def _one_hot_indices(ctx: Context, node: ir.Node) -> tuple[list[ir.Node], ir.Value]:
    """OneHot-11 reads an index i in [-depth, -1] as i + depth; OneHot-9 reads every negative
    index as out of range. Adding depth to the negative indices is exact: those below -depth
    stay negative, out of range at both versions. Indices are read as int64 at both."""
    indices, depth = node.inputs[0], node.inputs[1]
    value, depth_value = ctx.const(indices), ctx.const(depth)
    if value is not None and depth_value is not None:
        whole = value.astype(np.int64)
        counted = np.where(whole < 0, whole + int(depth_value.reshape(-1)[0]), whole)
        return [], ctx.add_const(counted, "indices")
    shape = ctx.shape(indices)
    as_int = ctx.make_node("Cast", [indices], to=_INT64)
    scalar_depth = ctx.make_node("Cast", [depth], to=_INT64)
    flat_depth = ctx.make_node(
        "Reshape", [scalar_depth.outputs[0], ctx.add_const(np.zeros(0, np.int64), "scalar")]
    )
    zero = ctx.add_const(np.array(0, np.int64), "zero")
    negative = ctx.make_node("Less", [as_int.outputs[0], zero])
    as_count = ctx.make_node("Cast", [negative.outputs[0]], to=_INT64)
    offset = ctx.make_node("Mul", [as_count.outputs[0], flat_depth.outputs[0]])
    counted = ctx.make_node("Add", [as_int.outputs[0], offset.outputs[0]])
    for made in (as_int, as_count, offset, counted):
        ctx.set_type(made.outputs[0], _INT64, shape)
    ctx.set_type(negative.outputs[0], ir.DataType.BOOL, shape)
    made_nodes = [as_int, scalar_depth, flat_depth, negative, as_count, offset, counted]
    return made_nodes, counted.outputs[0]


@register("", "ScatterElements", 16, 18)
def _scatter_elements_reduction(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """ScatterElements-16 added ``reduction`` (none, add, mul), ScatterElements-18 max and min:
    onnx's C++ adapter drops it where it means the older behaviour and refuses any other
    value."""
    return ctx.run_onnx_adapter(node, boundary)


@register("", "ScatterElements", 11)
def _scatter_elements_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """ScatterElements does not exist before opset 11; Scatter-9 is the same operator ("Scatter
    ... is deprecated. Please use ScatterElements, which provides the same functionality")
    without negative axes and indices."""
    node.op_type = "Scatter"
    return _negative_axes_11(node, ctx, boundary)


@register("", ["Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool"], 11)
def _auto_pad_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """Opset 11 defined ``auto_pad=SAME_UPPER`` and ``SAME_LOWER`` as padding to an output of
    ``ceil(input / stride)``; before, they padded "so that the output spatial size match the
    input", the same where every stride is 1. Explicit pads and VALID did not change."""
    auto_pad = attribute(node, "auto_pad", "NOTSET")
    strides = attribute(node, "strides") or []
    if auto_pad.startswith("SAME") and any(s != 1 for s in strides):
        raise ctx.refuse(
            node, boundary, f"auto_pad={auto_pad} with strides {strides} pads differently "
            "before opset 11"
        )  # fmt: skip
    return [node]


# -- operators that older opsets lack ------------------------------------------------------------


@register("", "ConstantOfShape", 9)
def _constant_of_shape_9(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """ConstantOfShape does not exist before opset 9; Expand (opset 8) of its one value to the
    shape makes the same tensor."""
    value = attribute(node, "value")
    scalar = value.numpy().reshape(()) if value is not None else np.float32(0)
    filler = ctx.add_const(scalar, "value")
    return [ctx.make_node("Expand", [filler, node.inputs[0]], [node.outputs[0]])]


@register("", "Where", 9)
def _where_9(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """Where does not exist before opset 9. For an output of static shape S with N elements it
    is computed by selection alone, which keeps every value, infinities and NaN included: y and
    x broadcast to S and flattened are concatenated, and element i of the result is element
    i + N * condition[i] of that."""
    condition, x, y = node.inputs
    shape = ctx.shape(node.outputs[0])
    if shape is None or None in shape:
        shapes = [ctx.shape(value) for value in node.inputs]
        if any(s is None or None in s for s in shapes):
            raise ctx.refuse(
                node, boundary, "without Where, selecting needs the shape of the result, which "
                "is not known before run time (export with static shapes where it is computed: "
                "a scan with lengths selects the carry of every example, and needs a static "
                "batch size)"
            )  # fmt: skip
        shape = list(np.broadcast_shapes(*[tuple(s) for s in shapes]))
    size = int(np.prod(shape, dtype=np.int64))
    elem = ctx.elem_type(x)
    target = ctx.add_const(np.array(shape, np.int64), "shape")
    flat = ctx.add_const(np.array([size], np.int64), "flat")
    made: list[ir.Node] = []

    def flattened(value: ir.Value, kind: ir.DataType | None) -> ir.Value:
        expanded = ctx.make_node("Expand", [value, target])
        reshaped = ctx.make_node("Reshape", [expanded.outputs[0], flat])
        ctx.set_type(expanded.outputs[0], kind, shape)
        ctx.set_type(reshaped.outputs[0], kind, [size])
        made.extend([expanded, reshaped])
        return reshaped.outputs[0]

    both = ctx.make_node("Concat", [flattened(y, elem), flattened(x, elem)], axis=0)
    chosen = ctx.make_node("Cast", [flattened(condition, ir.DataType.BOOL)], to=_INT64)
    offset = ctx.make_node("Mul", [chosen.outputs[0], ctx.add_const(np.int64(size), "size")])
    positions = ctx.add_const(np.arange(size, dtype=np.int64), "positions")
    indices = ctx.make_node("Add", [offset.outputs[0], positions])
    picked = ctx.make_node("Gather", [both.outputs[0], indices.outputs[0]], axis=0)
    for made_node, kind, length in [
        (both, elem, 2 * size), (chosen, _INT64, size), (offset, _INT64, size),
        (indices, _INT64, size), (picked, elem, size),
    ]:  # fmt: skip
        ctx.set_type(made_node.outputs[0], kind, [length])
    result = ctx.make_node("Reshape", [picked.outputs[0], target], [node.outputs[0]])
    return [*made, both, chosen, offset, indices, picked, result]
