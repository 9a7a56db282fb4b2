"""Adapters for comparisons and selections: Equal of floats, Min, Max and Clip of integers, and
Less and Greater of 64-bit integers, computed exactly with what older opsets have.

Each adapter is registered for ``("", op, b)`` and returns nodes valid at opset ``b - 1`` (see
``_adapters_attributes``); each docstring quotes the change of the specification it undoes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from torchscan.onnx._convert._context import FLOATS, Context, np_dtype, type_name
from torchscan.onnx._convert._registry import register

_BOOL, _DOUBLE = ir.DataType.BOOL, ir.DataType.DOUBLE


@register("", "Equal", 11)
def _equal_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """Equal-11 added floating-point types. Below, a == b is computed as not (a < b or a > b or
    a is NaN or b is NaN), which is exact for every value; IsNaN exists from opset 9 on. Other
    types are left to the check of types at the target."""
    elem = ctx.elem_type(node.inputs[0])
    if elem is None:
        raise ctx.refuse(node, boundary, "the type of its inputs is unknown")
    if elem not in FLOATS:
        return [node]
    if ctx.target < 9:
        raise ctx.refuse(
            node, boundary, f"comparing {type_name(elem)} values exactly needs IsNaN, which "
            "exists from opset 9 on"
        )  # fmt: skip
    a, b = node.inputs[0], node.inputs[1]
    less, greater = ctx.make_node("Less", [a, b]), ctx.make_node("Greater", [a, b])
    ordered = ctx.make_node("Or", [less.outputs[0], greater.outputs[0]])
    a_nan, b_nan = ctx.make_node("IsNaN", [a]), ctx.make_node("IsNaN", [b])
    nan = ctx.make_node("Or", [a_nan.outputs[0], b_nan.outputs[0]])
    unequal = ctx.make_node("Or", [ordered.outputs[0], nan.outputs[0]])
    equal = ctx.make_node("Not", [unequal.outputs[0]], [node.outputs[0]])
    made = [less, greater, ordered, a_nan, b_nan, nan, unequal]
    for m in made:
        ctx.set_type(m.outputs[0], _BOOL, None)
    return [*made, equal]


def _static_broadcast(ctx: Context, values: Sequence[ir.Value]) -> list[int] | None:
    """The shape ``values`` broadcast to, where all their shapes are known; else None."""
    shapes = [ctx.shape(value) for value in values]
    if any(shape is None or None in shape for shape in shapes):
        return None
    return list(np.broadcast_shapes(*[tuple(shape) for shape in shapes]))


def _select_extreme(
    ctx: Context,
    compare: str,
    inputs: Sequence[ir.Value],
    elem: ir.DataType,
    output: ir.Value | None,
) -> tuple[list[ir.Node], ir.Value]:
    """The nodes choosing, element by element, the smallest (``compare="Less"``) or largest
    (``"Greater"``) of ``inputs``, and their result, which replaces ``output`` where given."""
    made: list[ir.Node] = []
    result = inputs[0]
    for position, other in enumerate(inputs[1:], start=2):
        shape = _static_broadcast(ctx, [other, result])
        chosen = ctx.make_node(compare, [other, result])
        ctx.set_type(chosen.outputs[0], _BOOL, shape)
        last = position == len(inputs) and output is not None
        picked = ctx.make_node(
            "Where", [chosen.outputs[0], other, result], [output] if last else None
        )
        if not last:
            ctx.set_type(picked.outputs[0], elem, shape)
        made += [chosen, picked]
        result = picked.outputs[0]
    if not made:
        identity = ctx.make_node("Identity", [result], [output] if output is not None else None)
        made.append(identity)
        result = identity.outputs[0]
    return made, result


@register("", ["Min", "Max"], 12)
def _min_max_12(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """Min-12 and Max-12 take integer types, which Min-8 and Max-8 lack (torch.onnx makes a
    ``Min`` of two int64 sizes from ``min(len(a), len(b))``). For integers, each further input
    is chosen where it is smaller (larger), with ``Less`` and ``Where``, which opset 9 has for
    every integer type and which selects exactly; float inputs keep the node."""
    elem = ctx.elem_type(node.inputs[0])
    if elem is None or elem in FLOATS:
        return [node]
    compare = "Less" if node.op_type == "Min" else "Greater"
    made, _ = _select_extreme(ctx, compare, list(node.inputs), elem, node.outputs[0])
    return made


@register("", "Clip", 12)
def _clip_12(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """Clip-12 takes integer types, which Clip-11 lacks (``x.long().clamp(0, 9)``). For integers
    it is ``Min(Max(x, min), max)``, which gives ``max`` where ``min > max`` as Clip does, each
    computed by comparing and selecting (``_min_max_12``); floats keep the node."""
    elem = ctx.elem_type(node.inputs[0])
    if elem is None or elem in FLOATS:
        return [node]
    inputs = [*node.inputs, None, None]
    made: list[ir.Node] = []
    current = node.inputs[0]
    bounds = [
        (op, bound)
        for op, bound in (("Greater", inputs[1]), ("Less", inputs[2]))
        if bound is not None
    ]
    for position, (compare, bound) in enumerate(bounds, start=1):
        last = position == len(bounds)
        nodes, current = _select_extreme(
            ctx, compare, [current, bound], elem, node.outputs[0] if last else None
        )
        made += nodes
    return made or [ctx.make_node("Identity", [current], [node.outputs[0]])]


_WIDE_INTEGERS = frozenset({ir.DataType.INT64, ir.DataType.UINT64})


@register("", ["Less", "Greater"], 9)
def _compare_9(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
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
    elem = ctx.elem_type(node.inputs[0])
    if elem not in _WIDE_INTEGERS:
        return [node]
    shape = _static_broadcast(ctx, list(node.inputs))
    made: list[ir.Node] = []

    def op(name: str, inputs: list[ir.Value], kind: ir.DataType, of, **attrs) -> ir.Value:
        new = ctx.make_node(name, inputs, **attrs)
        ctx.set_type(new.outputs[0], kind, of)
        made.append(new)
        return new.outputs[0]

    base = ctx.add_const(np.array(2**32, np_dtype(elem)), "two_pow_32")
    halves: list[tuple[ir.Value, ir.Value]] = []
    for value in node.inputs:
        of = ctx.shape(value)
        hi = op("Div", [value, base], elem, of)
        lo = op("Sub", [value, op("Mul", [hi, base], elem, of)], elem, of)
        halves.append(tuple(op("Cast", [v], _DOUBLE, of, to=_DOUBLE) for v in (hi, lo)))
    (hi_a, lo_a), (hi_b, lo_b) = halves
    dh = op("Sub", [hi_a, hi_b], _DOUBLE, shape)
    dl = op("Sub", [lo_a, lo_b], _DOUBLE, shape)
    scale = ctx.add_const(np.float64(2.0**34), "two_pow_34")
    key = op("Add", [op("Mul", [dh, scale], _DOUBLE, shape), dl], _DOUBLE, shape)
    zero = ctx.add_const(np.float64(0.0), "zero")
    return [*made, ctx.make_node(node.op_type, [key, zero], [node.outputs[0]])]
