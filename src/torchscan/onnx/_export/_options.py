"""Settings of the export that torch.onnx has no argument for."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator

from torchscan import _checks


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    hoist_loop_invariants: bool = True
    """Move work that does not depend on the carried state out of Scan and Loop bodies: work on
    outside values only is done once, work on the scanned elements once over the whole sequence
    (see ``torchscan.onnx.hoist_loop_invariants``)."""


_DEFAULTS = ExportOptions()  # frozen: one instance can be every context's default
_current: contextvars.ContextVar[ExportOptions] = contextvars.ContextVar(
    "torchscan_export_options", default=_DEFAULTS
)


def current() -> ExportOptions:
    """The settings in force in this thread or task."""
    return _current.get()


@contextlib.contextmanager
def export_options(**changes: bool) -> Iterator[ExportOptions]:
    """Change torchscan's export settings for the exports inside the ``with`` block.

    >>> import torchscan.onnx
    >>> with torchscan.onnx.export_options(hoist_loop_invariants=False) as options:
    ...     options.hoist_loop_invariants
    False
    """
    for name, value in changes.items():
        _checks.check_bool("torchscan.onnx.export_options", name, value)
    token = _current.set(dataclasses.replace(_current.get(), **changes))
    try:
        yield _current.get()
    finally:
        _current.reset(token)
