"""``torchscan_scan``: the operator a scan becomes, and its implementations."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from torchscan._compat import (
    DispatchKey,
    HigherOrderOperator,
    ProxyTorchDispatchMode,
    autograd_not_implemented,
    disable_proxy_modes_tracing,
    lower_bound,
    maybe_run_with_interpreter,
    register_fake,
    runs_eagerly,
)
from torchscan._traced._body import (
    as_traced_body,
    output_values,
    record,
    refuse_mutation,
    trace_body,
)
from torchscan._traced._step_errors import attach, refuse_without_onnx_hooks, step_of


class ScanStatic(NamedTuple):
    """The static arguments of ``torchscan_scan``, after its tensors: the axis and direction of
    every sequence (``in_axes``, ``in_reverse``) and of every output (``out_axes``,
    ``out_reverse``; one entry stands for every output), and whether the traced program keeps
    the length at 1 or more (``nonempty``). Every kernel, and the translation to ONNX, reads
    them through this tuple."""

    in_axes: tuple[int, ...]
    in_reverse: tuple[bool, ...]
    out_axes: tuple[int, ...]
    out_reverse: tuple[bool, ...]
    nonempty: bool = False

    @classmethod
    def of(
        cls,
        in_axes: Sequence[Any],
        in_reverse: Sequence[Any],
        out_axes: Sequence[Any],
        out_reverse: Sequence[Any],
        nonempty: Any = False,
    ) -> ScanStatic:
        """The static arguments as the operator takes them: tuples of Python ints and bools."""
        return cls(
            tuple(int(a) for a in in_axes),
            tuple(bool(r) for r in in_reverse),
            tuple(int(a) for a in out_axes),
            tuple(bool(r) for r in out_reverse),
            bool(nonempty),
        )


class ScanOp(HigherOrderOperator):
    """``torchscan_scan(body, carries, xs, captured, *static)`` returns ``(*final_carries,
    *ys)``; ``body(*carries, *x_slices, *captured)`` returns ``(*new_carries, *y_slices)``;
    ``static`` is a :class:`ScanStatic`."""

    def __init__(self) -> None:
        super().__init__("torchscan_scan")

    def __call__(self, body, carries, xs, captured, *static):
        return super().__call__(
            body, tuple(carries), tuple(xs), tuple(captured), *ScanStatic.of(*static)
        )


torchscan_scan = ScanOp()


# -- shapes ------------------------------------------------------------------------------------


def _broadcast(values: tuple, n: int) -> tuple:
    return values * n if len(values) == 1 else values


def _stacking_axis(axis: int, slice_rank: int) -> int:
    return axis % (slice_rank + 1)


def slice_like(x: torch.Tensor, axis: int) -> torch.Tensor:
    """A fresh tensor shaped like one step of ``x``: indexing would guard on the length."""
    shape = list(x.shape)
    del shape[axis]
    return x.new_empty(shape)


def stacked_like(y: torch.Tensor, length: Any, axis: int) -> torch.Tensor:
    shape = list(y.shape)
    shape.insert(axis, length)
    return y.new_empty(shape)


def _scan_length(xs: Sequence[torch.Tensor], in_axes: Sequence[int]) -> Any:
    return xs[0].shape[in_axes[0]]


# -- implementations ---------------------------------------------------------------------------


@torchscan_scan.py_impl(DispatchKey.CompositeExplicitAutograd)
def _scan_dense(body, carries, xs, captured, *static):
    in_axes, in_reverse, out_axes, out_reverse, _ = ScanStatic(*static)
    length = _scan_length(xs, in_axes)
    if length == 0:
        empty = _scan_fake(body, carries, xs, captured, *static)
        return (*carries, *empty[len(carries) :])
    carries = list(carries)
    steps = []
    for k in range(length):
        x = [
            leaf.select(a, length - 1 - k if r else k)
            for leaf, a, r in zip(xs, in_axes, in_reverse, strict=True)
        ]
        out = body(*carries, *x, *captured)
        carries = list(out[: len(carries)])
        steps.append(out[len(carries) :])
    n_ys = len(steps[0])
    outputs = []
    for j, (a, r) in enumerate(
        zip(_broadcast(out_axes, n_ys), _broadcast(out_reverse, n_ys), strict=True)
    ):
        column = [step[j] for step in steps]
        if r:
            column.reverse()
        outputs.append(torch.stack(column, dim=_stacking_axis(a, column[0].ndim)))
    return (*carries, *outputs)


@register_fake(torchscan_scan, skip_cache=True)
def _scan_fake(body, carries, xs, captured, *static):
    in_axes, _, out_axes, _, _ = ScanStatic(*static)
    x = [slice_like(leaf, a) for leaf, a in zip(xs, in_axes, strict=True)]
    with as_traced_body():
        out = body(*carries, *x, *captured)
    ys = out[len(carries) :]
    length = _scan_length(xs, in_axes)
    axes = _broadcast(out_axes, len(ys))
    return (
        *[c.new_empty(c.shape) for c in carries],
        *[
            stacked_like(y, length, _stacking_axis(a, y.ndim))
            for y, a in zip(ys, axes, strict=True)
        ],
    )


_untrainable_scan = autograd_not_implemented(torchscan_scan, deferred_error=True)


@torchscan_scan.py_impl(DispatchKey.Autograd)
def _scan_autograd(body, carries, xs, captured, *static):
    """On real tensors (an exported program's module, trained), the Python loop with autograd
    recording every step, as an eager scan does. While traced (torch.export,
    ``run_decompositions``, torch.onnx), no backward is recorded, so that no graph is unrolled:
    a backward through the traced operator fails when it is asked for."""
    if runs_eagerly((*carries, *xs, *captured)):
        return _scan_dense(body, carries, xs, captured, *static)
    return _untrainable_scan(body, carries, xs, captured, *static)


@torchscan_scan.py_functionalize_impl
def _scan_functionalize(ctx, body, carries, xs, captured, *static):
    carries, xs, captured = [ctx.unwrap_tensors(group) for group in (carries, xs, captured)]
    with ctx.redispatch_to_next():
        functional_body = ctx.functionalize(maybe_run_with_interpreter(body))
        attach(functional_body, step_of(body))
        out = torchscan_scan(functional_body, carries, xs, captured, *static)
    return ctx.wrap_tensors(out)


@torchscan_scan.py_impl(ProxyTorchDispatchMode)
def _scan_trace(mode, body, carries, xs, captured, *static):
    in_axes, _, out_axes, out_reverse, _ = ScanStatic(*static)
    refuse_without_onnx_hooks(body)
    with disable_proxy_modes_tracing():
        # Cloned, so that a closure reference to the initial carry stays the outer value.
        sample_carries = [c.clone() for c in carries]
        sample_xs = [slice_like(leaf, a) for leaf, a in zip(xs, in_axes, strict=True)]
    body_gm, captured = trace_body(mode, body, [*sample_carries, *sample_xs], captured)
    refuse_mutation(body_gm, len(carries), len(xs), captured)
    outputs = output_values(body_gm)
    ys = outputs[len(carries) :]
    out_axes = tuple(
        _stacking_axis(a, y.ndim) for a, y in zip(_broadcast(out_axes, len(ys)), ys, strict=True)
    )
    out_reverse = _broadcast(out_reverse, len(ys))
    length = _scan_length(xs, in_axes)
    laid_out = ScanStatic(*static)._replace(
        out_axes=out_axes, out_reverse=out_reverse, nonempty=bool(lower_bound(length) >= 1)
    )
    args = (body_gm, carries, xs, captured, *laid_out)
    with disable_proxy_modes_tracing():
        example = (
            *[c.new_empty(c.shape) for c in carries],
            *[stacked_like(y, length, a) for y, a in zip(ys, out_axes, strict=True)],
        )
    return record(mode, torchscan_scan, body_gm, args, example)
