"""The operators ``check`` gives onnx's reference evaluator in place of its own: each against
onnxruntime and numpy, and onnx's own departure from the specification that it corrects."""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnx.reference
import pytest
from onnx import TensorProto
from onnx import helper as oh

import torchscan.onnx
from torchscan.onnx._check._runtimes import reference_ops

from ._runtimes import run_onnxruntime_on

INF = np.inf


def _one_node(node: onnx.NodeProto, inputs: list, output_type: int, opset: int, inits=()):
    graph = oh.make_graph(
        [node],
        "g",
        [oh.make_tensor_value_info(name, elem, shape) for name, elem, shape in inputs],
        [oh.make_tensor_value_info(node.output[0], output_type, None)],
        list(inits),
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])


def _reference(model: onnx.ModelProto, feeds: dict, ops=None) -> np.ndarray:
    with np.errstate(all="ignore"):
        return onnx.reference.ReferenceEvaluator(model, new_ops=ops).run(None, feeds)[0]


# --- ReduceLogSumExp ---------------------------------------------------------------------------

ROWS = np.array(
    [
        [-INF, -INF, -INF],  # every path unreachable: -inf, where onnx 1.23 gives NaN
        [0.0, -INF, 1.0],
        [INF, -INF, 0.0],
        [100.0, 100.0, -5.0],  # large: the maximum must be taken out before exp
    ],
    np.float32,
)


def _log_sum_exp_model(opset: int, axes: list[int] | None, keepdims: int, noop: int = 0):
    attributes = {"keepdims": keepdims}
    inputs, inits = ["x"], []
    if opset < 18 and axes is not None:
        attributes["axes"] = axes
    elif axes is not None:
        inputs.append("axes")
        inits.append(oh.make_tensor("axes", TensorProto.INT64, [len(axes)], axes))
    if noop:
        attributes["noop_with_empty_axes"] = noop
    node = oh.make_node("ReduceLogSumExp", inputs, ["y"], **attributes)
    x = ("x", TensorProto.FLOAT, list(ROWS.shape))
    return _one_node(node, [x], TensorProto.FLOAT, opset, inits)


def _log_sum_exp_by_definition(x: np.ndarray, axes, keepdims: bool) -> np.ndarray:
    """``log(sum(exp(x)))``, the specification's definition, in float64."""
    with np.errstate(all="ignore"):
        total = np.sum(np.exp(x.astype(np.float64)), axis=axes, keepdims=keepdims)
        return np.log(total).astype(np.float32)


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize(
    ("axes", "keepdims"), [([1], 0), ([1], 1), ([-1], 0), ([0], 0), (None, 0), ([0, 1], 1)]
)
def test_reduce_log_sum_exp_agrees_with_onnxruntime_and_the_definition(
    opset: int, axes, keepdims: int
) -> None:
    model = _log_sum_exp_model(opset, axes, keepdims)
    ours = _reference(model, {"x": ROWS}, reference_ops())
    numpy_axes = None if axes is None else tuple(axes)
    by_definition = _log_sum_exp_by_definition(ROWS, numpy_axes, bool(keepdims))
    for onnxruntime in run_onnxruntime_on(model, {"x": ROWS}).values():
        np.testing.assert_allclose(ours, onnxruntime[0], rtol=1e-6)
    np.testing.assert_allclose(ours, by_definition, rtol=1e-6)
    assert ours.dtype == np.float32


def test_onnx_s_reduce_log_sum_exp_gives_nan_for_a_row_of_minus_infinity() -> None:
    """What the replacement is for: onnx 1.23 against the specification (-inf)."""
    model = _log_sum_exp_model(18, [1], 0)
    assert np.isnan(_reference(model, {"x": ROWS})[0])
    assert _reference(model, {"x": ROWS}, reference_ops())[0] == -INF


def test_reduce_log_sum_exp_of_a_row_with_nan_is_nan() -> None:
    model = _log_sum_exp_model(18, [1], 0)
    x = ROWS.copy()
    x[1, 0] = np.nan
    ours = _reference(model, {"x": x}, reference_ops())
    np.testing.assert_array_equal(np.isnan(ours), [False, True, False, False])
    for onnxruntime in run_onnxruntime_on(model, {"x": x}).values():
        np.testing.assert_array_equal(ours, onnxruntime[0])
    np.testing.assert_allclose(ours, _log_sum_exp_by_definition(x, 1, False), rtol=1e-6)


