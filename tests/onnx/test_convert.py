"""``torchscan.onnx._export._convert``: models converted down from opset 18 to every opset 8 to 17.

Every model runs in onnxruntime, with graph optimisations off, before and after conversion on
the same inputs, and the outputs must agree: float32 within rtol 1e-5 and atol 1e-6, integers and
booleans exactly. Where an opset cannot express a model exactly, the conversion must refuse it,
with the message pinned here. Models exported by torch.onnx are exported once per session.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import types
from collections.abc import Callable

import numpy as np
import onnx
import onnx.helper as oh
import onnx.shape_inference
import onnx_ir as ir
import pytest
import torch
from onnx import TensorProto, numpy_helper

import torchscan
from torchscan.onnx._export._convert import OpsetConversionError, convert_model

from .._export import onnx_export
from ._runtimes import Runs
from ._runtimes import run_onnxruntime_on as run

TARGETS = list(range(8, 18))
F32, F16, F64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE
I8, I32, I64, BOOL = TensorProto.INT8, TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL
INT64_MIN = np.iinfo(np.int64).min

logging.getLogger("torch.onnx").setLevel(logging.ERROR)
_rng = np.random.default_rng(0)


# -- running and comparing ------------------------------------------------------------------------


def assert_same(expected: list[np.ndarray] | Runs, actual: list[np.ndarray] | Runs) -> None:
    """Outputs equal within float32 rounding; of onnxruntime, at each level (:class:`Runs`)."""
    if isinstance(actual, Runs):
        for level, got in actual.items():
            assert_same(expected[level] if isinstance(expected, Runs) else expected, got)
        return
    assert len(actual) == len(expected)
    for want, got in zip(expected, actual, strict=True):
        assert (got.dtype, got.shape) == (want.dtype, want.shape)
        if want.dtype.kind == "f":
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(got, want)


def convert(model: onnx.ModelProto, target: int) -> onnx.ModelProto:
    """``convert_model`` on ``model`` as an ``onnx_ir`` model, serialized back."""
    return ir.serde.serialize_model(convert_model(ir.serde.deserialize_model(model), target))


def converted(model: onnx.ModelProto, target: int) -> onnx.ModelProto:
    """``model`` at ``target``, held to the checker and to the opset asked for."""
    result = convert(model, target)
    onnx.checker.check_model(result, full_check=True)
    assert [(o.domain, o.version) for o in result.opset_import if o.domain in ("", "ai.onnx")] == [
        ("", target)
    ]
    return result


def assert_converts(model: onnx.ModelProto, feeds: dict[str, np.ndarray], target: int) -> None:
    assert_same(run(model, feeds), run(converted(model, target), feeds))


# -- building models ------------------------------------------------------------------------------


def info(name: str, elem: int, shape: list[int | str] | None = None) -> onnx.ValueInfoProto:
    return oh.make_tensor_value_info(name, elem, shape)


def const(name: str, value: object, dtype: object = None) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def build(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    initializers: list[onnx.TensorProto] = (),
    functions: list[onnx.FunctionProto] = (),
) -> onnx.ModelProto:
    """An opset-18 model with the shapes ONNX infers for it, held to the checker."""
    imports = [oh.make_opsetid("", 18)] + [oh.make_opsetid(f.domain, 1) for f in functions]
    graph = oh.make_graph(nodes, "model", inputs, outputs, initializer=list(initializers))
    model = oh.make_model(graph, opset_imports=imports, ir_version=10, functions=functions)
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.checker.check_model(model, full_check=True)
    return model


def normal(*shape: int) -> np.ndarray:
    return _rng.standard_normal(shape).astype(np.float32)


def outputs_of(*names: str, elem: int = F32) -> list[onnx.ValueInfoProto]:
    return [info(name, elem) for name in names]


# -- models exported by torch.onnx ----------------------------------------------------------------


class Elman(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.W = torch.nn.Parameter(torch.randn(4, 5) * 0.5)
        self.U = torch.nn.Parameter(torch.randn(5, 5) * 0.5)
        self.b = torch.nn.Parameter(torch.randn(5))

    def forward(self, h, x):
        h = torch.tanh(x @ self.W + h @ self.U + self.b)
        return h, h * 1.0


class LSTMCell(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4 + 5, 4 * 5)

    def forward(self, h, c, x):
        i, f, g, o = self.linear(torch.cat([x, h], dim=-1)).chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        return h, c, h * 1.0


class SoftmaxArgmax(torch.nn.Module):
    def forward(self, x):
        p = torch.softmax(x, dim=1)
        return p, torch.log_softmax(x, dim=0), torch.argmax(p, dim=-1), p.max(dim=1).values


class Reductions(torch.nn.Module):
    def forward(self, x):
        return (
            x.sum(dim=1), x.mean(dim=(0, 2), keepdim=True), x.amax(dim=-1), x.sum(),
            x.prod(0), x.norm(dim=-1), x.var(dim=1),
        )  # fmt: skip


class Misc(torch.nn.Module):
    def forward(self, x, y):
        moved = x.unsqueeze(0).squeeze(0).transpose(0, 1).reshape(-1)[1:5]
        values, indices = torch.topk(x, 2, dim=-1, largest=False)
        parts = torch.tensor_split(x, 3, dim=1)
        return (
            moved, torch.where(x > y, x, y).expand(2, *x.shape), values, indices,
            torch.nn.functional.pad(x, (1, 2), value=0.5), x[:, torch.tensor([0, -1])],
            torch.clamp(x, min=-0.5), torch.cumsum(x, 1), x.flip(1), parts[0], parts[2], x[::2],
            (x < y) & (x >= y),
        )  # fmt: skip


class Gelu(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.gelu(x)


class LayerNorm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(6)

    def forward(self, x):
        return self.norm(x)


class ConvPoolResize(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 4, 3, padding=1)
        self.linear = torch.nn.Linear(4 * 2 * 2, 3)

    def forward(self, x):
        y = torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
        y = torch.nn.functional.avg_pool2d(y, 2)
        upsampled = torch.nn.functional.interpolate(x, scale_factor=2.0, mode="nearest")
        return self.linear(torch.flatten(y, 1)), upsampled


class EmbeddingBatchNorm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(10, 3)
        self.norm = torch.nn.BatchNorm1d(3)

    def forward(self, i):
        return self.norm(self.embedding(i)), torch.nn.functional.one_hot(i, 10)


class DynamicBatchReshape(torch.nn.Module):
    def forward(self, x):
        return x.reshape(x.shape[0], -1) * 2, x.view(-1, 4)


class WhileLoop(torch.nn.Module):
    def forward(self, x, n):
        from torch._higher_order_ops.while_loop import while_loop

        def condition(i, v):
            return i < n.squeeze()

        def body(i, v):
            return i + 1, torch.tanh(v * 2 + 1)

        return while_loop(condition, body, (torch.zeros((), dtype=torch.int64), x))[1]


class Cond(torch.nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda t: torch.sigmoid(t) * 2, lambda t: t - 1, (x,))


class Int64Masks(torch.nn.Module):
    """``arange(n) < k`` masks and int64 comparisons, as sequence-masking code writes them."""

    def forward(self, x, k):
        steps = torch.arange(x.shape[0])
        mask = (steps < k).float()[:, None]
        return x * mask, steps > k, steps.max() < k


@dataclasses.dataclass(frozen=True)
class TorchCase:
    make: Callable[[], torch.nn.Module]
    inputs: tuple[torch.Tensor, ...]
    dynamic_shapes: object = None


_gen = torch.Generator().manual_seed(0)


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen)


TORCH_CASES = {
    "elman": TorchCase(Elman, (randn(3, 5), randn(3, 4))),
    "lstm-cell": TorchCase(LSTMCell, (randn(3, 5), randn(3, 5), randn(3, 4))),
    "softmax-argmax": TorchCase(SoftmaxArgmax, (randn(3, 6),)),
    "reductions": TorchCase(Reductions, (randn(3, 4, 5),)),
    "misc": TorchCase(Misc, (randn(3, 6), randn(3, 6))),
    "gelu": TorchCase(Gelu, (randn(3, 6),)),
    "layer-norm": TorchCase(LayerNorm, (randn(3, 6),)),
    "conv-pool-resize": TorchCase(ConvPoolResize, (randn(1, 2, 8, 8),)),
    "embedding-batchnorm": TorchCase(EmbeddingBatchNorm, (torch.tensor([1, 4, 9, 0]),)),
    "dynamic-batch-reshape": TorchCase(
        DynamicBatchReshape, (randn(3, 4, 2),), ({0: torch.export.Dim("batch")},)
    ),
    "while-loop": TorchCase(WhileLoop, (randn(3, 4), torch.tensor([5]))),
    "cond": TorchCase(Cond, (randn(3, 4),)),
    "int64-masks": TorchCase(
        Int64Masks, (randn(5, 3), torch.tensor([2])), ({0: torch.export.Dim("T")}, None)
    ),
}


@functools.cache
def exported(name: str) -> onnx.ModelProto:
    """``torch.onnx.export`` of case ``name`` at opset 18, once per session."""
    case = TORCH_CASES[name]
    torch.manual_seed(0)
    program = onnx_export(
        case.make(), case.inputs, dynamo=True, opset_version=18, dynamic_shapes=case.dynamic_shapes
    )
    return program.model_proto


def torch_feeds(name: str) -> dict[str, np.ndarray]:
    model = exported(name)
    return {
        i.name: t.numpy() for i, t in zip(model.graph.input, TORCH_CASES[name].inputs, strict=True)
    }


# -- Scan and Loop models around torch-exported step bodies ---------------------------------------

B, IN, H, T = 3, 4, 5, 6  # batch, input features, hidden size, steps


@functools.cache
def step(name: str) -> onnx.ModelProto:
    return exported(name)


def instantiate(
    step_model: onnx.ModelProto, prefix: str, inputs: list[str]
) -> tuple[list[onnx.NodeProto], list[str], list[onnx.TensorProto]]:
    """The nodes of a torch-exported step, reading ``inputs``, with every other name prefixed
    (names are unique across a model and its subgraphs); its outputs; its initializers, which
    belong in the main graph, where every body sees them."""
    graph = step_model.graph
    bound = {value.name: name for value, name in zip(graph.input, inputs, strict=True)}

    def rename(name: str) -> str:
        return bound.get(name) or (prefix + name if name else name)

    nodes = []
    for node in graph.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = prefix + node.name
        copy.input[:] = [rename(n) for n in node.input]
        copy.output[:] = [rename(n) for n in node.output]
        nodes.append(copy)
    initializers = []
    for init in graph.initializer:
        copy = onnx.TensorProto()
        copy.CopyFrom(init)
        copy.name = rename(init.name)
        initializers.append(copy)
    return nodes, [rename(o.name) for o in graph.output], initializers


def elman_body(prefix: str, h: str, x: str) -> tuple[onnx.GraphProto, list[onnx.TensorProto]]:
    nodes, (h_out, y), inits = instantiate(step("elman"), prefix, [h, x])
    body = oh.make_graph(
        nodes, f"{prefix}body", [info(h, F32, [B, H]), info(x, F32, [B, IN])],
        [info(h_out, F32, [B, H]), info(y, F32, [B, H])],
    )  # fmt: skip
    return body, inits


def scan_elman() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    body, inits = elman_body("s_", "h", "x")
    scan = oh.make_node("Scan", ["h0", "xs"], ["h_last", "hs"], body=body, num_scan_inputs=1)
    model = build(
        [scan], [info("h0", F32, [B, H]), info("xs", F32, [T, B, IN])],
        outputs_of("h_last", "hs"), inits,
    )  # fmt: skip
    return model, {"h0": normal(B, H), "xs": normal(T, B, IN)}


def scan_lstm_reverse_batch_first() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    nodes, (h, c, y), inits = instantiate(step("lstm-cell"), "l_", ["h", "c", "x"])
    body = oh.make_graph(
        nodes, "lstm_body",
        [info("h", F32, [B, H]), info("c", F32, [B, H]), info("x", F32, [B, IN])],
        [info(h, F32, [B, H]), info(c, F32, [B, H]), info(y, F32, [B, H])],
    )  # fmt: skip
    scan = oh.make_node(
        "Scan", ["h0", "c0", "xs"], ["h_last", "c_last", "hs"], body=body, num_scan_inputs=1,
        scan_input_axes=[1], scan_output_axes=[1], scan_input_directions=[1],
        scan_output_directions=[1],
    )  # fmt: skip
    model = build(
        [scan], [info("h0", F32, [B, H]), info("c0", F32, [B, H]), info("xs", F32, [B, T, IN])],
        outputs_of("h_last", "c_last", "hs"), inits,
    )  # fmt: skip
    return model, {"h0": normal(B, H), "c0": normal(B, H), "xs": normal(B, T, IN)}


def scan_in_scan() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """An outer Scan over chunks whose body runs an Elman Scan over the chunk and emits the mean
    of its steps, with axes that are an initializer of the main graph."""
    inner, inits = elman_body("i_", "ih", "ix")
    outer = oh.make_graph(
        [
            oh.make_node("Scan", ["oh", "ox"], ["oh_next", "ys"], body=inner, num_scan_inputs=1),
            oh.make_node("ReduceMean", ["ys", "axis0"], ["y_mean"], keepdims=0),
        ],
        "outer_body", [info("oh", F32, [B, H]), info("ox", F32, [2, B, IN])],
        [info("oh_next", F32, [B, H]), info("y_mean", F32, [B, H])],
    )  # fmt: skip
    scan = oh.make_node("Scan", ["h0", "xs"], ["h_last", "means"], body=outer, num_scan_inputs=1)
    model = build(
        [scan], [info("h0", F32, [B, H]), info("xs", F32, [T, 2, B, IN])],
        outputs_of("h_last", "means"), [*inits, const("axis0", [0], np.int64)],
    )  # fmt: skip
    return model, {"h0": normal(B, H), "xs": normal(T, 2, B, IN)}


def loop_in_scan() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A Scan whose body applies an Elman step twice in a Loop, reading the Scan's element from
    the Loop body, and sums what the Loop stacked."""
    nodes, (h_out, y), inits = instantiate(step("elman"), "b_", ["lh", "sx"])
    loop_body = oh.make_graph(
        [*nodes, oh.make_node("Identity", ["cond_in"], ["cond_out"])], "loop_body",
        [info("i", I64, []), info("cond_in", BOOL, []), info("lh", F32, [B, H])],
        [info("cond_out", BOOL, []), info(h_out, F32, [B, H]), info(y, F32, [B, H])],
    )  # fmt: skip
    scan_body = oh.make_graph(
        [
            oh.make_node("Loop", ["two", "", "sh"], ["sh_next", "stacked"], body=loop_body),
            oh.make_node("ReduceSum", ["stacked", "axis0"], ["total"], keepdims=0),
        ],
        "scan_body", [info("sh", F32, [B, H]), info("sx", F32, [B, IN])],
        [info("sh_next", F32, [B, H]), info("total", F32, [B, H])],
    )  # fmt: skip
    scan = oh.make_node("Scan", ["h0", "xs"], ["h_last", "totals"], body=scan_body,
                        num_scan_inputs=1)  # fmt: skip
    extra = [const("two", 2, np.int64), const("axis0", [0], np.int64)]
    model = build(
        [scan], [info("h0", F32, [B, H]), info("xs", F32, [T, B, IN])],
        outputs_of("h_last", "totals"), [*inits, *extra],
    )  # fmt: skip
    return model, {"h0": normal(B, H), "xs": normal(T, B, IN)}


