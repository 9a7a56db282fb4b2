"""Theano's ``map``, ``reduce``, ``foldl`` and ``foldr``, written on top of its ``scan``: ``map``
calls it with no output fed back, and the others keep the value of each output after the last
step (its initial value when no step runs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, overload

import torch

from torchscan._errors import TorchscanValueError
from torchscan.theano._args import _Output
from torchscan.theano._scan import Updates, _run, scan

if TYPE_CHECKING:
    from torchscan._typing import OneOutputStep, OneOutputUntilStep, Outputs, SeveralOutputsStep


@overload
def map(
    fn: OneOutputStep,
    sequences: Any,
    non_sequences: Any = None,
    truncate_gradient: int = -1,
    go_backwards: bool = False,
    mode: Any = None,
    name: str | None = None,
) -> tuple[torch.Tensor, Updates]: ...


@overload
def map(
    fn: SeveralOutputsStep,
    sequences: Any,
    non_sequences: Any = None,
    truncate_gradient: int = -1,
    go_backwards: bool = False,
    mode: Any = None,
    name: str | None = None,
) -> tuple[list[torch.Tensor], Updates]: ...


@overload
def map(
    fn: OneOutputUntilStep,
    sequences: Any,
    non_sequences: Any = None,
    truncate_gradient: int = -1,
    go_backwards: bool = False,
    mode: Any = None,
    name: str | None = None,
) -> tuple[torch.Tensor, Updates]: ...


@overload
def map(
    fn: Callable[..., Any],
    sequences: Any,
    non_sequences: Any = None,
    truncate_gradient: int = -1,
    go_backwards: bool = False,
    mode: Any = None,
    name: str | None = None,
) -> tuple[Outputs, Updates]: ...


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

    ``sequences``, ``non_sequences``, ``truncate_gradient``, ``go_backwards``, ``mode`` and
    ``name`` are the arguments of :func:`scan`.

    Args:
        fn: called with the slices of every sequence (by their taps), then ``non_sequences``.

    Returns:
        ``(outputs, updates)`` as :func:`scan` returns them.

    Raises:
        TypeError: as :func:`scan`.
        ValueError: as :func:`scan`.
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


@overload
def reduce(
    fn: OneOutputStep,
    sequences: Any,
    outputs_info: Any,
    non_sequences: Any = None,
    go_backwards: bool = False,
    mode: Any = None,
    name: str | None = None,
) -> tuple[torch.Tensor, Updates]: ...


@overload
def reduce(
    fn: SeveralOutputsStep,
    sequences: Any,
    outputs_info: Any,
    non_sequences: Any = None,
    go_backwards: bool = False,
    mode: Any = None,
    name: str | None = None,
) -> tuple[list[torch.Tensor], Updates]: ...


@overload
def reduce(
    fn: OneOutputUntilStep,
    sequences: Any,
    outputs_info: Any,
    non_sequences: Any = None,
    go_backwards: bool = False,
    mode: Any = None,
    name: str | None = None,
) -> tuple[torch.Tensor, Updates]: ...


@overload
def reduce(
    fn: Callable[..., Any],
    sequences: Any,
    outputs_info: Any,
    non_sequences: Any = None,
    go_backwards: bool = False,
    mode: Any = None,
    name: str | None = None,
) -> tuple[Outputs, Updates]: ...


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

    The arguments are those of :func:`scan`.

    Returns:
        ``(outputs, updates)``: the value of each output after the last step (a tensor when
        there is one output, else a list), and an empty dict. When no step runs, an output
        fed back has its initial value (for taps deeper than ``-1``, ``initial[depth - 1]``,
        the value just before step 0).

    Raises:
        TypeError: as :func:`scan`.
        ValueError: as :func:`scan`, and when no step runs and an output is not fed back, so
            it has no value.
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


@overload
def foldl(
    fn: OneOutputStep,
    sequences: Any,
    outputs_info: Any,
    non_sequences: Any = None,
    mode: Any = None,
    name: str | None = None,
) -> tuple[torch.Tensor, Updates]: ...


@overload
def foldl(
    fn: SeveralOutputsStep,
    sequences: Any,
    outputs_info: Any,
    non_sequences: Any = None,
    mode: Any = None,
    name: str | None = None,
) -> tuple[list[torch.Tensor], Updates]: ...


@overload
def foldl(
    fn: OneOutputUntilStep,
    sequences: Any,
    outputs_info: Any,
    non_sequences: Any = None,
    mode: Any = None,
    name: str | None = None,
) -> tuple[torch.Tensor, Updates]: ...


@overload
def foldl(
    fn: Callable[..., Any],
    sequences: Any,
    outputs_info: Any,
    non_sequences: Any = None,
    mode: Any = None,
    name: str | None = None,
) -> tuple[Outputs, Updates]: ...


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

    The arguments are those of :func:`scan`.

    Returns:
        ``(outputs, updates)`` as :func:`reduce` returns them.

    Raises:
        TypeError: as :func:`reduce`.
        ValueError: as :func:`reduce`.
    """
    del mode, name
    return _reduce("foldl", fn, sequences, outputs_info, non_sequences, False)


@overload
def foldr(
    fn: OneOutputStep,
    sequences: Any,
    outputs_info: Any,
    non_sequences: Any = None,
    mode: Any = None,
    name: str | None = None,
) -> tuple[torch.Tensor, Updates]: ...


@overload
def foldr(
    fn: SeveralOutputsStep,
    sequences: Any,
    outputs_info: Any,
    non_sequences: Any = None,
    mode: Any = None,
    name: str | None = None,
) -> tuple[list[torch.Tensor], Updates]: ...


@overload
def foldr(
    fn: OneOutputUntilStep,
    sequences: Any,
    outputs_info: Any,
    non_sequences: Any = None,
    mode: Any = None,
    name: str | None = None,
) -> tuple[torch.Tensor, Updates]: ...


@overload
def foldr(
    fn: Callable[..., Any],
    sequences: Any,
    outputs_info: Any,
    non_sequences: Any = None,
    mode: Any = None,
    name: str | None = None,
) -> tuple[Outputs, Updates]: ...


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

    The arguments are those of :func:`scan`.

    Returns:
        ``(outputs, updates)`` as :func:`reduce` returns them.

    Raises:
        TypeError: as :func:`reduce`.
        ValueError: as :func:`reduce`.
    """
    del mode, name
    return _reduce("foldr", fn, sequences, outputs_info, non_sequences, True)
