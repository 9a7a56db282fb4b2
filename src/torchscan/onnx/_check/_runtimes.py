"""The runtimes ``check`` runs a model in: onnxruntime's CPU provider, at its default graph
optimization level and with the optimizations off (:mod:`torchscan.onnx._check._ort`); onnx's
reference evaluator with a ``Loop``, a ``Scan``, a ``ReduceLogSumExp``, a ``GatherElements`` and a
``Pad`` that follow the specification (:func:`reference_ops`); the model imported into PyTorch by
``torchscan.onnx.to_torch`` (``"imported"``); and the user's eager PyTorch module. A runtime that
does not run a model raises :class:`_Unsupported`, which is not a failure. onnxruntime runs in this
process, except where a crash is plausible: on inputs with an empty dimension (onnxruntime 1.32
ends the process with SIGFPE on some zero-length scans) and on models the lint found fault with.
There it runs in a child process, whose death is reported as an error. Under a time limit
(:mod:`torchscan.onnx._check._limit`), onnxruntime is stopped through ``RunOptions.terminate``,
and its child process is killed.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from torchscan._errors import reduce_error
from torchscan.onnx._check import _ort
from torchscan.onnx._check._inputs import _as_value, _numpy_to_torch
from torchscan.onnx._check._limit import Limit
from torchscan.onnx._check._ort import run_onnxruntime
from torchscan.onnx._check._reference_ops import (
    gather_elements,
    log_sum_exp,
    pad,
    scatter,
    spec_loop,
    spec_scan,
)
from torchscan.onnx._lint._load import LoadedModel

RUNTIMES = ("onnxruntime", "reference", "imported")
"""The ONNX runtimes ``check`` can run: onnxruntime's CPU provider,
``onnx.reference.ReferenceEvaluator``, and the model imported by ``torchscan.onnx.to_torch``
run in eager PyTorch (``"imported"``: it reads the ONNX model, as the others do, and is no
PyTorch baseline; that is the user's module, ``"pytorch"``)."""


class _Unsupported(Exception):
    """A runtime does not run this model; not a fault of the model."""


def _pytorch_outputs(module: Callable[..., Any], args: Sequence[Any]) -> list[Any]:
    import torch

    from torchscan import _pytree

    with torch.no_grad():
        out = module(*args)
    return [_as_value(leaf) for leaf in _pytree.tree_leaves(out) if leaf is not None]


# onnx.reference ---------------------------------------------------------------------------------


def _run_reference(
    model: LoadedModel, feeds: dict[str, Any], _isolate: bool, _limit: Limit | None = None
) -> list[Any]:
    """The model's outputs in onnx's reference evaluator, which takes the model as loaded."""
    import onnx.reference

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        evaluator = onnx.reference.ReferenceEvaluator(model.proto, new_ops=reference_ops())
        return list(evaluator.run(None, feeds))


def reference_ops() -> list[type]:
    """The operators ``check`` gives onnx's reference evaluator in place of its own, which depart
    from the specification in onnx 1.23: ``Loop``, ``Scan`` (every axis, direction and version,
    Scan-8 included), ``ReduceLogSumExp``, ``GatherElements`` and ``Pad`` (negative pads), and
    ``Scatter``, which it lacks (:mod:`torchscan.onnx._check._reference_ops`). Bodies get them
    too."""
    return [spec_loop(), spec_scan(), log_sum_exp(), gather_elements(), pad(), scatter()]


# torchscan.onnx.to_torch ------------------------------------------------------------------------


def _run_imported(
    model: LoadedModel, feeds: dict[str, Any], _isolate: bool, _limit: Limit | None = None
) -> list[Any]:
    """The model's outputs computed by the module ``torchscan.onnx.to_torch`` makes of it, on
    the CPU without autograd. What to_torch or torch does not implement (an operator, a version,
    an element type) is :class:`_Unsupported`; any other error is the model's."""
    import torch

    from torchscan._errors import OnnxImportError
    from torchscan.onnx._import._graph import compile_model

    try:
        # (linted and read into onnx_ir by the check already)
        module = compile_model(model.proto, lint=False, read=model.model)
        args = [_as_torch(name, feeds[name]) for name in module.input_names]
        with torch.no_grad():
            out = module(*args)
    except OnnxImportError as error:
        reason = str(error).removeprefix("torchscan.onnx.to_torch: ")
        if error.not_implemented:
            raise _Unsupported(reason) from None
        raise OnnxImportError(reason) from None
    outputs = list(out) if len(module.output_names) > 1 else [out]
    return [_as_value(value) for value in outputs]


def _as_torch(name: str, value: Any) -> Any:
    """A feed as the module takes it: a tensor (a copy), a list of them for a sequence, None
    for an empty optional."""
    import torch

    converted = _numpy_to_torch(value)
    for leaf in converted if isinstance(converted, list) else [converted]:
        if leaf is not None and not isinstance(leaf, torch.Tensor):
            raise _Unsupported(f"input '{name}': torch has no element type {leaf.dtype}")
    return converted


# onnxruntime ------------------------------------------------------------------------------------


_NO_ORT_KERNELS = ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2")
"""Element types onnxruntime 1.32 has no CPU kernels for."""


def _onnxruntime_at(level: str) -> Callable[..., list[Any]]:
    """The runner of onnxruntime at one of its optimization levels (:data:`_ort.LEVELS`)."""

    def run(
        model: LoadedModel, feeds: dict[str, Any], isolate: bool, limit: Limit | None = None
    ) -> list[Any]:
        why = _onnxruntime_cannot_run(model.model)
        if why:
            raise _Unsupported(why)
        data = model.data
        if isolate:
            return _in_child_process(data, feeds, level, limit)
        return run_onnxruntime(data, feeds, level, limit)

    return run


def _onnxruntime_cannot_run(model: ir.Model) -> str | None:
    """Why onnxruntime cannot run ``model`` (an element type it has no kernels for), or None."""
    types = _element_types(model.graph)
    found = sorted(name for name in _NO_ORT_KERNELS if ir.DataType[name] in types)
    if found:
        return f"onnxruntime has no CPU kernels for {', '.join(t.lower() for t in found)}"
    return None


def _element_types(graph: ir.Graph) -> set[int]:
    """Every tensor element type a graph names (by number), its bodies included: of its
    initializers, of the values whose types it declares, of its tensor attributes and of the
    ``to`` of its casts."""
    types: set[int] = {
        value.const_value.dtype
        for value in graph.initializers.values()
        if value.const_value is not None
    }
    declared = [value for node in graph for value in node.outputs]
    for value in (*graph.inputs, *graph.outputs, *graph.initializers.values(), *declared):
        types |= _elem_types_of(value.type)
    for node in graph:
        for attr in node.attributes.values():
            if attr.is_ref():
                continue
            if attr.type == ir.AttributeType.TENSOR:
                types.add(attr.as_tensor().dtype)
            elif attr.type == ir.AttributeType.INT and attr.name == "to":
                types.add(attr.as_int())
            elif attr.type == ir.AttributeType.GRAPH:
                types |= _element_types(attr.as_graph())
            elif attr.type == ir.AttributeType.GRAPHS:
                for body in attr.as_graphs():
                    types |= _element_types(body)
    return types


def _elem_types_of(type_: ir.TypeProtocol | None) -> set[int]:
    if isinstance(type_, ir.TensorType):
        return {type_.dtype}
    if isinstance(type_, (ir.SequenceType, ir.OptionalType)):
        return _elem_types_of(type_.elem_type)
    return set()


class _ChildError(RuntimeError):
    """What onnxruntime raised in the child process, with its type's name."""

    __reduce__ = reduce_error

    def __init__(self, child_type: str, message: str) -> None:
        super().__init__(message)
        self.child_type = child_type


def _in_child_process(
    data: bytes, feeds: dict[str, Any], level: str, limit: Limit | None
) -> list[Any]:
    """``run_onnxruntime`` in a child process, so that a crash of onnxruntime ends only it; under
    a ``limit``, the process is killed when it is to stop, and the limit counts from when the
    child is ready to run the model (its start-up is not the model's run)."""
    import signal

    with tempfile.TemporaryDirectory(prefix="torchscan-check-") as folder:
        with open(os.path.join(folder, "in.pkl"), "wb") as f:
            pickle.dump((data, feeds, level), f)
        if limit is not None:
            limit.starting()
        with subprocess.Popen(
            [sys.executable, str(Path(_ort.__file__)), folder],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as child:
            if limit is not None:
                limit.on_stop(child.kill)
            assert child.stdout is not None
            if child.stdout.readline().strip() == "ready" and limit is not None:
                limit.begin()
            _, stderr = child.communicate()
        if child.returncode < 0:
            name = signal.Signals(-child.returncode).name
            raise RuntimeError(f"onnxruntime ended its process with {name}")
        out = os.path.join(folder, "out.pkl")
        if not os.path.exists(out):
            last = (stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"onnxruntime's process failed: {last}")
        with open(out, "rb") as f:
            result = pickle.load(f)
    if result[0] == "ok":
        return result[1]
    raise _ChildError(result[1], result[2])


_RUNNERS: dict[str, Callable[[LoadedModel, dict[str, Any], bool, Limit | None], list[Any]]] = {
    "onnxruntime": _onnxruntime_at("default"),
    "onnxruntime-unoptimized": _onnxruntime_at("unoptimized"),
    "reference": _run_reference,
    "imported": _run_imported,
}
"""Every source of outputs a runtime gives, by its name in reports."""

SOURCES = {
    "onnxruntime": ("onnxruntime", "onnxruntime-unoptimized"),
    "reference": ("reference",),
    "imported": ("imported",),
}
"""The sources each of :data:`RUNTIMES` gives: onnxruntime runs the model at its default graph
optimization level, as users run it, and with the optimizations off; the two are one runtime
when counting how many independent runtimes ran the model."""
