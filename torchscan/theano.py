"""Theano's ``scan``, ``map``, ``reduce``, ``foldl`` and ``foldr``, on top of torchscan.

Code written for ``theano.scan`` (or PyTensor's) runs here with its arguments and its semantics:
taps on sequences and outputs, ``n_steps``, ``go_backwards``, truncated backpropagation through
time, ``strict`` and ``until``. Each call lowers onto :func:`torchscan.scan` (or, with no
sequence or with ``n_steps`` a tensor being exported, :func:`torchscan.loop`), so it runs at
eager speed and exports to one ONNX ``Scan`` or ``Loop``: sequence taps become shifted slices of
the sequence fed to one scan, and output taps a carried window of past values.

PyTorch has no shared variables, so ``updates`` is always an empty dict; a step function that
returns updates is refused. Keep such state in ``outputs_info`` instead (see
``docs/theano.md``).
"""

from __future__ import annotations

import dataclasses
import itertools
import numbers
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from torchscan import _checks, _pytree
from torchscan._errors import TorchscanTypeError, TorchscanValueError
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
    where: str  # "sequences[1]", for messages

    @property
    def before(self) -> int:
        """How many elements the taps read before the position of step 0. Theano cuts every
        sequence as if tap 0 were read too, so this is never negative."""
        return max(0, -min(self.taps))

    @property
    def after(self) -> int:
        """How many elements the taps read after the position of the last step (at least 0, as
        for :attr:`before`)."""
        return max(0, max(self.taps))

    def steps_available(self) -> Any:
        return self.tensor.shape[0] - self.before - self.after

    def needs(self, n_steps: Any) -> str:
        """Why this sequence is too short for ``n_steps`` (``None``: for any number of steps)."""
        reads = (
            f"{self.where} has {_elements(self.tensor.shape[0])} and taps {list(self.taps)}, "
            f"which read {_elements(self.before)} before the first step and {self.after} after "
            "the last"
        )
        if n_steps is None:
            return (
                f"{reads}, so it needs at least {_elements(self.before + self.after)} "
                f"({self.before} + {self.after} + one per step)"
            )
        return (
            f"{reads}, so {n_steps} steps need {self.before} + {self.after} + {n_steps} = "
            f"{_elements(self.before + self.after + n_steps)}"
        )

    def slices(self, n_steps: Any, backwards: bool) -> list[torch.Tensor]:
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

    def value_before_step_0(self) -> torch.Tensor:
        """``output[-1]``: what a reduction over zero steps returns."""
        return self.initial[self.depth - 1] if self.windowed else self.initial

    def past(self, state: torch.Tensor) -> list[torch.Tensor]:
        """The values of the taps, in the order they were given."""
        if not self.windowed:
            return [state]
        return [state[self.depth + k] for k in self.taps]

    def advance(self, state: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        if not self.windowed:
            return new
        return torch.cat([state[1:], new.unsqueeze(0)])


def _elements(n: Any) -> str:
    return f"{n} element" if n == 1 else f"{n} elements"


def _as_list(value: Any) -> list:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _from_numpy(value: Any) -> Any:
    """Theano turns numpy arrays into tensors; so does this module (sharing their memory)."""
    if isinstance(value, (np.ndarray, np.generic)):
        return torch.as_tensor(value)
    return value


def _taps(value: Any, where: str) -> tuple[int, ...]:
    taps = _as_list(value)
    if not all(
        isinstance(t, numbers.Integral) and not isinstance(t, (bool, np.bool_)) for t in taps
    ):
        raise TorchscanTypeError(f"{_API}: the taps of {where} must be ints, but got {value!r}.")
    if not taps:
        raise TorchscanValueError(
            f"{_API}: {where} has no taps ({value!r}); give at least one, or leave taps out for "
            "the default."
        )
    return tuple(int(t) for t in taps)


def _sequences(sequences: Any) -> list[_Sequence]:
    result = []
    for i, seq in enumerate(_as_list(sequences)):
        where = f"sequences[{i}]"
        if isinstance(seq, Mapping):
            # Theano: taps missing or None is [0].
            taps = seq.get("taps")
            tensor, taps = seq.get("input"), (0,) if taps is None else _taps(taps, where)
        else:
            tensor, taps = seq, (0,)
        tensor = _from_numpy(tensor)
        if not isinstance(tensor, torch.Tensor) or tensor.ndim == 0:
            raise TorchscanTypeError(
                f"{_API}: {where} must be a tensor with a time axis, or a dict with such a tensor "
                f"as 'input', but got {_checks.describe(tensor)}."
            )
        result.append(_Sequence(tensor, taps, where))
    return result


def _outputs(outputs_info: Any) -> list[_Output]:
    return [_output(info, f"outputs_info[{i}]") for i, info in enumerate(_as_list(outputs_info))]


def _output(info: Any, where: str) -> _Output:
    if info is None:
        return _Output(None, ())
    if isinstance(info, Mapping):
        initial, taps = _from_numpy(info.get("initial")), info.get("taps", [-1])
        if initial is None:
            if "taps" in info and taps is not None:
                raise TorchscanValueError(
                    f"{_API}: {where} has taps {taps!r} but no initial state; the past values "
                    "the taps read before step 0 come from 'initial'. Give it, or drop 'taps' "
                    "for an output that is not fed back."
                )
            return _Output(None, ())
        if taps is None:  # the reference: {"initial": x, "taps": None} passes no past value
            return _Output(None, ())
        taps = _taps(taps, where)
    else:
        initial, taps = _from_numpy(info), (-1,)
    if any(t >= 0 for t in taps):
        raise TorchscanValueError(
            f"{_API}: the taps of {where} must be negative (past values), but got {list(taps)}."
        )
    repeated = sorted({t for t in taps if taps.count(t) > 1})
    if repeated:
        raise TorchscanValueError(
            f"{_API}: the taps of {where} must each read a different past step, but "
            f"{', '.join(str(t) for t in repeated)} appears more than once in {list(taps)}."
        )
    if not isinstance(initial, torch.Tensor):
        raise TorchscanTypeError(
            f"{_API}: the initial state of {where} must be a tensor, but got "
            f"{_checks.describe(initial)}."
        )
    output = _Output(initial, taps)
    if output.windowed and (initial.ndim == 0 or initial.shape[0] < output.depth):
        raise TorchscanValueError(
            f"{_API}: {where} reads {output.depth} steps back (taps {list(taps)}), so its "
            f"initial state needs a leading axis of at least {output.depth} holding those "
            f"past values, but it has shape {tuple(initial.shape)}."
        )
    return output


def _check_n_steps(n_steps: Any) -> Any:
    """``n_steps`` as an int, a SymInt (a size of a program being exported) or a 0-d integer
    tensor; numpy integers become ints."""
    if n_steps is None or isinstance(n_steps, torch.SymInt):
        return n_steps
    if isinstance(n_steps, np.ndarray) and n_steps.ndim == 0:
        n_steps = n_steps[()]
    if isinstance(n_steps, torch.Tensor):
        integer = not (n_steps.is_floating_point() or n_steps.is_complex())
        if n_steps.ndim == 0 and integer and n_steps.dtype != torch.bool:
            return n_steps
    elif isinstance(n_steps, numbers.Integral) and not isinstance(n_steps, (bool, np.bool_)):
        return int(n_steps)
    raise TorchscanTypeError(
        f"{_API}: n_steps must be an int or a 0-d integer tensor, but got "
        f"{_checks.describe(n_steps)}."
    )


def _n_steps(n_steps: Any, sequences: list[_Sequence], go_backwards: bool) -> tuple[Any, bool]:
    """The number of steps and whether to go backwards (a negative ``n_steps`` flips it).

    Eagerly a tensor ``n_steps`` is read; while a model is exported it stays a tensor (the
    direction is then left to :meth:`_Plan.run_indexed`)."""
    n_steps = _check_n_steps(n_steps)
    if n_steps is None:
        if not sequences:
            raise TorchscanValueError(f"{_API}: n_steps is needed when there are no sequences.")
        short = [seq.needs(None) for seq in sequences if seq.steps_available() < 0]
        if short:
            raise TorchscanValueError(
                f"{_API}: n_steps is not given, so the scan runs as many steps as the shortest "
                f"sequence allows, but a sequence is too short for its taps:"
                f"{_checks.bullets(short)}"
            )
        return min(seq.steps_available() for seq in sequences), go_backwards
    if isinstance(n_steps, torch.Tensor):
        if _exporting():
            return n_steps, go_backwards
        n_steps = int(n_steps)
    backwards = go_backwards != (n_steps < 0)
    steps = abs(n_steps)
    short = [seq.needs(steps) for seq in sequences if seq.steps_available() < steps]
    if short:
        raise TorchscanValueError(
            f"{_API}: n_steps={n_steps}, but not every sequence is long enough:"
            f"{_checks.bullets(short)}"
        )
    return steps, backwards


# -- what fn returns ---------------------------------------------------------------------------


def _split_result(result: Any, n_outputs: int | None) -> tuple[list[torch.Tensor], Until | None]:
    """Theano's step results: outputs (a tensor, or a list or tuple of them), perhaps updates,
    perhaps ``until`` last."""
    parts = list(result) if isinstance(result, tuple) else [result]
    stop = parts.pop() if parts and isinstance(parts[-1], Until) else None
    if any(isinstance(p, Until) for p in parts) or any(
        isinstance(o, Until) for p in parts if isinstance(p, list) for o in p
    ):
        raise TorchscanValueError(
            f"{_API}: until(stop) must be the last thing fn returns, after its outputs: return "
            f"(outputs, theano.until(stop)), but fn returned {_describe_returned(result)}."
        )
    updates = [p for p in parts if isinstance(p, Mapping) or _is_update_list(p)]
    if any(updates):  # an empty dict of updates updates nothing
        raise TorchscanTypeError(
            f"{_API}: fn returned updates, but PyTorch has no shared variables to update. Keep "
            "that state in outputs_info and return its new value as an output."
        )
    parts = [p for p in parts if not (isinstance(p, Mapping) or _is_update_list(p))]
    outputs = parts[0] if len(parts) == 1 and isinstance(parts[0], list) else parts
    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    if n_outputs is not None and len(outputs) != n_outputs:
        raise TorchscanValueError(
            f"{_API}: fn returned {len(outputs)} outputs, but outputs_info describes "
            f"{n_outputs}; give one entry per output (None for an output that is not fed back)."
        )
    if stop is not None and isinstance(stop.stop, (bool, np.bool_)):
        stop = Until(torch.tensor(bool(stop.stop)))  # Theano's until takes Python booleans
    return outputs, stop


def _is_update_list(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(v, tuple) and len(v) == 2 for v in value)
    )


