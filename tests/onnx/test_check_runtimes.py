"""``torchscan.onnx.check`` and the runtimes that do not run a model: which failures say that a
runtime lacks something (not supported by that runtime, not a failure), which say that the model
is wrong (an error, a failure), and how the report says which sources ran and which did not."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx.reference
import onnx.shape_inference
import pytest
import torch
from onnx import TensorProto
from onnx import helper as oh

import torchscan
import torchscan.onnx
from torchscan.onnx._check import _compare, _runtimes
from torchscan.onnx._check._runtimes import _ChildError, _Unsupported

from .._export import onnx_export


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
        "imported": "ok",
        "onnxruntime": "unsupported",
        "onnxruntime-unoptimized": "unsupported",
    }
    assert report.independent == ("reference", "imported")
    running_max = np.maximum.accumulate(np.concatenate([h0[None], xs]), axis=0)[1:]
    only_torch = torchscan.onnx.check(
        model, inputs=[h0, xs], expected=[running_max[-1], running_max], runtimes=("imported",)
    )
    assert only_torch.ok, only_torch
    wrong = torchscan.onnx.check(
        model, inputs=[h0, xs], expected=[running_max[-1], running_max + 1], runtimes=("imported",)
    )
    assert wrong.summary() == "FAILED: imported mismatch"


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
        "imported": "the model fails onnx.checker: No Op registered for NoSuchOp with "
        "domain_version of 18",
    }
    assert [c.source for c in report.comparisons] == list(starts)
    for c in report.comparisons:
        assert c.status == "error"
        assert c.reason.startswith(starts[c.source])
    lines = str(report).splitlines()
    assert any(line.startswith("onnxruntime: error: [ONNXRuntimeError] : 10 : ") for line in lines)
    assert lines[-1] == (
        "FAILED: onnxruntime error, onnxruntime-unoptimized error, reference error, imported error"
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
        "only onnxruntime ran (reference: not supported by that runtime; imported: not supported "
        "by that runtime)"
    )
    assert (
        "imported: not supported by that runtime: node #0 (com.microsoft.Gelu) of the body of node "
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
        "imported": "error",
    }
    assert report.summary() == (
        "FAILED: onnxruntime error, onnxruntime-unoptimized error, reference error, imported error"
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
        "imported mismatch"
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


# --- a runtime that cannot run a valid model --------------------------------------------------


def _raises(error: BaseException):
    def run(*_args: object) -> list:
        raise error

    return run


def test_a_runtime_that_cannot_run_a_valid_model_is_overruled_by_two_that_agree(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    error = ValueError("index can't contain negative values")
    monkeypatch.setitem(_runtimes._RUNNERS, "reference", _raises(error))
    model = scan_model([oh.make_node("Add", ["h_in", "x_t"], ["h_out"])])
    report = torchscan.onnx.check(model)
    assert (report.verdict, report.ok) == ("ok", True), report
    assert {c.source: (c.status, c.reason) for c in report.comparisons} == {
        "imported": ("baseline", ""),
        "onnxruntime": ("ok", ""),
        "onnxruntime-unoptimized": ("ok", ""),
        "reference": ("could not run", "index can't contain negative values"),
    }
    lines = str(report).splitlines()
    assert "reference: could not run: index can't contain negative values" in lines
    assert lines[-1] == (
        "OK: 1 Scan/Loop node checked, no findings; outputs agree across imported, onnxruntime, "
        "onnxruntime-unoptimized; reference could not run the model; no PyTorch baseline or "
        "expected outputs took part"
    )
    data = json.loads(report.to_json())
    assert (data["status"], data["ok"]) == ("ok", True)
    assert [c["status"] for c in data["comparisons"]][-1] == "could not run"


def test_onnxruntime_that_cannot_run_a_valid_model_is_overruled_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    error = _ChildError("RuntimeException", "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : boom")
    for level in ("onnxruntime", "onnxruntime-unoptimized"):
        monkeypatch.setitem(_runtimes._RUNNERS, level, _raises(error))
    report = torchscan.onnx.check(scan_model([oh.make_node("Add", ["h_in", "x_t"], ["h_out"])]))
    assert report.ok, report
    assert [(c.source, c.status) for c in report.comparisons] == [
        ("reference", "baseline"),
        ("onnxruntime", "could not run"),
        ("onnxruntime-unoptimized", "could not run"),
        ("imported", "ok"),
    ]
    assert report.summary().endswith(
        "; onnxruntime, onnxruntime-unoptimized could not run the model; no PyTorch baseline or "
        "expected outputs took part"
    )


def test_a_runtime_error_with_fewer_than_two_sources_left_still_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(_runtimes._RUNNERS, "reference", _raises(ValueError("no")))
    model = scan_model([oh.make_node("Add", ["h_in", "x_t"], ["h_out"])])
    report = torchscan.onnx.check(model, runtimes=("onnxruntime", "reference"))
    assert (report.verdict, report.ok) == ("failed", False)
    assert {c.source: c.status for c in report.comparisons}["reference"] == "error"
    assert report.summary() == "FAILED: reference error"
    single = torchscan.onnx.check(model, runtimes=("onnxruntime", "reference"), strict=False)
    assert (single.verdict, single.ok) == ("failed", False)


def test_a_runtime_error_on_a_model_that_fails_onnx_checker_is_the_model_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The declared output shape contradicts the input's: onnx.checker's full check (shape
    # inference) refuses the model, though the other runtimes run it.
    graph = oh.make_graph(
        [oh.make_node("Relu", ["x"], ["y"])],
        "mlp",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, (2,))],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, (3,))],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    with pytest.raises(onnx.shape_inference.InferenceError):
        onnx.checker.check_model(model, full_check=True)
    monkeypatch.setitem(_runtimes._RUNNERS, "reference", _raises(ValueError("no")))
    report = torchscan.onnx.check(model)
    assert {c.source: c.status for c in report.comparisons} == {
        "imported": "baseline",
        "onnxruntime": "ok",
        "onnxruntime-unoptimized": "ok",
        "reference": "error",
    }
    assert report.summary() == "FAILED: reference error"


def cropping_scan() -> onnx.ModelProto:
    """A Scan whose body shifts its state left, ``Pad(h, pads=[-1, 1])`` (what
    ``torch.nn.functional.pad(h, (-1, 1))`` exports to), and adds the step's input."""
    nodes = [
        oh.make_node("Pad", ["h_in", "pads"], ["shifted"]),
        oh.make_node("Add", ["shifted", "x_t"], ["h_out"]),
    ]
    pads = oh.make_tensor("pads", TensorProto.INT64, [2], [-1, 1])
    return scan_model(nodes, body_inits=(pads,))


