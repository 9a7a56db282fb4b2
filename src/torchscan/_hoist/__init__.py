"""Hoisting: the work of a scan's step that does not depend on the carry, done once per call.

A step such as ``h = tanh(x @ W + h @ U)`` computes ``x @ W`` at every step although it depends
on ``x`` alone. The ``"hoisted"`` strategy traces the step once per signature into a graph of
ATen operations (on fake tensors, so that Python control flow on tensor values fails the trace),
gives every node a class, and runs each class where it belongs:

==========  =========================================================================  ==========
class       what the node depends on                                                   runs
==========  =========================================================================  ==========
constant    captured tensors (parameters, buffers) and constants only                  once
sequence    ``x`` too, but not the carry                                               once, over
                                                                                       every step
                                                                                       (vmap)
carry       the carry, or a random operation (the RNG stream stays the loop's)         every step
==========  =========================================================================  ==========

A step is hoisted only where running the graph instead of the step cannot be told apart from the
Python loop but by rounding (a matmul over the whole sequence may add in another order):

* it traces on fake tensors: no Python control flow on tensor values, no ``.item()``, no
  operation whose output shape depends on values, no value of a captured tensor read by Python
  (``bool(buffer)``, a captured 0-d integer tensor as an index);
* it changes no argument and no captured tensor in place (a batch norm that updates its running
  statistics, a buffer written into); a value it writes into is made in the class of the write;
* the Python it runs on its behalf changes no state: no ``print``, no logging, no warnings, no
  ``random`` or ``time``, no assignment to an attribute, a global, a subscript or an enclosing
  function's variable, no mutation of a list, dict or set it captures, no nested scan; the
  trace stops before such a call, so that tracing changes nothing either;
* it returns ``(carry, y)`` or ``(carry, y, until(stop))`` of tensors, and what it captures is
  of known kinds: tensors, modules, functions, numbers, strings, and containers and plain
  objects of them.

Everything the step captures is part of its signature, read at every call: tensors by their
shapes, dtypes, devices and whether they require gradients (their values are read when the graph
runs, so a parameter updated in place is seen), Python values by value, modules with their
``training`` flag. A step whose signature changes is traced again; one that cannot be hoisted
runs as the Python loop, as before. Results equal the Python loop's within rounding, gradients
to ``xs``, ``init`` and every captured tensor included.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from torchscan import _compat, _pytree, _source
from torchscan._errors import HoistWarning
from torchscan._hoist import _policy
from torchscan._hoist._policy import TRACE_AT_CALL as TRACE_AT_CALL
from torchscan._hoist._signature import (
    _REFUSED_RESULT,
    _outcome,
    last,
    lookup,
    refuse,
    signature_arguments,
)
from torchscan._hoist._signature import Hoisted as Hoisted
from torchscan._hoist._signature import _module_walks as _module_walks
from torchscan._hoist._signature import clear as clear
from torchscan._hoist._signature import signature as signature
from torchscan._hoist._trace import trace
from torchscan._plan import ScanPlan


def eligible(plan: ScanPlan) -> bool:
    """Whether the context of ``plan`` lets it be hoisted at all (read before its signature)."""
    if plan.hoist is False or plan.direction is None or not isinstance(plan.length, int):
        return False
    if torch.is_autocast_enabled() or torch.is_inference_mode_enabled():
        return False
    return not _compat.functorch_transforms_active()


def scan(plan: ScanPlan) -> tuple[Any, Any] | None:
    """The steps of ``plan`` with the work that does not depend on the carry done once; ``None``
    where the step cannot be hoisted, and runs as the Python loop."""
    found = prepare(plan)
    return None if found is None else execute(plan, *found)


def prepare(plan: ScanPlan, *, now: bool = False) -> tuple[Hoisted, list[torch.Tensor]] | None:
    """The hoisted step of ``plan`` and the tensors it captures (:func:`execute` runs it), or
    None where the step is not hoisted (this call: :func:`lookup` says why in :data:`last`);
    ``now``: traced at its first call, as with ``hoist=True``."""
    # (the plan's direction, read by eligible() for this call, is in its memo)
    reverse = (plan.memo.get("direction") or plan.direction)[0]  # type: ignore[index]
    n = plan.length
    carry_type = plan.carry
    protocol = plan.protocol

    def first_step() -> tuple[Any, Any]:
        first = n - 1 if reverse else 0
        x_leaves = [
            None if leaf is None or a is None else leaf.select(a, first)  # None: no axis
            for leaf, a in zip(plan.xs_leaves, plan.in_axes, strict=True)
        ]
        return carry_type.init, _pytree.tree_unflatten(x_leaves, plan.xs_spec)

    found = lookup(
        plan,
        first_step,
        lambda out: protocol.check_fake_result(out, carry_type, plan.out),
        # under saved-tensor hooks a recomputation (torch.utils.checkpoint's) must take the
        # path its forward took, whatever the calls between them: traced at the first call
        now=now or plan.hoist is True or _compat.saved_tensors_hooks_active(),
        trace=trace,
    )
    if found is None:
        # (a step whose result the Python loop refuses is refused there, without a warning)
        if plan.hoist is True and last.what == "loop" and last.reason != _REFUSED_RESULT:
            _warn(plan, last.reason)
        return None
    hoisted, walk = found
    return hoisted, [walk.tensors[i] for i in hoisted.captured]


def execute(
    plan: ScanPlan, hoisted: Hoisted, captured: Sequence[torch.Tensor]
) -> tuple[Any, Any] | None:
    """``(carry, ys)`` of ``plan`` with its step's hoisted programs (:func:`prepare`), which
    capture ``captured`` (None where vmap cannot batch its sequence part, and the signature is
    refused from then on): the constant part once, the sequence part batched over every step
    where that pays (:data:`~._policy.BATCH_FROM`, within :data:`~._policy.AUTO_MEMORY_LIMIT` for
    ``hoist=None``, and where vmap batches it; else at every step, in the loop), the carry's part
    in the generated loop; ``ys`` stacked per leaf as ``plan.out`` lays them out."""
    reverse = (plan.memo.get("direction") or plan.direction)[0]  # type: ignore[index]
    n = plan.length
    carry_type = plan.carry
    once = hoisted.once(*captured)
    xs = [leaf for leaf in plan.xs_leaves if leaf is not None]
    axes = [a for a in plan.in_axes if a is not None]  # those of the tensors, as xs
    carry = [leaf for leaf in carry_type.leaves if leaf is not None]
    order = range(n - 1, -1, -1) if reverse else range(n)
    too_big = plan.hoist is None and hoisted.sequence_bytes * n > _policy.AUTO_MEMORY_LIMIT
    if too_big:
        _outcome(
            "hoisted",
            "the sequence part runs at every step: batched, it would take more "
            "than AUTO_MEMORY_LIMIT bytes",
        )
    if n < _policy.BATCH_FROM or not hoisted.sequence_count or too_big:
        # a loop that may stop early takes each step's slice as it comes to it
        columns = [
            _Slices(x, a) if hoisted.stops else x.unbind(a) for x, a in zip(xs, axes, strict=True)
        ]
        loop = hoisted.inline
    else:
        try:
            sequences = _compat.map_over(hoisted.over, list(zip(xs, axes, strict=True)), once)
        except Exception as error:
            reason = f"vmap cannot batch it ({type(error).__name__}: {error})"
            refuse(plan.fn, signature_arguments(plan), reason)
            _warn(plan, reason)
            return None
        columns = [s.unbind(0) for s in sequences]
        columns += [xs[i].unbind(axes[i]) for i in hoisted.x_used]
        loop = hoisted.loop
    carry_out, y_columns, _ = loop(carry, columns, [*captured, *once], order)
    if carry_type.single:
        final_carry: Any = carry_out[0]
    else:
        tensors = iter(carry_out)
        final = [next(tensors) if leaf is not None else None for leaf in carry_type.leaves]
        final_carry = _pytree.tree_unflatten(final, carry_type.spec)
    # Every step's y has the types the trace checked: stacked without checking them again.
    layout, flags = plan.out, hoisted.y_tensor
    if layout.axes_prefix is None and isinstance(layout.reverse_prefix, bool):
        axes = [layout.axis] * len(y_columns)
        reverses = [layout.reverse_prefix] * len(y_columns)
    else:
        y_first = _pytree.tree_unflatten(
            _fill([column[0] for column in y_columns], flags), hoisted.y_spec
        )
        axes = [a for a, t in zip(layout.axes(y_first), flags, strict=True) if t]
        reverses = [r for r, t in zip(layout.reverse(y_first), flags, strict=True) if t]
    stacked = [
        torch.stack(column[::-1] if backwards else column, axis)
        for column, axis, backwards in zip(y_columns, axes, reverses, strict=True)
    ]
    if hoisted.y_leaf:
        return final_carry, stacked[0]
    return final_carry, _pytree.tree_unflatten(_fill(stacked, flags), hoisted.y_spec)


class _Slices:
    """``x.unbind(axis)`` taken one step at a time: ``[t]`` is ``x.select(axis, t)``."""

    __slots__ = ("axis", "x")

    def __init__(self, x: torch.Tensor, axis: int) -> None:
        self.x, self.axis = x, axis

    def __getitem__(self, t: int) -> torch.Tensor:
        return self.x.select(self.axis, t)


def _warn(plan: ScanPlan, reason: str) -> None:
    """With ``hoist=True``, say why the step runs as the Python loop instead."""
    source = _source.StepSource.of(plan.user, plan.protocol.api, plan.protocol.fn_name)
    where = f", defined at {source.defined}" if source.defined else ""
    warnings.warn(
        f"{source.who}{where} is not hoisted although hoist=True: {reason}. It runs as the "
        "Python loop, every step as written.",
        HoistWarning,
        stacklevel=_users_frame(),
    )


def _users_frame() -> int:
    """The ``stacklevel`` of the first frame of the user's code that calls this one."""
    frame, level = sys._getframe(1), 1
    while frame is not None and not _source.is_users(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    return level


def _fill(tensors: Sequence[Any], flags: Sequence[bool]) -> list[Any]:
    it = iter(tensors)
    return [next(it) if flag else None for flag in flags]