def _describe_returned(result: Any) -> str:
    def kind(value: Any) -> str:
        if isinstance(value, Until):
            return "until(...)"
        if isinstance(value, torch.Tensor):
            return "a tensor"
        if isinstance(value, list):
            return "[" + ", ".join(kind(v) for v in value) + "]"
        return _checks.describe(value)

    if isinstance(result, tuple):
        return "(" + ", ".join(kind(v) for v in result) + ")"
    return kind(result)


# -- strict ------------------------------------------------------------------------------------


class _Known:
    """Tensors by identity, held weakly: an id that a dead tensor freed can come back."""

    def __init__(self, tensors: Iterable[torch.Tensor] = ()) -> None:
        self.refs: dict[int, weakref.ref] = {}
        for t in tensors:
            self.add(t)

    def add(self, tensor: torch.Tensor) -> None:
        self.refs[id(tensor)] = weakref.ref(tensor)

    def __contains__(self, tensor: torch.Tensor) -> bool:
        ref = self.refs.get(id(tensor))
        return ref is not None and ref() is tensor


def _passed_tensors(non_sequences: Sequence[Any]) -> list[torch.Tensor]:
    """The tensors that passing ``non_sequences`` gives ``fn``: tensors anywhere in them
    (lists, tuples, dicts), and everything a module among them holds: its parameters, buffers
    and tensor attributes, and those of its submodules."""
    found = []
    for leaf in _pytree.tree_leaves(list(non_sequences)):
        if isinstance(leaf, torch.Tensor):
            found.append(leaf)
        elif isinstance(leaf, torch.nn.Module):
            for module in leaf.modules():
                found += module.parameters(recurse=False)
                found += module.buffers(recurse=False)
                found += [v for v in vars(module).values() if isinstance(v, torch.Tensor)]
    return found


