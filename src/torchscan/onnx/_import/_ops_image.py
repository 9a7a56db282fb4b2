"""``Resize``, in torch (``Upsample`` 7 and 9 are in :mod:`._ops_nn`; ``Upsample``-10 is
deprecated, and onnx.checker refuses it).

A resize is separable: each resized axis in turn, in the order of ``axes``, maps every output
position to a coordinate of the input (``coordinate_transformation_mode``), and computes the
output as a weighted sum of the input elements around it, gathered with ``index_select``:

- ``nearest``: one element, the coordinate rounded as ``nearest_mode`` says (any element type,
  copied as it is);
- ``linear``: the two elements around it; ``cubic``: the four, weighted by the cubic
  convolution of coefficient ``cubic_coeff_a`` (``exclude_outside`` renormalizes the weights of
  the elements inside the input);
- with ``antialias``, when an axis shrinks, the kernel is stretched by ``1 / scale`` and covers
  as many elements as it reaches, its weights normalized.

Positions outside the input read its edge elements, as ONNX's reference implementation does;
``tf_crop_and_resize`` gives ``extrapolation_value`` to outputs whose coordinate falls outside
the input. The weights are computed in float64 and the sum in the input's floating-point type
(float32 for float16 and bfloat16), so that the result is differentiable in the input; integer
inputs of ``linear`` and ``cubic`` are computed in float64, rounded half to even and saturated
to their type, as the reference does.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch

from torchscan.onnx._import._graph import Call
from torchscan.onnx._import._graph import ints as _ints
from torchscan.onnx._import._registry import implements

_COMMON = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize")
_COORDINATES: dict[int, tuple[str, ...]] = {
    11: (*_COMMON, "tf_half_pixel_for_nn"),
    13: _COMMON,
    18: _COMMON,
    19: (*_COMMON, "half_pixel_symmetric"),
}
"""The coordinate transformation modes of each version of ``Resize``."""

_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


@dataclasses.dataclass(frozen=True)
class _Options:
    """The attributes of a resize."""

    mode: str = "nearest"
    coordinates: str = "half_pixel"
    nearest_mode: str = "round_prefer_floor"
    a: float = -0.75
    exclude_outside: bool = False
    extrapolation_value: float = 0.0
    antialias: bool = False
    axes: tuple[int, ...] = ()
    policy: str = "stretch"


def _floats(values: torch.Tensor | None) -> list[float]:
    return [] if values is None else [float(v) for v in values.reshape(-1).tolist()]


def _source(
    mode: str,
    out: int,
    size: int,
    scale: float,
    roi: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The coordinate in the input (of ``size`` elements) of each of the ``out`` output
    positions of an axis, in float64, and for ``tf_crop_and_resize`` which fall outside it
    (``roi``: the start and end of the axis's region, in the type of the node's ``roi``, in
    which the reference rounds their products)."""
    y = torch.arange(out, dtype=torch.float64)
    width = scale * size  # the output's length before it is rounded down
    if mode == "asymmetric":
        return y / scale, None
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5, None
    if mode == "pytorch_half_pixel":  # 0 where the output has one element, as the spec says
        return ((y + 0.5) / scale - 0.5) if out > 1 else torch.zeros_like(y), None
    if mode == "tf_half_pixel_for_nn":
        return (y + 0.5) / scale, None
    if mode == "half_pixel_symmetric":
        offset = size / 2 * (1 - out / width)
        return offset + (y + 0.5) / scale - 0.5, None
    if mode == "align_corners":
        return (torch.zeros_like(y) if width == 1 else y * (size - 1) / (width - 1)), None
    # tf_crop_and_resize (the modes were checked by _options)
    start, end = roi[0], roi[1]
    if width == 1:
        x = torch.full_like(y, float((end - start) * (size - 1) / 2))
    else:
        x = y * float(end - start) * (size - 1) / (width - 1)
    x = x + float(start * (size - 1))
    return x, (x < 0) | (x > size - 1)


def _nearest(x: torch.Tensor, rounding: str, downsampling: bool) -> torch.Tensor:
    """The input element each coordinate ``x`` reads (before clamping to the input)."""
    floor = torch.floor(x)
    fraction = x - floor
    if rounding == "round_prefer_floor":
        picked = torch.where(fraction <= 0.5, floor, floor + 1)
    elif rounding == "round_prefer_ceil":
        picked = torch.where(fraction < 0.5, floor, floor + 1)
    elif rounding == "floor":
        picked = floor
    elif rounding == "ceil":
        picked = torch.ceil(x)
    else:  # "simple": Resize-10, as onnxruntime reads it (the modes were checked by _options)
        picked = torch.ceil(x) if downsampling else floor
    return picked.to(torch.int64)


