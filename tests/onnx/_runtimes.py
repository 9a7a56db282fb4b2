"""Running ONNX models: onnxruntime with graph optimisations off and at its default level, and
onnx's reference evaluator."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import onnx
import onnx.reference
import onnxruntime as ort
import torch
import torch.utils._pytree as pytree

from torchscan.onnx._check._runtimes import reference_ops

LEVELS = {
    "unoptimized": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "default": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
"""The onnxruntime graph optimization levels every exported model runs at: none (the model as it
is) and the default that users get, whose constant folding trusts the shapes the model states."""


class Runs(dict):
    """The outputs of one model in onnxruntime at each level of :data:`LEVELS`, by level name;
    :func:`assert_outputs_close` holds every level against the expected outputs."""


def run_onnxruntime(model: onnx.ModelProto, inputs: Sequence[torch.Tensor]) -> Runs:
    """``model`` in onnxruntime at every level of :data:`LEVELS` on ``inputs``, given in the order
    of the model's inputs."""
    runs = Runs()
    for level, session in _sessions(model.SerializeToString()).items():
        names = [i.name for i in session.get_inputs()]
        runs[level] = session.run(None, dict(zip(names, _numpy(inputs), strict=True)))
    return runs


def run_onnxruntime_on(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> Runs:
    """``model`` in onnxruntime at every level of :data:`LEVELS` on ``feeds``, by input name."""
    return Runs(
        {
            level: session.run(None, feeds)
            for level, session in _sessions(model.SerializeToString()).items()
        }
    )


@functools.lru_cache(maxsize=32)
def _sessions(data: bytes) -> dict[str, ort.InferenceSession]:
    """onnxruntime sessions on the CPU, one per level, made once per model."""
    return {level: session_at(data, value) for level, value in LEVELS.items()}


def session_at(data: bytes, level: ort.GraphOptimizationLevel) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    """onnxruntime on the CPU with graph optimisations off: the model as it is."""
    return session_at(model.SerializeToString(), LEVELS["unoptimized"])


def run_reference(model: onnx.ModelProto, inputs: Sequence[torch.Tensor]) -> list[np.ndarray]:
    # onnx.reference's Loop, ReduceLogSumExp and GatherElements depart from the specification;
    # torchscan's check tool and these tests run it with the check tool's replacements.
    evaluator = onnx.reference.ReferenceEvaluator(model, new_ops=reference_ops())
    # Below IR version 4 (opset 8), initializers are listed among the graph's inputs too.
    initializers = {i.name for i in model.graph.initializer}
    names = [name for name in evaluator.input_names if name not in initializers]
    return evaluator.run(None, dict(zip(names, _numpy(inputs), strict=True)))


def _numpy(inputs: Sequence[torch.Tensor]) -> list[np.ndarray]:
    # onnx.reference reads numpy arrays only; torch.export drops inputs the graph never reads.
    return [t.detach().numpy() for t in inputs]


def eager_outputs(model: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> list[np.ndarray]:
    with torch.no_grad():
        out = model(*inputs)
    return [leaf.numpy() for leaf in pytree.tree_leaves(out) if leaf is not None]


def assert_outputs_close(
    actual: Sequence[np.ndarray] | Runs, expected: Sequence[np.ndarray], model: onnx.ModelProto
) -> None:
    """float32 within 1e-5, integers and booleans exactly; the model's text on a mismatch.
    ``actual`` may be onnxruntime's :class:`Runs`: every level is held against ``expected``."""
    if isinstance(actual, Runs):
        for level, outputs in actual.items():
            try:
                assert_outputs_close(outputs, expected, model)
            except AssertionError as error:
                raise AssertionError(f"onnxruntime at the {level} level: {error}") from None
        return
    try:
        assert len(actual) == len(expected), f"{len(actual)} outputs, expected {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert a.dtype == e.dtype, f"output {i}: dtype {a.dtype}, expected {e.dtype}"
            assert a.shape == e.shape, f"output {i}: shape {a.shape}, expected {e.shape}"
            np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5, err_msg=f"output {i}")
    except AssertionError as error:
        raise AssertionError(f"{error}\n\n{onnx.printer.to_text(model)}") from None


def assert_runs_close(actual: Runs, expected: Runs, *, rtol: float, atol: float) -> None:
    """Two models' onnxruntime outputs agree at each level."""
    assert actual.keys() == expected.keys()
    for level, outputs in actual.items():
        assert len(outputs) == len(expected[level])
        for i, (a, e) in enumerate(zip(outputs, expected[level], strict=True)):
            assert (a.dtype, a.shape) == (e.dtype, e.shape), f"{level} level, output {i}"
            np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=f"{level}, output {i}")


def nodes(graph: onnx.GraphProto, depth: int = 0):
    """Every node with its nesting depth, bodies included."""
    for node in graph.node:
        yield node, depth
        for attribute in node.attribute:
            for subgraph in [attribute.g] if attribute.HasField("g") else attribute.graphs:
                yield from nodes(subgraph, depth + 1)