class _StrictCheck(TorchFunctionMode):
    """Records the tensors that ``fn`` hands to torch functions and tensor methods and that are
    neither among what it was given nor computed during the step: those it reaches by closure
    or as globals. One Python call per torch call, about what the call itself costs in Python."""

    def __init__(self, passed: _Known, args: Sequence[Any]) -> None:
        super().__init__()
        self.passed = passed
        self.known = _Known(t for t in args if isinstance(t, torch.Tensor))
        self.foreign: list[torch.Tensor] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self._check(args)
        self._check(kwargs.values())
        out = func(*args, **kwargs)
        self._learn(out)
        return out

    def _check(self, values: Iterable[Any]) -> None:
        for value in values:
            if isinstance(value, torch.Tensor):
                if value not in self.known and value not in self.passed:
                    self.foreign.append(value)
                    self.known.add(value)
            elif isinstance(value, (list, tuple)):
                self._check(value)

    def _learn(self, out: Any) -> None:
        if isinstance(out, torch.Tensor):
            self.known.add(out)
        elif isinstance(out, (list, tuple)):
            for value in out:
                self._learn(value)


def _strict_call(fn: Callable, args: list[Any], passed: _Known) -> Any:
    with _StrictCheck(passed, args) as mode:
        result = fn(*args)
    if mode.foreign:
        names = [_name_in(fn, t) for t in mode.foreign]
        raise TorchscanValueError(
            f"{_API}: strict=True, but fn uses tensors that are not among its arguments:"
            f"{_checks.bullets(names)}\n"
            "Pass them in non_sequences (fn then receives them last), or use strict=False."
        )
    return result


