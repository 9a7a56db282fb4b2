"""What converted loops call when they run: the choice between a scan and the Python loop, made
at every run from the values the loop is given, and the lists a scan's outputs become.

A converted ``for`` statement calls :func:`for_` with its static description (:class:`Loop`),
the value it iterates over, its body as a function ``body(item, carry) -> (carry, ys)`` and the
values of its carries before it. :func:`for_` runs the body in a Python ``for`` (exactly the
original loop) unless the value is a time axis (a range over a tensor's size, a tensor's rows,
``unbind``, ``enumerate`` and ``zip`` of those) and the carries are tensors; then it runs one
:func:`torchscan.scan`, whose per-step outputs become the lists the loop appended to.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import functools
import inspect
import itertools
import operator
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import torch

from torchscan import _compat, _context
from torchscan._autoloop._base import (
    API,
    UNDEFINED,
    Loop,
    _Fallback,
    _is_tensor_tree,
    _record,
    _symbolic,
    refuse_strict,
)
from torchscan._autoloop._values import (
    _LAZY,
    STOP,
    Range,
    Rows,
    StackedList,
    Unbound,
    _axis_of,
    _one_empty,
    _python_items,
    _stacked,
    _write_back,
    _Zipped,
)
from torchscan._compat import pytree
from torchscan._errors import ExportError, TorchscanError, TorchscanTypeError


def for_(
    loop: Loop,
    iterable: Any,
    body: Callable[..., Any],
    carry: tuple[Any, ...],
    lists: tuple[list[Any], ...],
    slices: tuple[tuple[Any, int], ...] = (),
    buffers: tuple[tuple[Any, ...], ...] = (),
    inplace: tuple[int, ...] = (),
    tests: tuple[tuple[str, ...], Callable[[], tuple[Any, ...]]] | None = None,
    front: tuple[int, ...] = (),
    holder: list[Any] | None = None,
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """Run one converted ``for`` statement: as a scan where ``iterable`` is a time axis and the
    carries are tensors, else as the Python loop. ``slices``: the ``(sequence, axis)`` the body
    indexed at the step number of a range (``x[:, t]``), given to the body after the step
    number; ``buffers``: the ``(name, tensor, axis, carry position or -1)`` of the tensors the
    body writes into at the step number; ``inplace``: the positions of the carries it changes
    only in place (``h += x``); ``tests``: the comparisons the body makes of the step number
    (``"eq"``...) and a function of the values it compares it with; ``front``: the positions of
    the lists it inserts at the front of (``outs.insert(0, y)``). Returns the carries after the
    loop and the lists."""
    carry, made = _for(
        loop, iterable, body, carry, _fronts(lists, front), slices, buffers, inplace, tests, holder
    )
    return carry, _unfronted(made)


def _for(
    loop: Loop,
    iterable: Any,
    body: Callable[..., Any],
    carry: tuple[Any, ...],
    lists: tuple[Any, ...],
    slices: tuple[tuple[Any, int], ...],
    buffers: tuple[tuple[Any, ...], ...],
    inplace: tuple[int, ...],
    tests: tuple[tuple[str, ...], Callable[[], tuple[Any, ...]]] | None,
    holder: list[Any] | None = None,
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    slices = tuple(
        (s.sequence(), s.axis) if isinstance(s, Rows) and a == 0 and not _one_empty(s) else (s, a)
        for s, a in slices
    )
    try:
        plan = _time_axis(iterable, loop)
        for name, buffer, *_ in buffers:
            if not isinstance(buffer, torch.Tensor):
                raise _Fallback(f"it writes into `{name}`, a {type(buffer).__name__}, not a tensor")
        buffers += _inplace_buffers(loop, carry, inplace)
        if tests is not None and plan.index is not None:
            return _scan_with_tests(loop, plan, body, carry, lists, slices, buffers, tests, holder)
        return _scan(loop, plan, iterable, body, carry, lists, slices, buffers, holder)
    except _Fallback as reason:
        if loop.strict and plan_is_time(iterable, loop):
            refuse_strict(loop, reason)
        _record(loop, False, str(reason))
        _refuse_unrolling(loop, iterable, str(reason))
        return _python(_python_iteration(iterable, slices), body, carry, lists)


def _inplace_buffers(
    loop: Loop, carry: tuple[Any, ...], inplace: tuple[int, ...]
) -> tuple[tuple[Any, ...], ...]:
    """The carries changed only in place, as buffers carried whole: each gets its last value
    after the scan, as the loop would have left it."""
    found = []
    for position in inplace:
        value = carry[position]
        if isinstance(value, torch.Tensor):
            found.append((loop.carries[position], value, 0, position))
        elif value is UNDEFINED or value is None:
            raise _Fallback(f"`{loop.carries[position]}`, changed in place, is {value} before it")
    return tuple(found)


def _python_iteration(iterable: Any, slices: tuple[tuple[Any, int], ...]) -> Iterator[Any]:
    """What the body is given at each step of the Python loop."""
    items = _python_items(iterable)
    if slices and isinstance(iterable, (_Zipped, builtins.enumerate)):  # the count of enumerate
        return ((t, *[_take(s, a, t[0]) for s, a in slices]) for t in items)
    if slices:
        return ((t, *[_take(s, a, t) for s, a in slices]) for t in items)
    return items


def plan_is_time(iterable: Any, loop: Loop) -> bool:
    try:
        _time_axis(iterable, loop)
    except _Fallback:
        return False
    return True


@dataclasses.dataclass(frozen=True)
class _Plan:
    """A time axis: the index values (``None`` where the body does not see them as such), the
    tensors scanned and their axes, how many steps, and whether the item is a tuple."""

    index: Range | None
    sequences: tuple[torch.Tensor, ...]
    axes: tuple[int, ...]
    shape: str  # "index", "item", "tuple", "enumerate"
    keepdim: tuple[bool, ...] = ()  # of each sequence: its items keep the axis (split)


_TOO_SHORT = f"{API}: a sequence indexed at the count of an enumerate is too short"

_ONE_EMPTY = "it iterates over `split(1, axis)` of no rows, which gives one empty piece"


def _time_axis(iterable: Any, loop: Loop) -> _Plan:
    if isinstance(iterable, Range):
        if not iterable.sized and not loop.stops:
            raise _Fallback(
                "it counts to a Python number, not to a tensor's size: layers, heads or a "
                "fixed number of steps stay Python"
            )
        return _Plan(iterable, (), (), "index")
    if isinstance(iterable, _Zipped):
        inner = iterable.parts[0]
        if iterable.enumerated and isinstance(inner, _Zipped):
            if inner.enumerated:
                raise _Fallback("it enumerates an enumerate")
            plan = _time_axis(inner, loop)
            return dataclasses.replace(plan, shape="enumerate-zip")
        if any(_one_empty(p) for p in iterable.parts):
            raise _Fallback(_ONE_EMPTY)
        axes = tuple(_axis_of(p) for p in iterable.parts)
        tensors = tuple(p.tensor if isinstance(p, Unbound) else p for p in iterable.parts)
        keepdim = tuple(isinstance(p, Unbound) and p.keepdim for p in iterable.parts)
        shape = "enumerate" if iterable.enumerated else "tuple"
        return _Plan(None, tensors, axes, shape, keepdim)  # type: ignore[arg-type]
    axis = _axis_of(iterable)
    if axis is None:
        what = type(iterable).__name__
        what = f"{'an' if what[:1] in 'aeiou' else 'a'} {what}"
        if isinstance(iterable, torch.Tensor):
            what = "a 0-d tensor"
        raise _Fallback(f"it iterates over {what}, not along a tensor's axis")
    if _one_empty(iterable):
        raise _Fallback(_ONE_EMPTY)
    tensor = iterable.tensor if isinstance(iterable, Unbound) else iterable
    keepdim = isinstance(iterable, Unbound) and iterable.keepdim
    return _Plan(None, (tensor,), (axis,), "item", (keepdim,))


def _python(
    items: Iterator[Any],
    body: Callable[..., Any],
    carry: tuple[Any, ...],
    lists: tuple[list[Any], ...],
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The original loop."""
    for item in items:
        carry, ys, *stop = body(item, carry, False)
        for items_, y in builtins.zip(lists, ys, strict=False):  # then the buffers' Nones
            items_.append(y)
        if stop and stop[0] is STOP:
            break
    return carry, lists


