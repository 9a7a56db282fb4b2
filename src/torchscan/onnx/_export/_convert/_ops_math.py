"""Adapters for arithmetic, comparisons and selections: Equal, Less and Greater, IsInf, Min, Max
and Clip, Mod, Pow, Gemm and Trilu, computed exactly with what older opsets have.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from torchscan.onnx._export._convert._blocks import arange, lengths_of
from torchscan.onnx._export._convert._context import (
    FLOATS,
    VALUE_PRESERVING,
    Builder,
    Context,
    attribute,
    clear_attributes,
    exactly,
    given,
    np_dtype,
    present_inputs,
    required,
    set_attribute,
    static_shape,
    truncate_inputs,
    type_name,
)
from torchscan.onnx._export._convert._registry import adapters

_BOOL, _DOUBLE, _INT64 = ir.DataType.BOOL, ir.DataType.DOUBLE, ir.DataType.INT64


@adapters("Equal")
class Equal:
    """Equal: floating-point types at opset 11."""

    @staticmethod
    def below_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """Equal-11 added floating-point types. Below, a == b is computed as not (a < b or a > b or
        a is NaN or b is NaN), which is exact for every value; IsNaN exists from opset 9 on. Other
        types are left to the check of types at the target."""
        elem = ctx.elem_type(node.inputs[0])
        if elem is None:
            raise ctx.refuse(node, boundary, "the type of its inputs is unknown")
        if elem not in FLOATS:
            return [node]
        if ctx.target_opset < 9:
            raise ctx.refuse(
                node, boundary, f"comparing {type_name(elem)} values exactly needs IsNaN, which "
                "exists from opset 9 on"
            )  # fmt: skip
        a, b = node.inputs[0], node.inputs[1]
        build = Builder(ctx)
        less, greater = build.op("Less", [a, b], _BOOL), build.op("Greater", [a, b], _BOOL)
        ordered = build.op("Or", [less, greater], _BOOL)
        a_nan, b_nan = build.op("IsNaN", [a], _BOOL), build.op("IsNaN", [b], _BOOL)
        nan = build.op("Or", [a_nan, b_nan], _BOOL)
        unequal = build.op("Or", [ordered, nan], _BOOL)
        build.op("Not", [unequal], None, output=node.outputs[0])
        return build.nodes


_WIDE_INTEGERS = frozenset({ir.DataType.INT64, ir.DataType.UINT64})


@adapters("Less", "Greater")
class LessGreater:
    """Less and Greater: integer types at opset 9."""

    @staticmethod
    def below_9(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
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
        if elem is None or elem not in _WIDE_INTEGERS:
            return [node]
        shape = _static_broadcast(ctx, list(node.inputs))
        build = Builder(ctx)
        base = ctx.add_const(np.array(2**32, np_dtype(elem)), "two_pow_32")
        halves: list[tuple[ir.Value, ...]] = []
        for value in node.inputs:
            of = ctx.shape(value)
            hi = build.op("Div", [value, base], elem, of)
            lo = build.op("Sub", [value, build.op("Mul", [hi, base], elem, of)], elem, of)
            halves.append(tuple(build.op("Cast", [v], _DOUBLE, of, to=_DOUBLE) for v in (hi, lo)))
        (hi_a, lo_a), (hi_b, lo_b) = halves
        dh = build.op("Sub", [hi_a, hi_b], _DOUBLE, shape)
        dl = build.op("Sub", [lo_a, lo_b], _DOUBLE, shape)
        scale = ctx.add_const(np.float64(2.0**34), "two_pow_34")
        key = build.op("Add", [build.op("Mul", [dh, scale], _DOUBLE, shape), dl], _DOUBLE, shape)
        zero = ctx.add_const(np.float64(0.0), "zero")
        build.op(node.op_type, [key, zero], None, output=node.outputs[0])
        return build.nodes


@adapters("IsInf")
class IsInf:
    """IsInf, which opset 10 introduced."""

    @staticmethod
    def below_10(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """IsInf does not exist before opset 10. Below, ``x`` is +inf exactly where it is greater
        than the largest finite value of its type, and -inf where it is less than the lowest (NaN is
        neither); Less and Greater take floats at every opset."""
        elem = ctx.elem_type(node.inputs[0])
        if elem is None or elem not in FLOATS or elem == ir.DataType.BFLOAT16:
            kind = type_name(elem) if elem is not None else "unknown"
            raise ctx.refuse(node, boundary, f"the type of its input is {kind}")
        x, shape = node.inputs[0], ctx.shape(node.inputs[0])
        finfo = np.finfo(np_dtype(elem))
        positive = attribute(node, "detect_positive", 1)
        negative = attribute(node, "detect_negative", 1)
        build = Builder(ctx)
        found = []
        if positive:
            largest = build.const(np.array(finfo.max, dtype=np_dtype(elem)), "largest")
            found.append(build.op("Greater", [x, largest], _BOOL, shape))
        if negative:
            lowest = build.const(np.array(finfo.min, dtype=np_dtype(elem)), "lowest")
            found.append(build.op("Less", [x, lowest], _BOOL, shape))
        if len(found) == 2:
            build.op("Or", found, _BOOL, output=node.outputs[0])
        elif found:
            build.op("Identity", found, _BOOL, output=node.outputs[0])
        else:  # neither: false everywhere, x > x for every x, NaN included
            build.op("Greater", [x, x], _BOOL, output=node.outputs[0])
        return build.nodes


def _static_broadcast(ctx: Context, values: Sequence[ir.Value | None]) -> list[int] | None:
    """The shape ``values`` broadcast to, where all their shapes are known; else None."""
    shapes = [static_shape(ctx.shape(value)) for value in values]
    known = [shape for shape in shapes if shape is not None]
    if len(known) != len(shapes):
        return None
    return list(np.broadcast_shapes(*[tuple(shape) for shape in known]))


def _select_extreme(
    b: Builder,
    compare: str,
    inputs: Sequence[ir.Value],
    elem: ir.DataType,
    output: ir.Value | None,
) -> ir.Value:
    """The smallest (``compare="Less"``) or largest (``"Greater"``) of ``inputs``, chosen
    element by element, which replaces ``output`` where given."""
    result = inputs[0]
    for position, other in enumerate(inputs[1:], start=2):
        shape = _static_broadcast(b.ctx, [other, result])
        chosen = b.op(compare, [other, result], _BOOL, shape)
        last = position == len(inputs) and output is not None
        result = b.op(
            "Where", [chosen, other, result], elem, shape, output=output if last else None
        )
    if len(inputs) < 2:
        result = b.op("Identity", [result], None, output=output)
    return result


@adapters("Min", "Max")
class MinMax:
    """Min and Max: integer types at opset 12."""

    @staticmethod
    def below_12(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """Min-12 and Max-12 take integer types, which Min-8 and Max-8 lack (torch.onnx makes a
        ``Min`` of two int64 sizes from ``min(len(a), len(b))``). For integers, each further input
        is chosen where it is smaller (larger), with ``Less`` and ``Where``, which opset 9 has for
        every integer type and which selects exactly; float inputs keep the node."""
        elem = ctx.elem_type(node.inputs[0])
        if elem is None or elem in FLOATS:
            return [node]
        compare = "Less" if node.op_type == "Min" else "Greater"
        b = Builder(ctx)
        inputs = [required(node, i) for i in range(len(node.inputs))]
        _select_extreme(b, compare, inputs, elem, node.outputs[0])
        return b.nodes


@adapters("Clip")
class Clip:
    """Clip: ``min`` and ``max`` inputs at opset 11, integer types at opset 12."""

    @staticmethod
    def below_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """Clip-11 takes ``min`` and ``max`` as inputs, an absent one meaning no bound; Clip-6 takes
        float attributes whose defaults are the largest finite floats, which would clip infinities,
        so an absent bound becomes an infinite one. (Integer Clips were rewritten at opset 12.)"""
        bounds = {}
        for index, name, unbounded in ((1, "min", -np.inf), (2, "max", np.inf)):
            if index < len(node.inputs) and node.inputs[index] is not None:
                value = ctx.require_const(node, boundary, index, name).reshape(-1)
                as_float = exactly(value, np.dtype(np.float32))
                if as_float is None:
                    raise ctx.refuse(
                        node, boundary, f"its {name} {value[0]} is not exactly a float, the type "
                        f"of Clip-6's {name} attribute"
                    )  # fmt: skip
                bounds[name] = float(as_float[0])
            else:
                bounds[name] = unbounded
        truncate_inputs(node, 1)
        clear_attributes(node)
        for name, bound in bounds.items():
            set_attribute(node, name, bound)
        return [node]

    @staticmethod
    def below_12(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """Clip-12 takes integer types, which Clip-11 lacks (``x.long().clamp(0, 9)``). For integers
        it is ``Min(Max(x, min), max)``, which gives ``max`` where ``min > max`` as Clip does, each
        computed by comparing and selecting (``MinMax``). float keeps the node; double and
        float16, which Clip-11 and Clip-6 allow but onnxruntime implements for float only, are
        clipped by comparing and selecting too (a NaN compares false and stays NaN, as in Clip)."""
        elem = ctx.elem_type(node.inputs[0])
        if elem is None or elem == ir.DataType.FLOAT:
            return [node]
        inputs = [*node.inputs, None, None]
        b = Builder(ctx)
        current = required(node, 0)
        bounds = [
            (op, bound)
            for op, bound in (("Greater", inputs[1]), ("Less", inputs[2]))
            if bound is not None
        ]
        for position, (compare, bound) in enumerate(bounds, start=1):
            last = position == len(bounds)
            current = _select_extreme(
                b, compare, [current, bound], elem, node.outputs[0] if last else None
            )
        if not b.nodes:
            b.op("Identity", [current], None, output=node.outputs[0])
        return b.nodes


_SIGNED = frozenset({ir.DataType.INT8, ir.DataType.INT16, ir.DataType.INT32, ir.DataType.INT64})
_UNSIGNED = frozenset(
    {ir.DataType.UINT8, ir.DataType.UINT16, ir.DataType.UINT32, ir.DataType.UINT64}
)

_INTEGERS = _SIGNED | _UNSIGNED

# For each floating-point type that a double holds with room to spare: a bound B with
# |a / b| < 2**B for all finite a and non-zero b of the type (the largest finite value over the
# smallest subnormal one).
_QUOTIENT_BITS = {ir.DataType.FLOAT16: 40, ir.DataType.FLOAT: 277}
_STEP_BITS = 28  # the bits of the quotient taken at each step of the float remainder


@adapters("Mod")
class Mod:
    """Mod, which opset 10 introduced."""

    @staticmethod
    def below_10(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """Mod does not exist before opset 10. For integers, ``fmod=1`` is C's ``%``, whose result
        has the sign of the dividend, and ``fmod=0`` Python's ``%``, with the sign of the divisor.
        Both are computed from the quotient truncated towards zero, which is integer ``Div``:
        ``r = a - (a / b) * b``, exact for every value as integer arithmetic wraps around; for
        ``fmod=0``, ``b`` is added where ``r`` is not zero and its sign differs from ``b``'s (the
        signs compared as the sign of ``r * b`` in double, which is exact).

        Floating-point inputs (``fmod=1``, which Mod-10 requires for them: ``torch.fmod``) are
        computed exactly in double, see ``_float_fmod``; double inputs have no wider type and are
        refused."""
        a, b = required(node, 0), required(node, 1)
        elem = ctx.elem_type(a)
        if elem is None:
            raise ctx.refuse(node, boundary, "the type of its inputs is unknown")
        fmod = attribute(node, "fmod", 0)
        nodes = Builder(ctx)
        shape = _static_broadcast(ctx, [a, b])
        if elem not in _INTEGERS:
            if not fmod:
                raise ctx.refuse(
                    node, boundary, f"fmod=0 is not defined for {type_name(elem)} inputs at Mod-10"
                )  # fmt: skip
            if elem == ir.DataType.DOUBLE:
                raise ctx.refuse(
                    node, boundary, "the remainder of double values is computed exactly in a wider "
                    "type, and none holds every double"
                )  # fmt: skip
            if elem not in _QUOTIENT_BITS:
                raise ctx.refuse(
                    node, boundary, f"the remainder of {type_name(elem)} values is computed "
                    "exactly in double, and no Cast before opset 13 reads them"
                )  # fmt: skip
            _float_fmod(nodes, a, b, elem, shape, node.outputs[0])
            return nodes.nodes
        quotient = nodes.op("Div", [a, b], elem, shape)
        multiple = nodes.op("Mul", [quotient, b], elem, shape)
        if fmod or elem in _UNSIGNED:
            nodes.op("Sub", [a, multiple], None, output=node.outputs[0])
            return nodes.nodes
        remainder = nodes.op("Sub", [a, multiple], elem, shape)
        signs = nodes.op(
            "Mul",
            [nodes.op("Cast", [v], _DOUBLE, ctx.shape(v), to=_DOUBLE) for v in (remainder, b)],
            _DOUBLE,
            shape,
        )
        opposite = nodes.op("Less", [signs, nodes.const(np.float64(0.0), "zero")], _BOOL, shape)
        flag = nodes.op("Cast", [opposite], elem, shape, to=elem)
        correction = nodes.op("Mul", [flag, b], elem, shape)
        nodes.op("Add", [remainder, correction], None, output=node.outputs[0])
        return nodes.nodes


def _float_fmod(
    nodes: Builder,
    a: ir.Value,
    b: ir.Value,
    elem: ir.DataType,
    shape: list[int] | None,
    output: ir.Value,
) -> None:
    """``fmod(a, b)``, exactly, for float16 and float ``a`` and ``b``, in double and without Where
    (which opset 8 lacks).

    The remainder of ``x = |a|`` by ``y = |b|`` is exact and a value of the type; it is reduced in
    steps: with ``d = y * 2**S``, for S = 28k down to 0, ``x -= floor(x / d) * d``, and ``d`` is
    added back where that made ``x`` negative (the quotient rounded up to an integer). Before
    each step ``x < d * 2**28``, so the multiple of ``d`` has at most 29 + 24 bits and is exact in
    double, and the difference is exact (Sterbenz' lemma); after it ``0 <= x < d``. An infinite
    ``y`` is replaced by 2**200, larger than any finite ``x``. The result takes the sign of ``a``
    (of -0.0 too, found as the sign of ``1 / a``), and is NaN, by adding ``-0.0 / 0``, where ``x``
    is infinite or NaN or ``y`` is zero or NaN; elsewhere ``-0.0`` is added, which changes
    nothing."""

    def const(value: float, base: str) -> ir.Value:
        return nodes.const(np.float64(value), base)

    def op(
        name: str,
        inputs: list[ir.Value],
        kind: ir.DataType = _DOUBLE,
        of: Sequence[int | None] | None = shape,
        **attrs: Any,
    ) -> ir.Value:
        return nodes.op(name, inputs, kind, of, **attrs)

    a_shape, b_shape = nodes.ctx.shape(a), nodes.ctx.shape(b)
    a_wide = op("Cast", [a], of=a_shape, to=_DOUBLE)
    x = op("Abs", [a_wide], of=a_shape)
    y = op("Abs", [op("Cast", [b], of=b_shape, to=_DOUBLE)], of=b_shape)
    divisor = op("Min", [y, const(2.0**200, "unbounded")], of=b_shape)
    top = -(-(_QUOTIENT_BITS[elem] - _STEP_BITS) // _STEP_BITS) * _STEP_BITS
    zero = const(0.0, "zero")
    remainder = x
    for scale in range(top, -1, -_STEP_BITS):
        step = op("Mul", [divisor, const(2.0**scale, "scale")], of=b_shape) if scale else divisor
        whole = op("Floor", [op("Div", [remainder, step])])
        reduced = op("Sub", [remainder, op("Mul", [whole, step])])
        below = op("Cast", [op("Less", [reduced, zero], _BOOL)], to=_DOUBLE)
        remainder = op("Add", [reduced, op("Mul", [below, step])])
    finite_x = op("Less", [x, const(np.inf, "infinity")], _BOOL, of=a_shape)
    positive_y = op("Greater", [y, zero], _BOOL, of=b_shape)
    valid = op("Cast", [op("And", [finite_x, positive_y], _BOOL)], to=_DOUBLE)
    nan_or_zero = op("Div", [const(-0.0, "negative_zero"), valid])
    magnitude = op("Add", [remainder, nan_or_zero])
    inverse = op("Div", [const(1.0, "one"), a_wide], of=a_shape)
    negative = op("Cast", [op("Less", [inverse, zero], _BOOL, of=a_shape)], of=a_shape, to=_DOUBLE)
    twice = op("Mul", [negative, const(2.0, "two")], of=a_shape)
    sign = op("Sub", [const(1.0, "one"), twice], of=a_shape)
    signed = op("Mul", [magnitude, sign])
    nodes.op("Cast", [signed], None, output=output, to=elem)


@adapters("Pow")
class Pow:
    """Pow: an exponent of a type of its own at opset 12."""

    @staticmethod
    def below_12(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """Pow-12 lets the exponent have a type of its own; Pow-7 wants the base's type. The
        exponent is converted where that keeps every value: a constant whose values all survive, or
        a type that the base's type holds exactly."""
        base, exponent = required(node, 0), required(node, 1)
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
            b = Builder(ctx)
            cast = b.op("Cast", [exponent], base_type, ctx.shape(exponent), to=base_type)
            cast.name = ctx.fresh(f"{exponent.name}_cast")
            node.replace_input_with(1, cast)
            return [*b.nodes, node]
        raise ctx.refuse(
            node, boundary, f"Pow-7 wants the exponent of the base's type, {type_name(base_type)}, "
            f"and its exponent, of type {type_name(exponent_type)}, does not convert to it exactly"
        )  # fmt: skip


@adapters("Gemm")
class Gemm:
    """Gemm: an optional ``C`` at opset 11."""

    @staticmethod
    def below_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
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


@adapters("Trilu")
class Trilu:
    """Trilu, which opset 14 introduced."""

    @staticmethod
    def below_14(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """Trilu does not exist before opset 14. In the last two axes it keeps the element of row
        ``i`` and column ``j`` where ``j - i >= k`` (``upper=1``) or ``j - i <= k`` (``upper=0``),
        ``k`` 0 where it is omitted, and sets the others to zero: ``Where(j - i < k, 0, x)``, or
        ``Where(j - i > k, 0, x)``, broadcast over the leading axes. The offsets ``j - i`` are a
        constant where both lengths are known (and so is the mask where ``k`` is a constant too),
        else computed in int64 from ``arange`` of each length read when the model runs
        (``_blocks``); they are compared with ``k`` in int64, which Less and Greater take from
        opset 9 on (at opset 8, ``LessGreater`` compares them exactly). No arithmetic touches the
        data: every kept value, NaN, infinities and -0.0 included, comes out as it went in.
        Booleans are ``And``-ed with the negated mask instead, which every opset has.

        Where exists from opset 9 on; below, it is computed by selection for a static shape only
        (``_ops_gather.Where``), so a Trilu of dynamic shape is refused there. Strings have no zero
        to set."""
        x = required(node, 0)
        elem = ctx.elem_type(x)
        if elem is None:
            raise ctx.refuse(node, boundary, "the type of its input is unknown")
        if elem == ir.DataType.STRING:
            raise ctx.refuse(
                node, boundary, "its elements are strings, which have no zero to set the elements "
                "outside the triangle to"
            )  # fmt: skip
        rank = ctx.require_rank(node, boundary, x)
        if elem != _BOOL and not ctx.target_has("Where") and static_shape(ctx.shape(x)) is None:
            raise ctx.refuse(
                node, boundary, "below opset 9 it is computed by selection without Where, which "
                f"needs a static shape, and the shape of its input '{x.name}' is not known before "
                "run time (export at opset 9 or newer, or with static shapes in the step)"
            )  # fmt: skip
        b = Builder(ctx)
        offsets = _diagonal_offsets(b, node, boundary, x, rank)
        diagonal = given(node, 1)
        if diagonal is None:
            diagonal = b.const(np.int64(0), "k")
        compare = "Less" if attribute(node, "upper", 1) else "Greater"
        outside = _compared(b, compare, offsets, diagonal)
        if elem == _BOOL:
            known = ctx.const(outside)
            inside = (
                b.const(~known, "inside")
                if known is not None
                else b.op("Not", [outside], _BOOL, ctx.shape(outside))
            )
            b.op("And", [inside, x], None, output=node.outputs[0])
        else:
            zero = b.const(np.zeros((), np_dtype(elem)), "zero")
            b.op("Where", [outside, zero, x], None, output=node.outputs[0])
        return b.nodes


def _diagonal_offsets(b: Builder, node: ir.Node, boundary: int, x: ir.Value, rank: int) -> ir.Value:
    """``j - i`` in int64 for each row ``i`` and column ``j`` of the last two axes of ``x``: a
    constant where both lengths are known."""
    rows, columns = lengths_of(b, x).of([rank - 2, rank - 1])
    if isinstance(rows, int) and isinstance(columns, int):
        indices = np.arange(max(rows, columns), dtype=np.int64)
        return b.const(indices[None, :columns] - indices[:rows, None], "offsets")
    if isinstance(rows, int):
        row_indices = b.const(np.arange(rows, dtype=np.int64).reshape(rows, 1), "rows")
    else:
        column = b.const(np.array([-1, 1], np.int64), "column")
        positions = arange(b, node, boundary, rows)
        row_indices = b.op("Reshape", [positions, column], _INT64, [None, 1])
    column_indices = arange(b, node, boundary, columns)
    shape = [d if isinstance(d, int) else None for d in (rows, columns)]
    return b.op("Sub", [column_indices, row_indices], _INT64, shape)


def _compared(b: Builder, compare: str, a: ir.Value, c: ir.Value) -> ir.Value:
    """``Less`` or ``Greater`` of ``a`` and ``c``: a constant where both are."""
    known_a, known_c = b.ctx.const(a), b.ctx.const(c)
    if known_a is not None and known_c is not None:
        return b.const(known_a < known_c if compare == "Less" else known_a > known_c, "mask")
    return b.op(compare, [a, c], _BOOL, b.ctx.shape(a))