def _name_in(fn: Callable, tensor: torch.Tensor) -> str:
    """Where ``fn`` finds ``tensor``: a name in its closure or globals, an attribute of what
    such a name holds (a module's parameters and buffers included), or of ``self`` for a bound
    method or a module called as ``fn``."""
    places = {}
    if isinstance(fn, torch.nn.Module):
        places["fn"] = fn
    if getattr(fn, "__self__", None) is not None:
        places["self"] = fn.__self__
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if code is not None:
        for name, cell in zip(code.co_freevars, fn.__closure__ or (), strict=True):
            places[name] = cell.cell_contents
        for name in code.co_names:
            if name in fn.__globals__:
                places.setdefault(name, fn.__globals__[name])
    for name, value in places.items():
        if value is tensor:
            return f"{name} ({_checks.describe(tensor)})"
        attributes = []
        if isinstance(value, torch.nn.Module):
            attributes = [*value.named_parameters(), *value.named_buffers()]
        if hasattr(value, "__dict__") and not isinstance(value, type):
            attributes += [(a, v) for a, v in vars(value).items() if isinstance(v, torch.Tensor)]
        for attr, t in attributes:
            if t is tensor:
                return f"{name}.{attr} ({_checks.describe(tensor)})"
    return f"a tensor {_checks.describe(tensor)}"


# -- truncated backpropagation through time ----------------------------------------------------


class _Window:
    """The steps backpropagation goes through, from ``start`` on: with ``until`` they are known
    only once the scan has stopped, after the steps ran."""

    def __init__(self) -> None:
        self.start = 0

    def passes(self, step: int, into_state: bool) -> bool:
        if into_state:  # the state step ``step`` read: cut at the window's first step
            return self.start == 0 or step > self.start
        return step >= self.start  # what step ``step`` returned


