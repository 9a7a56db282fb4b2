"""``torchscan.onnx._export._convert``: GatherElements, GatherND, ScatterND and ScatterElements, and
Pad of integers, converted below opset 11 with dynamic shapes.

Each model is built at the opset where its operator appeared, and at 18, where torch.onnx builds
it, with symbolic dimensions, and converted once; hypothesis then draws shapes and values, with
negative indices, infinities, NaN, -0.0 and the extremes of int64. The converted model must give,
in onnxruntime, exactly what the original gives there (floats bit for bit), and what numpy gives.
"""

from __future__ import annotations

import functools

import hypothesis
import hypothesis.strategies as st
import numpy as np
import onnx
import onnx.helper as oh
import onnx.shape_inference
import pytest
import torch
import torch.nn.functional as F

import torchscan

from .._export import onnx_export
from ._runtimes import _session, eager_outputs, run_onnxruntime
from .test_convert import F32, I32, I64, const, converted, info

F64, U8 = onnx.TensorProto.DOUBLE, onnx.TensorProto.UINT8
EXAMPLES = hypothesis.settings(max_examples=15)
SPECIAL_FLOATS = [np.inf, -np.inf, np.nan, -0.0, 0.0, 1.5, -2.25, 3e38, -1e-45]
INT64 = np.iinfo(np.int64)


# -- models and runs ------------------------------------------------------------------------------


def model_at(
    opset: int,
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    initializers: list[onnx.TensorProto] = (),
) -> onnx.ModelProto:
    """A model at ``opset`` with the shapes ONNX infers for it, held to the checker."""
    graph = oh.make_graph(nodes, "model", inputs, outputs, initializer=list(initializers))
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)], ir_version=10)
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.checker.check_model(model, full_check=True)
    return model