def scan_in_loop() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A Loop of three iterations whose body runs an Elman Scan over a sequence of the main
    graph and halves its last state."""
    inner, inits = elman_body("n_", "sh", "sx")
    body = oh.make_graph(
        [
            oh.make_node("Scan", ["lh", "xs"], ["lh_scanned", "ys"], body=inner,
                         num_scan_inputs=1),
            oh.make_node("ReduceSum", ["ys", "axis0"], ["ysum"], keepdims=0),
            oh.make_node("Mul", ["lh_scanned", "half"], ["lh_next"]),
            oh.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "loop_body", [info("i", I64, []), info("cond_in", BOOL, []), info("lh", F32, [B, H])],
        [info("cond_out", BOOL, []), info("lh_next", F32, [B, H]), info("ysum", F32, [B, H])],
    )  # fmt: skip
    loop = oh.make_node("Loop", ["three", "yes", "h0"], ["h_last", "sums"], body=body)
    extra = [
        const("three", 3, np.int64), const("yes", True), const("axis0", [0], np.int64),
        const("half", 0.5, np.float32),
    ]  # fmt: skip
    model = build(
        [loop], [info("xs", F32, [T, B, IN]), info("h0", F32, [B, H])],
        [info("h_last", F32, [B, H]), info("sums", F32, [3, B, H])], [*inits, *extra],
    )  # fmt: skip
    return model, {"xs": normal(T, B, IN), "h0": normal(B, H)}


LOOP_CASES = {
    "scan-elman": scan_elman,
    "scan-lstm-reverse-batch-first": scan_lstm_reverse_batch_first,
    "scan-in-scan": scan_in_scan,
    "loop-in-scan": loop_in_scan,
    "scan-in-loop": scan_in_loop,
}


@functools.cache
def loop_case(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    return LOOP_CASES[name]()


def real_model(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    if name in TORCH_CASES:
        return exported(name), torch_feeds(name)
    return loop_case(name)


# Where a model cannot be expressed at an opset, the message of the refusal.
REAL_REFUSALS = {
    # x >= y is GreaterOrEqual, whose ONNX definition needs Equal; without IsNaN, Equal on
    # floats cannot tell NaN apart
    ("misc", 8): "torch.onnx.export: cannot convert Equal (node 'node_ge_Equal') from opset 11 to "
    "opset "
    "10: comparing float values exactly needs IsNaN, which exists from opset 9 on. Export with a "
    "newer opset_version (at opset 11 this Equal is kept as it is), or compute it in the step "
    "with operators that opset 10 has.",
    # GELU is x * (1 + erf(x / sqrt 2)) / 2, and no opset-8 operator computes erf
    ("gelu", 8): "torch.onnx.export: cannot convert Erf (node 'node_Erf_2') from opset 9 to opset "
    "8: Erf "
    "does not exist before opset 9 and its inputs are not constants. Export with a newer "
    "opset_version (at opset 9 this Erf is kept as it is), or compute it in the step with "
    "operators that opset 8 has.",
}

REAL_CASES = [*TORCH_CASES, *LOOP_CASES]


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"opset{t}")
@pytest.mark.parametrize("name", REAL_CASES)
def test_real_models_convert_to_every_opset(name: str, target: int) -> None:
    model, feeds = real_model(name)
    refusal = REAL_REFUSALS.get((name, target))
    if refusal is not None:
        with pytest.raises(OpsetConversionError) as raised:
            convert(model, target)
        assert str(raised.value) == refusal
        return
    assert_converts(model, feeds, target)


@pytest.mark.parametrize("name", ["elman", "cond", "scan-in-loop", "loop-in-scan"])
def test_input_model_is_not_changed(name: str) -> None:
    model = ir.serde.deserialize_model(real_model(name)[0])
    before = ir.serde.serialize_model(model).SerializeToString(deterministic=True)
    for target in (17, 10, 8):
        convert_model(model, target)
    assert ir.serde.serialize_model(model).SerializeToString(deterministic=True) == before


# -- Slice with bounds known only at run time -----------------------------------------------------

INT64_MAX = np.iinfo(np.int64).max
BOUNDS = [0, 1, 3, 5, 7, -1, -3, -5, -7, INT64_MAX, -INT64_MAX, INT64_MIN]


def runtime_slice(step: int, length: int | str) -> onnx.ModelProto:
    """``data[start:end:step]`` on axis 0, with ``start`` and ``end`` inputs of the model, as
    torch.onnx exports ``x[: x.shape[0] - k]`` and flips of an axis of dynamic length."""
    return build(
        [oh.make_node("Slice", ["data", "start", "end", "axes", "steps"], ["sliced"])],
        [info("data", F32, [length, 2]), info("start", I64, [1]), info("end", I64, [1])],
        [info("sliced", F32)],
        [const("axes", [0], np.int64), const("steps", [step], np.int64)],
    )


def spec_slice(data: np.ndarray, start: int, end: int, step: int) -> np.ndarray:
    """Slice-10 on axis 0 as its specification states it: negative bounds count from the back,
    then ``start`` is clamped to [0, dim] for a positive step and [0, dim - 1] for a negative
    one, ``end`` to [0, dim] and [-1, dim - 1]. (onnxruntime departs from it for an ``end`` of
    INT64_MAX with a negative step, which it takes to mean the front of the axis.)"""
    dim = len(data)
    start, end = (b + dim if b < 0 else b for b in (start, end))
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return data[list(range(start, end, step))]


@pytest.mark.parametrize("target", [9, 8], ids=lambda t: f"opset{t}")
@pytest.mark.parametrize("length", [5, "n"], ids=["static", "dynamic"])
@pytest.mark.parametrize("step", [1, 2, -1, -2])
def test_slice_bounds_computed_at_run_time(step: int, length: int | str, target: int) -> None:
    """Slice-1 takes its bounds as attributes: the converted model clamps them as Slice-10 does
    and gathers the indices they select."""
    lowered = converted(runtime_slice(step, length), target)
    data = normal(5, 2)
    for start, end in itertools.product(BOUNDS, BOUNDS):
        feeds = {"data": data, "start": np.array([start]), "end": np.array([end])}
        assert_same([spec_slice(data, start, end, step)], run(lowered, feeds))


def test_flip_of_a_dynamic_axis_converts_to_opset_9() -> None:
    model = runtime_slice(-1, "n")
    model.graph.node[0].input[1:3] = ["minus_one", "minus_max"]
    model.graph.input.pop()
    model.graph.input.pop()
    model.graph.initializer.extend(
        [const("minus_one", [-1], np.int64), const("minus_max", [-INT64_MAX], np.int64)]
    )
    for target in (9, 8):
        lowered = converted(model, target)
        for n in (0, 1, 4):
            data = normal(n, 2)
            assert_same([data[::-1]], run(lowered, {"data": data}))


# -- Min and Max of integers ----------------------------------------------------------------------


def min_max(elem: int) -> onnx.ModelProto:
    return build(
        [
            oh.make_node("Min", ["a", "b", "c"], ["smallest"]),
            oh.make_node("Max", ["a", "b"], ["largest"]),
            oh.make_node("Min", ["a"], ["alone"]),
        ],
        [info("a", elem, [2, 3]), info("b", elem, [3]), info("c", elem, [1, 1])],
        [info(name, elem) for name in ("smallest", "largest", "alone")],
    )


def integers(dtype: type, *shape: int) -> np.ndarray:
    info_ = np.iinfo(dtype)
    edges = np.array([info_.min, info_.max, 0, -1, 1], dtype=dtype)
    return _rng.choice(np.concatenate([edges, _rng.integers(-9, 9, 8).astype(dtype)]), shape)


@pytest.mark.parametrize("target", [11, 10, 9])
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int8])
def test_min_and_max_of_integers_convert_below_opset_12(dtype: type, target: int) -> None:
    """Min-8 and Max-8 take floats only; integers are compared and selected instead."""
    elem = oh.np_dtype_to_tensor_dtype(np.dtype(dtype))
    model = min_max(elem)
    lowered = converted(model, target)
    for _ in range(5):
        a, b, c = integers(dtype, 2, 3), integers(dtype, 3), integers(dtype, 1, 1)
        feeds = {"a": a, "b": b, "c": c}
        assert_same([np.minimum(np.minimum(a, b), c), np.maximum(a, b), a], run(lowered, feeds))


def test_min_of_int64_converts_to_opset_8() -> None:
    """Less-7 compares floats only, and no float holds every int64: the comparison is made on
    the 32-bit halves (see the comparisons below)."""
    lowered = converted(min_max(I64), 8)
    for _ in range(5):
        a, b, c = integers(np.int64, 2, 3), integers(np.int64, 3), integers(np.int64, 1, 1)
        assert_same(
            [np.minimum(np.minimum(a, b), c), np.maximum(a, b), a],
            run(lowered, {"a": a, "b": b, "c": c}),
        )


def test_min_of_int32_converts_to_opset_8() -> None:
    lowered = converted(min_max(I32), 8)
    a, b, c = integers(np.int32, 2, 3), integers(np.int32, 3), integers(np.int32, 1, 1)
    assert_same(
        [np.minimum(np.minimum(a, b), c), np.maximum(a, b), a],
        run(lowered, {"a": a, "b": b, "c": c}),
    )


# -- body outputs that are constants --------------------------------------------------------------


def invariant_body_outputs(op: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A loop whose body emits initializers of its own as outputs, as onnxscript's optimizer
    leaves a body that returns a captured weight or ``torch.zeros_like`` of a static shape: the
    new carry ``z`` and the output ``y`` of every step (and, for a Loop, its condition) are
    constants of the body, which the body also reads. A Scan is also nested in a Scan, its inner
    body emitting a constant."""
    weight, zeros = normal(B, H), np.zeros((B, H), np.float32)
    body_constants = [const(f"{op}_w", weight), const(f"{op}_zeros", zeros)]
    if op == "loop":
        body = oh.make_graph(
            [oh.make_node("Add", ["s", "z"], ["s_sum"]),
             oh.make_node("Add", ["s_sum", "loop_w"], ["s_next"])], "body",
            [info("i", I64, []), info("cond", BOOL, []), info("s", F32, [B, H]),
             info("z", F32, [B, H])],
            [info("loop_yes", BOOL, []), info("s_next", F32, [B, H]),
             info("loop_zeros", F32, [B, H]), info("loop_w", F32, [B, H])],
            [*body_constants, const("loop_yes", True)],
        )  # fmt: skip
        node = oh.make_node("Loop", ["n", "", "s0", "z0"], ["s_last", "z_last", "ys"], body=body)
        inputs = [info("n", I64, []), info("s0", F32, [B, H]), info("z0", F32, [B, H])]
        feeds = {"n": np.array(4, np.int64)}
    else:
        step = [
            oh.make_node("Add", ["s", "z"], ["s_sum"]),
            oh.make_node("Add", ["s_sum", f"{op}_w"], ["s_weighted"]),
            oh.make_node("Add", ["s_weighted", "x"], ["s_next"]),
        ]
        y = f"{op}_w"
        if op == "scan-in-scan":
            inner = oh.make_graph(
                [oh.make_node("Add", ["a", "v"], ["a_next"])], "inner",
                [info("a", F32, [H]), info("v", F32, [H])],
                [info("a_next", F32, [H]), info("inner_w", F32, [H])],
                [const("inner_w", weight[0])],
            )  # fmt: skip
            step.append(
                oh.make_node("Scan", ["row", "x"], ["a_last", "ws"], body=inner,
                             num_scan_inputs=1)
            )  # fmt: skip
            y = "ws"
        body = oh.make_graph(
            step, "body",
            [info("s", F32, [B, H]), info("z", F32, [B, H]), info("x", F32, [B, H])],
            [info("s_next", F32, [B, H]), info(f"{op}_zeros", F32, [B, H]),
             info(y, F32, [B, H])],
            body_constants,
        )  # fmt: skip
        node = oh.make_node(
            "Scan", ["s0", "z0", "xs"], ["s_last", "z_last", "ys"], body=body, num_scan_inputs=1
        )
        inputs = [info("s0", F32, [B, H]), info("z0", F32, [B, H]), info("xs", F32, [T, B, H])]
        feeds = {"xs": normal(T, B, H)}
    outputs = [info("s_last", F32, [B, H]), info("z_last", F32, [B, H]), info("ys", F32)]
    model = build([node], inputs, outputs, [const("row", np.zeros(H, np.float32))])
    return model, {**feeds, "s0": normal(B, H), "z0": normal(B, H)}


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"opset{t}")
@pytest.mark.parametrize("op", ["scan", "loop", "scan-in-scan"])
def test_body_outputs_that_are_constants_stay_computed_in_the_body(op: str, target: int) -> None:
    """IR 3 (opset 8) wants every initializer to be an input of the main graph, so those of
    bodies move there; a body output must still be computed by a node of the body."""
    model, feeds = invariant_body_outputs(op)
    lowered = converted(model, target)
    assert_same(run(model, feeds), run(lowered, feeds))


