"""Adapters for reductions: ReduceSum and the other ``Reduce*`` operators, ArgMax and ArgMin,
and TopK.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from torchscan.onnx._export._convert._context import (
    FLOATS,
    Builder,
    Context,
    attribute,
    present_inputs,
    remove_attribute,
    required,
    set_attribute,
    truncate_inputs,
    type_name,
)
from torchscan.onnx._export._convert._helpers import negative_axes, onnx_adapter
from torchscan.onnx._export._convert._registry import adapters

REDUCE_18 = [
    "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
    "ReduceMin", "ReduceProd", "ReduceSumSquare",
]  # fmt: skip


def _reduce_axes_input(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
    """ReduceSum-13 and the other reductions' version 18 take ``axes`` as an input, where "an
    empty axes" reduces over all axes, or with ``noop_with_empty_axes=1`` returns the input
    unchanged. Their older versions take an ``axes`` attribute, whose absence reduces over all
    axes."""
    given = len(present_inputs(node)) > 1
    axes = ctx.require_const(node, boundary, 1, "axes") if given else np.zeros(0, np.int64)
    if axes.size == 0 and attribute(node, "noop_with_empty_axes", 0):
        b = Builder(ctx)
        b.op("Identity", [node.inputs[0]], None, output=node.outputs[0])
        return b.nodes
    remove_attribute(node, "noop_with_empty_axes")
    truncate_inputs(node, 1)
    if axes.size:
        set_attribute(node, "axes", [int(a) for a in axes.reshape(-1)])
    return [node]


@adapters("ReduceSum")
class ReduceSum:
    """ReduceSum: axes that count from the back at opset 11, and ``axes`` an input from opset 13."""

    below_11 = negative_axes("axes")
    below_13 = _reduce_axes_input


@adapters(*REDUCE_18)
class Reduce:
    """The other reductions: axes that count from the back at opset 11, and ``axes`` an input from
    opset 18."""

    below_11 = negative_axes("axes")
    below_18 = _reduce_axes_input


@adapters("ArgMax", "ArgMin")
class ArgMaxArgMin:
    """ArgMax and ArgMin: an axis that counts from the back at opset 11, and ``select_last_index``
    at opset 12, which onnx's adapter drops where it is 0."""

    below_11 = negative_axes("axis")
    below_12 = onnx_adapter


@adapters("TopK")
class TopK:
    """TopK: ``K`` an input at opset 10, ``largest`` and ``sorted`` at opset 11."""

    @staticmethod
    def below_10(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """TopK-10 takes ``K`` as an input; TopK-1 as the attribute ``k``."""
        k = ctx.require_const(node, boundary, 1, "K")
        truncate_inputs(node, 1)
        set_attribute(node, "k", int(k.reshape(-1)[0]))
        return [node]

    @staticmethod
    def below_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """TopK-11 added ``largest`` and ``sorted``; TopK-10 returns the largest values, sorted.
        ``sorted=0`` leaves the order open, so a sorted result is one of the allowed ones.
        ``largest=0`` is the largest values of the negated input, negated back, which keeps "the
        lower index first" among equal values; negation is exact for floating-point types only."""
        largest = attribute(node, "largest", 1)
        remove_attribute(node, "largest")
        remove_attribute(node, "sorted")
        if largest:
            return [node]
        x, values = required(node, 0), node.outputs[0]
        elem = ctx.elem_type(x)
        if elem not in FLOATS:
            kind = type_name(elem) if elem else "unknown"
            raise ctx.refuse(
                node, boundary, f"largest=0 is computed on the negated input, which is exact for "
                f"floating-point types only, and the input is of type {kind}"
            )  # fmt: skip
        b = Builder(ctx)
        negated = b.op("Neg", [x], elem, ctx.shape(x))
        negated.name = ctx.fresh(f"{x.name}_negated")
        node.replace_input_with(0, negated)
        shape = ctx.shape(values)
        b.op("Neg", [values], None, output=values)
        values.name = ctx.fresh("values_negated")
        ctx.set_type(values, elem, shape)
        negate, negate_back = b.nodes
        return [negate, node, negate_back]
