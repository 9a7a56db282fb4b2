"""``torchscan.onnx.check`` running models: ONNX's own test cases, exports, errors."""

from __future__ import annotations

import functools
import json
import logging
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, numpy_helper
from onnx import helper as oh
from torch._higher_order_ops.scan import scan as hop_scan

import torchscan
import torchscan.onnx
from torchscan.onnx._check import _diff, _inputs, _random
from torchscan.onnx._lint import _load
from torchscan.onnx._lint._report import CheckedNode

from .._export import onnx_export

logging.getLogger("torch.onnx").setLevel(logging.ERROR)

# Every node test case of onnx 1.23 whose model has a Scan or a Loop, bodies included.
BACKEND_CASES = [
    "test_scan_sum",
    "test_scan9_sum",
    "test_scan9_multi_state",
    "test_scan9_scalar",
    "test_loop11",
    "test_loop13_seq",
    "test_loop16_seq_none",
    "test_range_float_type_positive_delta_expanded",
    "test_range_float16_type_positive_delta_expanded",
    "test_range_bfloat16_type_positive_delta_expanded",
    "test_range_int32_type_negative_delta_expanded",
    "test_sequence_map_identity_1_sequence_expanded",
    "test_sequence_map_identity_2_sequences_expanded",
    "test_sequence_map_identity_1_sequence_1_tensor_expanded",
    "test_sequence_map_add_2_sequences_expanded",
    "test_sequence_map_add_1_sequence_1_tensor_expanded",
    "test_sequence_map_extract_shapes_expanded",
    "test_linear_attention_linear_expanded",
    "test_linear_attention_gated_expanded",
    "test_linear_attention_gated_per_head_decay_expanded",
    "test_linear_attention_delta_expanded",
    "test_linear_attention_gated_delta_expanded",
    "test_linear_attention_gated_delta_beta_scalar_expanded",
    "test_linear_attention_gated_delta_gqa_expanded",
    "test_linear_attention_gated_delta_mqa_expanded",
    "test_linear_attention_decode_step_expanded",
    "test_linear_attention_prefill_with_past_expanded",
    "test_linear_attention_no_past_explicit_zeros_expanded",
    "test_linear_attention_explicit_scale_expanded",
    "test_linear_attention_fp16_expanded",
    "test_linear_attention_linear_t1_no_past_expanded",
]


@functools.cache
def backend_cases() -> dict:
    """onnx's node test cases (models, inputs, outputs; nothing downloaded), by name."""
    from onnx.backend.test.case.node import collect_testcases

    with np.errstate(all="ignore"):  # the generators of other cases overflow on purpose
        return {case.name: case for case in collect_testcases(None) if case.model is not None}


def _has_loop(graph: onnx.GraphProto) -> bool:
    return any(
        node.op_type in ("Scan", "Loop")
        or any(
            _has_loop(g) for a in node.attribute for g in ([a.g] if a.HasField("g") else a.graphs)
        )
        for node in graph.node
    )


def test_the_backend_cases_are_all_the_scan_and_loop_cases() -> None:
    found = [name for name, case in backend_cases().items() if _has_loop(case.model.graph)]
    assert sorted(found) == sorted(BACKEND_CASES)


@pytest.mark.parametrize("name", BACKEND_CASES)
def test_an_onnx_backend_case_read_from_its_files_matches_its_expected_outputs(
    name: str, tmp_path: Path
) -> None:
    case = backend_cases()[name]
    write_case(tmp_path, case.model, *case.data_sets[0])
    report = torchscan.onnx.check(tmp_path / "model.onnx", inputs=tmp_path / "test_data_set_0")
    assert report.ok, report
    statuses = {c.source: c.status for c in report.comparisons}
    assert statuses == {
        "expected": "baseline",
        "onnxruntime": "ok",
        "onnxruntime-unoptimized": "ok",
        "reference": "ok",  # Scan-8 (test_scan_sum) too
        "imported": "ok",  # sequences and optionals too
    }


@pytest.mark.parametrize("name", BACKEND_CASES)
def test_an_onnx_backend_case_passes_lint_and_matches_its_expected_outputs(name: str) -> None:
    case = backend_cases()[name]
    inputs, outputs = case.data_sets[0]
    report = torchscan.onnx.check(case.model, inputs=list(inputs), expected=list(outputs))
    assert report.ok, report
    assert report.findings == ()
    statuses = {c.source: c.status for c in report.comparisons}
    assert statuses == {
        "expected": "baseline",
        "onnxruntime": "ok",
        "onnxruntime-unoptimized": "ok",
        "reference": "ok",  # Scan-8 (test_scan_sum) too
        "imported": "ok",  # sequences and optionals too
    }


def test_a_case_folder_is_read_with_its_expected_outputs(tmp_path: Path) -> None:
    case = backend_cases()["test_loop13_seq"]
    write_case(tmp_path, case.model, *case.data_sets[0])
    report = torchscan.onnx.check(tmp_path / "model.onnx", inputs=tmp_path)
    assert report.ok, report
    assert report.comparisons[0].source == "expected"
    assert report.inputs[0] == f"source: {tmp_path}"


def write_case(folder: Path, model: onnx.ModelProto, inputs: list, outputs: list) -> None:
    """A test case folder as ONNX's backend tests lay it out."""
    onnx.save(model, folder / "model.onnx")
    data = folder / "test_data_set_0"
    data.mkdir()
    for prefix, values, infos in (
        ("input", inputs, model.graph.input),
        ("output", outputs, model.graph.output),
    ):
        for i, (value, info) in enumerate(zip(values, infos, strict=True)):
            proto = _value_proto(value, info.type, info.name)
            (data / f"{prefix}_{i}.pb").write_bytes(proto.SerializeToString())


def _value_proto(value, type_proto: onnx.TypeProto, name: str):
    """A value as ONNX's backend tests save it: TensorProto, SequenceProto or OptionalProto."""
    if type_proto.HasField("optional_type"):
        elem = type_proto.optional_type.elem_type
        kind = onnx.OptionalProto.SEQUENCE if elem.HasField("sequence_type") else None
        kind = kind or onnx.OptionalProto.TENSOR
        inner = value if value is None or isinstance(value, list) else np.asarray(value)
        return numpy_helper.from_optional(inner, name, kind)
    if type_proto.HasField("sequence_type"):
        return numpy_helper.from_list([np.asarray(v) for v in value], name)
    return numpy_helper.from_array(np.asarray(value), name)


# --- exported models ---------------------------------------------------------------------------