def test_a_pad_with_a_negative_pad_passes_where_onnx_s_evaluator_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = cropping_scan()
    h0 = np.array([1.0, 2.0], np.float32)
    xs = np.array([[10.0, 20.0], [30.0, 40.0], [50.0, 60.0]], np.float32)
    with pytest.raises(ValueError, match="index can't contain negative values"):
        onnx.reference.ReferenceEvaluator(model).run(None, {"h0": h0, "xs": xs})
    states, state = [], h0
    for x in xs:  # the specification: remove h[0], append a zero, add x
        state = np.append(state[1:], 0.0).astype(np.float32) + x
        states.append(state)
    expected = [states[-1], np.stack(states)]
    report = torchscan.onnx.check(model, inputs=[h0, xs], expected=expected)
    assert report.ok, report
    assert {c.source: c.status for c in report.comparisons} == {
        "expected": "baseline",
        "onnxruntime": "ok",
        "onnxruntime-unoptimized": "ok",
        "reference": "ok",
        "imported": "ok",
    }
    # onnx's own Pad: the reference evaluator cannot run the model, and the others decide
    stock = [op for op in _runtimes.reference_ops() if op.__name__ != "Pad"]
    monkeypatch.setattr(_runtimes, "reference_ops", lambda: stock)
    report = torchscan.onnx.check(model, inputs=[h0, xs])
    assert report.ok, report
    assert {c.source: (c.status, c.reason) for c in report.comparisons}["reference"] == (
        "could not run",
        "index can't contain negative values",
    )


# --- the imported module computes as onnxruntime and the reference evaluator -----------------


class Kalman(torch.nn.Module):
    """A constant-velocity Kalman filter over measurements of position and velocity whose
    noises are strongly correlated: the 2x2 innovation covariance S is close to singular, and
    its inverse, written out (the adjugate over ``a * d - b * c``), cancels."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("F", torch.tensor([[1.0, 1.0], [0.0, 1.0]]))
        self.register_buffer("Q", torch.tensor([[0.01 / 3, 0.01 / 2], [0.01 / 2, 0.01]]))
        self.register_buffer("H", torch.eye(2))
        self.register_buffer("R", torch.tensor([[1.0, 0.99], [0.99, 1.0]]))

    def forward(self, zs: torch.Tensor, x0: torch.Tensor, p0: torch.Tensor):
        f, q, h, r = self.F, self.Q, self.H, self.R

        def step(carry, z):
            x, p = carry
            x = x @ f.T  # predict
            p = f @ p @ f.T + q
            s = h @ p @ h.T + r
            a, b, c, d = s[:, 0, 0], s[:, 0, 1], s[:, 1, 0], s[:, 1, 1]
            det = a * d - b * c
            adjugate = torch.stack([torch.stack([d, -b], -1), torch.stack([-c, a], -1)], -2)
            gain = p @ h.T @ (adjugate / det[:, None, None])
            x = x + (gain @ (z - x @ h.T)[..., None])[..., 0]  # update
            p = (torch.eye(2) - gain @ h) @ p
            return (x, p), x

        (x, p), xs = torchscan.scan(step, (x0, p0), zs)
        return x, p, xs


def test_a_kalman_filter_with_2x2_inverses_computes_alike_in_every_runtime() -> None:
    torch.manual_seed(0)
    zs = (torch.randn(50, 4, 2) * 3).cumsum(0)
    x0, p0 = torch.zeros(4, 2), torch.eye(2).repeat(4, 1, 1)
    time = torch.export.Dim("time", min=2)
    program = onnx_export(
        Kalman(), (zs, x0, p0), dynamo=True, dynamic_shapes=({0: time}, None, None)
    )
    report = torchscan.onnx.check(program.model_proto, inputs=[zs, x0, p0])
    assert report.ok, report
    assert (report.atol, report.rtol) == (1e-5, 1e-5)  # float32's tolerance, the default
    by_source = {c.source: c for c in report.comparisons}
    assert {source: c.status for source, c in by_source.items()} == {
        "reference": "baseline",
        "onnxruntime": "ok",
        "onnxruntime-unoptimized": "ok",
        "imported": "ok",
    }
    # float32 products of small matrices rounded as onnxruntime and numpy round them: the
    # imported module gives the reference evaluator's outputs to the last bit.
    assert [o.max_abs for o in by_source["imported"].outputs] == [0.0, 0.0, 0.0]
