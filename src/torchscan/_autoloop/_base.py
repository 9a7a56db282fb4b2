"""What the runtime of converted loops shares: the static description of a loop (:class:`Loop`),
the record of what each loop did, and the signal to run a loop as Python (:class:`_Fallback`)."""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, NoReturn

import torch

from torchscan import _context
from torchscan._compat import pytree
from torchscan._errors import TorchscanTypeError, reduce_error

API = "torchscan.autoloop"


class _Undefined:
    """The value of a carry that is not bound before the loop."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<undefined>"


UNDEFINED: Any = _Undefined()


@dataclasses.dataclass(frozen=True, eq=False)
class Loop:
    """One ``for`` statement of a converted function: where it is, what it carries and
    appends, and why it stays Python where the analysis says so. Immutable, as what a step
    captures must be for hoisting (a converted method's closure holds it); what each run did is
    kept in :data:`_outcomes`."""

    function: str
    filename: str
    lineno: int
    carries: tuple[str, ...]
    lists: tuple[str, ...]
    strict: bool = False
    reason: str = ""  # why it stays Python, from its source alone
    stops: bool = False  # whether its body ends it with `if condition: break`
    skips: bool = False  # whether its body ends a step with `if condition: continue`

    def where(self) -> str:
        return f"{self.function} ({self.filename}, line {self.lineno})"

    def outcome(self) -> tuple[bool, str]:
        """Whether it ran as a scan the last time it ran (before that: whether it may), and
        why not."""
        return _outcomes.get(self, (not self.reason, self.reason))


_outcomes: weakref.WeakKeyDictionary[Loop, tuple[bool, str]] = weakref.WeakKeyDictionary()


def _record(loop: Loop, converted: bool, reason: str) -> None:
    if _context.compiling():
        return  # a run that torch traces records nothing (TorchDynamo would guard on the dict)
    _outcomes[loop] = (converted, reason)
    key = id(loop)
    if not converted:
        _last_scanned.discard(key)
    elif key not in _last_scanned:
        _last_scanned.add(key)
        if key not in _watched:
            _watched.add(key)
            weakref.finalize(loop, _forget, key)


_last_scanned: set[int] = set()
"""The ids of the living loops whose last run was recorded as a scan's: a ``while`` run as
written that would again be one (:func:`as_written`) records nothing anew."""

_watched: set[int] = set()


def _forget(key: int) -> None:
    _last_scanned.discard(key)
    _watched.discard(key)


class _Fallback(Exception):
    """Why a loop runs as Python this time; ``error``, the error the scan raised where it was
    not torchscan's (the user's own, or one the conversion caused)."""

    __reduce__ = reduce_error

    def __init__(self, reason: str, error: BaseException | None = None) -> None:
        super().__init__(reason)
        self.error = error


def _is_tensor_tree(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    leaves = pytree.tree_leaves(value)
    return all(isinstance(leaf, torch.Tensor) or leaf is None for leaf in leaves)


def _symbolic(t: torch.Tensor, axis: int) -> bool:
    return not isinstance(t.shape[axis], int)


def refuse_strict(loop: Loop, reason: _Fallback) -> NoReturn:
    """With ``strict=True``, the refusal of a loop that runs along a tensor's axis but would run
    as Python: the error the scan raised where it raised one, else why it runs as Python."""
    if reason.error is not None:
        raise reason.error from None
    raise TorchscanTypeError(
        f"{API}: the loop of {loop.where()} runs as Python: {reason}"
    ) from None
