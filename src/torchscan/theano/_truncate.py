"""The pieces of truncated backpropagation through time (``truncate_gradient=k``) when the step
function returns ``until``: a window of the steps backpropagation goes through, known only once
the scan has stopped, and gates (an identity with a backward) that let the gradient through only
inside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


class _Window:
    """The steps backpropagation goes through, from ``start`` on: with ``until`` they are known
    only once the scan has stopped, after the steps ran."""

    def __init__(self) -> None:
        self.start = 0

    def passes(self, step: int, into_state: bool) -> bool:
        if into_state:  # the state step ``step`` read: cut at the window's first step
            return self.start == 0 or step > self.start
        return step >= self.start  # what step ``step`` returned


class _Gate(torch.autograd.Function):
    """The identity, whose backward lets the gradient through only where ``window`` says."""

    @staticmethod
    def forward(ctx, window: _Window, step: int, into_state: bool, *tensors: torch.Tensor):
        ctx.window, ctx.step, ctx.into_state = window, step, into_state
        ctx.set_materialize_grads(False)
        return tuple(t.view_as(t) for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        through = ctx.window.passes(ctx.step, ctx.into_state)
        return (None, None, None, *(grads if through else (None,) * len(grads)))


def _gate(window: _Window, step: int, into_state: bool, values: Sequence[Any]) -> tuple:
    values = list(values)
    where = [i for i, v in enumerate(values) if isinstance(v, torch.Tensor)]
    if where:
        gated = _Gate.apply(window, step, into_state, *(values[i] for i in where))
        for i, g in zip(where, gated, strict=True):
            values[i] = g
    return tuple(values)


def _detach(value: Any) -> Any:
    return value.detach() if isinstance(value, torch.Tensor) else value
