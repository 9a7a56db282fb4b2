"""The runtimes ``check`` runs a model in: onnxruntime's CPU provider, at its default graph
optimization level and with the optimizations off (:mod:`torchscan.onnx._check._ort`); onnx's
reference evaluator with a ``Loop``, a ``Scan``, a ``ReduceLogSumExp`` and a ``GatherElements``
that follow the specification (:func:`reference_ops`); and eager PyTorch. A runtime that does
not run a model raises :class:`_Unsupported`, which is not a failure. onnxruntime runs in this
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
import onnx

from torchscan.onnx._check import _ort
from torchscan.onnx._check._inputs import _as_value
from torchscan.onnx._check._limit import Limit
from torchscan.onnx._check._ort import run_onnxruntime
from torchscan.onnx._check._reference_ops import (
    gather_elements,
    log_sum_exp,
    scatter,
    spec_loop,
    spec_scan,
)

RUNTIMES = ("onnxruntime", "reference")
"""The ONNX runtimes ``check`` can run: onnxruntime's CPU provider, and
``onnx.reference.ReferenceEvaluator``."""


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
    model: onnx.ModelProto, feeds: dict[str, Any], _isolate: bool, _limit: Limit | None = None
) -> list[Any]:
    import onnx.reference

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        evaluator = onnx.reference.ReferenceEvaluator(model, new_ops=reference_ops())
        return list(evaluator.run(None, feeds))


def reference_ops() -> list[type]:
    """The operators ``check`` gives onnx's reference evaluator in place of its own, which depart
    from the specification in onnx 1.23: ``Loop``, ``Scan`` (every axis, direction and version,
    Scan-8 included), ``ReduceLogSumExp`` and ``GatherElements``, and ``Scatter``, which it
    lacks (:mod:`torchscan.onnx._check._reference_ops`). Bodies get them too."""
    return [spec_loop(), spec_scan(), log_sum_exp(), gather_elements(), scatter()]


# onnxruntime ------------------------------------------------------------------------------------


_NO_ORT_KERNELS = ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2")
"""Element types onnxruntime 1.32 has no CPU kernels for."""


def _onnxruntime_at(level: str) -> Callable[..., list[Any]]:
    """The runner of onnxruntime at one of its optimization levels (:data:`_ort.LEVELS`)."""

    def run(
        model: onnx.ModelProto, feeds: dict[str, Any], isolate: bool, limit: Limit | None = None
    ) -> list[Any]:
        why = _onnxruntime_cannot_run(model)
        if why:
            raise _Unsupported(why)
        data = model.SerializeToString()
        if isolate:
            return _in_child_process(data, feeds, level, limit)
        return run_onnxruntime(data, feeds, level, limit)

    return run


def _onnxruntime_cannot_run(model: onnx.ModelProto) -> str | None:
    missing = {
        getattr(onnx.TensorProto, n) for n in _NO_ORT_KERNELS if hasattr(onnx.TensorProto, n)
    }
    found = sorted(
        {onnx.TensorProto.DataType.Name(t) for t in _element_types(model.graph)}
        & {onnx.TensorProto.DataType.Name(t) for t in missing}
    )
    if found:
        return f"onnxruntime has no CPU kernels for {', '.join(t.lower() for t in found)}"
    return None


def _element_types(graph: onnx.GraphProto) -> set[int]:
    """Every tensor element type a graph names, its bodies included."""
    types = {t.data_type for t in graph.initializer}
    for info in (*graph.input, *graph.output, *graph.value_info):
        types |= _elem_types_of(info.type)
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                types.add(attr.t.data_type)
            if attr.HasField("i") and attr.name == "to":
                types.add(attr.i)
            for body in [attr.g] if attr.HasField("g") else attr.graphs:
                types |= _element_types(body)
    return types


def _elem_types_of(type_proto: onnx.TypeProto) -> set[int]:
    kind = type_proto.WhichOneof("value")
    if kind == "tensor_type":
        return {type_proto.tensor_type.elem_type}
    if kind == "sequence_type":
        return _elem_types_of(type_proto.sequence_type.elem_type)
    if kind == "optional_type":
        return _elem_types_of(type_proto.optional_type.elem_type)
    return set()


class _ChildError(RuntimeError):
    """What onnxruntime raised in the child process, with its type's name."""

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


_RUNNERS: dict[str, Callable[[onnx.ModelProto, dict[str, Any], bool, Limit | None], list[Any]]] = {
    "onnxruntime": _onnxruntime_at("default"),
    "onnxruntime-unoptimized": _onnxruntime_at("unoptimized"),
    "reference": _run_reference,
}
"""Every source of outputs a runtime gives, by its name in reports."""

SOURCES = {"onnxruntime": ("onnxruntime", "onnxruntime-unoptimized"), "reference": ("reference",)}
"""The sources each of :data:`RUNTIMES` gives: onnxruntime runs the model at its default graph
optimization level, as users run it, and with the optimizations off; the two are one runtime
when counting how many independent runtimes ran the model."""
