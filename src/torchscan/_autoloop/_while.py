"""A converted ``while`` statement: :func:`while_` runs it as one ``torchscan.loop`` where its
condition and carries are tensors (its condition read by :func:`going` while it runs as Python),
else as the Python loop."""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import Any

import torch

from torchscan import _compat
from torchscan._autoloop._base import (
    API,
    Loop,
    _Fallback,
    _last_scanned,
    _record,
    refuse_strict,
)
from torchscan._autoloop._runtime import (
    _failed,
    _fronts,
    _inplace_buffers,
    _lists,
    _not_a_carry,
    _standing_for,
    _unfronted,
)
from torchscan._autoloop._values import (
    STOP,
    _as_flag,
    _write_back,
)
from torchscan._errors import TorchscanTypeError


def while_(
    loop: Loop,
    test: Callable[[tuple[Any, ...]], Any],
    body: Callable[..., Any],
    carry: tuple[Any, ...],
    lists: tuple[list[Any], ...],
    inplace: tuple[int, ...] = (),
    front: tuple[int, ...] = (),
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """Run one converted ``while`` statement: as a :func:`torchscan.loop` where its condition
    is a tensor (or ``True``, with an ``if condition: break`` in the body) and the carries are
    tensors, else as the Python loop. ``test(carry)`` is the condition. Returns the carries
    after the loop and the lists."""
    carry, made = _while(loop, test, body, carry, _fronts(lists, front), inplace)
    return carry, _unfronted(made)


def _while(
    loop: Loop,
    test: Callable[[tuple[Any, ...]], Any],
    body: Callable[..., Any],
    carry: tuple[Any, ...],
    lists: tuple[Any, ...],
    inplace: tuple[int, ...],
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    first = test(carry)  # as Python, before the first step
    is_tensor = isinstance(first, torch.Tensor)
    try:
        if not is_tensor and not (first is True and loop.stops):
            raise _Fallback(_not_a_tensor(first))
        reason = _not_a_carry(loop.carries, carry)
        if reason is not None:
            raise _Fallback(reason)
        buffers = _inplace_buffers(loop, carry, inplace)
        new, ys = _while_loop(loop, test, body, carry, first if is_tensor else None, lists)
        return _write_back(buffers, None, (), new), ys
    except _Fallback as reason:
        if loop.strict and is_tensor:
            refuse_strict(loop, reason)
        _record(loop, False, str(reason))
        return _python_while(first, test, body, carry, lists)


def _python_while(
    first: Any,
    test: Callable[[tuple[Any, ...]], Any],
    body: Callable[..., Any],
    carry: tuple[Any, ...],
    lists: tuple[Any, ...],
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The ``while`` statement as written, from its condition's first value ``first``."""
    going = first
    while going:
        carry, ys, *stop = body(None, carry, False)
        for items, y in builtins.zip(lists, ys, strict=False):
            items.append(y)
        if stop and stop[0] is STOP:
            break
        going = test(carry)
    return carry, lists


def as_written(loop: Loop, carry: tuple[Any, ...]) -> bool | None:
    """Whether a converted ``while`` runs as written now, its carries ``carry`` before it: None
    where something traces or transforms it (torch.export, torch.compile, a dispatch mode, a
    torch.jit trace or a torch.func transform), and the loop operator runs it. Else it runs as
    written, and True where its condition's first value goes through :func:`going`, to record
    whether the loop operator would have run it: the carries are not plain tensors, or the last
    run did not record that it would."""
    if not _compat.untraced():
        return None
    if id(loop) in _last_scanned and all(type(value) is torch.Tensor for value in carry):
        return False  # (the common case, at once: nothing to record)
    _pending[id(loop)] = _not_a_carry(loop.carries[: len(carry)], carry) or ""
    return True


_pending: dict[int, str] = {}
"""Of a ``while`` run as written (by the id of its :class:`Loop`), why its carries keep it
Python, until its condition is first read."""


def going(loop: Loop, condition: Any) -> Any:
    """The first value of the condition of a ``while`` run as written: what the loop operator
    would have made of it and of the carries is recorded."""
    reason = _pending.pop(id(loop), "")
    is_tensor = isinstance(condition, torch.Tensor)
    if not is_tensor and not (condition is True and loop.stops):
        reason = _not_a_tensor(condition)
    if reason and loop.strict and is_tensor:  # as the loop operator would have refused it
        raise TorchscanTypeError(f"{API}: the loop of {loop.where()} runs as Python: {reason}")
    _record(loop, not reason, reason)
    return condition


def _not_a_tensor(condition: Any) -> str:
    return f"its condition is a {type(condition).__name__}, not a tensor: it counts in Python"


def _while_loop(
    loop: Loop,
    test: Callable[[tuple[Any, ...]], Any],
    body: Callable[..., Any],
    carry: tuple[Any, ...],
    first: torch.Tensor | None,
    lists: tuple[list[Any], ...],
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    from torchscan._loop import loop as run_loop
    from torchscan._until import until

    def step(_: torch.Tensor, c: tuple[Any, ...]) -> tuple[Any, Any, Any]:
        new, ys, *stop = body(None, c, True)
        done = ~_as_flag(test(new))
        if stop:
            done = done | stop[0].stop
        return new, ys, until(done)

    step = _standing_for(step, body, loop)
    try:
        new, ys = run_loop(step, carry, cond=None if first is None else _as_flag(first))
    except Exception as error:
        _failed(error, "loop")
    _record(loop, True, "")
    return new, _lists(loop, ys, lists)