def _cubic(distance: torch.Tensor, a: float) -> torch.Tensor:
    """The cubic convolution kernel of coefficient ``a`` at ``distance``."""
    d = distance.abs()
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return torch.where(d <= 1, near, torch.where(d < 2, far, torch.zeros_like(d)))


def _weights(
    mode: str, ratio: torch.Tensor, scale: float, antialias: bool, a: float
) -> tuple[torch.Tensor, int]:
    """The weights (one row per output position) of the elements ``start, start + 1, ...`` from
    the element left of each coordinate, ``ratio`` (in (0, 1]) before it, and ``start``."""
    if not antialias or scale >= 1:
        if mode == "linear":
            return torch.stack([1 - ratio, ratio], dim=1), 0
        taps = torch.arange(-1, 3, dtype=torch.float64)
        return _cubic(taps[None, :] - ratio[:, None], a), -1
    reach = 1 if mode == "linear" else 2
    start = math.floor(-reach / scale) + 1
    taps = torch.arange(start, 2 - start, dtype=torch.float64)
    distance = (taps[None, :] - ratio[:, None]) * scale
    weights = (1 - distance.abs()).clamp(0, 1) if mode == "linear" else _cubic(distance, a)
    return weights / weights.sum(dim=1, keepdim=True), start


def _resize_axis(
    call: Call,
    x: torch.Tensor,
    axis: int,
    out: int,
    scale: float,
    roi: torch.Tensor,
    options: _Options,
) -> torch.Tensor:
    """``x`` resized along ``axis`` to ``out`` elements."""
    size = x.shape[axis]
    if out == 0 or size == 0:
        shape = list(x.shape)
        shape[axis] = out
        if size == 0 and out:
            raise call.refuse(f"an axis of length 0 resized to {out}")
        return x.new_zeros(shape)
    mode = options.mode
    coordinates, outside = _source(options.coordinates, out, size, scale, roi)
    device = x.device
    if mode == "nearest":
        picked = _nearest(coordinates, options.nearest_mode, scale < 1)
        y = x.index_select(axis, picked.clamp(0, size - 1).to(device))
    else:
        left = torch.ceil(coordinates) - 1  # the element left of the coordinate, or before it
        ratio = coordinates - left
        weights, start = _weights(mode, ratio, scale, options.antialias, options.a)
        n = weights.shape[1]
        index = left.to(torch.int64)[:, None] + start + torch.arange(n)[None, :]
        if options.exclude_outside:
            weights = torch.where((index < 0) | (index >= size), 0.0, weights)
            total = weights.sum(dim=1, keepdim=True)
            weights = weights / torch.where(total == 0, 1.0, total)
        gathered = x.index_select(axis, index.clamp(0, size - 1).reshape(-1).to(device))
        gathered = gathered.unflatten(axis, (out, n))
        shape = [1] * gathered.dim()
        shape[axis], shape[axis + 1] = out, n
        y = (gathered * weights.to(device=device, dtype=x.dtype).reshape(shape)).sum(axis + 1)
    if outside is not None and bool(outside.any()):
        shape = [1] * y.dim()
        shape[axis] = out
        fill = torch.tensor(options.extrapolation_value, dtype=y.dtype, device=device)
        y = torch.where(outside.to(device).reshape(shape), fill, y)
    return y


