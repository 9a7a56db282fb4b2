"""``torchscan.loop`` and ``torchscan.until``: the ONNX ``Loop``, written as a Python function."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import torch

from torchscan import _checks, _outputs

Carry = TypeVar("Carry")
Y = Any

_API = "torchscan.loop"
_OUTPUTS = _outputs.Outputs(_API, "body", "iteration")


@dataclasses.dataclass(frozen=True)
class Until:
    """The stop flag a loop body returns last: see :func:`until`."""

    stop: Any


def until(stop: torch.Tensor) -> Until:
    """Mark ``stop`` as the flag that ends a loop after the current iteration.

    A ``loop`` body returns ``(carry, y, torchscan.until(stop))``: when ``stop`` (a 0-d bool
    tensor) is true, the iteration that computed it is the last one, and its carry and ``y`` are
    kept. Exported, ``until(stop)`` becomes the condition output of the ONNX ``Loop`` body,
    ``Not(stop)``.
    """
    return Until(stop)


def loop(
    body: Callable[[torch.Tensor, Carry], tuple[Carry, Y] | tuple[Carry, Y, Until]],
    init: Carry,
    *,
    trip_count: int | torch.Tensor | None = None,
    cond: bool | torch.Tensor | None = None,
) -> tuple[Carry, Y]:
    """Run ``body`` with an iteration number and a carry, as ONNX ``Loop`` does.

    The semantics of ``loop`` are given by this Python, where ``stack(ys)`` stacks every leaf of
    the per-iteration outputs on a new axis 0::

        def loop(body, init, *, trip_count=None, cond=None):
            carry, ys = init, []
            keep_going = True if cond is None else bool(cond)
            i = 0
            while keep_going and (trip_count is None or i < trip_count):
                carry, y, *stop = body(torch.tensor(i), carry)
                ys.append(y)
                if stop:                      # body returned torchscan.until(flag)
                    keep_going = not bool(stop[0].stop)
                i += 1
            return carry, stack(ys)

    The five operating modes of the ONNX ``Loop`` are the five ways to combine the arguments:

    ====================================  ==============================================
    ONNX ``Loop`` inputs ``(M, cond)``    ``torchscan.loop``
    ====================================  ==============================================
    ``("", "")``: never ends              refused: no ``trip_count`` and no ``until``
    ``("", cond)``: while                 ``cond=flag``, body returns ``until(stop)``
    ``("", 1)``: do-while                 body returns ``until(stop)``
    ``(M, "")``: for                      ``trip_count=M``
    ``(M, cond)``: for with a stop        ``trip_count=M``, ``cond=flag`` or ``until``
    ====================================  ==============================================

    Unlike that Python version, ``loop`` checks its arguments and what ``body`` returns and
    names the leaf at fault; it returns ``ys`` of the right shape and dtype when no iteration
    runs (found by running ``body`` on fake tensors, never on real data); and under
    ``torch.onnx.export`` it becomes one ONNX ``Loop`` node. Autograd flows through it as
    through the Python loop.

    Args:
        body: ``body(i, carry) -> (new_carry, y)`` or ``(new_carry, y, torchscan.until(stop))``.
            ``i`` is the iteration number, a 0-d int64 tensor on the carry's device.
            ``new_carry`` must have the structure, shapes, dtypes and devices of ``init``; ``y``
            is any pytree of tensors and ``None``, the same at every iteration; ``stop`` is a
            0-d bool tensor. Whether ``until`` is returned must not change between iterations.
        init: the initial carry, a pytree of tensors (``None`` for no carry).
        trip_count: the most iterations to run: an int, a 0-d integer tensor (a negative value
            runs none, as in ONNX), or ``None`` for no limit.
        cond: whether to run the first iteration: a bool or a 0-d bool tensor; ``None`` means
            ``True``.

    Returns:
        ``(carry, ys)``: the carry after the last iteration, and the ``y`` of every iteration
        that ran stacked on a new axis 0 (``None`` leaves stay ``None``). With no iteration,
        ``init`` itself and ``ys`` of length 0.

    Raises:
        TypeError: ``body`` is not callable or does not return ``(carry, y)`` or ``(carry, y,
            until(stop))``; ``stop``, ``trip_count`` or ``cond`` has the wrong type; a leaf is
            not a tensor; the carry or ``y`` changes structure, shape, dtype or device.
        ValueError: the loop could never end (no ``trip_count`` and no ``until``); a negative
            int ``trip_count``; tensors of ``init`` on different devices.

    Example:
        Powers of two until one passes 100, at most 20:

        >>> import torch, torchscan
        >>> def body(i, p):
        ...     return p * 2, p, torchscan.until(p * 2 > 100)
        >>> last, powers = torchscan.loop(body, torch.tensor(1), trip_count=20)
        >>> last, powers
        (tensor(128), tensor([ 1,  2,  4,  8, 16, 32, 64]))
    """
    _checks.check_callable(_API, "body", body)
    _checks.refuse_torchscript(_API)
    carry_type = _checks.CarryType(_API, "body", init)
    _checks.check_tensor_leaves(_API, "init", init, carry_type.leaves)
    _checks.check_same_device(_API, [("init", init, carry_type.leaves)])
    trip_count = _check_trip_count(trip_count)
    cond = _check_cond(cond)
    if torch.compiler.is_exporting():
        from torchscan import _hops

        return _hops.traced_loop(body, carry_type, trip_count, cond)
    trips = None if trip_count is None else max(int(trip_count), 0)
    if trips == 0 or (cond is not None and not bool(cond)):
        return init, _empty_ys(body, carry_type, trip_count)
    device = _device([*carry_type.leaves, trip_count, cond])
    return _run(body, carry_type, _counter(trips, device), needs_until=trips is None)


def _check_trip_count(trip_count: Any) -> int | torch.Tensor | None:
    if trip_count is None:
        return None
    if isinstance(trip_count, torch.Tensor):
        if trip_count.ndim == 0 and not trip_count.is_floating_point() and not _is_bool(trip_count):
            return trip_count
    elif isinstance(trip_count, torch.SymInt):
        return trip_count  # a size of the program torch.export traces: never negative
    elif isinstance(trip_count, int) and not isinstance(trip_count, bool):
        if trip_count < 0:
            raise ValueError(f"{_API}: trip_count must be non-negative, but got {trip_count}.")
        return trip_count
    raise TypeError(
        f"{_API}: trip_count must be an int, a 0-d integer tensor or None, but got "
        f"{_checks.describe(trip_count)}."
    )


def _check_cond(cond: Any) -> bool | torch.Tensor | None:
    if cond is None or isinstance(cond, bool):
        return cond
    if isinstance(cond, torch.Tensor) and cond.ndim == 0 and _is_bool(cond):
        return cond
    raise TypeError(
        f"{_API}: cond must be a bool, a 0-d bool tensor or None, but got {_checks.describe(cond)}."
    )


def _is_bool(t: torch.Tensor) -> bool:
    return t.dtype == torch.bool


def _device(candidates: Sequence[Any]) -> torch.device:
    return next((t.device for t in candidates if isinstance(t, torch.Tensor)), torch.device("cpu"))


def _counter(trips: int | None, device: torch.device) -> Iterator[torch.Tensor]:
    """The iteration numbers as 0-d int64 tensors, made in batches: one ``torch.tensor(i)`` per
    iteration would cost more than the bookkeeping of the whole loop."""
    if trips is not None:
        yield from torch.arange(trips, device=device).unbind(0)
        return
    start, size = 0, 16
    while True:
        yield from torch.arange(start, start + size, device=device).unbind(0)
        start, size = start + size, min(size * 2, 4096)


def _run(
    body: Callable,
    carry_type: _checks.CarryType,
    counter: Iterator[torch.Tensor],
    needs_until: bool,
) -> tuple[Any, Any]:
    # The first iteration is checked in full; later ones only where data-dependent Python in
    # body could make them differ, which the final carry check and the stacking of ys catch.
    out = body(next(counter), carry_type.init)
    has_until = _check_result(out, needs_until)
    carry, y = out[0], out[1]
    carry_type.check(carry, " in its first iteration")
    _OUTPUTS.check_first(y, 0)
    ys = [y]
    append = ys.append
    if not has_until:
        for i in counter:
            out = body(i, carry)
            try:
                carry, y = out
            except (TypeError, ValueError):
                _check_result(out, needs_until, expect_until=False)
                raise
            append(y)
    elif not _stops(out[2], 0):
        for i in counter:
            out = body(i, carry)
            try:
                carry, y, flag = out
            except (TypeError, ValueError):
                _check_result(out, needs_until, expect_until=True)
                raise
            append(y)
            if _stops(flag, len(ys) - 1):
                break
    carry_type.check(carry, " in a later iteration")
    return carry, _OUTPUTS.stack(ys, 0)


def _check_result(out: Any, needs_until: bool, expect_until: bool | None = None) -> bool:
    """Check the shape of what ``body`` returned; whether it returned ``until``."""
    shape_ok = isinstance(out, tuple) and (
        len(out) == 2 or (len(out) == 3 and isinstance(out[2], Until))
    )
    if not shape_ok:
        got = f"a tuple of length {len(out)}" if isinstance(out, tuple) else None
        if isinstance(out, tuple) and len(out) == 3:
            got = f"a tuple whose last item is {_checks.describe(out[2])}"
        raise TypeError(
            f"{_API}: body must return (carry, y) or (carry, y, torchscan.until(stop)), but it "
            f"returned {got or _checks.describe(out)}."
        )
    has_until = len(out) == 3
    if expect_until is not None and has_until != expect_until:
        raise TypeError(
            f"{_API}: body must return torchscan.until(stop) at every iteration or at none, but "
            f"it returned {'it only in a later' if has_until else 'no until in a later'} "
            "iteration."
        )
    if needs_until and not has_until:
        raise ValueError(
            f"{_API}: trip_count is None and body does not return torchscan.until(stop), so the "
            "loop could never end. Pass trip_count=<the most iterations>, or return "
            "(carry, y, torchscan.until(stop)) from body."
        )
    return has_until


def _stops(flag: Until, iteration: int) -> bool:
    return bool(_check_stop(flag.stop, iteration))


def _check_stop(stop: Any, iteration: int) -> torch.Tensor:
    if not (isinstance(stop, torch.Tensor) and stop.ndim == 0 and stop.dtype == torch.bool):
        raise TypeError(
            f"{_API}: until(stop) needs stop to be a 0-d bool tensor, but body returned "
            f"{_checks.describe(stop)} in iteration {iteration}."
        )
    return stop


def _empty_ys(body: Callable, carry_type: _checks.CarryType, trip_count: Any) -> Any:
    """``ys`` of a loop that runs no iteration, with the shapes ``body`` would give them."""
    i = torch.zeros((), dtype=torch.int64, device=_device(carry_type.leaves))
    out = _OUTPUTS.call_on_fake("no iteration runs", body, i, carry_type.init)
    has_until = _check_result(out, needs_until=trip_count is None)
    if has_until:
        _check_stop(out[2].stop, 0)
    carry_type.check(out[0], "")
    _OUTPUTS.check_first(out[1], 0)
    return _OUTPUTS.empty(out[1], 0)