class HopRNN(torch.nn.Module):
    """An RNN written with torch's own ``scan`` higher-order operator."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = torch.nn.RNNCell(3, 4)

    def forward(self, xs: torch.Tensor, h: torch.Tensor):
        def step(h, x):
            h = self.cell(x, h)
            return h, h.clone()

        return hop_scan(step, h, xs)


class ScanGRU(torch.nn.Module):
    """A batch-first GRU written with ``torchscan.scan``, in reverse."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = torch.nn.GRUCell(3, 4)

    def forward(self, xs: torch.Tensor, h: torch.Tensor):
        def step(h, x):
            h = self.cell(x, h)
            return h, h

        return torchscan.scan(step, h, xs, axis=1, reverse=True)


def _export(module: torch.nn.Module, args: tuple, time_axis: int) -> onnx.ModelProto:
    time = torch.export.Dim("T", min=1)
    program = onnx_export(module, args, dynamo=True, dynamic_shapes=({time_axis: time}, None))
    return program.model_proto


@pytest.fixture(scope="session")
def hop_export() -> tuple[torch.nn.Module, tuple, onnx.ModelProto]:
    torch.manual_seed(0)
    module = HopRNN().eval()
    args = (torch.randn(5, 2, 3), torch.zeros(2, 4))
    return module, args, _export(module, args, 0)


@pytest.fixture(scope="session")
def torchscan_export() -> tuple[torch.nn.Module, tuple, onnx.ModelProto]:
    torch.manual_seed(0)
    module = ScanGRU().eval()
    args = (torch.randn(2, 5, 3), torch.randn(2, 4))
    return module, args, _export(module, args, 1)


def test_a_torch_hop_scan_export_agrees_with_pytorch_in_both_runtimes(hop_export) -> None:
    module, args, model = hop_export
    report = torchscan.onnx.check(model, module=module, args=args)
    assert report.ok, report
    assert [c.status for c in report.comparisons] == ["baseline", "ok", "ok", "ok", "ok"]
    assert [c.source for c in report.comparisons] == [
        "pytorch", "onnxruntime", "onnxruntime-unoptimized", "reference", "imported"
    ]  # fmt: skip
    assert all(d.max_abs < 1e-5 for c in report.comparisons[1:] for d in c.outputs)


def test_a_torch_hop_scan_export_agrees_across_runtimes_on_random_inputs(hop_export) -> None:
    _, _, model = hop_export
    report = torchscan.onnx.check(model, dims={"T": 7})
    assert report.ok, report
    assert report.inputs == ("source: random (seed 0)", "xs: float32[7, 2, 3]", "h: float32[2, 4]")


def test_a_torchscan_export_agrees_with_pytorch(torchscan_export) -> None:
    module, args, model = torchscan_export
    report = torchscan.onnx.check(model, module=module, args=args)
    assert report.ok, report
    onnxruntime = report.comparisons[1]
    assert (onnxruntime.source, onnxruntime.against, onnxruntime.status) == (
        "onnxruntime",
        "pytorch",
        "ok",
    )
    # A Scan along axis 1: the reference evaluator runs it with torchscan's Scan.
    assert [(c.source, c.status) for c in report.comparisons[2:]] == [
        ("onnxruntime-unoptimized", "ok"),
        ("reference", "ok"),
        ("imported", "ok"),
    ]


def test_a_module_that_disagrees_is_a_mismatch(torchscan_export) -> None:
    _, args, model = torchscan_export
    torch.manual_seed(1)
    other = ScanGRU().eval()  # other weights
    report = torchscan.onnx.check(model, module=other, args=args, runtimes=("onnxruntime",))
    assert not report.ok
    for onnxruntime in report.comparisons[1:]:
        assert onnxruntime.status == "mismatch"
        assert all(not d.ok and d.max_abs > 1e-3 for d in onnxruntime.outputs)
    assert report.summary() == "FAILED: onnxruntime mismatch, onnxruntime-unoptimized mismatch"


def test_a_random_dynamic_dimension_gets_a_size_no_static_dimension_has(torchscan_export) -> None:
    _, _, model = torchscan_export
    # 2, 3 and 4 are sizes of the inputs (and of the GRU's weights, with 12): T is 5.
    report = torchscan.onnx.check(model)
    assert report.ok, report
    assert report.inputs == ("source: random (seed 0)", "xs: float32[2, 5, 3]", "h: float32[2, 4]")


def _scan_over(*xs: tuple, h: tuple = (2,), axes: list[int] | None = None) -> onnx.ModelProto:
    """``h = h + x0 + x1 + ...`` over scan inputs of the given shapes (per step: h's shape)."""
    names = [f"x{j}" for j in range(len(xs))]
    body = oh.make_graph(
        [oh.make_node("Sum", ["h_in", *[f"{n}_t" for n in names]], ["h_out"])],
        "body",
        [
            _info("h_in", TensorProto.FLOAT, h),
            *[_info(f"{n}_t", TensorProto.FLOAT, h) for n in names],
        ],
        [_info("h_out", TensorProto.FLOAT, h)],
    )
    attributes = {"scan_input_axes": axes} if axes else {}
    scan = oh.make_node(
        "Scan", ["h0", *names], ["hT"], body=body, num_scan_inputs=len(xs), **attributes
    )
    inputs = [_info("h0", TensorProto.FLOAT, h)]
    inputs += [_info(n, TensorProto.FLOAT, shape) for n, shape in zip(names, xs, strict=True)]
    graph = oh.make_graph([scan], "main", inputs, [_info("hT", TensorProto.FLOAT, h)])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 16)])


def _random_inputs(model: onnx.ModelProto, dims: dict[str, int]) -> dict[str, object]:
    """The random inputs ``check`` makes for ``model``, read as ``check`` reads it."""
    loaded = _load.read_model(model, "<ModelProto>")
    return _random.random_inputs(loaded.model, dims, loaded.typed)


def _random_shapes(model: onnx.ModelProto, **dims: int) -> dict[str, tuple]:
    return {name: value.shape for name, value in _random_inputs(model, dims).items()}


def test_the_scan_inputs_of_one_scan_get_one_length_whatever_their_dimension_names() -> None:
    model = _scan_over(("T", 2), ("U", 2))
    assert _random_shapes(model) == {"h0": (2,), "x0": (3, 2), "x1": (3, 2)}
    assert _random_shapes(model, U=6) == {"h0": (2,), "x0": (6, 2), "x1": (6, 2)}
    report = torchscan.onnx.check(model)
    assert report.ok, report
    assert [c.status for c in report.comparisons] == ["baseline", "ok", "ok", "ok"]


def test_a_scan_input_of_dynamic_length_gets_the_length_of_a_static_one() -> None:
    model = _scan_over((4, 2), ("U", 2))
    assert _random_shapes(model) == {"h0": (2,), "x0": (4, 2), "x1": (4, 2)}


