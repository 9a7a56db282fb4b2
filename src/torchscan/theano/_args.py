"""The arguments of :func:`torchscan.theano.scan` as Theano gives them: ``sequences`` with their
taps (``_Sequence``: how far each reads before and after a step, and the slices it feeds the
scan), ``outputs_info`` with theirs (``_Output``: the initial state, a window of past values for
taps deeper than ``-1``), and ``n_steps`` with the direction it sets (a tensor ``n_steps`` stays
one while a model is exported, which ``_exporting`` tells); with the name every message starts
with.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from torchscan import _checks, _dispatch
from torchscan._errors import TorchscanTypeError, TorchscanValueError

_API = "torchscan.theano.scan"


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
        # narrow, whose result has n_steps elements by construction: a slice's size is
        # computed from its bounds, which torch.export cannot simplify to one size for every
        # sequence where the lengths are sizes of the exported program (a guard it refuses).
        # Its starts are never negative (n_steps is at most what is available), which
        # torch.export cannot prove where n_steps is the least of several sizes: it is told.
        starts = [k + self.before + start for k in self.taps]
        for first in starts:
            if isinstance(first, torch.SymInt):
                torch._check(first >= 0)
        return [self.tensor.narrow(0, first, n_steps) for first in starts]


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
        assert self.initial is not None  # an output with taps has an initial state
        return self.initial[: self.depth] if self.windowed else self.initial

    def value_before_step_0(self) -> torch.Tensor:
        """``output[-1]``: what a reduction over zero steps returns (for an output with taps)."""
        assert self.initial is not None  # an output with taps has an initial state
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


def _exporting() -> bool:
    return _dispatch.traced()