# -- comparisons of 64-bit integers at opset 8 ----------------------------------------------------


def edge_integers(dtype: type) -> np.ndarray:
    """The edges of ``dtype``, of the 32-bit halves and of double's exact integers, and random
    values of every magnitude."""
    info_ = np.iinfo(dtype)
    around = [0, 1, 2**31, 2**32, 2**33, 2**52, 2**53, 2**62, info_.max]
    values = {info_.min, info_.min + 1, info_.max - 1}
    for v in around:
        for d in (-1, 0, 1):
            values |= {v + d, -v + d}
    values = [v for v in values if info_.min <= v <= info_.max]
    randoms = _rng.integers(info_.min, info_.max, 40, dtype=dtype, endpoint=True)
    small = _rng.integers(-5, 5, 8) if info_.min < 0 else _rng.integers(0, 5, 8)
    return np.concatenate([np.array(values, dtype=dtype), randoms, small.astype(dtype)])


@pytest.mark.parametrize("dtype", [np.int64, np.uint64])
def test_64_bit_integer_comparisons_convert_to_opset_8(dtype: type) -> None:
    """Less-7 and Greater-7 take floats only: 64-bit integers are compared as their 32-bit
    halves, which double holds exactly. Every pair of edge values, against numpy."""
    elem = oh.np_dtype_to_tensor_dtype(np.dtype(dtype))
    values = edge_integers(dtype)
    model = build(
        [oh.make_node("Less", ["a", "b"], ["less"]), oh.make_node("Greater", ["a", "b"],
                                                                    ["greater"])],
        [info("a", elem, [len(values), 1]), info("b", elem, [len(values)])],
        outputs_of("less", "greater", elem=BOOL),
    )  # fmt: skip
    lowered = converted(model, 8)
    assert {n.op_type for n in lowered.graph.node} >= {"Div", "Less", "Greater"}
    a, b = values[:, None], values
    assert_same([np.less(a, b), np.greater(a, b)], run(lowered, {"a": a, "b": b}))


