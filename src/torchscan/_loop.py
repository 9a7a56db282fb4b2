"""``torchscan.loop`` and ``torchscan.until``: the ONNX ``Loop``, written as a Python function."""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable
from typing import Any, Literal, SupportsIndex, TypeVar

import torch

from torchscan import _checkpoint, _checks, _dispatch, _outputs, _steps
from torchscan._checkpoint import Checkpoint
from torchscan._errors import TorchscanTypeError
from torchscan._plan import LoopPlan
from torchscan._steps import Until

Carry = TypeVar("Carry")
Y = TypeVar("Y")

_API = "torchscan.loop"
_OUTPUTS = _outputs.Outputs(_API, "body", "iteration")
_PROTOCOL = _steps.Protocol(_OUTPUTS, "iteration", "i")
_NEVER_ENDS = (
    f"{_API}: trip_count is None and body does not return torchscan.until(stop), so the loop "
    "could never end. Pass trip_count=<the most iterations>, or return "
    "(carry, y, torchscan.until(stop)) from body."
)


def loop(
    body: Callable[[torch.Tensor, Carry], tuple[Carry, Y] | tuple[Carry, Y, Until]],
    init: Carry,
    *,
    trip_count: SupportsIndex | torch.Tensor | None = None,
    cond: bool | torch.Tensor | None = None,
    checkpoint: int | Literal["sqrt"] | Checkpoint | None = None,
    unroll: int | bool | None = None,
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

    Unlike that Python version, ``loop`` checks its arguments and what ``body`` returns at
    every iteration and names the leaf at fault; it refuses a ``body`` that changes ``i`` or
    its carry in place, and never changes ``init``; it returns ``ys`` of the right shape and
    dtype when no iteration runs (found by running ``body`` on fake tensors, never on real
    data); and under ``torch.onnx.export`` it becomes one ONNX ``Loop`` node. Autograd flows
    through it as through the Python loop.

    Args:
        body: ``body(i, carry) -> (new_carry, y)`` or ``(new_carry, y, torchscan.until(stop))``.
            ``i`` is the iteration number, a 0-d int64 tensor on the carry's device.
            ``new_carry`` must have the structure, shapes, dtypes and devices of ``init``; ``y``
            is any pytree of tensors and ``None``, the same at every iteration; ``stop`` is a
            0-d bool tensor. Whether ``until`` is returned must not change between iterations.
            ``body`` must not change its arguments in place: clone a carried buffer before
            writing into it.
        init: the initial carry, a pytree of tensors (``None`` for no carry).
        trip_count: the most iterations to run: an int (Python or numpy), a 0-d integer tensor,
            or ``None`` for no limit. A negative count runs none, as in ONNX and ``range``.
        cond: whether to run the first iteration: a bool or a 0-d bool tensor; ``None`` means
            ``True``.
        checkpoint: what the backward pass keeps of the iterations, and what it runs again, as
            in ``scan`` (see :class:`torchscan.Checkpoint`): an int ``k`` keeps the carry every
            ``k`` iterations, however many run; ``"sqrt"`` needs ``trip_count``, and plans
            for all of its iterations (a loop that stops earlier runs fewer again), as the
            binomial schedule (``Checkpoint(snapshots=c)``) does where ``trip_count`` is given;
            without it, that schedule places its ``c`` carries as the iterations run (the
            online schedule of docs/loop.md).
        unroll: under ``torch.compile``, how many iterations each iteration of the compiled
            loop runs, as in ``scan``; a body that returns ``until`` runs one per iteration.

    Returns:
        ``(carry, ys)``: the carry after the last iteration, and the ``y`` of every iteration
        that ran stacked on a new axis 0 (``None`` leaves stay ``None``). With no iteration,
        ``init`` itself and ``ys`` of length 0.

    Raises:
        TypeError: ``body`` is not callable or does not return ``(carry, y)`` or ``(carry, y,
            until(stop))``; ``stop``, ``trip_count``, ``cond``, ``checkpoint`` or ``unroll``
            has the wrong type; a leaf is
            not a tensor; the carry or ``y`` changes structure, shape, dtype or device at any
            iteration; ``until`` is not the last item ``body`` returns.
        ValueError: the loop could never end (no ``trip_count`` and no ``until``); tensors of
            ``init`` on different devices; ``body`` changes ``i`` or its carry in place;
            ``checkpoint`` or ``unroll`` is an int below 1, or ``checkpoint`` is ``"sqrt"``
            without ``trip_count``; the
            backward pass of ``Checkpoint(snapshots=c)`` over a body that reads a tensor
            requiring gradients where no torch function mode sees it.

    Example:
        Powers of two until one passes 100, at most 20:

        >>> import torch, torchscan
        >>> def body(i, p):
        ...     return p * 2, p, torchscan.until(p * 2 > 100)
        >>> last, powers = torchscan.loop(body, torch.tensor(1), trip_count=20)
        >>> last, powers
        (tensor(128), tensor([ 1,  2,  4,  8, 16, 32, 64]))
    """
    if _dispatch.checkpoints_outside_compile(checkpoint):
        return _dispatch.run_outside_compile(
            loop,
            body,
            init,
            trip_count=trip_count,
            cond=cond,
            checkpoint=checkpoint,
            unroll=unroll,
        )
    _checks.check_callable(_API, "body", body)
    _checks.check_parameters(
        _API,
        "body",
        body,
        "body(i, carry)",
        "at every iteration, i being the iteration number (a 0-d int64 tensor)",
        "Give it the parameters (i, carry); a body that reads no i still takes it: "
        "def body(_, carry).",
    )
    _checks.refuse_torchscript(_API)
    _checks.refuse_strict_export(_API)
    carry = _checks.CarryType(_API, "body", init)
    _checks.check_tensor_leaves(_API, "init", init, carry.leaves)
    _checks.check_same_device(_API, [("init", init, carry.leaves)])
    trip_count = _check_trip_count(trip_count)
    plan = LoopPlan(
        protocol=_PROTOCOL,
        body=body,
        carry=carry,
        trip_count=trip_count,
        cond=_check_cond(cond),
        never_ends=_NEVER_ENDS if trip_count is None else "",
        checkpoint=_checkpoint.resolve(_API, checkpoint),
        unroll=_checks.check_unroll(_API, unroll),
    )
    return _dispatch.run(plan)


def _check_trip_count(trip_count: Any) -> int | torch.SymInt | torch.Tensor | None:
    if trip_count is None:
        return None
    if isinstance(trip_count, torch.Tensor):
        if trip_count.ndim == 0 and not trip_count.is_floating_point() and not _is_bool(trip_count):
            return trip_count
    elif isinstance(trip_count, torch.SymInt):
        return trip_count  # a size of the program torch.export traces: never negative
    elif type(trip_count) is int:
        return trip_count  # as it is: torch.compile keeps an int symbolic, operator.index not
    elif not isinstance(trip_count, bool):
        with contextlib.suppress(TypeError):
            return operator.index(trip_count)  # a negative count runs none, as in ONNX
    raise TorchscanTypeError(
        f"{_API}: trip_count must be an int, a 0-d integer tensor or None, but got "
        f"{_checks.describe(trip_count)}."
    )


def _check_cond(cond: Any) -> bool | torch.Tensor | None:
    if cond is None or isinstance(cond, bool):
        return cond
    if isinstance(cond, torch.Tensor) and cond.ndim == 0 and _is_bool(cond):
        return cond
    raise TorchscanTypeError(
        f"{_API}: cond must be a bool, a 0-d bool tensor or None, but got {_checks.describe(cond)}."
    )


def _is_bool(t: torch.Tensor) -> bool:
    return t.dtype == torch.bool


_dispatch.register_api("torchscan.loop", loop)
