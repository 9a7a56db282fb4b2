"""``torchscan.onnx.check`` always ends: a source of outputs that runs past ``timeout`` is stopped
and reported as timed out; ``strict`` fails a check that compared nothing; a PyTorch module given
without ``args`` runs on the model's inputs."""

from __future__ import annotations

import threading
import time

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto
from onnx import helper as oh

import torchscan.onnx
from torchscan.onnx._check import _limit

from .test_check_runtimes import scan_model


def spinning_loop(trip_count: int = 2**62) -> onnx.ModelProto:
    """``v = -v`` in a Loop of ``trip_count`` iterations whose condition stays true: the lint finds
    nothing (it has ``M``), and no runtime ends it in a lifetime."""
    info = oh.make_tensor_value_info
    true = oh.make_tensor("true", TensorProto.BOOL, (), [True])
    body = oh.make_graph(
        [oh.make_node("Neg", ["v"], ["v2"]), oh.make_node("Constant", [], ["c2"], value=true)],
        "body",
        [info("i", TensorProto.INT64, ()), info("c", TensorProto.BOOL, ()), info("v", 1, (2,))],
        [info("c2", TensorProto.BOOL, ()), info("v2", 1, (2,))],
    )
    m = oh.make_tensor("m", TensorProto.INT64, (), [trip_count])
    nodes = [
        oh.make_node("Constant", [], ["M"], value=m),
        oh.make_node("Loop", ["M", "", "v0"], ["vT"], body=body, name="spin"),
    ]
    graph = oh.make_graph(nodes, "main", [info("v0", 1, (2,))], [info("vT", 1, (2,))])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 16)])


def test_a_loop_that_does_not_end_in_time_is_stopped_in_every_runtime() -> None:
    start = time.monotonic()
    report = torchscan.onnx.check(spinning_loop(), timeout=0.5)
    assert time.monotonic() - start < 10
    assert not report.ok
    assert report.findings == ()
    statuses = {c.source: (c.status, c.reason) for c in report.comparisons}
    assert statuses == {
        "onnxruntime": ("timeout", "timed out after 0.5 s"),
        "reference": ("timeout", "timed out after 0.5 s"),
    }
    lines = str(report).splitlines()
    assert lines[-3:] == [
        "onnxruntime: timed out after 0.5 s",
        "reference: timed out after 0.5 s",
        "FAILED: onnxruntime timed out, reference timed out",
    ]
    rows = [" ".join(line.strip("│ ").split()) for line in lines]
    assert "onnxruntime │ │ │ │ │ timed out" in rows
    data = report.to_dict()
    assert (data["status"], data["timeout"]) == ("failed", 0.5)


def test_a_stopped_runtime_leaves_no_thread_running() -> None:
    before = set(threading.enumerate())
    torchscan.onnx.check(spinning_loop(), timeout=0.3)
    assert set(threading.enumerate()) <= before


def test_a_pytorch_module_that_does_not_end_in_time_is_stopped() -> None:
    def forever(v: torch.Tensor) -> torch.Tensor:
        while True:
            v = -v

    report = torchscan.onnx.check(
        spinning_loop(), module=forever, args=(torch.zeros(2),), timeout=0.3
    )
    assert [(c.source, c.status) for c in report.comparisons] == [
        ("pytorch", "timeout"),
        ("onnxruntime", "timeout"),
        ("reference", "timeout"),
    ]


def test_onnxruntime_in_a_child_process_is_killed_when_it_does_not_end_in_time() -> None:
    # Inputs with an empty dimension run in onnxruntime in a child process.
    model = spinning_loop()
    model.graph.input.append(oh.make_tensor_value_info("unused", 1, (0,)))
    report = torchscan.onnx.check(model, timeout=1)
    assert report.inputs[-1] == "unused: float32[0]"
    assert {c.source: c.status for c in report.comparisons}["onnxruntime"] == "timeout"


def test_a_fast_model_gives_the_same_report_under_a_time_limit() -> None:
    model = scan_model([oh.make_node("Add", ["h_in", "x_t"], ["h_out"])])
    unlimited = torchscan.onnx.check(model)
    limited = torchscan.onnx.check(model, timeout=60)
    assert limited.comparisons == unlimited.comparisons
    assert limited.ok


def test_a_time_limit_longer_than_threads_can_wait_is_waited_as_long_as_they_can() -> None:
    assert _limit.within(1e300, lambda _: [1]) == [1]


def test_the_time_limit_costs_next_to_nothing_per_source() -> None:
    def run(_limit: object) -> list:
        return []

    start = time.perf_counter()
    for _ in range(200):
        _limit.within(60, run)
    assert (time.perf_counter() - start) / 200 < 0.005


def test_an_error_of_a_source_under_a_time_limit_is_raised_as_is() -> None:
    def run(_limit: object) -> list:
        raise ValueError("broken")

    with pytest.raises(ValueError, match=r"^broken$"):
        _limit.within(60, run)


@pytest.mark.parametrize("timeout", [0, -1, float("inf"), float("nan"), "5", True])
def test_a_timeout_that_is_not_a_positive_number_is_refused(timeout: object) -> None:
    with pytest.raises(ValueError, match=r"^timeout must be") as raised:
        torchscan.onnx.check(spinning_loop(), timeout=timeout)
    assert str(raised.value) == (
        f"timeout must be a finite number of seconds greater than 0, or None, not {timeout!r}"
    )


def test_strict_fails_a_check_that_compared_nothing() -> None:
    model = scan_model([oh.make_node("Add", ["h_in", "x_t"], ["h_out"])])
    report = torchscan.onnx.check(model, runtimes=("onnxruntime",), strict=True)
    assert not report.ok
    assert report.ran == ("onnxruntime",)
    assert report.summary() == (
        "FAILED: too few sources ran the model to compare outputs: only onnxruntime ran (strict)"
    )
    assert report.to_dict()["status"] == "failed"
    assert torchscan.onnx.check(model, strict=True).ok


def test_a_module_without_args_runs_on_the_inputs() -> None:
    model = scan_model([oh.make_node("Add", ["h_in", "x_t"], ["h_out"])])

    def cumulative(h0: torch.Tensor, xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ys = h0 + torch.cumsum(xs, 0)
        return ys[-1], ys

    h0, xs = np.ones(2, np.float32), np.arange(6, dtype=np.float32).reshape(3, 2)
    report = torchscan.onnx.check(model, module=cumulative, inputs=[h0, xs])
    assert report.ok, report
    assert [(c.source, c.status) for c in report.comparisons] == [
        ("pytorch", "baseline"),
        ("onnxruntime", "ok"),
        ("reference", "ok"),
    ]
    wrong = torchscan.onnx.check(model, module=lambda h0, xs: (h0, xs), inputs=[h0, xs])
    assert wrong.summary() == "FAILED: onnxruntime mismatch, reference mismatch"
