"""The eager runners of a plan: the Python loop (:func:`scan`, :func:`loop`), and the loops of no
step (:func:`scan_no_step`, :func:`loop_no_iteration`), whose ``ys`` get the shapes one call of
the step gives them, found on fake tensors (never on real data) or, where the step reads tensor
values, on zeros."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from torchscan import _context, _layout, _pytree, _steps, _traced
from torchscan._errors import TorchscanValueError
from torchscan._plan import LoopPlan, ScanPlan
from torchscan._until import Until


def scan(plan: ScanPlan) -> tuple[Any, Any]:
    """Every step of ``plan`` in a Python loop: ``x`` of step ``t`` reads index ``t`` of a
    forward sequence and ``n - 1 - t`` of a reversed one."""
    direction = plan.direction
    backwards = direction is not None and direction[0]
    if direction is not None:  # every sequence read one way: the steps run that way
        fn, in_reverse = plan.fn, None
    else:
        fn, in_reverse = _refusing_until(plan), plan.in_reverse

    def reslice(bumps: Sequence[int]) -> Sequence[Any]:
        later = slices(plan, in_reverse, indexed=[b != 0 for b in bumps])
        return (later[::-1] if backwards else later)[1:]

    steps = slices(plan, in_reverse)
    carry, ys = plan.protocol.run(
        fn,
        steps[::-1] if backwards else steps,
        plan.carry,
        plan.out,
        sources=_steps.Sources(plan.xs_leaves, plan.xs_spec),
        step=plan.user,
        reslice=reslice,
    )
    return carry, plan.protocol.outputs.stack(ys, plan.out)


def _refusing_until(plan: ScanPlan) -> Callable[[Any, Any], Any]:
    """The step, refusing ``until``, which a scan laid out leaf by leaf cannot honour."""
    fn, protocol = plan.fn, plan.protocol

    @functools.wraps(fn)
    def step(carry: Any, x: Any) -> Any:
        out = fn(carry, x)
        if isinstance(out, tuple) and len(out) == 3 and isinstance(out[2], Until):
            raise _layout.until_per_leaf(protocol.api, protocol.fn_name)
        return out

    return step


def slices(
    plan: ScanPlan, in_reverse: Sequence[bool] | None = None, indexed: Sequence[bool] = ()
) -> Sequence[Any]:
    """The ``x`` of every step, as views into ``xs`` (``unbind`` gives all of them at once, and
    its backward is one ``stack`` instead of one scatter per step); ``in_reverse`` reads the
    leaves it marks from their end. The tensor leaves that ``indexed`` marks are read one index
    at a time (``select``), as the Python loop reads them: a step may reshape a view of such an
    ``x`` in place while autograd records, which autograd refuses on the views ``unbind``
    makes."""
    marks = iter(indexed)
    columns = [
        (None,) * plan.length  # None: no axis
        if leaf is None or a is None
        else _indexed(leaf, a, plan.length)
        if next(marks, False)
        else leaf.unbind(a)
        for leaf, a in zip(plan.xs_leaves, plan.in_axes, strict=True)
    ]
    if in_reverse is not None:
        columns = [c[::-1] if r else c for c, r in zip(columns, in_reverse, strict=True)]
    if not columns:  # xs is an empty container: every step gets one like it
        return [_pytree.tree_unflatten([], plan.xs_spec)] * plan.length
    if _pytree.is_leaf_spec(plan.xs_spec):
        return columns[0]
    return [_pytree.tree_unflatten(list(step), plan.xs_spec) for step in zip(*columns, strict=True)]


def _indexed(leaf: torch.Tensor, axis: int, n: int) -> list[torch.Tensor]:
    return [leaf.select(axis, t) for t in range(n)]


def scan_no_step(plan: ScanPlan) -> tuple[Any, Any]:
    """``init``, and ``ys`` of length 0 along their axes, with the shapes and dtypes the step
    would give them."""
    fake_x = _pytree.tree_unflatten(
        [
            None if leaf is None or a is None else _without_axis(leaf, a)  # None: no axis
            for leaf, a in zip(plan.xs_leaves, plan.in_axes, strict=True)
        ],
        plan.xs_spec,
    )
    init, protocol = plan.carry.init, plan.protocol
    if _context.dynamo_tracing():
        # Traced for its shapes only: the compiler drops the computation.
        zeros = [None if t is None else torch.zeros_like(t) for t in _pytree.tree_leaves(fake_x)]
        out = plan.fn(init, _pytree.tree_unflatten(zeros, plan.xs_spec))
    else:
        out = protocol.outputs.call_on_fake(
            "xs has length 0", _traced.on_fake_tensors(plan.fn), init, fake_x, real=plan.fn
        )
    y = protocol.check_fake_result(out, plan.carry, plan.out)
    return init, protocol.outputs.empty(y, plan.out)


def _without_axis(leaf: torch.Tensor, axis: int) -> torch.Tensor:
    shape = leaf.shape[:axis] + leaf.shape[axis + 1 :]
    return torch.empty(shape, dtype=leaf.dtype, device=leaf.device)


def loop(plan: LoopPlan) -> tuple[Any, Any]:
    """Every iteration of ``plan`` in a Python loop."""
    trips = None if plan.trip_count is None else max(int(plan.trip_count), 0)
    device = device_of([*plan.carry.leaves, plan.trip_count, plan.cond])
    body = plan.body
    carry, ys = plan.protocol.run(
        lambda carry, i: body(i, carry),
        counter(trips, device),
        plan.carry,
        plan.out,
        refuse_without_until=plan.never_ends or None,
        step=body,
        bounded=trips is not None,
    )
    return carry, plan.protocol.outputs.stack(ys, plan.out)


def loop_no_iteration(plan: LoopPlan) -> tuple[Any, Any]:
    """``init``, and ``ys`` of length 0 with the shapes ``body`` would give them."""
    i = torch.zeros((), dtype=torch.int64, device=device_of(plan.carry.leaves))
    protocol, init = plan.protocol, plan.carry.init
    if _context.dynamo_tracing():
        out = plan.body(i, init)  # traced for its shapes only: the compiler drops it
    else:
        out = protocol.outputs.call_on_fake(
            "no iteration runs", _traced.on_fake_tensors(plan.body), i, init, real=plan.body
        )
    if plan.never_ends and not protocol.has_until(out):
        raise TorchscanValueError(plan.never_ends)
    y = protocol.check_fake_result(out, plan.carry, plan.out)
    return init, protocol.outputs.empty(y, plan.out)


def device_of(candidates: Sequence[Any]) -> torch.device:
    """The device of the first tensor among ``candidates`` (the CPU if none is)."""
    return next((t.device for t in candidates if isinstance(t, torch.Tensor)), torch.device("cpu"))


def counter(trips: int | None, device: torch.device) -> Iterator[torch.Tensor]:
    """The iteration numbers as 0-d int64 tensors, made in batches: one ``torch.tensor(i)`` per
    iteration would cost more than the bookkeeping of the whole loop, and all of them at once
    would cost in proportion to a cap that ``until`` may never reach."""
    start, size = 0, 16
    while trips is None or start < trips:
        stop = start + size if trips is None else min(start + size, trips)
        yield from torch.arange(start, stop, device=device).unbind(0)
        start, size = stop, min(size * 2, 4096)
