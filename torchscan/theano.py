"""Theano's ``scan``, ``map``, ``reduce``, ``foldl`` and ``foldr``, on top of torchscan.

Code written for ``theano.scan`` (or PyTensor's) runs here with its arguments and its semantics:
taps on sequences and outputs, ``n_steps``, ``go_backwards``, truncated backpropagation through
time, ``strict`` and ``until``. Each call lowers onto :func:`torchscan.scan` (or, with no
sequence, :func:`torchscan.loop`), so it runs at eager speed and exports to one ONNX ``Scan`` or
``Loop``: sequence taps become shifted slices of the sequence fed to one scan, and output taps a
carried window of past values.

PyTorch has no shared variables, so ``updates`` is always an empty dict; a step function that
returns updates is refused. Keep such state in ``outputs_info`` instead (see
``docs/theano.md``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch
import torch.utils._pytree
from torch.utils._python_dispatch import TorchDispatchMode

from torchscan import _checks
from torchscan._loop import loop as _loop
from torchscan._scan import scan_in_order as _scan_in_order
from torchscan._steps import Until, until

__all__ = ["foldl", "foldr", "map", "reduce", "scan", "until"]

_API = "torchscan.theano.scan"
Updates = dict


# -- arguments ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Sequence:
    tensor: torch.Tensor
    taps: tuple[int, ...]

    @property
    def before(self) -> int:
        """How many elements the taps read before the first step's position."""
        return -min(min(self.taps), 0)

    @property
    def after(self) -> int:
        return max(max(self.taps), 0)

    def steps_available(self) -> int:
        return self.tensor.shape[0] - self.before - self.after

    def slices(self, n_steps: int, backwards: bool) -> list[torch.Tensor]:
        """One sequence per tap: element ``t`` of the one for tap ``k`` is ``input[t + k]``,
        counting from the first position every tap can read. Going backwards, the steps are the
        last ``n_steps`` positions, as Theano reverses the sequences before it cuts them."""
        start = self.steps_available() - n_steps if backwards else 0
        return [
            self.tensor[k + self.before + start : k + self.before + start + n_steps]
            for k in self.taps
        ]