@pytest.mark.parametrize("target", [11, 10, 9, 8], ids=lambda t: f"opset{t}")
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int8])
@pytest.mark.parametrize("bounds", ["both", "low", "high"])
def test_clip_of_integers_converts_below_opset_12(bounds: str, dtype: type, target: int) -> None:
    """Clip-11 and Clip-6 take floats only; integers are clipped by comparing and selecting.
    A low bound above the high one gives the high one, as Clip and numpy do."""
    elem = oh.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inputs = {"both": ["x", "low", "high"], "low": ["x", "low"], "high": ["x", "", "high"]}
    model = build(
        [oh.make_node("Clip", inputs[bounds], ["clipped"])],
        [info("x", elem, [6]), info("low", elem, [])],
        outputs_of("clipped", elem=elem),
        [const("high", 9, dtype)],
    )
    lowered = converted(model, target)
    high = None if bounds == "low" else dtype(9)
    for low in (dtype(0), dtype(3), dtype(12)):
        x = integers(dtype, 6)
        expected = np.clip(x, None if bounds == "high" else low, high)
        assert_same([expected], run(lowered, {"x": x, "low": np.array(low)}))


def test_an_adapter_is_registered_once_per_domain_operator_and_version() -> None:
    from torchscan.onnx._export._convert._registry import AdapterRegistry

    def adapter(node, ctx, boundary):
        return [node]

    registry = AdapterRegistry()
    registry.register("", ["Foo", "Bar"], 9, 11)(adapter)
    assert registry.lookup("ai.onnx", "Foo", 11) is adapter  # the alias of the default domain
    assert registry.lookup("", "Foo", 10) is None
    assert len(registry) == 4
    with pytest.raises(torchscan.TorchscanValueError) as info:
        registry.add("ai.onnx", "Bar", 9, adapter)
    assert str(info.value) == (
        "torchscan.onnx: an adapter is already registered for ('', 'Bar', 9)"
    )


