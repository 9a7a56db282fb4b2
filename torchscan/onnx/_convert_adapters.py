"""The rewrites that carry a node across one version boundary of its operator.

An adapter registered for ``(op, b)`` receives a node valid at opset ``b`` (where the operator's
version ``b`` starts) and returns nodes valid at opset ``b - 1`` that compute the same outputs
for every input the node accepts; the converter (``_convert``) moves them further down. Where
opset ``b - 1`` cannot express the node, the adapter raises the converter's refusal, saying what
is missing. Each docstring quotes the change of the specification it undoes.

Adapters read types, shapes and constant values from the converter, and make new values and
initializers with it; they never change the node they are given.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

if TYPE_CHECKING:
    from torchscan.onnx._convert import Converter

Adapter = Callable[[onnx.NodeProto, "Converter", int], list[onnx.NodeProto]]

ADAPTERS: dict[tuple[str, int], Adapter] = {}
"""The adapter for each (operator, since version) boundary that needs one."""


def _adapts(ops: str | Sequence[str], *boundaries: int) -> Callable[[Adapter], Adapter]:
    def register(adapter: Adapter) -> Adapter:
        for op in [ops] if isinstance(ops, str) else ops:
            for boundary in boundaries:
                ADAPTERS[(op, boundary)] = adapter
        return adapter

    return register


# -- node helpers, shared with the converter ----------------------------------------------------


def attribute(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    """The value of attribute ``name`` of ``node`` (strings decoded), or ``default``."""
    for found in node.attribute:
        if found.name == name:
            value = helper.get_attribute_value(found)
            return value.decode() if isinstance(value, bytes) else value
    return default


def set_attribute(node: onnx.NodeProto, name: str, value: Any) -> None:
    remove_attribute(node, name)
    node.attribute.append(helper.make_attribute(name, value))


def remove_attribute(node: onnx.NodeProto, name: str) -> None:
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(kept)


def copy_node(node: onnx.NodeProto) -> onnx.NodeProto:
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    return copy


def present_inputs(node: onnx.NodeProto) -> list[str]:
    """The inputs of ``node`` without the omitted optional ones at the end."""
    inputs = list(node.input)
    while inputs and not inputs[-1]:
        inputs.pop()
    return inputs


def constant_of_node(node: onnx.NodeProto) -> np.ndarray | None:
    """The value of a ``Constant`` node, or None for one that holds no tensor."""
    for found in node.attribute:
        value = helper.get_attribute_value(found)
        if found.name == "value":
            return numpy_helper.to_array(value)
        if found.name == "sparse_value":
            return _dense(value)
        if found.name in ("value_float", "value_floats"):
            return np.array(value, dtype=np.float32)
        if found.name in ("value_int", "value_ints"):
            return np.array(value, dtype=np.int64)
        if found.name in ("value_string", "value_strings"):
            return np.array(value, dtype=object)
    return None


def _dense(sparse: onnx.SparseTensorProto) -> np.ndarray:
    values = numpy_helper.to_array(sparse.values)
    indices = numpy_helper.to_array(sparse.indices)
    dense = np.zeros(int(np.prod(sparse.dims)), dtype=values.dtype)
    if indices.ndim == 2:  # one row of coordinates per value
        indices = np.ravel_multi_index(tuple(indices.T), tuple(sparse.dims))
    dense[indices] = values
    return dense.reshape(tuple(sparse.dims))


# Wider types that hold every value of a type exactly, preferred first. int64 and uint64 have
# none: a double holds integers exactly only up to 2**53.
VALUE_PRESERVING = {
    "bool": ["int32", "int64", "float", "double"],
    "int8": ["int16", "int32", "int64", "float", "double"],
    "uint8": ["int16", "uint16", "int32", "uint32", "int64", "uint64", "float", "double"],
    "int16": ["int32", "int64", "float", "double"],
    "uint16": ["int32", "uint32", "int64", "uint64", "float", "double"],
    "int32": ["int64", "double"],
    "uint32": ["int64", "uint64", "double"],
    "float16": ["float", "double"],
    "bfloat16": ["float", "double"],
    "float": ["double"],
}


_FLOATS = frozenset({TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE})


def _type_name(elem_type: int) -> str:
    return TensorProto.DataType.Name(elem_type).lower()


def _np_dtype(elem_type: int) -> np.dtype:
    return helper.tensor_dtype_to_np_dtype(elem_type)


def _exactly(value: np.ndarray, dtype: np.dtype) -> np.ndarray | None:
    """``value`` converted to ``dtype``, or None where some element changes on the way."""
    with np.errstate(all="ignore"):
        converted = value.astype(dtype)
        back = converted.astype(value.dtype)
    nan = value.dtype.kind == "f" and bool(np.isnan(value).any())
    return converted if np.array_equal(back, value, equal_nan=nan) else None


# -- onnx's own adapters --------------------------------------------------------------------------


@_adapts(["ArgMax", "ArgMin"], 12)
@_adapts(["GRU", "LSTM", "RNN"], 14)
@_adapts(["ScatterElements", "ScatterND"], 16, 18)
@_adapts("Resize", 18)
@_adapts("BatchNormalization", 9)
def _onnx_adapter(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """onnx's C++ adapter, where it is exact: it drops an attribute the older version lacks when
    the attribute has the value that means the older behaviour (``select_last_index=0``,
    ``layout=0``, ``reduction`` none or add and mul, Resize's ``antialias=0`` and no ``axes``),
    and refuses any other value; BatchNormalization-9 dropped ``spatial``, whose default
    BatchNormalization-7 keeps."""
    return ctx.run_onnx_adapter(node, boundary)


@_adapts("Upsample", 9)
def _upsample_9(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """Upsample-9 takes ``scales`` as an input, Upsample-7 as an attribute (onnx's adapter)."""
    ctx.require_const(node, boundary, 1, "scales")
    return ctx.run_onnx_adapter(node, boundary)


# -- attributes added with a default that keeps the older behaviour -------------------------------

# Each attribute and the value that means what the older version did; for a list, every entry.
_ADDED_ATTRIBUTES: dict[tuple[str, int], dict[str, Any]] = {
    ("AveragePool", 10): {"ceil_mode": 0},
    ("MaxPool", 10): {"ceil_mode": 0, "dilations": 1},
    ("LpPool", 18): {"ceil_mode": 0, "dilations": 1},
    ("DepthToSpace", 11): {"mode": "DCR"},
    ("GatherND", 12): {"batch_dims": 0},
    ("BatchNormalization", 14): {"training_mode": 0},
}


def _drop_added_attributes(
    node: onnx.NodeProto, ctx: Converter, boundary: int
) -> list[onnx.NodeProto]:
    """An attribute added at ``boundary`` (pooling ``ceil_mode`` and ``dilations``, DepthToSpace's
    ``mode``, GatherND's ``batch_dims``, BatchNormalization's ``training_mode``) is dropped where
    it has the value that means the older behaviour, and refused otherwise."""
    lowered = copy_node(node)
    for name, neutral in _ADDED_ATTRIBUTES[(node.op_type, boundary)].items():
        value = attribute(node, name)
        values = value if isinstance(value, list) else [value]
        if value is not None and any(v != neutral for v in values):
            raise ctx.refuse(
                node, boundary, f"{name}={value} has no equivalent before opset {boundary}"
            )
        remove_attribute(lowered, name)
    return [lowered]


for _boundary in _ADDED_ATTRIBUTES:
    ADAPTERS[_boundary] = _drop_added_attributes


@_adapts("BatchNormalization", 15)
def _batchnorm_15(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """BatchNormalization-15 lets scale and bias, and mean and variance, have types of their
    own; BatchNormalization-14 wants scale and bias of the input's type. Nothing else changed:
    the node stays, and the converter checks its types at the target."""
    return [copy_node(node)]


# -- inputs that were attributes ------------------------------------------------------------------

_REDUCE_18 = [
    "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
    "ReduceMin", "ReduceProd", "ReduceSumSquare",
]  # fmt: skip


@_adapts(_REDUCE_18, 18)
@_adapts("ReduceSum", 13)
def _reduce_axes_input(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """ReduceSum-13 and the other reductions' version 18 take ``axes`` as an input, where "an
    empty axes" reduces over all axes, or with ``noop_with_empty_axes=1`` returns the input
    unchanged. Their older versions take an ``axes`` attribute, whose absence reduces over all
    axes."""
    given = len(present_inputs(node)) > 1
    axes = ctx.require_const(node, boundary, 1, "axes") if given else np.zeros(0, np.int64)
    if axes.size == 0 and attribute(node, "noop_with_empty_axes", 0):
        return [ctx.make_node("Identity", [node.input[0]], [node.output[0]])]
    lowered = copy_node(node)
    remove_attribute(lowered, "noop_with_empty_axes")
    del lowered.input[1:]
    if axes.size:
        set_attribute(lowered, "axes", [int(a) for a in axes.reshape(-1)])
    return [lowered]


@_adapts(["Squeeze", "Unsqueeze"], 13)
def _axes_input(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """Squeeze-13 and Unsqueeze-13 take ``axes`` as an input; their version 11 as an
    attribute."""
    lowered = copy_node(node)
    del lowered.input[1:]
    if len(present_inputs(node)) > 1:
        axes = ctx.require_const(node, boundary, 1, "axes")
        set_attribute(lowered, "axes", [int(a) for a in axes.reshape(-1)])
    return [lowered]


@_adapts("Split", 13)
def _split_13(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """Split-13 takes the lengths of its parts as the input ``split``; Split-11 as an
    attribute."""
    lowered = copy_node(node)
    del lowered.input[1:]
    if len(present_inputs(node)) > 1:
        split = ctx.require_const(node, boundary, 1, "split")
        set_attribute(lowered, "split", [int(s) for s in split.reshape(-1)])
    return [lowered]


@_adapts("TopK", 10)
def _topk_10(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """TopK-10 takes ``K`` as an input; TopK-1 as the attribute ``k``."""
    k = ctx.require_const(node, boundary, 1, "K")
    lowered = copy_node(node)
    del lowered.input[1:]
    set_attribute(lowered, "k", int(k.reshape(-1)[0]))
    return [lowered]


@_adapts("Pad", 11)
def _pad_11(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """Pad-11 takes ``pads`` and ``constant_value`` as inputs; Pad-2 takes the attributes
    ``pads`` and ``value``, a float, so the value must be exactly a float."""
    pads = ctx.require_const(node, boundary, 1, "pads")
    mode = attribute(node, "mode", "constant")
    lowered = helper.make_node(
        "Pad", [node.input[0]], list(node.output), name=node.name, mode=mode,
        pads=[int(p) for p in pads.reshape(-1)],
    )  # fmt: skip
    if len(present_inputs(node)) > 2 and mode == "constant":
        value = ctx.require_const(node, boundary, 2, "constant_value").reshape(-1)
        as_float = _exactly(value, np.dtype(np.float32))
        if as_float is None:
            raise ctx.refuse(
                node, boundary, f"its constant_value {value[0]} is not exactly a float, the type "
                "of Pad-2's value attribute"
            )  # fmt: skip
        lowered.attribute.append(helper.make_attribute("value", float(as_float[0])))
    return [lowered]


@_adapts("Clip", 11)
def _clip_11(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """Clip-11 takes ``min`` and ``max`` as inputs, an absent one meaning no bound; Clip-6 takes
    float attributes whose defaults are the largest finite floats, which would clip infinities,
    so an absent bound becomes an infinite one. (Integer Clips were rewritten at opset 12.)"""
    bounds = {}
    for index, name, unbounded in ((1, "min", -np.inf), (2, "max", np.inf)):
        if index < len(node.input) and node.input[index]:
            value = ctx.require_const(node, boundary, index, name).reshape(-1)
            as_float = _exactly(value, np.dtype(np.float32))
            if as_float is None:
                raise ctx.refuse(
                    node, boundary, f"its {name} {value[0]} is not exactly a float, the type of "
                    f"Clip-6's {name} attribute"
                )  # fmt: skip
            bounds[name] = float(as_float[0])
        else:
            bounds[name] = unbounded
    return [helper.make_node("Clip", [node.input[0]], list(node.output), name=node.name, **bounds)]


@_adapts("Slice", 10)
def _slice_10(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """Slice-10 takes ``starts``, ``ends``, ``axes`` and ``steps`` as inputs; Slice-1 takes the
    first three as attributes and has no steps. The axes with constant bounds and step 1 are
    sliced by one Slice-1. Every other axis is gathered at the indices its bounds and step
    select: found now where the bounds are constants and the axis length is known, else at run
    time (`_runtime_slice_indices`)."""
    inputs = present_inputs(node) + [""] * 5
    starts = ctx.const(inputs[1])
    ends = ctx.const(inputs[2])
    count = _slice_axis_count(node, ctx, boundary, starts, ends)
    axes = ctx.require_const(node, boundary, 3, "axes").reshape(-1) if inputs[3] else None
    steps = ctx.require_const(node, boundary, 4, "steps").reshape(-1) if inputs[4] else None
    if axes is None:
        axes = np.arange(count)
    if steps is None:
        steps = np.ones(count, np.int64)
    starts = None if starts is None else starts.reshape(-1)
    ends = None if ends is None else ends.reshape(-1)
    data, output = node.input[0], node.output[0]
    constant = starts is not None and ends is not None
    unit = (steps == 1) & constant
    if unit.all():
        lowered = helper.make_node(
            "Slice", [data], [output], name=node.name,
            starts=[int(s) for s in starts], ends=[int(e) for e in ends],
        )  # fmt: skip
        if inputs[3]:
            lowered.attribute.append(helper.make_attribute("axes", [int(a) for a in axes]))
        return [lowered]
    rank = ctx.require_rank(node, boundary, data)
    shape = list(ctx.shape(data) or [None] * rank)
    elem = ctx.elem_type(data)
    lowered = []
    current = data
    if unit.any():
        current = ctx.fresh(f"{output}_sliced")
        lowered.append(
            ctx.make_node(
                "Slice", [data], [current], starts=[int(s) for s in starts[unit]],
                ends=[int(e) for e in ends[unit]], axes=[int(a) % rank for a in axes[unit]],
            )
        )  # fmt: skip
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
                _slice_bound(ctx, lowered, name, values, j) for name, values in
                ((inputs[1], starts), (inputs[2], ends))
            ]  # fmt: skip
            indices = _runtime_slice_indices(ctx, lowered, current, axis, step, *bounds)
            shape[axis] = None
        result = output if done == len(gathered) else ctx.fresh(f"{output}_strided")
        ctx.set_type(result, elem, shape)
        lowered.append(ctx.make_node("Gather", [current, indices], [result], axis=axis))
        current = result
    return lowered


def _slice_axis_count(
    node: onnx.NodeProto,
    ctx: Converter,
    boundary: int,
    starts: np.ndarray | None,
    ends: np.ndarray | None,
) -> int:
    """How many axes a Slice slices: the length of its ``starts``, known before run time."""
    for known in (starts, ends):
        if known is not None:
            return int(known.size)
    shape = ctx.shape(node.input[1])
    if shape is None or len(shape) != 1 or shape[0] is None:
        raise ctx.refuse(node, boundary, "the number of axes it slices is not known")
    return shape[0]


def _slice_bound(
    ctx: Converter, made: list[onnx.NodeProto], name: str, values: np.ndarray | None, j: int
) -> str:
    """Entry ``j`` of a Slice's ``starts`` or ``ends`` as an int64 scalar."""
    if values is not None:
        return ctx.add_const(np.int64(values[j]), "bound")
    picked = _scalar_op(ctx, made, "Gather", [name, ctx.add_const(np.int64(j), "entry")])
    if ctx.elem_type(name) == TensorProto.INT64:
        return picked
    return _scalar_op(ctx, made, "Cast", [picked], to=TensorProto.INT64)


def _scalar_op(
    ctx: Converter,
    made: list[onnx.NodeProto],
    op: str,
    inputs: Sequence[str],
    elem: int = TensorProto.INT64,
    **attributes: Any,
) -> str:
    node = ctx.make_node(op, inputs, **attributes)
    ctx.set_type(node.output[0], elem, [])
    made.append(node)
    return node.output[0]


def _runtime_slice_indices(
    ctx: Converter,
    made: list[onnx.NodeProto],
    data: str,
    axis: int,
    step: int,
    start: str,
    end: str,
) -> str:
    """The indices that Slice-10 selects on ``axis`` of ``data`` with the int64 scalars
    ``start`` and ``end`` and the constant ``step``, computed when the model runs.

    The bounds are clamped as the specification says: a negative bound counts from the back,
    then both are clamped to ``[0, dim]`` for a positive step and to ``[0, dim - 1]`` (start)
    and ``[-1, dim - 1]`` (end) for a negative one. Comparisons are made in double, which is
    exact in sign for any int64 compared with an axis length, and selections by adding a
    multiple of 0 or 1, so that nothing here needs an operator that opset 8 lacks. The indices
    are then ``Range(start, end, step)``, which a Loop computes before opset 11 (``_range_11``).
    """
    shape = ctx.shape(data)
    length = shape[axis] if shape is not None else None
    if length is not None:
        dim = ctx.add_const(np.int64(length), "dim")
    else:
        whole = ctx.make_node("Shape", [data])
        ctx.set_type(whole.output[0], TensorProto.INT64, [len(shape) if shape else None])
        made.append(whole)
        dim = _scalar_op(
            ctx, made, "Gather", [whole.output[0], ctx.add_const(np.int64(axis), "axis")]
        )

    def is_less(a: str, b: str) -> str:
        a_, b_ = (
            _scalar_op(ctx, made, "Cast", [v], TensorProto.DOUBLE, to=TensorProto.DOUBLE)
            for v in (a, b)
        )
        less = _scalar_op(ctx, made, "Less", [a_, b_], TensorProto.BOOL)
        return _scalar_op(ctx, made, "Cast", [less], to=TensorProto.INT64)

    def select(flag: str, offset: str, base: str) -> str:
        moved = _scalar_op(ctx, made, "Mul", [offset, flag])
        return _scalar_op(ctx, made, "Add", [base, moved])

    def clamp(value: str, low: str, high: str) -> str:
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
    indices = ctx.fresh("slice_indices")
    ctx.set_type(indices, TensorProto.INT64, [None])
    count = ctx.make_node("Range", [start, end, ctx.add_const(np.int64(step), "step")], [indices])
    made.extend(_range_11(count, ctx, 11))
    return indices


# -- attributes and inputs whose meaning changed --------------------------------------------------


@_adapts("Split", 18)
def _split_18(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """Split-18's ``num_outputs`` splits into parts of equal length where the axis allows, "the
    last chunk will be smaller" otherwise; Split-13 without ``split`` only splits evenly, so
    uneven lengths are given as a constant ``split``, which needs the length of the axis."""
    lowered = copy_node(node)
    remove_attribute(lowered, "num_outputs")
    count = attribute(node, "num_outputs")
    if count is None:
        return [lowered]
    rank = ctx.require_rank(node, boundary, node.input[0])
    axis = attribute(node, "axis", 0) % rank
    length = (ctx.shape(node.input[0]) or [None] * rank)[axis]
    if length is None:
        raise ctx.refuse(
            node, boundary, f"num_outputs={count} makes parts whose lengths depend on the length "
            f"of axis {axis}, which is not known before run time"
        )  # fmt: skip
    if length % count == 0:
        return [lowered]
    chunk = -(-length // count)
    sizes = [chunk] * (count - 1) + [length - chunk * (count - 1)]
    if sizes[-1] < 0:
        raise ctx.refuse(node, boundary, f"an axis of length {length} has no {count} parts")
    del lowered.input[1:]
    lowered.input.append(ctx.add_const(np.array(sizes, np.int64), "split"))
    return [lowered]


@_adapts("Pad", 18)
def _pad_18(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """Pad-18 can pad the ``axes`` given only; Pad-13 takes ``pads`` for every axis, which are
    0 for the axes not given."""
    lowered = copy_node(node)
    del lowered.input[3:]
    if len(present_inputs(node)) < 4:
        return [lowered]
    axes = ctx.require_const(node, boundary, 3, "axes").reshape(-1)
    pads = ctx.require_const(node, boundary, 1, "pads").reshape(-1)
    rank = ctx.require_rank(node, boundary, node.input[0])
    full = np.zeros(2 * rank, np.int64)
    for i, axis in enumerate(axes):
        full[axis % rank] = pads[i]
        full[axis % rank + rank] = pads[i + len(axes)]
    lowered.input[1] = ctx.add_const(full, "pads")
    return [lowered]


@_adapts("TopK", 11)
def _topk_11(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """TopK-11 added ``largest`` and ``sorted``; TopK-10 returns the largest values, sorted.
    ``sorted=0`` leaves the order open, so a sorted result is one of the allowed ones.
    ``largest=0`` is the largest values of the negated input, negated back, which keeps "the
    lower index first" among equal values; negation is exact for floating-point types only."""
    lowered = copy_node(node)
    remove_attribute(lowered, "largest")
    remove_attribute(lowered, "sorted")
    if attribute(node, "largest", 1):
        return [lowered]
    elem = ctx.elem_type(node.input[0])
    if elem not in _FLOATS:
        kind = _type_name(elem) if elem else "unknown"
        raise ctx.refuse(
            node, boundary, f"largest=0 is computed on the negated input, which is exact for "
            f"floating-point types only, and the input is of type {kind}"
        )  # fmt: skip
    negated, negated_values = ctx.fresh(f"{node.input[0]}_negated"), ctx.fresh("values_negated")
    ctx.set_type(negated, elem, ctx.shape(node.input[0]))
    ctx.set_type(negated_values, elem, ctx.shape(node.output[0]))
    lowered.input[0], lowered.output[0] = negated, negated_values
    return [
        ctx.make_node("Neg", [node.input[0]], [negated]),
        lowered,
        ctx.make_node("Neg", [negated_values], [node.output[0]]),
    ]


@_adapts(["Softmax", "LogSoftmax", "Hardmax"], 13)
def _softmax_13(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """Softmax-13 (and LogSoftmax, Hardmax) normalizes along the one ``axis``; version 11
    "coerced to 2D" at ``axis`` and normalized over all axes from it to the last. The two agree
    where the axis is the last one, so another axis is swapped with the last by Transposes."""
    rank = ctx.require_rank(node, boundary, node.input[0])
    axis = attribute(node, "axis", -1) % rank
    lowered = copy_node(node)
    set_attribute(lowered, "axis", rank - 1)
    if axis == rank - 1:
        return [lowered]
    perm = list(range(rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    shape = ctx.shape(node.input[0])
    swapped = [shape[p] for p in perm] if shape else None
    elem = ctx.elem_type(node.input[0])
    before, after = ctx.fresh(f"{node.input[0]}_swapped"), ctx.fresh(f"{node.output[0]}_swapped")
    ctx.set_type(before, elem, swapped)
    ctx.set_type(after, elem, swapped)
    lowered.input[0], lowered.output[0] = before, after
    return [
        ctx.make_node("Transpose", [node.input[0]], [before], perm=perm),
        lowered,
        ctx.make_node("Transpose", [after], [node.output[0]], perm=perm),
    ]


@_adapts("Reshape", 14)
def _reshape_14(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """Reshape-14 added ``allowzero``: with allowzero=1 a 0 in the shape is a dimension of
    length 0, where Reshape-13 copies the input's dimension. Dropping it is exact where the shape
    holds no 0, or where the input is not empty: then a 0 would make an empty output from a
    non-empty input, which is an error of the model in the first place."""
    lowered = copy_node(node)
    remove_attribute(lowered, "allowzero")
    if not attribute(node, "allowzero", 0):
        return [lowered]
    data_shape = ctx.shape(node.input[0])
    if data_shape is not None and all(d for d in data_shape):
        return [lowered]
    if _holds_no_zero(ctx, node.input[1]):
        return [lowered]
    raise ctx.refuse(
        node, boundary, "allowzero=1 with a shape that may hold 0, which Reshape-13 reads as "
        "'copy the input's dimension'"
    )  # fmt: skip


def _holds_no_zero(ctx: Converter, shape: str) -> bool:
    value = ctx.const(shape)
    if value is not None:
        return not (value == 0).any()
    producer = ctx.producer(shape)
    if producer is None or producer.op_type != "Concat":
        return False
    # allowzero=1 forbids a 0 next to a -1, so with a -1 a valid shape has no 0
    pieces = [ctx.const(piece) for piece in producer.input]
    return any(piece is not None and (piece == -1).any() for piece in pieces)


@_adapts("Shape", 15)
def _shape_15(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """Shape-15 added ``start`` and ``end``, which select a slice of the shape with the clamping
    of Slice; Shape-13 returns the whole shape, which a Slice then cuts."""
    start, end = attribute(node, "start", 0), attribute(node, "end")
    lowered = copy_node(node)
    remove_attribute(lowered, "start")
    remove_attribute(lowered, "end")
    if start == 0 and end is None:
        return [lowered]
    whole = ctx.fresh(f"{node.output[0]}_whole")
    ctx.set_type(whole, TensorProto.INT64, [ctx.rank(node.input[0])])
    lowered.output[0] = whole
    last = end if end is not None else np.iinfo(np.int64).max
    starts = ctx.add_const(np.array([start], np.int64), "starts")
    ends = ctx.add_const(np.array([last], np.int64), "ends")
    return [lowered, ctx.make_node("Slice", [whole, starts, ends], [node.output[0]])]


@_adapts("Pow", 12)
def _pow_12(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """Pow-12 lets the exponent have a type of its own; Pow-7 wants the base's type. The
    exponent is converted where that keeps every value: a constant whose values all survive, or
    a type that the base's type holds exactly."""
    base, exponent = node.input[0], node.input[1]
    base_type, exponent_type = ctx.elem_type(base), ctx.elem_type(exponent)
    if base_type is None or exponent_type is None:
        raise ctx.refuse(node, boundary, "the types of its inputs are unknown")
    lowered = copy_node(node)
    if base_type == exponent_type:
        return [lowered]
    value = ctx.const(exponent)
    if value is not None:
        converted = _exactly(value, _np_dtype(base_type))
        if converted is not None:
            lowered.input[1] = ctx.add_const(converted, "exponent")
            return [lowered]
    elif _type_name(base_type) in VALUE_PRESERVING.get(_type_name(exponent_type), []):
        cast = ctx.fresh(f"{exponent}_cast")
        ctx.set_type(cast, base_type, ctx.shape(exponent))
        lowered.input[1] = cast
        return [ctx.make_node("Cast", [exponent], [cast], to=base_type), lowered]
    raise ctx.refuse(
        node, boundary, f"Pow-7 wants the exponent of the base's type, {_type_name(base_type)}, "
        f"and its exponent, of type {_type_name(exponent_type)}, does not convert to it exactly"
    )  # fmt: skip


@_adapts("Gemm", 11)
def _gemm_11(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """Gemm-11 made ``C`` optional; Gemm-9 requires it. A zero C adds nothing, if it is the zero
    whose sign keeps that of A*B: beta * C must be -0.0, as -0.0 + x is x for every x."""
    lowered = copy_node(node)
    if len(present_inputs(node)) >= 3:
        return [lowered]
    elem = ctx.elem_type(node.input[0])
    if elem is None:
        raise ctx.refuse(node, boundary, "the type of its inputs is unknown")
    zero = -0.0 if attribute(node, "beta", 1.0) >= 0 else 0.0
    del lowered.input[2:]
    lowered.input.extend([""] * (2 - len(lowered.input)))
    lowered.input.append(ctx.add_const(np.array(zero, _np_dtype(elem)), "C"))
    return [lowered]


@_adapts("Constant", 12)
def _constant_12(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """Constant-12 added ``value_float``, ``value_ints`` and the other typed attributes;
    Constant-11 holds a ``value`` tensor."""
    if attribute(node, "value") is not None or attribute(node, "sparse_value") is not None:
        return [copy_node(node)]
    value = constant_of_node(node)
    tensor = numpy_helper.from_array(value)
    return [helper.make_node("Constant", [], list(node.output), name=node.name, value=tensor)]


@_adapts("Constant", 11)
def _constant_11(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """Constant-11 added ``sparse_value``; Constant-9 holds the same values as a dense
    ``value``."""
    if attribute(node, "sparse_value") is None:
        return [copy_node(node)]
    tensor = numpy_helper.from_array(constant_of_node(node))
    return [helper.make_node("Constant", [], list(node.output), name=node.name, value=tensor)]


@_adapts("CastLike", 15)
def _castlike_15(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """CastLike does not exist before opset 15; it is the Cast to the type of its second
    input."""
    elem = ctx.elem_type(node.input[1])
    if elem is None:
        raise ctx.refuse(node, boundary, "the type of its input 'target_type' is unknown")
    return [helper.make_node("Cast", [node.input[0]], list(node.output), name=node.name, to=elem)]


@_adapts("Dropout", 12)
def _dropout_12(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """Dropout-12 takes ``training_mode`` as an input; out of training mode it returns its
    input, which is an Identity at every opset."""
    inputs = present_inputs(node)
    training = ctx.require_const(node, boundary, 2, "training_mode") if len(inputs) > 2 else 0
    if np.any(training):
        raise ctx.refuse(node, boundary, "training mode draws a random mask")
    if len(node.output) > 1 and node.output[1]:
        raise ctx.refuse(node, boundary, "its mask output is used")
    return [ctx.make_node("Identity", [node.input[0]], [node.output[0]])]


@_adapts("Resize", 13)
def _resize_13(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """Resize-13 made ``roi`` and ``scales`` optional; Resize-11 takes them always, where an
    empty tensor means not given."""
    lowered = copy_node(node)
    lowered.input.extend([""] * (3 - len(lowered.input)))
    for index, name in ((1, "roi"), (2, "scales")):
        if not lowered.input[index]:
            lowered.input[index] = ctx.add_const(np.zeros(0, np.float32), name)
    return [lowered]


@_adapts("Resize", 11)
def _resize_11(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """Resize-11 added the coordinate transformations and ``sizes``; Resize-10 maps an output
    coordinate x to x / scale ("asymmetric") and takes ``scales`` only. Nearest neighbours agree
    with ``nearest_mode=floor`` when no axis shrinks (onnxruntime rounds up when shrinking at
    opset 10); ``sizes`` become scales where each is an exact multiple of the input's length."""
    mode = attribute(node, "mode", "nearest")
    transformation = attribute(node, "coordinate_transformation_mode", "half_pixel")
    nearest = attribute(node, "nearest_mode", "round_prefer_floor")
    if (
        mode not in ("nearest", "linear")
        or transformation != "asymmetric"
        or (mode == "nearest" and nearest != "floor")
    ):
        raise ctx.refuse(
            node, boundary, "only mode=nearest with nearest_mode=floor, or mode=linear, with "
            f"coordinate_transformation_mode=asymmetric, exist before opset 11; it has "
            f"mode={mode}, coordinate_transformation_mode={transformation}, nearest_mode={nearest}"
        )  # fmt: skip
    inputs = [*present_inputs(node), "", "", ""]
    scales = ctx.const(inputs[2]) if inputs[2] else None
    if scales is None or scales.size == 0:
        scales = _scales_of_sizes(ctx, node, inputs[3])
        if scales is None:
            raise ctx.refuse(
                node, boundary, "Resize-10 takes scales: it needs constant scales, or constant "
                "sizes that are whole multiples of a static input shape"
            )  # fmt: skip
    if mode == "nearest" and (scales < 1).any():
        raise ctx.refuse(
            node, boundary, "nearest neighbours of a shrinking axis are rounded differently "
            "before opset 11"
        )  # fmt: skip
    given = ctx.add_const(scales.astype(np.float32), "scales")
    return [helper.make_node("Resize", [node.input[0], given], list(node.output), name=node.name,
                             mode=mode)]  # fmt: skip


def _scales_of_sizes(ctx: Converter, node: onnx.NodeProto, sizes: str) -> np.ndarray | None:
    value = ctx.const(sizes) if sizes else None
    shape = ctx.shape(node.input[0])
    if value is None or shape is None or None in shape or 0 in shape:
        return None
    lengths = np.array(shape, np.int64)
    if (value % lengths).any():
        return None
    return (value // lengths).astype(np.float32)


@_adapts("Resize", 10)
def _resize_10(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """Resize does not exist before opset 10; Upsample-9 has the same inputs, attribute and
    meaning."""
    lowered = copy_node(node)
    lowered.op_type = "Upsample"
    return [lowered]


# -- opset 11: negative axes and indices ----------------------------------------------------------

# Each operator whose axis attribute may count from the back at opset 11, with the attribute and
# how the rank it counts in follows from the input's: an axis of Flatten may be r, of Unsqueeze
# the rank of the result, of OneHot the rank of the result too.
_AXIS_ATTRIBUTE_11 = {
    "ArgMax": ("axis", 0), "ArgMin": ("axis", 0), "Compress": ("axis", 0), "Concat": ("axis", 0),
    "Flatten": ("axis", 0), "Gather": ("axis", 0), "Hardmax": ("axis", 0),
    "LogSoftmax": ("axis", 0), "OneHot": ("axis", 1), "Scatter": ("axis", 0),
    "Softmax": ("axis", 0), "Split": ("axis", 0), "Squeeze": ("axes", 0),
    "Unsqueeze": ("axes", None), **dict.fromkeys([*_REDUCE_18, "ReduceSum"], ("axes", 0)),
}  # fmt: skip


@_adapts(list(_AXIS_ATTRIBUTE_11), 11)
def _negative_axes_11(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """Opset 11 lets axes count from the back ("negative value means counting dimensions from
    the back"); they are counted from the front. Gather and Scatter also take negative indices
    from opset 11 on, and OneHot indices in [-depth, -1]: those are made non-negative too."""
    name, extra = _AXIS_ATTRIBUTE_11[node.op_type]
    lowered = copy_node(node)
    value = attribute(node, name)
    values = value if isinstance(value, list) else [] if value is None else [value]
    if any(v < 0 for v in values):
        rank = ctx.require_rank(node, boundary, node.input[0])
        rank += len(values) if extra is None else extra
        counted = [v + rank if v < 0 else v for v in values]
        if node.op_type == "Unsqueeze":
            counted.sort()
        set_attribute(lowered, name, counted if isinstance(value, list) else counted[0])
    prefix: list[onnx.NodeProto] = []
    if node.op_type in ("Gather", "Scatter"):
        axis = attribute(lowered, "axis", 0)
        prefix, lowered.input[1] = _indices_from_front(ctx, node, boundary, node.input[0], axis)
    elif node.op_type == "OneHot":
        prefix, lowered.input[0] = _one_hot_indices(ctx, node)
    return [*prefix, lowered]


def _indices_from_front(
    ctx: Converter, node: onnx.NodeProto, boundary: int, data: str, axis: int, indices: str = ""
) -> tuple[list[onnx.NodeProto], str]:
    """The nodes that count the indices of ``node`` (its input 1, or ``indices``) into axis
    ``axis`` of ``data`` from the front, and the name of the result."""
    indices = indices or node.input[1]
    value = ctx.const(indices)
    shape = ctx.shape(data)
    length = shape[axis] if shape is not None else None
    if value is not None and not (value < 0).any():
        return [], indices
    if value is not None and length is not None:
        return [], ctx.add_const(np.where(value < 0, value + length, value), "indices")
    elem = ctx.elem_type(indices)
    if elem not in (TensorProto.INT32, TensorProto.INT64):
        raise ctx.refuse(node, boundary, f"the type of its indices '{indices}' is unknown")
    nodes: list[onnx.NodeProto] = []
    if length is not None:
        size = ctx.add_const(np.array(length, _np_dtype(elem)), "length")
    else:
        whole = ctx.make_node("Shape", [data])
        size = ctx.fresh("length")
        nodes += [
            whole,
            ctx.make_node(
                "Gather", [whole.output[0], ctx.add_const(np.array(axis, np.int64), "axis")], [size]
            ),
        ]
        if elem != TensorProto.INT64:
            cast = ctx.make_node("Cast", [size], to=elem)
            nodes.append(cast)
            size = cast.output[0]
    # ONNX integer division truncates towards zero, so for an index i in [-n, n - 1] the
    # quotient (i - n + 1) / n is -1 where i is negative and 0 otherwise.
    one = ctx.add_const(np.array(1, _np_dtype(elem)), "one")
    length_less_one = ctx.make_node("Sub", [size, one])
    shifted = ctx.make_node("Sub", [indices, length_less_one.output[0]])
    quotient = ctx.make_node("Div", [shifted.output[0], size])
    offset = ctx.make_node("Mul", [quotient.output[0], size])
    counted = ctx.make_node("Sub", [indices, offset.output[0]])
    for made in (shifted, quotient, offset, counted):
        ctx.set_type(made.output[0], elem, ctx.shape(indices))
    return [*nodes, length_less_one, shifted, quotient, offset, counted], counted.output[0]


def _one_hot_indices(ctx: Converter, node: onnx.NodeProto) -> tuple[list[onnx.NodeProto], str]:
    """OneHot-11 reads an index i in [-depth, -1] as i + depth; OneHot-9 reads every negative
    index as out of range. Adding depth to the negative indices is exact: those below -depth
    stay negative, out of range at both versions. Indices are read as int64 at both."""
    indices, depth = node.input[0], node.input[1]
    value, depth_value = ctx.const(indices), ctx.const(depth)
    if value is not None and depth_value is not None:
        whole = value.astype(np.int64)
        counted = np.where(whole < 0, whole + int(depth_value.reshape(-1)[0]), whole)
        return [], ctx.add_const(counted, "indices")
    shape = ctx.shape(indices)
    as_int = ctx.make_node("Cast", [indices], to=TensorProto.INT64)
    scalar_depth = ctx.make_node("Cast", [depth], to=TensorProto.INT64)
    flat_depth = ctx.make_node(
        "Reshape", [scalar_depth.output[0], ctx.add_const(np.zeros(0, np.int64), "scalar")]
    )
    zero = ctx.add_const(np.array(0, np.int64), "zero")
    negative = ctx.make_node("Less", [as_int.output[0], zero])
    as_count = ctx.make_node("Cast", [negative.output[0]], to=TensorProto.INT64)
    offset = ctx.make_node("Mul", [as_count.output[0], flat_depth.output[0]])
    counted = ctx.make_node("Add", [as_int.output[0], offset.output[0]])
    for made in (as_int, as_count, offset, counted):
        ctx.set_type(made.output[0], TensorProto.INT64, shape)
    ctx.set_type(negative.output[0], TensorProto.BOOL, shape)
    made_nodes = [as_int, scalar_depth, flat_depth, negative, as_count, offset, counted]
    return made_nodes, counted.output[0]


@_adapts("Slice", 11)
def _slice_11(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """Slice-11 lets ``axes`` count from the back; they are counted from the front."""
    lowered = copy_node(node)
    if len(present_inputs(node)) > 3:
        axes = ctx.require_const(node, boundary, 3, "axes")
        if (axes < 0).any():
            rank = ctx.require_rank(node, boundary, node.input[0])
            lowered.input[3] = ctx.add_const(np.where(axes < 0, axes + rank, axes), "axes")
    return [lowered]


@_adapts("ScatterElements", 11)
def _scatter_elements_11(
    node: onnx.NodeProto, ctx: Converter, boundary: int
) -> list[onnx.NodeProto]:
    """ScatterElements does not exist before opset 11; Scatter-9 is the same operator ("Scatter
    ... is deprecated. Please use ScatterElements, which provides the same functionality")
    without negative axes and indices."""
    renamed = copy_node(node)
    renamed.op_type = "Scatter"
    return _negative_axes_11(renamed, ctx, boundary)


@_adapts("Equal", 11)
def _equal_11(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """Equal-11 added floating-point types. Below, a == b is computed as not (a < b or a > b or
    a is NaN or b is NaN), which is exact for every value; IsNaN exists from opset 9 on. Other
    types are left to the check of types at the target."""
    elem = ctx.elem_type(node.input[0])
    if elem is None:
        raise ctx.refuse(node, boundary, "the type of its inputs is unknown")
    if elem not in _FLOATS:
        return [copy_node(node)]
    if ctx.target < 9:
        raise ctx.refuse(
            node, boundary, f"comparing {_type_name(elem)} values exactly needs IsNaN, which "
            "exists from opset 9 on"
        )  # fmt: skip
    a, b = node.input[0], node.input[1]
    less, greater = ctx.make_node("Less", [a, b]), ctx.make_node("Greater", [a, b])
    ordered = ctx.make_node("Or", [less.output[0], greater.output[0]])
    a_nan, b_nan = ctx.make_node("IsNaN", [a]), ctx.make_node("IsNaN", [b])
    nan = ctx.make_node("Or", [a_nan.output[0], b_nan.output[0]])
    unequal = ctx.make_node("Or", [ordered.output[0], nan.output[0]])
    equal = ctx.make_node("Not", [unequal.output[0]], [node.output[0]])
    made = [less, greater, ordered, a_nan, b_nan, nan, unequal]
    for m in made:
        ctx.set_type(m.output[0], TensorProto.BOOL, None)
    return [*made, equal]


@_adapts("If", 11)
def _if_11(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """If-11 lets the branches return tensors of different shapes; If-1 says the outputs of the
    two branches "must be of the same shape". The node is kept unless the shapes known for an
    output differ."""
    then_branch, else_branch = attribute(node, "then_branch"), attribute(node, "else_branch")
    for i, (then_output, else_output) in enumerate(
        zip(then_branch.output, else_branch.output, strict=True)
    ):
        if _shapes_differ(then_output.type, else_output.type):
            raise ctx.refuse(
                node, boundary, f"its branches return output {i} in different shapes, which "
                "If-1 does not allow"
            )  # fmt: skip
    return [copy_node(node)]


def _shapes_differ(a: onnx.TypeProto, b: onnx.TypeProto) -> bool:
    if not (a.tensor_type.HasField("shape") and b.tensor_type.HasField("shape")):
        return False
    dims_a, dims_b = a.tensor_type.shape.dim, b.tensor_type.shape.dim
    if len(dims_a) != len(dims_b):
        return True
    return any(
        x.HasField("dim_value") and y.HasField("dim_value") and x.dim_value != y.dim_value
        for x, y in zip(dims_a, dims_b, strict=True)
    )


@_adapts(["Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool"], 11)
def _auto_pad_11(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
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
    return [copy_node(node)]


# -- operators that older opsets lack ------------------------------------------------------------


@_adapts("GatherND", 11)
def _gathernd_11(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """GatherND does not exist before opset 11. With index tuples of length 1 (``indices`` of
    shape [..., 1], what torch.onnx makes of ``x[:, idx]``) it gathers slices along axis 0, as
    Gather does; its negative indices, counted from the back, are counted from the front."""
    data, indices = node.input[0], node.input[1]
    shape = ctx.shape(indices)
    if not shape or shape[-1] != 1:
        raise ctx.refuse(
            node, boundary, "only index tuples of length 1, indices of a static shape [..., 1], "
            "have an equivalent, a Gather"
        )  # fmt: skip
    squeezed = ctx.make_node("Squeeze", [indices], axes=[len(shape) - 1])
    ctx.set_type(squeezed.output[0], ctx.elem_type(indices), shape[:-1])
    counting, counted = _indices_from_front(ctx, node, boundary, data, 0, squeezed.output[0])
    return [squeezed, *counting, ctx.make_node("Gather", [data, counted], [node.output[0]], axis=0)]


@_adapts("ConstantOfShape", 9)
def _constant_of_shape_9(
    node: onnx.NodeProto, ctx: Converter, boundary: int
) -> list[onnx.NodeProto]:
    """ConstantOfShape does not exist before opset 9; Expand (opset 8) of its one value to the
    shape makes the same tensor."""
    value = attribute(node, "value")
    scalar = numpy_helper.to_array(value).reshape(()) if value is not None else np.float32(0)
    filler = ctx.add_const(scalar, "value")
    return [ctx.make_node("Expand", [filler, node.input[0]], [node.output[0]])]


@_adapts("Where", 9)
def _where_9(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """Where does not exist before opset 9. For an output of static shape S with N elements it
    is computed by selection alone, which keeps every value, infinities and NaN included: y and
    x broadcast to S and flattened are concatenated, and element i of the result is element
    i + N * condition[i] of that."""
    condition, x, y = node.input
    shape = ctx.shape(node.output[0])
    if shape is None or None in shape:
        shapes = [ctx.shape(name) for name in node.input]
        if any(s is None or None in s for s in shapes):
            raise ctx.refuse(
                node, boundary, "without Where, selecting needs the shape of the result, which "
                "is not known before run time"
            )  # fmt: skip
        shape = list(np.broadcast_shapes(*[tuple(s) for s in shapes]))
    size = int(np.prod(shape, dtype=np.int64))
    elem = ctx.elem_type(x)
    target = ctx.add_const(np.array(shape, np.int64), "shape")
    flat = ctx.add_const(np.array([size], np.int64), "flat")
    made: list[onnx.NodeProto] = []

    def flattened(name: str, kind: int | None) -> str:
        expanded = ctx.make_node("Expand", [name, target])
        reshaped = ctx.make_node("Reshape", [expanded.output[0], flat])
        ctx.set_type(expanded.output[0], kind, shape)
        ctx.set_type(reshaped.output[0], kind, [size])
        made.extend([expanded, reshaped])
        return reshaped.output[0]

    both = ctx.make_node("Concat", [flattened(y, elem), flattened(x, elem)], axis=0)
    chosen = ctx.make_node("Cast", [flattened(condition, TensorProto.BOOL)], to=TensorProto.INT64)
    offset = ctx.make_node("Mul", [chosen.output[0], ctx.add_const(np.int64(size), "size")])
    positions = ctx.add_const(np.arange(size, dtype=np.int64), "positions")
    indices = ctx.make_node("Add", [offset.output[0], positions])
    picked = ctx.make_node("Gather", [both.output[0], indices.output[0]], axis=0)
    for name, kind, length in [
        (both.output[0], elem, 2 * size), (chosen.output[0], TensorProto.INT64, size),
        (offset.output[0], TensorProto.INT64, size), (indices.output[0], TensorProto.INT64, size),
        (picked.output[0], elem, size),
    ]:  # fmt: skip
        ctx.set_type(name, kind, [length])
    result = ctx.make_node("Reshape", [picked.output[0], target], [node.output[0]])
    return [*made, both, chosen, offset, indices, picked, result]


@_adapts("CumSum", 11)
def _cumsum_11(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """CumSum does not exist before opset 11. A Scan along ``axis`` adds one slice at a time to
    a running sum, in the order CumSum sums (backwards for ``reverse=1``), and emits the sum
    after each slice, or before it for ``exclusive=1``."""
    x = node.input[0]
    axis_value = ctx.require_const(node, boundary, 1, "axis")
    rank = ctx.require_rank(node, boundary, x)
    elem = ctx.elem_type(x)
    if elem is None:
        raise ctx.refuse(node, boundary, "the type of its input is unknown")
    axis = int(axis_value.reshape(-1)[0]) % rank
    shape = ctx.shape(x) or [None] * rank
    slice_shape = shape[:axis] + shape[axis + 1 :]
    made: list[onnx.NodeProto] = []
    if None not in slice_shape:
        zeros = ctx.add_const(np.zeros(slice_shape, _np_dtype(elem)), "zeros")
    else:
        whole = ctx.make_node("Shape", [x])
        others = [d for d in range(rank) if d != axis]
        kept = ctx.make_node("Gather", [whole.output[0], ctx.add_const(np.array(others), "axes")])
        filled = ctx.make_node(
            "ConstantOfShape", [kept.output[0]],
            value=numpy_helper.from_array(np.zeros(1, _np_dtype(elem))),
        )  # fmt: skip
        ctx.set_type(filled.output[0], elem, slice_shape)
        made += [whole, kept, filled]
        zeros = filled.output[0]
    running, piece = ctx.fresh("running_sum"), ctx.fresh(f"{x}_slice")
    total, emitted = ctx.fresh("running_sum_next"), ctx.fresh(f"{node.output[0]}_slice")
    exclusive = attribute(node, "exclusive", 0)
    body = helper.make_graph(
        [
            ctx.make_node("Add", [running, piece], [total]),
            ctx.make_node("Identity", [running if exclusive else total], [emitted]),
        ],
        ctx.fresh("cumsum_body"),
        [helper.make_tensor_value_info(n, elem, slice_shape) for n in (running, piece)],
        [helper.make_tensor_value_info(n, elem, slice_shape) for n in (total, emitted)],
    )
    reverse = attribute(node, "reverse", 0)
    scan = ctx.make_node(
        "Scan", [zeros, x], [ctx.fresh("running_sum_final"), node.output[0]], body=body,
        num_scan_inputs=1, scan_input_axes=[axis], scan_output_axes=[axis],
        scan_input_directions=[reverse], scan_output_directions=[reverse],
    )  # fmt: skip
    return [*made, scan]


@_adapts("Range", 11)
def _range_11(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """Range does not exist before opset 11. A Loop emits ``start + i * delta`` for
    ``i < ceil((limit - start) / delta)``, the definition of Range, computed in the type of its
    inputs; a negative count runs no iteration. For integers, the ceiling of the quotient is
    ``(limit - start + delta - sign(delta)) / delta`` with division truncating towards zero, which
    needs a constant ``delta``."""
    start, limit, delta = node.input
    elem = ctx.elem_type(start)
    if elem is None:
        raise ctx.refuse(node, boundary, "the type of its inputs is unknown")
    difference = ctx.make_node("Sub", [limit, start])
    made = [difference]
    if elem in _FLOATS:
        quotient = ctx.make_node("Div", [difference.output[0], delta])
        count = ctx.make_node("Ceil", [quotient.output[0]])
        made += [quotient, count]
    else:
        step = ctx.const(delta)
        if step is None:
            raise ctx.refuse(
                node, boundary, "counting the elements of an integer range needs the sign of "
                "delta, and its delta is computed at run time"
            )  # fmt: skip
        sign = ctx.add_const(np.sign(step).astype(step.dtype), "sign")
        widened = ctx.make_node("Add", [difference.output[0], delta])
        rounded = ctx.make_node("Sub", [widened.output[0], sign])
        count = ctx.make_node("Div", [rounded.output[0], delta])
        made += [widened, rounded, count]
    for m in made:
        ctx.set_type(m.output[0], elem, [])
    trip_count = ctx.make_node("Cast", [count.output[0]], to=TensorProto.INT64)
    ctx.set_type(trip_count.output[0], TensorProto.INT64, [])
    iteration, condition, carried = ctx.fresh("i"), ctx.fresh("condition"), ctx.fresh("unused")
    condition_out, carried_out = ctx.fresh("condition_out"), ctx.fresh("unused_out")
    index = ctx.make_node("Cast", [iteration], to=elem)
    scaled = ctx.make_node("Mul", [index.output[0], delta])
    value = ctx.make_node("Add", [start, scaled.output[0]])
    body = helper.make_graph(
        [
            ctx.make_node("Identity", [condition], [condition_out]),
            ctx.make_node("Identity", [carried], [carried_out]),
            index, scaled, value,
        ],
        ctx.fresh("range_body"),
        [
            helper.make_tensor_value_info(iteration, TensorProto.INT64, []),
            helper.make_tensor_value_info(condition, TensorProto.BOOL, []),
            helper.make_tensor_value_info(carried, TensorProto.INT64, []),
        ],
        [
            helper.make_tensor_value_info(condition_out, TensorProto.BOOL, []),
            helper.make_tensor_value_info(carried_out, TensorProto.INT64, []),
            helper.make_tensor_value_info(value.output[0], elem, []),
        ],
    )  # fmt: skip
    # Loop-1 needs a carried value: an unused one
    unused = ctx.add_const(np.int64(0), "unused")
    loop = ctx.make_node(
        "Loop", [trip_count.output[0], "", unused], [ctx.fresh("unused_final"), node.output[0]],
        body=body,
    )  # fmt: skip
    return [*made, trip_count, loop]


def _static_broadcast(ctx: Converter, names: Sequence[str]) -> list[int] | None:
    """The shape ``names`` broadcast to, where all their shapes are known; else None."""
    shapes = [ctx.shape(name) for name in names]
    if any(shape is None or None in shape for shape in shapes):
        return None
    return list(np.broadcast_shapes(*[tuple(shape) for shape in shapes]))


@_adapts(["Min", "Max"], 12)
def _min_max_12(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """Min-12 and Max-12 take integer types, which Min-8 and Max-8 lack (torch.onnx makes a
    ``Min`` of two int64 sizes from ``min(len(a), len(b))``). For integers, each further input
    is chosen where it is smaller (larger), with ``Less`` and ``Where``, which opset 9 has for
    every integer type and which selects exactly; float inputs keep the node."""
    elem = ctx.elem_type(node.input[0])
    if elem is None or elem in _FLOATS:
        return [copy_node(node)]
    compare = "Less" if node.op_type == "Min" else "Greater"
    made: list[onnx.NodeProto] = []
    result = node.input[0]
    for position, other in enumerate(node.input[1:], start=2):
        shape = _static_broadcast(ctx, [other, result])
        chosen = ctx.make_node(compare, [other, result])
        ctx.set_type(chosen.output[0], TensorProto.BOOL, shape)
        last = position == len(node.input)
        picked = ctx.make_node(
            "Where", [chosen.output[0], other, result], [node.output[0]] if last else None
        )
        ctx.set_type(picked.output[0], elem, shape)
        made += [chosen, picked]
        result = picked.output[0]
    if not made:
        made.append(ctx.make_node("Identity", [result], [node.output[0]]))
    return made


@_adapts("Clip", 12)
def _clip_12(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """Clip-12 takes integer types, which Clip-11 lacks (``x.long().clamp(0, 9)``). For integers
    it is ``Min(Max(x, min), max)``, which gives ``max`` where ``min > max`` as Clip does, each
    computed by comparing and selecting (``_min_max_12``); floats keep the node."""
    elem = ctx.elem_type(node.input[0])
    if elem is None or elem in _FLOATS:
        return [copy_node(node)]
    inputs = [*node.input, "", ""]
    made: list[onnx.NodeProto] = []
    current = node.input[0]
    bounds = [(op, bound) for op, bound in (("Max", inputs[1]), ("Min", inputs[2])) if bound]
    for position, (op, bound) in enumerate(bounds, start=1):
        last = position == len(bounds)
        step = ctx.make_node(op, [current, bound], [node.output[0]] if last else None)
        ctx.set_type(step.output[0], elem, _static_broadcast(ctx, [current, bound]))
        made += _min_max_12(step, ctx, 12)
        current = step.output[0]
    return made or [ctx.make_node("Identity", [current], [node.output[0]])]


_WIDE_INTEGERS = frozenset({TensorProto.INT64, TensorProto.UINT64})


@_adapts(["Less", "Greater"], 9)
def _compare_9(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """Less-9 and Greater-9 added integer types; Less-7 and Greater-7 compare floats only, and
    no float holds every int64 or uint64 (smaller integers are compared in double by the check
    of types at the target).

    Each 64-bit integer ``a`` is split, with opset 7's integer ``Div``, ``Mul`` and ``Sub``,
    into ``hi = a / 2**32`` and ``lo = a - hi * 2**32``: ``|hi| <= 2**31`` and ``|lo| < 2**32``,
    both exact in double, and ``a`` is ordered as the pair ``(hi, lo)`` is (with division
    rounding towards zero, ``lo`` has the sign of ``a``: the values of one ``hi`` are one
    interval, the intervals ordered as their ``hi``). In double, ``dh = hi_a - hi_b`` and
    ``dl = lo_a - lo_b`` are exact, and ``|dl| < 2**33``: ``dh * 2**34 + dl`` has the sign of
    ``dh`` where ``dh`` is not zero (rounding never crosses zero) and is ``dl`` exactly where it
    is, so comparing it with zero compares ``a`` and ``b`` exactly, for every value."""
    elem = ctx.elem_type(node.input[0])
    if elem not in _WIDE_INTEGERS:
        return [copy_node(node)]
    shape = _static_broadcast(ctx, list(node.input))
    made: list[onnx.NodeProto] = []

    def op(name: str, inputs: list[str], kind: int, of: Sequence[int | None] | None, **attrs):
        new = ctx.make_node(name, inputs, **attrs)
        ctx.set_type(new.output[0], kind, of)
        made.append(new)
        return new.output[0]

    base = ctx.add_const(np.array(2**32, _np_dtype(elem)), "two_pow_32")
    halves: list[tuple[str, str]] = []
    for value in node.input:
        of = ctx.shape(value)
        hi = op("Div", [value, base], elem, of)
        lo = op("Sub", [value, op("Mul", [hi, base], elem, of)], elem, of)
        halves.append(
            tuple(op("Cast", [v], TensorProto.DOUBLE, of, to=TensorProto.DOUBLE) for v in (hi, lo))
        )
    (hi_a, lo_a), (hi_b, lo_b) = halves
    dh = op("Sub", [hi_a, hi_b], TensorProto.DOUBLE, shape)
    dl = op("Sub", [lo_a, lo_b], TensorProto.DOUBLE, shape)
    scale = ctx.add_const(np.float64(2.0**34), "two_pow_34")
    key = op(
        "Add", [op("Mul", [dh, scale], TensorProto.DOUBLE, shape), dl], TensorProto.DOUBLE, shape
    )
    zero = ctx.add_const(np.float64(0.0), "zero")
    return [*made, ctx.make_node(node.op_type, [key, zero], [node.output[0]])]


# -- Loop and Scan --------------------------------------------------------------------------------


@_adapts("Loop", 11)
def _loop_11(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """Loop-11 allows a loop without carried values; Loop-1 needs at least one, so an unused
    one is added to the node and its body."""
    lowered = copy_node(node)
    if len(node.input) > 2:
        return [lowered]
    lowered.input.extend([""] * (2 - len(lowered.input)))
    lowered.input.append(ctx.add_const(np.int64(0), "unused"))
    body = next(a.g for a in lowered.attribute if a.name == "body")
    carried, carried_out = ctx.fresh("unused"), ctx.fresh("unused_out")
    scalar = helper.make_tensor_type_proto(TensorProto.INT64, [])
    body.input.append(helper.make_value_info(carried, scalar))
    body.node.append(ctx.make_node("Identity", [carried], [carried_out]))
    body.output.insert(1, helper.make_value_info(carried_out, scalar))
    outputs = list(lowered.output)
    del lowered.output[:]
    lowered.output.extend([ctx.fresh("unused_final"), *outputs])
    return [lowered]


@_adapts("Scan", 11)
def _scan_11(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """Scan-11 lets ``scan_input_axes`` and ``scan_output_axes`` count from the back; they are
    counted from the front. A scanned output has one axis more than the body's output."""
    lowered = copy_node(node)
    scanned = attribute(node, "num_scan_inputs")
    carried = len(node.input) - scanned
    input_axes = attribute(node, "scan_input_axes")
    if input_axes and any(a < 0 for a in input_axes):
        ranks = [ctx.require_rank(node, boundary, x) for x in node.input[carried:]]
        counted = [a + r if a < 0 else a for a, r in zip(input_axes, ranks, strict=True)]
        set_attribute(lowered, "scan_input_axes", counted)
    output_axes = attribute(node, "scan_output_axes")
    if output_axes and any(a < 0 for a in output_axes):
        body = attribute(node, "body")
        counted = []
        for axis, emitted in zip(output_axes, body.output[carried:], strict=True):
            if axis < 0:
                if not emitted.type.tensor_type.HasField("shape"):
                    raise ctx.refuse(node, boundary, f"the rank of '{emitted.name}' is unknown")
                axis += len(emitted.type.tensor_type.shape.dim) + 1
            counted.append(axis)
        set_attribute(lowered, "scan_output_axes", counted)
    return [lowered]


@_adapts("Scan", 9)
def _scan_9(node: onnx.NodeProto, ctx: Converter, boundary: int) -> list[onnx.NodeProto]:
    """Scan-8 has a leading batch axis on every carried value and sequence, scans sequences
    along axis 1, takes ``sequence_lens`` first, and has no scan axes nor output directions;
    Scan-9 has none of that. Every input gets a batch axis of 1 (after moving its scan axis to
    the front), every output loses it; an output that Scan-9 prepends is reversed by a second
    Scan-8 whose body passes each element through, as its input is scanned backwards. The body
    stays as it is."""
    scanned = attribute(node, "num_scan_inputs")
    carried = len(node.input) - scanned
    outputs = len(node.output) - carried
    input_axes = attribute(node, "scan_input_axes") or [0] * scanned
    output_axes = attribute(node, "scan_output_axes") or [0] * outputs
    output_directions = attribute(node, "scan_output_directions") or [0] * outputs
    before: list[onnx.NodeProto] = []
    after: list[onnx.NodeProto] = []
    inputs = [""]  # no sequence_lens: every sequence is scanned whole
    for i, x in enumerate(node.input):
        elem, shape = ctx.elem_type(x), ctx.shape(x)
        axis = input_axes[i - carried] if i >= carried else 0
        if axis:
            rank = ctx.require_rank(node, boundary, x)
            perm = [axis, *(d for d in range(rank) if d != axis)]
            moved = ctx.make_node("Transpose", [x], perm=perm)
            shape = [shape[p] for p in perm] if shape else None
            ctx.set_type(moved.output[0], elem, shape)
            before.append(moved)
            x = moved.output[0]
        batched = ctx.make_node("Unsqueeze", [x], axes=[0])
        ctx.set_type(batched.output[0], elem, [1, *shape] if shape is not None else None)
        before.append(batched)
        inputs.append(batched.output[0])
    results = []
    for j, y in enumerate(node.output):
        elem, shape = ctx.elem_type(y), ctx.shape(y)
        batched = ctx.fresh(f"{y}_batched")
        results.append(batched)
        if j < carried:
            ctx.set_type(batched, elem, [1, *shape] if shape is not None else None)
            after.append(ctx.make_node("Squeeze", [batched], [y], axes=[0]))
            continue
        axis = output_axes[j - carried]
        rank = len(shape) if shape is not None else None
        if axis and rank is None:
            raise ctx.refuse(node, boundary, f"the rank of its output '{y}' is unknown")
        perm = [axis, *(d for d in range(rank) if d != axis)] if rank is not None else []
        stacked = [shape[p] for p in perm] if shape is not None else None
        ctx.set_type(batched, elem, [1, *stacked] if stacked is not None else None)
        current = batched
        if output_directions[j - carried]:
            current = _reversed(ctx, node, boundary, batched, elem, stacked)
            after.append(current)
            current = current.output[0]
        unbatched = ctx.make_node("Squeeze", [current], [y] if not axis else None, axes=[0])
        ctx.set_type(unbatched.output[0], elem, stacked)
        after.append(unbatched)
        if axis:
            inverse = [perm.index(d) for d in range(rank)]
            after.append(ctx.make_node("Transpose", [unbatched.output[0]], [y], perm=inverse))
    scan = helper.make_node(
        "Scan", inputs, results, name=node.name, num_scan_inputs=scanned,
        body=attribute(node, "body"),
    )  # fmt: skip
    input_directions = attribute(node, "scan_input_directions")
    if input_directions and any(input_directions):
        scan.attribute.append(helper.make_attribute("directions", input_directions))
    return [*before, scan, *after]


def _reversed(
    ctx: Converter,
    node: onnx.NodeProto,
    boundary: int,
    stacked: str,
    elem: int | None,
    shape: list[int | None] | None,
) -> onnx.NodeProto:
    """A Scan-8 that returns the batched sequence ``stacked`` in reverse order."""
    if elem is None:
        raise ctx.refuse(node, boundary, f"the type of its output '{stacked}' is unknown")
    element, passed = ctx.fresh(f"{stacked}_element"), ctx.fresh(f"{stacked}_element_out")
    element_shape = shape[1:] if shape is not None else None
    body = helper.make_graph(
        [ctx.make_node("Identity", [element], [passed])],
        ctx.fresh("reverse_body"),
        [helper.make_tensor_value_info(element, elem, element_shape)],
        [helper.make_tensor_value_info(passed, elem, element_shape)],
    )
    reversed_ = ctx.make_node("Scan", ["", stacked], body=body, num_scan_inputs=1, directions=[1])
    ctx.set_type(reversed_.output[0], elem, [1, *shape] if shape is not None else None)
    return reversed_
