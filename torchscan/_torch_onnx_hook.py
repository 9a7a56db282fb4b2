"""Makes ``torch.onnx.export`` aware of torchscan, without importing onnx until it is used.

``import torchscan`` wraps ``torch.onnx.export`` (``torch.onnx`` itself is light); the first export
installs torchscan's translations and version conversion into torch.onnx's internals
(``torchscan.onnx._hooks``). The traced ``scan`` installs them too, for code that kept a
reference to ``torch.onnx.export`` from before ``import torchscan``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch.onnx


def wrap_torch_onnx_export() -> None:
    original = torch.onnx.export
    if getattr(original, "__torchscan_wrapped__", False):
        return

    @functools.wraps(original)
    def export(*args: Any, **kwargs: Any) -> Any:
        install_onnx_hooks()
        try:
            return original(*args, **kwargs)
        except Exception as error:
            cause = _torchscan_cause(error)
            if cause is None:
                raise
            # torch.onnx wraps what failed while tracing in its own error after trying other
            # strategies; torchscan's message already says what is wrong and what to do.
            raise cause.with_traceback(None) from None

    export.__torchscan_wrapped__ = True  # type: ignore[attr-defined]
    torch.onnx.export = export


def install_onnx_hooks() -> None:
    from torchscan.onnx import _hooks

    _hooks.install()


def _torchscan_cause(error: BaseException) -> BaseException | None:
    seen = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if current is not error and str(current).startswith("torchscan"):
            return current
        current = current.__cause__ or current.__context__
    return None
