"""``torchscan.onnx.check`` always ends: a source of outputs that runs past ``timeout`` is stopped
and reported as timed out, the limit counting from the model's run; a check that compared nothing
is not compared, and fails unless ``strict=False``; a PyTorch module given without ``args`` runs
on the model's inputs."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto
from onnx import helper as oh

import torchscan.onnx
from torchscan.onnx._check import _limit, _runtimes

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
        "onnxruntime-unoptimized": ("timeout", "timed out after 0.5 s"),
        "reference": ("timeout", "timed out after 0.5 s"),
        "imported": ("timeout", "timed out after 0.5 s"),
    }
    lines = str(report).splitlines()
    assert lines[-5:] == [
        "onnxruntime: timed out after 0.5 s",
        "onnxruntime-unoptimized: timed out after 0.5 s",
        "reference: timed out after 0.5 s",
        "imported: timed out after 0.5 s",
        "FAILED: onnxruntime timed out, onnxruntime-unoptimized timed out, reference timed out, "
        "imported timed out",
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
        ("onnxruntime-unoptimized", "timeout"),
        ("reference", "timeout"),
        ("imported", "timeout"),
    ]


def test_onnxruntime_in_a_child_process_is_killed_when_it_does_not_end_in_time() -> None:
    # Inputs with an empty dimension run in onnxruntime in a child process.
    model = spinning_loop()
    model.graph.input.append(oh.make_tensor_value_info("unused", 1, (0,)))
    start = time.monotonic()
    report = torchscan.onnx.check(model, timeout=1, runtimes=("onnxruntime",))
    # The limit counts from the child's start, however late the waiting thread hears of it:
    # not STARTUP (60 s) per level.
    assert time.monotonic() - start < 30
    assert report.inputs[-1] == "unused: float32[0]"
    assert [c.status for c in report.comparisons] == ["timeout", "timeout"]


def test_the_start_up_of_a_child_process_does_not_count_against_the_time_limit(
    tmp_path, monkeypatch
) -> None:
    # A Python that takes 4 s to start, more than the limit: the model's run is what counts (3 s
    # for a tiny model, ample on a loaded machine, where 1 s for onnxruntime's session was not).
    slow = tmp_path / "slow-python"
    slow.write_text(f'#!/bin/sh\nsleep 4\nexec "{sys.executable}" "$@"\n')
    slow.chmod(0o755)
    monkeypatch.setattr(_runtimes.sys, "executable", str(slow))
    model = scan_model([oh.make_node("Add", ["h_in", "x_t"], ["h_out"])])
    model.graph.input.append(oh.make_tensor_value_info("unused", 1, (0,)))  # a child process
    start = time.monotonic()
    report = torchscan.onnx.check(model, timeout=3)
    assert time.monotonic() - start > 8  # two children, each 4 s to start
    assert report.ok, report
    assert [c.status for c in report.comparisons] == ["baseline", "ok", "ok", "ok"]


def test_the_child_process_imports_neither_torch_nor_torchscan(tmp_path) -> None:
    """Its start-up costs what onnxruntime's import costs."""
    import pickle
    import subprocess

    model = scan_model([oh.make_node("Add", ["h_in", "x_t"], ["h_out"])])
    feeds = {"h0": np.zeros(2, np.float32), "xs": np.ones((3, 2), np.float32)}
    with open(tmp_path / "in.pkl", "wb") as f:
        pickle.dump((model.SerializeToString(), feeds, "default"), f)
    probe = (
        "import runpy, sys; sys.argv = [sys.argv[1], sys.argv[2]]; "
        "runpy.run_path(sys.argv[0], run_name='__main__'); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torchscan', 'onnx')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, _runtimes._ort.__file__, str(tmp_path)],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert out == ["ready", "[]"]
    with open(tmp_path / "out.pkl", "rb") as f:
        status, (final, ys) = pickle.load(f)
    assert status == "ok"
    np.testing.assert_array_equal(final, [3, 3])
    np.testing.assert_array_equal(ys, [[1, 1], [2, 2], [3, 3]])


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
    with pytest.raises(ValueError, match=r"^torchscan\.onnx\.check: timeout must be") as raised:
        torchscan.onnx.check(spinning_loop(), timeout=timeout)
    assert str(raised.value) == (
        f"torchscan.onnx.check: timeout must be a finite number of seconds greater than 0, or "
        f"None, not {timeout!r}"
    )


def test_a_check_that_compared_nothing_is_not_compared_and_fails() -> None:
    model = scan_model([oh.make_node("Add", ["h_in", "x_t"], ["h_out"])])
    report = torchscan.onnx.check(model, runtimes=("onnxruntime",))
    assert (report.verdict, report.ok, report.strict) == ("not compared", False, True)
    assert report.ran == ("onnxruntime-unoptimized", "onnxruntime")  # the baseline first
    assert report.independent == ("onnxruntime",)
    assert report.summary() == (
        "NOT COMPARED: 1 Scan/Loop node checked, no findings; too few independent sources ran "
        "the model to compare outputs: only onnxruntime ran"
    )
    assert (report.to_dict()["status"], report.to_dict()["ok"]) == ("not compared", False)
    accepted = torchscan.onnx.check(model, runtimes=("onnxruntime",), strict=False)
    assert (accepted.verdict, accepted.ok) == ("not compared", True)
    assert (accepted.to_dict()["status"], accepted.to_dict()["ok"]) == ("not compared", True)
    assert torchscan.onnx.check(model).ok


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
        ("onnxruntime-unoptimized", "ok"),
        ("reference", "ok"),
        ("imported", "ok"),
    ]
    wrong = torchscan.onnx.check(model, module=lambda h0, xs: (h0, xs), inputs=[h0, xs])
    assert wrong.summary() == (
        "FAILED: onnxruntime mismatch, onnxruntime-unoptimized mismatch, reference mismatch, "
        "imported mismatch"
    )
