"""Makes ``torch.onnx.export`` aware of torchscan, without importing torch.onnx or onnx until
they are used.

``import torchscan`` calls :func:`install_export_hooks` unless the environment variable
``TORCHSCAN_PATCH_TORCH_ONNX`` is ``0`` (:func:`install_at_import`), which wraps
``torch.onnx.export``, and installs torchscan's translations and version conversion into
torch.onnx's internals (``torchscan.onnx._export._hooks``) as soon as torch.onnx loads its
exporter. Each
is done at once where its module is loaded already, else right after the module is imported (by
a finder placed first in ``sys.meta_path``, which leaves once both are done): torch.onnx when
``torch.onnx`` is first read, its exporter at the first export. So ``import torchscan`` imports
neither, and an export through a reference to ``torch.onnx.export`` kept from before
``import torchscan`` gets the hooks too. :func:`uninstall_export_hooks` undoes all of it;
:func:`export` installs the hooks into torch.onnx's internals for the duration of one export.
``torchscan.onnx`` makes these four functions public.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import Any

from torchscan import _compat, _context
from torchscan._errors import TorchscanError, TorchscanValueError

ENVIRONMENT_VARIABLE = "TORCHSCAN_PATCH_TORCH_ONNX"
_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")

_lock = threading.RLock()
"""Held while the hooks are put in or taken out, and while the count of calls of :func:`export`
changes."""

_installed = False
"""Whether the hooks are installed for every export (:func:`install_export_hooks`)."""

_exports_in_progress = 0
"""Calls of :func:`export` in progress: the hooks stay in torch.onnx's exporter until the last
one ends, where they are not installed for every export."""

_wrapper: Callable[..., Any] | None = None
"""torchscan's wrapper while it is the one installed in ``torch.onnx.export``."""

_wrapped: Callable[..., Any] | None = None
"""What the wrapper replaced in ``torch.onnx.export`` (torch's own function)."""


def install_at_import() -> None:
    """:func:`install_export_hooks`, unless ``TORCHSCAN_PATCH_TORCH_ONNX`` says not to."""
    if patch_at_import():
        install_export_hooks()


def patch_at_import() -> bool:
    """What ``TORCHSCAN_PATCH_TORCH_ONNX`` asks: True where it is unset, empty or one of
    ``1 true yes on``, False for ``0 false no off`` (in any case); any other value is refused."""
    value = os.environ.get(ENVIRONMENT_VARIABLE, "")
    if value.strip().lower() in ("", *_ON):
        return True
    if value.strip().lower() in _OFF:
        return False
    raise TorchscanValueError(
        f"import torchscan: {ENVIRONMENT_VARIABLE}={value!r} is not a value torchscan knows. "
        "Set it to 0 (or false, no, off) for import torchscan to leave torch.onnx as it is, or "
        "to 1 (or true, yes, on; the default) for it to install its hooks in torch.onnx."
    )


def install_export_hooks() -> None:
    """Install torchscan's hooks in torch.onnx for every export, as ``import torchscan`` does
    unless the environment variable ``TORCHSCAN_PATCH_TORCH_ONNX`` is ``0``.

    ``torch.onnx.export`` becomes torchscan's wrapper of it (with its signature and docstring),
    which passes torchscan's translations in ``custom_translation_table`` (your entries win) and
    records ``opset_version`` for the checks of element types. Where torch.onnx's exporter
    (``torch.onnx._internal.exporter._core``) is loaded, four of its attributes are replaced and
    two log filters added at once; else a finder placed first in ``sys.meta_path`` does so right
    after the exporter is imported, and leaves. What each one does is listed in the docstring of
    :mod:`torchscan.onnx` and in docs/export.md ("What importing torchscan changes in torch").
    A second call changes nothing; :func:`uninstall_export_hooks` undoes it.
    """
    global _installed
    with _lock:
        _installed = True
        if _TORCH_ONNX in sys.modules:
            _wrap_torch_onnx_export(sys.modules[_TORCH_ONNX])
        if any(name not in sys.modules for name in _WATCHED) and not any(
            isinstance(finder, _AfterImport) for finder in sys.meta_path
        ):
            sys.meta_path.insert(0, _AfterImport())
    if _EXPORTER in sys.modules:
        install_onnx_hooks()