def _first_device(*trees: Any) -> torch.device:
    for tree in trees:
        for leaf in pytree.tree_leaves(tree):
            if isinstance(leaf, torch.Tensor):
                return leaf.device
    return torch.device("cpu")


def _range_sequences(
    r: Range, slices: tuple[tuple[Any, int], ...], device: torch.device
) -> tuple[list[Any], list[int], bool, bool]:
    """The sequences of a scan over ``r``: the step numbers and, where the range steps by 1 or
    -1, each sliced sequence narrowed to the range; in ascending order, with whether the scan
    runs them in reverse, and whether the slices are among them."""
    step = r.step
    if isinstance(step, int) and step in (1, -1):
        low = r.start if step == 1 else r.stop + 1
        count = r.stop - r.start if step == 1 else r.start - r.stop
        reverse = r.reverse != (step == -1)
        if all(isinstance(v, int) for v in (low, count)):
            count = max(count, 0)
            if count == 0:  # no step: an empty slice anywhere (past the end, too)
                low = 0
            if low < 0 < low + count:  # Python's indexing wraps around, narrowing does not
                return _index_sequences(r, device), [0], False, False
        index = torch.arange(low, low + count, device=device)
        narrowed = [s.narrow(a, low, count) for s, a in slices]
        return [index, *narrowed], [0, *[a for _, a in slices]], reverse, True
    return _index_sequences(r, device), [0], False, False


