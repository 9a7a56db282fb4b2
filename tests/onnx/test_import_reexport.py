"""Imported modules export again (``torch.onnx.export`` of ``torchscan.onnx.to_torch``'s
module) with the same loops, and onnxruntime computes with the export what it computes with the
model imported: models of torch's older exporter (integer ``Constant`` nodes), ``If`` branches
holding ``Constant`` nodes, ``TopK``; the rest are the export tests' ``check_reexported``."""

from __future__ import annotations

import io
import json
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper
import pytest
import torch

import torchscan
import torchscan.onnx

from .._export import onnx_export
from ._roundtrip import EVERY_PAIR
from ._runtimes import run_onnxruntime_on

F = onnx.TensorProto.FLOAT


def _op_types(graph: onnx.GraphProto) -> list[str]:
    found = []
    for node in graph.node:
        found.append(node.op_type)
        for attribute in node.attribute:
            if attribute.HasField("g"):
                found += _op_types(attribute.g)
    return found


def _agree(first: onnx.ModelProto, second: onnx.ModelProto, inputs: list[np.ndarray]) -> None:
    """onnxruntime computes the same outputs with both models, at every optimization level."""
    want = run_onnxruntime_on(
        first, dict(zip([i.name for i in first.graph.input], inputs, strict=True))
    )
    got = run_onnxruntime_on(
        second, dict(zip([i.name for i in second.graph.input], inputs, strict=True))
    )
    for level, outputs in got.items():
        for g, w in zip(outputs, want[level], strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=level)