def uninstall_export_hooks() -> None:
    """Undo :func:`install_export_hooks`, and so what ``import torchscan`` changed in torch.onnx.

    ``torch.onnx.export`` is torch's own function again, the finder leaves ``sys.meta_path``,
    and torch.onnx's exporter gets its four attributes back and loses the two log filters (once
    the calls of :func:`export` in progress end). Where other code has wrapped one of them
    since, torchscan's hook stays inside that wrapper and passes every call through.

    Then a plain ``torch.onnx.export`` of a model with a torchscan loop is refused: torch.onnx's
    error holds (and shows) a :class:`~torchscan.ExportError` that says how to export it.
    :func:`export` still exports it, and torch's exports of everything else are torch's alone.
    torchscan's two higher-order operators stay registered with torch: ``scan`` and ``loop``
    call them under ``torch.export``. Nothing is done where the hooks are not installed.
    """
    global _installed, _wrapper
    with _lock:
        _installed = False
        torch_onnx = sys.modules.get(_TORCH_ONNX)
        if _wrapper is not None and torch_onnx is not None and torch_onnx.export is _wrapper:
            setattr(torch_onnx, "export", _wrapped)  # noqa: B010 (ModuleType declares no export)
        # where something else has wrapped torchscan's wrapper since, the wrapper stays in its
        # chain and passes every call through to torch's function
        _wrapper = None
        for finder in [f for f in sys.meta_path if isinstance(f, _AfterImport)]:
            sys.meta_path.remove(finder)
        if not _exports_in_progress:
            _uninstall_onnx_hooks()


def export_hooks_installed() -> bool:
    """Whether torchscan's hooks are installed in torch.onnx for every export: from
    ``import torchscan`` (unless ``TORCHSCAN_PATCH_TORCH_ONNX=0``) or
    :func:`install_export_hooks` until :func:`uninstall_export_hooks`."""
    return _installed


def export(model: Any, args: tuple[Any, ...] = (), f: Any = None, **kwargs: Any) -> Any:
    """``torch.onnx.export(model, args, f, **kwargs)`` with torchscan's hooks, whether they are
    installed for every export or not: the way to export torchscan's loops after
    ``TORCHSCAN_PATCH_TORCH_ONNX=0`` or :func:`uninstall_export_hooks`.

    It takes the arguments of torch's function and returns what it returns, and does what the
    wrapper of ``torch.onnx.export`` does. Where the hooks are not installed for every export,
    those of torch.onnx's exporter are installed for the duration of the call (and of the other
    calls of this function running then), where any export in the process sees them, and taken
    out after it.
    """
    torch_onnx = importlib.import_module(_TORCH_ONNX)  # wraps its export where installed
    if _wrapper is not None:
        assert _wrapped is not None  # set with _wrapper
        function = _wrapped
    else:
        function = torch_onnx.export
    return _export_with_hooks(function, (model, args, f), kwargs)


def _wrap_torch_onnx_export(torch_onnx: ModuleType) -> None:
    global _wrapper, _wrapped
    original = torch_onnx.export
    if original is _wrapper:
        return

    @functools.wraps(original)
    def export(*args: Any, **kwargs: Any) -> Any:
        if _wrapper is not export:  # uninstalled, but still called by what wrapped it since
            return original(*args, **kwargs)
        return _export_with_hooks(original, args, kwargs)

    export.__torchscan_wrapped__ = True  # type: ignore[attr-defined]
    _wrapper, _wrapped = export, original
    setattr(torch_onnx, "export", export)  # noqa: B010 (ModuleType declares no export)


