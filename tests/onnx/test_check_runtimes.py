"""``torchscan.onnx.check`` and the runtimes that do not run a model: which failures say that a
runtime lacks something (not supported by that runtime, not a failure), which say that the model
is wrong (an error, a failure), and how the report says which sources ran and which did not."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as oh

import torchscan.onnx
from torchscan.onnx._check import _compare
from torchscan.onnx._check._runtimes import _ChildError, _Unsupported


def scan_model(
    nodes: list[onnx.NodeProto],
    elem: int = TensorProto.FLOAT,
    opset: int = 18,
    reverse: bool = False,
    body_inits: tuple = (),
) -> onnx.ModelProto:
    """A Scan over xs[T, 2] with a state h[2]; the body computes h_out from h_in and x_t with
    ``nodes``, and its scan output is h_out."""
    info = oh.make_tensor_value_info
    body = oh.make_graph(
        [*nodes, oh.make_node("Identity", ["h_out"], ["y"])],
        "body",
        [info("h_in", elem, [2]), info("x_t", elem, [2])],
        [info("h_out", elem, [2]), info("y", elem, [2])],
        list(body_inits),
    )
    directions = {"scan_input_directions": [1]} if reverse else {}
    scan = oh.make_node(
        "Scan", ["h0", "xs"], ["hT", "ys"], body=body, num_scan_inputs=1, name="scan", **directions
    )
    graph = oh.make_graph(
        [scan],
        "main",
        [info("h0", elem, [2]), info("xs", elem, ["T", 2])],
        [info("hT", elem, [2]), info("ys", elem, ["T", 2])],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])


def test_onnxruntime_without_a_kernel_is_not_supported_and_the_reference_is_the_baseline() -> None:
    # onnxruntime 1.32 has no int16 kernel for Max-13: its status is NOT_IMPLEMENTED.
    nodes = [oh.make_node("Max", ["h_in", "x_t"], ["h_out"], name="max")]
    model = scan_model(nodes, TensorProto.INT16)
    report = torchscan.onnx.check(model, runtimes=("onnxruntime", "reference"))
    assert (report.verdict, report.ok) == ("not compared", False), report
    lacks = (
        "unsupported",
        "[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for "
        "Max(13) node with name 'max'",
    )
    statuses = {c.source: (c.status, c.reason) for c in report.comparisons}
    assert statuses == {
        "reference": ("baseline", ""),
        "onnxruntime": lacks,
        "onnxruntime-unoptimized": lacks,
    }
    lines = str(report).splitlines()
    assert (
        "onnxruntime: not supported by that runtime: [ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : "
        "Could not find an implementation for Max(13) node with name 'max'"
    ) in lines
    assert lines[-1] == (
        "NOT COMPARED: 1 Scan/Loop node checked, no findings; too few independent sources ran "
        "the model to compare outputs: only reference ran (onnxruntime: not supported by that "
        "runtime; onnxruntime-unoptimized: not supported by that runtime)"
    )
    accepted = torchscan.onnx.check(model, runtimes=("onnxruntime", "reference"), strict=False)
    assert (accepted.verdict, accepted.ok) == ("not compared", True)
    assert str(accepted).splitlines()[-1].endswith("(a single source was accepted)")


def test_the_imported_module_is_a_second_runtime_where_onnxruntime_lacks_a_kernel() -> None:
    # onnxruntime has no int16 Max-13; the reference evaluator and the imported module compute
    # it, and are compared: a right model passes, and a wrong expected output fails both.
    nodes = [oh.make_node("Max", ["h_in", "x_t"], ["h_out"], name="max")]
    model = scan_model(nodes, TensorProto.INT16)
    h0 = np.array([0, 5], np.int16)
    xs = np.array([[1, 2], [-3, 7], [4, 1]], np.int16)
    report = torchscan.onnx.check(model, inputs=[h0, xs])
    assert (report.verdict, report.ok) == ("ok", True), report
    assert {c.source: c.status for c in report.comparisons} == {
        "reference": "baseline",
        "torch": "ok",
        "onnxruntime": "unsupported",
        "onnxruntime-unoptimized": "unsupported",
    }
    assert report.independent == ("reference", "torch")
    running_max = np.maximum.accumulate(np.concatenate([h0[None], xs]), axis=0)[1:]
    only_torch = torchscan.onnx.check(
        model, inputs=[h0, xs], expected=[running_max[-1], running_max], runtimes=("torch",)
    )
    assert only_torch.ok, only_torch
    wrong = torchscan.onnx.check(
        model, inputs=[h0, xs], expected=[running_max[-1], running_max + 1], runtimes=("torch",)
    )
    assert wrong.summary() == "FAILED: torch mismatch"


def test_no_source_that_runs_the_model_is_said_plainly() -> None:
    # onnxruntime has no Max-13 of int16; the reference evaluator is not asked for.
    nodes = [oh.make_node("Max", ["h_in", "x_t"], ["h_out"], name="max")]
    model = scan_model(nodes, TensorProto.INT16, reverse=True)
    report = torchscan.onnx.check(model, runtimes=("onnxruntime",))
    assert (report.verdict, report.ok) == ("not compared", False), report
    assert [c.status for c in report.comparisons] == ["unsupported", "unsupported"]
    lines = str(report).splitlines()
    assert lines[-3:] == [
        "onnxruntime: not supported by that runtime: [ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : "
        "Could not find an implementation for Max(13) node with name 'max'",
        "onnxruntime-unoptimized: not supported by that runtime: [ONNXRuntimeError] : 9 : "
        "NOT_IMPLEMENTED : Could not find an implementation for Max(13) node with name 'max'",
        "NOT COMPARED: 1 Scan/Loop node checked, no findings; too few independent sources ran "
        "the model to compare outputs: none ran (onnxruntime: not supported by that runtime; "
        "onnxruntime-unoptimized: not supported by that runtime)",
    ]
    rows = [" ".join(line.strip("│ ").split()) for line in str(report).splitlines()]
    assert "onnxruntime │ │ │ │ │ not supported by that runtime" in rows


def test_one_runtime_asked_for_is_too_few_without_any_other_to_blame() -> None:
    model = scan_model([oh.make_node("Add", ["h_in", "x_t"], ["h_out"])])
    report = torchscan.onnx.check(model, runtimes=("onnxruntime",))
    # its two optimization levels are one runtime
    assert [c.status for c in report.comparisons] == ["baseline", "ok"]
    assert report.summary() == (
        "NOT COMPARED: 1 Scan/Loop node checked, no findings; too few independent sources ran "
        "the model to compare outputs: only onnxruntime ran"
    )


def test_an_operator_that_onnx_does_not_have_is_an_error_of_every_runtime() -> None:
    model = scan_model([oh.make_node("NoSuchOp", ["h_in", "x_t"], ["h_out"])])
    report = torchscan.onnx.check(model)
    assert not report.ok
    invalid = "[ONNXRuntimeError] : 10 : INVALID_GRAPH : This is an invalid model."
    starts = {
        "onnxruntime": invalid,
        "onnxruntime-unoptimized": invalid,
        "reference": "No registered schema for operator 'NoSuchOp' and domain ''.",
        "torch": "the model fails onnx.checker: No Op registered for NoSuchOp with "
        "domain_version of 18",
    }
    assert [c.source for c in report.comparisons] == list(starts)
    for c in report.comparisons:
        assert c.status == "error"
        assert c.reason.startswith(starts[c.source])
    lines = str(report).splitlines()
    assert any(line.startswith("onnxruntime: error: [ONNXRuntimeError] : 10 : ") for line in lines)
    assert lines[-1] == (
        "FAILED: onnxruntime error, onnxruntime-unoptimized error, reference error, torch error"
    )


def test_an_operator_of_another_domain_is_not_supported_by_the_reference_evaluator() -> None:
    # onnxruntime runs com.microsoft's Gelu; onnx's reference evaluator does not know it.
    model = scan_model([oh.make_node("Gelu", ["x_t"], ["h_out"], domain="com.microsoft")])
    model.opset_import.append(oh.make_opsetid("com.microsoft", 1))
    report = torchscan.onnx.check(model)
    assert report.verdict == "not compared", report
    lines = str(report).splitlines()
    assert (
        "reference: not supported by that runtime: Node type 'Gelu' from domain 'com.microsoft' "
        "is unknown, known functions: []."
    ) in lines
    assert lines[-1].endswith(
        "only onnxruntime ran (reference: not supported by that runtime; torch: not supported by "
        "that runtime)"
    )
    assert (
        "torch: not supported by that runtime: node #0 (com.microsoft.Gelu) of the body of node "
        "'scan' (Scan-16): onnx knows no operator com.microsoft.Gelu at opset 1"
    ) in lines


def test_shapes_that_do_not_fit_are_an_error_of_every_runtime() -> None:
    # h + c with c of 3 elements: both runtimes fail while running, and neither lacks anything.
    c = oh.make_tensor("c", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
    nodes = [oh.make_node("Add", ["h_in", "c"], ["h_out"])]
    report = torchscan.onnx.check(scan_model(nodes, body_inits=[c]))
    assert not report.ok
    assert {c.source: c.status for c in report.comparisons} == {
        "onnxruntime": "error",
        "onnxruntime-unoptimized": "error",
        "reference": "error",
        "torch": "error",
    }
    assert report.summary() == (
        "FAILED: onnxruntime error, onnxruntime-unoptimized error, reference error, torch error"
    )


def test_a_mismatch_between_runtimes_that_ran_still_fails() -> None:
    model = scan_model([oh.make_node("Add", ["h_in", "x_t"], ["h_out"])])
    h0 = np.zeros(2, np.float32)
    xs = np.ones((3, 2), np.float32)
    report = torchscan.onnx.check(
        model, inputs=[h0, xs], expected=[xs.sum(0) + 1, np.cumsum(xs, 0)]
    )
    assert not report.ok
    assert report.summary() == (
        "FAILED: onnxruntime mismatch, onnxruntime-unoptimized mismatch, reference mismatch, "
        "torch mismatch"
    )


class NotImplemented(RuntimeError):  # onnxruntime's exception for its status NOT_IMPLEMENTED
    pass


class InvalidArgument(RuntimeError):
    pass


@pytest.mark.parametrize(
    ("source", "error", "lacks"),
    [
        ("onnxruntime", NotImplemented("[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : ..."), True),
        ("onnxruntime", _ChildError("NotImplemented", "[ONNXRuntimeError] : 9 : ..."), True),
        ("onnxruntime-unoptimized", NotImplemented("[ONNXRuntimeError] : 9 : ..."), True),
        ("onnxruntime-unoptimized", InvalidArgument("[ONNXRuntimeError] : 2 : ..."), False),
        ("onnxruntime", InvalidArgument("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : ..."), False),
        ("onnxruntime", _ChildError("InvalidGraph", "[ONNXRuntimeError] : 10 : ..."), False),
        ("onnxruntime", _ChildError("Fail", "op is not supported"), False),
        ("onnxruntime", RuntimeError("onnxruntime ended its process with SIGFPE"), False),
        ("reference", NotImplementedError("No registered implementation for operator"), True),
        ("reference", NotImplementedError("No registered schema for operator 'X'"), False),
        ("reference", RuntimeError("Scan is not implemented for other input axes than 0."), True),
        ("reference", RuntimeError("Unsupported shape (2,)."), True),
        ("reference", RuntimeError("No implementation for operator 'X' version 7"), False),
        ("reference", ValueError("BitCast to STRING is not supported"), False),
        ("reference", ValueError("operands could not be broadcast together"), False),
        ("reference", IndexError("index 3 is out of bounds"), False),
        ("reference", TypeError("Issues with types"), False),
        ("pytorch", NotImplementedError("aten::foo on the CPU"), False),
    ],
)
def test_which_errors_say_that_a_runtime_lacks_something(
    source: str, error: BaseException, lacks: bool
) -> None:
    assert _compare._runtime_lacks(source, error) is lacks
    status = _compare._failed(source, "x", error, False).status
    assert status == ("unsupported" if lacks else "error")


def test_a_runtime_that_refuses_a_model_before_running_it_is_not_supported() -> None:
    comparison = _compare._failed("reference", "", _Unsupported("why"), False)
    assert (comparison.status, comparison.reason) == ("unsupported", "why")
