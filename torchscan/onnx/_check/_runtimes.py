"""The runtimes ``check`` runs a model in: onnxruntime's CPU provider, onnx's reference evaluator
with a ``Loop``, a ``ReduceLogSumExp`` and a ``GatherElements`` that follow the specification
(:func:`reference_ops`), and eager PyTorch; a runtime that does not run a model raises
:class:`_Unsupported`, which is not a failure. onnxruntime runs in this process, except where a
crash is plausible: on inputs with an empty dimension (onnxruntime 1.32 ends the process with
SIGFPE on some zero-length scans) and on models the lint found fault with. There it runs in a
child process, whose death is reported as an error. Under a time limit
(:mod:`torchscan.onnx._check._limit`), onnxruntime is stopped through ``RunOptions.terminate``,
and its child process is killed.
"""

from __future__ import annotations

import ctypes
import functools
import os
import pickle
import re
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from torchscan.onnx import _ir
from torchscan.onnx._check import _lint
from torchscan.onnx._check._inputs import _as_value
from torchscan.onnx._check._limit import Limit
from torchscan.onnx._check._reference_ops import gather_elements, log_sum_exp

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
    why = _reference_cannot_run(model)
    if why:
        raise _Unsupported(why)
    import onnx.reference

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        evaluator = onnx.reference.ReferenceEvaluator(model, new_ops=reference_ops())
        return list(evaluator.run(None, feeds))


def reference_ops() -> list[type]:
    """The operators ``check`` gives onnx's reference evaluator in place of its own, which depart
    from the specification in onnx 1.23: ``Loop`` (:func:`_spec_loop`), ``ReduceLogSumExp`` and
    ``GatherElements`` (:mod:`torchscan.onnx._check._reference_ops`). Bodies get them too."""
    return [_spec_loop(), log_sum_exp(), gather_elements()]


def _reference_cannot_run(model: onnx.ModelProto) -> str | None:
    """Why onnx's reference evaluator would not run ``model`` right, or None: it runs Scan-8
    wrongly, and Scan only along axis 0, forward."""
    opset = _lint.default_opset(model.opset_import)
    functions = [node for function in model.functions for node in function.node]
    for node in _all_nodes(model.graph) + functions:
        if node.op_type != "Scan" or not _ir.is_default_domain(node.domain) or opset is None:
            continue
        version = _lint.version_in_force("Scan", opset)
        if version is not None and version.batch_axis:
            return f"onnx.reference does not run Scan-{version.since} right"
        for attr in node.attribute:
            if attr.name.startswith("scan_") and any(v != 0 for v in attr.ints):
                return f"onnx.reference runs Scan only along axis 0, forward ({attr.name})"
    return None


def _all_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    found = []
    for node in graph.node:
        found.append(node)
        for attr in node.attribute:
            for body in [attr.g] if attr.HasField("g") else attr.graphs:
                found += _all_nodes(body)
    return found


@functools.cache
def _spec_loop() -> type:
    """onnx.reference's ``Loop`` with two departures from the specification undone.

    In onnx 1.23 it runs no iteration when ``cond`` is omitted (the ``(M, "")`` mode is a for
    loop that ignores the body's condition), and it joins scan outputs with ``np.vstack``, which
    concatenates per-iteration tensors of rank 2 or more instead of stacking them. This follows
    the specification's pseudo-code.
    """
    import onnx.reference.ops.op_loop

    class Loop(onnx.reference.ops.op_loop.Loop):
        def _run(self, M, cond, *args, context=None, body=None, attributes=None, bindings=None):
            names = self.body.input_names
            inputs = dict(context or {})
            inputs.update(zip(names[2:], args, strict=False))
            scan_outputs: list[list[np.ndarray]] = [[] for _ in range(self.K)]
            keep_going, i = True if cond is None else bool(cond), 0
            while keep_going and (M is None or i < M):
                inputs[names[0]] = np.array(i, dtype=np.int64)
                inputs[names[1]] = np.array(keep_going)
                outputs = self._run_body(inputs, attributes=attributes, bindings=bindings)
                if cond is not None:
                    keep_going = bool(outputs[0])
                inputs.update(zip(names[2:], outputs[1 : 1 + self.N], strict=True))
                for k in range(self.K):
                    scan_outputs[k].append(outputs[1 + self.N + k])
                i += 1
            if self.K and i == 0:
                raise NotImplementedError(
                    "a Loop that runs no iteration has scan outputs of unknown shape"
                )
            carried = [inputs[name] for name in names[2:]]
            return tuple(carried + [np.stack(column) for column in scan_outputs])

    return Loop


