"""Adapters for gathering, scattering and selecting: Gather, Scatter, ScatterElements, OneHot and
Compress, whose axes and indices count from the back from opset 11 on; GatherElements, GatherND
and ScatterND, which opset 11 introduced, computed below it as offsets into the flattened data;
and Scatter and Where, which opset 8 lacks.

Every rewrite here selects or places values without arithmetic on them: the data is reshaped,
and ``Gather`` (opset 1) or ``Scatter`` (opset 9) moves its elements, so every value,
infinities, NaN and -0.0 included, comes out as it went in. Only the offsets are computed, in
int64, from the indices and the dimensions of the data read with ``Shape`` when the model runs,
so dynamic shapes convert too (``_blocks``).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from torchscan.onnx._export._convert._blocks import (
    Int,
    Lengths,
    add,
    arange,
    as_int64,
    from_front,
    lengths_of,
    multiply,
    product,
    scalar,
    strides,
    vector,
)
from torchscan.onnx._export._convert._context import (
    Builder,
    Context,
    attribute,
    np_dtype,
    required,
    static_shape,
)
from torchscan.onnx._export._convert._helpers import (
    drop_added_attributes,
    negative_axes,
    onnx_adapter,
)
from torchscan.onnx._export._convert._registry import adapters

_INT64, _BOOL = ir.DataType.INT64, ir.DataType.BOOL


# -- axes and indices that count from the back (opset 11) -----------------------------------------

_count_axis = negative_axes("axis")
_count_one_hot_axis = negative_axes("axis", 1)


def _axis_and_indices_from_front(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """Opset 11 lets the ``axis`` of Gather and Scatter count from the back, and their indices
    too; both are counted from the front."""
    _count_axis(node, ctx, boundary)
    b = Builder(ctx)
    axis = attribute(node, "axis", 0)
    node.replace_input_with(1, _indices_from_front(b, node, boundary, required(node, 0), axis))
    return [*b.nodes, node]


def _indices_from_front(
    b: Builder, node: ir.Node, boundary: int, data: ir.Value, axis: int
) -> ir.Value:
    """The indices of ``node`` (its input 1) into axis ``axis`` of ``data``, counted from the
    front."""
    ctx = b.ctx
    indices = required(node, 1)
    value = ctx.const(indices)
    shape = ctx.shape(data)
    length = shape[axis] if shape is not None else None
    if value is not None and not (value < 0).any():
        return indices
    if value is not None and length is not None:
        return ctx.add_const(np.where(value < 0, value + length, value), "indices")
    elem = ctx.elem_type(indices)
    if elem is None or elem not in (ir.DataType.INT32, _INT64):
        raise ctx.refuse(node, boundary, f"the type of its indices '{indices.name}' is unknown")
    if length is not None:
        size = ctx.add_const(np.array(length, np_dtype(elem)), "length")
    else:
        whole = b.op("Shape", [data], None)
        size = b.op("Gather", [whole, ctx.add_const(np.array(axis, np.int64), "axis")], None)
        size.name = ctx.fresh("length")
        if elem != _INT64:
            size = b.op("Cast", [size], None, to=elem)
    # ONNX integer division truncates towards zero, so for an index i in [-n, n - 1] the
    # quotient (i - n + 1) / n is -1 where i is negative and 0 otherwise.
    one = ctx.add_const(np.array(1, np_dtype(elem)), "one")
    length_less_one = b.op("Sub", [size, one], None)
    index_shape = ctx.shape(indices)
    shifted = b.op("Sub", [indices, length_less_one], elem, index_shape)
    quotient = b.op("Div", [shifted, size], elem, index_shape)
    offset = b.op("Mul", [quotient, size], elem, index_shape)
    return b.op("Sub", [indices, offset], elem, index_shape)


def _one_hot_from_front(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """Opset 11 lets OneHot's ``axis`` count from the back, in the rank of its result, and its
    indices be in [-depth, -1]; both are counted from the front."""
    _count_one_hot_axis(node, ctx, boundary)
    b = Builder(ctx)
    node.replace_input_with(0, _one_hot_indices(b, node))
    return [*b.nodes, node]


def _one_hot_indices(b: Builder, node: ir.Node) -> ir.Value:
    """OneHot-11 reads an index i in [-depth, -1] as i + depth; OneHot-9 reads every negative
    index as out of range. Adding depth to the negative indices is exact: those below -depth
    stay negative, out of range at both versions. Indices are read as int64 at both."""
    ctx = b.ctx
    indices, depth = node.inputs[0], node.inputs[1]
    value, depth_value = ctx.const(indices), ctx.const(depth)
    if value is not None and depth_value is not None:
        whole = value.astype(np.int64)
        counted = np.where(whole < 0, whole + int(depth_value.reshape(-1)[0]), whole)
        return ctx.add_const(counted, "indices")
    shape = ctx.shape(indices)
    as_int = b.op("Cast", [indices], _INT64, shape, to=_INT64)
    scalar_depth = b.op("Cast", [depth], None, to=_INT64)
    flat_depth = b.op(
        "Reshape", [scalar_depth, ctx.add_const(np.zeros(0, np.int64), "scalar")], None
    )
    zero = ctx.add_const(np.array(0, np.int64), "zero")
    negative = b.op("Less", [as_int, zero], _BOOL, shape)
    as_count = b.op("Cast", [negative], _INT64, shape, to=_INT64)
    offset = b.op("Mul", [as_count, flat_depth], _INT64, shape)
    return b.op("Add", [as_int, offset], _INT64, shape)


# -- the operators ---------------------------------------------------------------------------------


@adapters("Gather")
class Gather:
    """Gather: an axis and indices that count from the back at opset 11."""

    below_11 = _axis_and_indices_from_front


@adapters("Scatter")
class Scatter:
    """Scatter, which opset 9 introduced; an axis and indices that count from the back at opset
    11."""

    @staticmethod
    def below_9(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """Scatter does not exist before opset 9 (nor ScatterElements, which is the same operator):
        ``output[i][index[i][j]] = updates[i][j]`` for ``axis = 1``. Without it, each element of the
        result is chosen: with ``axis`` moved to the front, the indices and updates are first
        extended to the data's length on every other axis (with the index -1, which matches nothing)
        and by one row in front on ``axis``; each position p along ``axis`` is compared with every
        index, the row j of the last index equal to p found with ReduceMax of ``j * (index == p)``
        (0, the added row, for none), and the result taken from the updates at that row
        (GatherElements) or from the data (GatherElements of the two stacked)."""
        data, indices, updates = required(node, 0), required(node, 1), required(node, 2)
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
            "Squeeze",
            [picked],
            elem,
            [None] * rank,
            output=node.outputs[0] if last else None,
            axes=[0],
        )
        if not last:
            inverse = [perm.index(k) for k in range(rank)]
            b.op("Transpose", [result], None, output=node.outputs[0], perm=inverse)
        return b.nodes

    below_11 = _axis_and_indices_from_front


@adapters("ScatterElements")
class ScatterElements:
    """ScatterElements, which opset 11 introduced; ``reduction`` at opset 16 (none, add, mul) and 18
    (max, min), which onnx's adapter drops where it means the older behaviour and refuses
    otherwise."""

    @staticmethod
    def below_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """ScatterElements does not exist before opset 11; Scatter-9 is the same operator ("Scatter
        ... is deprecated. Please use ScatterElements, which provides the same functionality")
        without negative axes and indices."""
        node.op_type = "Scatter"
        return _axis_and_indices_from_front(node, ctx, boundary)

    below_16 = below_18 = onnx_adapter


@adapters("OneHot")
class OneHot:
    """OneHot: an axis and indices that count from the back at opset 11."""

    below_11 = _one_hot_from_front


@adapters("Compress")
class Compress:
    """Compress: an axis that counts from the back at opset 11."""

    below_11 = negative_axes("axis")


@adapters("GatherElements")
class GatherElements:
    """GatherElements, which opset 11 introduced."""

    @staticmethod
    def below_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """GatherElements does not exist before opset 11:
        ``out[i][j][k] = data[i][index[i][j][k]][k]`` for ``axis = 1`` ("its output shape is the
        same as the shape of indices"), with negative indices counted from the back (see
        ``gather_elements``)."""
        data, indices = required(node, 0), required(node, 1)
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
    assert rank is not None  # known to every caller
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


@adapters("GatherND")
class GatherND:
    """GatherND, which opset 11 introduced; ``batch_dims`` at opset 12, dropped where it is 0."""

    @staticmethod
    def below_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """GatherND does not exist before opset 11. Index tuples of length 1 (``indices`` of shape
        [..., 1], what torch.onnx makes of ``x[:, idx]``) gather slices along axis 0, as Gather
        does. Longer tuples of length k (``t[a, b]``) gather from the data with its first k axes
        made one: at the offset ``sum(index[m] * stride[m])`` of each tuple, where ``stride[m]`` is
        the product of the lengths of axes m + 1 to k - 1 and negative indices are counted from the
        front."""
        data, indices = required(node, 0), required(node, 1)
        rank, index_rank, tuple_length = _index_tuples(node, ctx, boundary)
        b = Builder(ctx)
        shape = ctx.shape(indices)
        assert shape is not None  # _index_tuples refuses indices of unknown shape
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
        kept = (
            data_shape[tuple_length:] if data_shape is not None else [None] * (rank - tuple_length)
        )
        merged = b.op("Reshape", [data, rows], ctx.elem_type(data), [None, *kept])
        b.op("Gather", [merged, offsets], None, output=node.outputs[0], axis=0)
        return b.nodes

    below_12 = drop_added_attributes(batch_dims=0)


@adapters("ScatterND")
class ScatterND:
    """ScatterND, which opset 11 introduced; ``reduction`` at opset 16 (none, add, mul) and 18
    (max, min), which onnx's adapter drops where it means the older behaviour and refuses
    otherwise."""

    @staticmethod
    def below_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """ScatterND does not exist before opset 11: ``output[indices[idx]] = updates[idx]``, each
        index tuple of length k naming a slice of the last r - k axes. From opset 9 on, it is a
        Scatter-9 along the one axis of the flattened data: each element of a slice goes to the
        offset of its tuple (``sum(index[m] * stride[m])``, negative indices counted from the front)
        times the size of a slice, plus its position in the slice. At opset 8, which has no Scatter,
        the data is seen as rows, one per slice, and each row of the result is chosen from the data
        or the updates (``_choose_rows``)."""
        data, indices, updates = required(node, 0), required(node, 1), required(node, 2)
        rank, _, tuple_length = _index_tuples(node, ctx, boundary)
        b = Builder(ctx)
        elem = ctx.elem_type(data)
        keep = tuple_length < rank
        offsets, lengths = _tuple_offsets(b, data, indices, rank, tuple_length, keepdims=int(keep))
        slice_size = product(b, lengths.of(range(tuple_length, rank)))
        flat = b.const(np.array([-1], np.int64), "flat")
        index_shape = ctx.shape(indices)
        assert index_shape is not None  # _index_tuples refuses indices of unknown shape
        if ctx.target_opset < 9:
            rows = b.op("Reshape", [offsets, flat], _INT64, [None])
            count = product(b, lengths_of(b, indices).of(range(len(index_shape) - 1)))
            row_count = product(b, lengths.of(range(tuple_length)))
            as_rows = vector(b, [row_count, slice_size])
            table = b.op("Reshape", [data, as_rows], elem, [None, None])
            new_rows = b.op(
                "Reshape", [updates, vector(b, [count, slice_size])], elem, [None, None]
            )
            chosen = _choose_rows(b, node, boundary, table, row_count, rows, count, new_rows)
        else:
            if keep:
                shape = index_shape[:-1]
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

    below_16 = below_18 = onnx_adapter


def _flat(b: Builder, data: ir.Value) -> ir.Value:
    static = static_shape(b.ctx.shape(data))
    size = None if static is None else int(np.prod(static, dtype=np.int64))
    flat = b.const(np.array([-1], np.int64), "flat")
    return b.op("Reshape", [data, flat], b.ctx.elem_type(data), [size])


def _index_tuples(node: ir.Node, ctx: Context, boundary: int) -> tuple[int, int, int]:
    """The rank of ``data``, the rank of ``indices`` and the length of its index tuples, which
    GatherND and ScatterND need to be known."""
    data, indices = required(node, 0), required(node, 1)
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
    assert shape is not None  # _index_tuples refuses indices of unknown shape
    leading = lengths.of(range(tuple_length))
    counted = from_front(b, as_int64(b, indices), vector(b, leading), shape)
    steps = vector(b, strides(b, lengths.__getitem__, tuple_length))
    scaled = b.op("Mul", [counted, steps], _INT64, shape)
    summed = [*shape[:-1], 1] if keepdims else shape[:-1]
    offsets = b.op(
        "ReduceSum", [scaled], _INT64, summed, axes=[len(shape) - 1], keepdims=keepdims
    )  # fmt: skip
    return offsets, lengths


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


def _moved(b: Builder, value: ir.Value, perm: list[int]) -> ir.Value:
    if perm == list(range(len(perm))):
        return value
    shape = b.ctx.shape(value)
    moved = [shape[p] for p in perm] if shape is not None else None
    return b.op("Transpose", [value], b.ctx.elem_type(value), moved, perm=perm)


def _extended(
    b: Builder, value: ir.Value, elem: ir.DataType, lengths: Lengths, fill: np.ndarray | np.generic
) -> ir.Value:
    """``value`` extended with ``fill`` to the ``lengths`` of every axis but the first, and by one
    element in front on the first."""
    rank = len(lengths.shape) if lengths.shape is not None else b.ctx.rank(value)
    assert rank is not None  # the caller's data has a known rank
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
    assert rank is not None  # Scatter's indices of unknown rank are not converted
    block = vector(b, [amount if k == axis else own[k] for k in range(rank)])
    filled = b.op("Expand", [filler, block], elem, [None] * rank)
    parts = [value, filled] if after else [filled, value]
    return b.op("Concat", parts, elem, [None] * rank, axis=axis)


@adapters("Where")
class Where:
    """Where, which opset 9 introduced."""

    @staticmethod
    def below_9(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """Where does not exist before opset 9. For an output of static shape S with N elements it
        is computed by selection alone, which keeps every value, infinities and NaN included: y and
        x broadcast to S and flattened are concatenated, and element i of the result is element
        i + N * condition[i] of that."""
        condition, x, y = required(node, 0), required(node, 1), required(node, 2)
        shape = static_shape(ctx.shape(node.outputs[0]))
        if shape is None:
            shapes = [static_shape(ctx.shape(value)) for value in node.inputs]
            known = [s for s in shapes if s is not None]
            if len(known) != len(shapes):
                raise ctx.refuse(
                    node, boundary, "without Where, selecting needs the shape of the result, which "
                    "is not known before run time (export with static shapes where it is computed: "
                    "a scan with lengths selects the carry of every example, and needs a static "
                    "batch size)"
                )  # fmt: skip
            shape = list(np.broadcast_shapes(*[tuple(s) for s in known]))
        size = int(np.prod(shape, dtype=np.int64))
        elem = ctx.elem_type(x)
        target = ctx.add_const(np.array(shape, np.int64), "shape")
        flat = ctx.add_const(np.array([size], np.int64), "flat")
        # the flattened inputs come first in the graph, then what selects from them
        flattening, b = Builder(ctx), Builder(ctx)

        def flattened(value: ir.Value, kind: ir.DataType | None) -> ir.Value:
            expanded = flattening.op("Expand", [value, target], kind, shape)
            return flattening.op("Reshape", [expanded, flat], kind, [size])

        both = b.op("Concat", [flattened(y, elem), flattened(x, elem)], elem, [2 * size], axis=0)
        chosen = b.op("Cast", [flattened(condition, _BOOL)], _INT64, [size], to=_INT64)
        offset = b.op("Mul", [chosen, ctx.add_const(np.int64(size), "size")], _INT64, [size])
        positions = ctx.add_const(np.arange(size, dtype=np.int64), "positions")
        indices = b.op("Add", [offset, positions], _INT64, [size])
        picked = b.op("Gather", [both, indices], elem, [size], axis=0)
        b.op("Reshape", [picked, target], None, output=node.outputs[0])
        return [*flattening.nodes, *b.nodes]