def _export_with_hooks(export: Callable[..., Any], args: Sequence[Any], kwargs: dict) -> Any:
    """``export(*args, **kwargs)`` (torch.onnx's), with torchscan's translations in
    ``custom_translation_table``, the target opset recorded for the loops traced, the hooks in
    torch.onnx's exporter, and torchscan's refusals raised as they are."""
    with _hooks_for_this_call() as hooks:
        if kwargs.get("dynamo", True) is not False:
            # torch.onnx's public way in; the user's own entries win
            user_table = kwargs.get("custom_translation_table") or {}
            kwargs["custom_translation_table"] = {**hooks.translations(), **user_table}
        try:
            with _context.exporting_to_onnx(
                kwargs.get("opset_version") or _compat.onnx_default_opset()
            ):
                return export(*args, **kwargs)
        except Exception as error:
            cause = _torchscan_cause(error)
            if cause is None or cause is error:
                raise
        # torch.onnx wraps what failed while tracing in its own error after trying other
        # strategies; torchscan's message already says what is wrong and what to do. Raised
        # outside the handler, so that torch.onnx's error, which holds the refusal, does not
        # become its context: a loop for code that follows __context__.
        raise cause.with_traceback(None) from None


@contextlib.contextmanager
def _hooks_for_this_call() -> Iterator[ModuleType]:
    """The hooks in torch.onnx's exporter for the duration of one export: taken out after it
    where they are not installed for every export and no other call of :func:`export` runs."""
    global _exports_in_progress
    hooks = install_onnx_hooks()  # imports, which is not done while the lock is held
    with _lock:
        _exports_in_progress += 1
        hooks.install()  # where another call's end took them out since
    try:
        yield hooks
    finally:
        with _lock:
            _exports_in_progress -= 1
            if not _installed and not _exports_in_progress:
                hooks.uninstall()


_TORCH_ONNX = "torch.onnx"
_EXPORTER = _compat.ONNX_EXPORTER_MODULE
_WATCHED = (_TORCH_ONNX, _EXPORTER)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds torch.onnx and its exporter as the other finders do, and wraps
    ``torch.onnx.export`` or installs the hooks once the module has been executed; leaves the
    import system once both are loaded."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in _WATCHED:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_install(module: Any) -> None:
            exec_module(module)
            if all(watched in sys.modules for watched in _WATCHED):
                # uninstall_export_hooks() may have removed it
                with contextlib.suppress(ValueError):
                    sys.meta_path.remove(self)
            if not _installed:
                return
            if name == _TORCH_ONNX:
                with _lock:
                    _wrap_torch_onnx_export(module)
            else:
                install_onnx_hooks()

        spec.loader.exec_module = exec_then_install  # type: ignore[method-assign]
        return spec


def install_if_exporting(api: str) -> Callable[[str, Sequence[tuple[str, Any]]], None] | None:
    """Make sure the hooks are in place when a scan or loop is traced by ``torch.onnx.export``
    (torch.onnx may have loaded its exporter in a way the import hook did not see), and return
    the check of the element types of its leaves, in the words of ``api``, where the target
    opset is known (the export was called through the wrapper or :func:`export`); None
    elsewhere. Where the hooks are not installed for every export, an export through torch's
    own ``torch.onnx.export`` gets none, and the traced operator refuses the loop
    (``_traced._step_errors.refuse_without_onnx_hooks``)."""
    torch_onnx = sys.modules.get(_TORCH_ONNX)
    if torch_onnx is None or not torch_onnx.is_in_onnx_export():
        return None
    export = _context.onnx_export()
    opset = export.target_opset if export is not None else None
    if opset is None and not _installed:
        return None
    install_onnx_hooks()
    if opset is None:
        return None
    from torchscan.onnx._export import _element_types

    return functools.partial(_element_types.check_leaf_types, api, opset)


def install_onnx_hooks() -> ModuleType:
    """Install torchscan's hooks in torch.onnx; return the module that holds them."""
    from torchscan.onnx._export import _hooks

    _hooks.install()
    return _hooks


def _uninstall_onnx_hooks() -> None:
    hooks = sys.modules.get("torchscan.onnx._export._hooks")
    if hooks is not None:
        hooks.uninstall()


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
