"""The ``torchscan`` command, run as users run it: ``python -m torchscan check ...``."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import tomllib
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

ROOT = Path(__file__).resolve().parents[1]


# Options whose runs are made in a process of their own: --timeout stops runs with signals and
# threads, --version is what ``python -m torchscan`` answers from its entry point. (--module
# imports the user's module and puts the folder on sys.path: both are undone after the run.)
OWN_PROCESS = ("--timeout", "--version")


def torchscan(*args: str | Path, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m torchscan *args`` in ``cwd``: in a process of its own for the options of
    :data:`OWN_PROCESS` and without arguments, else ``torchscan._cli.main`` in this process
    (the same function the entry point calls), with stdout and stderr captured."""
    argv = [str(a) for a in args]
    if not argv or any(a in OWN_PROCESS for a in argv):
        return subprocess.run(
            [sys.executable, "-m", "torchscan", *argv],
            capture_output=True,
            text=True,
            cwd=cwd,
            timeout=timeout,
        )
    from torchscan._cli import main

    out, err, before = io.StringIO(), io.StringIO(), os.getcwd()
    path, modules = list(sys.path), set(sys.modules)
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exit:  # argparse's own exits (--help)
                code = exit.code if isinstance(exit.code, int) else 2
    finally:
        os.chdir(before)
        sys.path[:] = path
        folder = Path(cwd).resolve()
        for name in set(sys.modules) - modules:  # the user's modules (--module), imported anew
            file = getattr(sys.modules[name], "__file__", None)
            if file and Path(file).resolve().is_relative_to(folder):
                del sys.modules[name]
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def scan_model(axis: int = 0) -> onnx.ModelProto:
    """``h, ys = scan(h + x)`` over x of shape (T, 2), T dynamic, along ``axis``."""
    info = oh.make_tensor_value_info
    body = oh.make_graph(
        [oh.make_node("Add", ["h", "x"], ["h2"]), oh.make_node("Identity", ["h2"], ["y"])],
        "body",
        [info("h", TensorProto.FLOAT, (2,)), info("x", TensorProto.FLOAT, (2,))],
        [info("h2", TensorProto.FLOAT, (2,)), info("y", TensorProto.FLOAT, (2,))],
    )
    node = oh.make_node(
        "Scan", ["h0", "xs"], ["hT", "ys"], body=body, num_scan_inputs=1, scan_input_axes=[axis]
    )
    graph = oh.make_graph(
        [node],
        "main",
        [info("h0", TensorProto.FLOAT, (2,)), info("xs", TensorProto.FLOAT, ("T", 2))],
        [info("hT", TensorProto.FLOAT, (2,)), info("ys", TensorProto.FLOAT, ("T", 2))],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 16)])


@pytest.fixture
def files(tmp_path: Path) -> Path:
    onnx.save(scan_model(), tmp_path / "scan.onnx")
    onnx.save(scan_model(axis=5), tmp_path / "broken.onnx")
    data = scan_model().SerializeToString()
    (tmp_path / "cut.onnx").write_bytes(data[: len(data) // 2])
    (tmp_path / "notes.onnx").write_text("not a model\n")
    relu = oh.make_graph(
        [oh.make_node("Relu", ["x"], ["y"])],
        "mlp",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, (2,))],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, (2,))],
    )
    onnx.save(oh.make_model(relu, opset_imports=[oh.make_opsetid("", 17)]), tmp_path / "mlp.onnx")
    named = scan_model()
    named.graph.node[0].name = "abc"
    (tmp_path / "corrupt.onnx").write_bytes(named.SerializeToString().replace(b"abc", b"a\xfec"))
    without_opsets = scan_model()
    del without_opsets.opset_import[:]
    (tmp_path / "cut_at_graph.onnx").write_bytes(without_opsets.SerializeToString())
    assert data.startswith((tmp_path / "cut_at_graph.onnx").read_bytes())
    np.savez(tmp_path / "f64.npz", h0=np.zeros(2), xs=np.zeros((3, 2), np.float32))
    np.savez(tmp_path / "rank.npz", h0=np.zeros(2, np.float32), xs=np.zeros(3, np.float32))
    np.savez(tmp_path / "h0.npz", h0=np.zeros(2, np.float32))
    (tmp_path / "badpb").mkdir()
    h0 = numpy_helper.from_array(np.zeros(2, np.float32), "h0").SerializeToString()
    (tmp_path / "badpb" / "input_0.pb").write_bytes(h0)
    (tmp_path / "badpb" / "input_1.pb").write_bytes(b"\xff\xff")
    (tmp_path / "f64pb").mkdir()
    for i, (name, value) in enumerate([("h0", np.zeros(2, np.float32)), ("xs", np.zeros((3, 2)))]):
        proto = numpy_helper.from_array(value, name).SerializeToString()
        (tmp_path / "f64pb" / f"input_{i}.pb").write_bytes(proto)
    return tmp_path


