"""Adapters for the layers of neural networks: convolutions and pools, BatchNormalization, the
recurrent layers, Dropout, Softmax, LogSoftmax and Hardmax, Resize and Upsample.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from torchscan.onnx._export._convert._context import (
    Builder,
    Context,
    attribute,
    clear_attributes,
    is_present,
    present_inputs,
    required,
    set_attribute,
    truncate_inputs,
)
from torchscan.onnx._export._convert._helpers import (
    drop_added_attributes,
    negative_axes,
    onnx_adapter,
)
from torchscan.onnx._export._convert._registry import adapters


def _auto_pad_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
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
    return [node]


@adapters("Conv", "ConvTranspose")
class Convolution:
    """Conv and ConvTranspose: ``auto_pad`` redefined at opset 11."""

    below_11 = _auto_pad_11


@adapters("MaxPool")
class MaxPool:
    """MaxPool: ``ceil_mode`` and ``dilations`` at opset 10, dropped where they mean the older
    behaviour; ``auto_pad`` redefined at opset 11."""

    below_10 = drop_added_attributes(ceil_mode=0, dilations=1)
    below_11 = _auto_pad_11


@adapters("AveragePool")
class AveragePool:
    """AveragePool: ``ceil_mode`` at opset 10, dropped where it is 0; ``auto_pad`` redefined at
    opset 11."""

    below_10 = drop_added_attributes(ceil_mode=0)
    below_11 = _auto_pad_11


@adapters("LpPool")
class LpPool:
    """LpPool: ``auto_pad`` redefined at opset 11; ``ceil_mode`` and ``dilations`` at opset 18,
    dropped where they mean the older behaviour."""

    below_11 = _auto_pad_11
    below_18 = drop_added_attributes(ceil_mode=0, dilations=1)


@adapters("BatchNormalization")
class BatchNormalization:
    """BatchNormalization: ``spatial`` dropped at opset 9, whose default BatchNormalization-7 keeps
    (onnx's adapter); ``training_mode`` at opset 14, dropped where it is 0; types of their own
    for scale, bias, mean and variance at opset 15."""

    below_9 = onnx_adapter
    below_14 = drop_added_attributes(training_mode=0)

    @staticmethod
    def below_15(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """BatchNormalization-15 lets scale and bias, and mean and variance, have types of their
        own; BatchNormalization-14 wants scale and bias of the input's type. Nothing else changed:
        the node stays, and the converter checks its types at the target."""
        return [node]


@adapters("GRU", "LSTM", "RNN")
class Recurrent:
    """GRU, LSTM and RNN: ``layout`` at opset 14, which onnx's adapter drops where it is 0."""

    below_14 = onnx_adapter


@adapters("Dropout")
class Dropout:
    """Dropout: ``training_mode`` an input at opset 12."""

    @staticmethod
    def below_12(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """Dropout-12 takes ``training_mode`` as an input; out of training mode it returns its
        input, which is an Identity at every opset."""
        inputs = present_inputs(node)
        training = ctx.require_const(node, boundary, 2, "training_mode") if len(inputs) > 2 else 0
        if np.any(training):
            raise ctx.refuse(node, boundary, "training mode draws a random mask")
        if len(node.outputs) > 1 and is_present(node.outputs[1]):
            raise ctx.refuse(node, boundary, "its mask output is used")
        b = Builder(ctx)
        b.op("Identity", [node.inputs[0]], None, output=node.outputs[0])
        return b.nodes


@adapters("Softmax", "LogSoftmax", "Hardmax")
class Softmax:
    """Softmax, LogSoftmax and Hardmax: an axis that counts from the back at opset 11, and one axis
    normalized at opset 13."""

    below_11 = negative_axes("axis")

    @staticmethod
    def below_13(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """Softmax-13 (and LogSoftmax, Hardmax) normalizes along the one ``axis``; version 11
        "coerced to 2D" at ``axis`` and normalized over all axes from it to the last. The two agree
        where the axis is the last one, so another axis is swapped with the last by Transposes."""
        x, y = required(node, 0), node.outputs[0]
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
        b = Builder(ctx)
        swapped_x = b.op("Transpose", [x], elem, swapped, perm=perm)
        swapped_x.name = ctx.fresh(f"{x.name}_swapped")
        node.replace_input_with(0, swapped_x)
        b.op("Transpose", [y], None, output=y, perm=perm)
        y.name = ctx.fresh(f"{y.name}_swapped")
        ctx.set_type(y, elem, swapped)
        before, after = b.nodes
        return [before, node, after]


@adapters("Resize")
class Resize:
    """Resize, which opset 10 introduced; the coordinate transformations and ``sizes`` at opset 11,
    optional ``roi`` and ``scales`` at opset 13, ``antialias`` and ``axes`` at opset 18, which
    onnx's adapter drops where they mean the older behaviour."""

    @staticmethod
    def below_10(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """Resize does not exist before opset 10; Upsample-9 has the same inputs, attribute and
        meaning."""
        node.op_type = "Upsample"
        return [node]

    @staticmethod
    def below_11(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
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
                f"mode={mode}, coordinate_transformation_mode={transformation}, "
                f"nearest_mode={nearest}"
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

    @staticmethod
    def below_13(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """Resize-13 made ``roi`` and ``scales`` optional; Resize-11 takes them always, where an
        empty tensor means not given."""
        if len(node.inputs) < 3:
            node.resize_inputs(3)
        for index, name in ((1, "roi"), (2, "scales")):
            if node.inputs[index] is None:
                node.replace_input_with(index, ctx.add_const(np.zeros(0, np.float32), name))
        return [node]

    below_18 = onnx_adapter


def _scales_of_sizes(ctx: Context, node: ir.Node, sizes: ir.Value | None) -> np.ndarray | None:
    value = ctx.const(sizes)
    shape = ctx.shape(node.inputs[0])
    if value is None or shape is None or None in shape or 0 in shape:
        return None
    lengths = np.array(shape, np.int64)
    if (value % lengths).any():
        return None
    return (value // lengths).astype(np.float32)


@adapters("Upsample")
class Upsample:
    """Upsample: ``scales`` an input at opset 9."""

    @staticmethod
    def below_9(node: ir.Node, ctx: Context, boundary: int) -> list[ir.Node]:
        """Upsample-9 takes ``scales`` as an input, Upsample-7 as an attribute (onnx's adapter)."""
        ctx.require_const(node, boundary, 1, "scales")
        return ctx.run_onnx_adapter(node, boundary)