def _index_sequences(r: Range, device: torch.device) -> list[Any]:
    index = torch.arange(r.start, r.stop, r.step, device=device)
    return [index.flip(0) if r.reverse else index]


def _index_select(sequence: torch.Tensor, axis: int, index: torch.Tensor) -> torch.Tensor:
    return sequence.index_select(axis, index.reshape(1)).squeeze(axis)


def _take(sequence: Any, axis: int, index: int) -> Any:
    """``sequence[:, ..., index]`` with ``axis`` full slices first, as the body wrote it."""
    return sequence[(slice(None),) * axis + (index,)] if axis else sequence[index]


def _scan(
    loop: Loop,
    plan: _Plan,
    iterable: Any,
    body: Callable[..., Any],
    carry: tuple[Any, ...],
    lists: tuple[list[Any], ...],
    slices: tuple[tuple[Any, int], ...],
    buffers: tuple[tuple[Any, ...], ...] = (),
    holder: list[Any] | None = None,
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """Run the converted loop as one ``torchscan.scan``: the sequences it steps along (a
    ``range``'s step numbers, ``enumerate``'s, the tensors of ``zip``) and the ``slices`` it
    takes at the step number as ``xs``, the ``carry`` as the carry, the values appended to
    ``lists`` as ``ys`` (returned to be extended), the rows of ``buffers`` written at the step
    number as ``ys`` written back after the scan. Raises :class:`_Fallback` where the loop is to
    run as Python after all."""
    from torchscan._scan import scan

    for sequence, _ in slices:
        if not isinstance(sequence, torch.Tensor):
            raise _Fallback(f"it indexes a {type(sequence).__name__} at the step number")
    device = _first_device(carry, plan.sequences, slices)
    xs: list[Any] = []
    in_axes: list[int] = []
    reverse = False
    sliced = False  # the slices of the step number given as sequences
    if plan.index is not None:
        xs, in_axes, reverse, sliced = _range_sequences(plan.index, slices, device)
    else:
        if plan.shape in ("enumerate", "enumerate-zip"):
            n = plan.sequences[0].shape[plan.axes[0]]
            xs.append(torch.arange(n, device=device))
            in_axes.append(0)
        xs.extend(plan.sequences)
        in_axes.extend(plan.axes)
        if slices:  # indexed at the count of enumerate: from 0, one row a step
            n = plan.sequences[0].shape[plan.axes[0]]
            for sequence, axis in slices:
                size = sequence.shape[axis]
                if isinstance(n, int) and isinstance(size, int) and size < n:
                    raise _Fallback(
                        f"it indexes a sequence of {size} at the count of an enumerate of {n}"
                    )
                torch._check(size >= n, lambda: _TOO_SHORT)
                xs.append(sequence.narrow(axis, 0, n))
                in_axes.append(axis)
    shape = plan.shape
    # the sequences whose items keep their axis (split), after the step numbers of enumerate
    offset = len(xs) - len(plan.sequences) - (len(slices) if plan.index is None else 0)
    kept_axes = {
        offset + k: a
        for k, (a, keep) in enumerate(builtins.zip(plan.axes, plan.keepdim, strict=False))
        if keep
    }

    # what the step reads of the plan: numbers and flags, no tensor whose shape holds the number
    # of steps (a hoisted step's signature would then hold it, and each length be traced anew)
    n_sequences, n_slices = len(plan.sequences), len(slices)
    enumerated_slices = bool(slices) and plan.index is None
    indexed = slices if shape == "index" and slices and not sliced else ()  # (range steps of 2)

    def step(c: tuple[Any, ...], x: tuple[Any, ...]) -> tuple[Any, Any]:
        if kept_axes:
            x = tuple(v.unsqueeze(kept_axes[k]) if k in kept_axes else v for k, v in enumerate(x))
        if shape == "index":
            if not n_slices:
                item = x[0]
            elif not indexed:
                item = tuple(x)
            else:
                item = (x[0], *[_index_select(s, a, x[0]) for s, a in indexed])
        elif shape == "item":
            item = x[-1]
        elif shape == "tuple":
            item = tuple(x)
        elif shape == "enumerate":
            item = (x[0], x[1])
        else:  # enumerate of zip
            item = (x[0], tuple(x[1 : 1 + n_sequences]))
        if enumerated_slices:  # enumerate's: the rows at its count after the item
            item = (item, *x[len(x) - n_slices :])
        return body(item, c, True)

    step = _standing_for(step, body, loop)
    lengths = {
        int(t.shape[a]) for t, a in builtins.zip(xs, in_axes, strict=True) if not _symbolic(t, a)
    }
    if len(lengths) > 1:
        raise _Fallback("the sequences it zips have different lengths")
    first: tuple[Any, ...] | None = None
    reason = _not_a_carry(loop.carries, carry)
    if reason is not None and (loop.stops or loop.skips):
        word = "break" if loop.stops else "continue"
        raise _Fallback(f"{reason}, and the loop may `{word}` at its first step")
    if _runs_as_written(lengths) and not (reason is not None and 0 in lengths):
        return _as_written(loop, _python_iteration(iterable, slices), body, carry, lists, reason)
    if reason is not None:  # the first step as Python runs it, the others scanned from its carry
        n = xs[0].shape[in_axes[0]]
        if isinstance(n, int) and n == 0:
            raise _Fallback(reason)
        message = f"{API}: {reason}, and the loop at {loop.where()} ran no step"
        torch._check(n > 0, lambda: message)  # (a string: TorchDynamo takes it as it is)
        first_index = n - 1 if reverse else 0
        x0 = tuple(t.select(a, first_index) for t, a in builtins.zip(xs, in_axes, strict=True))
        with _templates(holder, buffers):
            carry, first_ys = step(carry, x0)[:2]
        first = first_ys
        xs = [
            t.narrow(a, 0 if reverse else 1, n - 1)
            for t, a in builtins.zip(xs, in_axes, strict=True)
        ]
        reason = _not_a_carry(loop.carries, carry, "after the first step")
        if reason is not None:  # the other steps in Python too
            if loop.strict:
                raise TorchscanTypeError(
                    f"{API}: the loop of {loop.where()} runs as Python: {reason}"
                )
            if buffers:
                raise _Fallback(reason)  # the first step wrote nothing in place
            _record(loop, False, reason)
            for items, y in builtins.zip(lists, first_ys, strict=True):
                items.append(y)
            rest = itertools.islice(_python_iteration(iterable, slices), 1, None)
            return _python(rest, body, carry, lists)
    try:
        options: dict[str, Any] = {"in_reverse": True} if reverse else {}  # in step order
        with _templates(holder, buffers):
            new, ys = scan(step, carry, tuple(xs), in_axes=tuple(in_axes), **options)
    except Exception as error:
        _failed(error, "scan")
    if first is not None:
        ys = pytree.tree_map(lambda y0, y: torch.cat([y0.unsqueeze(0), y]), first, ys)
    if buffers:
        new = _write_back(buffers, plan.index, ys[len(lists) :], new)
        ys = ys[: len(lists)]
    _record(loop, True, "")
    return new, _lists(loop, ys, lists)


def runs_as_written(loop: Loop, iterable: Any, carry: tuple[Any, ...]) -> bool:
    """Whether a converted ``for`` runs as written now, over ``iterable`` from the carries
    ``carry``: nothing traces it (:func:`_compat.untraced`), it
    runs fewer than :data:`AS_WRITTEN_BELOW` steps, and its carries are tensors; else
    :func:`for_` runs it. A run as written records nothing: the report keeps what the last scan
    of the loop did (before one: what the analysis found)."""
    if not _compat.untraced():
        return False
    kind = type(iterable)
    if kind is torch.Tensor:  # (the common forms first, read at once)
        if not iterable.dim():
            return False
        n = iterable.shape[0]
    elif kind is Range:
        start, stop, step = iterable.start, iterable.stop, iterable.step
        if type(start) is not int or type(stop) is not int or type(step) is not int:
            return False
        if not iterable.sized and not loop.stops:
            return False  # (a Python count: for_ says why it stays Python)
        n = len(builtins.range(start, stop, step))
    else:
        try:
            plan = _time_axis(iterable, loop)
        except _Fallback:
            return False
        if plan.index is not None:
            return False
        lengths = {t.shape[a] for t, a in builtins.zip(plan.sequences, plan.axes, strict=True)}
        if len(lengths) != 1:  # (zipped unequal: for_ says why it stays Python)
            return False
        (n,) = lengths
    if not (isinstance(n, int) and n < AS_WRITTEN_BELOW):
        return False
    for value in carry:
        if type(value) is not torch.Tensor:
            if _not_a_carry(loop.carries[: len(carry)], carry) is not None:
                return False
            break
    return True


AS_WRITTEN_BELOW = 32
"""Eagerly, with nothing tracing it, a converted ``for`` of fewer steps runs as written: the
fixed cost of a scan (reading its step's signature, batching the step's work over the steps) is
not won back over fewer (``benchmarks/autoloop.py --T 16``)."""


def _runs_as_written(lengths: set[int]) -> bool:
    """Whether a converted loop of ``lengths`` steps (empty: a symbolic number) runs as written
    now: nothing traces it, and it runs fewer than :data:`AS_WRITTEN_BELOW` steps."""
    return (
        bool(lengths)
        and all(isinstance(n, int) for n in lengths)
        and max(lengths) < AS_WRITTEN_BELOW
        and _compat.untraced()
    )


def _as_written(
    loop: Loop,
    items: Iterator[Any],
    body: Callable[..., Any],
    carry: tuple[Any, ...],
    lists: tuple[list[Any], ...],
    reason: str | None,
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """A converted loop run as written (:func:`_runs_as_written`), ``reason`` why its carries
    are no scan's before its first step (a state the first step makes). Nothing is recorded,
    as by :func:`runs_as_written`; with ``strict``, a carry still no tensor after the loop is
    refused, as the scan refuses it after the first step."""
    new, made = _python(items, body, carry, lists)
    if reason is not None and loop.strict:
        reason = _not_a_carry(loop.carries, new, "after the first step")
        if reason is not None:
            raise TorchscanTypeError(f"{API}: the loop of {loop.where()} runs as Python: {reason}")
    return new, made


@contextlib.contextmanager
def _templates(holder: list[Any] | None, buffers: tuple[tuple[Any, ...], ...]) -> Iterator[None]:
    """While a scan runs the step, the tensors of ``holder`` (those the step writes into, by
    :func:`write`) as templates: of their dtype and device, their axis of steps of size 1. In a
    scan the step reads only that of them, and what it captures then holds no number of steps:
    one hoisted form serves every length. As Python runs the step, the tensors themselves."""
    if not holder:
        yield
        return
    tensors = list(holder)
    axes = [axis for _, _, axis, position, *_ in buffers if position == -1]
    holder[:] = [
        t.new_empty((*t.shape[:axis], 1, *t.shape[axis + 1 :]))
        if isinstance(t, torch.Tensor)
        else t
        for t, axis in builtins.zip(tensors, axes, strict=True)
    ]
    try:
        yield
    finally:
        holder[:] = tensors


def _scan_with_tests(
    loop: Loop,
    plan: _Plan,
    body: Callable[..., Any],
    carry: tuple[Any, ...],
    lists: tuple[list[Any], ...],
    slices: tuple[tuple[Any, int], ...],
    buffers: tuple[tuple[Any, ...], ...],
    tests: tuple[tuple[str, ...], Callable[[], tuple[Any, ...]]],
    holder: list[Any] | None = None,
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """A loop whose body tests the step number (``if t == 0:``): its first and last steps run
    as Python, with the step number a number, and the scan runs the others, where each test has
    the value it has at all of them (else the loop runs as Python)."""
    assert plan.index is not None
    ops, others_of = tests
    try:
        others = others_of()
    except Exception as error:  # raised again by the Python loop, at its step
        raise _Fallback(f"a value the step number is compared with failed ({error})") from None
    first, direction, n = _steps_of(plan.index)
    if isinstance(n, int) and n == 0:
        _record(loop, True, "")
        return carry, lists
    if not isinstance(n, int):
        message = f"{API}: the loop at {loop.where()} runs fewer than 2 steps"
        torch._check(n >= 2, lambda: message)  # (a string: TorchDynamo takes it as it is)

    def number(k: Any) -> Any:  # the step number of the k-th step
        return first + direction * k

    def item_at(t: Any) -> Any:
        return (t, *[_take(s, a, t) for s, a in slices]) if slices else t

    compared = builtins.list(builtins.zip(ops, others, strict=True))
    short = isinstance(n, int) and n <= 2  # every step peeled
    constants = tuple(
        False if short else _constant_test(op, other, (number(1), number(n - 2)), n, direction)
        for op, other in compared
    )
    if any(c is None for c in constants):
        raise _Fallback("a test of the step number does not have one value at all the middle steps")

    def differs(t: Any) -> bool:  # a test has another value at step number t
        return any(
            not _known(getattr(operator, op)(t, other) == c)
            for (op, other), c in builtins.zip(compared, constants, strict=True)
        )

    peel_first = short or differs(first) or _not_a_carry(loop.carries, carry) is not None
    peel_last = not short and differs(number(n - 1))
    if peel_first:
        carry, first_ys, *_ = body(item_at(first), carry, False)  # as Python runs it
        for items, y in builtins.zip(lists, first_ys, strict=False):
            items.append(y)
    if short:
        if n == 2:
            carry, last_ys, *_ = body(item_at(number(1)), carry, False)
            for items, y in builtins.zip(lists, last_ys, strict=False):
                items.append(y)
        _record(loop, True, "")
        return carry, lists
    low = number(1) if peel_first else first
    count = n - peel_first - peel_last
    rest = Range(low, low + direction * count, direction)
    try:
        carry, made = _scan(
            loop,
            dataclasses.replace(plan, index=rest),
            rest,
            _with_tests(body, constants),  # type: ignore[arg-type]
            carry,
            lists,
            slices,
            buffers,
            holder,
        )
    except _Fallback as reason:  # the other steps as Python runs them
        if loop.strict:
            raise TorchscanTypeError(
                f"{API}: the loop of {loop.where()} runs as Python: {reason}"
            ) from None
        _record(loop, False, str(reason))
        steps = (number(k) for k in builtins.range(1 if peel_first else 0, n))
        return _python((item_at(t) for t in steps), body, carry, lists)
    if not peel_last:
        return carry, made
    carry, last_ys, *_ = body(item_at(number(n - 1)), carry, False)
    return carry, tuple(
        _with_last(items, y, isinstance(before, _Front))
        for items, y, before in builtins.zip(made, last_ys, lists, strict=False)
    )


def _known(value: Any) -> bool:
    """Whether ``value`` (a bool, or a symbolic one while torch traces) is surely true."""
    if isinstance(value, builtins.bool):
        return value
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return statically_known_true(value)


def _with_tests(body: Callable[..., Any], constants: tuple[bool, ...]) -> Callable[..., Any]:
    """``body`` given the values of its tests of the step number (positionally: its parameter's
    name is mangled in a method)."""

    def tested(item: Any, carry: tuple[Any, ...], scanning: bool) -> Any:
        return body(item, carry, scanning, constants)

    tested.__wrapped__ = body  # type: ignore[attr-defined]
    return tested


def _steps_of(r: Range) -> tuple[Any, int, Any]:
    """The first step number of a range in the order it runs, +1 or -1, and how many steps."""
    if all(isinstance(v, int) for v in (r.start, r.stop, r.step)):
        values = builtins.range(r.start, r.stop, r.step)
        if r.reverse:
            values = values[::-1]
        if values.step not in (1, -1):
            raise _Fallback("it tests the step number of a range that steps by more than 1")
        return (values[0] if values else 0), values.step, len(values)
    if r.step not in (1, -1):
        raise _Fallback("it tests the step number of a range that steps by more than 1")
    n = r.stop - r.start if r.step == 1 else r.start - r.stop
    first = r.start
    last = first + r.step * (n - 1)
    return (last, -r.step, n) if r.reverse else (first, r.step, n)


def _constant_test(
    op: str, other: Any, middle: tuple[Any, Any], n: Any, direction: int
) -> bool | None:
    """The value of ``t <op> other`` at every step number ``t`` from ``middle[0]`` to
    ``middle[1]``, or None where it is not one value (or not known while torch traces)."""
    compare = getattr(operator, op)
    if isinstance(n, int):
        if n <= 2:
            return False  # no middle step: any value
        low, high = sorted(middle)
        values = {builtins.bool(compare(t, other)) for t in builtins.range(low, high + 1)}
        return values.pop() if len(values) == 1 else None
    if isinstance(other, torch.Tensor):
        return None
    low, high = middle if direction > 0 else middle[::-1]
    if op in ("eq", "ne"):  # outside the middle steps: never equal
        outside = _known(other < low) or _known(other > high)
        return (op == "ne") if outside else None
    # monotone in t: true at the lowest step number of gt and ge is true at every higher one,
    # false at the highest is false at every lower one (and the other way for lt and le)
    rising = op in ("gt", "ge")
    if _known(compare(low if rising else high, other)):
        return True
    if _known(compare(high if rising else low, other) == False):  # noqa: E712 (symbolic)
        return False
    return None


def _with_last(items: Any, y: Any, front: bool = False) -> Any:
    """A loop's list with the value of its last step appended (inserted at the front where
    ``front``), keeping its stacked outputs."""
    stacked = _stacked(items)
    if (
        stacked is not None
        and isinstance(y, torch.Tensor)
        and y.shape == stacked.shape[1:]
        and y.dtype == stacked.dtype
    ):
        parts = [y.unsqueeze(0), stacked] if front else [stacked, y.unsqueeze(0)]
        return StackedList._of(torch.cat(parts), items.lazy)
    if getattr(items, "lazy", ""):
        raise TorchscanTypeError(items.lazy)
    items = builtins.list(items)
    items.insert(0 if front else len(items), y)
    return items


class _Front:
    """A list the loop inserts each value at the front of (``outs.insert(0, y)``): what the
    runtime appends goes first."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def append(self, value: Any) -> None:
        self.items.insert(0, value)


def _fronts(lists: tuple[list[Any], ...], front: tuple[int, ...]) -> tuple[Any, ...]:
    return tuple(_Front(items) if k in front else items for k, items in enumerate(lists))


def _unfronted(lists: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(items.items if isinstance(items, _Front) else items for items in lists)


def _lists(loop: Loop, ys: tuple[Any, ...], before: tuple[Any, ...]) -> tuple[StackedList, ...]:
    """The lists a loop appended to: the items they held ``before`` it (``[y0]``) and its
    stacked outputs (in reverse order and before those items where it inserted each at the
    front, :class:`_Front`); their items made only where the number of steps is a number (not
    while torch traces the model)."""
    made = []
    for y, items in builtins.zip(ys, before, strict=True):
        lazy = "" if isinstance(y.shape[0], int) else _LAZY.format(api=API, where=loop.where())
        front = isinstance(items, _Front)
        prefix = list.__getitem__(items.items if front else items, slice(None))
        if front:
            y = y.flip(0)
        if prefix and all(
            isinstance(p, torch.Tensor)
            and p.shape == y.shape[1:]
            and p.dtype == y.dtype
            and p.device == y.device
            for p in prefix
        ):
            before_y = torch.stack(prefix)
            y = torch.cat([y, before_y] if front else [before_y, y])
        elif prefix:  # items unlike the loop's: a list of them all, no stacked outputs
            if lazy:
                raise TorchscanTypeError(lazy)
            rows = builtins.list(y.unbind(0))
            result = StackedList([*rows, *prefix] if front else [*prefix, *rows])
            result.stacked, result.lazy = None, ""
            made.append(result)
            continue
        made.append(StackedList._of(y, lazy))
    return tuple(made)


def _failed(error: Exception, what: str) -> NoReturn:
    """What a step that failed as a ``scan`` or ``loop`` raises: while torch exports the model,
    the error itself (the Python loop could only be unrolled to the length being traced);
    else the reason to run the loop as Python, which raises the error again where it is the
    user's own."""
    if _context.exporting() or _compat.is_recomputation_stop(error):
        raise error
    if isinstance(error, TorchscanError):
        raise _Fallback(_first_line(error)) from None
    raise _Fallback(
        f"its step failed as a {what} ({type(error).__name__}: {_first_line(error)})", error
    ) from None


def _standing_for(step: Callable[..., Any], body: Callable[..., Any], loop: Loop) -> Any:
    """``step``, marked (``__wrapped__``) as standing for the loop's ``body``, in the user's file:
    what torchscan keeps per step function is kept per loop, and refusals of what a step does
    while a model is exported name the loop and its lines."""
    if _context.dynamo_tracing():
        return step  # TorchDynamo cannot set attributes of a partial; nothing is exported
    inspect.unwrap(body).__qualname__ = f"the loop at line {loop.lineno} of {loop.function}"
    marked = functools.partial(step)
    marked.__wrapped__ = body  # type: ignore[attr-defined]
    return marked


def _not_a_carry(
    names: tuple[str, ...], carry: tuple[Any, ...], when: str = "before the loop"
) -> str | None:
    """Why a value of the carry cannot be a scan's (unbound, not a tensor or a pytree of
    tensors), or None."""
    for name, value in builtins.zip(names, carry, strict=True):
        if value is UNDEFINED:
            return f"`{name}` is not bound {when}"
        if value is None:  # as `h = None`, a state the first step makes
            return f"`{name}` is None {when}"
        if not _is_tensor_tree(value):
            kind = type(value).__name__
            article = "an" if kind[:1] in "aeiou" else "a"
            return (
                f"`{name}` is {article} {kind} {when}, not a tensor or a pytree of tensors: "
                "make it a tensor before the loop (torch.tensor(0))"
            )
    return None


def _first_line(error: BaseException) -> str:
    """The first line of an error's message (and the next, where the first ends with a
    colon), without the API's name."""
    text = str(error)
    if text.startswith("torchscan.scan: "):
        text = text[len("torchscan.scan: ") :]
    lines = [line.strip() for line in text.split("\n") if line.strip()] or [""]
    return " ".join(lines[:2]) if lines[0].endswith(":") else lines[0]


def kept(loop: Loop, iterable: Any) -> Any:
    """The iterable of a loop that stays Python, as it is (None for a ``while``); recorded,
    and refused with ``strict`` where it runs along a tensor's axis, and while torch exports
    where the number of its steps is a dynamic size (the loop would be unrolled to the length
    being traced)."""
    _record(loop, False, loop.reason)
    if loop.strict and iterable is not None and _axis_of(iterable) is not None:
        raise TorchscanTypeError(
            f"{API}: the loop of {loop.where()} runs along a tensor's axis but stays Python: "
            f"{loop.reason}"
        )
    _refuse_unrolling(loop, iterable, loop.reason)
    return iterable


def _refuse_unrolling(loop: Loop, iterable: Any, reason: str) -> None:
    """Refuse, while torch exports, a loop that runs as Python over a dynamic number of steps."""
    if iterable is None or not _context.exporting() or not _dynamic_steps(iterable):
        return
    raise ExportError(
        f"{API}: the loop of {loop.where()} runs as Python ({reason}), so torch.export would "
        "unroll it to the length being traced, which is dynamic: rewrite it as the reason says, "
        "or export with a static length"
    )


def _dynamic_steps(iterable: Any) -> bool:
    """Whether the number of steps of iterating ``iterable`` is a symbolic size."""
    if isinstance(iterable, Range):
        return not all(isinstance(v, int) for v in (iterable.start, iterable.stop, iterable.step))
    if isinstance(iterable, _Zipped):
        return any(_dynamic_steps(p) for p in iterable.parts)
    axis = _axis_of(iterable)
    if axis is None:
        return False
    tensor = iterable.tensor if isinstance(iterable, Unbound) else iterable
    return _symbolic(tensor, axis)