def test_a_clean_model_exits_0_with_a_table(files: Path) -> None:
    done = torchscan("check", "scan.onnx", cwd=files)
    assert done.returncode == 0, done.stderr
    assert "Scan and Loop nodes" in done.stdout
    assert done.stdout.rstrip().endswith(
        "OK: 1 Scan/Loop node checked, no findings; outputs agree across reference, onnxruntime, "
        "onnxruntime-unoptimized, imported; no PyTorch baseline or expected outputs took part"
    )
    assert done.stderr == ""


def test_a_model_with_findings_exits_1(files: Path) -> None:
    done = torchscan("check", "broken.onnx", "--lint-only", cwd=files)
    assert done.returncode == 1, done.stderr
    assert "scan-axis-range" in done.stdout
    assert done.stdout.rstrip().endswith("FAILED: 1 finding")


def test_a_model_with_findings_is_run_and_exits_1(files: Path) -> None:
    done = torchscan("check", "broken.onnx", cwd=files)
    assert done.returncode == 1, done.stderr
    assert done.stderr == ""
    lines = [" ".join(line.strip("│ ").split()) for line in done.stdout.splitlines()]
    assert "Findings" in lines
    assert (
        "Scan #0 │ scan-axis-range │ scan_input_axes[0] is 5, outside [-2, 1]: │ “Accepted range "
        "is [-r, r-1] where r ="
    ) in lines
    assert "Outputs (none computed)" in lines
    assert "onnxruntime │ │ │ │ │ error" in lines
    assert "reference │ │ │ │ │ error" in lines
    onnxruntime = (
        "error: [ONNXRuntimeError] : 1 : FAIL : Node () Op (Scan) [ShapeInferenceError] "
        "scan_input_axes axis value 5 is invalid for a tensor of rank 2"
    )
    assert lines[-5:] == [
        f"onnxruntime: {onnxruntime}",
        f"onnxruntime-unoptimized: {onnxruntime}",
        "reference: error: Scan: scan_input_axes holds 5, outside [-2, 1]",
        "imported: error: node #0 (Scan-16) of the main graph: torchscan.scan: in_axes does not "
        "fit every leaf of xs: * in_axes gives it 5: xs[0] has shape (3, 2), so axis must be in "
        "[-2, 1]",
        "FAILED: 1 finding, onnxruntime error, onnxruntime-unoptimized error, reference error, "
        "imported error",
    ]


def test_a_loop_that_never_ends_is_reported_and_not_run(files: Path) -> None:
    info = oh.make_tensor_value_info
    body = oh.make_graph(
        [oh.make_node("Identity", ["c"], ["c2"]), oh.make_node("Neg", ["v"], ["v2"])],
        "body",
        [info("i", TensorProto.INT64, ()), info("c", TensorProto.BOOL, ()), info("v", 1, (2,))],
        [info("c2", TensorProto.BOOL, ()), info("v2", 1, (2,))],
    )
    loop = oh.make_node("Loop", ["", "", "v0"], ["vT"], body=body, name="forever")
    graph = oh.make_graph([loop], "main", [info("v0", 1, (2,))], [info("vT", 1, (2,))])
    onnx.save(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 16)]), files / "loop.onnx")
    done = torchscan("check", "loop.onnx", "--json", cwd=files)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert [f["rule"] for f in report["findings"]] == ["loop-never-ends"]
    assert report["comparisons"] == []
    assert report["notes"] == [
        "the model was not run: Loop 'forever' never ends (see its loop-never-ends finding), so "
        "no runtime could finish it"
    ]