def test_dimensions_that_are_not_scanned_together_get_sizes_of_their_own() -> None:
    # B is the batch, T the time along axis 1, and 3 a static size: all differ.
    model = _scan_over(("B", "T"), ("B", "T"), h=("B",), axes=[1, 1])
    assert _random_shapes(model) == {"h0": (3,), "x0": (3, 4), "x1": (3, 4)}
    model = _scan_over(("B", "T", 3), h=("B", 3), axes=[1])
    assert _random_shapes(model) == {"h0": (4, 3), "x0": (4, 5, 3)}


@pytest.mark.parametrize(
    ("model", "dims", "message"),
    [
        (
            lambda: _scan_over(("T", 2), ("U", 2)),
            {"T": 4, "U": 5},
            "dims sets 'T' to 4 and 'U' to 5, but they must be equal: both are among the lengths "
            "of the scan inputs of Scan #0",
        ),
        (
            lambda: _scan_over((4, 2), ("U", 2)),
            {"U": 5},
            "dims sets 'U' to 5, but it is one of the lengths of the scan inputs of Scan #0, which "
            "must be equal, and another of them is 4",
        ),
    ],
    ids=["two-names", "static"],
)
def test_dims_that_break_a_scan_are_refused(model, dims: dict, message: str) -> None:
    with pytest.raises(ValueError, match=r"^torchscan\.onnx\.check: dims sets ") as raised:
        torchscan.onnx.check(model(), dims=dims)
    assert str(raised.value) == f"torchscan.onnx.check: {message}"


def test_random_inputs_are_arrays_even_scalars_and_a_bool_scalar_is_true() -> None:
    rng = np.random.default_rng(0)
    for dtype in (np.bool_, np.complex64, np.complex128, np.float32, np.int64, np.object_):
        value = _random._random_array(np.dtype(dtype), (), rng)
        assert isinstance(value, np.ndarray), dtype
        assert (value.shape, value.dtype) == ((), np.dtype(dtype))
    assert _random._random_array(np.dtype(np.bool_), (), rng).item() is True
    assert _random._random_array(np.dtype(np.bool_), (100,), rng).sum() not in (0, 100)


def test_onnx_s_test_loop11_passes_on_random_inputs() -> None:
    # Its inputs: an int64 trip count, a bool cond and a float vector; cond is True, so that the
    # loop runs (1 to 3 iterations: random integers lie in [1, 3]).
    report = torchscan.onnx.check(backend_cases()["test_loop11"].model)
    assert report.ok, report
    assert report.inputs[1:3] == ("trip_count: int64[]", "cond: bool[]")
    statuses = {c.source: c.status for c in report.comparisons}
    assert statuses == {
        "reference": "baseline",
        "onnxruntime": "ok",
        "onnxruntime-unoptimized": "ok",
        "imported": "ok",
    }
    feeds = _random_inputs(backend_cases()["test_loop11"].model, {})
    assert (feeds["trip_count"].item(), feeds["cond"].item()) == (3, True)
    outputs = [(o.name, o.shape) for o in report.comparisons[0].outputs]
    assert outputs == [("res_y", "(1,)"), ("res_scan", "(3, 1)")]  # 3 iterations, not 0


def test_a_loop_that_never_ends_is_not_run() -> None:
    from .test_lint import loop_model

    model = loop_model(16)
    model.graph.node[0].input[0] = model.graph.node[0].input[1] = ""
    report = torchscan.onnx.check(model)
    assert [f.rule for f in report.findings] == ["loop-never-ends"]
    assert report.comparisons == ()
    assert report.notes == (
        "the model was not run: Loop #0 never ends (see its loop-never-ends finding), so no "
        "runtime could finish it",
    )
    assert not report.ok


def test_a_zero_length_scan_is_not_supported_and_does_not_end_the_process(
    torchscan_export,
) -> None:
    # onnxruntime 1.32 dies of SIGFPE on a zero-length scan along axis 1: it runs in a child.
    # The reference evaluator and the imported module run it, and are compared.
    _, _, model = torchscan_export
    report = torchscan.onnx.check(model, dims={"T": 0})
    assert (report.verdict, report.ok) == ("ok", True), report
    statuses = {c.source: c.status for c in report.comparisons}
    assert statuses == {
        "reference": "baseline",
        "onnxruntime": "unsupported",
        "onnxruntime-unoptimized": "unsupported",
        "imported": "ok",
    }
    for onnxruntime in report.comparisons[1:3]:
        assert onnxruntime.reason.startswith("an input has an empty dimension: ")
    # Without the imported module, one source ran: nothing is compared.
    without = torchscan.onnx.check(model, dims={"T": 0}, runtimes=("onnxruntime", "reference"))
    assert (without.verdict, without.ok) == ("not compared", False), without
    strict = torchscan.onnx.check(
        model, dims={"T": 0}, runtimes=("onnxruntime", "reference"), strict=False
    )
    assert strict.ok


def test_a_runtime_that_fails_on_a_broken_model_is_an_error() -> None:
    from .test_lint import scan_model

    # It runs in a child process, as the lint found fault with the model.
    report = torchscan.onnx.check(scan_model(16, scan_input_axes=[2]), runtimes=("onnxruntime",))
    assert not report.ok
    assert [f.rule for f in report.findings] == ["scan-axis-range"]
    assert [c.source for c in report.comparisons] == ["onnxruntime", "onnxruntime-unoptimized"]
    for onnxruntime in report.comparisons:
        assert onnxruntime.status == "error"
        assert (
            "scan_input_axes axis value 2 is invalid for a tensor of rank 2" in onnxruntime.reason
        )
    assert report.summary() == "FAILED: 1 finding, onnxruntime error, onnxruntime-unoptimized error"


def test_onnxruntime_does_not_run_int4() -> None:
    body = oh.make_graph(
        [oh.make_node("Identity", ["c_in"], ["c_out"]), oh.make_node("Identity", ["h_in"], ["h"])],
        "body",
        [_info("i", TensorProto.INT64, ()), _info("c_in", TensorProto.BOOL, ()), _info("h_in")],
        [_info("c_out", TensorProto.BOOL, ()), _info("h")],
    )
    loop = oh.make_node("Loop", ["M", "", "h0"], ["hT"], body=body)
    graph = oh.make_graph(
        [loop], "main", [_info("M", TensorProto.INT64, ()), _info("h0")], [_info("hT")]
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 21)])
    report = torchscan.onnx.check(model)
    assert (report.verdict, report.ok) == ("not compared", False), report
    statuses = {c.source: (c.status, c.reason) for c in report.comparisons}
    unsupported = ("unsupported", "onnxruntime has no CPU kernels for int4")
    assert statuses == {
        "reference": ("baseline", ""),
        "onnxruntime": unsupported,
        "onnxruntime-unoptimized": unsupported,
        "imported": ("unsupported", "input 'h0': torch has no element type int4"),
    }
    assert report.summary() == (
        "NOT COMPARED: 1 Scan/Loop node checked, no findings; too few independent sources ran "
        "the model to compare outputs: only reference ran (onnxruntime: not supported by that "
        "runtime; onnxruntime-unoptimized: not supported by that runtime; imported: not supported "
        "by that runtime)"
    )
    assert (
        "onnxruntime: not supported by that runtime: onnxruntime has no CPU kernels for int4"
        in str(report).splitlines()
    )