def test_reduce_log_sum_exp_with_no_axes_and_noop_is_the_identity() -> None:
    model = _log_sum_exp_model(18, None, 1, noop=1)
    ours = _reference(model, {"x": ROWS}, reference_ops())
    np.testing.assert_array_equal(ours, ROWS)
    for onnxruntime in run_onnxruntime_on(model, {"x": ROWS}).values():
        np.testing.assert_array_equal(ours, onnxruntime[0])


def test_reduce_log_sum_exp_of_an_empty_set_is_minus_infinity() -> None:
    node = oh.make_node("ReduceLogSumExp", ["x", "axes"], ["y"], keepdims=0)
    axes = oh.make_tensor("axes", TensorProto.INT64, [1], [1])
    model = _one_node(node, [("x", TensorProto.FLOAT, [2, 0])], TensorProto.FLOAT, 18, [axes])
    x = np.zeros((2, 0), np.float32)
    np.testing.assert_array_equal(_reference(model, {"x": x}, reference_ops()), [-INF, -INF])


def test_a_log_space_scan_over_unreachable_states_passes_the_check() -> None:
    """A CTC-like recursion: ``alpha = logsumexp(alpha + x)`` over states that start at -inf."""
    info = oh.make_tensor_value_info
    body = oh.make_graph(
        [
            oh.make_node("Add", ["a_in", "x_t"], ["s"]),
            oh.make_node("ReduceLogSumExp", ["s", "axes"], ["a_out"], keepdims=0),
            oh.make_node("Identity", ["a_out"], ["y"]),
        ],
        "body",
        [info("a_in", TensorProto.FLOAT, [3]), info("x_t", TensorProto.FLOAT, [3, 3])],
        [info("a_out", TensorProto.FLOAT, [3]), info("y", TensorProto.FLOAT, [3])],
        [oh.make_tensor("axes", TensorProto.INT64, [1], [1])],
    )
    scan = oh.make_node("Scan", ["a0", "xs"], ["aT", "ys"], body=body, num_scan_inputs=1)
    graph = oh.make_graph(
        [scan],
        "main",
        [info("a0", TensorProto.FLOAT, [3]), info("xs", TensorProto.FLOAT, [4, 3, 3])],
        [info("aT", TensorProto.FLOAT, [3]), info("ys", TensorProto.FLOAT, [4, 3])],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    a0 = np.array([0.0, -INF, -INF], np.float32)
    xs = np.full((4, 3, 3), -INF, np.float32)
    xs[:, 0, 0] = 0.0  # state 0 is reachable from state 0 only; states 1 and 2 never are
    report = torchscan.onnx.check(model, inputs={"a0": a0, "xs": xs})
    assert report.ok, report
    assert {c.source: c.status for c in report.comparisons} == {
        "reference": "baseline",
        "onnxruntime": "ok",
        "onnxruntime-unoptimized": "ok",
        "imported": "ok",
    }


# --- GatherElements ----------------------------------------------------------------------------


def _gather_model(data_shape, indices_shape, axis: int | None):
    attributes = {} if axis is None else {"axis": axis}
    node = oh.make_node("GatherElements", ["data", "indices"], ["y"], **attributes)
    inputs = [
        ("data", TensorProto.FLOAT, list(data_shape)),
        ("indices", TensorProto.INT64, list(indices_shape)),
    ]
    return _one_node(node, inputs, TensorProto.FLOAT, 13, [])


GATHERS = {
    "axis -1": ((2, 3), (2, 2), -1),
    "axis 1": ((2, 3), (2, 2), 1),
    "axis -2": ((3, 2), (2, 2), -2),
    "axis 0": ((3, 2), (2, 2), 0),
    "no axis": ((3, 2), (2, 2), None),
    "rank 3, axis -1 of 100": ((2, 3, 100), (2, 3, 5), -1),
    "rank 3, axis 1": ((2, 4, 3), (2, 6, 3), 1),
    "indices smaller than data": ((4, 5), (2, 3), 1),
}


@pytest.mark.parametrize("case", list(GATHERS))
def test_gather_elements_agrees_with_onnxruntime_and_numpy(case: str) -> None:
    data_shape, indices_shape, axis = GATHERS[case]
    rng = np.random.default_rng(0)
    data = rng.standard_normal(data_shape).astype(np.float32)
    along = (axis or 0) % len(data_shape)
    size = data_shape[along]
    indices = rng.integers(-size, size, size=indices_shape)  # negative indices too
    model = _gather_model(data_shape, indices_shape, axis)
    feeds = {"data": data, "indices": indices}
    ours = _reference(model, feeds, reference_ops())
    for onnxruntime in run_onnxruntime_on(model, feeds).values():
        np.testing.assert_array_equal(ours, onnxruntime[0])
    covered = data[
        tuple(slice(None) if d == along else slice(0, n) for d, n in enumerate(indices_shape))
    ]
    np.testing.assert_array_equal(ours, np.take_along_axis(covered, indices, axis=along))
    assert ours.shape == tuple(indices_shape)


def test_onnx_s_gather_elements_fails_on_a_negative_axis() -> None:
    """What the replacement is for: onnx 1.23 refuses axis=-1, which the specification allows
    ("Accepted range is [-r, r-1] where r = rank(data)")."""
    model = _gather_model((2, 3), (2, 2), -1)
    feeds = {"data": np.zeros((2, 3), np.float32), "indices": np.zeros((2, 2), np.int64)}
    with pytest.raises(ValueError, match="Except for dimension -1"):
        _reference(model, feeds)
    assert _reference(model, feeds, reference_ops()).shape == (2, 2)


def test_gather_elements_refuses_an_index_out_of_range_as_onnxruntime_does() -> None:
    model = _gather_model((2, 3), (2, 2), -1)
    feeds = {"data": np.zeros((2, 3), np.float32), "indices": np.full((2, 2), 3, np.int64)}
    with pytest.raises(IndexError):
        _reference(model, feeds, reference_ops())
    with pytest.raises(Exception, match="Out of range value in index tensor"):
        run_onnxruntime_on(model, feeds)


def test_gather_elements_refuses_indices_larger_than_data_off_the_axis() -> None:
    model = _gather_model((2, 3), (3, 3), 1)
    feeds = {"data": np.zeros((2, 3), np.float32), "indices": np.zeros((3, 3), np.int64)}
    with pytest.raises(ValueError, match=r"^GatherElements: indices have 3 entries on axis 0, "):
        onnx.reference.ReferenceEvaluator(model, new_ops=reference_ops()).run(None, feeds)


# --- Scatter (opsets 9 and 10) ------------------------------------------------------------------


@pytest.mark.parametrize("opset", [9, 10])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_scatter_agrees_with_onnxruntime_and_numpy(opset: int, axis: int | None) -> None:
    rng = np.random.default_rng(abs(axis or 0))
    data = rng.standard_normal((3, 4)).astype(np.float32)
    along = (axis or 0) % 2
    size = data.shape[along]
    # a permutation along the axis in every slice (no index written twice), negative ones too
    indices = np.argsort(rng.random(data.shape), axis=along)
    indices = (indices - size * (rng.random(indices.shape) > 0.5)).astype(np.int64)
    updates = rng.standard_normal(indices.shape).astype(np.float32)
    attributes = {} if axis is None else {"axis": axis}
    node = oh.make_node("Scatter", ["data", "indices", "updates"], ["y"], **attributes)
    model = _one_node(
        node,
        [
            ("data", TensorProto.FLOAT, list(data.shape)),
            ("indices", TensorProto.INT64, list(indices.shape)),
            ("updates", TensorProto.FLOAT, list(updates.shape)),
        ],
        TensorProto.FLOAT,
        opset,
    )
    feeds = {"data": data, "indices": indices, "updates": updates}
    ours = _reference(model, feeds, reference_ops())
    expected = data.copy()
    np.put_along_axis(expected, indices % size, updates, axis=along)
    np.testing.assert_array_equal(ours, expected)
    for onnxruntime in run_onnxruntime_on(model, feeds).values():
        np.testing.assert_array_equal(ours, onnxruntime[0])
    with pytest.raises(NotImplementedError, match="'Scatter'"):
        _reference(model, feeds)  # what the replacement is for


# --- Pad ---------------------------------------------------------------------------------------

PADS = {
    "crop the start of axis 1, pad its end": [0, -1, 0, 1],
    "pad the start of axis 0, crop its end": [1, 0, -1, 0],
    "crop both ends of axis 1": [0, -1, 0, -2],
    "crop axis 0, pad and crop axis 1": [-1, 1, 0, -2],
    "pads only": [1, 2, 0, 1],
}


def _spec_pad(data: np.ndarray, pads: list[int], mode: str) -> np.ndarray:
    """The specification's ``Pad``: "the number of padding elements to add or remove (if
    negative) at the beginning and end of each axis": the elements of the negative pads are
    removed, and what is left is padded by ``numpy.pad`` with the others."""
    rank = data.ndim
    kept = tuple(
        slice(max(-pads[axis], 0), data.shape[axis] - max(-pads[rank + axis], 0))
        for axis in range(rank)
    )
    widths = [(max(pads[axis], 0), max(pads[rank + axis], 0)) for axis in range(rank)]
    return np.pad(data[kept], widths, mode=mode)


def _pad_model(mode: str, opset: int = 19, rank: int = 2, axes: list[int] | None = None):
    inputs = [("data", TensorProto.FLOAT, [3, 4][:rank]), ("pads", TensorProto.INT64, None)]
    names = ["data", "pads"]
    inits = []
    if axes is not None:
        names += ["", "axes"]
        inits.append(oh.make_tensor("axes", TensorProto.INT64, [len(axes)], axes))
    node = oh.make_node("Pad", names, ["y"], mode=mode)
    return _one_node(node, inputs, TensorProto.FLOAT, opset, inits)


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "wrap"])
@pytest.mark.parametrize("case", list(PADS))
def test_pad_with_negative_pads_agrees_with_onnxruntime_and_the_specification(
    mode: str, case: str
) -> None:
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    pads = np.array(PADS[case], np.int64)
    model = _pad_model(mode)
    feeds = {"data": data, "pads": pads}
    ours = _reference(model, feeds, reference_ops())
    np.testing.assert_array_equal(ours, _spec_pad(data, PADS[case], mode))
    for onnxruntime in run_onnxruntime_on(model, feeds).values():
        np.testing.assert_array_equal(ours, onnxruntime[0])
    assert ours.dtype == np.float32