@dataclasses.dataclass(frozen=True)
class _Output:
    initial: torch.Tensor | None
    taps: tuple[int, ...]  # empty: not fed back

    @property
    def depth(self) -> int:
        return -min(self.taps) if self.taps else 0

    @property
    def windowed(self) -> bool:
        """Whether the carried state is a window of past values rather than the last value:
        ``initial`` then has an extra leading axis covering the deepest tap."""
        return bool(self.taps) and self.taps != (-1,)

    def initial_state(self) -> torch.Tensor | None:
        if not self.taps:
            return None
        return self.initial[: self.depth] if self.windowed else self.initial

    def past(self, state: torch.Tensor) -> list[torch.Tensor]:
        """The values of the taps, in the order they were given."""
        if not self.windowed:
            return [state]
        return [state[self.depth + k] for k in self.taps]

    def advance(self, state: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        if not self.windowed:
            return new
        return torch.cat([state[1:], new.unsqueeze(0)])


def _as_list(value: Any) -> list:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _taps(value: Any, where: str) -> tuple[int, ...]:
    taps = tuple(_as_list(value))
    if not taps or not all(isinstance(t, int) and not isinstance(t, bool) for t in taps):
        raise TypeError(f"{_API}: the taps of {where} must be ints, but got {value!r}.")
    return taps


def _sequences(sequences: Any) -> list[_Sequence]:
    result = []
    for i, seq in enumerate(_as_list(sequences)):
        where = f"sequences[{i}]"
        if isinstance(seq, Mapping):
            tensor, taps = seq.get("input"), _taps(seq.get("taps", [0]), where)
        else:
            tensor, taps = seq, (0,)
        if not isinstance(tensor, torch.Tensor) or tensor.ndim == 0:
            raise TypeError(
                f"{_API}: {where} must be a tensor with a time axis, or a dict with such a tensor "
                f"as 'input', but got {_checks.describe(tensor)}."
            )
        result.append(_Sequence(tensor, taps))
    return result


def _outputs(outputs_info: Any) -> list[_Output]:
    result = []
    for i, info in enumerate(_as_list(outputs_info)):
        where = f"outputs_info[{i}]"
        if isinstance(info, Mapping):
            initial = info.get("initial")
            taps = () if initial is None or info.get("taps", [-1]) is None else None
            taps = taps if taps is not None else _taps(info.get("taps", [-1]), where)
        else:
            initial, taps = info, (() if info is None else (-1,))
        if taps and any(t >= 0 for t in taps):
            raise ValueError(
                f"{_API}: the taps of {where} must be negative (past values), but got {list(taps)}."
            )
        if taps and not isinstance(initial, torch.Tensor):
            raise TypeError(
                f"{_API}: the initial state of {where} must be a tensor, but got "
                f"{_checks.describe(initial)}."
            )
        output = _Output(initial, taps)
        if output.windowed and (initial.ndim == 0 or initial.shape[0] < output.depth):
            raise ValueError(
                f"{_API}: {where} reads {output.depth} steps back (taps {list(taps)}), so its "
                f"initial state needs a leading axis of at least {output.depth} holding those "
                f"past values, but it has shape {tuple(initial.shape)}."
            )
        result.append(output)
    return result


def _n_steps(n_steps: Any, sequences: list[_Sequence], go_backwards: bool) -> tuple[Any, bool]:
    """The number of steps, and whether to go backwards: a negative ``n_steps`` flips it."""
    if n_steps is None:
        if not sequences:
            raise ValueError(f"{_API}: n_steps is needed when there are no sequences.")
        return min(seq.steps_available() for seq in sequences), go_backwards
    if isinstance(n_steps, torch.Tensor):
        if n_steps.ndim != 0 or n_steps.is_floating_point() or n_steps.dtype == torch.bool:
            raise TypeError(
                f"{_API}: n_steps must be an int or a 0-d integer tensor, but got "
                f"{_checks.describe(n_steps)}."
            )
        if not sequences:
            return n_steps, go_backwards
        n_steps = int(n_steps)
    elif isinstance(n_steps, bool) or not isinstance(n_steps, (int, torch.SymInt)):
        raise TypeError(
            f"{_API}: n_steps must be an int or a 0-d integer tensor, but got "
            f"{_checks.describe(n_steps)}."
        )
    backwards = go_backwards != (n_steps < 0)
    n_steps = abs(n_steps)
    short = [
        f"sequences[{i}] has {seq.tensor.shape[0]} elements and taps {list(seq.taps)}, so "
        f"{seq.steps_available()} steps"
        for i, seq in enumerate(sequences)
        if seq.steps_available() < n_steps
    ]
    if short:
        raise ValueError(
            f"{_API}: n_steps={n_steps}, but not every sequence is long enough:"
            f"{_checks.bullets(short)}"
        )
    return n_steps, backwards


# -- what fn returns ---------------------------------------------------------------------------


def _split_result(result: Any, n_outputs: int | None) -> tuple[list[torch.Tensor], Until | None]:
    """Theano's step results: outputs (a tensor or a list), perhaps updates, perhaps ``until``
    last."""
    parts = list(result) if isinstance(result, tuple) else [result]
    stop = parts.pop() if parts and isinstance(parts[-1], Until) else None
    updates = [p for p in parts if isinstance(p, Mapping) or _is_update_list(p)]
    if any(updates):
        raise TypeError(
            f"{_API}: fn returned updates, but PyTorch has no shared variables to update. Keep "
            "that state in outputs_info and return its new value as an output."
        )
    parts = [p for p in parts if not (isinstance(p, Mapping) or _is_update_list(p))]
    outputs = parts[0] if len(parts) == 1 and isinstance(parts[0], list) else parts
    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    if n_outputs is not None and len(outputs) != n_outputs:
        raise ValueError(
            f"{_API}: fn returned {len(outputs)} outputs, but outputs_info describes "
            f"{n_outputs}; give one entry per output (None for an output that is not fed back)."
        )
    return outputs, stop


def _is_update_list(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(v, tuple) and len(v) == 2 for v in value)
    )


# -- strict ------------------------------------------------------------------------------------


