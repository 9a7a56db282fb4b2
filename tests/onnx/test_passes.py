"""The export as named passes over onnx_ir models (src/torchscan/onnx/_export/_passes.py): each pass
alone, their order, and a model without loops passed to torch.onnx untouched."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest

import torchscan
from torchscan.onnx._export import _empty_loops, _passes

from .test_export_errors import hand_built
from .test_hoist_bodies import SCAN_INPUTS, scan_model


def _model_of(graph: ir.Graph) -> ir.Model:
    return ir.Model(graph, ir_version=8)


def test_check_loop_types_refuses_what_the_target_does_not_allow() -> None:
    bfloat16 = onnx.TensorProto.BFLOAT16
    model = _model_of(hand_built("Scan", bfloat16, 16))
    assert _passes.CheckLoopTypes(16)(model).modified is False
    with pytest.raises(torchscan.ExportError, match=r"^torch\.onnx\.export: the Scan node"):
        _passes.CheckLoopTypes(15)(_model_of(hand_built("Scan", bfloat16, 15)))


def _loop_that_may_run_no_iteration() -> ir.Model:
    f = onnx.TensorProto.FLOAT
    body = oh.make_graph(
        [
            oh.make_node("Identity", ["c_in"], ["c_out"]),
            oh.make_node("Identity", ["s_in"], ["s_out"]),
            oh.make_node("Identity", ["s_in"], ["y"]),
        ],
        "body",
        [
            oh.make_tensor_value_info("i", onnx.TensorProto.INT64, []),
            oh.make_tensor_value_info("c_in", onnx.TensorProto.BOOL, []),
            oh.make_tensor_value_info("s_in", f, ["B", 3]),
        ],
        [
            oh.make_tensor_value_info("c_out", onnx.TensorProto.BOOL, []),
            oh.make_tensor_value_info("s_out", f, ["B", 3]),
            oh.make_tensor_value_info("y", f, ["B", 3]),
        ],
    )
    loop = oh.make_node("Loop", ["m", "", "s0"], ["final", "ys"], body=body, name="loop")
    graph = oh.make_graph(
        [loop],
        "g",
        [
            oh.make_tensor_value_info("m", onnx.TensorProto.INT64, []),
            oh.make_tensor_value_info("s0", f, ["B", 3]),
        ],
        [oh.make_tensor_value_info("final", f, None), oh.make_tensor_value_info("ys", f, None)],
    )
    model = ir.from_proto(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)]))
    next(n for n in model.graph if n.op_type == "Loop").meta[_empty_loops.MAY_RUN_NO_ITERATION] = (
        True
    )
    return model


def test_shape_empty_loops_gives_zero_iterations_the_step_shape() -> None:
    import onnxruntime as ort

    model = _loop_that_may_run_no_iteration()
    assert _passes.ShapeEmptyLoops()(model).modified is True
    assert "Reshape" in [n.op_type for n in model.graph]
    data = ir.serde.serialize_model(model).SerializeToString()
    s0 = np.ones((2, 3), dtype=np.float32)
    for level in (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    ):
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
        _, ys = session.run(None, {"m": np.array(0, dtype=np.int64), "s0": s0})
        assert ys.shape == (0, 2, 3)
        _, ys = session.run(None, {"m": np.array(4, dtype=np.int64), "s0": s0})
        np.testing.assert_array_equal(ys, np.stack([s0] * 4))
    assert _passes.ShapeEmptyLoops()(model).modified is False  # the mark is used once


def test_hoist_loop_invariants_moves_per_step_work_out() -> None:
    model = scan_model(
        [
            oh.make_node("Mul", ["x", "x"], ["x2"]),
            oh.make_node("Add", ["s", "x2"], ["s_out"]),
            oh.make_node("Identity", ["s_out"], ["y"]),
        ],
        SCAN_INPUTS,
    )
    assert _passes.HoistLoopInvariants(18)(model).modified is True
    scan = next(n for n in model.graph if n.op_type == "Scan")
    body = scan.attributes["body"].as_graph()
    assert "Mul" not in [n.op_type for n in body]
    assert _passes.HoistLoopInvariants(18)(model).modified is False


def test_optimize_runs_the_optimizer_then_drops_unread_sequences() -> None:
    calls: list[ir.Model] = []
    f = onnx.TensorProto.FLOAT
    body = oh.make_graph(
        [oh.make_node("Add", ["s", "b_t"], ["s_out"]), oh.make_node("Identity", ["s_out"], ["y"])],
        "body",
        [oh.make_tensor_value_info(n, f, [2]) for n in ("s", "a_t", "b_t")],
        [oh.make_tensor_value_info(n, f, [2]) for n in ("s_out", "y")],
    )
    scan = oh.make_node("Scan", ["s0", "a", "b"], ["s_n", "ys"], body=body, num_scan_inputs=2)
    graph = oh.make_graph(
        [scan],
        "g",
        [
            oh.make_tensor_value_info(n, f, s)
            for n, s in (("s0", [2]), ("a", [3, 2]), ("b", [3, 2]))
        ],
        [oh.make_tensor_value_info(n, f, None) for n in ("s_n", "ys")],
    )
    model = ir.from_proto(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)]))
    _passes.Optimize(lambda m: calls.append(m) or m)(model)
    assert calls == [model]
    scan_node = next(n for n in model.graph if n.op_type == "Scan")
    assert [v.name for v in scan_node.inputs] == ["s0", "b"]  # a, which the body never read


def test_convert_version_calls_torch_s_conversion_with_the_target() -> None:
    calls = []
    model = scan_model(
        [oh.make_node("Add", ["s", "x"], ["s_out"]), oh.make_node("Identity", ["s_out"], ["y"])],
        SCAN_INPUTS,
    )
    _passes.ConvertVersion(21, lambda m, opset: calls.append((m, opset)) or m)(model)
    assert calls == [(model, 21)]


def _fuse_into_gelu(model: ir.Model) -> ir.Model:
    """An optimizer that writes an operator opset 13 lacks (Gelu, opset 20) into the model."""
    output = model.graph.outputs[0]
    producer = output.producer()
    assert producer is not None
    gelu = ir.node("Gelu", [producer.outputs[0]])
    model.graph.append(gelu)
    model.graph.outputs[0] = gelu.outputs[0]
    return model


def test_convert_down_converts_the_model_as_built_where_the_optimized_one_fails() -> None:
    model = scan_model(
        [oh.make_node("Add", ["s", "x"], ["s_out"]), oh.make_node("Identity", ["s_out"], ["y"])],
        SCAN_INPUTS,
    )
    result = _passes.ConvertDown(13, _fuse_into_gelu)(model)
    assert result.model is model
    assert model.opset_imports[""] == 13
    assert "Gelu" not in [n.op_type for n in model.graph]
    assert model.meta[_passes.OPTIMIZED] is True
    onnx.checker.check_model(ir.serde.serialize_model(model), full_check=True)


def test_convert_down_optimizes_first() -> None:
    seen = []
    model = scan_model(
        [oh.make_node("Add", ["s", "x"], ["s_out"]), oh.make_node("Identity", ["s_out"], ["y"])],
        SCAN_INPUTS,
    )
    _passes.ConvertDown(13, lambda m: seen.append(m.opset_imports[""]) or m)(model)
    assert seen == [18]
    assert model.opset_imports[""] == 13


def _names(sequential: ir.passes.Sequential) -> list[str]:
    return [type(p).__name__ for p in sequential.passes]


def test_the_pipeline_s_order() -> None:
    def keep(m, *_):
        return m

    assert _names(_passes.pipeline(21, convert=keep, optimize=keep)) == [
        "CheckLoopTypes",
        "InlinePass",
        "NameFixPass",
        "ShapeEmptyLoops",
        "HoistLoopInvariants",
        "ConvertVersion",
        "WarnOnnxruntimeGaps",
    ]
    assert _names(_passes.pipeline(13, convert=keep, optimize=keep, hoist=False)) == [
        "CheckLoopTypes",
        "InlinePass",
        "NameFixPass",
        "ShapeEmptyLoops",
        "ConvertDown",
        "WarnOnnxruntimeGaps",
    ]


def test_a_model_without_loops_goes_to_torch_s_functions_untouched() -> None:
    graph = oh.make_graph(
        [oh.make_node("Relu", ["x"], ["y"])],
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])],
    )
    model = ir.from_proto(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)]))
    before = ir.serde.serialize_model(model).SerializeToString()
    calls = []
    assert not _passes.has_loops(model)
    _passes.convert_version(
        model,
        13,
        convert=lambda m, o: calls.append(("convert", o)) or m,
        optimize=None,  # type: ignore[arg-type]
    )
    _passes.optimize(model, optimize=lambda m: calls.append(("optimize",)) or m)
    assert calls == [("convert", 13), ("optimize",)]
    assert ir.serde.serialize_model(model).SerializeToString() == before


def test_loops_are_found_at_any_depth() -> None:
    model = _loop_that_may_run_no_iteration()
    assert _passes.has_loops(model)
    outer = ir.from_proto(
        oh.make_model(
            oh.make_graph(
                [
                    oh.make_node(
                        "If",
                        ["c"],
                        ["y"],
                        then_branch=ir.serde.serialize_graph(model.graph),
                        else_branch=ir.serde.serialize_graph(model.graph),
                    )
                ],
                "g",
                [oh.make_tensor_value_info("c", onnx.TensorProto.BOOL, [])],
                [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
            ),
            opset_imports=[oh.make_opsetid("", 18)],
        )
    )
    assert _passes.has_loops(outer)  # in an If's branches


# -- byte-identical exports of models without loops ------------------------------------------------

MODELS_WITHOUT_LOOPS = textwrap.dedent(
    """
    import hashlib, logging, sys
    import torch

    if sys.argv[1] == "with":
        import torchscan  # noqa: F401
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    torch.manual_seed(0)


    class Block(torch.nn.Module):  # a torchvision-style residual block
        def __init__(self):
            super().__init__()
            self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
            self.bn1 = torch.nn.BatchNorm2d(8)
            self.conv2 = torch.nn.Conv2d(8, 3, 3, padding=1, bias=False)
            self.bn2 = torch.nn.BatchNorm2d(3)
            self.fc = torch.nn.Linear(3, 10)

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            y = torch.relu(self.bn2(self.conv2(y)) + x)
            return self.fc(torch.nn.functional.adaptive_avg_pool2d(y, 1).flatten(1))


    class Encoder(torch.nn.Module):  # a transformer-style encoder with a causal mask
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(20, 16)
            self.layer = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
            self.head = torch.nn.Linear(16, 20)

        def forward(self, tokens):
            n = tokens.shape[1]
            mask = torch.triu(torch.full((n, n), float("-inf")), diagonal=1)
            return self.head(self.layer(self.embed(tokens), src_mask=mask))


    class Recurrent(torch.nn.Module):  # torch's own LSTM, exported as ONNX LSTM
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(4, 8, batch_first=True)

        def forward(self, x):
            return self.lstm(x)[0]


    cases = [
        (Block(), (torch.randn(2, 3, 8, 8),)),
        (Encoder(), (torch.randint(0, 20, (2, 5)),)),
        (Recurrent(), (torch.randn(2, 5, 4),)),
    ]
    for model, args in cases:
        for opset in (int(o) for o in sys.argv[2].split(",")):
            program = torch.onnx.export(
                model.eval(), args, dynamo=True, opset_version=opset, verbose=False
            )
            data = program.model_proto.SerializeToString()
            print(type(model).__name__, opset, hashlib.sha256(data).hexdigest())
    """
)


def _hashes(torchscan_imported: bool, opsets: str) -> list[str]:
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            MODELS_WITHOUT_LOOPS,
            "with" if torchscan_imported else "without",
            opsets,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 3 * len(opsets.split(","))
    return lines


def test_a_model_without_loops_exports_byte_identically_with_torchscan() -> None:
    """torchvision-, transformer- and nn.LSTM-style models, at torch.onnx's opset and below it
    (where torchscan converts models with loops itself)."""
    opsets = "18,13"
    alone = _hashes(False, opsets)
    for opset in opsets.split(","):  # three different models at each opset
        assert len({line.split()[-1] for line in alone if line.split()[1] == opset}) == 3
    assert hashlib.sha256(b"").hexdigest() not in " ".join(alone)
    assert _hashes(True, opsets) == alone
