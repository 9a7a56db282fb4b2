"""Operators that gather, scatter, select, sort and count by index (GatherND, ScatterND,
ScatterElements, TopK, Unique, ...), the reductions composed of others (ReduceL1, ReduceL2,
ReduceLogSum, ReduceLogSumExp, ReduceSumSquare), a few element-wise and matrix operators
(Shrink, Celu, Det, EyeLike) and the random generators, in torch.

torch moves no data of the unsigned types wider than 8 bits (no gather, scatter or index_select
of them), so the operators that only move or compare bits view those as the signed type of the
same width. The random operators draw from torch's generator, or from a generator of their own
seeded by their ``seed`` attribute (then every run of the node draws the same values); their
values cannot match another runtime's, only their shapes and types.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import cast

import torch

from torchscan import _context
from torchscan.onnx._import._graph import Call
from torchscan.onnx._import._graph import ints as _ints
from torchscan.onnx._import._registry import implements
from torchscan.onnx._import._types import torch_dtype

_SIGNED = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}
"""The unsigned types torch moves no data of, and the signed types of their width."""

_HALF = (torch.float16, torch.bfloat16)


def _bits(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a tensor torch can gather and scatter: the unsigned types of 16 to 64 bits
    viewed as the signed type of their width (same bits; undo with ``.view(x.dtype)``)."""
    signed = _SIGNED.get(x.dtype)
    return x if signed is None else x.view(signed)