def test_outputs_that_disagree_with_the_expected_ones_exit_1(files: Path) -> None:
    data = files / "test_data_set_0"
    data.mkdir()
    xs = np.arange(6, dtype=np.float32).reshape(3, 2)
    h0 = np.zeros(2, np.float32)
    values = {
        "input_0": (h0, "h0"),
        "input_1": (xs, "xs"),
        "output_0": (xs.sum(0), "hT"),
        "output_1": (np.cumsum(xs, 0) + 1, "ys"),  # one off
    }
    for name, (value, tensor) in values.items():
        (data / f"{name}.pb").write_bytes(
            numpy_helper.from_array(value, tensor).SerializeToString()
        )
    done = torchscan("check", "scan.onnx", "--inputs", files, "--json", cwd=files)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is False
    statuses = {c["source"]: c["status"] for c in report["comparisons"]}
    assert statuses == {
        "expected": "baseline",
        "onnxruntime": "mismatch",
        "onnxruntime-unoptimized": "mismatch",
        "reference": "mismatch",
        "imported": "mismatch",
    }
    ys = report["comparisons"][1]["outputs"][1]
    assert (ys["name"], ys["max_abs"], ys["ok"]) == ("ys", 1.0, False)


def test_json_output_parses_and_dims_set_random_inputs(files: Path) -> None:
    done = torchscan("check", "scan.onnx", "--json", "--dim", "T=4", "--atol", "0.001", cwd=files)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True
    assert report["atol"] == 0.001
    assert report["inputs"] == ["source: random (seed 0)", "h0: float32[2]", "xs: float32[4, 2]"]
    assert report["findings"] == []


UNREADABLE = [
    (["missing.onnx"], "torchscan check: error: missing.onnx: no such file"),
    (
        ["notes.onnx"],
        "torchscan check: error: notes.onnx: is not an ONNX model (byte 0 does not start a "
        "field of ModelProto)",
    ),
    (
        ["cut.onnx"],
        "torchscan check: error: cut.onnx: is truncated: its graph field declares 285 bytes, "
        "but the file ends 143 bytes into it",
    ),
    (
        ["mlp.onnx", "--lint-only"],
        "torchscan check: error: mlp.onnx: has no Scan, Loop or If node to lint, and no runtime "
        "is to run it (--lint-only, runtimes=()); there is nothing to check",
    ),
    (
        ["scan.onnx", "--inputs", "inputs.npz"],
        "torchscan check: error: inputs.npz: no such file",
    ),
    (
        ["corrupt.onnx", "--lint-only"],
        "torchscan check: error: corrupt.onnx: is corrupt: its string graph.node[0].name is "
        "not valid UTF-8 (b'a\\xfec')",
    ),
    (
        ["cut_at_graph.onnx", "--lint-only"],
        "torchscan check: error: cut_at_graph.onnx: has no opset_import, which every ONNX "
        "model needs to say the versions of its operators (a file cut short right after its "
        "graph field reads like this)",
    ),
    (
        ["scan.onnx", "--inputs", "f64.npz"],
        "torchscan check: error: scan.onnx: input 'h0' takes float32[2], but f64.npz gives "
        "float64[2]: its element type is float64, not float32",
    ),
    (
        ["scan.onnx", "--inputs", "rank.npz"],
        "torchscan check: error: scan.onnx: input 'xs' takes float32[T, 2], but rank.npz gives "
        "float32[3]: its rank is 1, not 2",
    ),
    (
        ["scan.onnx", "--inputs", "f64pb"],
        "torchscan check: error: scan.onnx: input 'xs' takes float32[T, 2], but "
        "f64pb/input_1.pb gives float64[3, 2]: its element type is float64, not float32",
    ),
    (
        ["scan.onnx", "--inputs", "h0.npz"],
        "torchscan check: error: h0.npz gives no value for input 'xs' of scan.onnx; its "
        "inputs are: h0, xs",
    ),
    (
        ["scan.onnx", "--inputs", "badpb"],
        "torchscan check: error: badpb/input_1.pb: cannot read input 'xs' from it: it is not "
        "a TensorProto (Error parsing message with type 'onnx.TensorProto': Wire format was "
        "corrupt)",
    ),
    (
        ["scan.onnx", "--dim", "T=99999999999"],
        "torchscan check: error: random input 'xs', float32[99999999999, 2], would hold "
        "199,999,999,998 elements, more than the 16,777,216 a random input may hold; give its "
        "dynamic dimensions smaller sizes with dims (--dim NAME=SIZE)",
    ),
]

