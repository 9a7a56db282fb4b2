"""The neural-network operators, in torch: convolutions, pooling, the normalizations, padding,
the depth/space rearrangements, ``Upsample`` (mode ``nearest``), and the recurrent layers
(``RNN``, ``GRU``, ``LSTM``), whose time loop is a :func:`torchscan.scan`.

Convolutions and pools take ONNX's padding as it is written (asymmetric, ``auto_pad``), padding
the input first where torch's symmetric ``padding`` cannot say it; the pools run over windows
that ``Tensor.unfold`` cuts, so that every combination of ``pads``, ``strides``, ``dilations``
and ``ceil_mode`` is computed as ONNX defines it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from torchscan._scan import scan
from torchscan.onnx._import._graph import Call
from torchscan.onnx._import._graph import ints as _ints
from torchscan.onnx._import._registry import implements


def _floats(values: torch.Tensor | None) -> list[float]:
    return [] if values is None else [float(v) for v in values.reshape(-1).tolist()]


def _per_axis(call: Call, name: str, count: int, default: int) -> list[int]:
    given = call.attribute(name)
    return [int(v) for v in given] if given else [default] * count


def _torch_pads(begins: Sequence[int], ends: Sequence[int]) -> list[int]:
    """ONNX's pads of the trailing axes as ``F.pad`` reads them (last axis first)."""
    flat: list[int] = []
    for begin, end in zip(reversed(begins), reversed(ends), strict=True):
        flat += [begin, end]
    return flat


# ---------------------------------------------------------------------------------------------
# Padding of convolutions and pools


_OLD_AUTO_PAD = {("Conv", 1), ("MaxPool", 1), ("MaxPool", 8), ("MaxPool", 10), ("MaxPool", 11)}
_OLD_AUTO_PAD |= {("AveragePool", 1), ("AveragePool", 7), ("AveragePool", 10)}
"""The versions whose ``SAME_*`` pads the input "so that the output spatial size matches the
input", which agrees with ``ceil(input / stride)`` only for strides of 1."""


