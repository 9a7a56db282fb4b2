"""Adapters for attributes and inputs: onnx's own adapters where they are exact, attributes added
with a default that keeps the older behaviour, inputs that were attributes, and attributes and
inputs whose meaning changed.

An adapter registered for ``("", op, b)`` receives a node valid at opset ``b`` (where the
operator's version ``b`` starts) and returns nodes valid at opset ``b - 1`` that compute the same
outputs for every input the node accepts; the converter moves them further down. Where opset
``b - 1`` cannot express the node, the adapter raises the context's refusal, saying what is
missing. Each docstring quotes the change of the specification it undoes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from torchscan.onnx._convert._adapters_gather import pad_by_concat
from torchscan.onnx._convert._context import (
    FLOATS,
    VALUE_PRESERVING,
    Context,
    as_tensor,
    attribute,
    clear_attributes,
    constant_of_node,
    exactly,
    is_present,
    np_dtype,
    present_inputs,
    remove_attribute,
    set_attribute,
    truncate_inputs,
    type_name,
)
from torchscan.onnx._convert._registry import register, registry

REDUCE_18 = [
    "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
    "ReduceMin", "ReduceProd", "ReduceSumSquare",
]  # fmt: skip


# -- onnx's own adapters --------------------------------------------------------------------------


@register("", ["ArgMax", "ArgMin"], 12)
@register("", ["GRU", "LSTM", "RNN"], 14)
@register("", "Resize", 18)
@register("", "BatchNormalization", 9)
def _onnx_adapter(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """onnx's C++ adapter, where it is exact: it drops an attribute the older version lacks when
    the attribute has the value that means the older behaviour (``select_last_index=0``,
    ``layout=0``, Resize's ``antialias=0`` and no ``axes``),
    and refuses any other value; BatchNormalization-9 dropped ``spatial``, whose default
    BatchNormalization-7 keeps."""
    return ctx.run_onnx_adapter(node, boundary)


@register("", "Upsample", 9)
def _upsample_9(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
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


def _drop_added_attributes(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """An attribute added at ``boundary`` (pooling ``ceil_mode`` and ``dilations``, DepthToSpace's
    ``mode``, GatherND's ``batch_dims``, BatchNormalization's ``training_mode``) is dropped where
    it has the value that means the older behaviour, and refused otherwise."""
    added = _ADDED_ATTRIBUTES[(node.op_type, boundary)]
    for name, neutral in added.items():
        value = attribute(node, name)
        values = value if isinstance(value, list) else [value]
        if value is not None and any(v != neutral for v in values):
            raise ctx.refuse(
                node, boundary, f"{name}={value} has no equivalent before opset {boundary}"
            )
    for name in added:
        remove_attribute(node, name)
    return [node]


for _op, _boundary in _ADDED_ATTRIBUTES:
    registry.add("", _op, _boundary, _drop_added_attributes)


@register("", "BatchNormalization", 15)
def _batchnorm_15(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """BatchNormalization-15 lets scale and bias, and mean and variance, have types of their
    own; BatchNormalization-14 wants scale and bias of the input's type. Nothing else changed:
    the node stays, and the converter checks its types at the target."""
    return [node]


# -- inputs that were attributes ------------------------------------------------------------------


@register("", REDUCE_18, 18)
@register("", "ReduceSum", 13)
def _reduce_axes_input(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """ReduceSum-13 and the other reductions' version 18 take ``axes`` as an input, where "an
    empty axes" reduces over all axes, or with ``noop_with_empty_axes=1`` returns the input
    unchanged. Their older versions take an ``axes`` attribute, whose absence reduces over all
    axes."""
    given = len(present_inputs(node)) > 1
    axes = ctx.require_const(node, boundary, 1, "axes") if given else np.zeros(0, np.int64)
    if axes.size == 0 and attribute(node, "noop_with_empty_axes", 0):
        return [ctx.make_node("Identity", [node.inputs[0]], [node.outputs[0]])]
    remove_attribute(node, "noop_with_empty_axes")
    truncate_inputs(node, 1)
    if axes.size:
        set_attribute(node, "axes", [int(a) for a in axes.reshape(-1)])
    return [node]


@register("", ["Squeeze", "Unsqueeze"], 13)
def _axes_input(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """Squeeze-13 and Unsqueeze-13 take ``axes`` as an input; their version 11 as an
    attribute."""
    return _optional_input_as_attribute(node, ctx, boundary, "axes")


@register("", "Split", 13)
def _split_13(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """Split-13 takes the lengths of its parts as the input ``split``; Split-11 as an
    attribute."""
    return _optional_input_as_attribute(node, ctx, boundary, "split")


def _optional_input_as_attribute(
    node: ir.Node, ctx: Context, boundary: int, name: str
) -> list[ir.Node]:
    """``node`` with its optional second input ``name``, a constant, moved to the attribute of
    that name (left out where the input is)."""
    values = None
    if len(present_inputs(node)) > 1:
        values = ctx.require_const(node, boundary, 1, name)
    truncate_inputs(node, 1)
    if values is not None:
        set_attribute(node, name, [int(v) for v in values.reshape(-1)])
    return [node]


@register("", "TopK", 10)
def _topk_10(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """TopK-10 takes ``K`` as an input; TopK-1 as the attribute ``k``."""
    k = ctx.require_const(node, boundary, 1, "K")
    truncate_inputs(node, 1)
    set_attribute(node, "k", int(k.reshape(-1)[0]))
    return [node]


@register("", "Pad", 11)
def _pad_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """Pad-11 takes ``pads`` and ``constant_value`` as inputs, and data of every type; Pad-2
    takes the attributes ``pads`` and ``value``, a float, and floating-point data only. In
    constant mode, data of another type (``F.pad`` of int64 labels), or a value that is not
    exactly a float or is computed at run time, is padded by concatenating blocks of the value
    instead (``_adapters_gather.pad_by_concat``)."""
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


# -- attributes and inputs whose meaning changed --------------------------------------------------


@register("", "Split", 18)
def _split_18(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """Split-18's ``num_outputs`` splits into parts of equal length where the axis allows, "the
    last chunk will be smaller" otherwise; Split-13 without ``split`` only splits evenly, so
    uneven lengths are given as a constant ``split``, which needs the length of the axis."""
    count = attribute(node, "num_outputs")
    remove_attribute(node, "num_outputs")
    if count is None:
        return [node]
    rank = ctx.require_rank(node, boundary, node.inputs[0])
    axis = attribute(node, "axis", 0) % rank
    length = (ctx.shape(node.inputs[0]) or [None] * rank)[axis]
    if length is None:
        raise ctx.refuse(
            node, boundary, f"num_outputs={count} makes parts whose lengths depend on the length "
            f"of axis {axis}, which is not known before run time"
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


@register("", "Pad", 18)
def _pad_18(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """Pad-18 can pad the ``axes`` given only; Pad-13 takes ``pads`` for every axis, which are
    0 for the axes not given."""
    if len(present_inputs(node)) < 4:
        truncate_inputs(node, 3)
        return [node]
    axes = ctx.require_const(node, boundary, 3, "axes").reshape(-1)
    pads = ctx.require_const(node, boundary, 1, "pads").reshape(-1)
    rank = ctx.require_rank(node, boundary, node.inputs[0])
    full = np.zeros(2 * rank, np.int64)
    for i, axis in enumerate(axes):
        full[axis % rank] = pads[i]
        full[axis % rank + rank] = pads[i + len(axes)]
    truncate_inputs(node, 3)
    node.replace_input_with(1, ctx.add_const(full, "pads"))
    return [node]


@register("", "TopK", 11)
def _topk_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """TopK-11 added ``largest`` and ``sorted``; TopK-10 returns the largest values, sorted.
    ``sorted=0`` leaves the order open, so a sorted result is one of the allowed ones.
    ``largest=0`` is the largest values of the negated input, negated back, which keeps "the
    lower index first" among equal values; negation is exact for floating-point types only."""
    largest = attribute(node, "largest", 1)
    remove_attribute(node, "largest")
    remove_attribute(node, "sorted")
    if largest:
        return [node]
    x, values = node.inputs[0], node.outputs[0]
    elem = ctx.elem_type(x)
    if elem not in FLOATS:
        kind = type_name(elem) if elem else "unknown"
        raise ctx.refuse(
            node, boundary, f"largest=0 is computed on the negated input, which is exact for "
            f"floating-point types only, and the input is of type {kind}"
        )  # fmt: skip
    negated = ctx.make_node("Neg", [x])
    negated.outputs[0].name = ctx.fresh(f"{x.name}_negated")
    ctx.set_type(negated.outputs[0], elem, ctx.shape(x))
    node.replace_input_with(0, negated.outputs[0])
    shape = ctx.shape(values)
    negated_back = ctx.make_node("Neg", [values], [values])
    values.name = ctx.fresh("values_negated")
    ctx.set_type(values, elem, shape)
    return [negated, node, negated_back]


@register("", ["Softmax", "LogSoftmax", "Hardmax"], 13)
def _softmax_13(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """Softmax-13 (and LogSoftmax, Hardmax) normalizes along the one ``axis``; version 11
    "coerced to 2D" at ``axis`` and normalized over all axes from it to the last. The two agree
    where the axis is the last one, so another axis is swapped with the last by Transposes."""
    x, y = node.inputs[0], node.outputs[0]
    rank = ctx.require_rank(node, boundary, x)
    axis = attribute(node, "axis", -1) % rank
    set_attribute(node, "axis", rank - 1)
    if axis == rank - 1:
        return [node]
    perm = list(range(rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    shape = ctx.shape(x)
    swapped = [shape[p] for p in perm] if shape else None
    elem = ctx.elem_type(x)
    before = ctx.make_node("Transpose", [x], perm=perm)
    before.outputs[0].name = ctx.fresh(f"{x.name}_swapped")
    ctx.set_type(before.outputs[0], elem, swapped)
    node.replace_input_with(0, before.outputs[0])
    after = ctx.make_node("Transpose", [y], [y], perm=perm)
    y.name = ctx.fresh(f"{y.name}_swapped")
    ctx.set_type(y, elem, swapped)
    return [before, node, after]


@register("", "Reshape", 14)
def _reshape_14(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """Reshape-14 added ``allowzero``: with allowzero=1 a 0 in the shape is a dimension of
    length 0, where Reshape-13 copies the input's dimension. Dropping it is exact where the shape
    holds no 0, or where the input is not empty: then a 0 would make an empty output from a
    non-empty input, which is an error of the model in the first place."""
    allowzero = attribute(node, "allowzero", 0)
    remove_attribute(node, "allowzero")
    if not allowzero:
        return [node]
    data_shape = ctx.shape(node.inputs[0])
    if data_shape is not None and all(d for d in data_shape):
        return [node]
    if _holds_no_zero(ctx, node.inputs[1]):
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


@register("", "Shape", 15)
def _shape_15(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
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
    cut = ctx.make_node("Slice", [output, starts, ends], [output])
    output.name = ctx.fresh(f"{output.name}_whole")
    ctx.set_type(output, ir.DataType.INT64, [ctx.rank(node.inputs[0])])
    return [node, cut]


@register("", "Pow", 12)
def _pow_12(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """Pow-12 lets the exponent have a type of its own; Pow-7 wants the base's type. The
    exponent is converted where that keeps every value: a constant whose values all survive, or
    a type that the base's type holds exactly."""
    base, exponent = node.inputs[0], node.inputs[1]
    base_type, exponent_type = ctx.elem_type(base), ctx.elem_type(exponent)
    if base_type is None or exponent_type is None:
        raise ctx.refuse(node, boundary, "the types of its inputs are unknown")
    if base_type == exponent_type:
        return [node]
    value = ctx.const(exponent)
    if value is not None:
        converted = exactly(value, np_dtype(base_type))
        if converted is not None:
            node.replace_input_with(1, ctx.add_const(converted, "exponent"))
            return [node]
    elif type_name(base_type) in VALUE_PRESERVING.get(type_name(exponent_type), []):
        cast = ctx.make_node("Cast", [exponent], to=base_type)
        cast.outputs[0].name = ctx.fresh(f"{exponent.name}_cast")
        ctx.set_type(cast.outputs[0], base_type, ctx.shape(exponent))
        node.replace_input_with(1, cast.outputs[0])
        return [cast, node]
    raise ctx.refuse(
        node, boundary, f"Pow-7 wants the exponent of the base's type, {type_name(base_type)}, "
        f"and its exponent, of type {type_name(exponent_type)}, does not convert to it exactly"
    )  # fmt: skip


@register("", "Gemm", 11)
def _gemm_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """Gemm-11 made ``C`` optional; Gemm-9 requires it. A zero C adds nothing, if it is the zero
    whose sign keeps that of A*B: beta * C must be -0.0, as -0.0 + x is x for every x."""
    if len(present_inputs(node)) >= 3:
        return [node]
    elem = ctx.elem_type(node.inputs[0])
    if elem is None:
        raise ctx.refuse(node, boundary, "the type of its inputs is unknown")
    zero = -0.0 if attribute(node, "beta", 1.0) >= 0 else 0.0
    node.resize_inputs(3)
    node.replace_input_with(2, ctx.add_const(np.array(zero, np_dtype(elem)), "C"))
    return [node]


def _dense_constant(node: ir.Node, value: np.ndarray) -> list[ir.Node]:
    """``node``, a Constant, holding ``value`` as a ``value`` tensor."""
    clear_attributes(node)
    node.attributes["value"] = ir.AttrTensor("value", as_tensor(value))
    return [node]


@register("", "Constant", 12)
def _constant_12(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """Constant-12 added ``value_float``, ``value_ints`` and the other typed attributes;
    Constant-11 holds a ``value`` tensor."""
    if attribute(node, "value") is not None or attribute(node, "sparse_value") is not None:
        return [node]
    return _dense_constant(node, constant_of_node(node))


@register("", "Constant", 11)
def _constant_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """Constant-11 added ``sparse_value``; Constant-9 holds the same values as a dense
    ``value``."""
    if attribute(node, "sparse_value") is None:
        return [node]
    return _dense_constant(node, constant_of_node(node))


@register("", "CastLike", 15)
def _castlike_15(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """CastLike does not exist before opset 15; it is the Cast to the type of its second
    input."""
    elem = ctx.elem_type(node.inputs[1])
    if elem is None:
        raise ctx.refuse(node, boundary, "the type of its input 'target_type' is unknown")
    node.op_type = "Cast"
    truncate_inputs(node, 1)
    clear_attributes(node)
    set_attribute(node, "to", int(elem))
    return [node]


@register("", "Dropout", 12)
def _dropout_12(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """Dropout-12 takes ``training_mode`` as an input; out of training mode it returns its
    input, which is an Identity at every opset."""
    inputs = present_inputs(node)
    training = ctx.require_const(node, boundary, 2, "training_mode") if len(inputs) > 2 else 0
    if np.any(training):
        raise ctx.refuse(node, boundary, "training mode draws a random mask")
    if len(node.outputs) > 1 and is_present(node.outputs[1]):
        raise ctx.refuse(node, boundary, "its mask output is used")
    return [ctx.make_node("Identity", [node.inputs[0]], [node.outputs[0]])]


@register("", "Resize", 13)
def _resize_13(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """Resize-13 made ``roi`` and ``scales`` optional; Resize-11 takes them always, where an
    empty tensor means not given."""
    if len(node.inputs) < 3:
        node.resize_inputs(3)
    for index, name in ((1, "roi"), (2, "scales")):
        if node.inputs[index] is None:
            node.replace_input_with(index, ctx.add_const(np.zeros(0, np.float32), name))
    return [node]


@register("", "Resize", 11)
def _resize_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
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
    inputs = [*present_inputs(node), None, None, None]
    scales = ctx.const(inputs[2]) if inputs[2] is not None else None
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
    truncate_inputs(node, 1)
    node.resize_inputs(2)
    node.replace_input_with(1, ctx.add_const(scales.astype(np.float32), "scales"))
    clear_attributes(node)
    set_attribute(node, "mode", mode)
    return [node]


def _scales_of_sizes(ctx: Context, node: ir.Node, sizes: ir.Value | None) -> np.ndarray | None:
    value = ctx.const(sizes)
    shape = ctx.shape(node.inputs[0])
    if value is None or shape is None or None in shape or 0 in shape:
        return None
    lengths = np.array(shape, np.int64)
    if (value % lengths).any():
        return None
    return (value // lengths).astype(np.float32)


@register("", "Resize", 10)
def _resize_10(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """Resize does not exist before opset 10; Upsample-9 has the same inputs, attribute and
    meaning."""
    node.op_type = "Upsample"
    return [node]
