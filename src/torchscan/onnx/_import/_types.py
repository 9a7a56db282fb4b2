"""ONNX element types as torch dtypes."""

from __future__ import annotations

import onnx_ir as ir
import torch

_DTYPES: dict[ir.DataType, torch.dtype] = {
    ir.DataType.FLOAT: torch.float32,
    ir.DataType.DOUBLE: torch.float64,
    ir.DataType.FLOAT16: torch.float16,
    ir.DataType.BFLOAT16: torch.bfloat16,
    ir.DataType.INT8: torch.int8,
    ir.DataType.INT16: torch.int16,
    ir.DataType.INT32: torch.int32,
    ir.DataType.INT64: torch.int64,
    ir.DataType.UINT8: torch.uint8,
    ir.DataType.UINT16: torch.uint16,
    ir.DataType.UINT32: torch.uint32,
    ir.DataType.UINT64: torch.uint64,
    ir.DataType.BOOL: torch.bool,
    ir.DataType.COMPLEX64: torch.complex64,
    ir.DataType.COMPLEX128: torch.complex128,
}


def torch_dtype(element_type: int | ir.DataType) -> torch.dtype | None:
    """The torch dtype of an ONNX element type (``None`` where torch has none, as for
    strings and the 8-, 4- and 2-bit floating-point types)."""
    try:
        return _DTYPES.get(ir.DataType(element_type))
    except ValueError:  # (a number that names no element type)
        return None


def torch_tensor(tensor: ir.TensorProtocol) -> torch.Tensor | None:
    """``tensor`` (an initializer, a ``Constant``'s value) as a torch tensor of its own memory;
    None where torch has no dtype of its element type."""
    dtype = torch_dtype(tensor.dtype)
    if dtype is None:
        return None
    shape = tuple(d for d in tensor.shape.dims if isinstance(d, int))  # (a tensor's are numbers)
    data = bytearray(tensor.tobytes())  # (little-endian, as torch reads it)
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(data, dtype=dtype).reshape(shape)
