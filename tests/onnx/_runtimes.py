"""Running ONNX models: onnxruntime with graph optimisations off, and onnx's reference evaluator."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnx.reference
import onnxruntime as ort
import torch
import torch.utils._pytree as pytree

from torchscan.onnx._check._runtimes import reference_ops


def run_onnxruntime(model: onnx.ModelProto, inputs: Sequence[torch.Tensor]) -> list[np.ndarray]:
    """``model`` in onnxruntime on ``inputs``, given in the order of the model's inputs."""
    session = _session(model)
    names = [i.name for i in session.get_inputs()]
    return session.run(None, dict(zip(names, _numpy(inputs), strict=True)))


def run_onnxruntime_on(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """``model`` in onnxruntime on ``feeds``, by input name."""
    return _session(model).run(None, feeds)


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    """onnxruntime on the CPU with graph optimisations off: the model as it is."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def run_reference(model: onnx.ModelProto, inputs: Sequence[torch.Tensor]) -> list[np.ndarray]:
    # onnx.reference's Loop, ReduceLogSumExp and GatherElements depart from the specification;
    # torchscan's check tool and these tests run it with the check tool's replacements.
    evaluator = onnx.reference.ReferenceEvaluator(model, new_ops=reference_ops())
    return evaluator.run(None, dict(zip(evaluator.input_names, _numpy(inputs), strict=True)))


def _numpy(inputs: Sequence[torch.Tensor]) -> list[np.ndarray]:
    # onnx.reference reads numpy arrays only; torch.export drops inputs the graph never reads.
    return [t.detach().numpy() for t in inputs]


def eager_outputs(model: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> list[np.ndarray]:
    with torch.no_grad():
        out = model(*inputs)
    return [leaf.numpy() for leaf in pytree.tree_leaves(out) if leaf is not None]


def assert_outputs_close(
    actual: Sequence[np.ndarray], expected: Sequence[np.ndarray], model: onnx.ModelProto
) -> None:
    """float32 within 1e-5, integers and booleans exactly; the model's text on a mismatch."""
    try:
        assert len(actual) == len(expected), f"{len(actual)} outputs, expected {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert a.dtype == e.dtype, f"output {i}: dtype {a.dtype}, expected {e.dtype}"
            assert a.shape == e.shape, f"output {i}: shape {a.shape}, expected {e.shape}"
            np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5, err_msg=f"output {i}")
    except AssertionError as error:
        raise AssertionError(f"{error}\n\n{onnx.printer.to_text(model)}") from None


def nodes(graph: onnx.GraphProto, depth: int = 0):
    """Every node with its nesting depth, bodies included."""
    for node in graph.node:
        yield node, depth
        for attribute in node.attribute:
            for subgraph in [attribute.g] if attribute.HasField("g") else attribute.graphs:
                yield from nodes(subgraph, depth + 1)
