"""The plan of one Theano scan and its ways to run: the step that calls ``fn`` on the slices of the
sequences, the past values of the outputs fed back and the ``non_sequences`` (through the
``strict`` check if asked), and advances the carried state; run as one :func:`torchscan.scan`,
as a :func:`torchscan.loop` with no sequence, as a loop that gathers the elements each step reads
while a model with a tensor ``n_steps`` is exported, or with truncated backpropagation through
time.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from torchscan import _context, _inplace
from torchscan._loop import loop as _loop
from torchscan._scan import scan_in_order as _scan_in_order
from torchscan._steps import Until
from torchscan.theano._args import _API, _exporting, _Output, _Sequence
from torchscan.theano._step import _split_result
from torchscan.theano._strict import _Known, _passed_tensors, _strict_call
from torchscan.theano._truncate import _detach, _gate, _Window


@dataclasses.dataclass(frozen=True)
class _Plan:
    """One call of ``theano.scan``, checked: ``fn``, its sequences with their taps, its outputs
    with their initial states and taps, the ``non_sequences``, and how many steps run which way.
    :func:`run` chooses how it runs."""

    fn: Callable
    sequences: tuple[_Sequence, ...]
    outputs: tuple[_Output, ...]
    non_sequences: tuple[Any, ...]
    strict: bool
    n_steps: Any  # an int, or a 0-d tensor of the program being exported
    backwards: bool  # whether the steps run from the end (go_backwards, or negative n_steps)
    go_backwards: bool
    truncate: int  # truncate_gradient: -1, or the steps backpropagated through
    n_outputs: int | None = dataclasses.field(init=False)
    fed_back: tuple[_Output, ...] = dataclasses.field(init=False)
    passed: _Known | None = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        init = functools.partial(object.__setattr__, self)
        init("n_outputs", len(self.outputs) or None)
        init("fed_back", tuple(out for out in self.outputs if out.taps))
        init("passed", _Known(_passed_tensors(list(self.non_sequences))) if self.strict else None)

    def initial_states(self) -> tuple[Any, ...]:
        return tuple(out.initial_state() for out in self.fed_back)

    def sliced(self, n_steps: Any, backwards: bool) -> tuple[torch.Tensor, ...]:
        return tuple(s for seq in self.sequences for s in seq.slices(n_steps, backwards))

    def argument_names(self) -> list[str]:
        """What fn's arguments read, in order: sequences at their taps, then past outputs."""
        return [
            *(f"{seq.where} at tap {k}" for seq in self.sequences for k in seq.taps),
            *(
                f"outputs_info[{index}] at tap {k}"
                for index, out in enumerate(self.outputs)
                for k in out.taps
            ),
        ]

    def next_states(self, states: tuple[Any, ...], values: list[torch.Tensor]) -> tuple[Any, ...]:
        if not self.outputs:  # no outputs_info: nothing is fed back
            return ()
        return tuple(
            out.advance(state, value)
            for out, state, value in zip(
                self.fed_back,
                states,
                [v for o, v in zip(self.outputs, values, strict=True) if o.taps],
                strict=True,
            )
        )

    def as_fn(self, step: Callable) -> Callable:
        """``step``, marked (``__wrapped__``) as standing for ``fn``: refusals of what a step
        does while a model is exported name ``fn`` and its lines."""
        if _context.dynamo_tracing():
            return step  # TorchDynamo cannot set attributes of a partial; nothing is exported
        marked = functools.partial(step)
        marked.__wrapped__ = self.fn  # type: ignore[attr-defined]
        return marked


def run(plan: _Plan) -> list[torch.Tensor]:
    """The outputs of ``plan`` stacked over the steps that ran: the one place that chooses how
    a Theano scan runs, each way one ``torchscan.scan`` or ``torchscan.loop`` (which choose
    how they run in their turn)."""
    steps = plan.n_steps
    if isinstance(steps, torch.Tensor):  # only while exporting
        return _run_indexed(plan) if plan.sequences else _run_as_loop(plan)
    truncate = plan.truncate
    if torch.is_grad_enabled() and not _exporting() and 0 <= truncate < steps:
        return _run_truncated(plan)
    if not plan.sequences:
        return _run_as_loop(plan)
    return _run_as_scan(plan)