UNREADABLE_IDS = [
    "missing",
    "not-onnx",
    "truncated",
    "no-loop",
    "missing-inputs",
    "corrupt-string",
    "cut-at-graph-end",
    "npz-dtype",
    "npz-rank",
    "pb-dtype",
    "npz-missing-input",
    "pb-unreadable",
    "huge-dim",
]


@pytest.mark.parametrize(("args", "line"), UNREADABLE, ids=UNREADABLE_IDS)
def test_unreadable_input_exits_2_with_one_line(files: Path, args: list[str], line: str) -> None:
    done = torchscan("check", *args, cwd=files)
    assert done.returncode == 2
    assert done.stderr == line + "\n"
    assert done.stdout == ""


@pytest.mark.parametrize(("args", "line"), UNREADABLE, ids=UNREADABLE_IDS)
def test_unreadable_input_with_json_prints_one_json_document(
    files: Path, args: list[str], line: str
) -> None:
    done = torchscan("check", *args, "--json", cwd=files)
    assert done.returncode == 2
    assert json.loads(done.stdout) == {
        "status": "error",
        "error": line.removeprefix("torchscan check: error: "),
        "exit_status": 2,
    }
    assert done.stderr == line + "\n"


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            ["--timeout", "0"],
            "argument --timeout: expected a number of seconds greater than 0, not '0'",
        ),
        (
            ["--timeout", "soon"],
            "argument --timeout: expected a number of seconds greater than 0, not 'soon'",
        ),
        (["--dim", "T"], "argument --dim: expected NAME=SIZE with SIZE a whole number, not 'T'"),
        (["--no-such-option"], "unrecognized arguments: --no-such-option"),
        (
            ["--strict", "--lint-only"],
            "--strict fails where fewer than two sources ran the model, and --lint-only runs "
            "none; give one of them",
        ),
        (
            ["--allow-single-source", "--lint-only"],
            "--allow-single-source passes where fewer than two sources ran the model, and "
            "--lint-only runs none; give one of them",
        ),
        (
            ["--strict", "--allow-single-source"],
            "--strict fails where fewer than two sources ran the model, and "
            "--allow-single-source passes; give one of them",
        ),
        (
            ["--module", "baselines:make", "--lint-only"],
            "--module gives a baseline for the runtimes, and --lint-only runs none; give one of "
            "them",
        ),
        (
            ["--runtimes", "onnxruntime,tvm"],
            "argument --runtimes: unknown runtime 'tvm' in 'onnxruntime,tvm'; the runtimes are "
            "onnxruntime, reference, imported",
        ),
        (
            ["--runtimes", "imported", "--lint-only"],
            "--runtimes names runtimes to run, and --lint-only runs none; give one of them",
        ),
        (
            ["--runtimes", "onnxruntime,torch"],
            "argument --runtimes: unknown runtime 'torch' in 'onnxruntime,torch': the module "
            "torchscan.onnx.to_torch makes of the model is the runtime 'imported', and eager "
            "PyTorch is the module given to compare with (--module); the runtimes are "
            "onnxruntime, reference, imported",
        ),
    ],
    ids=[
        "timeout-zero",
        "timeout-word",
        "malformed-dim",
        "unknown-option",
        "strict-lint-only",
        "allow-single-source-lint-only",
        "strict-allow-single-source",
        "module-lint-only",
        "unknown-runtime",
        "runtimes-lint-only",
        "old-name-of-imported",
    ],
)
def test_wrong_options_with_json_print_one_json_document(
    files: Path, args: list[str], error: str
) -> None:
    done = torchscan("check", "scan.onnx", *args, "--json", cwd=files)
    assert done.returncode == 2
    assert json.loads(done.stdout) == {"status": "error", "error": error, "exit_status": 2}
    # argparse's parser of the whole command line finds the options that no command takes
    prog = "torchscan" if error.startswith("unrecognized") else "torchscan check"
    assert done.stderr.splitlines() == [f"{prog}: error: {error}"]