def _info(name: str, elem: int = TensorProto.INT4, shape: tuple = (2,)) -> onnx.ValueInfoProto:
    return oh.make_tensor_value_info(name, elem, shape)


def test_expected_outputs_that_differ_are_a_mismatch_with_the_error() -> None:
    case = backend_cases()["test_scan9_sum"]
    inputs, (y, z) = case.data_sets[0]
    wrong = z.copy()
    wrong[1, 0] += 0.5
    report = torchscan.onnx.check(case.model, inputs=list(inputs), expected={"y": y, "z": wrong})
    assert not report.ok
    onnxruntime = next(c for c in report.comparisons if c.source == "onnxruntime")
    assert onnxruntime.status == "mismatch"
    z_diff = onnxruntime.outputs[1]
    assert (z_diff.name, z_diff.shape, z_diff.max_abs, z_diff.ok) == ("z", "(3, 2)", 0.5, False)
    assert z_diff.max_rel == pytest.approx(0.5 / 4.5)


def test_the_report_renders_as_tables_and_as_json() -> None:
    case = backend_cases()["test_scan9_sum"]
    inputs, outputs = case.data_sets[0]
    report = torchscan.onnx.check(case.model, inputs=list(inputs), expected=list(outputs))
    text = str(report)
    assert text.startswith("torchscan check: <ModelProto> (opset 9)\n")
    for piece in ("Scan and Loop nodes", "Outputs against expected (atol 1e-05, rtol 1e-05)"):
        assert piece in text
    assert text.endswith(
        "OK: 1 Scan/Loop node checked, no findings; outputs agree across expected, onnxruntime, "
        "onnxruntime-unoptimized, reference, imported\n"
    )
    data = json.loads(report.to_json())
    assert data["ok"] is True
    assert data["nodes"] == [{"node": "Scan #0", "op": "Scan-9"}]
    assert data["comparisons"][1]["outputs"][0] == {
        "name": "y",
        "shape": "(2,)",
        "max_abs": 0.0,
        "max_rel": 0.0,
        "ok": True,
        "note": "",
        "not_compared": "",
    }


def test_npz_inputs_are_read_by_name_or_position(tmp_path: Path) -> None:
    case = backend_cases()["test_scan9_sum"]
    (initial, x), _ = case.data_sets[0]
    np.savez(tmp_path / "named.npz", initial=initial, x=x)
    np.savez(tmp_path / "positional.npz", initial, x)
    for name in ("named.npz", "positional.npz"):
        report = torchscan.onnx.check(case.model, inputs=tmp_path / name)
        assert report.ok, report
        assert report.inputs[1:] == ("initial: float32[2]", "x: float32[3, 2]")


# --- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (np.array([1.0, np.nan]), np.array([1.0, np.nan]), (0.0, 0.0, True)),
        (np.array([np.nan]), np.array([1.0]), (math.inf, math.inf, False)),
        (np.array([np.inf]), np.array([np.inf]), (0.0, 0.0, True)),
        (np.array([1.0]), np.array([0.0]), (1.0, math.inf, False)),
        (np.array([2.0, 1.0]), np.array([1.0, 1.0]), (1.0, 1.0, False)),
        (np.array([1.0 + 1e-6]), np.array([1.0]), (pytest.approx(1e-6), pytest.approx(1e-6), True)),
        (np.array(["a"], dtype=object), np.array(["b"], dtype=object), (math.inf, math.inf, False)),
        (np.array([True]), np.array([True]), (0.0, 0.0, True)),
    ],
    ids=["nan-nan", "nan-1", "inf-inf", "1-0", "2-1", "within", "strings", "bools"],
)
def test_errors_are_largest_absolute_and_relative(a, b, expected) -> None:
    assert _diff._errors(a, b, 1e-5, 1e-5) == expected


def _model_without_loops() -> onnx.ModelProto:
    graph = oh.make_graph(
        [oh.make_node("Relu", ["x"], ["y"])],
        "mlp",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, (2,))],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, (2,))],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def _with_input(type_proto: onnx.TypeProto) -> onnx.ModelProto:
    """test_scan9_sum with one more input, 'm', that it does not read."""
    model = onnx.ModelProto()
    model.CopyFrom(_scan9())
    model.graph.input.append(oh.make_value_info("m", type_proto))
    return model


def _map_type() -> onnx.TypeProto:
    return oh.make_map_type_proto(TensorProto.INT64, oh.make_tensor_type_proto(1, (2,)))


def _sparse_type() -> onnx.TypeProto:
    return oh.make_sparse_tensor_type_proto(TensorProto.FLOAT, (2,))


def _scan9() -> onnx.ModelProto:
    return backend_cases()["test_scan9_sum"].model


