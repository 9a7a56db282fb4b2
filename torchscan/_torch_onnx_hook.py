"""Makes ``torch.onnx.export`` aware of torchscan, without importing onnx until it is used.

``import torchscan`` wraps ``torch.onnx.export`` (``torch.onnx`` itself is light), and installs
torchscan's translations and version conversion into torch.onnx's internals
(``torchscan.onnx._hooks``) as soon as torch.onnx loads its exporter: at once where it is loaded
already, else right after it is imported, which the first export does. So an export through a
reference to ``torch.onnx.export`` kept from before ``import torchscan`` gets them too.
"""

from __future__ import annotations

import contextvars
import functools
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import torch.onnx

from torchscan import _compat
from torchscan._errors import TorchscanError


def wrap_torch_onnx_export() -> None:
    original = torch.onnx.export
    if getattr(original, "__torchscan_wrapped__", False):
        return

    @functools.wraps(original)
    def export(*args: Any, **kwargs: Any) -> Any:
        hooks = install_onnx_hooks()
        if kwargs.get("dynamo", True) is not False:
            # torch.onnx's public way in; the user's own entries win
            user_table = kwargs.get("custom_translation_table") or {}
            kwargs["custom_translation_table"] = {**hooks.translations(), **user_table}
        target = _target_opset.set(kwargs.get("opset_version") or _DEFAULT_OPSET)
        try:
            return original(*args, **kwargs)
        except Exception as error:
            cause = _torchscan_cause(error)
            if cause is None or cause is error:
                raise
        finally:
            _target_opset.reset(target)
        # torch.onnx wraps what failed while tracing in its own error after trying other
        # strategies; torchscan's message already says what is wrong and what to do. Raised
        # outside the handler, so that torch.onnx's error, which holds the refusal, does not
        # become its context: a loop for code that follows __context__.
        raise cause.with_traceback(None) from None

    export.__torchscan_wrapped__ = True  # type: ignore[attr-defined]
    torch.onnx.export = export


_EXPORTER = _compat.ONNX_EXPORTER_MODULE


def install_hooks_when_the_exporter_loads() -> None:
    if _EXPORTER in sys.modules:
        install_onnx_hooks()
    elif not any(isinstance(finder, _AfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds torch.onnx's exporter as the other finders do, and installs the hooks once it has
    been executed; then leaves the import system."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != _EXPORTER:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_install(module: Any) -> None:
            exec_module(module)
            sys.meta_path.remove(self)
            install_onnx_hooks()

        spec.loader.exec_module = exec_then_install  # type: ignore[method-assign]
        return spec


_DEFAULT_OPSET = -1
"""What the wrapper records when the call names no ``opset_version``: torch.onnx's default."""

_target_opset: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "torchscan_target_opset", default=None
)
"""The ``opset_version`` of the ``torch.onnx.export`` call in progress through the wrapper."""


def install_if_exporting(api: str) -> Callable[[str, Sequence[tuple[str, Any]]], None] | None:
    """Make sure the hooks are in place when a scan or loop is traced by ``torch.onnx.export``
    (torch.onnx may have loaded its exporter in a way the import hook did not see), and return
    the check of the element types of its leaves, in the words of ``api``, where the target
    opset is known (the export was called through the wrapper); None elsewhere."""
    if not torch.onnx.is_in_onnx_export():
        return None
    install_onnx_hooks()
    opset = _target_opset.get()
    if opset is None:
        return None
    from torchscan.onnx import _hooks

    return functools.partial(_hooks.check_leaf_types, api, None if opset < 0 else opset)


def install_onnx_hooks() -> ModuleType:
    """Install torchscan's hooks in torch.onnx; return the module that holds them."""
    from torchscan.onnx import _hooks

    _hooks.install()
    return _hooks


def _torchscan_cause(error: BaseException) -> BaseException | None:
    """The error of torchscan's own that torch.onnx wrapped in ``error``, if any."""
    seen = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, TorchscanError):
            return current
        # what the error was raised from, or else what it was raised while handling, unless
        # that was suppressed (``raise ... from None``)
        context = None if current.__suppress_context__ else current.__context__
        current = current.__cause__ or context
    return None
