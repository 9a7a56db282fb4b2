"""Adapters for the indexing operators that opset 11 introduced: GatherElements, GatherND and
ScatterND, computed below opset 11 as offsets into the flattened data; Scatter, which opset 8
lacks; and the padding of types that Pad-2 does not take, made of blocks concatenated to the
data.

Every rewrite here selects or places values without arithmetic on them: the data is reshaped,
and ``Gather`` (opset 1) or ``Scatter`` (opset 9) moves its elements, so every value,
infinities, NaN and -0.0 included, comes out as it went in. Only the offsets are computed, in
int64, from the indices and the dimensions of the data read with ``Shape`` when the model runs,
so dynamic shapes convert too. Where an ``arange`` of a length known only at run time is needed,
opset 9 and later list the elements of a tensor of ones with ``NonZero``; opset 8 runs a
``Loop`` (``_adapters_control.range_nodes``).

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


def lengths_of(b: Builder, value: ir.Value) -> Lengths:
    """The :class:`Lengths` of ``value``, one for each value an adapter reads them of."""
    key = ("lengths", value)
    if key not in b.made:
        b.made[key] = Lengths(b, value)
    return b.made[key]


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
    key = ("arange", length)
    if key in b.made:
        return b.made[key]
    if b.ctx.target >= 9:
        one = b.const(np.array([1], np.int64), "one_element")
        shape = b.op("Reshape", [length, one], _INT64, [1])
        ones = b.op("ConstantOfShape", [shape], _BOOL, [None], value=np.ones(1, np.bool_))
        found = b.op("NonZero", [ones], _INT64, [1, None])
        flat = b.const(np.array([-1], np.int64), "flat")
        positions = b.op("Reshape", [found, flat], _INT64, [None])
    else:
        zero, step = b.const(np.int64(0), "start"), b.const(np.int64(1), "delta")
        made, positions = range_nodes(b.ctx, node, boundary, zero, length, step)
        b.nodes.extend(made)
        positions.name = b.ctx.fresh("positions")
        b.ctx.set_type(positions, _INT64, [None])
    b.made[key] = positions
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
    ``tuple_length - 1``. Also the lengths of the axes of ``data``. (onnxruntime's ReduceSum
    rounds some int64 sums through double; offsets into a tensor are below 2**53, and exact.)"""
    lengths = lengths_of(b, data)
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
    for ``axis = 1`` ("its output shape is the same as the shape of indices"), with negative
    indices counted from the back (see ``gather_elements``)."""
    data, indices = node.inputs[0], node.inputs[1]
    rank = ctx.require_rank(node, boundary, data)
    axis = attribute(node, "axis", 0) % rank
    b = Builder(ctx)
    shape = ctx.shape(indices) or [None] * rank
    counted = from_front(b, as_int64(b, indices), lengths_of(b, data)[axis], shape)
    gather_elements(b, node, boundary, data, counted, axis, node.outputs[0])
    return b.nodes


def gather_elements(
    b: Builder,
    node: ir.Node,
    boundary: int,
    data: ir.Value,
    indices: ir.Value,
    axis: int,
    output: ir.Value | None = None,
) -> ir.Value:
    """GatherElements of ``data`` at the non-negative int64 ``indices`` along ``axis``: a Gather
    from the flattened data at the offset of each element of the result, which is the index
    times the stride of ``axis``, plus each other coordinate times its stride, the coordinates an
    ``arange`` of each axis of ``indices`` broadcast along it."""
    rank = b.ctx.rank(data)
    shape = b.ctx.shape(indices) or [None] * rank
    steps = strides(b, lengths_of(b, data).__getitem__, rank)
    offsets = multiply(b, indices, steps[axis], shape)
    index_lengths = lengths_of(b, indices)
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
    elem = b.ctx.elem_type(data)
    return b.op("Gather", [_flat(b, data), offsets], elem, shape, output=output, axis=0)


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
        counted = from_front(b, as_int64(b, squeezed), lengths_of(b, data)[0], shape[:-1])
        b.op("Gather", [data, counted], None, output=node.outputs[0], axis=0)
        return b.nodes
    offsets, lengths = _tuple_offsets(b, data, indices, rank, tuple_length, keepdims=0)
    row_count = product(b, lengths.of(range(tuple_length)))
    rows = vector(b, [row_count, *lengths.of(range(tuple_length, rank))])
    data_shape = ctx.shape(data)
    kept = data_shape[tuple_length:] if data_shape is not None else [None] * (rank - tuple_length)
    merged = b.op("Reshape", [data, rows], ctx.elem_type(data), [None, *kept])
    b.op("Gather", [merged, offsets], None, output=node.outputs[0], axis=0)
    return b.nodes


@register("", "ScatterND", 16, 18)
def _scatter_nd_reduction(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """ScatterND-16 added ``reduction`` (none, add, mul), ScatterND-18 max and min:
    onnx's C++ adapter drops it where it means the older behaviour and refuses any other
    value."""
    return ctx.run_onnx_adapter(node, boundary)


@register("", "ScatterND", 11)
def _scatternd_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """ScatterND does not exist before opset 11: ``output[indices[idx]] = updates[idx]``, each
    index tuple of length k naming a slice of the last r - k axes. From opset 9 on, it is a
    Scatter-9 along the one axis of the flattened data: each element of a slice goes to the
    offset of its tuple (``sum(index[m] * stride[m])``, negative indices counted from the front)
    times the size of a slice, plus its position in the slice. At opset 8, which has no Scatter,
    the data is seen as rows, one per slice, and each row of the result is chosen from the data
    or the updates (``_choose_rows``)."""
    data, indices, updates = node.inputs[0], node.inputs[1], node.inputs[2]
    rank, _, tuple_length = _index_tuples(node, ctx, boundary)
    b = Builder(ctx)
    elem = ctx.elem_type(data)
    keep = tuple_length < rank
    offsets, lengths = _tuple_offsets(b, data, indices, rank, tuple_length, keepdims=int(keep))
    slice_size = product(b, lengths.of(range(tuple_length, rank)))
    flat = b.const(np.array([-1], np.int64), "flat")
    if ctx.target < 9:
        rows = b.op("Reshape", [offsets, flat], _INT64, [None])
        count = product(b, lengths_of(b, indices).of(range(len(ctx.shape(indices)) - 1)))
        row_count = product(b, lengths.of(range(tuple_length)))
        as_rows = vector(b, [row_count, slice_size])
        table = b.op("Reshape", [data, as_rows], elem, [None, None])
        new_rows = b.op("Reshape", [updates, vector(b, [count, slice_size])], elem, [None, None])
        chosen = _choose_rows(b, node, boundary, table, row_count, rows, count, new_rows)
    else:
        if keep:
            shape = ctx.shape(indices)[:-1]
            offsets = multiply(b, offsets, slice_size, [*shape, 1])
            positions = arange(b, node, boundary, slice_size)
            offsets = add(b, offsets, positions, [*shape, None])
        offsets = b.op("Reshape", [offsets, flat], _INT64, [None])
        values = b.op("Reshape", [updates, flat], elem, [None])
        chosen = b.op("Scatter", [_flat(b, data), offsets, values], elem, [None], axis=0)
    data_shape = ctx.shape(data)
    if data_shape is not None and None not in data_shape:
        whole = b.const(np.array(data_shape, np.int64), "shape")
    else:
        whole = b.op("Shape", [data], _INT64, [rank])
    b.op("Reshape", [chosen, whole], None, output=node.outputs[0])
    return b.nodes


def _choose_rows(
    b: Builder,
    node: ir.Node,
    boundary: int,
    table: ir.Value,
    row_count: Int,
    rows: ir.Value,
    count: Int,
    new_rows: ir.Value,
) -> ir.Value:
    """``table`` (``row_count`` rows) with row ``rows[j]`` replaced by ``new_rows[j]`` for each
    of the ``count`` updates, the last one where a row is named twice, without Scatter: each row
    is compared with every update's row, the matching update with the highest position
    ``j + 1`` (0 for none, from a column of zeros put first) found with ReduceMax, and the row
    gathered from ``table`` and ``new_rows`` concatenated."""
    elem = b.ctx.elem_type(table)
    positions = arange(b, node, boundary, row_count)
    column = b.op("Unsqueeze", [positions], _INT64, [None, 1], axes=[1])
    matches = b.op(
        "Equal",
        [column, b.op("Unsqueeze", [rows], _INT64, [1, None], axes=[0])],
        _BOOL,
        [None, None],
    )
    ranks = add(b, arange(b, node, boundary, count), 1, [None])
    ranked = b.op(
        "Mul",
        [b.op("Cast", [matches], _INT64, [None, None], to=_INT64), ranks],
        _INT64,
        [None, None],
    )
    zeros = b.op(
        "Expand", [b.const(np.int64(0), "zero"), vector(b, [row_count, 1])], _INT64, [None, 1]
    )
    ranked = b.op("Concat", [zeros, ranked], _INT64, [None, None], axis=1)
    best = b.op("ReduceMax", [ranked], _INT64, [None], axes=[1], keepdims=0)
    hit = b.op("Cast", [b.op("Cast", [best], _BOOL, [None], to=_BOOL)], _INT64, [None], to=_INT64)
    # row i of the result: row i of table where nothing hits it, else row row_count + best - 1
    # of the concatenation
    moved = b.op(
        "Sub",
        [add(b, best, row_count, [None]), b.op("Add", [positions, hit], _INT64, [None])],
        _INT64,
        [None],
    )
    choice = b.op("Add", [positions, b.op("Mul", [hit, moved], _INT64, [None])], _INT64, [None])
    both = b.op("Concat", [table, new_rows], elem, [None, None], axis=0)
    return b.op("Gather", [both, choice], elem, [None, None], axis=0)


@register("", "Scatter", 9)
def _scatter_9(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """Scatter does not exist before opset 9 (nor ScatterElements, which is the same operator):
    ``output[i][index[i][j]] = updates[i][j]`` for ``axis = 1``. Without it, each element of the
    result is chosen: with ``axis`` moved to the front, the indices and updates are first
    extended to the data's length on every other axis (with the index -1, which matches
    nothing) and by one row in front on ``axis``; each position p along ``axis`` is compared with
    every index, the row j of the last index equal to p found with ReduceMax of ``j * (index ==
    p)`` (0, the added row, for none), and the result taken from the updates at that row
    (GatherElements) or from the data (GatherElements of the two stacked)."""
    data, indices, updates = node.inputs[0], node.inputs[1], node.inputs[2]
    rank = ctx.require_rank(node, boundary, data)
    axis = attribute(node, "axis", 0) % rank
    elem = ctx.elem_type(data)
    if elem is None:
        raise ctx.refuse(node, boundary, f"the type of its input '{data.name}' is unknown")
    b = Builder(ctx)
    perm = [axis, *(k for k in range(rank) if k != axis)]
    moved = [_moved(b, value, perm) for value in (data, as_int64(b, indices), updates)]
    table, index, values = moved
    table_lengths = lengths_of(b, table)
    index = _extended(b, index, _INT64, table_lengths, np.int64(-1))
    values = _extended(b, values, elem, table_lengths, np.zeros((), np_dtype(elem)))
    ones = [1] * (rank - 1)
    positions = arange(b, node, boundary, table_lengths[0])
    column = b.op(
        "Reshape",
        [positions, b.const(np.array([-1, 1, *ones], np.int64), "along")],
        _INT64,
        [None, 1, *ones],
    )
    spread = b.op("Unsqueeze", [index], _INT64, [1, None, *[None] * (rank - 1)], axes=[0])
    matches = b.op("Equal", [spread, column], _BOOL, [None] * (rank + 1))
    rows = arange(b, node, boundary, lengths_of(b, index)[0])
    rows = b.op(
        "Reshape",
        [rows, b.const(np.array([1, -1, *ones], np.int64), "along")],
        _INT64,
        [1, None, *ones],
    )
    ranked = b.op(
        "Mul",
        [b.op("Cast", [matches], _INT64, [None] * (rank + 1), to=_INT64), rows],
        _INT64,
        [None] * (rank + 1),
    )
    best = b.op("ReduceMax", [ranked], _INT64, [None] * rank, axes=[1], keepdims=0)
    chosen = gather_elements(b, node, boundary, values, best, 0)
    hit = b.op(
        "Cast",
        [b.op("Cast", [best], _BOOL, [None] * rank, to=_BOOL)],
        _INT64,
        [None] * rank,
        to=_INT64,
    )
    stacked = b.op(
        "Concat",
        [b.op("Unsqueeze", [v], elem, [1, *[None] * rank], axes=[0]) for v in (table, chosen)],
        elem, [2, *[None] * rank], axis=0,
    )  # fmt: skip
    hits = b.op("Unsqueeze", [hit], _INT64, [1, *[None] * rank], axes=[0])
    picked = gather_elements(b, node, boundary, stacked, hits, 0)
    last = perm == list(range(rank))
    result = b.op(
        "Squeeze", [picked], elem, [None] * rank, output=node.outputs[0] if last else None, axes=[0]
    )
    if not last:
        inverse = [perm.index(k) for k in range(rank)]
        b.op("Transpose", [result], None, output=node.outputs[0], perm=inverse)
    return b.nodes


def _moved(b: Builder, value: ir.Value, perm: list[int]) -> ir.Value:
    if perm == list(range(len(perm))):
        return value
    shape = b.ctx.shape(value)
    moved = [shape[p] for p in perm] if shape is not None else None
    return b.op("Transpose", [value], b.ctx.elem_type(value), moved, perm=perm)


def _extended(
    b: Builder, value: ir.Value, elem: ir.DataType, lengths: Lengths, fill: np.ndarray
) -> ir.Value:
    """``value`` extended with ``fill`` to the ``lengths`` of every axis but the first, and by one
    element in front on the first."""
    rank = len(lengths.shape) if lengths.shape is not None else b.ctx.rank(value)
    filler = b.const(fill, "fill")
    own = lengths_of(b, value)
    for k in range(1, rank):
        target, current = lengths[k], own[k]
        if isinstance(target, int) and isinstance(current, int) and target == current:
            continue
        missing = (
            target - current
            if isinstance(target, int) and isinstance(current, int)
            else b.op("Sub", [scalar(b, target), scalar(b, current)], _INT64, [])
        )
        value = _concat_block(b, value, elem, k, missing, after=True, filler=filler)
        own = lengths_of(b, value)
    return _concat_block(b, value, elem, 0, 1, after=False, filler=filler)


def _concat_block(
    b: Builder,
    value: ir.Value,
    elem: ir.DataType,
    axis: int,
    amount: Int,
    *,
    after: bool,
    filler: ir.Value,
) -> ir.Value:
    """``value`` with a block of ``filler``, ``amount`` long on ``axis``, concatenated after or
    before it."""
    own = lengths_of(b, value)
    rank = b.ctx.rank(value)
    block = vector(b, [amount if k == axis else own[k] for k in range(rank)])
    filled = b.op("Expand", [filler, block], elem, [None] * rank)
    parts = [value, filled] if after else [filled, value]
    return b.op("Concat", parts, elem, [None] * rank, axis=axis)


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