def _files(tmp_path: Path) -> dict[str, Path]:
    """Files the error cases read: each kind of bad model, and inputs."""
    model = _scan9().SerializeToString()
    files = {
        "empty.onnx": b"",
        "notes.txt": b"hello, this is not a model\n",
        "cut.onnx": model[: len(model) // 2],
        "mlp.onnx": _model_without_loops().SerializeToString(),
        "scan.onnx": model,
        "inputs.txt": b"1 2 3",
        "bad.npz": b"PK not a zip",
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    with_weights = onnx.ModelProto()
    with_weights.CopyFrom(_scan9())
    with_weights.graph.initializer.append(numpy_helper.from_array(np.ones(4, np.float32), "w"))
    onnx.save(
        with_weights,
        tmp_path / "weights.onnx",
        save_as_external_data=True,
        location="absent.bin",
        size_threshold=0,
    )
    (tmp_path / "absent.bin").unlink()
    np.savez(tmp_path / "extra.npz", initial=np.zeros(2, np.float32), x=np.zeros((3, 2)), z=1)
    np.savez(tmp_path / "missing.npz", initial=np.zeros(2, np.float32))
    (tmp_path / "folder").mkdir()
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "input_0.pb").write_bytes(
        numpy_helper.from_array(np.zeros(2)).SerializeToString()
    )
    (tmp_path / "garbage").mkdir()
    for i in range(2):
        (tmp_path / "garbage" / f"input_{i}.pb").write_bytes(b"\xff\xff\xff")
    onnx.save(_with_input(_map_type()), tmp_path / "map.onnx")
    (tmp_path / "maps").mkdir()
    (tmp_path / "maps" / "input_0.pb").write_bytes(
        numpy_helper.from_array(np.zeros(2)).SerializeToString()
    )
    (tmp_path / "maps" / "input_1.pb").write_bytes(
        numpy_helper.from_array(np.zeros(2)).SerializeToString()
    )
    (tmp_path / "maps" / "input_2.pb").write_bytes(b"")
    more = ["extra.npz", "missing.npz", "folder", "weights.onnx", "one", "garbage", "map.onnx"]
    more.append("maps")
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    bad_inputs = {
        "f64": (np.zeros(2), x),
        "shape": (np.zeros(5, np.float32), x),
        "rank": (np.zeros((2, 2), np.float32), x),
        "f64pb": (np.zeros(2), x),
        "shapepb": (np.zeros(2, np.float32), np.zeros((3, 3), np.float32)),
    }
    for name, (initial, xs) in bad_inputs.items():
        if name.endswith("pb"):
            (tmp_path / name).mkdir()
            for i, value in enumerate((initial, xs)):
                proto = numpy_helper.from_array(value, ["initial", "x"][i])
                (tmp_path / name / f"input_{i}.pb").write_bytes(proto.SerializeToString())
            more.append(name)
        else:
            np.savez(tmp_path / f"{name}.npz", initial=initial, x=xs)
            more.append(f"{name}.npz")
    named = onnx.ModelProto()
    named.CopyFrom(_scan9())
    named.graph.node[0].name = "abc"
    data = named.SerializeToString()
    assert data.count(b"abc") == 1
    (tmp_path / "corrupt.onnx").write_bytes(data.replace(b"abc", b"a\xfec"))
    without_opsets = onnx.ModelProto()
    without_opsets.CopyFrom(_scan9())
    del without_opsets.opset_import[:]
    cut = without_opsets.SerializeToString()
    assert model.startswith(cut)  # the model cut right after its graph field
    (tmp_path / "cut_at_graph.onnx").write_bytes(cut)
    more += ["corrupt.onnx", "cut_at_graph.onnx"]
    return {name: tmp_path / name for name in [*files, *more]}


INTERNAL = {"pb file of a sparse tensor", "random sparse tensor"}
"""The cases of :data:`CHECK_ERRORS` that call the check's helpers, not the public function."""

CHECK_ERRORS: dict[str, tuple[Callable[[dict], object], type, str]] = {
    "missing model": (
        lambda f: torchscan.onnx.check(f["folder"] / "nope.onnx"),
        FileNotFoundError,
        "{folder}/nope.onnx: no such file",
    ),
    "folder as model": (
        lambda f: torchscan.onnx.check(f["folder"]),
        ValueError,
        "{folder}: is a folder, not an ONNX model file",
    ),
    "empty model": (
        lambda f: torchscan.onnx.check(f["empty.onnx"]),
        ValueError,
        "{empty.onnx}: is empty, not an ONNX model",
    ),
    "not onnx": (
        lambda f: torchscan.onnx.check(f["notes.txt"]),
        ValueError,
        "{notes.txt}: is not an ONNX model (byte 0 does not start a field of ModelProto)",
    ),
    "truncated": (
        lambda f: torchscan.onnx.check(f["cut.onnx"]),
        ValueError,
        "{cut.onnx}: is truncated: its graph field declares 331 bytes, but the file ends 159 "
        "bytes into it",
    ),
    "nothing to lint or run": (
        lambda f: torchscan.onnx.check(f["mlp.onnx"], runtimes=()),
        ValueError,
        "{mlp.onnx}: has no Scan, Loop or If node to lint, and no runtime is to run it "
        "(--lint-only, runtimes=()); there is nothing to check",
    ),
    "missing external data": (
        lambda f: torchscan.onnx.check(f["weights.onnx"]),
        ValueError,
        "{weights.onnx}: cannot read its external data: ",
    ),
    "no graph": (
        lambda f: torchscan.onnx.check(b"\x08\x07"),
        ValueError,
        "<bytes>: is not an ONNX model (it has no graph)",
    ),
    "model type": (
        lambda f: torchscan.onnx.check(3),
        TypeError,
        "model is a path, bytes or an onnx.ModelProto, not int",
    ),
    "missing inputs": (
        lambda f: torchscan.onnx.check(f["scan.onnx"], inputs=f["folder"] / "in.npz"),
        FileNotFoundError,
        "{folder}/in.npz: no such file",
    ),
    "inputs not npz": (
        lambda f: torchscan.onnx.check(f["scan.onnx"], inputs=f["inputs.txt"]),
        ValueError,
        "{inputs.txt}: cannot read inputs from it: expected a .npz file or a folder of "
        "input_*.pb files",
    ),
    "bad npz": (
        lambda f: torchscan.onnx.check(f["scan.onnx"], inputs=f["bad.npz"]),
        ValueError,
        "{bad.npz}: cannot read arrays from it (",
    ),
    "extra input": (
        lambda f: torchscan.onnx.check(f["scan.onnx"], inputs=f["extra.npz"]),
        ValueError,
        "{extra.npz} gives values for 'z', which {scan.onnx} has no input for; its inputs are: "
        "initial, x",
    ),
    "missing input": (
        lambda f: torchscan.onnx.check(f["scan.onnx"], inputs=f["missing.npz"]),
        ValueError,
        "{missing.npz} gives no value for input 'x' of {scan.onnx}; its inputs are: initial, x",
    ),
    "input count": (
        lambda f: torchscan.onnx.check(f["scan.onnx"], inputs=[np.zeros(2)]),
        ValueError,
        "the inputs give 1 values, but {scan.onnx} has 2 inputs: initial, x",
    ),
    "folder without inputs": (
        lambda f: torchscan.onnx.check(f["scan.onnx"], inputs=f["folder"]),
        ValueError,
        "{folder}: has no input_*.pb files and no test_data_set_* folder",
    ),
    "too few pb files": (
        lambda f: torchscan.onnx.check(f["scan.onnx"], inputs=f["one"]),
        ValueError,
        "{one}: has 1 input_*.pb files, but {scan.onnx} has 2 inputs",
    ),
    "bad pb file": (
        lambda f: torchscan.onnx.check(f["scan.onnx"], inputs=f["garbage"]),
        ValueError,
        "{garbage}/input_0.pb: cannot read input 'initial' from it: it is not a TensorProto (",
    ),
    "map input": (
        lambda f: torchscan.onnx.check(f["map.onnx"]),
        ValueError,
        "{map.onnx}: onnx_ir cannot read the model to lint it: Map types are not supported yet.",
    ),
    "pb file of a sparse tensor": (
        lambda f: _inputs.read_inputs(
            f["maps"], _load.read_model(_with_input(_sparse_type()), "<ModelProto>").model
        ),
        ValueError,
        "{maps}/input_2.pb: cannot read input 'm', of type sparse_tensor_type, from it",
    ),
    "random sparse tensor": (
        lambda f: _random_inputs(_with_input(_sparse_type()), {}),
        ValueError,
        "input 'm' is of type sparse_tensor_type: give its values with inputs",
    ),
    "random tensor of no element type": (
        lambda f: torchscan.onnx.check(_with_input(oh.make_tensor_type_proto(0, (2,)))),
        ValueError,
        "input 'm' has no element type: give its values with inputs",
    ),
    "expected count": (
        lambda f: torchscan.onnx.check(f["scan.onnx"], expected=[np.zeros(2)]),
        ValueError,
        "expected holds 1 values, but the model has 2 outputs",
    ),
    "expected name": (
        lambda f: torchscan.onnx.check(f["scan.onnx"], expected={"y": np.zeros(2)}),
        ValueError,
        "expected has no value for model output 'z'",
    ),
    "unknown dim": (
        lambda f: torchscan.onnx.check(f["scan.onnx"], dims={"T": 3}),
        ValueError,
        "dims sets 'T', which is not a dynamic dimension of the model's inputs; theirs are: none",
    ),
    "dims with inputs": (
        lambda f: torchscan.onnx.check(
            f["scan.onnx"], inputs=[np.zeros(2), np.zeros(3)], dims={"T": 3}
        ),
        ValueError,
        "dims sets the sizes of random inputs, but the inputs were given",
    ),
    "args without module": (
        lambda f: torchscan.onnx.check(f["scan.onnx"], args=(1,)),
        ValueError,
        "args was given without module: PyTorch runs module(*args)",
    ),
    "args count": (
        lambda f: torchscan.onnx.check(
            f["scan.onnx"], module=torch.nn.Identity(), args=(torch.zeros(2),)
        ),
        ValueError,
        "args hold 1 tensors, but the model has 2 inputs (initial, x); give the model's inputs "
        "with inputs",
    ),
    "inputs of another type": (
        lambda f: torchscan.onnx.check(f["scan.onnx"], inputs=f["f64.npz"]),
        ValueError,
        "{scan.onnx}: input 'initial' takes float32[2], but {f64.npz} gives float64[2]: its "
        "element type is float64, not float32",
    ),
    "inputs of another shape": (
        lambda f: torchscan.onnx.check(f["scan.onnx"], inputs=f["shape.npz"]),
        ValueError,
        "{scan.onnx}: input 'initial' takes float32[2], but {shape.npz} gives float32[5]: its "
        "dimension 0 is 5, not 2",
    ),
    "inputs of another rank": (
        lambda f: torchscan.onnx.check(f["scan.onnx"], inputs=f["rank.npz"]),
        ValueError,
        "{scan.onnx}: input 'initial' takes float32[2], but {rank.npz} gives float32[2, 2]: its "
        "rank is 2, not 1",
    ),
    "pb files of another type": (
        lambda f: torchscan.onnx.check(f["scan.onnx"], inputs=f["f64pb"]),
        ValueError,
        "{scan.onnx}: input 'initial' takes float32[2], but {f64pb}/input_0.pb gives "
        "float64[2]: its element type is float64, not float32",
    ),
    "pb files of another shape": (
        lambda f: torchscan.onnx.check(f["scan.onnx"], inputs=f["shapepb"]),
        ValueError,
        "{scan.onnx}: input 'x' takes float32[3, 2], but {shapepb}/input_1.pb gives "
        "float32[3, 3]: its dimension 1 is 3, not 2",
    ),
    "given values of another type": (
        lambda f: torchscan.onnx.check(
            f["scan.onnx"], inputs={"initial": np.zeros(2, np.int32), "x": np.zeros((3, 2))}
        ),
        ValueError,
        "{scan.onnx}: input 'initial' takes float32[2], but the inputs give int32[2]: its "
        "element type is int32, not float32",
    ),
    "args of another type": (
        lambda f: torchscan.onnx.check(
            f["scan.onnx"],
            module=torch.nn.Identity(),
            args=(torch.zeros(2, dtype=torch.float64), torch.zeros(3, 2)),
        ),
        ValueError,
        "{scan.onnx}: input 'initial' takes float32[2], but the tensors of args give "
        "float64[2]: its element type is float64, not float32",
    ),
    "a tensor for a sequence": (
        lambda f: torchscan.onnx.check(
            backend_cases()["test_loop13_seq"].model,
            inputs=[np.array(2), np.array(True), np.zeros(2, np.float32)],
        ),
        ValueError,
        "the model: input 'seq_empty' takes seq of float32[], but the inputs give float32[2]: "
        "it is not a sequence (give a list of tensors)",
    ),
    "a sequence of another type": (
        lambda f: torchscan.onnx.check(
            backend_cases()["test_loop13_seq"].model,
            inputs=[np.array(2), np.array(True), [np.zeros(2, np.int64)]],
        ),
        ValueError,
        "the model: input 'seq_empty' takes seq of float32[], but the inputs give seq[1] of "
        "int64[2]: its element 0: its element type is int64, not float32",
    ),
    "None for a tensor": (
        lambda f: torchscan.onnx.check(f["scan.onnx"], inputs=[None, np.zeros((3, 2))]),
        ValueError,
        "{scan.onnx}: input 'initial' takes float32[2], but the inputs give None: it is not a "
        "tensor",
    ),
    "corrupt string": (
        lambda f: torchscan.onnx.check(f["corrupt.onnx"]),
        ValueError,
        "{corrupt.onnx}: is corrupt: its string graph.node[0].name is not valid UTF-8 (b'a\\xfec')",
    ),
    "cut right after the graph": (
        lambda f: torchscan.onnx.check(f["cut_at_graph.onnx"], runtimes=()),
        ValueError,
        "{cut_at_graph.onnx}: has no opset_import, which every ONNX model needs to say the "
        "versions of its operators (a file cut short right after its graph field reads like this)",
    ),
    "random input too large": (
        lambda f: torchscan.onnx.check(_scan_over(("T", 2)), dims={"T": 10**11}),
        ValueError,
        "random input 'x0', float32[100000000000, 2], would hold 200,000,000,000 elements, more "
        "than the 16,777,216 a random input may hold; give its dynamic dimensions smaller sizes "
        "with dims (--dim NAME=SIZE)",
    ),
    "unknown runtime": (
        lambda f: torchscan.onnx.check(f["scan.onnx"], runtimes=("tensorrt",)),
        ValueError,
        "unknown runtime 'tensorrt'; the runtimes are onnxruntime, reference",
    ),
    "the old name of the imported module": (
        lambda f: torchscan.onnx.check(f["scan.onnx"], runtimes=("onnxruntime", "torch")),
        ValueError,
        "unknown runtime 'torch': the module torchscan.onnx.to_torch makes of the model is the "
        "runtime 'imported', and eager PyTorch is the module given to compare with (module=); "
        "the runtimes are onnxruntime, reference, imported",
    ),
    "runtimes as a string": (
        lambda f: torchscan.onnx.check(f["scan.onnx"], runtimes="onnxruntime"),
        ValueError,
        "runtimes is a sequence of names, not the string 'onnxruntime'",
    ),
    "negative atol": (
        lambda f: torchscan.onnx.check(f["scan.onnx"], atol=-1.0),
        ValueError,
        "atol must be a finite number at least 0, not -1.0",
    ),
    "nan rtol": (
        lambda f: torchscan.onnx.check(f["scan.onnx"], rtol=math.nan),
        ValueError,
        "rtol must be a finite number at least 0, not nan",
    ),
}


@pytest.mark.parametrize("case", sorted(CHECK_ERRORS))
def test_bad_input_raises_a_clear_error(case: str, tmp_path: Path) -> None:
    call, error, message = CHECK_ERRORS[case]
    files = _files(tmp_path)
    expected = message
    for name, path in files.items():
        expected = expected.replace("{" + name + "}", str(path))
    if issubclass(error, (ValueError, TypeError)) and case not in INTERNAL:
        expected = f"torchscan.onnx.check: {expected}"  # torchscan's own: named by the API
    with pytest.raises(error) as raised:
        call(files)
    assert str(raised.value).startswith(expected)


def test_a_random_input_that_does_not_fit_in_memory_is_refused(monkeypatch) -> None:
    allocate = _random._random_array

    def exhausted(dtype, shape, rng):
        if math.prod(shape) > 1000:
            raise MemoryError
        return allocate(dtype, shape, rng)

    monkeypatch.setattr(_random, "_random_array", exhausted)
    with pytest.raises(ValueError, match=r"^torchscan\.onnx\.check: random input 'x0', ") as raised:
        torchscan.onnx.check(_scan_over(("T", 2)), dims={"T": 10**6})
    assert str(raised.value) == (
        "torchscan.onnx.check: random input 'x0', float32[1000000, 2], does not fit in memory; "
        "give its dynamic "
        "dimensions smaller sizes with dims (--dim NAME=SIZE)"
    )


@pytest.mark.parametrize(
    ("dims", "message"),
    [
        ({"N": -1}, "dims sets 'N' to -1, not a size (an int at least 0)"),
        ({"N": 2.5}, "dims sets 'N' to 2.5, not a size (an int at least 0)"),
    ],
    ids=["negative", "float"],
)
def test_a_bad_dimension_size_is_refused(dims: dict, message: str) -> None:
    graph = oh.make_graph(
        [oh.make_node("Scan", ["x"], ["y"], num_scan_inputs=1, body=_identity_body())],
        "main",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, ("N",))],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, ("N",))],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 16)])
    with pytest.raises(
        ValueError,
        match="^torchscan\\.onnx\\.check: " + message.replace("(", r"\(").replace(")", r"\)"),
    ):
        torchscan.onnx.check(model, dims=dims)


