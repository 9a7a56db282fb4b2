"""Operators on shapes, indices and types, and the constants, in torch."""

from __future__ import annotations

import math
from typing import Any

import torch

from torchscan import _context
from torchscan._errors import TorchscanValueError
from torchscan.onnx._import._graph import Call
from torchscan.onnx._import._graph import ints as _ints
from torchscan.onnx._import._registry import implements
from torchscan.onnx._import._types import torch_dtype

_LATEST = (13, 14, 16, 19, 21, 23, 24, 25)


@implements("Identity", 1, *_LATEST)
def identity(call: Call, x: Any) -> tuple[Any]:
    return (x,)  # a 1-tuple: x may be a sequence, a list


@implements("Constant", 1, 9, 11, 12, 13, 19, 21, 23, 24, 25)
def constant(call: Call) -> torch.Tensor:
    attributes = call.node.attributes
    if "value" in attributes:
        return attributes["value"].clone()
    for name, dtype in (
        ("value_float", torch.float32),
        ("value_floats", torch.float32),
        ("value_int", torch.int64),
        ("value_ints", torch.int64),
    ):
        if name in attributes:
            return torch.tensor(attributes[name], dtype=dtype)
    given = ", ".join(attributes) or "no value"
    raise call.refuse(
        f"a Constant of {given} (strings and sparse tensors are not implemented)",
        not_implemented=True,
    )


@implements("ConstantOfShape", 9, 20, 21, 23, 24, 25)
def constant_of_shape(call: Call, shape: torch.Tensor) -> torch.Tensor:
    value = call.attribute("value")
    fill = torch.zeros(1, dtype=torch.float32) if value is None else value
    return fill.reshape(()).expand(*_ints(shape)).clone()


@implements("Cast", 6, 9, 13, 19, 21, 23, 24, 25)
def cast(call: Call, x: torch.Tensor) -> torch.Tensor:
    dtype = torch_dtype(call.attribute("to"))
    if dtype is None:
        raise call.refuse(
            f"a Cast to element type {call.attribute('to')}, which torch lacks",
            not_implemented=True,
        )
    return x.to(dtype)