class _Step:
    """``fn`` as one step of the scan: it slices the past of the outputs for their taps, calls
    ``fn`` (through the ``strict`` check if asked), and advances the carried states.

    The first call records the changes in place that ``fn`` makes to its arguments (refusing
    those that would change the caller's tensors); later calls must make the same ones.
    ``records_stop`` keeps the ``until`` of the last call in ``last_stop``."""

    def __init__(self, plan: _Plan) -> None:
        self.plan = plan
        self.allowed: tuple[int, ...] | None = None
        self.records_stop = False
        self.last_stop: Until | None = None

    def __call__(self, states: tuple[Any, ...], x: Any) -> tuple[Any, ...]:
        values, stop = self.call(states, x or ())
        if self.records_stop:  # a change of state torch.compile's loop operators refuse
            self.last_stop = stop
        new = (self.plan.next_states(states, values), tuple(values))
        return (*new, stop) if stop is not None else new

    def call(self, states: tuple[Any, ...], x: Sequence[torch.Tensor]) -> tuple[list, Until | None]:
        plan = self.plan
        past = [
            v for out, state in zip(plan.fed_back, states, strict=True) for v in out.past(state)
        ]
        args = [*x, *past, *plan.non_sequences]
        # Versions are read eagerly and while torch.export traces; TorchDynamo cannot read them.
        watching = not (_context.dynamo_tracing() or torch.is_inference_mode_enabled())
        if not watching:
            return _split_result(self._call(args), plan.n_outputs)
        arguments = (*x, *past)
        if self.allowed is None:  # the first step: which in-place changes does fn make?
            named = list(zip(plan.argument_names(), arguments, strict=True))
            with _inplace.Recorder(named) as recorder:
                result = self._call(args)
            refused = [change for change in recorder.changes if change.refused]
            if refused:
                raise _inplace.refuse(_API, "fn", plan.fn, refused, "")
            self.allowed = recorder.deltas()
            return _split_result(result, plan.n_outputs)
        before = [_inplace.version(t) for t in arguments]
        result = self._call(args)
        deltas = tuple(_inplace.version(t) - b for t, b in zip(arguments, before, strict=True))
        if deltas != self.allowed:
            changed = [
                name
                for name, d, a in zip(plan.argument_names(), deltas, self.allowed, strict=True)
                if d != a
            ]
            raise _inplace.refuse(_API, "fn", plan.fn, changed, "in a later step")
        return _split_result(result, plan.n_outputs)

    def _call(self, args: list[Any]) -> Any:
        plan = self.plan
        if not plan.strict:
            return plan.fn(*args)
        assert plan.passed is not None  # recorded for a strict plan
        return _strict_call(plan.fn, args, plan.passed)


def _run_as_scan(plan: _Plan) -> list[torch.Tensor]:
    """One ``torchscan.scan`` over the slices of the sequences for their taps, ``ys`` in the
    order the steps ran."""
    xs = plan.sliced(plan.n_steps, plan.backwards)
    _, ys = _scan_in_order(
        plan.as_fn(_Step(plan)),
        plan.initial_states(),
        xs,
        length=None,
        axis=0,
        reverse=plan.backwards,
        realign=False,
    )
    return list(ys)


def _run_as_loop(plan: _Plan) -> list[torch.Tensor]:
    """No sequence: a loop of ``n_steps`` iterations (an int or a tensor, exported as the
    ``Loop``'s trip count)."""
    n_steps = plan.n_steps
    if isinstance(n_steps, torch.Tensor):
        n_steps = n_steps.abs()
    step = _Step(plan)

    def body(i, states):
        return step(states, ())

    _, ys = _loop(plan.as_fn(body), plan.initial_states(), trip_count=n_steps)
    return list(ys)


