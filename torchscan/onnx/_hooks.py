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
  ``_onnx_program``): torchscan checks every Scan and Loop against the rules of the opset asked
  for, moves loop-invariant work out of their bodies before the optimizer runs, and converts
  models below opset 18 itself, Scan and Loop bodies included, where torch.onnx would keep
  opset 18, and warns where the converted model holds an operator version that onnxruntime has
  no kernel for (:func:`warn_onnxruntime_gaps`). A pass over the finished ``ONNXProgram.model``
  would come after the optimizer, and after torch.onnx has written the file the user asked for.

:func:`install` replaces these attributes and adds two log filters (``_drop_stale_warning``,
``_drop_signature_warning``); :func:`uninstall` puts back what it replaced, where it is still
torchscan's hook in place. A hook that something else has wrapped since stays in that wrapper and
passes every call through once it is no longer the installation in force.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import warnings
from collections.abc import Sequence
from typing import Any

import onnx_ir as ir

from torchscan._errors import ExportError
from torchscan.onnx import _empty_loops, _hoist, _ir, _opsets, _options

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
        (_compat.ONNX_OPSET_WARNING[0], _drop_stale_warning),
        (_compat.ONNX_SIGNATURE_WARNING[0], _drop_signature_warning),
    ]


def translations() -> dict[Any, Any]:
    """torchscan's operators and their ONNX translations, as ``custom_translation_table`` takes
    them."""
    from torchscan import _traced
    from torchscan.onnx import _translate

    return {
        _traced.torchscan_scan: _translate.scan_to_onnx,
        _traced.torchscan_loop: _translate.loop_to_onnx,
    }


def installed() -> bool:
    """Whether the hooks are in place in torch.onnx's exporter."""
    return _installation is not None


def install() -> None:
    """Install the fallback lookup of translations, the refusal of a loop-body node without a
    translation, the conversion hook and the two log filters in torch.onnx's exporter; a second
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


def _drop_stale_warning(record: logging.LogRecord) -> bool:
    """torch.onnx warns that a model asked below opset 18 may stay at opset 18; with torchscan
    it is converted, or the export fails."""
    from torchscan import _compat

    return not str(record.msg).startswith(_compat.ONNX_OPSET_WARNING[1])


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
    from torchscan._traced._step_errors import ONNX_HOOKS_ACTIVE

    setattr(lookup, ONNX_HOOKS_ACTIVE, lambda: _active(installation))
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
    """torch.onnx's onnxscript entry points, with ``convert_version`` and ``optimize`` replaced.

    torch.onnx converts a model to the opset asked for, then optimizes it. Below opset 18 that
    order fails twice: torch's own translation uses operators that old opsets lack (``chunk`` is
    a ``SplitToSequence`` until the optimizer folds it into a ``Split``), and onnxscript's
    optimizer, run on an old-opset model, writes opset-18 nodes into it. So a model asked below
    18 is optimized at opset 18 first, then converted, and not optimized again.
    """

    _CONVERTED = "torchscan.converted_down"

    def __init__(self, apis: Any, installation: _Installation) -> None:
        self._apis = apis
        self._installation = installation

    def __getattr__(self, name: str) -> Any:
        return getattr(self._apis, name)

    def convert_version(self, model: ir.Model, target_version: int) -> ir.Model:
        if not _active(self._installation):
            return self._apis.convert_version(model, target_version)
        converted = self._convert_version(model, target_version)
        warn_onnxruntime_gaps(converted)
        return converted

    def _convert_version(self, model: ir.Model, target_version: int) -> ir.Model:
        check_loop_types(model.graph, target_version)
        ir.passes.common.InlinePass()(model)
        _empty_loops.shape_empty_loop_outputs(model)
        if _options.current().hoist_loop_invariants:
            _hoist.hoist_loop_invariants(model, opset=target_version)
        if target_version >= _opsets.TORCH_BUILD_OPSET:
            return self._apis.convert_version(model, target_version)
        from torchscan.onnx import _convert

        # The optimizer changes the model it is given: the model as built is kept for a retry.
        built = model.clone()
        try:
            converted = _convert.convert_model(
                self._optimized(model), target_version, in_place=True
            )
        except _convert.OpsetConversionError as refused:
            # The optimizer may choose operators the target lacks; the model as built may not.
            # Where both fail, the optimized model's refusal names the real blocker: the model as
            # built still holds what the optimizer folds away (a SplitToSequence that is a Split,
            # a bound computed from constants).
            try:
                converted = _convert.convert_model(built, target_version, in_place=True)
            except _convert.OpsetConversionError:
                raise refused from None
        converted.meta[self._CONVERTED] = True
        return converted

    def optimize(self, model: ir.Model) -> ir.Model:
        if not _active(self._installation):
            return self._apis.optimize(model)
        if model.meta.get(self._CONVERTED):
            return model
        return self._optimized(model)

    def _optimized(self, model: ir.Model) -> ir.Model:
        """onnxscript's optimizer, then the scanned inputs it left unread dropped."""
        optimized = self._apis.optimize(model)
        _hoist.drop_unread_sequences(optimized.graph)
        return optimized