@implements("CastLike", 15, 19, 21, 23, 24, 25)
def cast_like(call: Call, x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return x.to(like.dtype)


@implements("Reshape", 5, 13, 14, 19, 21, 23, 24, 25)
def reshape(call: Call, x: torch.Tensor, shape: torch.Tensor) -> torch.Tensor:
    target = _ints(shape)
    if not call.attribute("allowzero", 0):  # a 0 copies the input's size (sizes: never 0 here)
        target = [x.shape[i] if isinstance(d, int) and d == 0 else d for i, d in enumerate(target)]
    return x.reshape(target)


@implements("Flatten", 1, 9, 11, 13, 21, 23, 24, 25)
def flatten(call: Call, x: torch.Tensor) -> torch.Tensor:
    axis = call.attribute("axis", 1)
    axis = axis + x.dim() if axis < 0 else axis
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


@implements("Transpose", 1, 13, 21, 23, 24, 25)
def transpose(call: Call, x: torch.Tensor) -> torch.Tensor:
    perm = call.attribute("perm") or list(range(x.dim()))[::-1]
    return x.permute(*perm)


def _squeeze(x: torch.Tensor, axes: list[int]) -> torch.Tensor:
    if not axes:
        return x.squeeze()
    return x.squeeze(tuple(a % x.dim() for a in axes))


@implements("Squeeze", 1, 11)
def squeeze_attribute(call: Call, x: torch.Tensor) -> torch.Tensor:
    return _squeeze(x, list(call.attribute("axes", []) or []))


@implements("Squeeze", 13, 21, 23, 24, 25)
def squeeze(call: Call, x: torch.Tensor, axes: torch.Tensor | None = None) -> torch.Tensor:
    return _squeeze(x, _ints(axes))


def _unsqueeze(x: torch.Tensor, axes: list[int]) -> torch.Tensor:
    rank = x.dim() + len(axes)
    for axis in sorted(a % rank for a in axes):
        x = x.unsqueeze(axis)
    return x


@implements("Unsqueeze", 1, 11)
def unsqueeze_attribute(call: Call, x: torch.Tensor) -> torch.Tensor:
    return _unsqueeze(x, list(call.attribute("axes")))


@implements("Unsqueeze", 13, 21, 23, 24, 25)
def unsqueeze(call: Call, x: torch.Tensor, axes: torch.Tensor) -> torch.Tensor:
    return _unsqueeze(x, _ints(axes))


@implements("Concat", 4, 11, 13)
def concat(call: Call, *inputs: torch.Tensor) -> torch.Tensor:
    return torch.cat(inputs, dim=call.attribute("axis"))


def _split(call: Call, x: torch.Tensor, sizes: list[int]) -> tuple[torch.Tensor, ...]:
    axis = call.attribute("axis", 0)
    count = len(call.node.outputs)
    if not sizes:
        parts = call.attribute("num_outputs") or count
        size = x.shape[axis]
        chunk = -(-size // parts)  # the last part is smaller where the size does not divide
        sizes = [min(chunk, size - i * chunk) for i in range(parts)]
    return torch.split(x, sizes, dim=axis)


@implements("Split", 2, 11)
def split_attribute(call: Call, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return _split(call, x, list(call.attribute("split", []) or []))


@implements("Split", 13, 18)
def split(call: Call, x: torch.Tensor, sizes: torch.Tensor | None = None) -> Any:
    return _split(call, x, _ints(sizes))


def _slice(x: torch.Tensor, starts: list[int], ends: list[int], axes: list[int], steps: list[int]):
    index: list[Any] = [slice(None)] * x.dim()
    flips = []
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        axis %= x.dim()
        size = x.shape[axis]
        if step == 0:
            raise TorchscanValueError("a step of 0")
        start = start + size if start < 0 else start
        end = end + size if end < 0 else end
        if step > 0:
            index[axis] = slice(min(max(start, 0), size), min(max(end, 0), size), step)
        else:  # read backwards: a slice of the flipped axis
            start = min(max(start, 0), size - 1)
            end = min(max(end, -1), size - 1)
            flips.append(axis)
            index[axis] = slice(size - 1 - start, size - 1 - end, -step)
    if flips:
        x = x.flip(flips)
    return x[tuple(index)]


@implements("Slice", 10, 11, 13)
def slice_(
    call: Call,
    x: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    axes: torch.Tensor | None = None,
    steps: torch.Tensor | None = None,
) -> torch.Tensor:
    begin, end = _ints(starts), _ints(ends)
    chosen = _ints(axes) if axes is not None else list(range(len(begin)))
    stride = _ints(steps) if steps is not None else [1] * len(begin)
    try:
        part = _slice(x, begin, end, chosen, stride)
    except TorchscanValueError as error:
        raise call.refuse(str(error)) from None
    # Traced, a copy: two slices of one tensor read by a branch would alias, which torch.cond
    # refuses (and a copy costs nothing in the exported graph).
    return part.clone() if _context.compiling() else part


@implements("Slice", 1)
def slice_1(call: Call, x: torch.Tensor) -> torch.Tensor:
    begin, end = list(call.attribute("starts")), list(call.attribute("ends"))
    chosen = list(call.attribute("axes") or range(len(begin)))
    return _slice(x, begin, end, chosen, [1] * len(begin))


@implements("Gather", 1, 11, 13)
def gather(call: Call, x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    axis = call.attribute("axis", 0) % x.dim()
    size = x.shape[axis]
    indices = torch.where(indices < 0, indices + size, indices).to(torch.int64)
    picked = x.index_select(axis, indices.reshape(-1))
    return picked.reshape((*x.shape[:axis], *indices.shape, *x.shape[axis + 1 :]))


@implements("GatherElements", 11, 13)
def gather_elements(call: Call, x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    axis = call.attribute("axis", 0) % x.dim()
    indices = torch.where(indices < 0, indices + x.shape[axis], indices).to(torch.int64)
    return torch.gather(x, axis, indices)


@implements("Shape", 1, 13, 15, 19, 21, 23, 24, 25)
def shape(call: Call, x: torch.Tensor) -> torch.Tensor:
    rank = x.dim()
    start, end = call.attribute("start", 0), call.attribute("end", rank)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return torch.tensor(list(x.shape[start:end]), dtype=torch.int64)


@implements("Size", 1, 13, 19, 21, 23, 24, 25)
def size(call: Call, x: torch.Tensor) -> torch.Tensor:
    return torch.tensor(x.numel(), dtype=torch.int64)


@implements("Expand", 8, 13)
def expand(call: Call, x: torch.Tensor, shape: torch.Tensor) -> torch.Tensor:
    return x.expand(torch.broadcast_shapes(x.shape, tuple(_ints(shape)))).clone()


@implements("Tile", 6, 13)
def tile(call: Call, x: torch.Tensor, repeats: torch.Tensor) -> torch.Tensor:
    return x.repeat(*_ints(repeats))


@implements("Where", 9, 16)
def where(call: Call, condition: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.where(condition, x, y)


@implements("Range", 11)
def range_(call: Call, start: torch.Tensor, limit: torch.Tensor, delta: torch.Tensor) -> Any:
    count = max(math.ceil((limit.item() - start.item()) / delta.item()), 0)
    return start + torch.arange(count, dtype=start.dtype) * delta


@implements("Dropout", 7, 10, 12, 13, 22)
def dropout(
    call: Call, x: torch.Tensor, ratio: Any = None, training: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    if training is not None and bool(training):
        raise call.refuse(
            "Dropout in training mode (a random mask) is not implemented", not_implemented=True
        )
    return x.clone(), torch.ones(x.shape, dtype=torch.bool)
