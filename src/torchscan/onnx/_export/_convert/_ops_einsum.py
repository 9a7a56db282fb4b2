"""Adapters for Einsum, which does not exist before opset 12: its equation decomposed into sums,
transpositions, and products of two operands at a time (``MatMul``).
"""

from __future__ import annotations

import string
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from torchscan.onnx._export._convert._blocks import (
    Int,
    Lengths,
    lengths_of,
    product,
    scalar,
    vector,
)
from torchscan.onnx._export._convert._context import FLOATS, Builder, Context, attribute, required
from torchscan.onnx._export._convert._registry import adapters

_Operand = tuple[ir.Value, list[str], Sequence[int | None] | None]
"""A tensor, the subscript of each of its axes, and its shape where its rank is known."""


class _Unsupported(Exception):
    """An equation that the decomposition does not handle, and why."""


def parse_equation(equation: str, ranks: Sequence[int]) -> tuple[list[list[str]], list[str]]:
    """The subscripts of each operand's axes and of the output's, from an Einsum equation and the
    ranks of the operands. An ellipsis stands for axes of subscripts ``...0``, ``...1`` and so
    on, aligned at the right as broadcasting aligns them; without ``->`` the output has the
    ellipsis's axes, then the subscripts that appear once, in alphabetical order (Einsum-12)."""
    text = equation.replace(" ", "")
    inputs, arrow, output = text.partition("->")
    terms = inputs.split(",")
    if len(terms) != len(ranks):
        raise _Unsupported(f"its equation '{equation}' has {len(terms)} operands, not {len(ranks)}")
    widths = []
    for term, rank in zip(terms, ranks, strict=True):
        letters = term.replace("...", "")
        if "..." in term:
            widths.append(rank - len(letters))
        elif len(letters) != rank:
            raise _Unsupported(f"its equation '{equation}' does not match operands of rank {rank}")
    ellipsis = [f"...{i}" for i in range(max(widths, default=0))]

    def subscripts(term: str, width: int) -> list[str]:
        before, dots, after = term.partition("...")
        if any(c not in string.ascii_letters for c in before + after):
            raise _Unsupported(f"its equation '{equation}' has a subscript that is not a letter")
        return [*before, *(ellipsis[len(ellipsis) - width :] if dots else []), *after]

    widths_iter = iter(widths)
    parsed = [subscripts(t, next(widths_iter) if "..." in t else 0) for t in terms]
    for term in parsed:
        repeated = sorted({s for s in term if term.count(s) > 1})
        if repeated:
            raise _Unsupported(
                f"its equation '{equation}' repeats the subscript '{repeated[0]}' within one "
                "operand (a diagonal), which is not decomposed"
            )
    if arrow:
        if ellipsis and "..." not in output:
            raise _Unsupported(f"its equation '{equation}' sums over the axes of its ellipsis")
        result = subscripts(output, len(ellipsis))
        if len(set(result)) != len(result):
            raise _Unsupported(f"its equation '{equation}' repeats a subscript of its output")
        missing = sorted(set(result) - {s for term in parsed for s in term})
        if missing:
            raise _Unsupported(f"its output subscript '{missing[0]}' is in no operand")
    else:
        counts: dict[str, int] = {}
        for term in parsed:
            for s in term:
                counts[s] = counts.get(s, 0) + 1
        once = sorted(s for s, n in counts.items() if n == 1 and not s.startswith("..."))
        result = [*ellipsis, *once]
    return parsed, result


