"""Adapters for the indexing operators that opset 11 introduced: GatherElements, GatherND and
ScatterND, computed below opset 11 as offsets into the flattened data; and the padding of types
that Pad-2 does not take, made of blocks concatenated to the data.

Every rewrite here selects or places values without arithmetic on them: the data is reshaped to
one axis, and ``Gather`` (opset 1) or ``Scatter`` (opset 9) moves its elements, so every value,
infinities, NaN and -0.0 included, comes out as it went in. Only the offsets are computed, in
int64, from the indices and the dimensions of the data read with ``Shape`` when the model runs,
so dynamic shapes convert too.

Each adapter is registered for ``("", op, b)`` and returns nodes valid at opset ``b - 1`` (see
``_adapters_attributes``); each docstring quotes the change of the specification it undoes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir

from torchscan.onnx._convert._adapters_control import range_nodes
from torchscan.onnx._convert._context import Builder, Context, attribute, np_dtype
from torchscan.onnx._convert._registry import register

_INT64, _BOOL = ir.DataType.INT64, ir.DataType.BOOL
_INT64_MAX = np.iinfo(np.int64).max


# -- offsets computed when the model runs ---------------------------------------------------------

Int = int | ir.Value
"""An int64 scalar: a Python int where it is known before run time, else a value."""


def scalar(b: Builder, value: Int) -> ir.Value:
    """``value`` as an int64 scalar value: a new constant for an int."""
    return b.const(np.int64(value), "scalar") if isinstance(value, int) else value


class Lengths:
    """The lengths of the axes of ``value``, read when asked for: ints where they are known,
    else read from one ``Shape`` of it when the model runs."""

    def __init__(self, b: Builder, value: ir.Value) -> None:
        self.b, self.value = b, value
        self.shape = b.ctx.shape(value)
        self._whole: ir.Value | None = None
        self._read: dict[int, Int] = {}

    def __getitem__(self, axis: int) -> Int:
        if axis not in self._read:
            if self.shape is not None and self.shape[axis] is not None:
                self._read[axis] = self.shape[axis]
            else:
                if self._whole is None:
                    rank = len(self.shape) if self.shape is not None else None
                    self._whole = self.b.op("Shape", [self.value], _INT64, [rank])
                index = self.b.const(np.int64(axis), "axis")
                self._read[axis] = self.b.op("Gather", [self._whole, index], _INT64, [])
        return self._read[axis]

    def of(self, axes: Sequence[int]) -> list[Int]:
        return [self[axis] for axis in axes]


def multiply(b: Builder, a: Int, c: Int, shape: Sequence[int | None] | None = ()) -> Int:
    """``a * c`` in int64 (``a`` may be a tensor of ``shape``), folded where both are ints or
    one is 1."""
    if isinstance(a, int) and isinstance(c, int):
        return a * c
    if isinstance(c, int) and c == 1:
        return a
    if isinstance(a, int) and a == 1:
        return c
    return b.op("Mul", [scalar(b, a), scalar(b, c)], _INT64, shape)


def add(b: Builder, a: Int, c: Int, shape: Sequence[int | None] | None = ()) -> Int:
    """``a + c`` in int64, folded where both are ints or one is 0."""
    if isinstance(a, int) and isinstance(c, int):
        return a + c
    if isinstance(c, int) and c == 0:
        return a
    if isinstance(a, int) and a == 0:
        return c
    return b.op("Add", [scalar(b, a), scalar(b, c)], _INT64, shape)


def product(b: Builder, lengths: Sequence[Int]) -> Int:
    """The product of ``lengths``, 1 for none."""
    result: Int = 1
    for length in lengths:
        result = multiply(b, result, length)
    return result


def strides(b: Builder, length_of: Callable[[int], Int], count: int) -> list[Int]:
    """The row-major strides of ``count`` axes whose lengths ``length_of`` gives: the product of
    the lengths of the axes after each."""
    found: list[Int] = [1]
    for axis in range(count - 1, 0, -1):
        found.insert(0, multiply(b, found[0], length_of(axis)))
    return found


def vector(b: Builder, values: Sequence[Int]) -> ir.Value:
    """``values`` as one int64 vector."""
    if all(isinstance(v, int) for v in values):
        return b.const(np.array(values, np.int64), "vector")
    one = b.const(np.array([1], np.int64), "one_element")
    pieces = [b.op("Reshape", [scalar(b, v), one], _INT64, [1]) for v in values]
    if len(pieces) == 1:
        return pieces[0]
    return b.op("Concat", pieces, _INT64, [len(pieces)], axis=0)


def arange(b: Builder, node: ir.Node, boundary: int, length: Int) -> ir.Value:
    """``0, 1, ..., length - 1`` in int64: a constant where ``length`` is known; else, from opset
    9 on, the indices of the elements of a tensor of ``length`` ones (``NonZero`` lists them in
    order), and at opset 8 a ``Loop`` (``range_nodes``)."""
    if isinstance(length, int):
        return b.const(np.arange(length, dtype=np.int64), "positions")
    if b.ctx.target >= 9:
        one = b.const(np.array([1], np.int64), "one_element")
        shape = b.op("Reshape", [length, one], _INT64, [1])
        ones = b.op("ConstantOfShape", [shape], _BOOL, [None], value=np.ones(1, np.bool_))
        found = b.op("NonZero", [ones], _INT64, [1, None])
        return b.op("Reshape", [found, b.const(np.array([-1], np.int64), "flat")], _INT64, [None])
    zero, step = b.const(np.int64(0), "start"), b.const(np.int64(1), "delta")
    made, positions = range_nodes(b.ctx, node, boundary, zero, length, step)
    b.nodes.extend(made)
    positions.name = b.ctx.fresh("positions")
    b.ctx.set_type(positions, _INT64, [None])
    return positions


def as_int64(b: Builder, indices: ir.Value) -> ir.Value:
    if b.ctx.elem_type(indices) == _INT64:
        return indices
    return b.op("Cast", [indices], _INT64, b.ctx.shape(indices), to=_INT64)


def from_front(
    b: Builder, indices: ir.Value, lengths: Int, shape: Sequence[int | None] | None
) -> ir.Value:
    """int64 ``indices`` into axes of ``lengths`` (a scalar, or a vector broadcast against them)
    counted from the front: an index ``i`` in ``[-n, n - 1]`` less ``n * ((i - n + 1) / n)``,
    where the quotient, truncated towards zero, is -1 for a negative index and 0 otherwise."""
    known = b.ctx.const(indices)
    if known is not None and not (known < 0).any():
        return indices
    if known is not None and isinstance(lengths, int):
        return b.const(np.where(known < 0, known + lengths, known).astype(np.int64), "indices")
    if isinstance(lengths, int):
        last: ir.Value = b.const(np.int64(lengths - 1), "last")
        lengths = scalar(b, lengths)
    else:
        last = b.op("Sub", [lengths, b.const(np.int64(1), "one")], _INT64, b.ctx.shape(lengths))
    shifted = b.op("Sub", [indices, last], _INT64, shape)
    quotient = b.op("Div", [shifted, lengths], _INT64, shape)
    return b.op("Sub", [indices, b.op("Mul", [quotient, lengths], _INT64, shape)], _INT64, shape)


def _flat(b: Builder, data: ir.Value) -> ir.Value:
    shape = b.ctx.shape(data)
    size = None if shape is None or None in shape else int(np.prod(shape, dtype=np.int64))
    flat = b.const(np.array([-1], np.int64), "flat")
    return b.op("Reshape", [data, flat], b.ctx.elem_type(data), [size])


def _index_tuples(node: ir.Node, ctx: Context, boundary: int) -> tuple[int, int, int]:
    """The rank of ``data``, the rank of ``indices`` and the length of its index tuples, which
    GatherND and ScatterND need to be known."""
    data, indices = node.inputs[0], node.inputs[1]
    rank = ctx.require_rank(node, boundary, data)
    shape = ctx.shape(indices)
    if not shape or shape[-1] is None:
        raise ctx.refuse(
            node, boundary, f"the length of its index tuples, the last dimension of "
            f"'{indices.name}', is not known before run time"
        )  # fmt: skip
    length = shape[-1]
    if not 1 <= length <= rank:
        raise ctx.refuse(
            node, boundary, f"its index tuples of length {length} do not index data of rank {rank}"
        )
    return rank, len(shape), length


def _tuple_offsets(
    b: Builder, data: ir.Value, indices: ir.Value, rank: int, tuple_length: int, *, keepdims: int
) -> tuple[ir.Value, Lengths]:
    """The offset of each index tuple of ``indices`` among the slices its tuples name, the first
    ``tuple_length`` axes of ``data`` made one: ``sum(index[m] * stride[m])``, negative indices
    counted from the front, ``stride[m]`` the product of the lengths of axes ``m + 1`` to
    ``tuple_length - 1``. Also the lengths of the axes of ``data``."""
    lengths = Lengths(b, data)
    shape = b.ctx.shape(indices)
    leading = lengths.of(range(tuple_length))
    counted = from_front(b, as_int64(b, indices), vector(b, leading), shape)
    steps = vector(b, strides(b, lengths.__getitem__, tuple_length))
    scaled = b.op("Mul", [counted, steps], _INT64, shape)
    summed = [*shape[:-1], 1] if keepdims else shape[:-1]
    offsets = b.op(
        "ReduceSum", [scaled], _INT64, summed, axes=[len(shape) - 1], keepdims=keepdims
    )  # fmt: skip
    return offsets, lengths


# -- GatherElements, GatherND and ScatterND -------------------------------------------------------


@register("", "GatherElements", 11)
def _gather_elements_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """GatherElements does not exist before opset 11: ``out[i][j][k] = data[i][index[i][j][k]][k]``
    for ``axis = 1`` ("its output shape is the same as the shape of indices"). It is a Gather from
    the flattened data at the offset of each of those elements: the index, counted from the front
    where negative, times the stride of ``axis``, plus each other coordinate of the output times
    its stride, the coordinates an ``arange`` of each axis of ``indices`` broadcast along it."""
    data, indices = node.inputs[0], node.inputs[1]
    rank = ctx.require_rank(node, boundary, data)
    axis = attribute(node, "axis", 0) % rank
    b = Builder(ctx)
    shape = ctx.shape(indices) or [None] * rank
    lengths = Lengths(b, data)
    counted = from_front(b, as_int64(b, indices), lengths[axis], shape)
    steps = strides(b, lengths.__getitem__, rank)
    offsets = multiply(b, counted, steps[axis], shape)
    index_lengths = Lengths(b, indices)
    for k in range(rank):
        if k == axis or shape[k] == 1:
            continue
        positions = multiply(b, arange(b, node, boundary, index_lengths[k]), steps[k], [shape[k]])
        if rank > 1:
            along = b.const(np.array([1] * k + [-1] + [1] * (rank - k - 1), np.int64), "along")
            positions = b.op(
                "Reshape", [positions, along], _INT64, [1] * k + [shape[k]] + [1] * (rank - k - 1)
            )
        offsets = add(b, offsets, positions, shape)
    b.op("Gather", [_flat(b, data), offsets], None, output=node.outputs[0], axis=0)
    return b.nodes


@register("", "GatherND", 11)
def _gathernd_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """GatherND does not exist before opset 11. Index tuples of length 1 (``indices`` of shape
    [..., 1], what torch.onnx makes of ``x[:, idx]``) gather slices along axis 0, as Gather does.
    Longer tuples of length k (``t[a, b]``) gather from the data with its first k axes made one:
    at the offset ``sum(index[m] * stride[m])`` of each tuple, where ``stride[m]`` is the product
    of the lengths of axes m + 1 to k - 1 and negative indices are counted from the front."""
    data, indices = node.inputs[0], node.inputs[1]
    rank, index_rank, tuple_length = _index_tuples(node, ctx, boundary)
    b = Builder(ctx)
    shape = ctx.shape(indices)
    if tuple_length == 1:
        squeezed = b.op(
            "Squeeze", [indices], ctx.elem_type(indices), shape[:-1], axes=[index_rank - 1]
        )
        counted = from_front(b, as_int64(b, squeezed), Lengths(b, data)[0], shape[:-1])
        b.op("Gather", [data, counted], None, output=node.outputs[0], axis=0)
        return b.nodes
    offsets, lengths = _tuple_offsets(b, data, indices, rank, tuple_length, keepdims=0)
    rows = vector(b, [-1, *lengths.of(range(tuple_length, rank))])
    data_shape = ctx.shape(data)
    kept = data_shape[tuple_length:] if data_shape is not None else [None] * (rank - tuple_length)
    merged = b.op("Reshape", [data, rows], ctx.elem_type(data), [None, *kept])
    b.op("Gather", [merged, offsets], None, output=node.outputs[0], axis=0)
    return b.nodes


@register("", "ScatterND", 11)
def _scatternd_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """ScatterND does not exist before opset 11: ``output[indices[idx]] = updates[idx]``, each
    index tuple of length k naming a slice of the last r - k axes. It is a Scatter-9 along the
    one axis of the flattened data: each element of a slice goes to the offset of its tuple
    (``sum(index[m] * stride[m])``, negative indices counted from the front) plus its position in
    the slice, in the order of the flattened ``updates``."""
    if ctx.target < 9:
        raise ctx.refuse(
            node, boundary, "writing at positions computed when the model runs needs Scatter, "
            "which exists from opset 9 on"
        )  # fmt: skip
    data, indices, updates = node.inputs[0], node.inputs[1], node.inputs[2]
    rank, _, tuple_length = _index_tuples(node, ctx, boundary)
    b = Builder(ctx)
    offsets, lengths = _tuple_offsets(b, data, indices, rank, tuple_length, keepdims=1)
    if tuple_length < rank:
        slice_size = product(b, lengths.of(range(tuple_length, rank)))
        shape = ctx.shape(indices)[:-1]
        offsets = multiply(b, offsets, slice_size, [*shape, 1])
        positions = arange(b, node, boundary, slice_size)
        offsets = add(b, offsets, positions, [*shape, None])
    flat = b.const(np.array([-1], np.int64), "flat")
    offsets = b.op("Reshape", [offsets, flat], _INT64, [None])
    elem = ctx.elem_type(data)
    values = b.op("Reshape", [updates, flat], elem, [None])
    scattered = b.op("Scatter", [_flat(b, data), offsets, values], elem, [None], axis=0)
    data_shape = ctx.shape(data)
    if data_shape is not None and None not in data_shape:
        whole = b.const(np.array(data_shape, np.int64), "shape")
    else:
        whole = b.op("Shape", [data], _INT64, [rank])
    b.op("Reshape", [scattered, whole], None, output=node.outputs[0])
    return b.nodes


# -- Pad of the types Pad-2 does not take ---------------------------------------------------------


def pad_by_concat(node: ir.Node, ctx: Context, boundary: int, pads: np.ndarray) -> list[ir.Node]:
    """Pad-11 in constant mode, at opset 10: along each axis, a negative pad crops with a Slice,
    and a positive one concatenates a block of ``constant_value``, expanded to the shape of the
    data with that axis as long as the pad. Nothing is computed on the values, so every type and
    every value of ``constant_value`` (a run-time one too) is kept exactly."""
    data = node.inputs[0]
    rank = ctx.require_rank(node, boundary, data)
    elem = ctx.elem_type(data)
    if elem is None:
        raise ctx.refuse(node, boundary, f"the type of its input '{data.name}' is unknown")
    b = Builder(ctx)
    value = node.inputs[2] if len(node.inputs) > 2 else None
    if value is None:
        value = b.const(np.zeros((), np_dtype(elem)), "constant_value")
    shape = ctx.shape(data)
    shape = list(shape) if shape is not None else [None] * rank
    current = data
    steps = [
        (k, int(pads[k]), int(pads[k + rank])) for k in range(rank) if pads[k] or pads[k + rank]
    ]
    for done, (k, begin, end) in enumerate(steps, start=1):
        last = done == len(steps)
        if begin < 0 or end < 0:
            starts = b.const(np.array([max(-begin, 0)], np.int64), "starts")
            ends = b.const(np.array([end if end < 0 else _INT64_MAX], np.int64), "ends")
            if shape[k] is not None:
                shape[k] += min(begin, 0) + min(end, 0)
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
        if shape[k] is not None:
            shape[k] += max(begin, 0) + max(end, 0)
        parts = [blocks[0], current, blocks[1]]
        current = b.op(
            "Concat", [p for p in parts if p is not None], elem, shape.copy(),
            output=node.outputs[0] if last else None, axis=k,
        )  # fmt: skip
    if not b.nodes or current is data:
        b.op("Identity", [data], None, output=node.outputs[0])
    return b.nodes