def test_an_operator_is_declared_by_one_class() -> None:
    """``adapters`` registers a class's ``below_N`` for each of its operators at boundary
    ``N``, records the class, and refuses a second class for an operator."""
    from torchscan.onnx._export._convert._registry import AdapterRegistry

    def adapter(node, ctx, boundary):
        return [node]

    registry = AdapterRegistry()

    @registry.declare("Foo", "Bar")
    class FooBar:
        below_9 = adapter

        @staticmethod
        def below_11(node, ctx, boundary):
            return [node]

    assert registry.lookup("ai.onnx", "Foo", 9) is adapter
    assert registry.lookup("", "Bar", 11) is FooBar.below_11
    assert registry.declared_by("ai.onnx", "Bar") is FooBar
    assert registry.declared_by("", "Baz") is None
    assert len(registry) == 4
    with pytest.raises(
        torchscan.TorchscanValueError, match=r"adapters of Bar are declared by .*\.FooBar already"
    ):

        @registry.declare("Baz", "Bar")
        class Bar:
            below_13 = adapter

    assert (registry.lookup("", "Bar", 13), registry.lookup("", "Baz", 13)) == (None, None)
    with pytest.raises(torchscan.TorchscanValueError, match="declares no adapter"):

        @registry.declare("Baz")
        class Nothing:
            def adapt(self, node, ctx, boundary):
                return [node]


