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

import collections
import dataclasses
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from torchscan import _compat, _pytree, _source
from torchscan._errors import HoistWarning
from torchscan._hoist import _policy
from torchscan._hoist._policy import TRACE_AT_CALL as TRACE_AT_CALL
from torchscan._hoist._signature import (
    _CACHE_SIZE,
    _REFUSED_RESULT,
    _Key,
    _meta,
    _module_walks,
    _NotHoistable,
    _Walk,
)
from torchscan._hoist._split import Hoisted
from torchscan._hoist._trace import trace
from torchscan._plan import ScanPlan

_cache: collections.OrderedDict[Any, Any] = collections.OrderedDict()
traces = 0
"""How many steps were traced (for tests: a signature is traced once)."""


def signature(fn: Callable[..., Any], arguments: Any) -> tuple[Any, _Walk]:
    """The key of a step's signature (what it captures, its arguments' :func:`signature_arguments`,
    and the grad mode), and the walk that read it. The modules it reaches are read again only
    where they changed (:func:`_module_walk`): a step made anew at every call (a closure, a
    bound method) is walked quickly."""
    walk = _Walk()
    key = _Key(walk.key(fn))
    walk.finish()
    return (key, arguments, torch.is_grad_enabled()), walk


@dataclasses.dataclass
class Outcome:
    """What the last scan that could be hoisted did: ``"hoisted"``, ``"first call"`` (a step
    is traced at call :data:`TRACE_AT_CALL` of its signature, unless ``hoist=True``), or
    ``"loop"``, with
    the reason."""

    what: str = ""
    reason: str = ""


last = Outcome()
"""What the last scan that could be hoisted did (read by tests and when debugging)."""


def lookup(
    fn: Callable[[Any, Any], Any],
    step_arguments: Any,
    arguments: Callable[[], tuple[Any, Any]],
    check: Callable[[Any], Any],
    *,
    now: bool,
) -> tuple[Hoisted, _Walk] | None:
    """The hoisted step of this signature, traced at its call :data:`TRACE_AT_CALL` (a step
    called once or twice is not worth a trace) or, with ``now``, at its first; ``None`` where it
    runs as the Python loop."""
    global traces
    try:
        key, walk = signature(fn, step_arguments)
    except _NotHoistable as reason:
        _outcome("loop", str(reason))
        return None
    entry = _cache.get(key, 0)
    if isinstance(entry, Hoisted):
        _cache.move_to_end(key)
        _outcome("hoisted")
        return entry, walk
    if isinstance(entry, _Refused):
        _outcome("loop", entry.reason)
        return None
    if isinstance(entry, int) and entry < _policy.TRACE_AT_CALL - 1 and not now:
        _remember(key, entry + 1)  # calls seen
        _outcome("first call")
        return None
    if sys.getprofile() is not None and not callable(sys.getprofile()):
        _outcome("loop", "a profiler that cannot be chained runs (cProfile)")
        return None  # traced when it no longer runs
    try:
        traces += 1
        hoisted = trace(fn, *arguments(), walk, check)
    except _NotHoistable as reason:
        _remember(key, _Refused(str(reason)))
        _outcome("loop", str(reason))
        return None
    _remember(key, hoisted)
    _outcome("hoisted")
    return hoisted, walk


@dataclasses.dataclass(frozen=True)
class _Refused:
    reason: str


def _outcome(what: str, reason: str = "") -> None:
    last.what, last.reason = what, reason


def refuse(fn: Callable[..., Any], step_arguments: Any, reason: str) -> None:
    """Remember that the step of this signature runs as the Python loop."""
    try:
        key, _ = signature(fn, step_arguments)
    except _NotHoistable:
        return
    _remember(key, _Refused(reason))
    _outcome("loop", reason)


def _remember(key: Any, value: Any) -> None:
    _cache[key] = value
    _cache.move_to_end(key)
    while len(_cache) > _CACHE_SIZE:
        _cache.popitem(last=False)


def clear() -> None:
    """Forget every traced step."""
    _cache.clear()
    _module_walks.clear()
    _outcome("")


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
    return _run(plan)


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def signature_arguments(plan: ScanPlan) -> _Key | None:
    """What a signature holds of the arguments of ``plan``: the structures of the carry and of
    ``x``, and the shape (``x`` without the scanned axis: the length is no part of a signature),
    dtype, device and ``requires_grad`` of their leaves; ``None`` where a leaf is a tensor
    subclass. Read from the plan's metadata alone, so kept in its memo."""
    memo = plan.memo
    if "hoist" in memo:
        return memo["hoist"]
    carry_type = plan.carry
    x_meta: list[Any] = [carry_type.spec, plan.xs_spec]
    key: _Key | None = None
    for leaf, axis in zip(plan.xs_leaves, plan.in_axes, strict=True):
        if leaf is None:
            x_meta.append(None)
        elif type(leaf) not in _PLAIN:
            break
        else:
            assert axis is not None  # None for a None leaf alone
            shape = leaf.shape
            x_meta.append(
                (shape[:axis] + shape[axis + 1 :], leaf.dtype, leaf.device, leaf.requires_grad)
            )
    else:
        if all(leaf is None or type(leaf) in _PLAIN for leaf in carry_type.leaves):
            carry_meta = tuple(None if t is None else _meta(t) for t in carry_type.leaves)
            key = _Key((carry_meta, tuple(x_meta)))
    memo["hoist"] = key
    return key


def _run(plan: ScanPlan) -> tuple[Any, Any] | None:
    """``(carry, ys)`` of ``plan`` with its step's hoisted programs, or None where the step is
    not hoisted (this call: :func:`lookup` says why in :data:`last`): the constant part once,
    the sequence part batched over every step where that pays (:func:`~._policy.batching_pays`,
    within :data:`~._policy.AUTO_MEMORY_LIMIT` for ``hoist=None``, and where vmap batches it;
    else at every step, in the loop), the carry's part in the generated loop; ``ys`` stacked
    per leaf as ``plan.out`` lays them out."""
    reverse = plan.direction[0]  # type: ignore[index]
    n = plan.length
    carry_type = plan.carry
    x_key = signature_arguments(plan)
    if x_key is None:
        return None
    protocol = plan.protocol

    def first_step() -> tuple[Any, Any]:
        first = n - 1 if reverse else 0
        x_leaves = [
            None if leaf is None or a is None else leaf.select(a, first)  # None: no axis
            for leaf, a in zip(plan.xs_leaves, plan.in_axes, strict=True)
        ]
        return carry_type.init, _pytree.tree_unflatten(x_leaves, plan.xs_spec)

    found = lookup(
        plan.fn,
        x_key,
        first_step,
        lambda out: protocol.check_fake_result(out, carry_type, plan.out),
        # under saved-tensor hooks a recomputation (torch.utils.checkpoint's) must take the
        # path its forward took, whatever the calls between them: traced at the first call
        now=plan.hoist is True or _compat.saved_tensors_hooks_active(),
    )
    if found is None:
        # (a step whose result the Python loop refuses is refused there, without a warning)
        if plan.hoist is True and last.what == "loop" and last.reason != _REFUSED_RESULT:
            _warn(plan, last.reason)
        return None
    hoisted, walk = found
    captured = [walk.tensors[i] for i in hoisted.captured]
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
    if not _policy.batching_pays(n) or not hoisted.sequence_count or too_big:
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
            refuse(plan.fn, x_key, reason)
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
