"""Element-wise operators, products, reductions and the normalizations, in torch.

Each is registered for the versions whose meaning it follows; the versions before
multidirectional broadcasting (``Add-1``, ``Add-6`` with their ``broadcast`` attribute) are not
implemented.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from torchscan import _context
from torchscan.onnx._import._graph import Call, ints
from torchscan.onnx._import._registry import implements

_UNARY: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], tuple[int, ...]]] = {
    "Abs": (torch.abs, (6, 13)),
    "Neg": (torch.neg, (6, 13)),
    "Exp": (torch.exp, (6, 13)),
    "Log": (torch.log, (6, 13)),
    "Sqrt": (torch.sqrt, (6, 13)),
    "Reciprocal": (torch.reciprocal, (6, 13)),
    "Tanh": (torch.tanh, (6, 13)),
    "Sigmoid": (torch.sigmoid, (6, 13)),
    "Relu": (torch.relu, (6, 13, 14)),
    "Floor": (torch.floor, (6, 13)),
    "Ceil": (torch.ceil, (6, 13)),
    "Erf": (torch.erf, (9, 13)),
    "Sin": (torch.sin, (7, 22)),
    "Cos": (torch.cos, (7, 22)),
    "Sign": (torch.sign, (9, 13)),
    "Round": (torch.round, (11, 22)),  # half to even, as torch rounds
    "IsNaN": (torch.isnan, (9, 13, 20)),
    "Not": (torch.logical_not, (1,)),
    "Softplus": (torch.nn.functional.softplus, (1, 22)),
    "Softsign": (torch.nn.functional.softsign, (1, 22)),
    "Mish": (torch.nn.functional.mish, (18, 22)),
    "Tan": (torch.tan, (7, 22)),
    "Asin": (torch.asin, (7, 22)),
    "Acos": (torch.acos, (7, 22)),
    "Atan": (torch.atan, (7, 22)),
    "Sinh": (torch.sinh, (9, 22)),
    "Cosh": (torch.cosh, (9, 22)),
    "Asinh": (torch.asinh, (9, 22)),
    "Acosh": (torch.acosh, (9, 22)),
    "Atanh": (torch.atanh, (9, 22)),
    "BitwiseNot": (torch.bitwise_not, (18,)),
}


def _unary(function: Callable[[torch.Tensor], torch.Tensor]) -> Callable[..., torch.Tensor]:
    def run(call: Call, x: torch.Tensor) -> torch.Tensor:
        return function(x)

    return run


for _name, (_function, _versions) in _UNARY.items():
    implements(_name, *_versions)(_unary(_function))


@implements("Add", 7, 13, 14)
def add(call: Call, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.add(a, b)


@implements("Sub", 7, 13, 14)
def sub(call: Call, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.dtype == torch.bool:
        raise call.refuse("Sub of bool tensors")
    return torch.sub(a, b)


@implements("Mul", 7, 13, 14)
def mul(call: Call, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.mul(a, b)


@implements("Div", 7, 13, 14)
def div(call: Call, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.is_floating_point() or a.is_complex():
        return torch.div(a, b)
    return torch.div(a, b, rounding_mode="trunc")  # integers: truncated, as C++ divides


@implements("Pow", 7, 12, 13, 15)
def pow_(call: Call, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.pow(x, y).to(x.dtype)  # the type of the base


@implements("Mod", 10, 13)
def mod(call: Call, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if call.attribute("fmod", 0):
        return torch.fmod(a, b)
    if a.is_floating_point():
        raise call.refuse("fmod=0 with floating-point inputs (the specification requires fmod=1)")
    return torch.remainder(a, b)  # the sign of the divisor


_COMPARISONS = {
    "Equal": (torch.eq, (7, 11, 13, 19)),
    "Less": (torch.lt, (7, 9, 13)),
    "Greater": (torch.gt, (7, 9, 13)),
    "LessOrEqual": (torch.le, (12, 16)),
    "GreaterOrEqual": (torch.ge, (12, 16)),
    "And": (torch.logical_and, (7,)),
    "Or": (torch.logical_or, (7,)),
    "Xor": (torch.logical_xor, (7,)),
    "BitwiseAnd": (torch.bitwise_and, (18,)),
    "BitwiseOr": (torch.bitwise_or, (18,)),
    "BitwiseXor": (torch.bitwise_xor, (18,)),
}


def _binary(function: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def run(call: Call, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return function(a, b)

    return run


for _name, (_function, _versions) in _COMPARISONS.items():
    implements(_name, *_versions)(_binary(_function))


def _variadic(function: Callable[..., torch.Tensor], mean: bool = False) -> Callable[..., Any]:
    def run(call: Call, *inputs: torch.Tensor) -> torch.Tensor:
        result = inputs[0]
        for other in inputs[1:]:
            result = function(result, other)
        if len(inputs) == 1:
            result = result.clone()
        return result / len(inputs) if mean else result

    return run


implements("Max", 8, 12, 13)(_variadic(torch.maximum))
implements("Min", 8, 12, 13)(_variadic(torch.minimum))
implements("Sum", 8, 13)(_variadic(torch.add))
implements("Mean", 8, 13)(_variadic(torch.add, mean=True))


FUSED_INNER = 16
"""The largest inner dimension ``K`` of a float32 ``MatMul`` (and ``Gemm``) of matrices that the
module computes as onnxruntime and numpy do (:func:`fused_matmul`)."""

ROUNDED_INNER = 5
"""The largest inner dimension ``K`` of a float32 product with one row or one column that the
module computes as onnxruntime and numpy do (:func:`rounded_matmul`): beyond it their
matrix-vector kernels add the terms in vector lanes, in an order that depends on the CPU."""


@implements("MatMul", 1, 9, 13)
def matmul(call: Call, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _matmul(a, b)


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``numpy.matmul(a, b)``, the specification's product. A small float32 product is
    computed as onnxruntime's CPU kernels and numpy compute it (:func:`_as_onnxruntime`), where
    torch's CPU kernels round differently from one CPU to another: one unit in the last place
    per element, which a computation that cancels (the determinant of a 2x2 covariance,
    ``a * d - b * c``) makes much larger. While torch.compile or torch.export trace the module,
    and for the gradients, it is ``torch.matmul``, so that a module exported again holds a
    ``MatMul``."""
    rounding = None if _context.compiling() else _as_onnxruntime(a, b)  # traced: no guard
    if rounding is None:
        return torch.matmul(a, b)
    with torch.no_grad():
        exact = rounding(a, b)
    if not (torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)):
        return exact
    product = torch.matmul(a, b)
    # the values of ``exact``, the gradients of ``product``
    zero = product - product.detach()
    return exact + torch.where(torch.isfinite(product.detach()), zero, torch.zeros_like(zero))


