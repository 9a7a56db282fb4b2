"""How torchscan plugs into ``torch.onnx.export(..., dynamo=True)``, with no argument from the user.

An export through ``torch.onnx.export`` as torchscan wraps it passes torchscan's translations in
torch.onnx's public ``custom_translation_table`` (:func:`translations`, merged with the user's
own table, whose entries win). Three private extension points of torch.onnx are used besides
(imported from ``torchscan._compat``, and held by tests there and in
``tests/onnx/test_hooks.py``):

* the lookup of translations, ``ONNXRegistry.get_decomps``, answers for torchscan's operators
  where the registry has no translation of them: an export through a reference to
  ``torch.onnx.export`` kept from before ``import torchscan``, which the wrapper never sees;
* the choice of a translation for a node, ``_dispatching.dispatch``: a node of a loop body
  that has none is refused in torchscan's words, naming the step function and its line;
* the version conversion and the optimization torch.onnx runs inside the export, once the model is
  built (``onnxscript_apis.convert_version`` and ``optimize``, read by ``_core`` and
  ``_onnx_program``): they become :func:`torchscan.onnx._export._passes.convert_version` and
  :func:`torchscan.onnx._export._passes.optimize`, which run torchscan's passes on a model
  with loops and pass any other model to torch.onnx's own functions. A pass over the finished
  ``ONNXProgram.model`` would come after the optimizer, and after torch.onnx has written the
  file the user asked for.

:func:`install` replaces these attributes and adds a log filter (``_drop_signature_warning``);
:func:`uninstall` puts back what it replaced, where it is still
torchscan's hook in place. A hook that something else has wrapped since stays in that wrapper and
passes every call through once it is no longer the installation in force.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

import onnx_ir as ir

from torchscan.onnx._export import _passes

_lock = threading.RLock()
"""Held while the hooks are put in or taken out; nothing is imported while it is held."""

_installation: _Installation | None = None
"""The hooks in place in torch.onnx, or None: a hook that finds another installation here (or
none) passes its call through to what it replaced."""


class _Installation:
    """What one installation of the hooks replaced: ``(owner, attribute, torch's value,
    torchscan's value)`` for each attribute of torch.onnx's exporter, and the log filters."""

    def __init__(self) -> None:
        self.replaced: list[tuple[Any, str, Any, Any]] = []

    def replace(self, owner: Any, name: str, ours: Any) -> None:
        self.replaced.append((owner, name, getattr(owner, name), ours))
        setattr(owner, name, ours)

    def undo(self) -> None:
        for owner, name, original, ours in reversed(self.replaced):
            # Where something else has replaced torchscan's hook since, the hook stays in its
            # chain and passes every call through (it is no longer the installation in place).
            if getattr(owner, name) is ours:
                setattr(owner, name, original)
        for logger, log_filter in _log_filters():
            logging.getLogger(logger).removeFilter(log_filter)


def _active(installation: _Installation) -> bool:
    return _installation is installation


def _log_filters() -> list[tuple[str, Any]]:
    from torchscan import _compat

    return [
        (_compat.ONNX_SIGNATURE_WARNING[0], _drop_signature_warning),
    ]


def translations() -> dict[Any, Any]:
    """torchscan's operators and their ONNX translations, as ``custom_translation_table`` takes
    them."""
    from torchscan import _traced
    from torchscan.onnx._export import _translate

    return {
        _traced.torchscan_scan: _translate.scan_to_onnx,
        _traced.torchscan_loop: _translate.loop_to_onnx,
    }


def installed() -> bool:
    """Whether the hooks are in place in torch.onnx's exporter."""
    return _installation is not None


def install() -> None:
    """Install the fallback lookup of translations, the refusal of a loop-body node without a
    translation, the conversion hook and the log filter in torch.onnx's exporter; a second
    call changes nothing. Imports torch.onnx's exporter."""
    global _installation
    if _installation is not None:
        return
    from torchscan import _compat

    # Imported before the lock is taken: importing torch.onnx's exporter may run torchscan's
    # import hook (``torchscan._torch_onnx_hook``), which installs the hooks in this thread.
    registration, core, program, dispatching = (
        _compat.onnx_registration(),
        _compat.onnx_core(),
        _compat.onnx_program(),
        _compat.onnx_dispatching(),
    )
    table = translations()
    with _lock:
        if _installation is not None:
            return  # installed meanwhile: a second install would wrap the hooks in themselves
        installation = _Installation()
        installation.replace(
            registration.ONNXRegistry,
            "get_decomps",
            _with_translations(
                registration.ONNXRegistry.get_decomps,
                table,
                registration.OnnxDecompMeta,
                installation,
            ),
        )
        apis = _ConvertingAPIs(core.onnxscript_apis, installation)
        installation.replace(core, "onnxscript_apis", apis)
        installation.replace(program, "onnxscript_apis", apis)
        installation.replace(
            dispatching, "dispatch", _naming_the_step(dispatching.dispatch, installation)
        )
        for logger, log_filter in _log_filters():
            logging.getLogger(logger).addFilter(log_filter)
        _installation = installation


def uninstall() -> None:
    """Put back what :func:`install` replaced in torch.onnx's exporter and remove the log
    filters; nothing where the hooks are not installed."""
    global _installation
    with _lock:
        if _installation is None:
            return
        installation, _installation = _installation, None
        installation.undo()


def _drop_signature_warning(record: logging.LogRecord) -> bool:
    """torch.onnx warns that a translation in ``custom_translation_table`` whose ONNX signature it
    cannot infer gets every node of its operator: what torchscan's translations are for."""
    from torchscan import _compat

    ours = set(translations().values())
    args = record.args if isinstance(record.args, tuple) else ()
    return not (
        str(record.msg).startswith(_compat.ONNX_SIGNATURE_WARNING[1]) and args and args[0] in ours
    )


def _with_translations(
    get_decomps: Any, table: dict, meta: type, installation: _Installation
) -> Any:
    """``ONNXRegistry.get_decomps`` that falls back on ``table`` (operator -> translation) for an
    operator the registry has no custom translation of."""
    metas = {
        op: [
            meta(
                onnx_function=function,
                fx_target=op,
                signature=None,
                is_custom=True,
                skip_signature_inference=True,
            )
        ]
        for op, function in table.items()
    }

    @functools.wraps(get_decomps)
    def lookup(registry: Any, target: Any) -> Any:
        found = get_decomps(registry, target)
        if not _active(installation) or any(meta.is_custom for meta in found):
            return found  # custom_translation_table's, or the hooks were uninstalled
        return next((ours for op, ours in metas.items() if target is op), found)

    # what torchscan's traced operators read to refuse a loop where the hooks are not in place
    from torchscan import _context

    _context.set_onnx_hooks_probe(lambda: _active(installation))
    return lookup


def _naming_the_step(dispatch: Any, installation: _Installation) -> Any:
    """torch.onnx's choice of a translation for a node (``_dispatching.dispatch``), which
    refuses a node of a loop body that has none in torchscan's words, naming the step function,
    its line and the operator the user called."""

    @functools.wraps(dispatch)
    def dispatch_or_refuse(node: Any, registry: Any) -> Any:
        function, message = dispatch(node, registry)
        if function is None and _active(installation):
            from torchscan._traced import _step_errors

            refusal = _step_errors.untranslatable(node)
            if refusal is not None:
                raise refusal
        return function, message

    return dispatch_or_refuse


class _ConvertingAPIs:
    """torch.onnx's onnxscript entry points, with ``convert_version`` and ``optimize`` replaced by
    torchscan's passes (:mod:`torchscan.onnx._export._passes`) while this installation is in
    force."""

    def __init__(self, apis: Any, installation: _Installation) -> None:
        self._apis = apis
        self._installation = installation

    def __getattr__(self, name: str) -> Any:
        return getattr(self._apis, name)

    def convert_version(self, model: ir.Model, target_version: int) -> ir.Model:
        if not _active(self._installation):
            return self._apis.convert_version(model, target_version)
        return _passes.convert_version(
            model,
            target_version,
            convert=self._apis.convert_version,
            optimize=self._apis.optimize,
        )

    def optimize(self, model: ir.Model) -> ir.Model:
        if not _active(self._installation):
            return self._apis.optimize(model)
        return _passes.optimize(model, optimize=self._apis.optimize)
