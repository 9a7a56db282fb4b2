"""The quantization operators, in torch: ``QuantizeLinear``, ``DequantizeLinear``,
``DynamicQuantizeLinear``, and the integer products ``MatMulInteger``, ``ConvInteger``,
``QLinearMatMul`` and ``QLinearConv``.

A quantized tensor is an integer tensor of one of the types torch has (``int8``, ``uint8``,
``int16``, ``uint16``, ``int32``), its scale and zero point of one element (per tensor), one per
index of an axis (per axis) or one per block of ``block_size`` elements along an axis (blocked).
Quantizing divides by the scale, rounds half to even (``torch.round``), adds the zero point and
saturates to the type's range; dequantizing subtracts the zero point and multiplies by the scale,
in float32, so that it is differentiable in the scale. The 8-, 6-, 4- and 2-bit floating-point
and integer types have no torch dtype here, and are refused.

The integer products subtract the zero points and compute exactly: in int64 on the CPU, in
float64 elsewhere (exact for products of 8-bit values); ``QLinearMatMul`` and ``QLinearConv``
then requantize as onnxruntime does, ``round(sum * (scale_a * scale_b / scale_y)) + zero_point_y``
saturated, the multiplier in float32.
"""

from __future__ import annotations

import torch

from torchscan.onnx._import import _ops_nn
from torchscan.onnx._import._graph import Call
from torchscan.onnx._import._registry import implements
from torchscan.onnx._import._types import torch_dtype

_RANGES = {
    torch.uint8: (0, 255),
    torch.int8: (-128, 127),
    torch.uint16: (0, 65535),
    torch.int16: (-32768, 32767),
    torch.int32: (-(2**31), 2**31 - 1),
}
"""The quantized types torch has, and their ranges."""


def _quantized_type(call: Call, dtype: torch.dtype | None, element_type: int | None) -> torch.dtype:
    """The quantized type ``dtype`` (that of a zero point), checked; ``element_type`` names an
    ONNX type torch lacks (for the message)."""
    if dtype is None or dtype not in _RANGES or dtype == torch.int32:
        described = f"element type {element_type}" if dtype is None else str(dtype)
        raise call.refuse(
            f"quantization to {described} (torch has int8, uint8, int16 and uint16 of the "
            "quantized types)",
            not_implemented=True,
        )
    return dtype