def test_wrong_options_without_json_print_the_usage_and_one_line(files: Path) -> None:
    done = torchscan("check", "scan.onnx", "--timeout", "-5", cwd=files)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert lines[0].startswith("usage: torchscan check [-h]")
    assert lines[-1] == (
        "torchscan check: error: argument --timeout: expected a number of seconds greater than 0, "
        "not '-5'"
    )


def test_the_report_in_json_says_its_status(files: Path) -> None:
    done = torchscan("check", "broken.onnx", "--lint-only", "--json", cwd=files)
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert (report["status"], report["ok"], report["timeout"], report["strict"]) == (
        "failed",
        False,
        60.0,
        True,
    )


def test_version_prints_the_version_and_exits_0(files: Path) -> None:
    import torchscan as package

    done = torchscan("--version", cwd=files)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"torchscan {package.__version__}\n"
    assert done.stderr == ""


def test_a_loop_that_runs_past_the_timeout_is_stopped_and_exits_1(files: Path) -> None:
    from .onnx.test_check_timeout import spinning_loop

    onnx.save(spinning_loop(), files / "spin.onnx")
    done = torchscan("check", "spin.onnx", "--timeout", "1", cwd=files, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr == ""
    assert done.stdout.splitlines()[-5:] == [
        "onnxruntime: timed out after 1 s",
        "onnxruntime-unoptimized: timed out after 1 s",
        "reference: timed out after 1 s",
        "imported: timed out after 1 s",
        "FAILED: onnxruntime timed out, onnxruntime-unoptimized timed out, reference timed out, "
        "imported timed out",
    ]
    done = torchscan("check", "spin.onnx", "--timeout", "0.5", "--json", cwd=files, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["status"] == "failed"
    assert [(c["source"], c["status"], c["reason"]) for c in report["comparisons"]] == [
        ("onnxruntime", "timeout", "timed out after 0.5 s"),
        ("onnxruntime-unoptimized", "timeout", "timed out after 0.5 s"),
        ("reference", "timeout", "timed out after 0.5 s"),
        ("imported", "timeout", "timed out after 0.5 s"),
    ]


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/PID/maps")
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_ctrl_c_stops_the_check_at_once_and_exits_130(files: Path, as_json: bool) -> None:
    import signal
    import time

    from .onnx.test_check_timeout import spinning_loop

    onnx.save(spinning_loop(), files / "spin.onnx")
    command = [sys.executable, "-m", "torchscan", "check", "spin.onnx", "--timeout", "600"]
    child = subprocess.Popen(
        command + ["--json"] * as_json,
        cwd=files,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A shell ignores Ctrl-C for what it starts in the background, as a test run may be,
        # and Python keeps a signal ignored: the child gets Ctrl-C as a terminal would give it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        maps = Path(f"/proc/{child.pid}/maps")
        # onnxruntime is imported when the first runtime starts: then the model is running.
        while "onnxruntime_pybind11_state" not in maps.read_text():
            assert child.poll() is None
            assert time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(0.5)
        start = time.monotonic()
        child.send_signal(signal.SIGINT)
        stdout, stderr = child.communicate(timeout=20)
        assert time.monotonic() - start < 5
    finally:
        child.kill()
        child.communicate()  # and close its pipes
    assert child.returncode == 130
    assert stderr == "torchscan check: interrupted\n"
    if as_json:
        assert json.loads(stdout) == {
            "status": "interrupted",
            "error": "interrupted",
            "exit_status": 130,
        }
    else:
        assert stdout == ""


@pytest.mark.parametrize("options", [(), ("--strict",)])
def test_a_check_that_compared_nothing_exits_3(tmp_path: Path, options: tuple) -> None:
    from .onnx.test_check_random import noisy_scan

    # onnxruntime 1.32 has no RandomNormalLike-22: of the two runtimes asked for, the reference
    # evaluator runs it alone.
    onnx.save(noisy_scan(opset=22, reverse=True), tmp_path / "noisy.onnx")
    options = (*options, "--runtimes", "onnxruntime,reference")
    done = torchscan("check", "noisy.onnx", *options, cwd=tmp_path)
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == (
        "NOT COMPARED: 1 Scan/Loop node checked, no findings; too few independent sources ran "
        "the model to compare outputs: only reference ran (onnxruntime: not supported by that "
        "runtime; onnxruntime-unoptimized: not supported by that runtime)"
    )
    done = torchscan("check", "noisy.onnx", *options, "--json", cwd=tmp_path)
    assert done.returncode == 3, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert (report["status"], report["ok"], report["strict"]) == ("not compared", False, True)


def test_a_check_that_compared_nothing_passes_with_allow_single_source(tmp_path: Path) -> None:
    from .onnx.test_check_random import noisy_scan

    onnx.save(noisy_scan(opset=22, reverse=True), tmp_path / "noisy.onnx")
    done = torchscan(
        "check",
        "noisy.onnx",
        "--runtimes",
        "onnxruntime,reference",
        "--allow-single-source",
        "--json",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert (report["status"], report["ok"], report["strict"]) == ("not compared", True, False)


def test_strict_passes_a_check_that_compared_two_sources(files: Path) -> None:
    done = torchscan("check", "scan.onnx", "--strict", "--json", cwd=files)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["strict"] is True


BASELINES = """
import torch


class Cumulative(torch.nn.Module):
    def forward(self, h0, xs):
        assert not self.training
        ys = h0 + torch.cumsum(xs, 0)
        return ys[-1], ys


def make():
    return Cumulative()


def wrong():
    return lambda h0, xs: (h0, xs + 1)


not_callable = 3


def returns_a_number():
    return 3


def fails():
    raise RuntimeError("no weights")
"""


@pytest.fixture
def baselines(files: Path) -> Path:
    (files / "baselines.py").write_text(BASELINES)
    (files / "broken_baselines.py").write_text("import no_such_module_anywhere\n")
    return files


def test_a_module_is_a_further_source_and_the_baseline(baselines: Path) -> None:
    done = torchscan("check", "scan.onnx", "--module", "baselines:make", "--json", cwd=baselines)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert [(c["source"], c["status"]) for c in report["comparisons"]] == [
        ("pytorch", "baseline"),
        ("onnxruntime", "ok"),
        ("onnxruntime-unoptimized", "ok"),
        ("reference", "ok"),
        ("imported", "ok"),
    ]


def test_a_module_that_disagrees_exits_1(baselines: Path) -> None:
    done = torchscan("check", "scan.onnx", "--module", "baselines:wrong", cwd=baselines)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == (
        "FAILED: onnxruntime mismatch, onnxruntime-unoptimized mismatch, reference mismatch, "
        "imported mismatch"
    )


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ("baselines", "--module baselines: expected PACKAGE.MODULE:FACTORY"),
        (
            "no_such_package.models:make",
            "--module no_such_package.models:make: cannot import no_such_package.models "
            "(ModuleNotFoundError: No module named 'no_such_package')",
        ),
        (
            "broken_baselines:make",
            "--module broken_baselines:make: cannot import broken_baselines "
            "(ModuleNotFoundError: No module named 'no_such_module_anywhere')",
        ),
        ("baselines:missing", "--module baselines:missing: baselines has no attribute 'missing'"),
        (
            "baselines:not_callable",
            "--module baselines:not_callable: baselines.not_callable is an int, not a factory to "
            "call",
        ),
        (
            "baselines:returns_a_number",
            "--module baselines:returns_a_number: returns_a_number() returned an int, not an "
            "nn.Module or a callable",
        ),
        (
            "baselines:fails",
            "--module baselines:fails: fails() raised RuntimeError: no weights",
        ),
    ],
    ids=[
        "no-factory",
        "no-package",
        "import-fails",
        "no-attribute",
        "not-callable",
        "returns-int",
        "raises",
    ],
)
def test_a_module_that_cannot_be_used_exits_2_with_one_line(
    baselines: Path, spec: str, error: str
) -> None:
    done = torchscan("check", "scan.onnx", "--module", spec, cwd=baselines)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == f"torchscan check: error: {error}\n"


def test_a_malformed_dim_exits_2(files: Path) -> None:
    done = torchscan("check", "scan.onnx", "--dim", "T", cwd=files)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        "torchscan check: error: argument --dim: expected NAME=SIZE with SIZE a whole number, "
        "not 'T'"
    )


def test_a_model_importing_no_default_opset_exits_2_even_to_lint(files: Path) -> None:
    m = scan_model()
    m.opset_import[0].domain = "com.example"
    onnx.save(m, files / "no_opset.onnx")
    done = torchscan("check", "no_opset.onnx", "--lint-only", cwd=files)
    assert done.returncode == 2
    assert done.stderr == (
        "torchscan check: error: no_opset.onnx: imports no version of the default ONNX domain (no "
        'opset_import for "" or "ai.onnx"), so the version in force for Scan #0 is unknown and it '
        "cannot be checked\n"
    )


def test_a_dim_too_large_to_read_exits_2(files: Path) -> None:
    done = torchscan("check", "scan.onnx", "--dim", "T=" + "9" * 5000, cwd=files)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        f"torchscan check: error: argument --dim: SIZE is too large in 'T={'9' * 5000}'"
    )