class _ForeignTensors(TorchDispatchMode):
    """Records the tensors operations read that are neither given nor computed: those ``fn``
    reaches by closure."""

    # Constants built inside fn (torch.tensor(...)) arrive through these as fresh tensors.
    _MAKES_CONSTANTS: ClassVar = {
        torch.ops.aten.lift_fresh.default,
        torch.ops.aten.lift_fresh_copy.default,
    }

    def __init__(self, given: Sequence[Any]) -> None:
        super().__init__()
        self.alive = [t for t in given if isinstance(t, torch.Tensor)]
        self.known = {id(t) for t in self.alive}
        self.foreign: list[torch.Tensor] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func not in self._MAKES_CONSTANTS:
            for t in torch.utils._pytree.tree_leaves((args, kwargs)):
                if isinstance(t, torch.Tensor) and id(t) not in self.known:
                    self.foreign.append(t)
                    self.known.add(id(t))
                    self.alive.append(t)
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.known.add(id(t))
                self.alive.append(t)
        return out


def _strict_call(fn: Callable, args: list[Any]) -> Any:
    with _ForeignTensors(args) as mode:
        result = fn(*args)
    if mode.foreign:
        names = [_name_in(fn, t) for t in mode.foreign]
        raise ValueError(
            f"{_API}: strict=True, but fn uses tensors that are not among its arguments:"
            f"{_checks.bullets(names)}\n"
            "Pass them in non_sequences (fn then receives them last), or use strict=False."
        )
    return result


def _name_in(fn: Callable, tensor: torch.Tensor) -> str:
    """Where ``fn`` finds ``tensor``: a name in its closure or globals, or a module attribute."""
    code = getattr(fn, "__code__", None)
    places = {}
    if code is not None:
        for name, cell in zip(code.co_freevars, fn.__closure__ or (), strict=True):
            places[name] = cell.cell_contents
        for name in code.co_names:
            if name in fn.__globals__:
                places.setdefault(name, fn.__globals__[name])
    for name, value in places.items():
        if value is tensor:
            return f"{name} ({_checks.describe(tensor)})"
        if isinstance(value, torch.nn.Module):
            for attr, t in [*value.named_parameters(), *value.named_buffers()]:
                if t is tensor:
                    return f"{name}.{attr} ({_checks.describe(tensor)})"
    return f"a tensor {_checks.describe(tensor)}"


# -- scan --------------------------------------------------------------------------------------