@adapters("Einsum")
class Einsum:
    """Einsum, which opset 12 introduced."""

    @staticmethod
    def below_12(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """Einsum does not exist before opset 12. Its equation is decomposed: each operand is first
        summed over the subscripts that no other operand and not the output has; then the operands
        are multiplied two at a time, left to right. In each product the subscripts of both are
        either kept, which makes them batch axes, or summed, which makes them the contracted axis of
        a ``MatMul``: each operand is transposed to [batch, own, summed] (the other to [batch,
        summed, own]) and reshaped to three groups of axes, and the product reshaped back. (Before
        opset 9, MatMul takes floating-point types only: integers are multiplied elementwise with
        broadcasting and summed, which is exact as integer arithmetic wraps around.) A last
        transposition puts the axes in the output's order.

        Equations with a subscript repeated within one operand (a diagonal: ``ii->i``) or an
        ellipsis that is summed over are refused."""
        operands = [required(node, i) for i in range(len(node.inputs))]
        ranks = [ctx.require_rank(node, boundary, value) for value in operands]
        elem = ctx.elem_type(operands[0])
        if elem is None:
            raise ctx.refuse(node, boundary, "the type of its inputs is unknown")
        equation = attribute(node, "equation", "")
        try:
            terms, result = parse_equation(equation, ranks)
        except _Unsupported as error:
            raise ctx.refuse(node, boundary, str(error)) from None
        b = Builder(ctx)
        pending: list[_Operand] = [
            (v, t, ctx.shape(v)) for v, t in zip(operands, terms, strict=True)
        ]
        for i, (value, term, shape) in enumerate(pending):
            needed = set(result).union(*(t for j, (_, t, _) in enumerate(pending) if j != i))
            pending[i] = _sum_over(b, elem, (value, term, shape), needed)
        current = pending[0]
        for i in range(1, len(pending)):
            needed = set(result).union(*(t for _, t, _ in pending[i + 1 :]))
            current = _contract(b, elem, current, pending[i], needed)
        current = _sum_over(b, elem, current, set(result))
        value, term, shape = current
        perm = [term.index(s) for s in result]
        if perm != list(range(len(perm))):
            b.op("Transpose", [value], None, output=node.outputs[0], perm=perm)
        else:
            b.op("Identity", [value], None, output=node.outputs[0])
        return b.nodes


def _sum_over(b: Builder, elem: ir.DataType, operand: _Operand, needed: set[str]) -> _Operand:
    """``operand`` summed over the axes whose subscripts are not ``needed``."""
    value, term, shape = operand
    axes = [k for k, s in enumerate(term) if s not in needed]
    if not axes:
        return operand
    kept = [k for k in range(len(term)) if k not in axes]
    new_shape = [shape[k] for k in kept] if shape is not None else None
    if elem in FLOATS:
        summed = b.op("ReduceSum", [value], elem, new_shape, axes=axes, keepdims=0)
        return summed, [term[k] for k in kept], new_shape
    value, _, _ = _transpose(b, elem, operand, [term[k] for k in kept + axes])
    summed = _sum_last(b, elem, value, len(term), len(axes))
    return summed, [term[k] for k in kept], [None] * len(kept)


def _sum_last(b: Builder, elem: ir.DataType, value: ir.Value, rank: int, count: int) -> ir.Value:
    """Integer ``value`` summed over its last ``count`` axes, exactly: onnxruntime's ReduceSum
    rounds some int64 sums through double, and its MatMul takes no integers before opset 9. The
    axes are made one, a 0 put before it (so that an empty axis sums to 0), and the last of its
    cumulative sums taken, which CumSum computes with integer additions (a Scan below opset 11,
    ``_ops_control.CumSum``)."""
    lengths = lengths_of(b, value)
    kept = rank - count
    merged = product(b, lengths.of(range(kept, rank)))
    if count != 1:
        shape = vector(b, [*lengths.of(range(kept)), merged])
        value = b.op("Reshape", [value, shape], elem, [None] * (kept + 1))
    pads = np.zeros(2 * (kept + 1), np.int64)
    pads[kept] = 1
    padded = b.op("Pad", [value, b.const(pads, "pads")], elem, [None] * (kept + 1), mode="constant")
    axis = b.const(np.int64(kept), "axis")
    sums = b.op("CumSum", [padded, axis], elem, [None] * (kept + 1))
    return b.op("Gather", [sums, scalar(b, merged)], elem, [None] * kept, axis=kept)


def _transpose(b: Builder, elem: ir.DataType, operand: _Operand, order: list[str]) -> _Operand:
    value, term, shape = operand
    perm = [term.index(s) for s in order]
    if perm == list(range(len(perm))):
        return operand
    new_shape = [shape[p] for p in perm] if shape is not None else None
    return b.op("Transpose", [value], elem, new_shape, perm=perm), order, new_shape


def _group_shape(
    b: Builder, lengths: Lengths, groups: Sequence[Sequence[int]], batch: int
) -> tuple[ir.Value, list[int | None]]:
    """The shape that keeps the first ``batch`` axes and merges each group of axes into one,
    as a vector, and where known as ints."""
    merged: list[Int] = [*lengths.of(range(batch)), *(product(b, lengths.of(g)) for g in groups)]
    return vector(b, merged), [m if isinstance(m, int) else None for m in merged]


def _contract(
    b: Builder, elem: ir.DataType, left: _Operand, right: _Operand, needed: set[str]
) -> _Operand:
    """The product of two operands, summed over the subscripts they share that are not
    ``needed``: with the subscripts ``batch + left's own + right's own``."""
    left_term, right_term = left[1], right[1]
    batch = [s for s in left_term if s in right_term and s in needed]
    summed = [s for s in left_term if s in right_term and s not in needed]
    own_left = [s for s in left_term if s not in right_term]
    own_right = [s for s in right_term if s not in left_term]
    nb, nl, nr, ns = len(batch), len(own_left), len(own_right), len(summed)
    term = batch + own_left + own_right
    if elem not in FLOATS and b.ctx.target_opset < 9:
        a, _, _ = _transpose(b, elem, left, batch + own_left + summed)
        c, _, _ = _transpose(b, elem, right, batch + own_right + summed)
        if nr:
            a = b.op(
                "Unsqueeze",
                [a],
                elem,
                [None] * (nb + nl + nr + ns),
                axes=list(range(nb + nl, nb + nl + nr)),
            )
        if nl:
            c = b.op(
                "Unsqueeze", [c], elem, [None] * (nb + nl + nr + ns), axes=list(range(nb, nb + nl))
            )
        multiplied = b.op("Mul", [a, c], elem, [None] * (nb + nl + nr + ns))
        if not summed:
            return multiplied, term, [None] * len(term)
        return _sum_last(b, elem, multiplied, nb + nl + nr + ns, ns), term, [None] * len(term)
    a, _, _ = _transpose(b, elem, left, batch + own_left + summed)
    c, _, _ = _transpose(b, elem, right, batch + summed + own_right)
    a_lengths, c_lengths = lengths_of(b, a), lengths_of(b, c)
    left_groups = [range(nb, nb + nl), range(nb + nl, nb + nl + ns)]
    right_groups = [range(nb, nb + ns), range(nb + ns, nb + ns + nr)]
    if nl != 1 or ns != 1:
        shape, known = _group_shape(b, a_lengths, left_groups, nb)
        a = b.op("Reshape", [a, shape], elem, known)
    if nr != 1 or ns != 1:
        shape, known = _group_shape(b, c_lengths, right_groups, nb)
        c = b.op("Reshape", [c, shape], elem, known)
    multiplied = b.op("MatMul", [a, c], elem, [None] * (nb + 2))
    if nl == 1 and nr == 1:
        return multiplied, term, [None] * len(term)
    result_lengths = lengths_of(b, multiplied)
    dims = [
        *result_lengths.of(range(nb)),
        *a_lengths.of(range(nb, nb + nl)),
        *c_lengths.of(range(nb + ns, nb + ns + nr)),
    ]
    known = [d if isinstance(d, int) else None for d in dims]
    return b.op("Reshape", [multiplied, vector(b, dims)], elem, known), term, known
