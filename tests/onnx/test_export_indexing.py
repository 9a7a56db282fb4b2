"""Indexing with the step number inside loop and scan bodies: exported, and run as eager.

A ``loop`` body gets its step number ``i`` as a 0-d int64 tensor; a ``scan`` step here gets it
from ``xs = torch.arange(T)``. Each idiom is exported once per opset and kind (module-scoped), with
a dynamic length, and onnxruntime is compared with eager at lengths 1, 2 and 5. The rewrite of the
indices that makes them export (``torchscan._traced._indexing``) is also checked on real tensors
against eager torch, and its refusals are pinned.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import types
from collections.abc import Callable

import hypothesis
import hypothesis.strategies as st
import pytest
import torch
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

import torchscan
from torchscan._traced._indexing import DataDependentSlice, body_indexing

from .._export import onnx_export
from ._roundtrip import opset_pairs
from ._runtimes import assert_outputs_close, eager_outputs, nodes, run_onnxruntime

logging.getLogger("torch.onnx").setLevel(logging.ERROR)

B, F, K, W = 2, 3, 2, 6
LENGTHS = (1, 2, 5)
OPSETS = (9, 13, 18, 25)


@dataclasses.dataclass(frozen=True)
class Idiom:
    """``body(i, c, v) -> (new_c, y)``, with ``v`` the tensors of :func:`_tensors`; ``init(v)``
    the first carry."""

    body: Callable
    init: Callable = lambda v: torch.zeros(B, F)


def _add(c: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return c + y, y


def _write_in_a_new_buffer(i, c, v):
    o = torch.zeros_like(v.x)
    o[:, i] = v.x[:, i] * 2
    return _add(c, o.sum(1))


def _write_in_the_carry(i, c, v):
    c = c.clone()
    c[:, :, i] = v.x[:, i] + 1
    return c, c.sum(2)


def _keep(width: int) -> Callable:
    return lambda v: torch.zeros(B, width, F)


IDIOMS = {
    # v.xt: (T, B, F); v.x: (B, T, F); v.xx: (B, 2T, F), so that i:i + K stays inside
    "x[i]": Idiom(lambda i, c, v: _add(c, v.xt[i])),
    "x[i - 1]": Idiom(lambda i, c, v: _add(c, v.xt[i - 1])),
    "x[:, i]": Idiom(lambda i, c, v: _add(c, v.x[:, i])),
    "x[:, -1 - i]": Idiom(lambda i, c, v: _add(c, v.x[:, -1 - i])),
    "x[:, i, None]": Idiom(lambda i, c, v: _add(c, v.x[:, i, None]), _keep(1)),
    "x[:, i:i + 1]": Idiom(lambda i, c, v: _add(c, v.x[:, i : i + 1]), _keep(1)),
    "x[:, i:i + 1].squeeze(1)": Idiom(lambda i, c, v: _add(c, v.x[:, i : i + 1].squeeze(1))),
    "x[:, i:i + k]": Idiom(lambda i, c, v: _add(c, v.xx[:, i : i + K]), _keep(K)),
    "x[:, i * k:(i + 1) * k]": Idiom(
        lambda i, c, v: _add(c, v.xx[:, i * K : (i + 1) * K]), _keep(K)
    ),
    "x.narrow(1, i, k)": Idiom(lambda i, c, v: _add(c, v.xx.narrow(1, i, K)), _keep(K)),
    "w[idx[i]]": Idiom(lambda i, c, v: _add(c, v.w[v.idx[i]])),
    "x[arange(B), i]": Idiom(lambda i, c, v: _add(c, v.x[torch.arange(B), i])),
    # GatherND with index pairs and ScatterND, which the conversion computes below opset 11
    "em[batch, i, tags[:, i]]": Idiom(
        lambda i, c, v: _add(c, v.x[v.batch, i, v.tags[:, i]]), lambda v: torch.zeros(B)
    ),
    "o[:, i] = v (a buffer of the body)": Idiom(_write_in_a_new_buffer),
    "o[:, :, i] = v (the carry)": Idiom(
        _write_in_the_carry, lambda v: torch.zeros(B, F, v.x.shape[1])
    ),
}


def _tensors(x: torch.Tensor, w: torch.Tensor, idx: torch.Tensor) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        x=x,
        xt=x.transpose(0, 1),
        xx=torch.cat([x, x], 1),
        w=w,
        idx=idx,
        batch=torch.arange(B),
        tags=x.argmax(-1),
    )


class Model(torch.nn.Module):
    def __init__(self, idiom: Idiom, kind: str) -> None:
        super().__init__()
        self.idiom, self.kind = idiom, kind
        g = torch.Generator().manual_seed(1)
        self.register_buffer("w", torch.randn(W, B, F, generator=g))
        self.register_buffer("idx", torch.tensor([3, 0, 5, 1, 4, 2, 0, 1]))

    def forward(self, x):
        v = _tensors(x, self.w, self.idx)
        body, init = self.idiom.body, self.idiom.init(v)
        if self.kind == "loop":
            return torchscan.loop(lambda i, c: body(i, c, v), init, trip_count=x.shape[1])
        return torchscan.scan(lambda c, i: body(i, c, v), init, torch.arange(x.shape[1]))


def _inputs(length: int) -> tuple[torch.Tensor]:
    return (torch.randn(B, length, F, generator=torch.Generator().manual_seed(length)),)


def _export(model: torch.nn.Module, opset: int):
    return onnx_export(
        model,
        _inputs(4),
        dynamo=True,
        opset_version=opset,
        dynamic_shapes=({1: torch.export.Dim("T", min=1)},),
    ).model_proto


@pytest.fixture(scope="module")
def exported():
    cache: dict = {}

    def get(name: str, kind: str, opset: int):
        key = (name, kind, opset)
        if key not in cache:
            model = Model(IDIOMS[name], kind).eval()
            try:
                cache[key] = model, _export(model, opset)
            except Exception as error:  # re-raised in every test that needs this export
                cache[key] = model, error
        model, result = cache[key]
        if isinstance(result, Exception):
            raise result
        return model, result

    return get


# each idiom in a loop and in a scan, at one of OPSETS in turn (all of them with
# TORCHSCAN_TEST_ALL_OPSETS=1)
POINTS = [
    (*case.split("/"), opset)
    for case, opset in opset_pairs(
        [f"{name}/{kind}" for name in IDIOMS for kind in ("loop", "scan")], OPSETS, per_case=1
    )
]


@pytest.mark.parametrize(
    ("name", "kind", "opset"), POINTS, ids=["-".join(map(str, p)) for p in POINTS]
)
def test_onnxruntime_equals_eager(exported, name: str, kind: str, opset: int) -> None:
    model, proto = exported(name, kind, opset)
    op_types = [node.op_type for node, _ in nodes(proto.graph)]
    assert op_types.count("Loop" if kind == "loop" else "Scan") == 1
    for length in LENGTHS:
        inputs = _inputs(length)
        assert_outputs_close(run_onnxruntime(proto, inputs), eager_outputs(model, inputs), proto)


# -- where eager torch fails or clips, the exported model fails --------------------------------


class Reads(torch.nn.Module):
    def __init__(self, read: Callable) -> None:
        super().__init__()
        self.read = read

    def forward(self, x):
        return torchscan.loop(
            lambda i, c: (c + self.read(x, i), None), torch.zeros(B, F), trip_count=x.shape[1]
        )[0]


def test_an_index_out_of_range_fails_in_onnxruntime_as_in_eager() -> None:
    model = Reads(lambda x, i: x[:, i - 6])  # at i = 0, -6 is out of range for a length of 5
    proto = _export(model, 18)
    assert_outputs_close(
        run_onnxruntime(proto, _inputs(6)), eager_outputs(model, _inputs(6)), proto
    )
    with pytest.raises(IndexError, match="out of bounds"):
        model(*_inputs(5))
    with pytest.raises(InvalidArgument, match="indices element out of data bounds"):
        run_onnxruntime(proto, _inputs(5))


def test_a_slice_eager_torch_clips_fails_in_onnxruntime() -> None:
    # At the last step eager torch reads one element; the export reads two or none.
    model = Reads(lambda x, i: x[:, i : i + 2].sum(1))
    proto = _export(model, 18)
    assert model(*_inputs(5)).shape == (B, F)
    with pytest.raises(InvalidArgument, match="indices element out of data bounds"):
        run_onnxruntime(proto, _inputs(5))


# -- the rewrite against eager torch ----------------------------------------------------------

X = torch.randn(4, 5, 6, 3, generator=torch.Generator().manual_seed(0))
A = torch.tensor([0, 2, 1])
C = torch.tensor([[0], [1]])
M = torch.tensor([True, False, True, True, False])


def _i(n: int = 2) -> torch.Tensor:
    return torch.tensor(n)


READS = {
    "x[i]": lambda: X[_i()],
    "x[-1]": lambda: X[_i(-1)],
    "x[:, i]": lambda: X[:, _i()],
    "x[..., i]": lambda: X[..., _i()],
    "x[i, ..., -1]": lambda: X[_i(), ..., _i(-1)],
    "x[None, i, None, :, -1]": lambda: X[None, _i(), None, :, _i(-1)],
    # torch applies a 0-d index before the tensor indices, as it applies an int (numpy not)
    "x[:, a, :, i]": lambda: X[:, A, :, _i()],
    "x[i, :, a]": lambda: X[_i(), :, A],
    "x[c, i, a]": lambda: X[C, _i(), A],
    "x[c, :, a, i]": lambda: X[C, :, A, _i()],
    "x[:, mask, i]": lambda: X[:, M, _i()],
    "x[i, mask]": lambda: X[_i(), M],
    "x[i, 1:4:2, -1]": lambda: X[_i(), 1:4:2, _i(-1)],
    "x[int32 i]": lambda: X[_i().int()],
    "x[0-d bool mask]": lambda: X[torch.tensor(True)],
    "x[:, i:i + 2]": lambda: X[:, _i() : _i() + 2],
    "x[:, i - 1:i + 2:2]": lambda: (i := _i(), X[:, i - 1 : i + 2 : 2])[1],
    "x[:, j - 2:j], j = -1": lambda: (j := _i(-1), X[:, j - 2 : j])[1],
    "x[:, 2i:2(i + 1)], i = 1": lambda: (i := _i(1), X[:, i * 2 : (i + 1) * 2])[1],
    "x[:, 3 - i:5 - i]": lambda: (i := _i(), X[:, 3 - i : 5 - i])[1],
    "x[:, -i - 1:-i + 1]": lambda: (i := _i(), X[:, -i - 1 : -i + 1])[1],
    "x[:, :i]": lambda: X[:, : _i()],
    "x[:, i:]": lambda: X[:, _i() :],
    "x.narrow(1, i, 2)": lambda: X.narrow(1, _i(), 2),
    "x.narrow(1, -1, 1)": lambda: X.narrow(1, _i(-1), 1),
    "x.narrow(1, -i - 1, 2)": lambda: (i := _i(), X.narrow(1, -i - 1, 2))[1],
    "x.select(2, -1)": lambda: X.select(2, _i(-1)),
}


@pytest.mark.parametrize("name", list(READS))
def test_a_rewritten_read_equals_eager(name: str) -> None:
    expected = READS[name]()
    with body_indexing():
        actual = READS[name]()
    assert actual.shape == expected.shape
    assert torch.equal(actual, expected)


def _write(index: Callable, value: Callable) -> Callable[[], torch.Tensor]:
    def write():
        o = X.clone()
        o[index()] = value()
        return o

    return write


def _write_through_a_view() -> torch.Tensor:
    o = X.clone()
    view = o[0]
    view[_i(), _i(-1)] = 5.0
    return o


WRITES = {
    "o[:, i] = 7": _write(lambda: (slice(None), _i()), lambda: 7.0),
    "o[c, i, a] = v": _write(lambda: (C, _i(), A), lambda: torch.arange(9.0).reshape(3, 3)),
    "o[..., i - 1:i + 1, -1] = v": _write(
        lambda: (i := _i(), (Ellipsis, slice(i - 1, i + 1), _i(-1)))[1], lambda: torch.ones(2)
    ),
    "o[i][-1] = 5 (a view)": _write_through_a_view,
}


@pytest.mark.parametrize("name", list(WRITES))
def test_a_rewritten_write_equals_eager(name: str) -> None:
    expected = WRITES[name]()
    with body_indexing():
        actual = WRITES[name]()
    assert torch.equal(actual, expected)


FAILURES = {
    "an index out of range": lambda: X[:, _i(5)],
    "a negative index out of range": lambda: X[:, _i(-6)],
    "narrow past the end": lambda: X.narrow(1, _i(4), 2),
}


@pytest.mark.parametrize("name", list(FAILURES))
def test_a_rewritten_read_fails_where_eager_fails(name: str) -> None:
    with pytest.raises((IndexError, RuntimeError)):
        FAILURES[name]()
    with pytest.raises(RuntimeError, match="out of"), body_indexing():
        FAILURES[name]()


@st.composite
def index_recipes(draw):
    """Items of an index of ``X`` (4, 5, 6, 3), as recipes: built anew where they are used, so
    that the mode sees the arithmetic on 0-d tensors."""
    n_axes = draw(st.integers(1, 4))
    recipes = []
    for _ in range(n_axes):
        recipes.append(
            draw(
                st.one_of(
                    st.tuples(st.just("tensor"), st.integers(-3, 2)),
                    st.tuples(st.just("int"), st.integers(-3, 2)),
                    st.tuples(st.just("all")),
                    st.tuples(st.just("slice"), st.integers(-3, 2), st.integers(-3, 3)),
                    st.tuples(
                        st.just("affine"),
                        st.integers(-1, 2),
                        st.sampled_from([1, 2, -1]),
                        st.integers(-2, 1),
                        st.integers(0, 3),
                        st.integers(1, 2),
                    ),
                    st.tuples(st.just("advanced"), st.lists(st.integers(-3, 2), min_size=2)),
                )
            )
        )
    if draw(st.booleans()):
        recipes.insert(draw(st.integers(0, len(recipes))), ("none",))
    if draw(st.booleans()):
        recipes.insert(draw(st.integers(0, len(recipes))), ("ellipsis",))
    return recipes


def _build(recipes: list) -> tuple:
    items = []
    for kind, *args in recipes:
        if kind == "tensor":
            items.append(torch.tensor(args[0]))
        elif kind == "int":
            items.append(args[0])
        elif kind == "all":
            items.append(slice(None))
        elif kind == "slice":
            items.append(slice(args[0], args[1]))
        elif kind == "affine":
            base, a, b, length, step = args
            i = torch.tensor(base)
            items.append(slice(i * a + b, i * a + b + length, step))
        elif kind == "advanced":
            items.append(torch.tensor(args[0]))
        else:
            items.append(None if kind == "none" else Ellipsis)
    return tuple(items)


def _eager_clips(recipes: list, shape: tuple[int, ...]) -> bool:
    """Whether an affine slice of ``recipes`` is one eager torch clips at an end of its axis (the
    rewrite fails there instead): found by the axis it lands on."""
    consumed = [0 if r[0] in ("none", "ellipsis") else 1 for r in recipes]
    axis = 0
    for recipe, n in zip(recipes, consumed, strict=True):
        if recipe[0] == "ellipsis":
            axis += len(shape) - sum(consumed)
            continue
        if recipe[0] == "affine" and axis < len(shape):
            base, a, b, length, _ = recipe[1:]
            start, stop, size = base * a + b, base * a + b + length, shape[axis]
            if not ((start >= 0 and stop <= size) or (start >= -size and stop < 0)):
                return True
        axis += n
    return False


@hypothesis.given(index_recipes())
def test_any_rewritten_index_equals_eager(recipes) -> None:
    hypothesis.assume(not _eager_clips(recipes, tuple(X.shape)))
    try:
        expected, failed = X[_build(recipes)], None
    except (IndexError, RuntimeError, TypeError) as error:
        expected, failed = None, error
    if failed is not None:
        with pytest.raises((IndexError, RuntimeError, TypeError)), body_indexing():
            X[_build(recipes)]
        return
    with body_indexing():
        actual = X[_build(recipes)]
    assert actual.shape == expected.shape
    assert torch.equal(actual, expected)


@hypothesis.given(index_recipes())
def test_any_rewritten_write_equals_eager(recipes) -> None:
    hypothesis.assume(not _eager_clips(recipes, tuple(X.shape)))

    def write():
        o = X.clone()
        o[_build(recipes)] = -1.0
        return o

    try:
        expected = write()
    except (IndexError, RuntimeError, TypeError):
        with pytest.raises((IndexError, RuntimeError, TypeError)), body_indexing():
            write()
        return
    with body_indexing():
        actual = write()
    assert torch.equal(actual, expected)


# -- refusals ---------------------------------------------------------------------------------

STOPS = torch.tensor([1, 3, 4, 4, 5])


def _export_loop(body: Callable, init: torch.Tensor) -> None:
    class Loop(torch.nn.Module):
        def forward(self, x):
            return torchscan.loop(lambda i, c: body(i, c, x), init, trip_count=x.shape[1])[0]

    torch.export.export(
        Loop(), _inputs(5), dynamic_shapes=({1: torch.export.Dim("T", min=1)},), strict=False
    )


def _refusal(code: str, need: str) -> str:
    return (
        rf"^torchscan\.loop: the slice at \S+test_export_indexing\.py:\d+ \({re.escape(code)}\) "
        "has a length that depends on the values of its tensor bounds, which are unknown where the "
        r"loop body runs on fake tensors \(traced for export, or called for the shapes of ys "
        rf"when no step runs\), and {need}\. Give the slice a fixed length: "
        r"x\.narrow\(dim, i, k\), or x\[:, i:i \+ k\] with both bounds the same tensor plus, "
        r"minus or times Python ints; or take one element with x\[:, i\]\.$"
    )


def test_a_slice_of_a_length_read_from_data_that_decides_a_shape_is_refused() -> None:
    def body(i, c, x):
        return c + x[:, i : STOPS[i]], None

    with pytest.raises(DataDependentSlice) as caught:
        _export_loop(body, torch.zeros(B, 1, F))
    code = "return c + x[:, i : STOPS[i]], None"
    assert re.match(
        _refusal(code, r"torch needs to know whether Eq\(u\d+, 1\) holds"), str(caught.value)
    )


def test_a_squeeze_of_a_slice_of_a_length_read_from_data_is_refused() -> None:
    def body(i, c, x):
        return c + x[:, i : STOPS[i]].squeeze(1), None

    with pytest.raises(DataDependentSlice) as caught:
        _export_loop(body, torch.zeros(B, F))
    code = "return c + x[:, i : STOPS[i]].squeeze(1), None"
    assert re.match(
        _refusal(code, r"squeeze\(1\) there keeps or drops that axis by it"), str(caught.value)
    )


def test_a_write_into_a_slice_of_a_length_read_from_data_is_refused() -> None:
    def body(i, c, x):
        o = torch.zeros(B, 5)
        o[:, :i] = 1.0
        return c + o, None

    with pytest.raises(DataDependentSlice) as caught:
        _export_loop(body, torch.zeros(B, 5))
    assert re.match(_refusal("o[:, :i] = 1.0", r"torch needs the value of u\d+"), str(caught.value))


def test_torch_onnx_export_gives_the_refusal_as_it_is() -> None:
    class Loop(torch.nn.Module):
        def forward(self, x):
            return torchscan.loop(
                lambda i, c: (c + x[:, i : STOPS[i]], None),
                torch.zeros(B, 1, F),
                trip_count=x.shape[1],
            )[0]

    with pytest.raises(DataDependentSlice, match="has a length that depends on the values"):
        _export(Loop(), 18)


def test_a_slice_of_a_length_read_from_data_that_decides_no_shape_exports() -> None:
    model = Reads(lambda x, i: x[:, : i + 1].sum(1))  # a running sum
    proto = _export(model, 18)
    for length in LENGTHS:
        inputs = _inputs(length)
        assert_outputs_close(run_onnxruntime(proto, inputs), eager_outputs(model, inputs), proto)


class WritesIntoABuffer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("o", torch.zeros(B, 8))

    def forward(self, x):
        def body(i, c):
            self.o[:, i] = c
            return c + 1, None

        return torchscan.loop(body, torch.zeros(B), trip_count=x.shape[1])[0]


def test_a_write_at_the_step_number_into_a_captured_tensor_is_refused() -> None:
    body_line = f"test_export_indexing.py:{WritesIntoABuffer.forward.__code__.co_firstlineno + 2}"
    with pytest.raises(
        torchscan.ExportError,
        match=rf"^torchscan\.loop: body \(WritesIntoABuffer\.forward\.<locals>\.body\) modifies in "
        rf"place self\.o \(float32\[2, 8\] on cpu\) with index_copy_ at \S+{body_line}, ",
    ):
        torch.export.export(
            WritesIntoABuffer(),
            _inputs(5),
            dynamic_shapes=({1: torch.export.Dim("T", min=1)},),
            strict=False,
        )
