"""Adapters for constants and types: Constant, ConstantOfShape and CastLike."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from torchscan.onnx._export._convert._context import (
    Builder,
    Context,
    as_tensor,
    attribute,
    clear_attributes,
    constant_of_node,
    set_attribute,
    truncate_inputs,
)
from torchscan.onnx._export._convert._registry import adapters


@adapters("Constant")
class Constant:
    """Constant: ``sparse_value`` at opset 11, the typed attributes at opset 12."""

    @staticmethod
    def below_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """Constant-11 added ``sparse_value``; Constant-9 holds the same values as a dense
        ``value``."""
        if attribute(node, "sparse_value") is None:
            return [node]
        return _dense_constant(node)

    @staticmethod
    def below_12(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """Constant-12 added ``value_float``, ``value_ints`` and the other typed attributes;
        Constant-11 holds a ``value`` tensor."""
        if attribute(node, "value") is not None or attribute(node, "sparse_value") is not None:
            return [node]
        return _dense_constant(node)


def _dense_constant(node: ir.Node) -> list[ir.Node]:
    """``node``, a Constant, holding its value as a ``value`` tensor."""
    value = constant_of_node(node)
    assert value is not None  # a Constant holds its value in one of its attributes
    clear_attributes(node)
    node.attributes["value"] = ir.AttrTensor("value", as_tensor(value))
    return [node]


@adapters("ConstantOfShape")
class ConstantOfShape:
    """ConstantOfShape, which opset 9 introduced."""

    @staticmethod
    def below_9(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """ConstantOfShape does not exist before opset 9; Expand (opset 8) of its one value to the
        shape makes the same tensor."""
        value = attribute(node, "value")
        scalar = value.numpy().reshape(()) if value is not None else np.float32(0)
        filler = ctx.add_const(scalar, "value")
        b = Builder(ctx)
        b.op("Expand", [filler, node.inputs[0]], None, output=node.outputs[0])
        return b.nodes


@adapters("CastLike")
class CastLike:
    """CastLike, which opset 15 introduced."""

    @staticmethod
    def below_15(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
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