def test_onnx_s_pad_fails_on_a_negative_pad() -> None:
    """What the replacement is for: onnx 1.23 hands negative pads to numpy.pad."""
    feeds = {"data": np.ones((3, 4), np.float32), "pads": np.array([0, -1, 0, 1], np.int64)}
    with pytest.raises(ValueError, match="index can't contain negative values"):
        _reference(_pad_model("constant"), feeds)


def test_pad_with_axes_and_a_value_and_pad_2_with_attributes() -> None:
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    # Pad-18: pads for axis -1 only, and a constant value
    model = _pad_model("constant", opset=18, axes=[-1])
    model.graph.node[0].input[2] = "value"
    model.graph.initializer.append(oh.make_tensor("value", TensorProto.FLOAT, [], [7.0]))
    feeds = {"data": data, "pads": np.array([-1, 2], np.int64)}
    ours = _reference(model, feeds, reference_ops())
    expected = np.concatenate([data[:, 1:], np.full((3, 2), 7.0, np.float32)], axis=1)
    np.testing.assert_array_equal(ours, expected)
    for onnxruntime in run_onnxruntime_on(model, feeds).values():
        np.testing.assert_array_equal(ours, onnxruntime[0])
    # Pad-2: pads and value are attributes
    node = oh.make_node("Pad", ["data"], ["y"], pads=[0, -1, 0, 2], value=5.0)
    model = _one_node(node, [("data", TensorProto.FLOAT, [3, 4])], TensorProto.FLOAT, 10)
    ours = _reference(model, {"data": data}, reference_ops())
    expected = np.concatenate([data[:, 1:], np.full((3, 2), 5.0, np.float32)], axis=1)
    np.testing.assert_array_equal(ours, expected)
    for onnxruntime in run_onnxruntime_on(model, {"data": data}).values():
        np.testing.assert_array_equal(ours, onnxruntime[0])


@pytest.mark.parametrize(
    ("pads", "axes", "message"),
    [
        (
            [0, -3, 0, -2],
            None,
            "Pad: pads [0, -3, 0, -2] remove more than the 4 elements of axis 1",
        ),
        ([0, 1, 0], None, "Pad: pads [0, 1, 0] do not give 2 values for each of 2 axes"),
        ([1, 1], [2], "Pad: axis 2 is out of range for rank 2"),
    ],
    ids=["too much removed", "odd pads", "axis"],
)
def test_pad_refuses_pads_that_do_not_fit(pads: list[int], axes, message: str) -> None:
    feeds = {"data": np.ones((3, 4), np.float32), "pads": np.array(pads, np.int64)}
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        _reference(_pad_model("constant", axes=axes), feeds, reference_ops())
