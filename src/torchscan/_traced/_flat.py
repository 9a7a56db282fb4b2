"""From pytrees to the operators: ``traced_scan`` and ``traced_loop``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from torchscan import _checks, _context, _layout, _pytree
from torchscan._compat import (
    disable_proxy_modes_tracing,
    guard_on_data_dependent_error,
    uncaptured_operator_error,
)
from torchscan._errors import TorchscanValueError
from torchscan._traced import _step_errors
from torchscan._traced._body import InPlaceWrite, as_traced_body
from torchscan._traced._loop_op import torchscan_loop
from torchscan._traced._scan_op import slice_like as _slice_like
from torchscan._traced._scan_op import stacked_like, torchscan_scan

if TYPE_CHECKING:
    from torchscan._plan import LoopPlan, ScanPlan

TypeCheck = Callable[[str, Sequence[tuple[str, Any]]], None]
"""``check(op, leaves)``: refuses the named tensors whose element type the ONNX operator ``op``
does not allow at the opset being exported to."""


# -- from pytrees to the operators -------------------------------------------------------------


class _FlatStep:
    """A step function seen through flat tensors, as the operators call it.

    Pytrees become flat lists of tensors, ``None`` leaves (which an operator's tensors cannot
    hold) are dropped on the way in and put back on the way out, and ``until`` becomes a last
    output. What the step returns (its ``y`` structure, whether it stops) is learned the first
    time it runs: traced for an operator, or called on fake tensors (:meth:`probe`).
    """

    def __init__(
        self,
        fn: Callable,
        protocol: Any,
        carry_type: _checks.CarryType,
        user: Callable,
        never_ends: str = "",
        check_types: TypeCheck | None = None,
        sequences: Sequence[tuple[str, torch.Tensor]] = (),
    ) -> None:
        self.fn, self.protocol, self.carry_type = fn, protocol, carry_type
        self.never_ends = never_ends
        # Named in refusals of what torch cannot trace or translate in the step.
        self.source = _step_errors.StepSource.of(user, protocol.api, protocol.fn_name)
        self.source.keep_its_frames()
        # While torch.onnx exports: the element types of the leaves, which the ONNX operator
        # the call becomes must allow, checked where their names are known; ``sequences`` are
        # the named leaves of xs, which only a Scan takes as inputs.
        self.check_types, self.sequences = check_types, list(sequences)
        self.present = [leaf is not None for leaf in carry_type.leaves]
        self.carries = [leaf for leaf in carry_type.leaves if leaf is not None]
        self.y_spec: Any = None
        self.y_present: list[bool] = []
        self.y: Any = None  # what the probe's step returned as y
        self.has_until = False
        # The operator the step is traced for ("Scan" or "Loop"); None while it is probed.
        self.operator: str | None = None

    def call(self, *args: Any) -> Any:
        """``fn(*args)``; a guard on a tensor's value in the user's code, and a ``torch.cond``
        whose branches TorchDynamo could not trace, are refused, naming the line, and so is a
        call that changes its arguments in place, as eagerly."""
        names = ("i", "carry") if self.protocol.item_name == "i" else ("carry", "x")
        try:
            return self.protocol.traced_call(self.fn, self.fn, list(zip(names, args, strict=True)))
        except guard_on_data_dependent_error() as error:
            refusal = _step_errors.data_dependent(self.source, error)
            if refusal is None:
                raise
            raise refusal from None
        except uncaptured_operator_error() as error:
            refusal = _step_errors.uncaptured_cond(self.source, error)
            if refusal is None:
                raise
            raise refusal from None

    def body(self, step: Callable) -> Callable:
        """``step``, the flat form of ``fn`` that an operator traces, marked as ``fn``."""
        return _step_errors.attach(step, self.source)

    def carry(self, leaves: Sequence[Any]) -> Any:
        return _pytree.tree_unflatten(_fill(self.present, leaves), self.carry_type.spec)

    def flatten(self, out: Any) -> tuple[Any, ...]:
        """The flat outputs of one step: new carries, ``y`` leaves, and the stop flag."""
        has_until = self.protocol.has_until(out)
        if self.operator is not None and has_until != self.has_until:
            # the probe decided the operator; a step whose output changes between two calls
            # on the same shapes cannot be one operator
            raise TorchscanValueError(
                f"{self.protocol.api}: {self.protocol.fn_name} returned until in one call and "
                "not in another on the same shapes: return until from every call, or from none"
            )
        self.has_until = has_until
        if self.never_ends and not self.has_until:
            raise TorchscanValueError(self.never_ends)
        self.carry_type.check(out[0], "")
        y_leaves, self.y_spec = _pytree.tree_flatten(out[1])
        _checks.check_tensor_leaves(self.protocol.api, "y", out[1], y_leaves)
        self.y_present = [leaf is not None for leaf in y_leaves]
        if self.operator is None:
            self.y = out[1]
        elif self.check_types is not None:
            as_scan = self.operator == "Scan"
            self.check_types(
                self.operator,
                [
                    *_pytree.named_tensors(out[0], "carry"),
                    *(self.sequences if as_scan else ()),
                    *_pytree.named_tensors(out[1], "y"),
                ],
            )
        stop = [self.protocol.check_stop(out[2].stop, 0)] if self.has_until else []
        return (
            *[leaf for leaf in _pytree.tree_leaves(out[0]) if leaf is not None],
            *[leaf for leaf in y_leaves if leaf is not None],
            *stop,
        )

    def probe(self, step: Callable, *args: Any) -> None:
        """Run ``step`` once on fake copies of ``args``, outside the trace, to learn what it
        returns: whether it stops decides which operator it becomes, and its ``y`` the axis and
        direction of every output laid out leaf by leaf."""
        self.operator = None
        with (
            _context.probing(_context.Probe.STEP),
            disable_proxy_modes_tracing(),
            as_traced_body(),
        ):
            step(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])

    def probed(self, length: Any, axes: Sequence[int]) -> tuple[Any, Any]:
        """Within the probe of an outer step: ``(carry, ys)`` shaped as the probe of this one
        found them, ``ys`` of ``length`` on ``axes``, without tracing the step again: the outer
        probe needs only shapes, and the outer trace traces this call once more."""
        ys = [leaf for leaf in _pytree.tree_leaves(self.y) if leaf is not None]
        return self.unflatten(
            [
                *[torch.empty_like(c) for c in self.carries],
                *[stacked_like(y, length, a % (y.ndim + 1)) for y, a in zip(ys, axes, strict=True)],
            ]
        )

    def unflatten(self, out: Sequence[Any]) -> tuple[Any, Any]:
        n = len(self.carries)
        ys = _pytree.tree_unflatten(_fill(self.y_present, out[n:]), self.y_spec)
        return self.carry(out[:n]), ys


def traced_scan(plan: ScanPlan, check_types: TypeCheck | None = None) -> tuple[Any, Any]:
    """``scan`` under ``torch.export``: one ``torchscan_scan`` call on the flat tensors, or, when
    the step returns ``until``, one ``torchscan_loop`` call (a Scan cannot stop early): which one
    is decided before anything is traced, by running the step once on fake tensors.

    ``check_types``, given while torch.onnx exports, refuses leaves whose element type the ONNX
    operator does not allow at the target opset, naming them by their paths.
    """
    xs_tree = _pytree.tree_unflatten(list(plan.xs_leaves), plan.xs_spec)
    flat = _FlatStep(
        plan.fn,
        plan.protocol,
        plan.carry,
        plan.user,
        check_types=check_types,
        sequences=_pytree.named_tensors(xs_tree, "xs"),
    )
    x_present = [leaf is not None for leaf in plan.xs_leaves]
    xs = plan.present
    in_axes = [a for a in plan.in_axes if a is not None]  # None for a None leaf alone

    def x_of(slices: Sequence[Any]) -> Any:
        return _pytree.tree_unflatten(_fill(x_present, slices), plan.xs_spec)

    def step(*args):
        n = len(flat.carries)
        return flat.flatten(flat.call(flat.carry(args[:n]), x_of(args[n : n + len(xs)])))

    # What the step returns decides the operator (a Scan cannot stop early) and, where they are
    # given leaf by leaf, the axis and direction of every output: the step runs once on fake
    # tensors, outside the trace, to learn it.
    direction = plan.direction
    flat.probe(step, *flat.carries, *[_slice_like(x, a) for x, a in zip(xs, in_axes, strict=True)])
    if flat.has_until:
        if direction is None:
            raise _layout.until_per_leaf(plan.protocol.api, plan.protocol.fn_name)
        return _scan_as_loop(flat, xs, in_axes, x_of, plan.length, plan.out.axis, *direction)
    scan_xs, scan_axes = (xs, in_axes) if xs else _empty_sequence(plan.length)
    if direction is not None:
        reverse, realign = direction
        in_reverse = [reverse] * len(scan_xs)
        out_axes, out_reverse = [plan.out.axis], [reverse and realign]
    else:
        in_reverse = [r for r, present in zip(plan.in_reverse, x_present, strict=True) if present]
        in_reverse = in_reverse if xs else [False]
        out_axes, out_reverse = _laid_out(flat, plan)
    if _context.probe(_context.Probe.STEP):
        return flat.probed(plan.length, _laid_out(flat, plan)[0])
    flat.operator = "Scan"
    try:
        out = torchscan_scan(
            flat.body(lambda *args: step(*args[: len(flat.carries) + len(xs)])),
            flat.carries,
            scan_xs,
            (),
            scan_axes,
            in_reverse,
            out_axes,
            out_reverse,
        )
    except InPlaceWrite as refused:
        if not refused.sequences or not xs:
            raise
        raise refused.naming([name for name, _ in flat.sequences]) from None
    finally:
        flat.operator = None
    return flat.unflatten(out)


def _laid_out(flat: _FlatStep, plan: ScanPlan) -> tuple[list[int], list[bool]]:
    """The stacking axis and direction of every (present) ``ys`` leaf, as the plan's layout
    gives them for the ``y`` the probe returned."""
    y = flat.y
    plan.protocol.outputs.check_first(y, plan.out)
    axes, reverse = plan.out.axes(y), plan.out.reverse(y)
    present = flat.y_present
    return (
        [a for a, p in zip(axes, present, strict=True) if p],
        [r for r, p in zip(reverse, present, strict=True) if p],
    )


def _empty_sequence(length: Any) -> tuple[list[torch.Tensor], list[int]]:
    """A Scan needs a sequence to count its steps: an empty one, ``(length, 0)``, costs
    nothing."""
    return [torch.empty(length, 0)], [0]


def _scan_as_loop(
    flat: _FlatStep,
    xs: Sequence[torch.Tensor],
    in_axes: Sequence[int],
    x_of: Callable[[Sequence[Any]], Any],
    length: Any,
    axis: int,
    reverse: bool,
    realign: bool,
) -> tuple[Any, Any]:
    """A scan that stops early, as a loop over the sequence positions it reads with ``i``."""

    def step(i, *args):
        t = length - 1 - i if reverse else i
        slices = [
            torch.index_select(x, a, t.reshape(1)).squeeze(a)
            for x, a in zip(xs, in_axes, strict=True)
        ]
        return flat.flatten(flat.call(flat.carry(args), x_of(slices)))

    flat.operator = "Loop"
    out = torchscan_loop(flat.body(step), length, None, flat.carries, (), True)
    carry, ys = flat.unflatten(out)
    # The loop stacks in the order the steps ran, on axis 0.
    ys = _pytree.tree_map(
        lambda y: (
            None
            if y is None
            else (y.flip(0) if reverse and realign else y).movedim(0, axis % y.ndim)
        ),
        ys,
    )
    return carry, ys


def _fill(present: Sequence[bool], values: Sequence[Any]) -> list[Any]:
    """Put ``values`` where ``present`` is true and ``None`` elsewhere."""
    it = iter(values)
    return [next(it) if p else None for p in present]


def traced_loop(plan: LoopPlan, check_types: TypeCheck | None = None) -> tuple[Any, Any]:
    """``loop`` under ``torch.export``: one ``torchscan_loop`` call on the flat tensors;
    ``check_types`` as for :func:`traced_scan`."""
    flat = _FlatStep(plan.body, plan.protocol, plan.carry, plan.body, plan.never_ends, check_types)

    def step(i, *args):
        return flat.flatten(flat.call(i, flat.carry(args)))

    reference = next(iter(flat.carries), None)
    with disable_proxy_modes_tracing():
        i = torch.zeros((), dtype=torch.int64, device=getattr(reference, "device", None))
    flat.probe(step, i, *flat.carries)
    if (
        _context.probe(_context.Probe.STEP)
        and not flat.has_until
        and isinstance(plan.trip_count, (int, torch.SymInt))
    ):
        return flat.probed(plan.trip_count, [0] * sum(flat.y_present))
    cond = plan.cond
    if isinstance(cond, bool):
        cond = torch.tensor(cond)
    flat.operator = "Loop"
    out = torchscan_loop(flat.body(step), plan.trip_count, cond, flat.carries, (), flat.has_until)
    return flat.unflatten(out)
