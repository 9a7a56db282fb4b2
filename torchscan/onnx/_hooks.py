"""How torchscan plugs into ``torch.onnx.export(..., dynamo=True)``, with no argument from the user.

Two private extension points of torch.onnx are used (imported from ``torchscan._compat``, and
held by tests there and in ``tests/onnx/test_hooks.py``):

* the lookup of translations, ``ONNXRegistry.get_decomps``: torchscan answers it for its own
  operators, also in registries that torch.onnx built before the hooks were installed (the
  export call builds its registry before it traces the model);
* the version conversion and the optimization it runs once the model is built
  (``onnxscript_apis.convert_version`` and ``optimize``, read by ``_core`` and
  ``_onnx_program``): torchscan checks every Scan and Loop against the rules of the opset asked
  for, moves loop-invariant work out of their bodies, and converts models below opset 18
  itself, Scan and Loop bodies included, where torch.onnx would keep opset 18.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import onnx_ir as ir

from torchscan._errors import ExportError
from torchscan.onnx import _hoist, _opsets, _options

_installed = False


def install() -> None:
    """Register the translations and the conversion hook in torch.onnx (once per process)."""
    global _installed
    if _installed:
        return
    from torchscan import _compat, _hops
    from torchscan.onnx import _translate

    translations = {
        _hops.torchscan_scan: _translate.scan_to_onnx,
        _hops.torchscan_loop: _translate.loop_to_onnx,
    }
    registration, core = _compat.onnx_registration(), _compat.onnx_core()
    registration.ONNXRegistry.get_decomps = _with_translations(
        registration.ONNXRegistry.get_decomps, translations, registration.OnnxDecompMeta
    )
    core.onnxscript_apis = _compat.onnx_program().onnxscript_apis = _ConvertingAPIs(
        core.onnxscript_apis
    )
    logging.getLogger(_compat.ONNX_OPSET_WARNING[0]).addFilter(_drop_stale_warning)
    _installed = True


def _drop_stale_warning(record: logging.LogRecord) -> bool:
    """torch.onnx warns that a model asked below opset 18 may stay at opset 18; with torchscan
    it is converted, or the export fails."""
    from torchscan import _compat

    return not str(record.msg).startswith(_compat.ONNX_OPSET_WARNING[1])


def _with_translations(get_decomps: Any, translations: dict, meta: type) -> Any:
    """``ONNXRegistry.get_decomps`` that knows ``translations`` (operator -> function)."""
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
        for op, function in translations.items()
    }

    @functools.wraps(get_decomps)
    def lookup(registry: Any, target: Any) -> Any:
        for op, found in metas.items():
            if target is op:
                return found
        return get_decomps(registry, target)

    return lookup


class _ConvertingAPIs:
    """torch.onnx's onnxscript entry points, with ``convert_version`` and ``optimize`` replaced.

    torch.onnx converts a model to the opset asked for, then optimizes it. Below opset 18 that
    order fails twice: torch's own translation uses operators that old opsets lack (``chunk`` is
    a ``SplitToSequence`` until the optimizer folds it into a ``Split``), and onnxscript's
    optimizer, run on an old-opset model, writes opset-18 nodes into it. So a model asked below
    18 is optimized at opset 18 first, then converted, and not optimized again.
    """

    _CONVERTED = "torchscan.converted_down"

    def __init__(self, apis: Any) -> None:
        self._apis = apis

    def __getattr__(self, name: str) -> Any:
        return getattr(self._apis, name)

    def convert_version(self, model: ir.Model, target_version: int) -> ir.Model:
        check_loop_types(model.graph, target_version)
        ir.passes.common.InlinePass()(model)
        if _options.current().hoist_loop_invariants:
            _hoist.hoist_loop_invariants(model, opset=target_version)
        if target_version >= _opsets.TORCH_BUILD_OPSET:
            return self._apis.convert_version(model, target_version)
        from torchscan.onnx import _convert

        # The optimizer changes the model it is given: the model as built is kept for a retry.
        built = model.clone()
        try:
            converted = _convert.convert_model(
                self._apis.optimize(model), target_version, in_place=True
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
        if model.meta.get(self._CONVERTED):
            return model
        return self._apis.optimize(model)


def check_loop_types(graph: ir.Graph, opset: int) -> None:
    """Refuse a Scan or Loop, at any depth, whose tensors have an element type that its version
    at ``opset`` does not allow, naming the first opset that does."""
    for node in ir.traversal.RecursiveGraphIterator(graph):
        if node.domain not in ("", "ai.onnx") or node.op_type not in ("Scan", "Loop"):
            continue
        is_scan = node.op_type == "Scan"
        versions = _opsets.SCAN_VERSIONS if is_scan else _opsets.LOOP_VERSIONS
        version = (_opsets.scan_version if is_scan else _opsets.loop_version)(opset)
        for role, value in _roles(node):
            if value.type is None or value.dtype in version.element_types:
                continue
            first = _opsets.first_opset_allowing(versions, value.dtype)
            if first:
                allowed = f"the first opset that allows it is {first}"
                remedy = (
                    f"export with opset_version={first} or newer, or cast it to a type that "
                    f"opset {opset} allows"
                )
            else:
                allowed = f"no version of {node.op_type} allows it"
                remedy = f"cast it to a type that opset {opset} allows"
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