def test_an_input_without_a_shape_cannot_be_made_up() -> None:
    graph = oh.make_graph(
        [oh.make_node("Scan", ["x"], ["y"], num_scan_inputs=1, body=_identity_body())],
        "main",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 16)])
    with pytest.raises(
        ValueError,
        match=r"^torchscan\.onnx\.check: input 'x' has no shape \(not even a rank\): give its "
        r"values$",
    ):
        torchscan.onnx.check(model)


def _identity_body() -> onnx.GraphProto:
    return oh.make_graph(
        [oh.make_node("Identity", ["e"], ["f"])],
        "body",
        [oh.make_tensor_value_info("e", TensorProto.FLOAT, ())],
        [oh.make_tensor_value_info("f", TensorProto.FLOAT, ())],
    )


# --- what a check without a PyTorch baseline cannot catch -------------------------------------


def cumulative_scan(reverse: bool = False) -> onnx.ModelProto:
    """``h, ys = scan(h + x)`` over ``xs[T, 2]``; ``reverse``: reading xs from its end, a model
    exported wrong that every runtime computes alike."""
    info = oh.make_tensor_value_info
    body = oh.make_graph(
        [oh.make_node("Add", ["h", "x"], ["h2"]), oh.make_node("Identity", ["h2"], ["y"])],
        "body",
        [info("h", TensorProto.FLOAT, (2,)), info("x", TensorProto.FLOAT, (2,))],
        [info("h2", TensorProto.FLOAT, (2,)), info("y", TensorProto.FLOAT, (2,))],
    )
    directions = {"scan_input_directions": [1]} if reverse else {}
    node = oh.make_node(
        "Scan", ["h0", "xs"], ["hT", "ys"], body=body, num_scan_inputs=1, **directions
    )
    graph = oh.make_graph(
        [node],
        "main",
        [info("h0", TensorProto.FLOAT, (2,)), info("xs", TensorProto.FLOAT, ("T", 2))],
        [info("hT", TensorProto.FLOAT, (2,)), info("ys", TensorProto.FLOAT, ("T", 2))],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 16)])