def scan(
    fn: Callable[..., Any],
    sequences: Any = None,
    outputs_info: Any = None,
    non_sequences: Any = None,
    n_steps: int | torch.Tensor | None = None,
    truncate_gradient: int = -1,
    go_backwards: bool = False,
    mode: Any = None,
    name: str | None = None,
    profile: bool = False,
    allow_gc: bool | None = None,
    strict: bool = False,
) -> tuple[torch.Tensor | list[torch.Tensor], Updates]:
    """Theano's ``scan``: call ``fn`` on slices of sequences and past outputs, collect outputs.

    At step ``t`` (from 0 to ``n_steps - 1``), ``fn`` receives, in this order: for every
    sequence, its elements at ``t + k`` for each of its taps ``k`` (default ``[0]``); for every
    output fed back, its values at ``t + k`` for each of its (negative) taps (default ``[-1]``),
    the initial state standing for the values before step 0; then every non-sequence. It returns
    the new value of every output, and optionally ``until(stop)`` last::

        def scan(fn, sequences, outputs_info, non_sequences, n_steps):
            out = {i: list(initial_i) for i in fed_back}        # the past, oldest first
            for t in range(n_steps):
                args = [seq[t + k] for seq in sequences for k in taps(seq)]
                args += [out[i][t + k] for i in fed_back for k in taps(i)]
                values = fn(*args, *non_sequences)
                # append values[i] to out[i]; stop after this step if until(...) is true
            return [stack(out[i][steps]) for i in outputs], {}

    Sequence positions count from the first one every tap can read: with taps ``[-4, 0]``,
    ``u[t - 4]`` is ``input[t]`` and ``u[t]`` is ``input[t + 4]``. Without ``n_steps`` the scan
    runs as long as the shortest sequence allows. An output with taps other than ``[-1]`` has an
    initial state with an extra leading axis covering the deepest tap: ``initial[0]`` is the
    value ``depth`` steps back. ``go_backwards`` (or a negative ``n_steps``) runs from the last
    step to the first, and the outputs are in the order the steps ran.

    Args:
        fn: the step function.
        sequences: tensors iterated over their first axis, or dicts ``{"input": tensor, "taps":
            [...]}``.
        outputs_info: per output: its initial state (a tensor: tap -1), a dict ``{"initial":
            tensor, "taps": [...]}``, or ``None`` for an output that is not fed back. ``None``
            alone: no output is fed back.
        non_sequences: tensors (or anything) passed unchanged to every call, last.
        n_steps: the number of steps: an int or a 0-d integer tensor. Negative runs backwards.
            Needed without sequences; with them, each must be long enough.
        truncate_gradient: ``-1`` for full backpropagation through time, or ``k >= 0`` to
            backpropagate through the last ``k`` steps only (earlier steps run without
            gradients).
        go_backwards: run from the end of the sequences to their start.
        mode, name, profile, allow_gc: Theano's compilation and profiling settings; accepted,
            and without effect in PyTorch.
        strict: refuse a ``fn`` that reads tensors it was not given (by closure or as globals);
            checked on the first step.

    Returns:
        ``(outputs, updates)``: every output stacked over the steps that ran (a tensor when
        there is one output, else a list), and an empty dict.

    Raises:
        TypeError: an argument of the wrong type; ``fn`` returns updates.
        ValueError: taps that do not fit; sequences too short for ``n_steps``; no ``n_steps``
            and no sequence; ``strict`` and a tensor read by closure; the number of outputs does
            not match ``outputs_info``.
    """
    del mode, name, profile, allow_gc
    _checks.check_callable(_API, "fn", fn)
    if isinstance(truncate_gradient, bool) or not isinstance(truncate_gradient, int):
        raise TypeError(f"{_API}: truncate_gradient must be an int, but got {truncate_gradient!r}.")
    if truncate_gradient < -1:
        raise ValueError(
            f"{_API}: truncate_gradient must be -1 (no truncation) or a number of steps >= 0, "
            f"but got {truncate_gradient}."
        )
    seqs = _sequences(sequences)
    outs = _outputs(outputs_info)
    steps, backwards = _n_steps(n_steps, seqs, go_backwards)
    extra = _as_list(non_sequences)
    plan = _Plan(fn, seqs, outs, extra, strict)
    if not seqs:
        stacked = plan.run_as_loop(steps)
    elif 0 <= truncate_gradient < steps and torch.is_grad_enabled() and not _exporting():
        stacked = plan.run_truncated(steps, backwards, truncate_gradient)
    else:
        stacked = plan.run(plan.initial_states(), plan.sliced(steps, backwards), backwards)[1]
    return (stacked[0] if len(stacked) == 1 else stacked), {}


def _exporting() -> bool:
    return torch.compiler.is_exporting()


