"""Adapters for shapes, axes and layout: Squeeze, Unsqueeze, Flatten, Concat, Split, Reshape,
Shape, DepthToSpace, Slice and Pad.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from torchscan.onnx._export._convert._blocks import range_by_loop
from torchscan.onnx._export._convert._context import (
    FLOATS,
    Builder,
    Context,
    attribute,
    clear_attributes,
    exactly,
    np_dtype,
    present_inputs,
    remove_attribute,
    required,
    set_attribute,
    truncate_inputs,
)
from torchscan.onnx._export._convert._helpers import (
    drop_added_attributes,
    input_as_attribute,
    negative_axes,
)
from torchscan.onnx._export._convert._registry import adapters

_INT64 = ir.DataType.INT64
_INT64_MAX = np.iinfo(np.int64).max


@adapters("Squeeze")
class Squeeze:
    """Squeeze: axes that count from the back at opset 11; Squeeze-13 takes ``axes`` as an input,
    Squeeze-11 as an attribute."""

    below_11 = negative_axes("axes")
    below_13 = input_as_attribute("axes")


@adapters("Unsqueeze")
class Unsqueeze:
    """Unsqueeze: axes that count from the back, in the rank of the result, at opset 11;
    Unsqueeze-13 takes ``axes`` as an input, Unsqueeze-11 as an attribute."""

    below_11 = negative_axes("axes", None, sort=True)
    below_13 = input_as_attribute("axes")


@adapters("Flatten")
class Flatten:
    """Flatten: an axis that counts from the back at opset 11."""

    below_11 = negative_axes("axis")


@adapters("Concat")
class Concat:
    """Concat: an axis that counts from the back at opset 11."""

    below_11 = negative_axes("axis")


@adapters("Split")
class Split:
    """Split: an axis that counts from the back at opset 11; Split-13 takes the lengths of its parts
    as the input ``split``, Split-11 as an attribute; ``num_outputs`` at opset 18."""

    below_11 = negative_axes("axis")
    below_13 = input_as_attribute("split")

    @staticmethod
    def below_18(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """Split-18's ``num_outputs`` splits into parts of equal length where the axis allows, "the
        last chunk will be smaller" otherwise; Split-13 without ``split`` only splits evenly, so
        uneven lengths are given as a constant ``split``, which needs the length of the axis."""
        count = attribute(node, "num_outputs")
        remove_attribute(node, "num_outputs")
        if count is None:
            return [node]
        rank = ctx.require_rank(node, boundary, required(node, 0))
        axis = attribute(node, "axis", 0) % rank
        length = (ctx.shape(node.inputs[0]) or [None] * rank)[axis]
        if length is None:
            raise ctx.refuse(
                node, boundary, f"num_outputs={count} makes parts whose lengths depend on the "
                f"length of axis {axis}, which is not known before run time"
            )  # fmt: skip
        if length % count == 0:
            return [node]
        chunk = -(-length // count)
        sizes = [chunk] * (count - 1) + [length - chunk * (count - 1)]
        if sizes[-1] < 0:
            raise ctx.refuse(node, boundary, f"an axis of length {length} has no {count} parts")
        truncate_inputs(node, 1)
        node.resize_inputs(2)
        node.replace_input_with(1, ctx.add_const(np.array(sizes, np.int64), "split"))
        return [node]


@adapters("Reshape")
class Reshape:
    """Reshape: ``allowzero`` at opset 14."""

    @staticmethod
    def below_14(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """Reshape-14 added ``allowzero``: with allowzero=1 a 0 in the shape is a dimension of
        length 0, where Reshape-13 copies the input's dimension. Dropping it is exact where the
        shape holds no 0, or where the input is not empty: then a 0 would make an empty output from
        a non-empty input, which is an error of the model in the first place."""
        allowzero = attribute(node, "allowzero", 0)
        remove_attribute(node, "allowzero")
        if not allowzero:
            return [node]
        data_shape = ctx.shape(node.inputs[0])
        if data_shape is not None and all(d for d in data_shape):
            return [node]
        if _holds_no_zero(ctx, required(node, 1)):
            return [node]
        raise ctx.refuse(
            node, boundary, "allowzero=1 with a shape that may hold 0, which Reshape-13 reads as "
            "'copy the input's dimension'"
        )  # fmt: skip


def _holds_no_zero(ctx: Context, shape: ir.Value) -> bool:
    value = ctx.const(shape)
    if value is not None:
        return not (value == 0).any()
    producer = shape.producer()
    if producer is None or producer.op_type != "Concat":
        return False
    # allowzero=1 forbids a 0 next to a -1, so with a -1 a valid shape has no 0
    pieces = [ctx.const(piece) for piece in producer.inputs]
    return any(piece is not None and (piece == -1).any() for piece in pieces)


@adapters("Shape")
class Shape:
    """Shape: ``start`` and ``end`` at opset 15."""

    @staticmethod
    def below_15(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """Shape-15 added ``start`` and ``end``, which select a slice of the shape with the clamping
        of Slice; Shape-13 returns the whole shape, which a Slice then cuts."""
        start, end = attribute(node, "start", 0), attribute(node, "end")
        remove_attribute(node, "start")
        remove_attribute(node, "end")
        if start == 0 and end is None:
            return [node]
        output = node.outputs[0]
        last = end if end is not None else np.iinfo(np.int64).max
        starts = ctx.add_const(np.array([start], np.int64), "starts")
        ends = ctx.add_const(np.array([last], np.int64), "ends")
        b = Builder(ctx)
        b.op("Slice", [output, starts, ends], None, output=output)
        output.name = ctx.fresh(f"{output.name}_whole")
        ctx.set_type(output, ir.DataType.INT64, [ctx.rank(node.inputs[0])])
        return [node, *b.nodes]


@adapters("DepthToSpace")
class DepthToSpace:
    """DepthToSpace: ``mode`` at opset 11, dropped where it is DCR, the older behaviour."""

    below_11 = drop_added_attributes(mode="DCR")


@adapters("Slice")
class Slice:
    """Slice: inputs and steps at opset 10, axes that count from the back at opset 11."""

    @staticmethod
    def below_10(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
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
            ctx.require_const(node, boundary, 3, "axes").reshape(-1)
            if inputs[3] is not None
            else None
        )
        steps = (
            ctx.require_const(node, boundary, 4, "steps").reshape(-1)
            if inputs[4] is not None
            else None
        )
        given_axes = axes is not None
        if axes is None:
            axes = np.arange(count)
        if steps is None:
            steps = np.ones(count, np.int64)
        starts = None if starts is None else starts.reshape(-1)
        ends = None if ends is None else ends.reshape(-1)
        data, output = required(node, 0), node.outputs[0]
        constant = starts is not None and ends is not None
        unit = (steps == 1) & constant
        if unit.all():
            # constant bounds: an axis with other bounds is not unit
            assert starts is not None
            assert ends is not None
            truncate_inputs(node, 1)
            set_attribute(node, "starts", [int(s) for s in starts])
            set_attribute(node, "ends", [int(e) for e in ends])
            if given_axes:
                set_attribute(node, "axes", [int(a) for a in axes])
            return [node]
        rank = ctx.require_rank(node, boundary, data)
        shape = list(ctx.shape(data) or [None] * rank)
        elem = ctx.elem_type(data)
        b = Builder(ctx)
        current = data
        if unit.any():
            # an axis is unit for constant bounds only
            assert starts is not None
            assert ends is not None
            current = b.op(
                "Slice", [data], None, starts=[int(s) for s in starts[unit]],
                ends=[int(e) for e in ends[unit]], axes=[int(a) % rank for a in axes[unit]],
            )  # fmt: skip
            current.name = ctx.fresh(f"{output.name}_sliced")
            for axis in axes[unit]:
                shape[int(axis) % rank] = None
        gathered = [j for j in range(count) if not unit[j]]
        for done, j in enumerate(gathered, start=1):
            axis, step = int(axes[j]) % rank, int(steps[j])
            length = shape[axis]
            if starts is not None and ends is not None and length is not None:
                picked = np.arange(length)[slice(int(starts[j]), int(ends[j]), step)]
                indices = ctx.add_const(picked.astype(np.int64), "indices")
                shape[axis] = len(picked)
            else:
                bounds = [
                    _slice_bound(b, value, values, j) for value, values in
                    ((inputs[1], starts), (inputs[2], ends))
                ]  # fmt: skip
                indices = _runtime_slice_indices(b, node, current, axis, step, *bounds)
                shape[axis] = None
            last = done == len(gathered)
            current = b.op(
                "Gather",
                [current, indices],
                elem,
                shape,
                output=output if last else None,
                axis=axis,
            )
            if not last:
                current.name = ctx.fresh(f"{output.name}_strided")
        return b.nodes

    @staticmethod
    def below_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """Slice-11 lets ``axes`` count from the back; they are counted from the front."""
        if len(present_inputs(node)) > 3:
            axes = ctx.require_const(node, boundary, 3, "axes")
            if (axes < 0).any():
                rank = ctx.require_rank(node, boundary, required(node, 0))
                node.replace_input_with(
                    3, ctx.add_const(np.where(axes < 0, axes + rank, axes), "axes")
                )
        return [node]


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


def _slice_bound(b: Builder, bound: ir.Value, values: np.ndarray | None, j: int) -> ir.Value:
    """Entry ``j`` of a Slice's ``starts`` or ``ends`` as an int64 scalar."""
    if values is not None:
        return b.const(np.int64(values[j]), "bound")
    picked = _scalar_op(b, "Gather", [bound, b.const(np.int64(j), "entry")])
    if b.ctx.elem_type(bound) == _INT64:
        return picked
    return _scalar_op(b, "Cast", [picked], to=_INT64)