class Pair:
    """A model and the model converted to ``target``, each in an onnxruntime session."""

    def __init__(self, model: onnx.ModelProto, target: int) -> None:
        self.lowered = converted(model, target)
        self._sessions = _session(model), _session(self.lowered)

    def run(self, feeds: dict[str, np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The outputs of the original and of the converted model."""
        original, lowered = self._sessions
        return original.run(None, feeds), lowered.run(None, feeds)

    def check(self, feeds: dict[str, np.ndarray], *expected: np.ndarray) -> None:
        """Both models give the same outputs, bit for bit, and ``expected`` where given."""
        want, got = self.run(feeds)
        for w, g in zip(want, got, strict=True):
            assert_identical(g, w)
        for e, g in zip(expected, got, strict=False):
            assert_identical(g, e)


def assert_identical(got: np.ndarray, want: np.ndarray) -> None:
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    np.testing.assert_array_equal(got, want)
    if want.dtype.kind == "f":  # the sign of zero too
        values = ~np.isnan(want)
        np.testing.assert_array_equal(np.signbit(got[values]), np.signbit(want[values]))


def elem_of(dtype: type) -> int:
    return oh.np_dtype_to_tensor_dtype(np.dtype(dtype))


def values(seed: int, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    """Values of ``dtype``: for floats, special values among normal ones; for integers, the
    extremes of the type among small ones."""
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        pool = np.concatenate([SPECIAL_FLOATS, rng.standard_normal(8)])
    elif np.dtype(dtype).kind == "b":
        pool = np.array([True, False])
    else:
        extremes = np.iinfo(dtype)
        pool = np.concatenate([[extremes.min, extremes.max, 0, -1, 1], rng.integers(-9, 9, 8)])
    with np.errstate(over="ignore"):
        return rng.choice(pool, shape).astype(dtype)


def symbolic(prefix: str, rank: int) -> list[str]:
    return [f"{prefix}{k}" for k in range(rank)]


shapes = st.lists(st.integers(1, 4), min_size=3, max_size=3).map(tuple)
seeds = st.integers(0, 2**32 - 1)

# -- GatherElements -------------------------------------------------------------------------------


@functools.cache
def gather_elements(source: int, target: int, axis: int, dtype: type, index: int) -> Pair:
    elem = elem_of(dtype)
    model = model_at(
        source,
        [oh.make_node("GatherElements", ["data", "indices"], ["out"], axis=axis)],
        [info("data", elem, symbolic("d", 3)), info("indices", index, symbolic("i", 3))],
        [info("out", elem, None)],
    )
    return Pair(model, target)


@pytest.mark.parametrize("target", [10, 9, 8], ids=lambda t: f"opset{t}")
@pytest.mark.parametrize("source", [11, 18], ids=lambda s: f"from{s}")
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize(("dtype", "index"), [(np.float32, I64), (np.int64, I64), (np.bool_, I32)])
@EXAMPLES
@hypothesis.given(data_shape=shapes, index_shape=shapes, seed=seeds)
def test_gather_elements_converts_below_opset_11(
    dtype, index, axis, source, target, data_shape, index_shape, seed
) -> None:
    """``hist.gather(1, idx)``: a Gather from the flattened data at offsets computed from the
    indices and the shape, for every axis, with negative indices."""
    rank_axis = axis % 3
    # the indices may be shorter than the data on every axis but the gathered one
    index_shape = tuple(
        n if k == rank_axis else min(n, d)
        for k, (n, d) in enumerate(zip(index_shape, data_shape, strict=True))
    )
    rng = np.random.default_rng(seed)
    data = values(seed, dtype, data_shape)
    length = data_shape[rank_axis]
    indices = rng.integers(-length, length, index_shape).astype(
        np.int64 if index == I64 else np.int32
    )
    expected = np.take_along_axis(
        data[
            tuple(slice(0, n) if k != rank_axis else slice(None) for k, n in enumerate(index_shape))
        ],
        np.where(indices < 0, indices + length, indices),
        axis=rank_axis,
    )
    gather_elements(source, target, axis, dtype, index).check(
        {"data": data, "indices": indices}, expected
    )


def test_gather_elements_of_a_static_shape_needs_no_loop() -> None:
    model = model_at(
        13,
        [oh.make_node("GatherElements", ["data", "indices"], ["out"], axis=1)],
        [info("data", F32, [3, 4]), info("indices", I64, [3, 2])],
        [info("out", F32, None)],
    )
    lowered = converted(model, 8)
    assert {n.op_type for n in lowered.graph.node} <= {
        "Reshape",
        "Sub",
        "Div",
        "Mul",
        "Add",
        "Gather",
    }


# -- GatherND -------------------------------------------------------------------------------------


@functools.cache
def gather_nd(source: int, target: int, tuple_length: int, index_rank: int, dtype: type) -> Pair:
    elem = elem_of(dtype)
    index_shape = [*symbolic("n", index_rank - 1), tuple_length]
    model = model_at(
        source,
        [oh.make_node("GatherND", ["data", "indices"], ["out"])],
        [info("data", elem, symbolic("d", 3)), info("indices", I64, index_shape)],
        [info("out", elem, [None] * (index_rank + 3 - tuple_length - 1))],
    )
    return Pair(model, target)


@pytest.mark.parametrize("target", [10, 9, 8], ids=lambda t: f"opset{t}")
@pytest.mark.parametrize("source", [11, 18], ids=lambda s: f"from{s}")
@pytest.mark.parametrize("tuple_length", [1, 2, 3])
@pytest.mark.parametrize("index_rank", [1, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
@EXAMPLES
@hypothesis.given(data_shape=shapes, count=st.lists(st.integers(0, 3), min_size=2, max_size=2),
                  seed=seeds)  # fmt: skip
def test_gather_nd_converts_below_opset_11(
    dtype, index_rank, tuple_length, source, target, data_shape, count, seed
) -> None:
    """``transitions[a, b]``: index tuples of any length, negative indices included, gather
    from the data with their axes made one."""
    rng = np.random.default_rng(seed)
    data = values(seed, dtype, data_shape)
    batch = tuple(count[: index_rank - 1])
    indices = np.stack(
        [rng.integers(-n, n, batch) for n in data_shape[:tuple_length]], axis=-1
    ).astype(np.int64)
    expected = data[tuple(indices[..., k] for k in range(tuple_length))]
    gather_nd(source, target, tuple_length, index_rank, dtype).check(
        {"data": data, "indices": indices}, expected
    )


def test_gather_nd_with_tuples_of_unknown_length_is_refused() -> None:
    graph = oh.make_graph(
        [oh.make_node("GatherND", ["data", "indices"], ["out"])], "model",
        [info("data", F32, [2, 3]), info("indices", I64, ["n", "k"])], [info("out", F32, None)],
    )  # fmt: skip
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 11)], ir_version=10)
    with pytest.raises(torchscan.onnx.OpsetConversionError) as raised:
        converted(model, 10)
    assert str(raised.value) == (
        "torch.onnx.export: cannot convert GatherND from opset 11 to opset 10: the length of its "
        "index "
        "tuples, the last dimension of 'indices', is not known before run time. Export with a "
        "newer opset_version (at opset 11 this GatherND is kept as it is), or compute it in the "
        "step with operators that opset 10 has."
    )


# -- ScatterND and ScatterElements ----------------------------------------------------------------


def scatter_nd_model(source: int, tuple_length: int, dtype: type) -> onnx.ModelProto:
    elem = elem_of(dtype)
    return model_at(
        source,
        [oh.make_node("ScatterND", ["data", "indices", "updates"], ["out"])],
        [
            info("data", elem, symbolic("d", 3)), info("indices", I64, ["n", tuple_length]),
            info("updates", elem, ["n", *symbolic("d", 3)[tuple_length:]]),
        ],
        [info("out", elem, None)],
    )  # fmt: skip


@functools.cache
def scatter_nd(source: int, target: int, tuple_length: int, dtype: type) -> Pair:
    return Pair(scatter_nd_model(source, tuple_length, dtype), target)


@pytest.mark.parametrize("target", [10, 9, 8], ids=lambda t: f"opset{t}")
@pytest.mark.parametrize("source", [11, 18], ids=lambda s: f"from{s}")
@pytest.mark.parametrize("tuple_length", [1, 2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
@EXAMPLES
@hypothesis.given(data_shape=shapes, count=st.integers(0, 4), seed=seeds)
def test_scatter_nd_converts_below_opset_11(
    dtype, tuple_length, source, target, data_shape, count, seed
) -> None:
    """``buf.index_copy(0, i, v)``, ``index_put``: a Scatter-9 into the flattened data, and at
    opset 8 rows chosen from the data or the updates; slices of any length, negative indices
    included (ScatterND leaves duplicates undefined: none)."""
    rng = np.random.default_rng(seed)
    data = values(seed, dtype, data_shape)
    rows = int(np.prod(data_shape[:tuple_length]))
    count = min(count, rows)
    chosen = rng.permutation(rows)[:count]
    indices = np.stack(np.unravel_index(chosen, data_shape[:tuple_length]), axis=-1).reshape(
        count, tuple_length
    )
    indices = np.where(
        rng.random(indices.shape) < 0.5, indices - data_shape[:tuple_length], indices
    )
    updates = values(seed + 1, dtype, (count, *data_shape[tuple_length:]))
    expected = data.copy()
    expected[tuple(indices[:, k] for k in range(tuple_length))] = updates
    scatter_nd(source, target, tuple_length, dtype).check(
        {"data": data, "indices": indices.astype(np.int64), "updates": updates}, expected
    )


@functools.cache
def scatter_elements(source: int, target: int, axis: int, dtype: type) -> Pair:
    elem = elem_of(dtype)
    model = model_at(
        source,
        [oh.make_node("ScatterElements", ["data", "indices", "updates"], ["out"], axis=axis)],
        [
            info("data", elem, symbolic("d", 3)), info("indices", I64, symbolic("i", 3)),
            info("updates", elem, symbolic("i", 3)),
        ],
        [info("out", elem, None)],
    )  # fmt: skip
    return Pair(model, target)


@pytest.mark.parametrize("target", [10, 9, 8], ids=lambda t: f"opset{t}")
@pytest.mark.parametrize("source", [11, 18], ids=lambda s: f"from{s}")
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
@EXAMPLES
@hypothesis.given(data_shape=shapes, index_shape=shapes, seed=seeds)
def test_scatter_elements_converts_below_opset_11(
    dtype, axis, source, target, data_shape, index_shape, seed
) -> None:
    """``x.scatter(1, i, v)`` and ``x[:, 1] = v``: ScatterElements is Scatter-9 renamed, with
    negative indices counted from the front; at opset 8, where Scatter does not exist, each
    element of the result is chosen from the data or the updates. The indices may be shorter
    than the data on every axis (ScatterElements leaves duplicates undefined: none)."""
    rng = np.random.default_rng(seed)
    k = axis % 3
    length = data_shape[k]
    # shorter than the data on every axis, on the scattered one too: no index twice along it
    index_shape = tuple(min(n, d) for n, d in zip(index_shape, data_shape, strict=True))
    data = values(seed, dtype, data_shape)
    order = rng.random((length, *index_shape[:k], *index_shape[k + 1 :]))
    picks = np.moveaxis(np.argsort(order, axis=0)[: index_shape[k]], 0, k)
    indices = np.where(rng.random(picks.shape) < 0.5, picks - length, picks)
    updates = values(seed + 1, dtype, picks.shape)
    expected = data.copy()
    covered = tuple(slice(0, n) if d != k else slice(None) for d, n in enumerate(index_shape))
    region = expected[covered]
    np.put_along_axis(region, picks, updates, axis=k)
    expected[covered] = region
    scatter_elements(source, target, axis, dtype).check(
        {"data": data, "indices": indices.astype(np.int64), "updates": updates}, expected
    )


# -- Pad of the types Pad-2 does not take ---------------------------------------------------------


@functools.cache
def pad(source: int, target: int, dtype: type, pads: tuple[int, ...], value: str) -> Pair:
    elem = elem_of(dtype)
    inputs = [info("x", elem, symbolic("d", 2))]
    initializers = [const("pads", pads, np.int64)]
    names = ["x", "pads"]
    if value == "input":
        inputs.append(info("value", elem, []))
        names.append("value")
    elif value == "constant":
        initializers.append(const("value", np.array(INT64.min if dtype == np.int64 else 7, dtype)))
        names.append("value")
    model = model_at(
        source, [oh.make_node("Pad", names, ["out"], mode="constant")], inputs,
        [info("out", elem, None)], initializers,
    )  # fmt: skip
    return Pair(model, target)


PADS = [(1, 0, 2, 3), (-1, 2, 0, -2), (0, 0, 0, 0)]


@pytest.mark.parametrize("target", [10, 9, 8], ids=lambda t: f"opset{t}")
@pytest.mark.parametrize("source", [11, 18], ids=lambda s: f"from{s}")
@pytest.mark.parametrize("dtype", [np.int64, np.uint8, np.int32, np.float64])
@pytest.mark.parametrize("value", ["input", "constant", "absent"])
@pytest.mark.parametrize("pads", PADS, ids=str)
@hypothesis.settings(max_examples=5)
@hypothesis.given(shape=st.tuples(st.integers(2, 4), st.integers(2, 4)), seed=seeds)
def test_constant_pad_of_any_type_converts_below_opset_11(
    pads, value, dtype, source, target, shape, seed
) -> None:
    """``F.pad`` of int64 labels: blocks of the value, concatenated; negative pads crop."""
    x = values(seed, dtype, shape)
    feeds = {"x": x}
    fill = np.zeros((), dtype)
    if value == "input":
        fill = values(seed + 1, dtype, ())
        feeds["value"] = fill
    elif value == "constant":
        fill = np.array(INT64.min if dtype == np.int64 else 7, dtype)
    cropped = x[
        max(-pads[0], 0) : shape[0] - max(-pads[2], 0),
        max(-pads[1], 0) : shape[1] - max(-pads[3], 0),
    ]
    widths = [(max(pads[0], 0), max(pads[2], 0)), (max(pads[1], 0), max(pads[3], 0))]
    expected = np.pad(cropped, widths, constant_values=fill)
    pad(source, target, dtype, pads, value).check(feeds, expected)


# -- exported from torch ---------------------------------------------------------------------------


class Indexing(torch.nn.Module):
    """A CRF-like step: ``transitions[prev, tag]`` (GatherND), ``hist.gather`` (GatherElements),
    ``index_copy`` into a buffer (ScatterND), ``x[:, 0] = v`` (ScatterElements) and ``F.pad`` of
    int64 tags (Pad)."""

    def __init__(self) -> None:
        super().__init__()
        self.transitions = torch.nn.Parameter(torch.randn(5, 5))

    def forward(self, tags, emissions, buffer):
        def step(carry, x):
            prev, score, buffer = carry
            tag, emission = x
            score = score + self.transitions[prev, tag]
            hist = emission.unsqueeze(1) + self.transitions
            best = hist.gather(1, tag.view(-1, 1, 1).expand(-1, 1, 5)).squeeze(1)
            buffer = buffer.index_copy(0, tag[:1], emission[:1])
            marked = emission.clone()
            marked[:, 0] = score
            padded = F.pad(tag, (1, 2), value=-1)
            return (tag, score, buffer), (best, marked, padded)

        return torchscan.scan(
            step, (tags[0], torch.zeros(tags.shape[1]), buffer), (tags, emissions)
        )


def indexing_inputs(length: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(length)
    tags = torch.randint(0, 5, (length, 3), generator=generator)
    return tags, torch.randn(length, 3, 5, generator=generator), torch.zeros(6, 5)


@pytest.mark.parametrize("opset", [9, 8])
def test_indexing_in_a_scan_exports_below_opset_11(opset: int) -> None:
    torch.manual_seed(0)
    model = Indexing().eval()
    time = torch.export.Dim("T", min=1)
    program = onnx_export(
        model, indexing_inputs(3), dynamo=True, opset_version=opset,
        dynamic_shapes=({0: time}, {0: time}, None),
    )  # fmt: skip
    proto = program.model_proto
    assert [(o.domain, o.version) for o in proto.opset_import if o.domain == ""] == [("", opset)]
    for length in (1, 4):
        inputs = indexing_inputs(length)
        expected = eager_outputs(model, inputs)
        for outputs in run_onnxruntime(proto, inputs).values():
            for got, want in zip(outputs, expected, strict=True):
                np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