def _run_indexed(plan: _Plan) -> list[torch.Tensor]:
    """Sequences and ``n_steps`` a tensor of the exported graph: a loop of ``abs(n_steps)``
    iterations whose iteration ``i`` gathers element ``i`` of each tap's sequence, cut as in
    :meth:`_Sequence.slices` and reversed when going backwards (the sign of ``n_steps``
    flips ``go_backwards``). Past a sequence's available positions the index is out of
    range: the runtime fails there rather than read the wrong elements.

    Only operators that every opset has on int64 (``Abs``, ``Equal``, ``Not``, ``Cast``,
    ``Gather``) choose the direction: comparisons of integers and ``Where`` come later."""
    n_steps, step = plan.n_steps, _Step(plan)
    negative = n_steps.abs() != n_steps
    flag = (negative.logical_not() if plan.go_backwards else negative).to(torch.int64).reshape(1)
    reads = []
    for seq in plan.sequences:
        for cut in seq.slices(seq.steps_available(), False):
            both = torch.stack([cut, cut.flip(0)])
            reads.append(both.index_select(0, flag).squeeze(0))

    def body(i, states):
        x = [read.index_select(0, i.reshape(1)).squeeze(0) for read in reads]
        return step(states, x)

    _, ys = _loop(plan.as_fn(body), plan.initial_states(), trip_count=n_steps.abs())
    return list(ys)


def _run_truncated(plan: _Plan) -> list[torch.Tensor]:
    """Truncated backpropagation through time over the last ``k`` (``< n_steps``) steps that
    run, in the order they run.

    Step 0 runs alone first, to learn whether ``fn`` returns ``until``. Without it the
    window is known: the steps before it run without autograd, and the window starts from
    their state detached. With it, the other steps run with autograd, each behind gates
    (:class:`_Gate`) that are told the window once the scan has stopped: the state the
    window's first step reads, and the outputs of earlier steps, pass no gradient."""
    n_steps, k = plan.n_steps, plan.truncate
    backwards = plan.backwards
    xs = plan.sliced(n_steps, backwards)
    xs = [x.flip(0) for x in xs] if backwards else list(xs)
    window = _Window()
    counter = itertools.count()
    step = _Step(plan)

    def gated(states, x):
        s = next(counter)
        out = step(_gate(window, s, True, states), x)
        return (out[0], _gate(window, s, False, out[1]), *out[2:])

    def piece(states, start, stop, step=step, before=()):
        """Steps ``start`` to ``stop``, their outputs after those ``before``."""
        part = tuple(x[start:stop] for x in xs) or None  # None: no sequence
        carry, ys = _scan_in_order(
            plan.as_fn(step),
            states,
            part,
            length=stop - start,
            axis=0,
            reverse=False,
            realign=False,
            loop_operator=False,  # the gates count the steps: a change of Python state
        )
        if before:
            ys = [torch.cat([a, b]) for a, b in zip(before, ys, strict=True)]
        return carry, list(ys)

    step.records_stop = True
    states, ys = piece(plan.initial_states(), 0, 1, gated)
    step.records_stop = False
    if step.last_stop is None:
        cut = n_steps - k  # >= 1: step 0 is before the window
        states = tuple(_detach(s) for s in states)
        ys = [y.detach() for y in ys]
        if cut > 1:
            with torch.no_grad():
                states, ys = piece(states, 1, cut, before=ys)
        if k > 0:
            _, ys = piece(states, cut, n_steps, before=ys)
        return ys
    if n_steps > 1 and not bool(step.last_stop.stop):
        _, ys = piece(states, 1, n_steps, gated, before=ys)
    window.start = max(next(counter) - k, 0)  # the counter has counted the steps that ran
    return ys
