"""Running a model in onnxruntime's CPU provider, at one of its graph optimization levels.

``check`` runs it in this process, or in a child process where a crash is plausible; the child
runs this file as a script (``python _ort.py FOLDER``), so that it imports numpy and onnxruntime
only, not torchscan, torch or onnx (onnx_ir, and with it onnx, only for a tensor of a type numpy
lacks, bfloat16 or float8, whose ONNX element type it gives): its start-up costs a fraction of a
second, and the time limit counts from when it is ready (it prints ``ready``), not from its start.
"""

from __future__ import annotations

import ctypes
import pickle
import re
import sys
from typing import Any

import numpy as np

LEVELS = {"default": "ORT_ENABLE_ALL", "unoptimized": "ORT_DISABLE_ALL"}
"""onnxruntime's graph optimization levels ``check`` runs a model at: its default, what users
get (constant folding and fusions trust the shapes and values the model states), and none (the
model as it is)."""


def run_onnxruntime(
    data: bytes, feeds: dict[str, Any], level: str = "default", limit: Any = None
) -> list[Any]:
    """Run a serialized model in onnxruntime's CPU provider at ``level`` (a key of
    :data:`LEVELS`); under a ``limit`` (:class:`~torchscan.onnx._check._limit.Limit`), stopped
    through ``RunOptions.terminate`` when it is to stop.

    Tensors of types numpy lacks (bfloat16, float8; numpy arrays of ``ml_dtypes`` types) go in
    and come out through ``OrtValue`` and their bits.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[level])
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
    import onnx_ir as ir

    onnx_type = int(ir.DataType.from_numpy(value.dtype))
    # ascontiguousarray would make a scalar a vector of one
    bits = np.array(value, order="C", copy=True).view(f"uint{8 * value.dtype.itemsize}")
    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, onnx_type)


def _from_ort_value(value: Any) -> np.ndarray:
    if not _exotic_onnx_type(value.data_type()):
        return value.numpy()
    import onnx_ir as ir

    dtype = np.dtype(ir.DataType(value.element_type()).numpy())
    shape, size = tuple(value.shape()), value.tensor_size_in_bytes()
    raw = (ctypes.c_char * size).from_address(value.data_ptr()) if size else b""
    return np.frombuffer(bytes(raw), dtype=dtype).reshape(shape)


def _child(folder: str) -> None:
    """The child process: read ``in.pkl``, say ``ready``, run, write ``out.pkl``."""
    import onnxruntime  # noqa: F401  (imported before the model's time starts)

    with open(f"{folder}/in.pkl", "rb") as f:
        data, feeds, level = pickle.load(f)
    print("ready", flush=True)
    try:
        result: tuple = ("ok", run_onnxruntime(data, feeds, level))
    except Exception as error:  # reported by the parent, by its type's name
        result = ("error", type(error).__name__, str(error))
    with open(f"{folder}/out.pkl", "wb") as f:
        pickle.dump(result, f)


if __name__ == "__main__":
    _child(sys.argv[1])
