"""``torchscan.onnx.check`` on models with random operators: the outputs that depend on them are
compared by shape and element type only ("not compared: random"), the others by value."""

from __future__ import annotations

import json
import logging

import numpy as np
import onnx
import onnx_ir as ir
import pytest
import torch
from onnx import TensorProto
from onnx import helper as oh

import torchscan
import torchscan.onnx
from torchscan.onnx._check import _random_ops
from torchscan.onnx._check._random_ops import RANDOM_OPS
from torchscan.onnx._lint._report import NO_BASELINE

from .._export import onnx_export

logging.getLogger("torch.onnx").setLevel(logging.ERROR)

info = oh.make_tensor_value_info
F = TensorProto.FLOAT


def random_outputs(model: onnx.ModelProto) -> dict[str, str]:
    """:func:`_random_ops.random_outputs` of ``model``, read into onnx_ir."""
    return _random_ops.random_outputs(ir.serde.deserialize_model(model))


def _scan_body(nodes: list[onnx.NodeProto]) -> onnx.GraphProto:
    """A Scan body from h_in[2], x_t[2] to h_out[2] (computed by ``nodes``) and y = h_out."""
    return oh.make_graph(
        [*nodes, oh.make_node("Identity", ["h_out"], ["y"])],
        "body",
        [info("h_in", F, [2]), info("x_t", F, [2])],
        [info("h_out", F, [2]), info("y", F, [2])],
    )


def noisy_scan(opset: int = 18, reverse: bool = False) -> onnx.ModelProto:
    """``h = h + x + noise`` over xs, noise from RandomNormalLike in the body; besides, a
    deterministic output ``total = ReduceSum(xs)`` and an output ``shifted = hT + 1`` that
    depends on the Scan."""
    body = _scan_body(
        [
            oh.make_node("RandomNormalLike", ["h_in"], ["noise"], name="noise"),
            oh.make_node("Add", ["h_in", "x_t"], ["s"]),
            oh.make_node("Add", ["s", "noise"], ["h_out"]),
        ]
    )
    directions = {"scan_input_directions": [1]} if reverse else {}
    graph = oh.make_graph(
        [
            oh.make_node(
                "Scan",
                ["h0", "xs"],
                ["hT", "ys"],
                body=body,
                num_scan_inputs=1,
                name="scan",
                **directions,
            ),
            oh.make_node("Add", ["hT", "one"], ["shifted"]),
            oh.make_node("ReduceSum", ["xs"], ["total"], keepdims=0),
        ],
        "main",
        [info("h0", F, [2]), info("xs", F, ["T", 2])],
        [info("ys", F, ["T", 2]), info("shifted", F, [2]), info("total", F, [])],
        [oh.make_tensor("one", F, [], [1.0])],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])


# --- which outputs depend on a random operator ----------------------------------------------


def test_every_output_of_a_scan_whose_body_draws_is_random_and_what_follows_it() -> None:
    assert random_outputs(noisy_scan()) == {
        "ys": "Scan 'scan' > body > RandomNormalLike 'noise'",
        "shifted": "Scan 'scan' > body > RandomNormalLike 'noise'",
    }


@pytest.mark.parametrize("op", sorted(RANDOM_OPS))
def test_each_random_operator_of_the_main_graph_is_found(op: str) -> None:
    inputs = [] if op in ("RandomNormal", "RandomUniform") else ["x"]
    graph = oh.make_graph(
        [
            oh.make_node(op, inputs, ["r"]),
            oh.make_node("Add", ["x", "r"], ["noisy"]),
            oh.make_node("Neg", ["x"], ["clean"]),
        ],
        "main",
        [info("x", F, [2])],
        [info("noisy", F, [2]), info("clean", F, [2]), info("r", F, [2])],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 21)])
    assert random_outputs(model) == {"noisy": f"{op} #0", "r": f"{op} #0"}


def test_an_operator_of_another_domain_with_a_random_name_is_not_random() -> None:
    graph = oh.make_graph(
        [oh.make_node("RandomNormalLike", ["x"], ["y"], domain="com.example")],
        "main",
        [info("x", F, [2])],
        [info("y", F, [2])],
    )
    model = oh.make_model(
        graph, opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid("com.example", 1)]
    )
    assert random_outputs(model) == {}