@dataclasses.dataclass
class _Plan:
    fn: Callable
    sequences: list[_Sequence]
    outputs: list[_Output]
    non_sequences: list[Any]
    strict: bool
    n_outputs: int | None = None
    checked: bool = False

    def __post_init__(self) -> None:
        self.n_outputs = len(self.outputs) or None

    def initial_states(self) -> tuple[Any, ...]:
        return tuple(out.initial_state() for out in self.outputs if out.taps)

    def sliced(self, n_steps: int, backwards: bool) -> tuple[torch.Tensor, ...]:
        return tuple(s for seq in self.sequences for s in seq.slices(n_steps, backwards))

    def call(self, states: tuple[Any, ...], x: Sequence[torch.Tensor]) -> tuple[list, Until | None]:
        fed_back = [out for out in self.outputs if out.taps]
        past = [v for out, state in zip(fed_back, states, strict=True) for v in out.past(state)]
        args = [*x, *past, *self.non_sequences]
        if self.strict and not self.checked:
            self.checked = True
            result = _strict_call(self.fn, args)
        else:
            result = self.fn(*args)
        return _split_result(result, self.n_outputs)

    def next_states(self, states: tuple[Any, ...], values: list[torch.Tensor]) -> tuple[Any, ...]:
        if not self.outputs:  # no outputs_info: nothing is fed back
            return ()
        return tuple(
            out.advance(state, value)
            for out, state, value in zip(
                [o for o in self.outputs if o.taps],
                states,
                [v for o, v in zip(self.outputs, values, strict=True) if o.taps],
                strict=True,
            )
        )

    def step(self, states: tuple[Any, ...], x: Any) -> tuple[Any, ...]:
        values, stop = self.call(states, x or ())
        new = (self.next_states(states, values), tuple(values))
        return (*new, stop) if stop is not None else new

    def run(self, states: tuple, xs: tuple, backwards: bool) -> tuple[tuple, list[torch.Tensor]]:
        carry, ys = _scan_in_order(
            self.step, states, xs, length=None, axis=0, reverse=backwards, realign=False
        )
        return carry, list(ys)

    def run_truncated(self, n_steps: int, backwards: bool, k: int) -> list[torch.Tensor]:
        """Truncated backpropagation through time: the first ``n_steps - k`` steps (in the
        order they run) without gradients, the last ``k`` with them."""
        xs = self.sliced(n_steps, backwards)
        order = [x.flip(0) for x in xs] if backwards else list(xs)
        head, tail = [x[: n_steps - k] for x in order], [x[n_steps - k :] for x in order]
        with torch.no_grad():
            states, first = self.run(self.initial_states(), tuple(head), False)
        stopped = first and first[0].shape[0] < n_steps - k
        if stopped:
            return first
        states = torch.utils._pytree.tree_map(_detach, states)
        _, last = self.run(states, tuple(tail), False)
        return [torch.cat([a, b]) for a, b in zip(first, last, strict=True)] if first else last

    def run_as_loop(self, n_steps: Any) -> list[torch.Tensor]:
        """No sequence: a loop of ``n_steps`` iterations (an int or a tensor, exported as the
        ``Loop``'s trip count)."""
        if isinstance(n_steps, torch.Tensor):
            n_steps = n_steps.abs()

        def body(i, states):
            return self.step(states, ())

        _, ys = _loop(body, self.initial_states(), trip_count=n_steps)
        return list(ys)


def _detach(value: Any) -> Any:
    return value.detach() if isinstance(value, torch.Tensor) else value


# -- map, reduce, folds ------------------------------------------------------------------------


def map(
    fn: Callable[..., Any],
    sequences: Any,
    non_sequences: Any = None,
    truncate_gradient: int = -1,
    go_backwards: bool = False,
    mode: Any = None,
    name: str | None = None,
) -> tuple[torch.Tensor | list[torch.Tensor], Updates]:
    """Theano's ``map``: ``fn`` on each element of the sequences, no output fed back.

    ``map(fn, seqs, ...)`` is ``scan(fn, seqs, outputs_info=None, ...)``.
    """
    return scan(
        fn,
        sequences,
        None,
        non_sequences,
        truncate_gradient=truncate_gradient,
        go_backwards=go_backwards,
        mode=mode,
        name=name,
    )


def reduce(
    fn: Callable[..., Any],
    sequences: Any,
    outputs_info: Any,
    non_sequences: Any = None,
    go_backwards: bool = False,
    mode: Any = None,
    name: str | None = None,
) -> tuple[torch.Tensor | list[torch.Tensor], Updates]:
    """Theano's ``reduce``: ``scan``, keeping only the value of each output after the last step."""
    outputs, updates = scan(
        fn, sequences, outputs_info, non_sequences, go_backwards=go_backwards, mode=mode, name=name
    )
    if isinstance(outputs, list):
        return [out[-1] for out in outputs], updates
    return outputs[-1], updates


def foldl(
    fn: Callable[..., Any],
    sequences: Any,
    outputs_info: Any,
    non_sequences: Any = None,
    mode: Any = None,
    name: str | None = None,
) -> tuple[torch.Tensor | list[torch.Tensor], Updates]:
    """Theano's ``foldl``: ``reduce`` from the first element to the last."""
    return reduce(fn, sequences, outputs_info, non_sequences, False, mode, name)


def foldr(
    fn: Callable[..., Any],
    sequences: Any,
    outputs_info: Any,
    non_sequences: Any = None,
    mode: Any = None,
    name: str | None = None,
) -> tuple[torch.Tensor | list[torch.Tensor], Updates]:
    """Theano's ``foldr``: ``reduce`` from the last element to the first."""
    return reduce(fn, sequences, outputs_info, non_sequences, True, mode, name)