ONNXRUNTIME_MISSING_KERNELS = {
    "RandomNormal": 22,
    "RandomNormalLike": 22,
    "RandomUniform": 22,
    "RandomUniformLike": 22,
    "Bernoulli": 22,
    "Multinomial": 22,
}
"""Operators of the default domain that onnxruntime 1.32's CPU provider has no kernel for from
the version given on (its status NOT_IMPLEMENTED, "Could not find an implementation for
RandomNormalLike(22) node"), though it runs the versions before (Bernoulli-22 through its
function, a RandomUniformLike-22)."""
ONNXRUNTIME_CHECKED = "1.32"


def warn_onnxruntime_gaps(model: ir.Model) -> None:
    """Warn (:class:`~torchscan.TorchscanWarning`) where ``model`` holds, at any depth, a node
    of an operator version that onnxruntime has no kernel for
    (:data:`ONNXRUNTIME_MISSING_KERNELS`), naming the versions, the nodes and the opset to
    export at instead."""
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx"))
    if opset is None:
        return
    found: dict[str, list[str]] = {}
    for graph in [model.graph, *model.functions.values()]:
        for node in ir.traversal.RecursiveGraphIterator(graph):
            since = ONNXRUNTIME_MISSING_KERNELS.get(node.op_type)
            if since is not None and _ir.is_default_domain(node.domain) and opset >= since:
                name = repr(node.name) if node.name else "without a name"
                found.setdefault(node.op_type, []).append(name)
    if not found:
        return
    import onnx.defs

    from torchscan._errors import TorchscanWarning

    held = [
        f"{op}-{onnx.defs.get_schema(op, opset, '').since_version} "
        f"(node{'s' if len(names) > 1 else ''} {', '.join(names)})"
        for op, names in found.items()
    ]
    below = min(ONNXRUNTIME_MISSING_KERNELS[op] for op in found) - 1
    warnings.warn(
        f"torchscan: the model holds {_listing(held)} at opset {opset}, and onnxruntime "
        f"{ONNXRUNTIME_CHECKED} has no kernel for {'them' if len(held) > 1 else 'it'}: it "
        f"refuses to run the model (NOT_IMPLEMENTED). To run it in onnxruntime "
        f"{ONNXRUNTIME_CHECKED}, export with opset_version={below} or lower.",
        TorchscanWarning,
        stacklevel=_stacklevel_outside_the_export(),
    )