def test_no_command_prints_the_help_and_exits_2(files: Path) -> None:
    done = torchscan(cwd=files)
    assert done.returncode == 2
    assert done.stderr.startswith("usage: torchscan [-h] [--version] COMMAND ...")


def test_the_script_entry_point_is_the_cli() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["torchscan"].partition(":")
    entry = getattr(importlib.import_module(module), function)
    assert entry.__name__ == "entry"
    assert entry.__module__ == "torchscan._cli"
    assert importlib.import_module("torchscan.__main__").entry is entry


def test_importing_torchscan_and_its_cli_imports_no_onnx() -> None:
    code = (
        "import sys, torchscan, torchscan._cli\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('onnx', 'onnxruntime')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.stdout.strip() == "[]", done.stderr


def test_running_out_of_memory_is_one_line_and_exits_2(monkeypatch, capsys) -> None:
    from torchscan import _cli
    from torchscan.onnx._check import _compare

    def exhausted(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(_compare, "check", exhausted)
    assert _cli.main(["check", "model.onnx"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "torchscan check: error: out of memory reading or running the model; give dynamic "
        "dimensions smaller sizes with --dim NAME=SIZE\n"
    )


def test_a_model_that_draws_noise_exits_0_with_its_random_output_not_compared(
    tmp_path: Path,
) -> None:
    from .onnx.test_check_random import noisy_scan

    onnx.save(noisy_scan(opset=18), tmp_path / "noisy.onnx")
    done = torchscan("check", "noisy.onnx", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [" ".join(line.strip("│ ").split()) for line in done.stdout.splitlines()]
    assert "onnxruntime │ ys │ (3, 2) │ - │ - │ not compared: random" in rows
    assert "onnxruntime │ total │ () │ 0 │ 0 │ ok" in rows
    assert done.stdout.splitlines()[-1] == (
        "OK: 1 Scan/Loop node checked, no findings; outputs agree across reference, onnxruntime, "
        "onnxruntime-unoptimized, imported; values not compared: random (ys, shifted); no "
        "PyTorch baseline or expected outputs took part"
    )


def test_a_model_that_no_runtime_runs_exits_3_and_says_why(tmp_path: Path) -> None:
    from .onnx.test_check_random import noisy_scan

    onnx.save(noisy_scan(opset=22, reverse=True), tmp_path / "noisy.onnx")
    done = torchscan("check", "noisy.onnx", "--runtimes", "onnxruntime,reference", cwd=tmp_path)
    assert done.returncode == 3, done.stdout + done.stderr
    not_implemented = (
        "not supported by that runtime: [ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find "
        "an implementation for RandomNormalLike(22) node with name 'noise'"
    )
    assert done.stdout.splitlines()[-3:] == [
        f"onnxruntime: {not_implemented}",
        f"onnxruntime-unoptimized: {not_implemented}",
        "NOT COMPARED: 1 Scan/Loop node checked, no findings; too few independent sources ran "
        "the model to compare outputs: only reference ran (onnxruntime: not supported by that "
        "runtime; onnxruntime-unoptimized: not supported by that runtime)",
    ]


def test_a_flipped_scan_passes_without_a_baseline_and_fails_with_the_module(
    baselines: Path,
) -> None:
    from .onnx.test_compare import cumulative_scan

    onnx.save(cumulative_scan(reverse=True), baselines / "flipped.onnx")
    done = torchscan("check", "flipped.onnx", cwd=baselines)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-2:] == [
        "note: no PyTorch baseline took part: the runtimes were held against each other only, so "
        "a model that computes the wrong thing the same way in every runtime (a wrong weight, a "
        "scan run in the wrong direction) passes. Give the PyTorch module (--module, module=) or "
        "the expected outputs (output_*.pb files next to the inputs, expected=) to catch it.",
        "OK: 1 Scan/Loop node checked, no findings; outputs agree across reference, onnxruntime, "
        "onnxruntime-unoptimized, imported; no PyTorch baseline or expected outputs took part",
    ]
    done = torchscan("check", "flipped.onnx", "--module", "baselines:make", cwd=baselines)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == (
        "FAILED: onnxruntime mismatch, onnxruntime-unoptimized mismatch, reference mismatch, "
        "imported mismatch"
    )
    assert "no PyTorch baseline" not in done.stdout


def _save_case(folder: Path, inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None:
    """An ONNX test case's data set: input_*.pb and output_*.pb."""
    folder.mkdir()
    for kind, values in (("input", inputs), ("output", outputs)):
        for i, value in enumerate(values):
            tensor = numpy_helper.from_array(np.asarray(value), f"{kind}_{i}")
            (folder / f"{kind}_{i}.pb").write_bytes(tensor.SerializeToString())


def test_an_lstm_model_gets_a_verdict(tmp_path: Path) -> None:
    from .onnx.test_compare import lstm_model

    model, module, x = lstm_model()
    onnx.save(model, tmp_path / "lstm.onnx")
    done = torchscan("check", "lstm.onnx", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "If and recurrent nodes" in done.stdout
    assert done.stdout.splitlines()[-1] == (
        "OK: no Scan, Loop or If node to lint, no findings; outputs agree across reference, "
        "onnxruntime, onnxruntime-unoptimized, imported; no PyTorch baseline or expected outputs "
        "took part"
    )
    import torch

    with torch.no_grad():
        want = module(x).numpy()
    _save_case(tmp_path / "wrong", [x.numpy()], [want + 1e-3])
    done = torchscan("check", "lstm.onnx", "--inputs", "wrong", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == (
        "FAILED: onnxruntime mismatch, onnxruntime-unoptimized mismatch, reference mismatch, "
        "imported mismatch"
    )


def test_an_if_model_gets_a_verdict_and_is_linted(tmp_path: Path) -> None:
    from .onnx.test_compare import if_model

    onnx.save(if_model(), tmp_path / "if.onnx")
    done = torchscan("check", "if.onnx", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith("OK: 1 If node checked, no findings; ")
    done = torchscan("check", "if.onnx", "--lint-only", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "OK: 1 If node checked, no findings"
    x = np.array([1.0, 2.0, 3.0], np.float32)
    _save_case(tmp_path / "right", [np.array(False), x], [x * 2])
    _save_case(tmp_path / "wrong", [np.array(False), x], [x + 1])
    done = torchscan("check", "if.onnx", "--inputs", "right", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    done = torchscan("check", "if.onnx", "--inputs", "wrong", "--json", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert (report["status"], report["ok"]) == ("failed", False)
    assert report["other_nodes"] == [{"node": "If 'pick'", "op": "If-16"}]