# onnxruntime ------------------------------------------------------------------------------------


_NO_ORT_KERNELS = ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2")
"""Element types onnxruntime 1.32 has no CPU kernels for."""


def _run_onnxruntime(
    model: onnx.ModelProto, feeds: dict[str, Any], isolate: bool, limit: Limit | None = None
) -> list[Any]:
    why = _onnxruntime_cannot_run(model)
    if why:
        raise _Unsupported(why)
    data = model.SerializeToString()
    if isolate:
        return _in_child_process(data, feeds, limit)
    return run_onnxruntime(data, feeds, limit)


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


def run_onnxruntime(data: bytes, feeds: dict[str, Any], limit: Limit | None = None) -> list[Any]:
    """Run a serialized model in onnxruntime's CPU provider, graph optimizations off; under a
    ``limit``, stopped through ``RunOptions.terminate`` when it is to stop.

    Tensors of types numpy lacks (bfloat16, float8; numpy arrays of ``ml_dtypes`` types) go in
    and come out through ``OrtValue`` and their bits.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3  # warnings about unused initializers are not findings
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    run_options = ort.RunOptions()
    run_options.log_severity_level = 4  # a stopped run's error is reported, not logged
    if limit is not None:
        limit.on_stop(lambda: setattr(run_options, "terminate", True))
    exotic = any(_is_exotic(v) for v in feeds.values()) or any(
        _exotic_onnx_type(o.type) for o in session.get_outputs()
    )
    if not exotic:
        return list(session.run(None, feeds, run_options))
    values = {name: _to_ort_value(ort, value) for name, value in feeds.items()}
    return [_from_ort_value(v) for v in session.run_with_ort_values(None, values, run_options)]


def _is_exotic(value: Any) -> bool:
    return isinstance(value, np.ndarray) and value.dtype.kind == "V"


def _exotic_onnx_type(type_name: str) -> bool:
    return bool(re.fullmatch(r"tensor\((bfloat16|float8\w*)\)", type_name))


def _to_ort_value(ort: Any, value: Any) -> Any:
    if not _is_exotic(value):
        return ort.OrtValue.ortvalue_from_numpy(value)
    onnx_type = onnx.helper.np_dtype_to_tensor_dtype(value.dtype)
    # ascontiguousarray would make a scalar a vector of one
    bits = np.array(value, order="C", copy=True).view(f"uint{8 * value.dtype.itemsize}")
    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, onnx_type)


def _from_ort_value(value: Any) -> np.ndarray:
    if not _exotic_onnx_type(value.data_type()):
        return value.numpy()
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(value.element_type()))
    shape, size = tuple(value.shape()), value.tensor_size_in_bytes()
    raw = (ctypes.c_char * size).from_address(value.data_ptr()) if size else b""
    return np.frombuffer(bytes(raw), dtype=dtype).reshape(shape)


_CHILD = """
import pickle, sys
from torchscan.onnx._check._runtimes import run_onnxruntime
folder = sys.argv[1]
with open(folder + "/in.pkl", "rb") as f:
    data, feeds = pickle.load(f)
try:
    result = ("ok", run_onnxruntime(data, feeds))
except Exception as error:
    result = ("error", type(error).__name__, str(error))
with open(folder + "/out.pkl", "wb") as f:
    pickle.dump(result, f)
"""


class _ChildError(RuntimeError):
    """What onnxruntime raised in the child process, with its type's name."""

    def __init__(self, child_type: str, message: str) -> None:
        super().__init__(message)
        self.child_type = child_type


def _in_child_process(data: bytes, feeds: dict[str, Any], limit: Limit | None) -> list[Any]:
    """``run_onnxruntime`` in a child process, so that a crash of onnxruntime ends only it; under
    a ``limit``, the process is killed when it is to stop."""
    import signal

    root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryDirectory(prefix="torchscan-check-") as folder:
        with open(os.path.join(folder, "in.pkl"), "wb") as f:
            pickle.dump((data, feeds), f)
        with subprocess.Popen(
            [sys.executable, "-c", _CHILD, folder],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        ) as child:
            if limit is not None:
                limit.on_stop(child.kill)
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
    "onnxruntime": _run_onnxruntime,
    "reference": _run_reference,
}