def test_a_draw_in_an_if_in_a_loop_body_makes_the_loop_random() -> None:
    branch = oh.make_graph(
        [oh.make_node("RandomUniformLike", ["v"], ["u"], name="draw")],
        "then",
        [],
        [info("u", F, [2])],
    )
    other = oh.make_graph([oh.make_node("Identity", ["v"], ["w"])], "else", [], [info("w", F, [2])])
    body = oh.make_graph(
        [
            oh.make_node("If", ["c"], ["v2"], then_branch=branch, else_branch=other, name="pick"),
            oh.make_node("Identity", ["c"], ["c2"]),
        ],
        "body",
        [info("i", TensorProto.INT64, []), info("c", TensorProto.BOOL, []), info("v", F, [2])],
        [info("c2", TensorProto.BOOL, []), info("v2", F, [2])],
    )
    graph = oh.make_graph(
        [oh.make_node("Loop", ["M", "", "v0"], ["vT"], body=body, name="outer")],
        "main",
        [info("M", TensorProto.INT64, []), info("v0", F, [2])],
        [info("vT", F, [2])],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    assert random_outputs(model) == {
        "vT": "Loop 'outer' > body > If 'pick' > then_branch > RandomUniformLike 'draw'"
    }


def test_a_body_that_reads_a_random_value_of_the_outer_graph_is_random() -> None:
    body = _scan_body([oh.make_node("Add", ["h_in", "noise"], ["h_out"])])  # noise: outer
    graph = oh.make_graph(
        [
            oh.make_node("RandomNormal", [], ["noise"], shape=[2], name="noise"),
            oh.make_node("Scan", ["h0", "xs"], ["hT", "ys"], body=body, num_scan_inputs=1),
        ],
        "main",
        [info("h0", F, [2]), info("xs", F, ["T", 2])],
        [info("hT", F, [2])],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    assert random_outputs(model) == {"hT": "RandomNormal 'noise'"}


def test_a_call_of_a_local_function_that_draws_is_random() -> None:
    function = oh.make_function(
        "local",
        "Jitter",
        ["a"],
        ["b"],
        [
            oh.make_node("Bernoulli", ["a"], ["m"], name="coin"),
            oh.make_node("Mul", ["a", "m"], ["b"]),
        ],
        [oh.make_opsetid("", 18)],
    )
    graph = oh.make_graph(
        [
            oh.make_node("Jitter", ["x"], ["y"], domain="local", name="jitter"),
            oh.make_node("Neg", ["x"], ["z"]),
        ],
        "main",
        [info("x", F, [2])],
        [info("y", F, [2]), info("z", F, [2])],
    )
    model = oh.make_model(
        graph,
        opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid("local", 1)],
        functions=[function],
    )
    assert random_outputs(model) == {"y": "Jitter 'jitter' > Bernoulli 'coin'"}


# --- the check -------------------------------------------------------------------------------


def test_random_outputs_are_compared_by_shape_and_the_others_by_value() -> None:
    report = torchscan.onnx.check(noisy_scan())
    assert report.ok, report
    onnxruntime = report.comparisons[1]
    assert (onnxruntime.source, onnxruntime.status) == ("onnxruntime", "ok")
    compared = {o.name: (o.ok, o.not_compared, o.max_abs) for o in onnxruntime.outputs}
    assert compared == {
        "ys": (True, "random", None),
        "shifted": (True, "random", None),
        "total": (True, "", 0.0),
    }
    baseline = {o.name: o.not_compared for o in report.comparisons[0].outputs}
    assert baseline == {"ys": "random", "shifted": "random", "total": ""}


def test_the_text_report_says_which_outputs_are_not_compared_and_why() -> None:
    report = torchscan.onnx.check(noisy_scan())
    text = str(report)
    rows = [" ".join(line.strip("│ ").split()) for line in text.splitlines()]
    assert "onnxruntime │ ys │ (3, 2) │ - │ - │ not compared: random" in rows
    assert "onnxruntime │ total │ () │ 0 │ 0 │ ok" in rows
    lines = text.splitlines()
    assert lines[-4:] == [
        "note: ys: not compared: random: its values depend on Scan 'scan' > body > "
        "RandomNormalLike 'noise', which no two sources draw alike; its shape and element type "
        "are compared",
        "note: shifted: not compared: random: its values depend on Scan 'scan' > body > "
        "RandomNormalLike 'noise', which no two sources draw alike; its shape and element type "
        "are compared",
        f"note: {NO_BASELINE}",
        "OK: 1 Scan/Loop node checked, no findings; outputs agree across reference, onnxruntime, "
        "onnxruntime-unoptimized, imported; values not compared: random (ys, shifted); no "
        "PyTorch baseline or expected outputs took part",
    ]


def test_the_json_report_has_the_field() -> None:
    data = json.loads(torchscan.onnx.check(noisy_scan()).to_json())
    ys = data["comparisons"][1]["outputs"][0]
    assert ys == {
        "name": "ys",
        "shape": "(3, 2)",
        "max_abs": None,
        "max_rel": None,
        "ok": True,
        "note": "",
        "not_compared": "random",
    }
    assert data["notes"][0].startswith("ys: not compared: random: its values depend on ")


def test_a_random_output_of_another_shape_and_a_wrong_deterministic_one_still_fail() -> None:
    h0, xs = np.zeros(2, np.float32), np.ones((3, 2), np.float32)
    expected = {
        "ys": np.zeros((4, 2), np.float32),  # one step too many
        "shifted": np.zeros(2, np.float32),  # values: not compared
        "total": np.array(7.0, np.float32),  # 6
    }
    report = torchscan.onnx.check(noisy_scan(), inputs=[h0, xs], expected=expected)
    assert report.summary() == (
        "FAILED: onnxruntime mismatch, onnxruntime-unoptimized mismatch, reference mismatch, "
        "imported mismatch"
    )
    onnxruntime = report.comparisons[1]
    outputs = {o.name: (o.ok, o.note) for o in onnxruntime.outputs}
    assert outputs == {
        "ys": (False, "shape (3, 2), where the baseline has (4, 2)"),
        "shifted": (True, ""),
        "total": (False, ""),
    }
    rows = [" ".join(line.strip("│ ").split()) for line in str(report).splitlines()]
    # the result column wraps after "baseline"
    row = "onnxruntime │ ys │ (3, 2) │ - │ - │ mismatch: shape (3, 2), where the baseline"
    assert row in rows


def test_only_random_outputs_agree_by_shape_and_element_type() -> None:
    model = noisy_scan()
    del model.graph.output[2]  # total
    report = torchscan.onnx.check(model)
    assert report.ok, report
    assert report.summary() == (
        "OK: 1 Scan/Loop node checked, no findings; shapes and element types agree across "
        "reference, onnxruntime, onnxruntime-unoptimized, imported; values not compared: random "
        "(ys, shifted); no PyTorch baseline or expected outputs took part"
    )


def test_nothing_said_compared_where_one_source_ran() -> None:
    # onnxruntime 1.32 has no RandomNormalLike-22: of the two asked, only the reference
    # evaluator runs it.
    model = noisy_scan(opset=22, reverse=True)
    report = torchscan.onnx.check(model, runtimes=("onnxruntime", "reference"))
    assert report.verdict == "not compared", report
    assert report.notes == ()
    assert report.summary().endswith(
        "too few independent sources ran the model to compare outputs: only reference ran "
        "(onnxruntime: not supported by that runtime; onnxruntime-unoptimized: not supported by "
        "that runtime)"
    )
    # The imported module draws its own noise: the two are compared by shape and element type.
    with_torch = torchscan.onnx.check(model)
    assert with_torch.ok, with_torch
    assert {c.source: c.status for c in with_torch.comparisons} == {
        "reference": "baseline",
        "onnxruntime": "unsupported",
        "onnxruntime-unoptimized": "unsupported",
        "imported": "ok",
    }


class Denoise(torch.nn.Module):
    """A sampling loop: ``x = 0.9 x + t * randn_like(x)`` over ts."""

    def forward(self, x0: torch.Tensor, ts: torch.Tensor) -> torch.Tensor:
        def step(x, t):
            return x * 0.9 + t * torch.randn_like(x), None

        return torchscan.scan(step, x0, ts)[0]


def test_an_export_that_draws_noise_in_a_scan_passes_against_pytorch() -> None:
    module = Denoise()
    args = (torch.zeros(2), torch.ones(4, 2))
    time = torch.export.Dim("T", min=1)
    model = onnx_export(module, args, dynamo=True, dynamic_shapes=(None, {0: time})).model_proto
    report = torchscan.onnx.check(model, module=module, args=args)
    assert report.ok, report
    assert [(c.source, c.status) for c in report.comparisons] == [
        ("pytorch", "baseline"),
        ("onnxruntime", "ok"),
        ("onnxruntime-unoptimized", "ok"),
        ("reference", "ok"),
        ("imported", "ok"),
    ]
    assert all(o.not_compared == "random" for c in report.comparisons for o in c.outputs)