def _scalar_op(
    b: Builder, op: str, inputs: list[ir.Value], elem: ir.DataType = _INT64, **attributes: Any
) -> ir.Value:
    """A node of ``op`` whose output is a scalar of type ``elem``."""
    return b.op(op, inputs, elem, [], **attributes)


def _runtime_slice_indices(
    b: Builder,
    node: ir.Node,
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
    (``_blocks.range_by_loop``).
    """
    ctx = b.ctx
    shape = ctx.shape(data)
    length = shape[axis] if shape is not None else None
    if length is not None:
        dim = ctx.add_const(np.int64(length), "dim")
    else:
        whole = b.op("Shape", [data], _INT64, [len(shape) if shape else None])
        dim = _scalar_op(b, "Gather", [whole, ctx.add_const(np.int64(axis), "axis")])

    def is_less(left: ir.Value, right: ir.Value) -> ir.Value:
        left_, right_ = (
            _scalar_op(b, "Cast", [v], ir.DataType.DOUBLE, to=ir.DataType.DOUBLE)
            for v in (left, right)
        )
        less = _scalar_op(b, "Less", [left_, right_], ir.DataType.BOOL)
        return _scalar_op(b, "Cast", [less], to=_INT64)

    def select(flag: ir.Value, offset: ir.Value, base: ir.Value) -> ir.Value:
        moved = _scalar_op(b, "Mul", [offset, flag])
        return _scalar_op(b, "Add", [base, moved])

    def clamp(value: ir.Value, low: ir.Value, high: ir.Value) -> ir.Value:
        zero = ctx.add_const(np.int64(0), "zero")
        counted = select(is_less(value, zero), dim, value)
        raised = select(is_less(counted, low), _scalar_op(b, "Sub", [low, counted]), counted)
        excess = _scalar_op(b, "Sub", [high, raised])
        return select(is_less(high, raised), excess, raised)

    if step > 0:
        start = clamp(start, ctx.add_const(np.int64(0), "low"), dim)
        end = clamp(end, ctx.add_const(np.int64(0), "low"), dim)
    else:
        last = _scalar_op(b, "Sub", [dim, ctx.add_const(np.int64(1), "one")])
        start = clamp(start, ctx.add_const(np.int64(0), "low"), last)
        end = clamp(end, ctx.add_const(np.int64(-1), "low"), last)
    indices = range_by_loop(b, node, 11, start, end, ctx.add_const(np.int64(step), "step"))
    indices.name = ctx.fresh("slice_indices")
    ctx.set_type(indices, _INT64, [None])
    return indices


@adapters("Pad")
class Pad:
    """Pad: ``pads`` and ``constant_value`` inputs and every type at opset 11, ``axes`` at opset
    18."""

    @staticmethod
    def below_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """Pad-11 takes ``pads`` and ``constant_value`` as inputs, and data of every type; Pad-2
        takes the attributes ``pads`` and ``value``, a float, and floating-point data only. In
        constant mode, data of another type (``F.pad`` of int64 labels), or a value that is not
        exactly a float or is computed at run time, is padded by concatenating blocks of the value
        instead (``pad_by_concat``)."""
        pads = ctx.require_const(node, boundary, 1, "pads").reshape(-1)
        mode = attribute(node, "mode", "constant")
        value = None
        if mode == "constant":
            given = len(present_inputs(node)) > 2
            constant = ctx.const(node.inputs[2]) if given else None
            constant = None if constant is None else constant.reshape(-1)
            as_float = None if constant is None else exactly(constant, np.dtype(np.float32))
            elem = ctx.elem_type(node.inputs[0])
            if (elem is not None and elem not in FLOATS) or (given and as_float is None):
                return pad_by_concat(node, ctx, boundary, pads)
            if as_float is not None:
                value = float(as_float[0])
        truncate_inputs(node, 1)
        clear_attributes(node)
        set_attribute(node, "mode", mode)
        set_attribute(node, "pads", [int(p) for p in pads])
        if value is not None:
            set_attribute(node, "value", value)
        return [node]

    @staticmethod
    def below_18(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """Pad-18 can pad the ``axes`` given only; Pad-13 takes ``pads`` for every axis, which are
        0 for the axes not given."""
        if len(present_inputs(node)) < 4:
            truncate_inputs(node, 3)
            return [node]
        axes = ctx.require_const(node, boundary, 3, "axes").reshape(-1)
        pads = ctx.require_const(node, boundary, 1, "pads").reshape(-1)
        rank = ctx.require_rank(node, boundary, required(node, 0))
        full = np.zeros(2 * rank, np.int64)
        for i, axis in enumerate(axes):
            full[axis % rank] = pads[i]
            full[axis % rank + rank] = pads[i + len(axes)]
        truncate_inputs(node, 3)
        node.replace_input_with(1, ctx.add_const(full, "pads"))
        return [node]


def pad_by_concat(node: ir.Node, ctx: Context, boundary: int, pads: np.ndarray) -> list[ir.Node]:
    """Pad-11 in constant mode, at opset 10: along each axis, a negative pad crops with a Slice,
    and a positive one concatenates a block of ``constant_value``, expanded to the shape of the
    data with that axis as long as the pad. Nothing is computed on the values, so every type and
    every value of ``constant_value`` (a run-time one too) is kept exactly."""
    data = required(node, 0)
    rank = ctx.require_rank(node, boundary, data)
    elem = ctx.elem_type(data)
    if elem is None:
        raise ctx.refuse(node, boundary, f"the type of its input '{data.name}' is unknown")
    b = Builder(ctx)
    value = node.inputs[2] if len(node.inputs) > 2 else None
    if value is None:
        value = b.const(np.zeros((), np_dtype(elem)), "constant_value")
    known = ctx.shape(data)
    shape: list[int | None] = list(known) if known is not None else [None] * rank
    current = data
    steps = [
        (k, int(pads[k]), int(pads[k + rank])) for k in range(rank) if pads[k] or pads[k + rank]
    ]
    for done, (k, begin, end) in enumerate(steps, start=1):
        last = done == len(steps)
        if begin < 0 or end < 0:
            starts = b.const(np.array([max(-begin, 0)], np.int64), "starts")
            ends = b.const(np.array([end if end < 0 else _INT64_MAX], np.int64), "ends")
            length = shape[k]
            if length is not None:
                shape[k] = length + min(begin, 0) + min(end, 0)
            cropped = shape.copy()
            current = b.op(
                "Slice", [current, starts, ends, b.const(np.array([k], np.int64), "axes")],
                elem, cropped, output=node.outputs[0] if last and begin <= 0 and end <= 0 else None,
            )  # fmt: skip
        blocks = []
        for amount in (begin, end):
            if amount <= 0:
                blocks.append(None)
                continue
            if None not in shape:
                sizes = b.const(np.array([*shape[:k], amount, *shape[k + 1 :]], np.int64), "shape")
            else:
                whole = b.op("Shape", [current], _INT64, [rank])
                keep = b.const(np.array([int(d != k) for d in range(rank)], np.int64), "keep")
                put = b.const(
                    np.array([amount * int(d == k) for d in range(rank)], np.int64), "pad"
                )
                sizes = b.op(
                    "Add", [b.op("Mul", [whole, keep], _INT64, [rank]), put], _INT64, [rank]
                )
            block_shape = [*shape[:k], amount, *shape[k + 1 :]]
            blocks.append(b.op("Expand", [value, sizes], elem, block_shape))
        if blocks == [None, None]:
            continue
        length = shape[k]
        if length is not None:
            shape[k] = length + max(begin, 0) + max(end, 0)
        parts = [blocks[0], current, blocks[1]]
        current = b.op(
            "Concat", [p for p in parts if p is not None], elem, shape.copy(),
            output=node.outputs[0] if last else None, axis=k,
        )  # fmt: skip
    if not b.nodes or current is data:
        b.op("Identity", [data], None, output=node.outputs[0])
    return b.nodes