def _parameter(
    call: Call,
    name: str,
    value: torch.Tensor,
    shape: torch.Size,
    axis: int,
    block_size: int,
    version: int,
) -> torch.Tensor:
    """A scale or zero point ``value`` as a tensor that broadcasts to ``shape``: per tensor
    (one element), per axis (a 1-D tensor of the length of ``axis``), or blocked (the rank of
    the input, ``ceil(length / block_size)`` along ``axis``, repeated ``block_size`` times)."""
    rank = len(shape)
    if value.numel() == 1 and value.dim() <= 1 and not block_size:
        return value.reshape(())
    if version < 13:
        raise call.refuse(f"{name} of shape {list(value.shape)} (this version takes a scalar)")
    if not -rank <= axis < rank:
        raise call.refuse(f"axis {axis} is out of range for an input of rank {rank}")
    axis %= rank
    if not block_size:
        if value.dim() != 1 or value.shape[0] != shape[axis]:
            raise call.refuse(
                f"{name} of shape {list(value.shape)} is neither one element nor one for each "
                f"of the {shape[axis]} elements of axis {axis} of the input {list(shape)}"
            )
        view = [1] * rank
        view[axis] = shape[axis]
        return value.reshape(view)
    if block_size < 0:
        raise call.refuse(f"block_size {block_size} must be positive")
    expected = list(shape)
    expected[axis] = -(-shape[axis] // block_size)
    if list(value.shape) != expected:
        raise call.refuse(
            f"{name} of shape {list(value.shape)} does not block the input {list(shape)} in "
            f"blocks of {block_size} along axis {axis} (shape {expected})"
        )
    return value.repeat_interleave(block_size, dim=axis).narrow(axis, 0, shape[axis])


def _check_pair(call: Call, scale: torch.Tensor, zero_point: torch.Tensor | None) -> None:
    if zero_point is not None and zero_point.shape != scale.shape:
        raise call.refuse(
            f"the zero point's shape {list(zero_point.shape)} is not the scale's "
            f"{list(scale.shape)}"
        )


def _quantize_linear(
    call: Call, x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None = None
) -> torch.Tensor:
    version = call.node.version
    axis = call.attribute("axis", 1)
    block_size = call.attribute("block_size", 0)
    output_dtype = call.attribute("output_dtype", 0)
    _check_pair(call, scale, zero_point)
    if zero_point is not None:
        dtype = zero_point.dtype
        if output_dtype and torch_dtype(output_dtype) != dtype:
            raise call.refuse(
                f"output_dtype {output_dtype} is not the type of the zero point ({dtype})"
            )
    elif output_dtype:
        dtype = torch_dtype(output_dtype)
    else:
        dtype = torch.uint8
    dtype = _quantized_type(call, dtype, output_dtype or None)
    precision = call.attribute("precision", 0)
    compute = torch_dtype(precision) if precision else scale.dtype
    if precision and (compute is None or not compute.is_floating_point):
        raise call.refuse(f"precision {precision} (a floating-point type torch has)")
    if compute is None or not compute.is_floating_point:  # (an int32 scale: true division)
        compute = torch.float64
    scale = _parameter(call, "the scale", scale, x.shape, axis, block_size, version)
    rounded = torch.round(x.to(compute) / scale.to(compute)).to(torch.float64)
    y = rounded.clamp(-(2.0**53), 2.0**53).to(torch.int64)  # (the zero point added exactly)
    if zero_point is not None:
        zero = _parameter(call, "the zero point", zero_point, x.shape, axis, block_size, version)
        y = y + zero.to(torch.int64)
    low, high = _RANGES[dtype]
    return y.clamp(low, high).to(dtype)


implements("QuantizeLinear", 10, 13, 19, 21, 23, 24, 25, 28)(_quantize_linear)


@implements("DequantizeLinear", 10, 13, 19, 21, 23, 24, 25, 28)
def dequantize_linear(
    call: Call, x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None = None
) -> torch.Tensor:
    version = call.node.version
    axis = call.attribute("axis", 1)
    block_size = call.attribute("block_size", 0)
    _check_pair(call, scale, zero_point)
    if x.dtype not in _RANGES:
        raise call.refuse(
            f"dequantization of {x.dtype} (torch has int8, uint8, int16, uint16 and int32 of "
            "the quantized types)",
            not_implemented=True,
        )
    if zero_point is not None and zero_point.dtype != x.dtype:
        raise call.refuse(f"the zero point ({zero_point.dtype}) is not of x's type ({x.dtype})")
    output_dtype = call.attribute("output_dtype", 0)
    dtype = torch_dtype(output_dtype) if output_dtype else scale.dtype
    if dtype is None or not dtype.is_floating_point:
        raise call.refuse(f"output_dtype {output_dtype} (float, float16 or bfloat16)")
    shifted = x.to(torch.int64)
    if zero_point is not None:
        zero = _parameter(call, "the zero point", zero_point, x.shape, axis, block_size, version)
        shifted = shifted - zero.to(torch.int64)
    scale = _parameter(call, "the scale", scale, x.shape, axis, block_size, version)
    return (shifted.to(torch.float32) * scale.to(torch.float32)).to(dtype)


@implements("DynamicQuantizeLinear", 11)
def dynamic_quantize_linear(call: Call, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """uint8, the range of ``x`` widened to hold 0; the scale of a tensor of zeros is 1, as
    onnxruntime gives it (the specification divides by 0 there)."""
    x = x.float()
    zero = x.new_zeros(())
    high = torch.maximum(x.max(), zero) if x.numel() else zero
    low = torch.minimum(x.min(), zero) if x.numel() else zero
    scale = torch.where(high == low, torch.ones_like(high), (high - low) / 255.0)
    zero_point = torch.round((0.0 - low / scale).clamp(0, 255))
    y = (torch.round(x / scale) + zero_point).clamp(0, 255).to(torch.uint8)
    return y, scale, zero_point.to(torch.uint8)


# ---------------------------------------------------------------------------------------------
# Integer products


def _exact(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """``tensors`` in a type torch multiplies and sums exactly: int64 on the CPU, float64
    elsewhere (where integer products are not implemented)."""
    dtype = torch.int64 if tensors[0].device.type == "cpu" else torch.float64
    return [t.to(dtype) for t in tensors]


def _per_row(value: torch.Tensor | None) -> torch.Tensor | None:
    """A parameter of the left operand of a product: one element, one per row (1-D), or the
    operand's rank with its last dimension 1."""
    if value is None:
        return None
    if value.numel() == 1 and value.dim() <= 1:
        return value.reshape(())
    return value.unsqueeze(-1) if value.dim() == 1 else value


def _per_column(value: torch.Tensor | None) -> torch.Tensor | None:
    """A parameter of the right operand of a product: one element, one per column (1-D), or
    the operand's rank with its second to last dimension 1."""
    if value is None:
        return None
    return value.reshape(()) if value.numel() == 1 and value.dim() <= 1 else value


def _int32(y: torch.Tensor) -> torch.Tensor:
    return (torch.round(y) if y.is_floating_point() else y).to(torch.int32)


def _matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    a_zero: torch.Tensor | None,
    b_zero: torch.Tensor | None,
) -> torch.Tensor:
    a, b = _exact(a, b)
    if a_zero is not None:
        a = a - a_zero.to(a.dtype)
    if b_zero is not None:
        b = b - b_zero.to(b.dtype)
    return torch.matmul(a, b)


@implements("MatMulInteger", 10)
def matmul_integer(
    call: Call,
    a: torch.Tensor,
    b: torch.Tensor,
    a_zero_point: torch.Tensor | None = None,
    b_zero_point: torch.Tensor | None = None,
) -> torch.Tensor:
    return _int32(_matmul(a, b, _per_row(a_zero_point), _per_column(b_zero_point)))


def _conv_operands(
    call: Call,
    x: torch.Tensor,
    w: torch.Tensor,
    x_zero_point: torch.Tensor | None,
    w_zero_point: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` and ``w`` less their zero points, in float64 (torch convolves no integers); the
    padding is then zeros, as a padding of the zero point."""
    x, w = x.to(torch.float64), w.to(torch.float64)
    if x_zero_point is not None:
        if x_zero_point.numel() != 1:
            raise call.refuse(
                f"x_zero_point of shape {list(x_zero_point.shape)} (this operator takes one "
                "zero point for the input)"
            )
        x = x - x_zero_point.reshape(()).to(torch.float64)
    if w_zero_point is not None:
        w = w - _per_channel(call, "w_zero_point", w_zero_point, w).to(torch.float64)
    return x, w


def _per_channel(call: Call, name: str, value: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A parameter of a convolution's weights: one element, or one per output channel."""
    if value.numel() == 1 and value.dim() <= 1:
        return value.reshape(())
    if value.dim() != 1 or value.shape[0] != w.shape[0]:
        raise call.refuse(
            f"{name} of shape {list(value.shape)} is neither one element nor one for each of "
            f"the {w.shape[0]} output channels"
        )
    return value.reshape([-1] + [1] * (w.dim() - 1))


@implements("ConvInteger", 10)
def conv_integer(
    call: Call,
    x: torch.Tensor,
    w: torch.Tensor,
    x_zero_point: torch.Tensor | None = None,
    w_zero_point: torch.Tensor | None = None,
) -> torch.Tensor:
    x, w = _conv_operands(call, x, w, x_zero_point, w_zero_point)
    return _int32(_ops_nn.conv(call, x, w))


def _requantize(
    call: Call,
    total: torch.Tensor,
    multiplier: torch.Tensor,
    zero_point: torch.Tensor,
) -> torch.Tensor:
    """``round(total * multiplier) + zero_point``, saturated to the zero point's type."""
    dtype = _quantized_type(call, zero_point.dtype, None)
    y = torch.round(total.to(torch.float32) * multiplier.to(torch.float32))
    low, high = _RANGES[dtype]
    return (y + zero_point.to(torch.float32)).clamp(low, high).to(dtype)


def _one(call: Call, name: str, value: torch.Tensor) -> torch.Tensor:
    if value.numel() != 1:
        raise call.refuse(f"{name} of shape {list(value.shape)} (this operator takes a scalar)")
    return value.reshape(())


@implements("QLinearMatMul", 10, 21)
def qlinear_matmul(
    call: Call,
    a: torch.Tensor,
    a_scale: torch.Tensor,
    a_zero_point: torch.Tensor,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    b_zero_point: torch.Tensor,
    y_scale: torch.Tensor,
    y_zero_point: torch.Tensor,
) -> torch.Tensor:
    for value in (a, b, a_zero_point, b_zero_point, y_zero_point):
        _quantized_type(call, value.dtype, None)
    total = _matmul(a, b, _per_row(a_zero_point), _per_column(b_zero_point))
    a_part, b_part = _per_row(a_scale), _per_column(b_scale)
    assert a_part is not None
    assert b_part is not None
    multiplier = a_part.float() * b_part.float() / _one(call, "y_scale", y_scale).float()
    return _requantize(call, total, multiplier, _one(call, "y_zero_point", y_zero_point))


@implements("QLinearConv", 10)
def qlinear_conv(
    call: Call,
    x: torch.Tensor,
    x_scale: torch.Tensor,
    x_zero_point: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    w_zero_point: torch.Tensor,
    y_scale: torch.Tensor,
    y_zero_point: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    for value in (x, w, x_zero_point, w_zero_point, y_zero_point):
        _quantized_type(call, value.dtype, None)
    xf, wf = _conv_operands(call, x, w, x_zero_point, w_zero_point)
    total = _ops_nn.conv(call, xf, wf, None if bias is None else bias.to(torch.float64))
    per_channel = _per_channel(call, "w_scale", w_scale, w).reshape(-1)
    shape = [1, -1] + [1] * (total.dim() - 2)
    multiplier = (
        _one(call, "x_scale", x_scale).float() * per_channel.float().reshape(shape)
    ) / _one(call, "y_scale", y_scale).float()
    return _requantize(call, total, multiplier, _one(call, "y_zero_point", y_zero_point))