def _listing(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _stacklevel_outside_the_export() -> int:
    """The ``stacklevel`` of the first frame of the caller's that is not torch's, onnxscript's,
    onnx_ir's or torchscan's: where the user called the export, for the warning to name."""
    level, frame = 2, sys._getframe(2)  # the caller of this function's caller
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.partition(".")[0] not in ("torch", "torchscan", "onnxscript", "onnx_ir"):
            return level
        level, frame = level + 1, frame.f_back
    return 2


def check_leaf_types(
    api: str, opset: int | None, op: str, leaves: Sequence[tuple[str, Any]]
) -> None:
    """Refuse the first of ``leaves`` (``(name, tensor)``, named by their pytree paths) whose
    element type the ``op`` (``"Scan"`` or ``"Loop"``) in force at ``opset`` (None: torch.onnx's
    default) does not allow, in the words of ``api``: called while the loop is traced, where the
    user's names are known."""
    from onnx_ir.tensor_adapters import from_torch_dtype

    opset = _opsets.TORCH_BUILD_OPSET if opset is None else opset
    if not _opsets.MIN_OPSET <= opset <= _opsets.MAX_OPSET:
        return  # torch.onnx or the conversion refuses the opset itself
    versions, version = _versions(op, opset)
    for name, tensor in leaves:
        dtype = from_torch_dtype(tensor.dtype)
        if dtype in version.element_types:
            continue
        allowed, remedy = _remedy(versions, dtype, opset, f"cast {name}")
        raise ExportError(
            f"{api}: {name} has dtype {tensor.dtype}, which ONNX {op}-{version.since} (the "
            f"version in force at opset {opset}) does not allow; {allowed}. To export it, "
            f"{remedy}."
        )


def _versions(op: str, opset: int) -> tuple[tuple[_opsets.OpVersion, ...], _opsets.OpVersion]:
    if op == "Scan":
        return _opsets.SCAN_VERSIONS, _opsets.scan_version(opset)
    return _opsets.LOOP_VERSIONS, _opsets.loop_version(opset)


def _remedy(
    versions: tuple[_opsets.OpVersion, ...], dtype: ir.DataType, opset: int, cast: str
) -> tuple[str, str]:
    """What allows ``dtype`` and what the user can do: a newer opset where there is one, a
    cast (``cast``, for instance ``cast carry['h']``) to a type ``opset`` allows."""
    first = _opsets.first_opset_allowing(versions, dtype)
    if first is None:
        return (
            f"no version of {versions[0].op} allows it",
            f"{cast} to a type that opset {opset} allows",
        )
    return (
        f"the first opset that allows it is {first}",
        f"export with opset_version={first} or newer, or {cast} to a type that opset {opset} "
        "allows",
    )


def check_loop_types(graph: ir.Graph, opset: int) -> None:
    """Refuse a Scan or Loop, at any depth, whose tensors have an element type that its version
    at ``opset`` does not allow, naming the first opset that does."""
    for node in ir.traversal.RecursiveGraphIterator(graph):
        if not _ir.is_default_domain(node.domain) or node.op_type not in ("Scan", "Loop"):
            continue
        versions, version = _versions(node.op_type, opset)
        for role, value in _roles(node):
            if value.type is None or value.dtype in version.element_types:
                continue
            allowed, remedy = _remedy(versions, value.dtype, opset, "cast it")
            raise ExportError(
                f"torchscan: the {node.op_type} node {node.name!r} has {role}, tensor "
                f"{value.name!r}, of element type {value.dtype.name.lower()}, which "
                f"{node.op_type}-{version.since} (the version in force at opset {opset}) does not "
                f"allow; {allowed}. To export it, {remedy}."
            )


def _roles(node: ir.Node) -> list[tuple[str, ir.Value]]:
    """Every input and output of a Scan or Loop, with what it is to the loop."""
    inputs = [v for v in node.inputs if v is not None]
    if node.op_type == "Scan":
        n_carried = len(inputs) - node.attributes["num_scan_inputs"].as_int()
        named = [
            *((f"initial carried value {i}", v) for i, v in enumerate(inputs[:n_carried])),
            *((f"scanned sequence {i}", v) for i, v in enumerate(inputs[n_carried:])),
        ]
    else:
        n_carried = len(node.inputs) - 2
        named = [(f"initial carried value {i}", v) for i, v in enumerate(node.inputs[2:])]
    return [
        *named,
        *((f"final carried value {i}", v) for i, v in enumerate(node.outputs[:n_carried])),
        *((f"stacked output {i}", v) for i, v in enumerate(node.outputs[n_carried:])),
    ]