class Cumulative(torch.nn.Module):
    """What :func:`cumulative_scan` computes, forward."""

    def forward(self, h0: torch.Tensor, xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ys = h0 + torch.cumsum(xs, 0)
        return ys[-1], ys


def test_without_a_baseline_a_scan_in_the_wrong_direction_passes_and_the_report_says_so() -> None:
    flipped = cumulative_scan(reverse=True)
    h0, xs = torch.zeros(2), torch.arange(8.0).reshape(4, 2)
    report = torchscan.onnx.check(flipped, inputs=[h0, xs])
    assert report.ok, report  # every runtime reads xs backwards alike
    assert not report.baseline_took_part
    lines = str(report).splitlines()
    assert lines[-2:] == [
        "note: no PyTorch baseline took part: the runtimes were held against each other only, so "
        "a model that computes the wrong thing the same way in every runtime (a wrong weight, a "
        "scan run in the wrong direction) passes. Give the PyTorch module (--module, module=) or "
        "the expected outputs (output_*.pb files next to the inputs, expected=) to catch it.",
        "OK: 1 Scan/Loop node checked, no findings; outputs agree across reference, onnxruntime, "
        "onnxruntime-unoptimized, imported; no PyTorch baseline or expected outputs took part",
    ]
    caught = torchscan.onnx.check(flipped, module=Cumulative(), args=(h0, xs))
    assert (caught.verdict, caught.ok) == ("failed", False)
    assert caught.summary() == (
        "FAILED: onnxruntime mismatch, onnxruntime-unoptimized mismatch, reference mismatch, "
        "imported mismatch"
    )
    expected = [t.numpy() for t in Cumulative()(h0, xs)]
    assert not torchscan.onnx.check(flipped, inputs=[h0, xs], expected=expected).ok
    right = torchscan.onnx.check(cumulative_scan(), module=Cumulative(), args=(h0, xs))
    assert right.ok, right
    assert right.baseline_took_part
    assert right.summary() == (
        "OK: 1 Scan/Loop node checked, no findings; outputs agree across pytorch, onnxruntime, "
        "onnxruntime-unoptimized, reference, imported"
    )
    assert not any(note.startswith("no PyTorch baseline") for note in right.notes)


# --- models without Scan or Loop: If, LSTM, and none of them ----------------------------------


class Lstm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lstm(x)[0]


@functools.cache
def lstm_model() -> tuple[onnx.ModelProto, torch.nn.Module, torch.Tensor]:
    """``nn.LSTM`` exported by ``torch.onnx.export(dynamo=True)``: one LSTM node, no loop."""
    torch.manual_seed(0)
    module, x = Lstm().eval(), torch.randn(5, 2, 3)
    program = onnx_export(module, (x,), dynamo=True)
    return program.model_proto, module, x


def if_model() -> onnx.ModelProto:
    """``y = x + 1 if cond else x * 2``, one If node."""
    info = oh.make_tensor_value_info
    one = oh.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    two = oh.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    then = oh.make_graph(
        [oh.make_node("Add", ["x", "one"], ["a"])], "then", [], [info("a", TensorProto.FLOAT, [3])]
    )
    orelse = oh.make_graph(
        [oh.make_node("Mul", ["x", "two"], ["m"])], "else", [], [info("m", TensorProto.FLOAT, [3])]
    )
    node = oh.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=orelse, name="pick")
    graph = oh.make_graph(
        [node],
        "main",
        [info("cond", TensorProto.BOOL, []), info("x", TensorProto.FLOAT, [3])],
        [info("y", TensorProto.FLOAT, [3])],
        [one, two],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 16)])


