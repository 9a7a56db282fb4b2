"""The user's step function as messages name it: :class:`StepSource`, and the frames of a stack
that are the user's own (not torch's, not torchscan's)."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from torchscan import _compat

# The packages whose frames are not the user's (with the separator: torchvision is not torch).
TORCH_FILES = os.path.join(Path(torch.__file__).parent, "")
TORCHSCAN_FILES = os.path.join(Path(__file__).parent, "")


TORCH_DISTRIBUTIONS_FILES = os.path.join(TORCH_FILES, "distributions", "")

DISTRIBUTIONS_FIX = (
    "make it with validate_args=False (torch.distributions.Normal(loc, scale, "
    "validate_args=False)), or turn the checks off for every distribution with "
    "torch.distributions.Distribution.set_default_validate_args(False)."
)
"""How to make a ``torch.distributions`` object that does not check its arguments."""

DISTRIBUTIONS_REMEDY = (
    "torch.distributions checks the values of a distribution's arguments when it is made "
    f"(validate_args), which reads them: {DISTRIBUTIONS_FIX}"
)
"""The remedy for a step whose ``torch.distributions`` object reads its arguments' values."""


def in_torch_distributions(filenames: Iterable[str]) -> bool:
    """Whether one of the frames of ``filenames`` runs in ``torch.distributions``."""
    return any(name.startswith(TORCH_DISTRIBUTIONS_FILES) for name in filenames)


def is_users(filename: str) -> bool:
    """Whether a frame of ``filename`` is the user's code: not torch's, torchscan's or
    generated code's."""
    return not filename.startswith((TORCH_FILES, TORCHSCAN_FILES, "<"))


@dataclasses.dataclass(frozen=True)
class StepSource:
    """The user's step function, as the public function that calls it names it: ``api``
    (``torchscan.scan``), ``role`` (``fn``, ``body``), its ``__qualname__`` and its code."""

    api: str
    role: str
    qualname: str
    code: types.CodeType | None
    function: Callable | None = dataclasses.field(default=None, compare=False, repr=False)
    """The step function itself, whose closure, globals and ``self`` name the tensors it reads."""

    @classmethod
    def of(cls, fn: Callable, api: str, role: str) -> StepSource:
        function = inspect.unwrap(fn)
        while isinstance(function, functools.partial):
            function = function.func
        if isinstance(function, torch.nn.Module):
            function = function.forward
        code = getattr(function, "__code__", None)
        if code is None and callable(function):  # an object with a __call__ method
            function = type(function).__call__
            code = getattr(function, "__code__", None)
        qualname = getattr(function, "__qualname__", None) or type(fn).__qualname__
        return cls(api, role, qualname, code, fn)

    def keep_its_frames(self) -> None:
        """Have torch record the step's own lines in the stack traces of the nodes it creates
        (while exporting, torch keeps only ``forward`` methods and the frames registered)."""
        if self.code is not None:
            _compat.register_stack_trace_anchor(self.code)

    @property
    def who(self) -> str:
        return f"{self.api}: {self.role} ({self.qualname})"

    @property
    def defined(self) -> str:
        """``file:line`` of the function's definition, or ``""`` where it has no code."""
        if self.code is None:
            return ""
        return f"{self.code.co_filename}:{self.code.co_firstlineno}"

    def _lines(self) -> set[int]:
        assert self.code is not None
        return {line for *_, line in self.code.co_lines() if line is not None}

    def owns(self, filename: str, name: str, line: int) -> bool:
        return (
            self.code is not None
            and filename == self.code.co_filename
            and name == self.code.co_name
            and line in self._lines()
        )


def name_in(fn: Callable, tensor: torch.Tensor) -> str:
    """Where ``fn`` finds ``tensor``: a name in its closure or globals, an attribute of what
    such a name holds (a module's parameters and buffers included), or of ``self`` for a bound
    method or a module called as ``fn``."""
    places = {}
    if isinstance(fn, torch.nn.Module):
        places["fn"] = fn
    if getattr(fn, "__self__", None) is not None:
        places["self"] = fn.__self__
    function: Any = getattr(fn, "__func__", fn)  # a function where it has code
    code = getattr(function, "__code__", None)
    if code is not None:
        for name, cell in zip(code.co_freevars, function.__closure__ or (), strict=True):
            places[name] = cell.cell_contents
        for name in code.co_names:
            if name in function.__globals__:
                places.setdefault(name, function.__globals__[name])
    for name, value in places.items():
        if value is tensor:
            return f"{name} ({_describe(tensor)})"
        attributes = []
        if isinstance(value, torch.nn.Module):
            attributes = [*value.named_parameters(), *value.named_buffers()]
        if hasattr(value, "__dict__") and not isinstance(value, type):
            attributes += [(a, v) for a, v in vars(value).items() if isinstance(v, torch.Tensor)]
        for attr, t in attributes:
            if t is tensor:
                return f"{name}.{attr} ({_describe(tensor)})"
    return f"a tensor {_describe(tensor)}"


def _describe(tensor: torch.Tensor) -> str:
    return f"{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)} on {tensor.device}"
