"""The check of ``strict=True``: a torch function mode that records the tensors the step function
hands to torch without having been given them or computed them during the step (tensors read by
closure or as globals), the tensors that passing ``non_sequences`` gives it, and where in the
function's closure, globals or ``self`` a refused tensor is found, for the message.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from torchscan import _checks, _pytree
from torchscan._errors import TorchscanValueError
from torchscan._source import name_in
from torchscan.theano._args import _API


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
        names = [name_in(fn, t) for t in mode.foreign]
        raise TorchscanValueError(
            f"{_API}: strict=True, but fn uses tensors that are not among its arguments:"
            f"{_checks.bullets(names)}\n"
            "Pass them in non_sequences (fn then receives them last), or use strict=False."
        )
    return result
