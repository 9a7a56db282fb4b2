"""Running ONNX models: onnxruntime with graph optimisations off, and onnx's reference evaluator."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnx.reference
import onnx.reference.ops.op_loop
import onnxruntime as ort
import torch
import torch.utils._pytree as pytree


def run_onnxruntime(model: onnx.ModelProto, inputs: Sequence[torch.Tensor]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    names = [i.name for i in session.get_inputs()]
    return session.run(None, dict(zip(names, _numpy(inputs), strict=True)))


class Loop(onnx.reference.ops.op_loop.Loop):
    """onnx.reference's ``Loop`` with two departures from the specification undone.

    This class replaces onnx's by name (``ReferenceEvaluator(..., new_ops=[Loop])``).

    In onnx 1.23 it runs no iteration when the ``cond`` input is omitted (the specification's
    ``(M, "")`` mode is a for loop that ignores the body's condition), and it joins scan outputs
    with ``np.vstack``, which concatenates per-iteration tensors of rank 2 or more on their own
    first axis instead of stacking them on a new one. This follows the specification's
    pseudo-code instead; a loop that runs no iteration stays unsupported, as the evaluator cannot
    know the shapes of its scan outputs.
    """

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


def run_reference(model: onnx.ModelProto, inputs: Sequence[torch.Tensor]) -> list[np.ndarray]:
    evaluator = onnx.reference.ReferenceEvaluator(model, new_ops=[Loop])
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