def _pads(
    call: Call,
    sizes: Sequence[int],
    kernels: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
) -> tuple[list[int], list[int]]:
    """The pads at the beginning and at the end of every spatial axis, from ``pads`` or
    ``auto_pad`` (``SAME_*``: the output is ``ceil(size / stride)``, the odd element of padding
    at the end for ``SAME_UPPER``, at the beginning for ``SAME_LOWER``)."""
    count = len(sizes)
    auto_pad = call.attribute("auto_pad", "NOTSET")
    if auto_pad == "NOTSET":
        pads = _per_axis(call, "pads", 2 * count, 0)
        if len(pads) != 2 * count:
            raise call.refuse(f"pads {pads} do not give 2 values for each of {count} axes")
        return pads[:count], pads[count:]
    if auto_pad == "VALID":
        return [0] * count, [0] * count
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise call.refuse(f"auto_pad {auto_pad!r}")
    if (call.node.op_type, call.node.version) in _OLD_AUTO_PAD and any(s != 1 for s in strides):
        raise call.refuse(
            f"auto_pad {auto_pad} with strides {list(strides)}: this version defines the output "
            "size only as the input's",
            not_implemented=True,
        )
    begins, ends = [], []
    for size, kernel, stride, dilation in zip(sizes, kernels, strides, dilations, strict=True):
        out = -(-size // stride)
        total = max((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
        small, large = total // 2, total - total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else large)
        ends.append(large if auto_pad == "SAME_UPPER" else small)
    return begins, ends


# ---------------------------------------------------------------------------------------------
# Convolutions

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_TRANSPOSE = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def _spatial_rank(call: Call, x: torch.Tensor) -> int:
    rank = x.dim() - 2
    if rank not in (1, 2, 3):
        raise call.refuse(
            f"a {call.node.op_type} of {rank} spatial axes (torch has 1 to 3)",
            not_implemented=True,
        )
    return rank


@implements("Conv", 1, 11, 22)
def conv(
    call: Call, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None
) -> torch.Tensor:
    rank = _spatial_rank(call, x)
    kernels = list(w.shape[2:])
    strides = _per_axis(call, "strides", rank, 1)
    dilations = _per_axis(call, "dilations", rank, 1)
    begins, ends = _pads(call, list(x.shape[2:]), kernels, strides, dilations)
    padding = begins
    if begins != ends:  # torch pads both sides alike: pad first
        x = F.pad(x, _torch_pads(begins, ends))
        padding = [0] * rank
    return _CONV[rank](x, w, b, strides, padding, dilations, call.attribute("group", 1))


@implements("ConvTranspose", 11, 22)
def conv_transpose(
    call: Call, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None
) -> torch.Tensor:
    """The full transposed convolution (no padding), then cut to the output: ``pads`` remove
    from it, ``output_padding`` and a larger ``output_shape`` add zeros (and the bias)."""
    rank = _spatial_rank(call, x)
    sizes = list(x.shape[2:])
    kernels = list(w.shape[2:])
    strides = _per_axis(call, "strides", rank, 1)
    dilations = _per_axis(call, "dilations", rank, 1)
    extra = _per_axis(call, "output_padding", rank, 0)
    full = [
        s * (n - 1) + (k - 1) * d + 1
        for n, k, s, d in zip(sizes, kernels, strides, dilations, strict=True)
    ]
    auto_pad = call.attribute("auto_pad", "NOTSET")
    output_shape = list(call.attribute("output_shape") or [])
    if len(output_shape) == rank + 2:  # written with the batch and channel axes
        output_shape = output_shape[2:]
    if output_shape or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if not output_shape:
            output_shape = [n * s for n, s in zip(sizes, strides, strict=True)]
        if len(output_shape) != rank:
            raise call.refuse(f"output_shape {output_shape} for {rank} spatial axes")
        begins = []
        for f, e, out in zip(full, extra, output_shape, strict=True):
            total = f + e - out
            begins.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
        outs = output_shape
    elif auto_pad == "VALID":
        begins = [0] * rank
        outs = [f + e for f, e in zip(full, extra, strict=True)]
    elif auto_pad == "NOTSET":
        pads = _per_axis(call, "pads", 2 * rank, 0)
        if len(pads) != 2 * rank:
            raise call.refuse(f"pads {pads} do not give 2 values for each of {rank} axes")
        begins = pads[:rank]
        outs = [
            f + e - pb - pe for f, e, pb, pe in zip(full, extra, begins, pads[rank:], strict=True)
        ]
    else:
        raise call.refuse(f"auto_pad {auto_pad!r}")
    y = _CONV_TRANSPOSE[rank](x, w, None, strides, 0, 0, call.attribute("group", 1), dilations)
    ends = [o + p - f for o, p, f in zip(outs, begins, full, strict=True)]
    y = F.pad(y, _torch_pads([-p for p in begins], ends))  # cut (negative) or add zeros
    if b is not None:
        y = y + b.reshape(-1, *[1] * rank)
    return y


# ---------------------------------------------------------------------------------------------
# Pools


def _lowest(dtype: torch.dtype) -> float | int:
    if dtype.is_floating_point:
        return -math.inf
    return torch.iinfo(dtype).min


def _windows(
    x: torch.Tensor,
    begins: Sequence[int],
    ends: Sequence[int],
    outs: Sequence[int],
    kernels: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    value: float | int,
    beyond: float | int,
) -> torch.Tensor:
    """Every pooling window of ``x`` (``N, C, *spatial``), as ``N, C, *outs, window``: ``x``
    padded with ``value`` by ``begins`` and ``ends``, then with ``beyond`` where the last
    windows (``ceil_mode``) reach past that."""
    rank = len(kernels)
    x = F.pad(x, _torch_pads(begins, ends), value=value)
    spans = [(k - 1) * d + 1 for k, d in zip(kernels, dilations, strict=True)]
    more = [
        max((o - 1) * s + span - n, 0)
        for o, s, span, n in zip(outs, strides, spans, x.shape[2:], strict=True)
    ]
    if any(more):
        x = F.pad(x, _torch_pads([0] * rank, more), value=beyond)
    for axis, (span, stride, out) in enumerate(zip(spans, strides, outs, strict=True)):
        x = x.unfold(2 + axis, span, stride).narrow(2 + axis, 0, out)
    x = x[(..., *[slice(None, None, d) for d in dilations])]
    return x.flatten(-rank)


def _pool_geometry(
    call: Call, x: torch.Tensor, dilated: bool
) -> tuple[list[int], list[int], list[int], list[int], list[int], list[int]]:
    """``kernels, strides, dilations, begins, ends, outs`` of a pool."""
    rank = x.dim() - 2
    if rank < 1:
        raise call.refuse(f"a {call.node.op_type} of a tensor of rank {x.dim()}")
    kernels = [int(k) for k in call.attribute("kernel_shape")]
    strides = _per_axis(call, "strides", rank, 1)
    dilations = _per_axis(call, "dilations", rank, 1) if dilated else [1] * rank
    sizes = list(x.shape[2:])
    begins, ends = _pads(call, sizes, kernels, strides, dilations)
    ceil_mode = call.attribute("ceil_mode", 0)
    outs = []
    for n, k, s, d, pb, pe in zip(sizes, kernels, strides, dilations, begins, ends, strict=True):
        span = n + pb + pe - (k - 1) * d - 1
        if ceil_mode:
            out = -(-span // s) + 1
            if (out - 1) * s >= n + pb:  # the last window starts in the padding at the end
                out -= 1
        else:
            out = span // s + 1
        outs.append(out)
    return kernels, strides, dilations, begins, ends, outs


@implements("MaxPool", 1, 8, 10, 11, 12, 22)
def max_pool(call: Call, x: torch.Tensor) -> Any:
    """The maximum of every window; ``Indices`` (MaxPool-8 and later) is the position of the
    first maximum in the flattened input (``storage_order=1``: its spatial axes column-major)."""
    kernels, strides, dilations, begins, ends, outs = _pool_geometry(call, x, dilated=True)
    lowest = _lowest(x.dtype)
    values = _windows(x, begins, ends, outs, kernels, strides, dilations, lowest, lowest)
    y = values.amax(-1)
    outputs = call.node.outputs
    if len(outputs) < 2 or not outputs[1]:
        return y
    spatial = list(x.shape[2:])
    plane = math.prod(spatial)
    positions = torch.arange(plane, dtype=torch.int64, device=x.device)
    if call.attribute("storage_order", 0):
        order = list(range(len(spatial)))[::-1]
        positions = positions.reshape(spatial[::-1]).permute(order)
    positions = positions.reshape(1, 1, *spatial)
    where = _windows(positions, begins, ends, outs, kernels, strides, dilations, -1, -1)
    first = values.argmax(-1, keepdim=True)
    indices = torch.gather(where.expand(*values.shape), -1, first).squeeze(-1)
    offsets = torch.arange(x.shape[0] * x.shape[1], dtype=torch.int64, device=x.device) * plane
    indices = indices + offsets.reshape(x.shape[0], x.shape[1], *[1] * len(spatial))
    return y, indices


@implements("AveragePool", 1, 7, 10, 11, 19, 22)
def average_pool(call: Call, x: torch.Tensor) -> torch.Tensor:
    """The mean of every window, over its input elements only, or (``count_include_pad=1``)
    over the elements of ``pads`` too; never over what ``ceil_mode`` adds beyond them."""
    kernels, strides, dilations, begins, ends, outs = _pool_geometry(call, x, dilated=True)
    geometry = (begins, ends, outs, kernels, strides, dilations)
    sums = _windows(x, *geometry, 0, 0).sum(-1)
    ones = torch.ones((1, 1, *x.shape[2:]), dtype=x.dtype, device=x.device)
    include = 1 if call.attribute("count_include_pad", 0) else 0
    counts = _windows(ones, *geometry, include, 0).sum(-1)
    return sums / counts


@implements("GlobalAveragePool", 1, 22)
def global_average_pool(call: Call, x: torch.Tensor) -> torch.Tensor:
    return x.mean(dim=tuple(range(2, x.dim())), keepdim=True)


@implements("GlobalMaxPool", 1, 22)
def global_max_pool(call: Call, x: torch.Tensor) -> torch.Tensor:
    return x.amax(dim=tuple(range(2, x.dim())), keepdim=True)


# ---------------------------------------------------------------------------------------------
# Normalizations


def _channels(value: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A per-channel (``C``) or per-activation (``C, D1, ...``) tensor, broadcast over ``x``'s
    batch axis (and its spatial axes)."""
    if x.dim() < 2:
        return value
    if value.dim() == 1:
        return value.reshape(-1, *[1] * (x.dim() - 2))
    return value


@implements("BatchNormalization", 1, 6, 7, 9, 14, 15)
def batch_normalization(
    call: Call,
    x: torch.Tensor,
    scale: torch.Tensor,
    b: torch.Tensor,
    mean: torch.Tensor,
    var: torch.Tensor,
) -> torch.Tensor:
    """Inference: the given (running) mean and variance. Training (BatchNormalization-14 and
    later's ``training_mode=1``, before that ``is_test=0`` or the statistics' outputs) is
    refused."""
    version = call.node.version
    if version < 7 and not call.attribute("is_test", 0):
        raise call.refuse("training (is_test=0)", not_implemented=True)
    if version >= 14 and call.attribute("training_mode", 0):
        raise call.refuse("training (training_mode=1)", not_implemented=True)
    if version < 14 and any(call.node.outputs[1:]):
        raise call.refuse("training (the outputs of the statistics)", not_implemented=True)
    epsilon = call.attribute("epsilon", 1e-5)
    inverse = _channels(scale, x) / torch.sqrt(_channels(var, x) + epsilon)
    return (x - _channels(mean, x)) * inverse + _channels(b, x)


@implements("InstanceNormalization", 1, 6, 22)
def instance_normalization(
    call: Call, x: torch.Tensor, scale: torch.Tensor, b: torch.Tensor
) -> torch.Tensor:
    axes = tuple(range(2, x.dim()))
    mean = x.mean(dim=axes, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=axes, keepdim=True)
    normalized = (x - mean) / torch.sqrt(var + call.attribute("epsilon", 1e-5))
    return normalized * _channels(scale, x) + _channels(b, x)


@implements("LpNormalization", 1, 22)
def lp_normalization(call: Call, x: torch.Tensor) -> torch.Tensor:
    p = call.attribute("p", 2)
    axis = call.attribute("axis", -1)
    if p == 1:
        norm = x.abs().sum(dim=axis, keepdim=True)
    elif p == 2:
        norm = torch.sqrt((x * x).sum(dim=axis, keepdim=True))
    else:
        raise call.refuse(f"p={p} (the specification allows 1 and 2)")
    return torch.where(norm == 0, torch.zeros_like(x), x / norm)  # 0 / 0 is 0


@implements("MeanVarianceNormalization", 9, 13)
def mean_variance_normalization(call: Call, x: torch.Tensor) -> torch.Tensor:
    """``(x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9)``, as the operator's function body."""
    axes = tuple(int(a) for a in call.attribute("axes", [0, 2, 3]))
    mean = x.mean(dim=axes, keepdim=True)
    var = (x * x).mean(dim=axes, keepdim=True) - mean * mean
    return (x - mean) / (torch.sqrt(var) + 1e-9)


# ---------------------------------------------------------------------------------------------
# Pad


def _pad(
    call: Call,
    x: torch.Tensor,
    pads: list[int],
    axes: list[int],
    mode: str,
    value: Any,
) -> torch.Tensor:
    """Pad (or, where negative, cut) ``x`` along ``axes``: every output position reads the
    input position that ``mode`` maps it to (and ``constant`` writes ``value`` outside). A
    negative pad removes its elements first, and the others pad what is left, as onnxruntime
    does: ``wrap`` wraps around, ``reflect`` and ``edge`` read, the elements that are kept."""
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise call.refuse(f"mode {mode!r}")
    count = len(axes)
    if len(pads) != 2 * count:
        raise call.refuse(f"pads {pads} do not give 2 values for each of {count} axes")
    for axis, begin, end in zip(axes, pads[:count], pads[count:], strict=True):
        if not begin and not end:
            continue
        axis %= x.dim()
        first = max(-begin, 0)  # the first element kept
        size = x.shape[axis] - first - max(-end, 0)  # the elements kept
        length = size + max(begin, 0) + max(end, 0)
        if size < 0:
            raise call.refuse(f"pads {pads} cut more than axis {axis} holds")
        source = torch.arange(length, device=x.device) - max(begin, 0)
        if mode != "constant" and size == 0 and length:
            raise call.refuse(f"mode {mode!r} on the empty axis {axis}")
        inside = (source >= 0) & (source < size)
        if mode == "edge":
            source = source.clamp(0, size - 1)
        elif mode == "wrap":
            source = torch.remainder(source, size)
        elif mode == "reflect":
            period = 2 * (size - 1)
            if period == 0:
                source = torch.zeros_like(source)
            else:
                source = torch.remainder(source, period)
                source = torch.where(source < size, source, period - source)
        else:
            source = source.clamp(0, max(size - 1, 0))
        source = source + first
        if size == 0:  # constant padding of an empty axis: only the value
            shape = list(x.shape)
            shape[axis] = length
            x = torch.full(shape, value, dtype=x.dtype, device=x.device)
            continue
        taken = x.index_select(axis, source)
        if mode == "constant" and (begin > 0 or end > 0):
            shape = [1] * x.dim()
            shape[axis] = length
            fill = torch.tensor(value, dtype=x.dtype, device=x.device)
            taken = torch.where(inside.reshape(shape), taken, fill)
        x = taken
    return x


def _value(x: torch.Tensor, constant: torch.Tensor | None) -> Any:
    if constant is None or constant.numel() == 0:
        return False if x.dtype == torch.bool else 0
    return constant.reshape(-1)[0].item()


@implements("Pad", 1)
def pad_1(call: Call, x: torch.Tensor) -> torch.Tensor:
    pads = [int(p) for p in call.attribute("paddings")]
    mode = call.attribute("mode", "constant")
    return _pad(call, x, pads, list(range(x.dim())), mode, call.attribute("value", 0.0))


@implements("Pad", 2)
def pad_2(call: Call, x: torch.Tensor) -> torch.Tensor:
    pads = [int(p) for p in call.attribute("pads")]
    mode = call.attribute("mode", "constant")
    return _pad(call, x, pads, list(range(x.dim())), mode, call.attribute("value", 0.0))


@implements("Pad", 11, 13, 18, 19, 21, 23, 24, 25)
def pad(
    call: Call,
    x: torch.Tensor,
    pads: torch.Tensor,
    constant_value: torch.Tensor | None = None,
    axes: torch.Tensor | None = None,
) -> torch.Tensor:
    mode = call.attribute("mode", "constant")
    if mode == "wrap" and call.node.version < 19:
        raise call.refuse("mode 'wrap' before Pad-19")
    chosen = _ints(axes) if axes is not None else list(range(x.dim()))
    return _pad(call, x, _ints(pads), chosen, mode, _value(x, constant_value))


# ---------------------------------------------------------------------------------------------
# Depth and space


def _block(call: Call, x: torch.Tensor) -> int:
    if x.dim() != 4:
        raise call.refuse(f"a {call.node.op_type} of a tensor of rank {x.dim()} (it takes 4)")
    return int(call.attribute("blocksize"))


@implements("DepthToSpace", 1, 11, 13, 28)
def depth_to_space(call: Call, x: torch.Tensor) -> torch.Tensor:
    size = _block(call, x)
    n, c, h, w = x.shape
    depth = c // (size * size)
    mode = call.attribute("mode", "DCR")
    if mode == "DCR":
        y = x.reshape(n, size, size, depth, h, w).permute(0, 3, 4, 1, 5, 2)
    elif mode == "CRD":
        y = x.reshape(n, depth, size, size, h, w).permute(0, 1, 4, 2, 5, 3)
    else:
        raise call.refuse(f"mode {mode!r}")
    return y.reshape(n, depth, h * size, w * size)


@implements("SpaceToDepth", 1, 13, 28)
def space_to_depth(call: Call, x: torch.Tensor) -> torch.Tensor:
    size = _block(call, x)
    n, c, h, w = x.shape
    y = x.reshape(n, c, h // size, size, w // size, size)
    mode = call.attribute("mode", "DCR")
    if mode == "DCR":
        y = y.permute(0, 3, 5, 1, 2, 4)
    elif mode == "CRD":
        y = y.permute(0, 1, 3, 5, 2, 4)
    else:
        raise call.refuse(f"mode {mode!r}")
    return y.reshape(n, c * size * size, h // size, w // size)


# ---------------------------------------------------------------------------------------------
# Upsample


def _upsample(call: Call, x: torch.Tensor, scales: list[float]) -> torch.Tensor:
    """Mode ``nearest``: output element ``i`` of an axis of scale ``s`` (at least 1) reads input
    element ``floor(i / s)``; the axis grows to ``floor(size * s)``. Mode ``linear`` is not
    implemented."""
    mode = call.attribute("mode", "nearest")
    if mode != "nearest":
        raise call.refuse(f"mode {mode!r} (only 'nearest' is implemented)", not_implemented=True)
    if len(scales) != x.dim():
        raise call.refuse(f"scales {scales} for a tensor of rank {x.dim()}")
    if any(s < 1 for s in scales):
        raise call.refuse(f"scales {scales} below 1")
    for axis, scale in enumerate(scales):
        if scale == 1:
            continue
        size = x.shape[axis]
        out = math.floor(size * scale)
        source = torch.floor(torch.arange(out, dtype=torch.float64, device=x.device) / scale)
        x = x.index_select(axis, source.to(torch.int64).clamp(max=size - 1))
    return x


@implements("Upsample", 7)
def upsample_7(call: Call, x: torch.Tensor) -> torch.Tensor:
    return _upsample(call, x, [float(s) for s in call.attribute("scales")])


@implements("Upsample", 9)
def upsample(call: Call, x: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return _upsample(call, x, _floats(scales))


# ---------------------------------------------------------------------------------------------
# Recurrent layers

_ACTIVATIONS: dict[str, tuple[int, float | None, float | None]] = {
    # name: (how many of alpha and beta it takes, their defaults)
    "relu": (0, None, None),
    "tanh": (0, None, None),
    "sigmoid": (0, None, None),
    "affine": (2, 1.0, 0.0),
    "leakyrelu": (1, 0.01, None),
    "thresholdedrelu": (1, 1.0, None),
    "scaledtanh": (2, 1.0, 1.0),
    "hardsigmoid": (2, 0.2, 0.5),
    "elu": (1, 1.0, None),
    "softsign": (0, None, None),
    "softplus": (0, None, None),
}

Activation = Callable[[torch.Tensor], torch.Tensor]


def _activation(name: str, alpha: Any, beta: Any) -> Activation:
    functions: dict[str, Activation] = {
        "relu": torch.relu,
        "tanh": torch.tanh,
        "sigmoid": torch.sigmoid,
        "affine": lambda v: alpha * v + beta,
        "leakyrelu": lambda v: F.leaky_relu(v, alpha),
        "thresholdedrelu": lambda v: torch.where(v > alpha, v, torch.zeros_like(v)),
        "scaledtanh": lambda v: alpha * torch.tanh(beta * v),
        "hardsigmoid": lambda v: torch.clamp(alpha * v + beta, 0, 1),
        "elu": lambda v: F.elu(v, alpha),
        "softsign": F.softsign,
        "softplus": F.softplus,
    }
    return functions[name]


def _activations(call: Call, defaults: list[str], directions: int) -> list[list[Activation]]:
    """The activation functions of each direction; ``activation_alpha`` and
    ``activation_beta`` are consumed in order by the functions that take them (the others
    default as their operators do)."""
    names = list(call.attribute("activations") or defaults)
    if len(names) == len(defaults) and directions == 2:
        names = names * 2
    if len(names) != len(defaults) * directions:
        raise call.refuse(
            f"activations {names}: {len(defaults)} for each of {directions} directions"
        )
    alphas = list(call.attribute("activation_alpha") or [])
    betas = list(call.attribute("activation_beta") or [])
    functions = []
    for name in names:
        key = name.lower()
        if key not in _ACTIVATIONS:
            raise call.refuse(f"activation {name!r}", not_implemented=True)
        takes, alpha, beta = _ACTIVATIONS[key]
        if takes >= 1 and alphas:
            alpha = alphas.pop(0)
        if takes >= 2 and betas:
            beta = betas.pop(0)
        functions.append(_activation(key, alpha, beta))
    return [functions[i : i + len(defaults)] for i in range(0, len(functions), len(defaults))]


_DIRECTIONS = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}


def _recurrence(
    call: Call,
    x: torch.Tensor,
    sequence_lens: torch.Tensor | None,
    inits: list[Any],
    steps: list[Callable[[Any, torch.Tensor], tuple[Any, torch.Tensor]]],
    reverses: list[bool],
) -> tuple[list[Any], list[torch.Tensor]]:
    """Run every direction's ``step(carry, projected x_t) -> (carry, h_t)`` over the time axis
    (0) of its ``x``: one scan for all directions, or with ``sequence_lens`` one scan for each
    (each example over its own length, its padded outputs zero)."""
    if sequence_lens is None:

        def step_all(carry: tuple[Any, ...], xs: tuple[torch.Tensor, ...]) -> Any:
            done = [step(c, xt) for step, c, xt in zip(steps, carry, xs, strict=True)]
            return tuple(d[0] for d in done), tuple(d[1] for d in done)

        carry, ys = scan(
            step_all,
            tuple(inits),
            tuple(x),
            in_reverse=tuple(reverses),
            out_reverse=tuple(reverses),
        )
        return list(carry), list(ys)
    lengths = sequence_lens.to(torch.int64)
    carries, outputs = [], []
    for step, init, xd, reverse in zip(steps, inits, x, reverses, strict=True):
        carry, ys = scan(step, init, xd, reverse=reverse, lengths=lengths, batch_axis=0)
        carries.append(carry)
        outputs.append(ys)
    return carries, outputs


def _rnn_inputs(
    call: Call,
    x: torch.Tensor,
    w: torch.Tensor,
    r: torch.Tensor,
    b: torch.Tensor | None,
    initial: list[torch.Tensor | None],
    gates: int,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[list[torch.Tensor]], list[bool]]:
    """The checked inputs of a recurrent node, ``layout`` 0: every direction's projected
    input ``x W^T + Wb`` (time, batch, gates * hidden), recurrence bias ``Rb`` and initial
    states, and its direction."""
    direction = call.attribute("direction", "forward")
    if direction not in _DIRECTIONS:
        raise call.refuse(f"direction {direction!r}")
    reverses = _DIRECTIONS[direction]
    if w.shape[0] != len(reverses):
        raise call.refuse(f"W of {w.shape[0]} directions for direction {direction!r}")
    hidden = r.shape[-1]
    if call.attribute("hidden_size", hidden) != hidden:
        raise call.refuse(f"hidden_size {call.attribute('hidden_size')} but R of {hidden}")
    batch = x.shape[1]
    if b is None:
        b = torch.zeros((len(reverses), 2 * gates * hidden), dtype=x.dtype, device=x.device)
    projected = [x @ w[d].T + b[d, : gates * hidden] for d in range(len(reverses))]
    recurrent_bias = [b[d, gates * hidden :] for d in range(len(reverses))]
    states = []
    for state in initial:
        if state is None:
            state = torch.zeros((len(reverses), batch, hidden), dtype=x.dtype, device=x.device)
        states.append([state[d] for d in range(len(reverses))])
    return projected, recurrent_bias, states, reverses


def _layout_in(call: Call, x: torch.Tensor, states: list[torch.Tensor | None]) -> Any:
    if call.node.version < 14 or not call.attribute("layout", 0):
        return x, states
    return x.transpose(0, 1), [None if s is None else s.transpose(0, 1) for s in states]


def _layout_out(call: Call, y: torch.Tensor, finals: list[torch.Tensor]) -> list[torch.Tensor]:
    """``Y`` (time, directions, batch, hidden) and the final states (directions, batch,
    hidden), in ``layout`` 1 as (batch, time, directions, hidden) and (batch, directions,
    hidden)."""
    if call.node.version < 14 or not call.attribute("layout", 0):
        return [y, *finals]
    return [y.permute(2, 0, 1, 3), *[f.transpose(0, 1) for f in finals]]


def _clip(call: Call) -> Callable[[torch.Tensor], torch.Tensor]:
    threshold = call.attribute("clip")
    if threshold is None:
        return lambda v: v
    return lambda v: torch.clamp(v, -threshold, threshold)


def _check_layout(call: Call) -> None:
    if call.attribute("layout", 0) not in (0, 1):
        raise call.refuse(f"layout {call.attribute('layout')}")


@implements("RNN", 1, 7, 14, 22)
def rnn(
    call: Call,
    x: torch.Tensor,
    w: torch.Tensor,
    r: torch.Tensor,
    b: torch.Tensor | None = None,
    sequence_lens: torch.Tensor | None = None,
    initial_h: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """``H_t = f(x_t W^T + H_{t-1} R^T + Wb + Rb)``, every direction one carry of a scan."""
    _check_layout(call)
    x, (initial_h,) = _layout_in(call, x, [initial_h])
    projected, rb, (h0,), reverses = _rnn_inputs(call, x, w, r, b, [initial_h], 1)
    functions = _activations(call, ["Tanh"], len(reverses))
    clip = _clip(call)

    def cell(d: int) -> Callable[[torch.Tensor, torch.Tensor], Any]:
        (f,) = functions[d]
        rt, bias = r[d].T, rb[d]

        def step(h: torch.Tensor, xt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            h = f(clip(xt + h @ rt + bias))
            return h, h

        return step

    steps = [cell(d) for d in range(len(reverses))]
    finals, ys = _recurrence(call, torch.stack(projected), sequence_lens, h0, steps, reverses)
    return _layout_out(call, torch.stack(ys, 1), [torch.stack(finals)])


@implements("GRU", 1, 3, 7, 14, 22)
def gru(
    call: Call,
    x: torch.Tensor,
    w: torch.Tensor,
    r: torch.Tensor,
    b: torch.Tensor | None = None,
    sequence_lens: torch.Tensor | None = None,
    initial_h: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """Gates ``z, r, h`` in this order in ``W``, ``R`` and ``B``;
    ``H_t = (1 - z) * g(...) + z * H_{t-1}``, the reset gate applied before the recurrent
    product (``linear_before_reset=0``) or after it."""
    _check_layout(call)
    x, (initial_h,) = _layout_in(call, x, [initial_h])
    projected, rb, (h0,), reverses = _rnn_inputs(call, x, w, r, b, [initial_h], 3)
    functions = _activations(call, ["Sigmoid", "Tanh"], len(reverses))
    clip = _clip(call)
    before = bool(call.attribute("linear_before_reset", 0))
    hidden = r.shape[-1]

    def cell(d: int) -> Callable[[torch.Tensor, torch.Tensor], Any]:
        f, g = functions[d]
        r_zr, r_h = r[d, : 2 * hidden].T, r[d, 2 * hidden :].T
        b_zr, b_h = rb[d][: 2 * hidden], rb[d][2 * hidden :]

        def step(h: torch.Tensor, xt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            x_zr, x_h = xt[..., : 2 * hidden], xt[..., 2 * hidden :]
            z, reset = f(clip(x_zr + h @ r_zr + b_zr)).chunk(2, -1)
            if before:
                candidate = g(clip(x_h + reset * (h @ r_h + b_h)))
            else:
                candidate = g(clip(x_h + (reset * h) @ r_h + b_h))
            h = (1 - z) * candidate + z * h
            return h, h

        return step

    steps = [cell(d) for d in range(len(reverses))]
    finals, ys = _recurrence(call, torch.stack(projected), sequence_lens, h0, steps, reverses)
    return _layout_out(call, torch.stack(ys, 1), [torch.stack(finals)])


@implements("LSTM", 1, 7, 14, 22)
def lstm(
    call: Call,
    x: torch.Tensor,
    w: torch.Tensor,
    r: torch.Tensor,
    b: torch.Tensor | None = None,
    sequence_lens: torch.Tensor | None = None,
    initial_h: torch.Tensor | None = None,
    initial_c: torch.Tensor | None = None,
    p: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """Gates ``i, o, f, c`` in this order in ``W``, ``R`` and ``B``, peepholes ``i, o, f`` in
    ``P``; ``input_forget=1`` couples the forget gate to the input gate (``f = 1 - i``)."""
    _check_layout(call)
    x, (initial_h, initial_c) = _layout_in(call, x, [initial_h, initial_c])
    projected, rb, (h0, c0), reverses = _rnn_inputs(call, x, w, r, b, [initial_h, initial_c], 4)
    functions = _activations(call, ["Sigmoid", "Tanh", "Tanh"], len(reverses))
    clip = _clip(call)
    coupled = bool(call.attribute("input_forget", 0))
    hidden = r.shape[-1]
    if p is None:
        p = torch.zeros((len(reverses), 3 * hidden), dtype=x.dtype, device=x.device)

    def cell(d: int) -> Callable[[Any, torch.Tensor], Any]:
        f, g, h_ = functions[d]
        rt, bias = r[d].T, rb[d]
        p_i, p_o, p_f = p[d].chunk(3)

        def step(carry: Any, xt: torch.Tensor) -> tuple[Any, torch.Tensor]:
            h, c = carry
            i, o, forget, candidate = (xt + h @ rt + bias).chunk(4, -1)
            i = f(clip(i + p_i * c))
            forget = 1 - i if coupled else f(clip(forget + p_f * c))
            c = forget * c + i * g(clip(candidate))
            o = f(clip(o + p_o * c))
            h = o * h_(c)
            return (h, c), h

        return step

    steps = [cell(d) for d in range(len(reverses))]
    inits = [(h, c) for h, c in zip(h0, c0, strict=True)]
    finals, ys = _recurrence(call, torch.stack(projected), sequence_lens, inits, steps, reverses)
    y_h = torch.stack([h for h, _ in finals])
    y_c = torch.stack([c for _, c in finals])
    return _layout_out(call, torch.stack(ys, 1), [y_h, y_c])
