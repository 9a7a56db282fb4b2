"""One plan per call of ``scan`` or ``loop``: what the public function learned from its arguments,
checked once, in a frozen dataclass that :func:`torchscan._dispatch.run` hands to one strategy.

A :class:`ScanPlan` holds the step, the flattened pytrees, the axis and direction of every
sequence and output (one axis and one direction for all being the common case), the number of
steps and, with ``lengths``, the padded length. A :class:`LoopPlan` holds the body, the carry,
the trip count and the condition, and whether something ends the loop."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from torchscan import _checks, _pytree, _steps
from torchscan._checkpoint import Checkpoint
from torchscan._layout import OutLayout


@dataclasses.dataclass(frozen=True)
class ScanPlan:
    """One call of ``scan`` (or of ``theano.scan``, which runs as one), checked.

    Attributes:
      protocol: how the public function words what the step returns, and its messages.
      fn: the step as the runners call it, ``fn(carry, x)`` (with ``lengths``, the step that
        masks the padded positions).
      user: the user's step function, which refusals name.
      carry: the structure, shapes and dtypes every carry must keep.
      xs_leaves: the leaves of the sequences, ``None`` leaves included.
      xs_spec: the structure of the sequences.
      in_axes: the scanned axis of every leaf (``None`` for a ``None`` leaf).
      in_reverse: whether every leaf is read from its end.
      out: the stacking axis and direction of every leaf of ``y``.
      length: the number of steps (an int, or a size of the program torch.export traces).
      padded_length: with ``lengths``, the length ``ys`` have when every step ran, where
        eagerly the steps past the longest example do not run; else ``None``.
      loop_operator: whether ``torch.compile`` may make the steps one loop operator (not for a
        step that changes Python state, which torch's loop operators refuse).
      hoist: whether the work of the step that does not depend on the carry is done once
        (:mod:`torchscan._hoist`): ``None`` where the step allows it and it pays, ``True``
        wherever the step allows it, ``False`` never.
      checkpoint: what the steps keep for the backward pass and what it runs again
        (:class:`torchscan.Checkpoint`); ``None``: everything they save.
      unroll: the steps each iteration of the loop operator runs under ``torch.compile``: an
        int, ``True`` for all of them, ``None`` for a number chosen from the step's cost
        (:func:`torchscan._compiled.unroll_for`).
      memo: what is derived from the plan's metadata alone, kept for the next calls whose
        arguments have the same :func:`arguments_key` (their plans share it).
    """

    protocol: _steps.Protocol
    fn: Callable[[Any, Any], Any]
    user: Callable[..., Any]
    carry: _checks.CarryType
    xs_leaves: tuple[torch.Tensor | None, ...]
    xs_spec: _pytree.TreeSpec
    in_axes: tuple[int | None, ...]
    in_reverse: tuple[bool, ...]
    out: OutLayout
    length: Any
    padded_length: Any = None
    loop_operator: bool = True
    hoist: bool | None = None
    checkpoint: Checkpoint | None = None
    unroll: int | bool | None = None
    memo: dict[str, Any] = dataclasses.field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    def without_values(self) -> ScanPlan:
        """This plan without the call's step and tensors: what a later call whose arguments have
        the same :func:`arguments_key` completes with :meth:`for_call` instead of checking its
        arguments again (the key holds everything the checks read)."""
        plan = dataclasses.replace(
            self, fn=_no_step, user=_no_step, carry=self.carry.of(None, []), xs_leaves=()
        )
        _ = plan.direction  # computed once, for every call
        return plan

    def for_call(
        self, fn: Callable[..., Any], init: Any, init_leaves: list[Any], xs_leaves: Sequence[Any]
    ) -> ScanPlan:
        """This plan (one :meth:`without_values`) for a call of ``fn`` on ``init`` and ``xs``,
        flattened to ``init_leaves`` and ``xs_leaves``."""
        plan = object.__new__(ScanPlan)
        state = plan.__dict__
        state.update(self.__dict__)
        state["fn"] = state["user"] = fn
        state["carry"] = self.carry.of(init, init_leaves)
        state["xs_leaves"] = tuple(xs_leaves)
        return plan

    @property
    def reverse(self) -> bool | None:
        """The one direction of every sequence and output, or ``None`` where they differ."""
        out = self.out.reverse_prefix
        if not isinstance(out, bool) or any(r != out for r in self.in_reverse):
            return None
        return out

    @property
    def direction(self) -> tuple[bool, bool] | None:
        """``(reverse, realign)`` where every sequence is read one way and every output is
        stacked on one axis, the form of ``jax.lax.scan``: the steps run backwards with
        ``reverse``, and ``ys`` are aligned with ``xs`` (``realign``) or in the order the steps
        ran. ``None`` where the axes or directions are given leaf by leaf."""
        memo = self.memo
        if "direction" not in memo:
            memo["direction"] = self._direction()
        return memo["direction"]

    def _direction(self) -> tuple[bool, bool] | None:
        out = self.out
        if out.axes_prefix is not None or not isinstance(out.reverse_prefix, bool):
            return None
        reading = set(self.in_reverse)
        if len(reading) > 1:
            return None
        backwards = reading.pop() if reading else out.reverse_prefix
        if backwards == out.reverse_prefix:
            return backwards, True
        if backwards:  # read backwards, stacked in the order the steps ran (go_backwards)
            return True, False
        return None

    @property
    def present(self) -> list[torch.Tensor]:
        """The tensors among the leaves of the sequences."""
        return [leaf for leaf in self.xs_leaves if leaf is not None]


def _no_step(*_: Any) -> None:
    """The step of a plan without values, which never runs (:meth:`ScanPlan.for_call` gives
    it the call's step)."""


_PLAIN = frozenset({torch.Tensor, torch.nn.Parameter})


def arguments_key(options: tuple[Any, ...], *trees: tuple[Any, Sequence[Any]]) -> Any:
    """What the checks of a call read of its arguments, hashable: ``options`` (ints, bools and
    ``None`` alone), and the structure of every flattened tree ``(spec, leaves)`` with the type,
    shape, dtype, device and ``requires_grad`` of its leaves. ``None`` where an argument is of
    another kind (a tensor subclass, a number, a symbolic size): that call is checked in full."""
    kinds = tuple(map(type, options))  # 0 and False are equal keys, but not equal options
    if not _OPTION_TYPES.issuperset(kinds):
        return None
    key: list[Any] = [options, kinds]
    for spec, leaves in trees:
        key.append(spec)
        for leaf in leaves:
            if leaf is None:
                key.append(None)
            elif type(leaf) in _PLAIN:
                key.append((leaf.shape, leaf.dtype, leaf.device, leaf.requires_grad))
            else:
                return None
    return tuple(key)


_OPTION_TYPES = frozenset({int, bool, type(None)})


@dataclasses.dataclass(frozen=True)
class LoopPlan:
    """One call of ``loop``, checked.

    Attributes:
      protocol: how ``loop`` words what the body returns, and its messages.
      body: the user's body, ``body(i, carry)``.
      carry: the structure, shapes and dtypes every carry must keep.
      trip_count: the most iterations: an int, a size of a traced program, a 0-d integer tensor,
        or ``None``.
      cond: whether the first iteration runs: a bool, a 0-d bool tensor, or ``None``.
      never_ends: the refusal of a body that returns no ``until`` where nothing else would end
        the loop; empty where something does.
      checkpoint: what the iterations keep for the backward pass and what it runs again
        (:class:`torchscan.Checkpoint`); ``None``: everything they save.
      unroll: the iterations each iteration of the loop operator runs under ``torch.compile``,
        as in :class:`ScanPlan`.
    """

    protocol: _steps.Protocol
    body: Callable[[torch.Tensor, Any], Any]
    carry: _checks.CarryType
    trip_count: Any
    cond: Any
    never_ends: str
    checkpoint: Checkpoint | None = None
    unroll: int | bool | None = None

    @property
    def user(self) -> Callable[..., Any]:
        return self.body

    @property
    def out(self) -> OutLayout:
        """``ys`` are stacked on a new axis 0, in the order the iterations ran."""
        return OutLayout(self.protocol.api, 0)

    def runs_no_iteration(self) -> bool | None:
        """Whether it is known before it runs that no iteration runs; ``None`` where a tensor
        decides (it is read only eagerly)."""
        if isinstance(self.trip_count, (int, torch.SymInt)) and self.trip_count <= 0:
            return True
        if self.cond is False:
            return True
        if isinstance(self.trip_count, torch.Tensor) or isinstance(self.cond, torch.Tensor):
            return None
        return False