class _Gate(torch.autograd.Function):
    """The identity, whose backward lets the gradient through only where ``window`` says."""

    @staticmethod
    def forward(ctx, window: _Window, step: int, into_state: bool, *tensors: torch.Tensor):
        ctx.window, ctx.step, ctx.into_state = window, step, into_state
        ctx.set_materialize_grads(False)
        return tuple(t.view_as(t) for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        through = ctx.window.passes(ctx.step, ctx.into_state)
        return (None, None, None, *(grads if through else (None,) * len(grads)))


def _gate(window: _Window, step: int, into_state: bool, values: Sequence[Any]) -> tuple:
    values = list(values)
    where = [i for i, v in enumerate(values) if isinstance(v, torch.Tensor)]
    if where:
        gated = _Gate.apply(window, step, into_state, *(values[i] for i in where))
        for i, g in zip(where, gated, strict=True):
            values[i] = g
    return tuple(values)


def _detach(value: Any) -> Any:
    return value.detach() if isinstance(value, torch.Tensor) else value


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

    The semantics are given by this Python, where ``seq(t)`` is the element of a sequence at
    time ``t`` (time 0 is ``input[before]``, ``before = max(0, -min(taps))``), ``seq.available``
    the number of steps it allows (``len(input) - before - max(0, max(taps))``), ``out[t]`` the
    value of an output at step ``t`` (``out[-depth:0]`` is its initial state) and ``stack``
    stacks the values of the steps that ran::

        def scan(fn, sequences, outputs_info, non_sequences, n_steps, go_backwards):
            if n_steps is None:
                n_steps = min(seq.available for seq in sequences)
            backwards = go_backwards != (n_steps < 0)
            for s in range(abs(n_steps)):
                args = []
                for seq in sequences:
                    t = seq.available - 1 - s if backwards else s
                    args += [seq(t + k) for k in seq.taps]  # taps default to [0]
                for out in fed_back:
                    args += [out[s + k] for k in out.taps]  # taps default to [-1]
                values, stop = fn(*args, *non_sequences)  # stop: until(...) last, if any
                for out, value in zip(outputs, values):
                    out[s] = value
                if stop:
                    break
            return [stack(out[0 : s + 1]) for out in outputs], {}

    Sequence positions count from the first one every tap can read: with taps ``[-4, 0]``,
    ``u[t - 4]`` is ``input[t]`` and ``u[t]`` is ``input[t + 4]``; as in Theano, a sequence is
    cut as if tap 0 were read too. Without ``n_steps`` the scan runs as many steps as the
    shortest sequence allows. An output with taps other than ``[-1]`` has an initial state with
    an extra leading axis covering the deepest tap: ``initial[0]`` is the value ``depth`` steps
    back. ``go_backwards`` (or a negative ``n_steps``; both: forwards) runs over the last
    ``n_steps`` positions of every sequence, from the last to the first, and the outputs are in
    the order the steps ran.

    Eagerly, ``n_steps`` given as a tensor is read. While a model is exported it stays a value
    of the graph: with sequences the scan becomes one ONNX ``Loop`` of ``abs(n_steps)``
    iterations that gathers the elements each step reads (its direction read from the sign at
    run time; a sequence that is too short makes the runtime fail on an index out of range).

    ``strict=True`` checks every step: each tensor that ``fn`` hands to a torch function, a
    tensor method or an operator must be among its arguments (sequence slices, past outputs,
    ``non_sequences`` and the tensors inside them, and the parameters, buffers and tensor
    attributes of modules among them) or computed during the step; tensors that ``fn`` reads
    by closure or as globals are refused, as Theano refuses shared variables missing from
    ``non_sequences``. A sequence counts as passed through its slices only. Tensors made by
    functions that torch does not report to the check (``torch.from_numpy``,
    ``torch.frombuffer``, ``torch.from_dlpack``) count as read by closure: make constants with
    ``torch.tensor`` or ``torch.as_tensor``. The check costs about one Python call per torch
    call.

    Args:
        fn: the step function.
        sequences: tensors (or numpy arrays) iterated over their first axis, or dicts
            ``{"input": tensor, "taps": [...]}`` (taps missing or ``None``: ``[0]``).
        outputs_info: per output: its initial state (a tensor: tap -1), a dict ``{"initial":
            tensor, "taps": [...]}`` (taps missing: ``[-1]``; ``None``: not fed back), or
            ``None`` or a dict without ``initial`` for an output that is not fed back. ``None``
            alone: no output is fed back.
        non_sequences: tensors, modules (or anything) passed unchanged to every call, last.
        n_steps: the number of steps: an int (numpy integers too) or a 0-d integer tensor.
            Negative runs backwards. Needed without sequences; with them, each must be long
            enough.
        truncate_gradient: ``-1`` for full backpropagation through time, or ``k >= 0`` to
            backpropagate through the last ``k`` steps that ran only: the state the first of
            them reads is cut from the gradient, and the outputs of earlier steps carry none.
            Without ``until`` the earlier steps run without autograd; with it, which steps are
            the last ``k`` is known once the scan stops, so every step is recorded and the
            backward pass skips those before the window. Exported models ignore it.
        go_backwards: run from the end of the sequences to their start.
        mode, name, profile, allow_gc: Theano's compilation and profiling settings; accepted,
            and without effect in PyTorch.
        strict: refuse a ``fn`` that reads tensors it was not given (see above).

    Returns:
        ``(outputs, updates)``: every output stacked over the steps that ran (a tensor when
        there is one output, else a list), and an empty dict.

    Raises:
        TypeError: an argument of the wrong type; ``fn`` returns updates.
        ValueError: taps that do not fit (empty, repeated or non-negative output taps, an
            initial state too short, taps without an initial state); sequences too short for
            their taps or for ``n_steps``; no ``n_steps`` and no sequence; ``strict`` and a
            tensor read by closure; ``until`` not returned last; the number of outputs does
            not match ``outputs_info``.
    """
    del mode, name, profile, allow_gc
    stacked, _ = _run(
        fn, sequences, outputs_info, non_sequences, n_steps, truncate_gradient, go_backwards, strict
    )
    return (stacked[0] if len(stacked) == 1 else stacked), {}


def _run(
    fn: Callable,
    sequences: Any,
    outputs_info: Any,
    non_sequences: Any,
    n_steps: Any,
    truncate_gradient: Any,
    go_backwards: bool,
    strict: bool,
) -> tuple[list[torch.Tensor], _Plan]:
    _checks.check_callable(_API, "fn", fn)
    if isinstance(truncate_gradient, bool) or not isinstance(truncate_gradient, numbers.Integral):
        raise TorchscanTypeError(
            f"{_API}: truncate_gradient must be an int, but got {truncate_gradient!r}."
        )
    if truncate_gradient < -1:
        raise TorchscanValueError(
            f"{_API}: truncate_gradient must be -1 (no truncation) or a number of steps >= 0, "
            f"but got {truncate_gradient}."
        )
    seqs = _sequences(sequences)
    outs = _outputs(outputs_info)
    steps, backwards = _n_steps(n_steps, seqs, go_backwards)
    plan = _Plan(fn, seqs, outs, _as_list(non_sequences), strict)
    if isinstance(steps, torch.Tensor):  # only while exporting
        stacked = plan.run_indexed(steps, go_backwards) if seqs else plan.run_as_loop(steps)
    elif torch.is_grad_enabled() and not _exporting() and 0 <= truncate_gradient < steps:
        stacked = plan.run_truncated(steps, backwards, int(truncate_gradient))
    elif not seqs:
        stacked = plan.run_as_loop(steps)
    else:
        stacked = plan.run(plan.initial_states(), plan.sliced(steps, backwards), backwards)
    return stacked, plan


def _exporting() -> bool:
    return torch.compiler.is_exporting()


@dataclasses.dataclass
class _Plan:
    fn: Callable
    sequences: list[_Sequence]
    outputs: list[_Output]
    non_sequences: list[Any]
    strict: bool
    last_stop: Until | None = None

    def __post_init__(self) -> None:
        self.n_outputs = len(self.outputs) or None
        self.fed_back = [out for out in self.outputs if out.taps]
        self.passed = _Known(_passed_tensors(self.non_sequences)) if self.strict else None

    def initial_states(self) -> tuple[Any, ...]:
        return tuple(out.initial_state() for out in self.fed_back)

    def sliced(self, n_steps: Any, backwards: bool) -> tuple[torch.Tensor, ...]:
        return tuple(s for seq in self.sequences for s in seq.slices(n_steps, backwards))

    def call(self, states: tuple[Any, ...], x: Sequence[torch.Tensor]) -> tuple[list, Until | None]:
        past = [
            v for out, state in zip(self.fed_back, states, strict=True) for v in out.past(state)
        ]
        args = [*x, *past, *self.non_sequences]
        result = _strict_call(self.fn, args, self.passed) if self.strict else self.fn(*args)
        return _split_result(result, self.n_outputs)

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

    def step(self, states: tuple[Any, ...], x: Any) -> tuple[Any, ...]:
        values, stop = self.call(states, x or ())
        self.last_stop = stop
        new = (self.next_states(states, values), tuple(values))
        return (*new, stop) if stop is not None else new

    def run(self, states: tuple, xs: tuple, backwards: bool) -> list[torch.Tensor]:
        _, ys = _scan_in_order(
            self.step, states, xs, length=None, axis=0, reverse=backwards, realign=False
        )
        return list(ys)

    def run_as_loop(self, n_steps: Any) -> list[torch.Tensor]:
        """No sequence: a loop of ``n_steps`` iterations (an int or a tensor, exported as the
        ``Loop``'s trip count)."""
        if isinstance(n_steps, torch.Tensor):
            n_steps = n_steps.abs()

        def body(i, states):
            return self.step(states, ())

        _, ys = _loop(body, self.initial_states(), trip_count=n_steps)
        return list(ys)

    def run_indexed(self, n_steps: torch.Tensor, go_backwards: bool) -> list[torch.Tensor]:
        """Sequences and ``n_steps`` a tensor of the exported graph: a loop of ``abs(n_steps)``
        iterations whose iteration ``i`` gathers element ``i`` of each tap's sequence, cut as in
        :meth:`_Sequence.slices` and reversed when going backwards (the sign of ``n_steps``
        flips ``go_backwards``). Past a sequence's available positions the index is out of
        range: the runtime fails there rather than read the wrong elements.

        Only operators that every opset has on int64 (``Abs``, ``Equal``, ``Not``, ``Cast``,
        ``Gather``) choose the direction: comparisons of integers and ``Where`` come later."""
        negative = n_steps.abs() != n_steps
        flag = (negative.logical_not() if go_backwards else negative).to(torch.int64).reshape(1)
        reads = []
        for seq in self.sequences:
            for cut in seq.slices(seq.steps_available(), False):
                both = torch.stack([cut, cut.flip(0)])
                reads.append(both.index_select(0, flag).squeeze(0))

        def body(i, states):
            x = [read.index_select(0, i.reshape(1)).squeeze(0) for read in reads]
            return self.step(states, x)

        _, ys = _loop(body, self.initial_states(), trip_count=n_steps.abs())
        return list(ys)

    def run_truncated(self, n_steps: int, backwards: bool, k: int) -> list[torch.Tensor]:
        """Truncated backpropagation through time over the last ``k`` (``< n_steps``) steps that
        run, in the order they run.

        Step 0 runs alone first, to learn whether ``fn`` returns ``until``. Without it the
        window is known: the steps before it run without autograd, and the window starts from
        their state detached. With it, the other steps run with autograd, each behind gates
        (:class:`_Gate`) that are told the window once the scan has stopped: the state the
        window's first step reads, and the outputs of earlier steps, pass no gradient."""
        xs = self.sliced(n_steps, backwards)
        xs = [x.flip(0) for x in xs] if backwards else list(xs)
        window = _Window()
        counter = itertools.count()

        def gated(states, x):
            s = next(counter)
            out = self.step(_gate(window, s, True, states), x)
            return (out[0], _gate(window, s, False, out[1]), *out[2:])

        def piece(states, start, stop, step=self.step, before=()):
            """Steps ``start`` to ``stop``, their outputs after those ``before``."""
            part = tuple(x[start:stop] for x in xs) or None  # None: no sequence
            carry, ys = _scan_in_order(
                step, states, part, length=stop - start, axis=0, reverse=False, realign=False
            )
            if before:
                ys = [torch.cat([a, b]) for a, b in zip(before, ys, strict=True)]
            return carry, list(ys)

        states, ys = piece(self.initial_states(), 0, 1, gated)
        if self.last_stop is None:
            cut = n_steps - k  # >= 1: step 0 is before the window
            states = tuple(_detach(s) for s in states)
            ys = [y.detach() for y in ys]
            if cut > 1:
                with torch.no_grad():
                    states, ys = piece(states, 1, cut, before=ys)
            if k > 0:
                _, ys = piece(states, cut, n_steps, before=ys)
            return ys
        if n_steps > 1 and not bool(self.last_stop.stop):
            _, ys = piece(states, 1, n_steps, gated, before=ys)
        window.start = max(next(counter) - k, 0)  # the counter has counted the steps that ran
        return ys


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

    ``map(fn, seqs, non_seqs, ...)`` is ``scan(fn, seqs, outputs_info=None, non_sequences=
    non_seqs, ...)``: ``[fn(*slices_t, *non_seqs) for t in steps]``, each output stacked.

    Args:
        fn: called with the slices of every sequence (by their taps), then ``non_sequences``.
        sequences, non_sequences, truncate_gradient, go_backwards, mode, name: as in
            :func:`scan`.

    Returns:
        ``(outputs, updates)`` as :func:`scan` returns them.

    Raises:
        TypeError, ValueError: as :func:`scan`.
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
    """Theano's ``reduce``: ``scan``, keeping only the value of each output after the last step.

    As Python's ``functools.reduce`` with an initial value, where ``out[-1]`` of an output fed
    back is its value just before step 0 when no step runs (see :func:`scan`)::

        def reduce(fn, sequences, outputs_info, non_sequences, go_backwards):
            outputs, updates = scan(
                fn, sequences, outputs_info, non_sequences, go_backwards=go_backwards
            )
            return [out[-1] for out in outputs], updates

    Args:
        fn, sequences, outputs_info, non_sequences, go_backwards, mode, name: as in
            :func:`scan`.

    Returns:
        ``(outputs, updates)``: the value of each output after the last step (a tensor when
        there is one output, else a list), and an empty dict. When no step runs, an output
        fed back has its initial value (for taps deeper than ``-1``, ``initial[depth - 1]``,
        the value just before step 0).

    Raises:
        TypeError, ValueError: as :func:`scan`; ValueError also when no step runs and an
        output is not fed back, so it has no value.
    """
    del mode, name
    return _reduce("reduce", fn, sequences, outputs_info, non_sequences, go_backwards)


def _reduce(
    api: str,
    fn: Callable,
    sequences: Any,
    outputs_info: Any,
    non_sequences: Any,
    go_backwards: bool,
) -> tuple[torch.Tensor | list[torch.Tensor], Updates]:
    stacked, plan = _run(fn, sequences, outputs_info, non_sequences, None, -1, go_backwards, False)
    last = []
    for i, ys in enumerate(stacked):
        output = plan.outputs[i] if i < len(plan.outputs) else _Output(None, ())
        if output.taps:
            # The value before step 0 in front of the last one: the last of the two is the
            # answer for any number of steps, also one known only when an exported model runs.
            before = output.value_before_step_0().unsqueeze(0)
            last.append(torch.cat([before, ys[-1:]])[-1])
            continue
        if isinstance(ys.shape[0], int) and ys.shape[0] == 0:
            where = f"outputs_info[{i}] is None" if plan.outputs else "outputs_info is None"
            raise TorchscanValueError(
                f"torchscan.theano.{api}: no step runs (the sequences have no element to "
                f"reduce), so output {i} has no value: {where}, so it is not fed back and has "
                "no initial value either. Give it an initial state, which is then the result."
            )
        last.append(ys[-1])
    return (last[0] if len(last) == 1 else last), {}


def foldl(
    fn: Callable[..., Any],
    sequences: Any,
    outputs_info: Any,
    non_sequences: Any = None,
    mode: Any = None,
    name: str | None = None,
) -> tuple[torch.Tensor | list[torch.Tensor], Updates]:
    """Theano's ``foldl``: :func:`reduce` from the first element to the last.

    As Haskell's ``foldl``: ``foldl(fn, [x0, x1], z)`` is ``fn(x1, fn(x0, z))``, and ``z`` for
    no element.

    Args:
        fn, sequences, outputs_info, non_sequences, mode, name: as in :func:`scan`.

    Returns:
        ``(outputs, updates)`` as :func:`reduce` returns them.

    Raises:
        TypeError, ValueError: as :func:`reduce`.
    """
    del mode, name
    return _reduce("foldl", fn, sequences, outputs_info, non_sequences, False)


def foldr(
    fn: Callable[..., Any],
    sequences: Any,
    outputs_info: Any,
    non_sequences: Any = None,
    mode: Any = None,
    name: str | None = None,
) -> tuple[torch.Tensor | list[torch.Tensor], Updates]:
    """Theano's ``foldr``: :func:`reduce` from the last element to the first.

    As Haskell's ``foldr`` (with the arguments in Theano's order): ``foldr(fn, [x0, x1], z)`` is
    ``fn(x0, fn(x1, z))``, and ``z`` for no element.

    Args:
        fn, sequences, outputs_info, non_sequences, mode, name: as in :func:`scan`.

    Returns:
        ``(outputs, updates)`` as :func:`reduce` returns them.

    Raises:
        TypeError, ValueError: as :func:`reduce`.
    """
    del mode, name
    return _reduce("foldr", fn, sequences, outputs_info, non_sequences, True)