def test_an_lstm_model_is_compared_and_its_node_listed() -> None:
    model, module, x = lstm_model()
    ops = {n.op_type for n in model.graph.node}
    assert "LSTM" in ops
    assert not ops & {"Scan", "Loop", "If"}
    report = torchscan.onnx.check(model, inputs=[x])
    assert report.ok, report
    assert report.nodes == ()
    assert [(n.node.split(" ")[0], n.op) for n in report.other_nodes] == [("LSTM", "LSTM-14")]
    assert {c.source: c.status for c in report.comparisons} == {
        "reference": "baseline",
        "onnxruntime": "ok",
        "onnxruntime-unoptimized": "ok",
        "imported": "ok",
    }
    assert report.summary() == (
        "OK: no Scan, Loop or If node to lint, no findings; outputs agree across reference, "
        "onnxruntime, onnxruntime-unoptimized, imported; no PyTorch baseline or expected outputs "
        "took part"
    )
    rows = [" ".join(line.strip("│ ").split()) for line in str(report).splitlines()]
    assert "If and recurrent nodes" in rows
    assert f"{report.other_nodes[0].node} │ LSTM-14 │ no rules (outputs compared)" in rows
    with torch.no_grad():
        want = module(x).numpy()
    assert torchscan.onnx.check(model, inputs=[x], module=module, args=(x,)).ok
    wrong = torchscan.onnx.check(model, inputs=[x], expected=[want + 1e-3])
    assert wrong.summary() == (
        "FAILED: onnxruntime mismatch, onnxruntime-unoptimized mismatch, reference mismatch, "
        "imported mismatch"
    )


def test_an_if_model_is_linted_and_compared() -> None:
    model = if_model()
    report = torchscan.onnx.check(model)
    assert report.ok, report
    assert report.other_nodes == (CheckedNode("If 'pick'", "If-16"),)
    assert report.summary() == (
        "OK: 1 If node checked, no findings; outputs agree across reference, onnxruntime, "
        "onnxruntime-unoptimized, imported; no PyTorch baseline or expected outputs took part"
    )
    rows = [" ".join(line.strip("│ ").split()) for line in str(report).splitlines()]
    assert "If 'pick' │ If-16 │ ok" in rows
    x = np.array([1.0, 2.0, 3.0], np.float32)
    inputs = {"cond": np.array(False), "x": x}
    assert torchscan.onnx.check(model, inputs=inputs, expected=[x * 2]).ok
    wrong = torchscan.onnx.check(model, inputs=inputs, expected=[x + 1])
    assert not wrong.ok
    assert wrong.summary() == (
        "FAILED: onnxruntime mismatch, onnxruntime-unoptimized mismatch, reference mismatch, "
        "imported mismatch"
    )
    linted = torchscan.onnx.check(model, runtimes=())
    assert (linted.verdict, linted.comparisons) == ("ok", ())
    assert linted.summary() == "OK: 1 If node checked, no findings"


def test_an_if_whose_branches_disagree_on_a_shape_is_a_finding_without_scan_or_loop() -> None:
    model = if_model()
    del model.opset_import[:]
    model.opset_import.append(oh.make_opsetid("", 10))  # If-1: one shape for both branches
    model.graph.node[0].attribute[1].g.output[0].type.tensor_type.shape.dim[0].dim_value = 4
    report = torchscan.onnx.check(model, runtimes=())
    assert [f.rule for f in report.findings] == ["if-branch-shapes"]
    assert report.summary() == "FAILED: 1 finding"
    rows = [" ".join(line.strip("│ ").split()) for line in str(report).splitlines()]
    assert "If 'pick' │ If-1 │ 1 finding" in rows


def test_a_model_with_no_loop_branch_or_recurrence_is_compared() -> None:
    report = torchscan.onnx.check(_model_without_loops())
    assert report.ok, report
    assert (report.nodes, report.other_nodes) == ((), ())
    assert report.summary().startswith(
        "OK: no Scan, Loop or If node to lint, no findings; outputs agree across reference, "
    )


def test_an_if_without_a_version_in_force_is_listed_as_not_checked() -> None:
    model = if_model()
    del model.opset_import[:]
    model.opset_import.append(oh.make_opsetid("com.example", 1))
    report = torchscan.onnx.check(model)
    assert report.other_nodes == (CheckedNode("If 'pick'", "If (no version in force)"),)
    rows = [" ".join(line.strip("│ ").split()) for line in str(report).splitlines()]
    assert "If 'pick' │ If (no version in force) │ not checked" in rows
    # onnxruntime runs it; the model fails onnx.checker, so the others' errors are the model's
    assert report.summary() == "FAILED: reference error, imported error"