def _adapter_modules() -> dict[str, types.ModuleType]:
    """The modules of ``torchscan.onnx._export._convert`` that declare adapters, by name,
    imported."""
    import importlib
    from pathlib import Path

    import torchscan.onnx._export._convert as package

    root = Path(package.__file__).parent
    return {
        path.stem: importlib.import_module(f"{package.__name__}.{path.stem}")
        for path in sorted(root.glob("_ops_*.py"))
    }


def test_every_operators_adapters_are_declared_together_in_one_class() -> None:
    """Every registered ``(domain, op, b)`` is ``version_b`` of the one class that declares the
    adapters of ``op``, a class of an ``_ops_*`` module, and every ``below_N`` of that class is
    registered for ``op``: all of an operator's versions are in one place. A class with adapters
    that declares no operator (its decorator forgotten) fails too."""
    from torchscan.onnx._export._convert import _converter  # noqa: F401  (it imports every adapter)
    from torchscan.onnx._export._convert._registry import registry, versions_of

    modules = _adapter_modules()
    assert {"_ops_shape", "_ops_reduce", "_ops_gather", "_ops_control"} <= set(modules)
    versions: dict[tuple[str, str], set[int]] = {}
    for domain, op, since in registry:
        versions.setdefault((domain, op), set()).add(since)
    declaring = {}
    for (domain, op), registered in versions.items():
        cls = registry.declared_by(domain, op)
        assert cls is not None, f"{op} is registered without a class that declares it"
        assert cls.__module__.rpartition(".")[2] in modules, (op, cls.__module__)
        declared = versions_of(cls)
        assert set(declared) == registered, (op, cls.__qualname__)
        for since in registered:
            assert registry.lookup(domain, op, since) is declared[since], (op, since)
        declaring.setdefault(cls, []).append(op)
    for name, module in modules.items():
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and value.__module__ == module.__name__
                and versions_of(value)
            ):
                assert value in declaring, f"{name}.{value.__qualname__} declares no operator"
    # one class per operator: no operator's name is in two classes
    named = [op for ops in declaring.values() for op in ops]
    assert len(named) == len(set(named))


