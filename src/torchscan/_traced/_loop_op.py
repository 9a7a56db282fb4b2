"""``torchscan_loop``: the operator a loop becomes, and its implementations."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torchscan._compat import (
    DispatchKey,
    HigherOrderOperator,
    ProxyTorchDispatchMode,
    autograd_not_implemented,
    detect_fake_mode,
    disable_proxy_modes_tracing,
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
from torchscan._traced._scan_op import stacked_like
from torchscan._traced._step_errors import attach, refuse_without_onnx_hooks, step_of

# -- loop --------------------------------------------------------------------------------------


class LoopOp(HigherOrderOperator):
    """``torchscan_loop(body, trip_count, cond, carries, captured, has_until)`` returns
    ``(*final_carries, *ys)``; ``body(i, *carries, *captured)`` returns ``(*new_carries,
    *y_slices)`` followed by the stop flag when ``has_until``. ``trip_count`` is an int, a size
    of the traced program, a 0-d integer tensor or None; ``cond`` a 0-d bool tensor or None."""

    def __init__(self) -> None:
        super().__init__("torchscan_loop")

    def __call__(self, body, trip_count, cond, carries, captured, has_until):
        return super().__call__(
            body, trip_count, cond, tuple(carries), tuple(captured), bool(has_until)
        )


torchscan_loop = LoopOp()


def _n_ys(out: Sequence[Any], n_carries: int, has_until: bool) -> int:
    return len(out) - n_carries - int(has_until)


@torchscan_loop.py_impl(DispatchKey.CompositeExplicitAutograd)
def _loop_dense(body, trip_count, cond, carries, captured, has_until):
    keep_going = True if cond is None else bool(cond)
    trips = None if trip_count is None else int(trip_count)
    carries, steps, i = list(carries), [], 0
    while keep_going and (trips is None or i < trips):
        out = body(torch.tensor(i), *carries, *captured)
        n_ys = _n_ys(out, len(carries), has_until)
        carries, ys = list(out[: len(carries)]), out[len(carries) : len(carries) + n_ys]
        steps.append(ys)
        if has_until:
            keep_going = not bool(out[-1])
        i += 1
    if not steps:  # ys of length 0, shaped by one call of the body
        empty = _loop_outputs(body, carries, captured, has_until, lambda: 0)
        return (*carries, *(y.new_empty(y.shape) for y in empty[len(carries) :]))
    return (*carries, *(torch.stack(column) for column in zip(*steps, strict=True)))


@register_fake(torchscan_loop, skip_cache=True)
def _loop_fake(body, trip_count, cond, carries, captured, has_until):
    return _loop_outputs(
        body, carries, captured, has_until, lambda: _loop_length(trip_count, cond, has_until)
    )


def _loop_outputs(body, carries, captured, has_until, length_of):
    """The carries and ys of a loop, as one call of ``body`` shapes them, with ys of
    ``length_of()`` iterations."""
    reference = next((t for t in (*carries, *captured) if isinstance(t, torch.Tensor)), None)
    i = torch.zeros((), dtype=torch.int64, device=None if reference is None else reference.device)
    with as_traced_body():
        out = body(i, *carries, *captured)
    ys = out[len(carries) : len(carries) + _n_ys(out, len(carries), has_until)]
    # No size is made for a loop without outputs: torch.export refuses an unbacked size that no
    # output of the model holds.
    length = length_of() if ys else None
    return (
        *[c.new_empty(c.shape) for c in carries],
        *[stacked_like(y, length, 0) for y in ys],
    )


def _loop_length(trip_count: Any, cond: Any, has_until: bool) -> Any:
    """The number of iterations as the fake implementation sees it: the trip count when nothing
    else can stop the loop, else a new size known only when the model runs."""
    if not has_until and cond is None and isinstance(trip_count, (int, torch.SymInt)):
        return trip_count
    fake_mode = detect_fake_mode()
    assert fake_mode is not None  # called by the fake kernel, or while traced
    assert fake_mode.shape_env is not None
    length = fake_mode.shape_env.create_unbacked_symint()
    torch._check(length >= 0)
    return length


_untrainable_loop = autograd_not_implemented(torchscan_loop, deferred_error=True)


@torchscan_loop.py_impl(DispatchKey.Autograd)
def _loop_autograd(body, trip_count, cond, carries, captured, has_until):
    """As ``torchscan_scan``'s: the Python loop with autograd on real tensors, and no backward
    recorded while traced."""
    tensors = [t for t in (trip_count, cond, *carries, *captured) if isinstance(t, torch.Tensor)]
    if runs_eagerly(tensors):
        return _loop_dense(body, trip_count, cond, carries, captured, has_until)
    return _untrainable_loop(body, trip_count, cond, carries, captured, has_until)


@torchscan_loop.py_functionalize_impl
def _loop_functionalize(ctx, body, trip_count, cond, carries, captured, has_until):
    trip_count, cond, carries, captured = [
        ctx.unwrap_tensors(group) for group in (trip_count, cond, carries, captured)
    ]
    with ctx.redispatch_to_next():
        functional_body = ctx.functionalize(maybe_run_with_interpreter(body))
        attach(functional_body, step_of(body))
        out = torchscan_loop(functional_body, trip_count, cond, carries, captured, has_until)
    return ctx.wrap_tensors(out)


@torchscan_loop.py_impl(ProxyTorchDispatchMode)
def _loop_trace(mode, body, trip_count, cond, carries, captured, has_until):
    refuse_without_onnx_hooks(body)
    with disable_proxy_modes_tracing():
        sample_carries = [c.clone() for c in carries]
        reference = next((t for t in (*carries, *captured) if isinstance(t, torch.Tensor)), None)
        i = torch.zeros(
            (), dtype=torch.int64, device=None if reference is None else reference.device
        )
    body_gm, captured = trace_body(mode, body, [i, *sample_carries], captured)
    refuse_mutation(body_gm, 1 + len(carries), 0, captured)
    args = (body_gm, trip_count, cond, carries, captured, has_until)
    outputs = output_values(body_gm)
    ys = outputs[len(carries) : len(carries) + _n_ys(outputs, len(carries), has_until)]
    # From the traced body, not by running it again: a scan or loop nested in it would be traced
    # anew outside the tracer that knows the sizes it reads.
    with disable_proxy_modes_tracing():
        length = _loop_length(trip_count, cond, has_until) if ys else None
        example = (
            *[c.new_empty(c.shape) for c in carries],
            *[stacked_like(y, length, 0) for y in ys],
        )
    return record(mode, torchscan_loop, body_gm, args, example)