class _GruScan(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = torch.nn.GRUCell(3, 4)

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        def step(h: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            h = self.cell(x, h)
            return h, h

        return torchscan.scan(step, xs.new_zeros(xs.shape[1], 4), xs)[1]


def test_a_scan_exported_for_every_length_exports_again_with_one_scan() -> None:
    """``Dim.DYNAMIC`` allows length 0, so the export guards the empty sequence with ``If``s
    on the length; imported, those conditions are taken in Python where the trace decides them,
    and the module exports again with one Scan (guarded again), right at every length."""
    torch.manual_seed(0)
    eager = _GruScan().eval()
    dynamic = {0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC}
    model = onnx_export(
        eager, (torch.randn(5, 2, 3),), dynamo=True, dynamic_shapes=(dynamic,)
    ).model_proto
    assert "If" in _op_types(model.graph)
    module = torchscan.onnx.to_torch(model).eval()
    again = onnx_export(
        module, (torch.randn(5, 2, 3),), dynamo=True, dynamic_shapes=(dynamic,)
    ).model_proto
    assert _op_types(again.graph).count("Scan") == 1
    for length in (0, 1, 9):
        xs = np.random.default_rng(length).standard_normal((length, 3, 3)).astype(np.float32)
        _agree(model, again, [xs])
        with torch.no_grad():
            expected = eager(torch.from_numpy(xs)).numpy()
        for outputs in run_onnxruntime_on(again, {again.graph.input[0].name: xs}).values():
            np.testing.assert_allclose(outputs[0], expected, rtol=1e-5, atol=1e-6)


class _Tagger(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = torch.nn.LSTM(3, 4, batch_first=True, bidirectional=True)

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        y, _ = self.rnn(xs)
        return y.reshape(y.shape[0], -1, 2, 4).sum(2)


def test_a_model_of_torch_s_older_exporter_exports_again_with_its_lstm_as_a_scan() -> None:
    """Its shapes are computed with integer ``Constant`` nodes (``Gather(Shape(x), 0)``,
    ``Unsqueeze``, ``Concat``, ``Reshape``), which trace as the constants they are."""
    torch.manual_seed(0)
    eager = _Tagger().eval()
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the older exporter's deprecation)
        torch.onnx.export(
            eager,
            (torch.randn(2, 5, 3),),
            buffer,  # type: ignore[arg-type]  (the older exporter writes to a file object)
            dynamo=False,
            input_names=["xs"],
            dynamic_axes={"xs": {0: "B", 1: "T"}},
            opset_version=14,
        )
    model = onnx.load_from_string(buffer.getvalue())
    assert "LSTM" in _op_types(model.graph)
    assert any(
        n.op_type == "Constant" and n.attribute[0].t.data_type == onnx.TensorProto.INT64
        for n in model.graph.node
    )
    module = torchscan.onnx.to_torch(model).eval()
    dims = {0: torch.export.Dim("B"), 1: torch.export.Dim("T")}
    again = onnx_export(
        module, (torch.randn(2, 5, 3),), dynamo=True, opset_version=17, dynamic_shapes=(dims,)
    ).model_proto
    assert _op_types(again.graph).count("Scan") == 1  # (both directions in one, as imported)
    assert "LSTM" not in _op_types(again.graph)
    xs = np.random.default_rng(1).standard_normal((3, 9, 3)).astype(np.float32)
    _agree(model, again, [xs])
    with torch.no_grad():
        np.testing.assert_allclose(
            next(iter(run_onnxruntime_on(again, {again.graph.input[0].name: xs}).values()))[0],
            eager(torch.from_numpy(xs)).numpy(),
            rtol=1e-5,
            atol=1e-6,
        )


def _branchy_model() -> onnx.ModelProto:
    """``y = x * 2 if sum(x) > 0 else x - 1`` (each branch's constant a ``Constant`` of
    ``value_float``), then the two largest of each row (``TopK``, ties to the lower index)."""

    def branch(name: str, op: str, value: float) -> onnx.GraphProto:
        return oh.make_graph(
            [
                oh.make_node("Constant", [], [f"{name}_c"], value_float=value),
                oh.make_node(op, ["x", f"{name}_c"], [f"{name}_y"]),
            ],
            name,
            [],
            [oh.make_tensor_value_info(f"{name}_y", F, ["B", 4])],
        )

    k = onnx.numpy_helper.from_array(np.array([2], np.int64))
    graph = oh.make_graph(
        [
            oh.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
            oh.make_node("Constant", [], ["zero"], value_float=0.0),
            oh.make_node("Greater", ["s", "zero"], ["c"]),
            oh.make_node(
                "If",
                ["c"],
                ["y"],
                then_branch=branch("then", "Mul", 2.0),
                else_branch=branch("else", "Sub", 1.0),
            ),
            oh.make_node("Constant", [], ["k"], value=k),
            oh.make_node("TopK", ["y", "k"], ["v", "i"], axis=-1),
        ],
        "g",
        [oh.make_tensor_value_info("x", F, ["B", 4])],
        [
            oh.make_tensor_value_info("v", F, ["B", 2]),
            oh.make_tensor_value_info("i", onnx.TensorProto.INT64, ["B", 2]),
        ],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def test_a_branch_of_constants_and_topk_export_again_as_an_if_and_a_topk() -> None:
    model = _branchy_model()
    module = torchscan.onnx.to_torch(model).eval()
    again = onnx_export(
        module,
        (torch.randn(3, 4),),
        dynamo=True,
        opset_version=17,
        dynamic_shapes=({0: torch.export.Dim("B")},),
    ).model_proto
    assert {"If", "TopK"} <= set(_op_types(again.graph))
    ties = np.array([[1, 3, 3, 0], [2, 2, 2, 2]], np.float32)
    for x in (np.random.default_rng(2).standard_normal((5, 4)).astype(np.float32), ties, -ties):
        _agree(model, again, [x])


def test_an_output_that_is_a_constant_of_the_model_is_a_copy() -> None:
    """Changing an output in place leaves the module's constants as they are."""
    graph = oh.make_graph(
        [oh.make_node("Constant", [], ["c"], value_floats=[1.0, 2.0])],
        "g",
        [],
        [oh.make_tensor_value_info("c", F, [2])],
    )
    module = torchscan.onnx.to_torch(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]))
    module().add_(10)
    torch.testing.assert_close(module(), torch.tensor([1.0, 2.0]))


JAX2ONNX = Path(__file__).parent / "data" / "jax2onnx"


_JAX2ONNX_SAMPLE = ["cond_branch.onnx", "fori_power.onnx", "scan_nested.onnx", "while_newton.onnx"]
"""A model of each kind jax2onnx writes (lax.cond, fori_loop, a nested scan, while_loop), which
the test command exports again; every one of the 18 with ``TORCHSCAN_TEST_ALL_OPSETS=1``."""


def _jax2onnx_models() -> list[str]:
    every = sorted(json.loads((JAX2ONNX / "manifest.json").read_text()))
    return every if EVERY_PAIR else [name for name in every if name in _JAX2ONNX_SAMPLE]


@pytest.mark.parametrize("name", _jax2onnx_models())
def test_a_jax2onnx_model_exports_again_with_its_loops_and_branches(name: str) -> None:
    """jax2onnx's ``Loop`` and ``If`` nodes, imported and exported again, are the same nodes,
    and onnxruntime computes with the export what it computes with jax2onnx's model."""
    manifest = json.loads((JAX2ONNX / "manifest.json").read_text())
    model = onnx.load(JAX2ONNX / name)
    arrays = np.load(JAX2ONNX / manifest[name]["data"][0])
    inputs = [arrays[f"input_{i}"] for i in range(len(model.graph.input))]
    module = torchscan.onnx.to_torch(model).eval()
    again = onnx_export(module, tuple(torch.from_numpy(i) for i in inputs), dynamo=True)
    kinds = ("Scan", "Loop", "If")
    assert sorted(n.op_type for n in again.model_proto.graph.node if n.op_type in kinds) == sorted(
        n.op_type for n in model.graph.node if n.op_type in kinds
    )
    _agree(model, again.model_proto, inputs)


# What torch.export cannot trace, refused naming the node

I64 = onnx.TensorProto.INT64


def _model(nodes: list, inputs: list, outputs: list, initializers: list) -> onnx.ModelProto:
    graph = oh.make_graph(nodes, "g", inputs, outputs, initializers)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def _ints(**values: list[int] | int) -> list[onnx.TensorProto]:
    return [onnx.numpy_helper.from_array(np.array(v, np.int64), k) for k, v in values.items()]


def _scan_over_a_range_of_the_data() -> onnx.ModelProto:
    """A Scan over ``xs`` and ``Range(0, sum(n))``: its length is a value of the data."""
    body = oh.make_graph(
        [oh.make_node("Add", ["s", "a"], ["t"]), oh.make_node("Add", ["t", "b"], ["s_out"])],
        "body",
        [oh.make_tensor_value_info(n, F, [1]) for n in ("s", "a", "b")],
        [oh.make_tensor_value_info("s_out", F, [1])],
    )
    nodes = [
        oh.make_node("ReduceSum", ["n"], ["total"], keepdims=0),
        oh.make_node("Range", ["zero", "total", "one"], ["r"]),
        oh.make_node("Cast", ["r"], ["rf"], to=F),
        oh.make_node("Unsqueeze", ["rf", "last"], ["steps"]),
        oh.make_node("Scan", ["s0", "steps", "xs"], ["s"], num_scan_inputs=2, body=body, name="sc"),
    ]
    return _model(
        nodes,
        [
            oh.make_tensor_value_info("n", I64, ["B"]),
            oh.make_tensor_value_info("s0", F, [1]),
            oh.make_tensor_value_info("xs", F, ["T", 1]),
        ],
        [oh.make_tensor_value_info("s", F, [1])],
        _ints(zero=0, one=1, last=[-1]),
    )


def _if_of_the_data_whose_branch_reads_sizes() -> onnx.ModelProto:
    """``If(sum(x) > 0)`` whose then branch reshapes ``x`` to a shape computed from its size."""
    then = oh.make_graph(
        [
            oh.make_node("Shape", ["x"], ["shape"]),
            oh.make_node("Slice", ["shape", "start", "end"], ["batch"]),
            oh.make_node("Concat", ["batch", "rest"], ["new"], axis=0),
            oh.make_node("Reshape", ["x", "new"], ["t"]),
        ],
        "then",
        [],
        [oh.make_tensor_value_info("t", F, ["B", 6])],
    )
    other = oh.make_graph(
        [oh.make_node("Flatten", ["x"], ["e"], axis=1)],
        "else",
        [],
        [oh.make_tensor_value_info("e", F, ["B", 6])],
    )
    nodes = [
        oh.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        oh.make_node("Constant", [], ["zero"], value_float=0.0),
        oh.make_node("Greater", ["total", "zero"], ["c"]),
        oh.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="branch"),
    ]
    return _model(
        nodes,
        [oh.make_tensor_value_info("x", F, ["B", 2, 3])],
        [oh.make_tensor_value_info("y", F, ["B", 6])],
        _ints(start=[0], end=[1], rest=[-1]),
    )


def _seeded_noise() -> onnx.ModelProto:
    nodes = [
        oh.make_node("RandomNormalLike", ["x"], ["r"], seed=3.0, name="noise"),
        oh.make_node("Add", ["r", "x"], ["y"]),
    ]
    declared = [oh.make_tensor_value_info(n, F, ["B", 2]) for n in ("x", "y")]
    return _model(nodes, declared[:1], declared[1:], [])


@pytest.mark.parametrize(
    ("make", "args", "refusal"),
    [
        (
            _scan_over_a_range_of_the_data,
            (torch.tensor([1, 2]), torch.zeros(1), torch.ones(3, 1)),
            r"node 'sc' \(Scan-16\) of the main graph: torch\.export cannot trace it: a size it "
            r"needs depends on values computed from the data \(Could not guard",
        ),
        (
            _if_of_the_data_whose_branch_reads_sizes,
            (torch.randn(4, 2, 3),),
            r"node 'branch' \(If-16\) of the main graph: torch\.export cannot trace it: its "
            r"condition depends on the data, so its branches are traced by TorchDynamo",
        ),
        (
            _seeded_noise,
            (torch.randn(3, 2),),
            r"node 'noise' \(RandomNormalLike-1\) of the main graph: torch\.export cannot trace "
            r"it: its seed makes every run draw the same values",
        ),
    ],
    ids=["size-from-data", "if-of-data", "seeded-random"],
)
def test_what_torch_export_cannot_trace_is_refused_naming_the_node(make, args, refusal) -> None:
    module = torchscan.onnx.to_torch(make()).eval()
    module(*args)  # (eagerly, it runs)
    dims = ({0: torch.export.Dim("B")}, *(None for _ in args[1:]))  # (a dynamic batch)
    with pytest.raises(Exception, match=refusal):
        onnx_export(module, args, dynamo=True, dynamic_shapes=dims)