def test_adapters_make_nodes_only_with_the_builder() -> None:
    """The context makes no node; the adapters, their shared rewrites and building blocks, and
    the walk make every node with ``Builder`` (the whole-model steps of ``__init__`` make one
    Identity of their own, and the context's ``splice`` takes the nodes onnx made)."""
    import re
    from pathlib import Path

    import torchscan.onnx._export._convert as package
    from torchscan.onnx._export._convert._context import Context

    assert not hasattr(Context, "make_node")
    root = Path(package.__file__).parent
    checked = [p for p in root.glob("*.py") if p.name not in ("__init__.py", "_context.py")]
    assert len(checked) >= 10
    for path in checked:
        text = path.read_text()
        assert not re.search(r"\bir\.(?:Node|node)\(|make_node\(", text), path.name


def test_the_adapter_modules_import_no_other_adapter_module() -> None:
    """An ``_ops_*`` module imports the context, the registry, ``_helpers`` and ``_blocks``,
    never another ``_ops_*`` module: an operator's adapters need no other family's."""
    import ast
    from pathlib import Path

    for name, module in _adapter_modules().items():
        tree = ast.parse(Path(module.__file__).read_text())
        imported = {
            node.module
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module
        }
        assert not [m for m in imported if "._ops_" in m], name


def _emitted_ops() -> set[str]:
    """The default-domain operators that torchscan's own code builds nodes of: the translations,
    the passes and the adapters (as they name them in ``make_node("Op", ...)``,
    ``ir.node("Op", ...)``, ``ir.Node("", "Op", ...)`` and, in the adapters, the ``Builder``'s
    ``b.op("Op", ...)`` and ``b.node("Op", ...)``)."""
    import re
    from pathlib import Path

    import torchscan.onnx

    root = Path(torchscan.onnx.__file__).parent / "_export"
    found: set[str] = set()
    for path in [*root.glob("*.py"), *root.glob("_convert/*.py")]:
        text = path.read_text()
        found |= set(
            re.findall(r'(?:make_node|ir\.node|_node|\.node|\.op)\(\s*"([A-Z][A-Za-z]+)"', text)
        )
        found |= set(re.findall(r'ir\.Node\(\s*"",\s*"([A-Z][A-Za-z]+)"', text))
    return found


