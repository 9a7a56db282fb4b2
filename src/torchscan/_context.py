"""The context a loop is called in, asked in one place: what traces the code now (torch.compile,
torch.export, TorchDynamo), the ``torch.onnx.export`` in progress through torchscan, and the
probes that run code on fake tensors to learn what it returns.

What changes during a call is held in context variables, so that threads and tasks do not see
each other's: :func:`onnx_export` (the export in progress, with the opset it targets) and
:func:`probe` (the probes in progress, by :class:`Probe`). TorchDynamo cannot read a context
variable: code that TorchDynamo may trace asks :func:`dynamo_tracing` first. Whether torchscan's
hooks are in torch.onnx's exporter is a fact of the process, not of a context
(:func:`onnx_hooks_active`).

``tests/test_architecture.py`` holds that no other module creates a ``ContextVar`` (but the
export settings' module, ``onnx/_export/_options.py``) or reads ``torch.compiler.is_*``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import enum
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

# -- what traces the code ----------------------------------------------------------------------
#
# torch's own functions, not wrappers of them: TorchDynamo answers them as it traces, and, where a
# graph break runs torchscan's code untraced under torch.compile, compiles no frame of a wrapper
# that would answer True there.

compiling = torch.compiler.is_compiling
"""Whether ``torch.compile`` or ``torch.export`` traces the code now (TorchDynamo, or the
tracing of AOTAutograd or non-strict export): its tensors may have no values to read."""

dynamo_tracing = torch.compiler.is_dynamo_compiling
"""Whether TorchDynamo traces the code now (``torch.compile``, strict export, the branches of
``torch.cond``): it reads no context variable and runs no untraceable Python."""

exporting = torch.compiler.is_exporting
"""Whether ``torch.export`` traces the model now (``torch.onnx.export`` does)."""


# -- the torch.onnx export in progress ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class OnnxExport:
    """A ``torch.onnx.export`` call in progress through torchscan's wrapper of it or
    ``torchscan.onnx.export``."""

    target_opset: int
    """The default-domain opset it targets (its ``opset_version``, or torch.onnx's default),
    resolved once where the call starts."""


_onnx_export: contextvars.ContextVar[OnnxExport | None] = contextvars.ContextVar(
    "torchscan_onnx_export", default=None
)


def onnx_export() -> OnnxExport | None:
    """The export in progress in this context through torchscan's wrapper, or None (none runs,
    or it was called through a reference to torch's own ``torch.onnx.export``)."""
    return _onnx_export.get()


@contextlib.contextmanager
def exporting_to_onnx(target_opset: int) -> Iterator[OnnxExport]:
    """Within: :func:`onnx_export` is an export that targets ``target_opset``."""
    export = OnnxExport(target_opset)
    token = _onnx_export.set(export)
    try:
        yield export
    finally:
        _onnx_export.reset(token)


_hooks_active: Callable[[], bool] = lambda: False  # noqa: E731


def onnx_hooks_active() -> bool:
    """Whether torchscan's hooks are in torch.onnx's exporter now, so that an export that does
    not go through the wrapper (a reference to ``torch.onnx.export`` kept from before ``import
    torchscan``) still finds torchscan's translations."""
    return _hooks_active()


def set_onnx_hooks_probe(active: Callable[[], bool]) -> None:
    """Make ``active`` the answer of :func:`onnx_hooks_active`: set by the hooks' installer
    (``onnx/_export/_hooks.py``), which alone knows its installation."""
    global _hooks_active
    _hooks_active = active


# -- probes on fake tensors --------------------------------------------------------------------


class Probe(enum.Enum):
    """Why code runs on fake tensors, to learn what it returns rather than to compute it."""

    SHAPES = "shapes"
    """A function called for the shapes of its outputs (a scan that runs no step, the shapes
    of ``ys``: ``_outputs.Protocol.call_on_fake``); a loop it calls finds its own shapes as
    under ``torch.export``."""
    STEP = "step"
    """A step traced for export, run once to learn what it returns (``_traced._flat``); a loop
    nested in it returns outputs shaped as its own probe found them."""
    IMPORT = "import"
    """An imported ONNX module traced, or a body of it probed; the state is the trace's record
    of the values known in Python (``onnx/_import/_graph.py``)."""


_probes: contextvars.ContextVar[Mapping[Probe, Any]] = contextvars.ContextVar(
    "torchscan_probes", default=types.MappingProxyType({})
)


probes: Callable[[], Mapping[Probe, Any]] = _probes.get
"""The probes in progress in this context, kind -> state (the context variable's own ``get``:
read on the path of every node of an imported module, where a call of :func:`probe` costs)."""


def probe(kind: Probe) -> Any:
    """The state of the innermost probe of ``kind`` in progress in this context (``True`` where
    it holds none), or None."""
    return _probes.get().get(kind)


@contextlib.contextmanager
def probing(kind: Probe, state: Any = True) -> Iterator[Any]:
    """Within: :func:`probe` of ``kind`` is ``state``; the probes of other kinds in progress
    stay as they are."""
    token = _probes.set(types.MappingProxyType({**_probes.get(), kind: state}))
    try:
        yield state
    finally:
        _probes.reset(token)