def _unbits(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Undo :func:`_bits`: ``y`` viewed as ``dtype`` where it is not of it already (a view to
    another dtype has no gradient, so a floating tensor is left as it is)."""
    return y if y.dtype == dtype else y.view(dtype)


def _checking() -> bool:
    """Whether to check data-dependent rules (not while torch.compile or torch.export trace)."""
    return not _context.compiling()


def _axis(call: Call, axis: int, rank: int, name: str = "axis") -> int:
    if not -rank <= axis < rank:
        raise call.refuse(f"{name} {axis} is out of range for an input of rank {rank}")
    return axis % rank


def _wide(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32 where it is of a 16-bit floating-point type (computed more exactly)."""
    return x.float() if x.dtype in _HALF else x


# ---------------------------------------------------------------------------------------------
# Gather and scatter


@implements("GatherND", 11, 12, 13)
def gather_nd(call: Call, data: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Each index tuple of the last axis of ``indices`` picks an element or slice of ``data``
    (after its first ``batch_dims`` axes, which ``data`` and ``indices`` share)."""
    batch = call.attribute("batch_dims", 0)
    rank, depth = data.dim(), indices.shape[-1] if indices.dim() else 0
    if not 0 <= batch < min(rank, indices.dim()):
        raise call.refuse(
            f"batch_dims {batch} must be below the ranks of data ({rank}) and indices "
            f"({indices.dim()})"
        )
    if data.shape[:batch] != indices.shape[:batch]:
        raise call.refuse(
            f"the first {batch} dimensions of data {list(data.shape)} and indices "
            f"{list(indices.shape)} differ"
        )
    if not 1 <= depth <= rank - batch:
        raise call.refuse(
            f"indices.shape[-1] = {depth} must be in [1, {rank - batch}] (the rank of data "
            "after its batch dimensions)"
        )
    count = math.prod(data.shape[:batch])
    tuples = math.prod(indices.shape[batch:-1])
    source = _bits(data).reshape(count, *data.shape[batch:])
    index = indices.to(torch.int64).reshape(count, tuples, depth)
    rows = torch.arange(count).reshape(count, 1)
    picked = source[(rows, *index.unbind(-1))]  # torch wraps negative indices, checks bounds
    shape = (*indices.shape[:-1], *data.shape[batch + depth :])
    return _unbits(picked.reshape(shape), data.dtype)


def _linear_index(call: Call, indices: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """The flat position, in the leading ``len(shape)`` axes, of each index tuple of the last
    axis of ``indices`` (negative indices counted from the end; checked to be in range)."""
    linear = torch.zeros(indices.shape[:-1], dtype=torch.int64)
    for axis, size in enumerate(shape):
        column = indices[..., axis].to(torch.int64)
        column = torch.where(column < 0, column + size, column)
        if _checking() and bool(((column < 0) | (column >= size)).any()):
            raise call.refuse(f"an index along axis {axis} is out of range [-{size}, {size - 1}]")
        linear = linear * size + column
    return linear.reshape(-1)


_TORCH_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


def _scatter(
    data: torch.Tensor, axis: int, index: torch.Tensor, updates: torch.Tensor, reduction: str
) -> torch.Tensor:
    """``data`` with ``updates`` written at ``index`` along ``axis`` (``torch.scatter``), or
    combined with what is there by ``reduction`` (ONNX's add, mul, max or min)."""
    if reduction == "none":
        return _unbits(_bits(data).scatter(axis, index, _bits(updates)), data.dtype)
    signed = _SIGNED.get(data.dtype)
    if signed is None:
        return data.scatter_reduce(axis, index, updates, _TORCH_REDUCE[reduction])
    if reduction in ("add", "mul"):  # the same bits in two's complement
        out = data.view(signed).scatter_reduce(
            axis, index, updates.view(signed), _TORCH_REDUCE[reduction]
        )
        return out.view(data.dtype)
    # max, min: flipping the sign bit orders the unsigned values as signed ones
    flip = torch.iinfo(signed).min
    out = (data.view(signed) ^ flip).scatter_reduce(
        axis, index, updates.view(signed) ^ flip, _TORCH_REDUCE[reduction]
    )
    return (out ^ flip).view(data.dtype)


def _reduction(call: Call, allowed: tuple[str, ...]) -> str:
    reduction = call.attribute("reduction", "none")
    if reduction not in allowed:
        raise call.refuse(
            f"reduction {reduction!r} is not one of this version's {list(allowed)}",
        )
    return reduction


def _scatter_nd(allowed: tuple[str, ...]) -> Callable[..., torch.Tensor]:
    def run(
        call: Call, data: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor
    ) -> torch.Tensor:
        reduction = _reduction(call, allowed)
        depth = indices.shape[-1] if indices.dim() else 0
        if not 1 <= depth <= data.dim():
            raise call.refuse(f"indices.shape[-1] = {depth} must be in [1, {data.dim()}]")
        expected = (*indices.shape[:-1], *data.shape[depth:])
        if tuple(updates.shape) != expected:
            raise call.refuse(
                f"updates has shape {list(updates.shape)}, not {list(expected)} "
                "(indices.shape[:-1] + data.shape[indices.shape[-1]:])"
            )
        linear = _linear_index(call, indices, data.shape[:depth])
        inner = math.prod(data.shape[depth:])
        flat = data.reshape(math.prod(data.shape[:depth]), inner)
        index = linear.reshape(-1, 1).expand(linear.shape[0], inner)
        out = _scatter(flat, 0, index, updates.reshape(linear.shape[0], inner), reduction)
        return out.reshape(data.shape)

    return run


implements("ScatterND", 11, 13)(_scatter_nd(("none",)))
implements("ScatterND", 16)(_scatter_nd(("none", "add", "mul")))
implements("ScatterND", 18)(_scatter_nd(("none", "add", "mul", "max", "min")))


def _scatter_elements(allowed: tuple[str, ...]) -> Callable[..., torch.Tensor]:
    def run(
        call: Call, data: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor
    ) -> torch.Tensor:
        reduction = _reduction(call, allowed)
        axis = _axis(call, call.attribute("axis", 0), data.dim())
        if indices.shape != updates.shape or indices.dim() != data.dim():
            raise call.refuse(
                f"indices {list(indices.shape)} and updates {list(updates.shape)} must have "
                f"the same shape, of the rank of data ({data.dim()})"
            )
        size = data.shape[axis]
        index = indices.to(torch.int64)
        index = torch.where(index < 0, index + size, index)  # torch checks the bounds
        return _scatter(data, axis, index, updates, reduction)

    return run


implements("Scatter", 9, 11)(_scatter_elements(("none",)))
implements("ScatterElements", 11, 13)(_scatter_elements(("none",)))
implements("ScatterElements", 16)(_scatter_elements(("none", "add", "mul")))
implements("ScatterElements", 18)(_scatter_elements(("none", "add", "mul", "max", "min")))


# ---------------------------------------------------------------------------------------------
# Selection, sorting, counting


@implements("NonZero", 9, 13)
def non_zero(call: Call, x: torch.Tensor) -> torch.Tensor:
    """The indices of the non-zero elements, one column each, in row-major order (``[0, n]``
    for a 0-d input)."""
    return torch.nonzero(_bits(x) != 0).t()


@implements("Compress", 9, 11, 28)
def compress(call: Call, x: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
    """The slices along ``axis`` (of the flattened input without one) whose ``condition`` is
    true, as ``numpy.compress``: a shorter condition selects among the first slices only."""
    chosen = torch.nonzero(condition.reshape(-1)).reshape(-1)
    axis = call.attribute("axis")
    source = _bits(x)
    if axis is None:
        return _unbits(source.reshape(-1).index_select(0, chosen), x.dtype)
    axis = _axis(call, axis, x.dim())
    return _unbits(source.index_select(axis, chosen), x.dtype)


def _top_k(
    call: Call, x: torch.Tensor, k: int, axis: int, largest: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest (or smallest) values along ``axis`` and their indices, in order, the
    lower index first among equal values (a stable sort)."""
    if x.dim() == 0:
        raise call.refuse("TopK of a 0-d input")
    dim = _axis(call, axis, x.dim())
    if not _checking():  # k may be traced from a tensor
        torch._check(k >= 0)
        torch._check(k <= x.shape[dim])
    elif not 0 <= k <= x.shape[dim]:
        raise call.refuse(f"k = {k} is not in [0, {x.shape[dim]}] (the size of axis {axis})")
    if _context.compiling():  # (exported as a TopK, which keeps ties in index order)
        return torch.topk(x, k, dim=dim, largest=largest, sorted=True)
    values, indices = torch.sort(x, dim=dim, descending=largest, stable=True)
    return values.narrow(dim, 0, k), indices.narrow(dim, 0, k)


@implements("TopK", 1)
def top_k_1(call: Call, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _top_k(call, x, call.attribute("k"), call.attribute("axis", -1), largest=True)


def _k(call: Call, k: torch.Tensor) -> int:
    if k.numel() != 1:
        raise call.refuse(f"K has {k.numel()} elements, not one")
    return cast(int, k.reshape(()).to(torch.int64).item())  # no int(): k may be traced


@implements("TopK", 10)
def top_k_10(call: Call, x: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _top_k(call, x, _k(call, k), call.attribute("axis", -1), largest=True)


@implements("TopK", 11, 24)
def top_k(call: Call, x: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``sorted=0`` leaves the order to the implementation: the values come sorted anyway."""
    largest = bool(call.attribute("largest", 1))
    return _top_k(call, x, _k(call, k), call.attribute("axis", -1), largest)


def _one_hot(wrap: bool) -> Callable[..., torch.Tensor]:
    def run(
        call: Call, indices: torch.Tensor, depth: torch.Tensor, values: torch.Tensor
    ) -> torch.Tensor:
        if depth.numel() != 1 or values.numel() != 2:
            raise call.refuse(
                f"depth must have one element ({depth.numel()} given) and values two "
                f"([off_value, on_value]; {values.numel()} given)"
            )
        size = cast(int, depth.reshape(()).to(torch.int64).item())
        if not _checking():  # depth may be traced from a tensor
            torch._check(size >= 0)
        elif size < 0:
            raise call.refuse(f"depth {size} is negative")
        rank = indices.dim() + 1
        axis = _axis(call, call.attribute("axis", -1), rank)
        index = indices.to(torch.int64)  # as onnxruntime, fractions truncated
        if wrap:
            index = torch.where(index < 0, index + size, index)
        hot = index.unsqueeze(-1) == torch.arange(size)  # out of range: all off
        off, on = values.reshape(2).unbind()
        return torch.where(hot.movedim(-1, axis), on, off)

    return run


implements("OneHot", 9)(_one_hot(wrap=False))  # indices in [0, depth)
implements("OneHot", 11, 28)(_one_hot(wrap=True))  # indices in [-depth, depth - 1]


def _hardmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    """1 at the first maximum along ``dim``, 0 elsewhere."""
    if x.numel() == 0:
        return x.clone()
    first = torch.argmax(x, dim=dim, keepdim=True)
    return torch.zeros_like(x).scatter(dim, first, 1)


@implements("Hardmax", 1, 11)
def hardmax_coerced(call: Call, x: torch.Tensor) -> torch.Tensor:
    """Hardmax before version 13: along each row of the input seen as a matrix of
    ``prod(shape[:axis])`` rows."""
    axis = _axis(call, call.attribute("axis", 1), max(x.dim(), 1))
    if x.numel() == 0:
        return x.clone()
    rows = math.prod(x.shape[:axis])
    return _hardmax(x.reshape(rows, -1), 1).reshape(x.shape)


@implements("Hardmax", 13)
def hardmax(call: Call, x: torch.Tensor) -> torch.Tensor:
    return _hardmax(x, _axis(call, call.attribute("axis", -1), x.dim()))


@implements("Unique", 11, 28)
def unique(
    call: Call, x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The unique elements (or slices along ``axis``), ascending or (``sorted=0``) in the
    order of their first occurrence, the index of that occurrence, the index in the first
    output of every element (slice) of the input, and the count of each."""
    axis = call.attribute("axis")
    if axis is None:
        dim, source = 0, x.reshape(-1)
        values, inverse, counts = torch.unique(source, return_inverse=True, return_counts=True)
    else:
        dim, source = _axis(call, axis, x.dim()), x
        values, inverse, counts = torch.unique(x, dim=dim, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    length, found = source.shape[dim], counts.shape[0]
    first = torch.full((found,), length, dtype=torch.int64).scatter_reduce(
        0, inverse, torch.arange(length), "amin"
    )
    if not call.attribute("sorted", 1):
        order = torch.argsort(first)
        rank = torch.empty_like(order).scatter(0, order, torch.arange(found))
        values = _unbits(_bits(values).index_select(dim, order), x.dtype)
        first, counts = first[order], counts[order]
        inverse = rank[inverse]
    return values, first, inverse, counts


@implements("ReverseSequence", 10, 28)
def reverse_sequence(call: Call, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Along ``time_axis``, the first ``sequence_lens[i]`` elements of each batch entry ``i``
    reversed, the others copied."""
    time, batch = call.attribute("time_axis", 0), call.attribute("batch_axis", 1)
    if {time, batch} != {0, 1} or x.dim() < 2:
        raise call.refuse(
            f"time_axis {time} and batch_axis {batch} must be 0 and 1, of an input of rank 2 "
            f"or more (rank {x.dim()})"
        )
    steps = x.shape[time]
    lengths = lengths.to(torch.int64).reshape(-1)
    if lengths.shape[0] != x.shape[batch]:
        raise call.refuse(
            f"sequence_lens has {lengths.shape[0]} lengths for a batch of {x.shape[batch]}"
        )
    if _checking() and bool(((lengths < 0) | (lengths > steps)).any()):
        raise call.refuse(f"a sequence length is out of [0, {steps}]")
    t = torch.arange(steps).reshape(steps, 1)
    source = torch.where(t < lengths, lengths - 1 - t, t)  # [time, batch]
    moved = _bits(x).movedim((time, batch), (0, 1))
    index = source.reshape(*source.shape, *([1] * (x.dim() - 2))).expand(moved.shape)
    out = torch.gather(moved, 0, index).movedim((0, 1), (time, batch))
    return _unbits(out.contiguous(), x.dtype)


# ---------------------------------------------------------------------------------------------
# Reductions composed of others


def _l1(call: Call, x: torch.Tensor, dims: tuple[int, ...], keep: bool) -> torch.Tensor:
    if x.dtype in _SIGNED:  # |x| = x, and the sum the same in two's complement
        return _l1(call, x.view(_SIGNED[x.dtype]), dims, keep).view(x.dtype)
    if x.dtype == torch.bool:
        raise call.refuse("a reduction of bool tensors")
    magnitude = _wide(x).abs()
    if not dims:
        return magnitude.to(x.dtype)
    return torch.sum(magnitude, dim=dims, keepdim=keep, dtype=magnitude.dtype).to(x.dtype)


def _sum_square(call: Call, x: torch.Tensor, dims: tuple[int, ...], keep: bool) -> torch.Tensor:
    if x.dtype in _SIGNED:  # the same bits in two's complement
        return _sum_square(call, x.view(_SIGNED[x.dtype]), dims, keep).view(x.dtype)
    if x.dtype == torch.bool:
        raise call.refuse("a reduction of bool tensors")
    wide = _wide(x)
    square = wide * wide
    if not dims:
        return square.to(x.dtype)
    return torch.sum(square, dim=dims, keepdim=keep, dtype=square.dtype).to(x.dtype)


def _l2(call: Call, x: torch.Tensor, dims: tuple[int, ...], keep: bool) -> torch.Tensor:
    """The square root of the sum of squares; of integers, the square root (truncated) of
    their sum of squares in their type, as onnxruntime computes it."""
    if x.is_floating_point():
        wide = _wide(x)
        if not dims:
            return wide.abs().to(x.dtype)
        return torch.sqrt(torch.sum(wide * wide, dim=dims, keepdim=keep)).to(x.dtype)
    total = _sum_square(call, x, dims, keep)
    return torch.sqrt(total.to(torch.float64)).to(x.dtype)


def _float_only(call: Call, x: torch.Tensor) -> None:
    if not x.is_floating_point():
        raise call.refuse(
            f"{call.node.op_type} of {str(x.dtype).removeprefix('torch.')} (a logarithm of "
            "integers, which onnx's reference refuses and opset 28 no longer allows)",
            not_implemented=True,
        )


def _log_sum(call: Call, x: torch.Tensor, dims: tuple[int, ...], keep: bool) -> torch.Tensor:
    _float_only(call, x)
    wide = _wide(x)
    total = wide if not dims else torch.sum(wide, dim=dims, keepdim=keep)
    return torch.log(total).to(x.dtype)  # over no element: log(0) = -inf


def _log_sum_exp(call: Call, x: torch.Tensor, dims: tuple[int, ...], keep: bool) -> torch.Tensor:
    _float_only(call, x)
    if not dims:  # log(exp(x)) = x
        return x.clone()
    return torch.logsumexp(_wide(x), dim=dims, keepdim=keep).to(x.dtype)  # none: -inf


_Reducer = Callable[[Call, torch.Tensor, tuple[int, ...], bool], torch.Tensor]


def _composite(reducer: _Reducer, axes_input: bool) -> Callable[..., torch.Tensor]:
    """A reduction, its axes an attribute (``axes_input`` false) or an input; over no axis
    (``noop_with_empty_axes``) only its element-wise steps, as ONNX specifies."""

    def run(call: Call, x: torch.Tensor, axes: torch.Tensor | None = None) -> torch.Tensor:
        keep = bool(call.attribute("keepdims", 1))
        if axes_input:
            chosen = _ints(axes)
            if not chosen and call.attribute("noop_with_empty_axes", 0):
                return reducer(call, x, (), keep)
        else:
            chosen = list(call.attribute("axes", []) or [])
        rank = x.dim()
        if not chosen:
            dims = tuple(range(rank))
        else:
            dims = tuple(sorted({_axis(call, a, rank, "an axis") for a in chosen}))
        return reducer(call, x, dims, keep)

    return run


_COMPOSITES: dict[str, tuple[_Reducer, tuple[int, ...], tuple[int, ...]]] = {
    # the reduction, the versions of its axes attribute, those of its axes input
    "ReduceL1": (_l1, (1, 11, 13), (18,)),
    "ReduceL2": (_l2, (1, 11, 13), (18,)),
    "ReduceSumSquare": (_sum_square, (1, 11, 13), (18,)),
    "ReduceLogSum": (_log_sum, (1, 11, 13), (18, 28)),
    "ReduceLogSumExp": (_log_sum_exp, (1, 11, 13), (18, 28)),
}
for _name, (_reducer, _attribute_versions, _input_versions) in _COMPOSITES.items():
    implements(_name, *_attribute_versions)(_composite(_reducer, axes_input=False))
    implements(_name, *_input_versions)(_composite(_reducer, axes_input=True))


# ---------------------------------------------------------------------------------------------
# Element-wise and matrix operators


@implements("Shrink", 9)
def shrink(call: Call, x: torch.Tensor) -> torch.Tensor:
    """``x + bias`` below ``-lambd``, ``x - bias`` above ``lambd``, 0 between (in the input's
    type: integers truncated)."""
    lambd, bias = call.attribute("lambd", 0.5), call.attribute("bias", 0.0)
    wide = x.to(torch.float64) if not x.is_floating_point() else x
    zero = torch.zeros((), dtype=wide.dtype)
    y = torch.where(wide < -lambd, wide + bias, torch.where(wide > lambd, wide - bias, zero))
    return y.to(x.dtype)


@implements("Celu", 12, 28)
def celu(call: Call, x: torch.Tensor) -> torch.Tensor:
    return torch.celu(x, alpha=call.attribute("alpha", 1.0))


@implements("Det", 11, 22)
def det(call: Call, x: torch.Tensor) -> torch.Tensor:
    return torch.linalg.det(_wide(x)).to(x.dtype)


@implements("EyeLike", 9, 22)
def eye_like(call: Call, x: torch.Tensor) -> torch.Tensor:
    """Ones on the ``k``-th diagonal of a matrix of the input's shape, of type ``dtype`` (or the
    input's)."""
    if x.dim() != 2:
        raise call.refuse(f"EyeLike of an input of rank {x.dim()} (it must be 2)")
    code = call.attribute("dtype")
    dtype = x.dtype if code is None else torch_dtype(code)
    if dtype is None:
        raise call.refuse(
            f"an output of element type {code}, which torch lacks", not_implemented=True
        )
    rows, columns = x.shape
    diagonal = torch.arange(columns) - torch.arange(rows).reshape(rows, 1)
    return (diagonal == call.attribute("k", 0)).to(dtype)


# ---------------------------------------------------------------------------------------------
# Random generators


def _generator(call: Call) -> torch.Generator | None:
    """A generator seeded by the ``seed`` attribute (a float: its integer value, or its bits
    where it has a fraction), or ``None`` (torch's own) without one."""
    seed = call.attribute("seed")
    if seed is not None and _context.compiling():
        raise call.refuse(
            "torch.export cannot trace it: its seed makes every run draw the same values, from a "
            "generator of its own, which torch.onnx does not export. The module runs it "
            "eagerly.",
            not_implemented=True,
        )
    if seed is None:
        return None
    seed = float(seed)
    if seed.is_integer() and abs(seed) < 2**63:
        number = int(seed)
    else:
        number = struct.unpack("<q", struct.pack("<d", seed))[0]
    return torch.Generator().manual_seed(number)


def _float_type(call: Call, code: int | None, default: torch.dtype) -> torch.dtype:
    dtype = default if code is None else torch_dtype(code)
    if dtype is None or not dtype.is_floating_point:
        name = code if dtype is None else str(dtype).removeprefix("torch.")
        raise call.refuse(
            f"an output of element type {name} (random values are drawn as floating point)",
            not_implemented=dtype is None,
        )
    return dtype


def _drawn(dtype: torch.dtype) -> torch.dtype:
    """The type to draw in: float64 for float64, float32 for the others (then cast)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _normal(call: Call, shape: list[int], dtype: torch.dtype) -> torch.Tensor:
    mean, scale = call.attribute("mean", 0.0), call.attribute("scale", 1.0)
    drawn = torch.randn(shape, dtype=_drawn(dtype), generator=_generator(call))
    return (drawn * scale + mean).to(dtype)


def _uniform(call: Call, shape: list[int], dtype: torch.dtype) -> torch.Tensor:
    low, high = call.attribute("low", 0.0), call.attribute("high", 1.0)
    drawn = torch.rand(shape, dtype=_drawn(dtype), generator=_generator(call))
    return (drawn * (high - low) + low).to(dtype)


def _shape(call: Call) -> list[int]:
    shape = call.attribute("shape")
    if shape is None:
        raise call.refuse("the attribute shape is missing")
    return [int(n) for n in shape]


@implements("RandomNormal", 1, 22)
def random_normal(call: Call) -> torch.Tensor:
    return _normal(call, _shape(call), _float_type(call, call.attribute("dtype"), torch.float32))


@implements("RandomUniform", 1, 22)
def random_uniform(call: Call) -> torch.Tensor:
    return _uniform(call, _shape(call), _float_type(call, call.attribute("dtype"), torch.float32))


@implements("RandomNormalLike", 1, 22)
def random_normal_like(call: Call, x: torch.Tensor) -> torch.Tensor:
    return _normal(call, list(x.shape), _float_type(call, call.attribute("dtype"), x.dtype))


@implements("RandomUniformLike", 1, 22)
def random_uniform_like(call: Call, x: torch.Tensor) -> torch.Tensor:
    return _uniform(call, list(x.shape), _float_type(call, call.attribute("dtype"), x.dtype))


@implements("Bernoulli", 15, 22)
def bernoulli(call: Call, p: torch.Tensor) -> torch.Tensor:
    """1 with probability ``p``, else 0, of type ``dtype`` (or the input's)."""
    code = call.attribute("dtype")
    dtype = p.dtype if code is None else torch_dtype(code)
    if dtype is None:
        raise call.refuse(
            f"an output of element type {code}, which torch lacks", not_implemented=True
        )
    drawn = torch.bernoulli(p.to(_drawn(p.dtype)), generator=_generator(call))
    return drawn.to(dtype)


@implements("Multinomial", 7, 22)
def multinomial(call: Call, x: torch.Tensor) -> torch.Tensor:
    """``sample_size`` draws (with replacement) for each row of unnormalized
    log-probabilities, as int32 (``dtype`` 6, the default) or int64 (7)."""
    code = call.attribute("dtype", 6)
    dtype = {6: torch.int32, 7: torch.int64}.get(code)
    if dtype is None:
        raise call.refuse(f"dtype {code} (the output must be int32 or int64)")
    if x.dim() != 2:
        raise call.refuse(f"the input has rank {x.dim()}, not 2 ([batch_size, class_size])")
    probabilities = torch.softmax(x.to(_drawn(x.dtype)), dim=1)
    drawn = torch.multinomial(
        probabilities,
        call.attribute("sample_size", 1),
        replacement=True,
        generator=_generator(call),
    )
    return drawn.to(dtype)