REFUSED_BELOW_FIRST_VERSION = {"IsNaN": 9, "NonZero": 9}
"""Operators torchscan emits that have no form before their first version: converting a model
that holds one below it is refused, naming the operator (an IsInf adapter emits IsNaN, so
IsInf is refused at opset 8; ``_blocks.arange`` emits NonZero at opset 9 and later only, a Loop
below)."""


def test_every_operator_torchscan_emits_converts_below_its_first_version_or_is_refused() -> None:
    from torchscan.onnx._export._convert._registry import registry

    emitted = _emitted_ops()
    assert {"Scan", "Loop", "If", "Reshape", "ConstantOfShape"} <= emitted
    first = {
        op: min(
            s.since_version
            for s in onnx.defs.get_all_schemas_with_history()
            if s.name == op and s.domain == ""
        )
        for op in emitted
    }
    unadapted = {
        op: since
        for op, since in first.items()
        if since > 8 and registry.lookup("", op, since) is None
    }
    assert unadapted == REFUSED_BELOW_FIRST_VERSION
    for op, since in REFUSED_BELOW_FIRST_VERSION.items():
        graph = oh.make_graph(
            [oh.make_node(op, ["x"], ["y"], name="the_node")],
            "g",
            [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
            [oh.make_tensor_value_info("y", onnx.TensorProto.BOOL, [2])],
        )
        model = ir.from_proto(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)]))
        with pytest.raises(torchscan.onnx.OpsetConversionError) as info:
            convert_model(model, since - 1)
        assert (info.value.op, info.value.node) == (op, "the_node")