def _as_onnxruntime(
    a: torch.Tensor, b: torch.Tensor
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
    """How onnxruntime's CPU kernel rounds ``a @ b``, where the module computes it so; else
    ``None``. For float32 on the CPU: a product of matrices of at least 2 rows (a batch of the
    left operand counts as rows where the right one is one matrix, as onnxruntime folds it so)
    and at least 2 columns, and an inner dimension of at most :data:`FUSED_INNER`, is a chain
    of fused multiply-adds (:func:`fused_matmul`); a product with a single row or column (a 1-D
    operand included), which runs in its matrix-vector kernel, and an inner dimension of at most
    :data:`ROUNDED_INNER`, is a sum of rounded terms (:func:`rounded_matmul`)."""
    if a.dtype != torch.float32 or b.dtype != torch.float32 or a.device.type != "cpu":
        return None
    inner = a.shape[-1]
    if a.dim() >= 2 and b.dim() >= 2:
        rows = a.shape[:-1].numel() if b.dim() == 2 else a.shape[-2]
        if rows >= 2 and b.shape[-1] >= 2:
            return fused_matmul if 1 <= inner <= FUSED_INNER else None
    return rounded_matmul if 1 <= inner <= ROUNDED_INNER else None


def rounded_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` of float32 tensors (numpy's broadcasting, 1-D operands included) with each
    element ``c = c + a[i, k] * b[k, j]`` for ``k`` from 0 up, from ``c = 0``, each product and
    each sum rounded to float32: what onnxruntime's matrix-vector kernel and numpy compute for a
    small inner dimension, on every CPU (torch's own kernel fuses some terms on one CPU and not
    on another)."""
    left = a.unsqueeze(0) if a.dim() == 1 else a
    right = b.unsqueeze(-1) if b.dim() == 1 else b
    total = left[..., :, 0:1] * right[..., 0:1, :] + 0.0  # a zero product is +0, as from 0
    for k in range(1, left.shape[-1]):
        total = total + left[..., :, k : k + 1] * right[..., k : k + 1, :]
    if a.dim() == 1:
        total = total.squeeze(-2)
    if b.dim() == 1:
        total = total.squeeze(-1)
    return total


def fused_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` of float32 tensors (numpy's broadcasting, 1-D operands included) with each
    element a chain of fused multiply-adds, ``c = fma(a[i, k], b[k, j], c)`` for ``k`` from 0
    up, from ``c = 0``: one rounding per term, of the exact ``c + a * b``. That is what
    onnxruntime's CPU MatMul (MLAS) and numpy's matmul (onnx's reference evaluator) compute for
    small matrices. Each product is exact in float64; the sum is rounded to float64 to odd
    (:func:`_add_to_odd`), which makes its rounding to float32 the one rounding of a fused
    multiply-add."""
    left = a.unsqueeze(0) if a.dim() == 1 else a
    right = b.unsqueeze(-1) if b.dim() == 1 else b
    left64, right64 = left.double(), right.double()
    total: torch.Tensor | None = None
    for k in range(left.shape[-1]):
        term = left64[..., :, k : k + 1] * right64[..., k : k + 1, :]
        # c = 0 + a * b: a zero product is +0, as in a sum that starts at 0
        total = term.float() + 0.0 if total is None else _add_to_odd(total.double(), term).float()
    assert total is not None  # the inner dimension is at least 1
    if a.dim() == 1:
        total = total.squeeze(-2)
    if b.dim() == 1:
        total = total.squeeze(-1)
    return total


def _add_to_odd(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``x + y`` of float64 tensors rounded to odd: the nearest float64 where the sum is one,
    else of the two float64 around it the one whose last bit is 1. A float32 rounding of it is
    the float32 rounding of the exact sum, as float64 has at least 24 + 2 bits: a float64 that
    is exactly halfway between two float32 is so only where the sum is."""
    total = x + y
    # the rounding error of the sum, exactly (Knuth's TwoSum)
    y_part = total - x
    error = (x - (total - y_part)) + (y - y_part)
    even = (total.view(torch.int64) & 1) == 0
    inexact = (error != 0) & even & torch.isfinite(total)
    toward = torch.where(error > 0, math.inf, -math.inf).to(total.dtype)
    return torch.where(inexact, torch.nextafter(total, toward), total)


@implements("Gemm", 7, 9, 11, 13)
def gemm(call: Call, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None) -> Any:
    a = a.t() if call.attribute("transA", 0) else a
    b = b.t() if call.attribute("transB", 0) else b
    alpha, beta = call.attribute("alpha", 1.0), call.attribute("beta", 1.0)
    product = _matmul(a, b)
    if alpha != 1.0:
        product = product * alpha
    if c is None:
        return product
    return product + (c * beta if beta != 1.0 else c)


@implements("LeakyRelu", 6, 16)
def leaky_relu(call: Call, x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.leaky_relu(x, call.attribute("alpha", 0.01))


@implements("Elu", 6, 22)
def elu(call: Call, x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.elu(x, call.attribute("alpha", 1.0))


@implements("Selu", 6, 22)
def selu(call: Call, x: torch.Tensor) -> torch.Tensor:
    alpha = call.attribute("alpha", 1.67326319217681884765625)
    gamma = call.attribute("gamma", 1.05070102214813232421875)
    return gamma * torch.where(x > 0, x, alpha * torch.expm1(x))


@implements("HardSigmoid", 6, 22)
def hard_sigmoid(call: Call, x: torch.Tensor) -> torch.Tensor:
    alpha, beta = call.attribute("alpha", 0.2), call.attribute("beta", 0.5)
    return torch.clamp(alpha * x + beta, 0, 1)


@implements("HardSwish", 14, 22)
def hard_swish(call: Call, x: torch.Tensor) -> torch.Tensor:
    return x * torch.clamp(x / 6 + 0.5, 0, 1)


@implements("Gelu", 20)
def gelu(call: Call, x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x, approximate=call.attribute("approximate", "none"))


@implements("ThresholdedRelu", 10, 22)
def thresholded_relu(call: Call, x: torch.Tensor) -> torch.Tensor:
    return torch.where(x > call.attribute("alpha", 1.0), x, torch.zeros_like(x))


@implements("PRelu", 9, 16)
def prelu(call: Call, x: torch.Tensor, slope: torch.Tensor) -> torch.Tensor:
    return torch.where(x < 0, slope * x, x)


@implements("IsInf", 10, 20)
def is_inf(call: Call, x: torch.Tensor) -> torch.Tensor:
    negative, positive = call.attribute("detect_negative", 1), call.attribute("detect_positive", 1)
    if negative and positive:
        return torch.isinf(x)
    if negative:
        return torch.isneginf(x)
    if positive:
        return torch.isposinf(x)
    return torch.zeros_like(x, dtype=torch.bool)


@implements("Trilu", 14)
def trilu(call: Call, x: torch.Tensor, k: torch.Tensor | None = None) -> torch.Tensor:
    diagonal = 0 if k is None else ints(k)[0]
    if call.attribute("upper", 1):
        return torch.triu(x, diagonal)
    return torch.tril(x, diagonal)


@implements("Einsum", 12)
def einsum(call: Call, *inputs: torch.Tensor) -> torch.Tensor:
    return torch.einsum(call.attribute("equation"), *inputs)


# ---------------------------------------------------------------------------------------------
# Softmax, reductions


def _coerced(function: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Softmax before version 13: the input seen as a matrix of ``prod(shape[:axis])`` rows,
    normalized along each row."""

    def run(call: Call, x: torch.Tensor) -> torch.Tensor:
        axis = call.attribute("axis", 1) % max(x.dim(), 1)
        rows = math.prod(x.shape[:axis])
        return function(x.reshape(rows, -1), dim=1).reshape(x.shape)

    return run


def _along_axis(function: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def run(call: Call, x: torch.Tensor) -> torch.Tensor:
        return function(x, dim=call.attribute("axis", -1))

    return run


implements("Softmax", 1, 11)(_coerced(torch.softmax))
implements("Softmax", 13)(_along_axis(torch.softmax))
implements("LogSoftmax", 1, 11)(_coerced(torch.log_softmax))
implements("LogSoftmax", 13)(_along_axis(torch.log_softmax))


def _reduction(
    function: Callable[[torch.Tensor, tuple[int, ...], bool], torch.Tensor],
    axes_input: bool,
    identity: Callable[[torch.dtype], Any],
) -> Callable[..., torch.Tensor]:
    def run(call: Call, x: torch.Tensor, axes: torch.Tensor | None = None) -> torch.Tensor:
        keep = bool(call.attribute("keepdims", 1))
        if axes_input:
            chosen = ints(axes)
            if not chosen and call.attribute("noop_with_empty_axes", 0):
                return x
        else:
            chosen = list(call.attribute("axes", []) or [])
        dims = tuple(range(x.dim())) if not chosen else tuple(a % x.dim() for a in chosen)
        if not dims:  # a 0-d input
            return x.clone()
        if any(x.shape[d] == 0 for d in dims):  # over no element: the reduction's identity
            shape = [1 if d in dims else n for d, n in enumerate(x.shape) if keep or d not in dims]
            return torch.full(shape, identity(x.dtype), dtype=x.dtype)
        return function(x, dims, keep)

    return run


def _sum(x: torch.Tensor, dims: tuple[int, ...], keep: bool) -> torch.Tensor:
    return torch.sum(x, dim=dims, keepdim=keep, dtype=x.dtype)


def _mean(x: torch.Tensor, dims: tuple[int, ...], keep: bool) -> torch.Tensor:
    return torch.mean(x, dim=dims, keepdim=keep)


def _amax(x: torch.Tensor, dims: tuple[int, ...], keep: bool) -> torch.Tensor:
    return torch.amax(x, dim=dims, keepdim=keep)


def _amin(x: torch.Tensor, dims: tuple[int, ...], keep: bool) -> torch.Tensor:
    return torch.amin(x, dim=dims, keepdim=keep)


def _prod(x: torch.Tensor, dims: tuple[int, ...], keep: bool) -> torch.Tensor:
    for dim in sorted(dims, reverse=True):
        x = torch.prod(x, dim=dim, keepdim=keep, dtype=x.dtype)
    return x


def _lowest(dtype: torch.dtype) -> Any:
    if dtype == torch.bool:
        return False
    return -math.inf if dtype.is_floating_point else torch.iinfo(dtype).min


def _highest(dtype: torch.dtype) -> Any:
    if dtype == torch.bool:
        return True
    return math.inf if dtype.is_floating_point else torch.iinfo(dtype).max


_REDUCTIONS = {  # the reduction, and its value over no element
    "ReduceSum": (_sum, lambda dtype: 0),
    "ReduceMean": (_mean, lambda dtype: math.nan),
    "ReduceMax": (_amax, _lowest),
    "ReduceMin": (_amin, _highest),
    "ReduceProd": (_prod, lambda dtype: 1),
}
for _name, (_function, _identity) in _REDUCTIONS.items():
    _attribute = _reduction(_function, axes_input=False, identity=_identity)
    _input = _reduction(_function, axes_input=True, identity=_identity)
    if _name == "ReduceSum":
        implements(_name, 1, 11)(_attribute)
        implements(_name, 13)(_input)
        continue
    implements(_name, 1, 11, 13, *((12,) if _name in ("ReduceMax", "ReduceMin") else ()))(
        _attribute
    )
    implements(_name, 18, *((20,) if _name in ("ReduceMax", "ReduceMin") else ()))(_input)


def _arg(function: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def run(call: Call, x: torch.Tensor) -> torch.Tensor:
        axis = call.attribute("axis", 0) % max(x.dim(), 1)
        keep = bool(call.attribute("keepdims", 1))
        if call.attribute("select_last_index", 0):
            flipped = function(x.flip(axis), dim=axis, keepdim=keep)
            return x.shape[axis] - 1 - flipped
        return function(x, dim=axis, keepdim=keep)

    return run


implements("ArgMax", 1, 11, 12, 13)(_arg(torch.argmax))
implements("ArgMin", 1, 11, 12, 13)(_arg(torch.argmin))


@implements("Clip", 11, 12, 13)
def clip(
    call: Call, x: torch.Tensor, low: torch.Tensor | None = None, high: torch.Tensor | None = None
) -> torch.Tensor:
    if low is None and high is None:
        return x.clone()
    return torch.clamp(x, low, high)


@implements("Clip", 6)
def clip_6(call: Call, x: torch.Tensor) -> torch.Tensor:
    return torch.clamp(x, call.attribute("min", -math.inf), call.attribute("max", math.inf))


@implements("CumSum", 11, 14)
def cumsum(call: Call, x: torch.Tensor, axis: torch.Tensor) -> torch.Tensor:
    dim = ints(axis)[0] % max(x.dim(), 1)
    if call.attribute("reverse", 0):
        x = x.flip(dim)
    out = torch.cumsum(x, dim, dtype=x.dtype)
    if call.attribute("exclusive", 0):
        out = out - x
    return out.flip(dim) if call.attribute("reverse", 0) else out


@implements("LayerNormalization", 17)
def layer_norm(
    call: Call, x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    axis = call.attribute("axis", -1) % x.dim()
    epsilon = call.attribute("epsilon", 1e-5)
    dims = tuple(range(axis, x.dim()))
    stash = torch.float32 if call.attribute("stash_type", 1) == 1 else x.dtype
    computed = x.to(stash)
    mean = computed.mean(dim=dims, keepdim=True)
    variance = ((computed - mean) ** 2).mean(dim=dims, keepdim=True)
    inverse = torch.rsqrt(variance + epsilon)
    y = ((computed - mean) * inverse).to(x.dtype) * scale
    if bias is not None:
        y = y + bias
    return y, mean, inverse