def _resize(
    call: Call,
    x: torch.Tensor,
    roi: torch.Tensor | None,
    scales: Sequence[float],
    sizes: Sequence[int],
    options: _Options,
) -> torch.Tensor:
    """``x`` resized by ``scales`` or to ``sizes`` (of the axes ``options.axes``, or all)."""
    rank = x.dim()
    mode = options.mode
    if mode not in ("nearest", "linear", "cubic"):
        raise call.refuse(f"mode {mode!r} (one of 'nearest', 'linear', 'cubic')")
    axes = list(options.axes or range(rank))
    if any(not -rank <= a < rank for a in axes):
        raise call.refuse(f"axes {axes} are out of range for an input of rank {rank}")
    axes = [a % rank for a in axes]
    if len(set(axes)) != len(axes):
        raise call.refuse(f"axes {axes} repeat an axis")
    count = len(axes)
    if scales and sizes:
        raise call.refuse("both scales and sizes are given (only one may be)")
    if not scales and not sizes:
        raise call.refuse("neither scales nor sizes is given")
    given = scales or sizes
    if len(given) != count:
        name = "scales" if scales else "sizes"
        raise call.refuse(
            f"{name} {list(given)} do not give one value for each of the {count} resized axes"
        )
    bounds = [torch.tensor([0.0, 1.0], dtype=torch.float64)] * count
    if options.coordinates == "tf_crop_and_resize":
        if roi is None or roi.numel() != 2 * count:
            raise call.refuse(
                f"roi {_floats(roi)} does not give a start and an end for each of the {count} "
                "resized axes"
            )
        flat = roi.detach().reshape(-1).cpu()
        bounds = [flat[i::count] for i in range(count)]
    lengths = [x.shape[a] for a in axes]
    if scales:
        if any(s <= 0 for s in scales):
            raise call.refuse(f"scales {list(scales)} must be positive")
        factors = [float(s) for s in scales]
        outs = [int(s * n) for s, n in zip(factors, lengths, strict=True)]
    else:
        if any(s < 0 for s in sizes):
            raise call.refuse(f"sizes {list(sizes)} must not be negative")
        outs = list(sizes)
        factors = [o / n if n else 1.0 for o, n in zip(outs, lengths, strict=True)]
        policy = options.policy
        if policy in ("not_larger", "not_smaller"):
            kept = min(factors) if policy == "not_larger" else max(factors)
            factors = [kept] * count
            outs = [int(kept * n + 0.5) for n in lengths]
        elif policy != "stretch":
            raise call.refuse(
                f"keep_aspect_ratio_policy {policy!r} (one of 'stretch', 'not_larger', "
                "'not_smaller')"
            )
    dtype = x.dtype
    integral = not (dtype.is_floating_point or dtype.is_complex)
    if mode != "nearest":
        if dtype == torch.bool or dtype.is_complex:
            raise call.refuse(f"mode {mode!r} of a {dtype} tensor", not_implemented=True)
        if integral:
            x = x.to(torch.float64)
        elif dtype in (torch.float16, torch.bfloat16):
            x = x.float()
    for axis, out, factor, bound in zip(axes, outs, factors, bounds, strict=True):
        trivial = bound.tolist() == [0.0, 1.0] or options.coordinates != "tf_crop_and_resize"
        if math.isclose(factor, 1.0) and out == x.shape[axis] and trivial:
            continue  # (the reference leaves such an axis as it is)
        x = _resize_axis(call, x, axis, out, factor, bound, options)
    if integral and mode != "nearest":
        info = torch.iinfo(dtype)
        return torch.round(x).clamp(info.min, info.max).to(dtype)
    return x.to(dtype)


def _options(call: Call, version: int) -> _Options:
    """The attributes of a ``Resize`` of ``version`` (11 or later), checked."""
    coordinates = call.attribute("coordinate_transformation_mode", "half_pixel")
    if coordinates not in _COORDINATES[version]:
        raise call.refuse(
            f"coordinate_transformation_mode {coordinates!r} (Resize-{version} has "
            f"{', '.join(_COORDINATES[version])})"
        )
    nearest_mode = call.attribute("nearest_mode", "round_prefer_floor")
    if nearest_mode not in _NEAREST_MODES:
        raise call.refuse(f"nearest_mode {nearest_mode!r} (one of {', '.join(_NEAREST_MODES)})")
    return _Options(
        mode=call.attribute("mode", "nearest"),
        coordinates=coordinates,
        nearest_mode=nearest_mode,
        a=float(call.attribute("cubic_coeff_a", -0.75)),
        exclude_outside=bool(call.attribute("exclude_outside", 0)),
        extrapolation_value=float(call.attribute("extrapolation_value", 0.0)),
        antialias=bool(call.attribute("antialias", 0)),
        axes=tuple(int(a) for a in call.attribute("axes", []) or []),
        policy=call.attribute("keep_aspect_ratio_policy", "stretch"),
    )


@implements("Resize", 11, 13, 18, 19)
def resize(
    call: Call,
    x: torch.Tensor,
    roi: torch.Tensor | None = None,
    scales: torch.Tensor | None = None,
    sizes: torch.Tensor | None = None,
) -> torch.Tensor:
    options = _options(call, call.node.version)
    return _resize(call, x, roi, _floats(scales), _ints(sizes), options)


def _resize_10(call: Call, x: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Resize-10: modes ``nearest`` and ``linear``, coordinates ``asymmetric``; ``nearest``
    reads the element at the coordinate rounded down, or up where the axis shrinks, as
    onnxruntime does (the version defines no rounding)."""
    mode = call.attribute("mode", "nearest")
    if mode not in ("nearest", "linear"):
        raise call.refuse(f"mode {mode!r} (one of 'nearest', 'linear')")
    options = _Options(mode=mode, coordinates="asymmetric", nearest_mode="simple")
    return _resize(call, x, None, _floats(scales), [], options)


implements("Resize", 10)(_resize_10)
