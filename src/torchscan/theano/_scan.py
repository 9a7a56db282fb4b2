"""Theano's ``scan`` itself: its signature, docstring and the checks of ``fn`` and
``truncate_gradient``, and the choice of how the plan runs (as one scan, as a loop, indexed while
exported, or with truncated backpropagation through time), shared with the reductions.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, SupportsIndex, TypeAlias, overload

import torch

from torchscan import _checks
from torchscan._errors import TorchscanTypeError, TorchscanValueError
from torchscan.theano._args import _API, _as_list, _n_steps, _outputs, _sequences
from torchscan.theano._plan import _Plan
from torchscan.theano._plan import run as _run_plan

if TYPE_CHECKING:
    from torchscan._typing import OneOutputStep, OneOutputUntilStep, Outputs, SeveralOutputsStep

Updates: TypeAlias = dict[Any, Any]


@overload
def scan(
    fn: OneOutputStep,
    sequences: Any = None,
    outputs_info: Any = None,
    non_sequences: Any = None,
    n_steps: SupportsIndex | torch.Tensor | None = None,
    truncate_gradient: int = -1,
    go_backwards: bool = False,
    mode: Any = None,
    name: str | None = None,
    profile: bool = False,
    allow_gc: bool | None = None,
    strict: bool = False,
) -> tuple[torch.Tensor, Updates]: ...


@overload
def scan(
    fn: SeveralOutputsStep,
    sequences: Any = None,
    outputs_info: Any = None,
    non_sequences: Any = None,
    n_steps: SupportsIndex | torch.Tensor | None = None,
    truncate_gradient: int = -1,
    go_backwards: bool = False,
    mode: Any = None,
    name: str | None = None,
    profile: bool = False,
    allow_gc: bool | None = None,
    strict: bool = False,
) -> tuple[list[torch.Tensor], Updates]: ...


@overload
def scan(
    fn: OneOutputUntilStep,
    sequences: Any = None,
    outputs_info: Any = None,
    non_sequences: Any = None,
    n_steps: SupportsIndex | torch.Tensor | None = None,
    truncate_gradient: int = -1,
    go_backwards: bool = False,
    mode: Any = None,
    name: str | None = None,
    profile: bool = False,
    allow_gc: bool | None = None,
    strict: bool = False,
) -> tuple[torch.Tensor, Updates]: ...


@overload
def scan(
    fn: Callable[..., Any],
    sequences: Any = None,
    outputs_info: Any = None,
    non_sequences: Any = None,
    n_steps: SupportsIndex | torch.Tensor | None = None,
    truncate_gradient: int = -1,
    go_backwards: bool = False,
    mode: Any = None,
    name: str | None = None,
    profile: bool = False,
    allow_gc: bool | None = None,
    strict: bool = False,
) -> tuple[Outputs, Updates]: ...


def scan(
    fn: Callable[..., Any],
    sequences: Any = None,
    outputs_info: Any = None,
    non_sequences: Any = None,
    n_steps: SupportsIndex | torch.Tensor | None = None,
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
        mode: Theano's compilation mode; accepted, and without effect in PyTorch.
        name: the name Theano gives the scan in profiles; accepted, without effect.
        profile: Theano's profiling switch, a bool; accepted, without effect.
        allow_gc: Theano's garbage-collection setting, a bool or ``None``; accepted, without
            effect.
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
    _checks.check_bool(_API, "profile", profile)
    if allow_gc is not None:
        _checks.check_bool(_API, "allow_gc", allow_gc)
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
    _checks.refuse_strict_export(_API)
    go_backwards = _checks.check_bool(_API, "go_backwards", go_backwards)
    strict = _checks.check_bool(_API, "strict", strict)
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
    plan = _Plan(
        fn,
        tuple(seqs),
        tuple(outs),
        tuple(_as_list(non_sequences)),
        strict,
        n_steps=steps,
        backwards=backwards,
        go_backwards=go_backwards,
        truncate=int(truncate_gradient),
    )
    return _run_plan(plan), plan
