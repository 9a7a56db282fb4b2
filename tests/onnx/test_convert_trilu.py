"""``torchscan.onnx._export._convert``: Trilu below opset 14 (``torch.triu``, ``torch.tril``
and the mask of ``F.scaled_dot_product_attention(..., is_causal=True)``), and its refusals.

Trilu models are built at opset 18, where torch.onnx builds them, with symbolic dimensions and a
diagonal ``k`` given when the model runs, and converted once; they must then give, in onnxruntime
at both optimization levels and in onnx's reference evaluator, exactly what eager ``torch.triu``
and ``torch.tril`` give, floats bit for bit (NaN, infinities and -0.0 included), for rectangular
matrices with a batch axis, every sign of ``k`` and ``k`` beyond the matrix. Scan steps that call
them are exported at opsets 9 to 13 (and 8, for matrices of static shape) with a dynamic sequence
length and compared with eager PyTorch at other lengths; at opset 14, where Trilu stays, the same
models are the control.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import numpy as np
import onnx
import onnx.helper as oh
import onnx.reference
import pytest
import torch
import torch.nn.functional as F

import torchscan
from torchscan.onnx import OpsetConversionError
from torchscan.onnx._check._runtimes import reference_ops

from .._export import onnx_export
from ._roundtrip import EVERY_PAIR
from ._runtimes import (
    assert_outputs_close,
    eager_outputs,
    nodes,
    run_onnxruntime,
    run_onnxruntime_on,
    run_reference,
)
from .test_convert import F32, I64, converted, info
from .test_convert_gather import assert_identical, elem_of, model_at, values

STRING = onnx.TensorProto.STRING

# -- Trilu models, converted ----------------------------------------------------------------------

DTYPES = [np.float32, np.float16, np.float64, np.int64, np.int32, np.int8, np.uint8, np.bool_]
"""The element types torch.triu takes that onnxruntime's Where-9 (or And, for bool) runs."""

DIAGONALS = [-7, -2, -1, 0, 1, 3, 9]
"""Values of ``k``: each sign, and beyond every matrix below (everything kept or zeroed)."""

BATCHED_SHAPES = [(2, 3, 5), (1, 4, 4), (3, 5, 2), (2, 1, 6), (1, 0, 3)]
"""(batch, rows, columns): rectangular both ways, square, one row, no row."""


@functools.cache
def trilu(target: int, dtype: type, upper: int, shape: tuple, given_k: bool = True):
    """A Trilu of ``shape`` (names for symbolic dimensions), with ``k`` an input or omitted, at
    opset 18 converted to ``target``."""
    elem = elem_of(dtype)
    inputs = [info("x", elem, list(shape))] + ([info("k", I64, [])] if given_k else [])
    model = model_at(
        18,
        [oh.make_node("Trilu", [i.name for i in inputs], ["y"], upper=upper)],
        inputs,
        [info("y", elem, list(shape))],
    )
    return converted(model, target)


def eager_trilu(x: np.ndarray, k: int, upper: int) -> np.ndarray:
    return (torch.triu if upper else torch.tril)(torch.from_numpy(x), k).numpy()


def assert_computes(lowered: onnx.ModelProto, x: np.ndarray, k: int | None, upper: int) -> None:
    """onnxruntime at both levels and the reference evaluator give eager torch's result."""
    feeds = {"x": x} if k is None else {"x": x, "k": np.array(k, np.int64)}
    expected = eager_trilu(x, 0 if k is None else k, upper)
    for level, (got,) in run_onnxruntime_on(lowered, feeds).items():
        try:
            assert_identical(got, expected)
        except AssertionError as error:
            raise AssertionError(f"onnxruntime at the {level} level: {error}") from None
    evaluator = onnx.reference.ReferenceEvaluator(lowered, new_ops=reference_ops())
    assert_identical(evaluator.run(None, feeds)[0], expected)


def op_types(model: onnx.ModelProto) -> set[str]:
    return {node.op_type for node, _ in nodes(model.graph)}


POINTS = [
    *[(target, dtype) for target in (13, 11, 10, 9) for dtype in DTYPES],
    (8, np.bool_),  # And, with arange as a Loop: no Where is needed
]


@pytest.mark.parametrize("upper", [1, 0], ids=["triu", "tril"])
@pytest.mark.parametrize(
    ("target", "dtype"), POINTS, ids=[f"opset{t}-{np.dtype(d).name}" for t, d in POINTS]
)
def test_trilu_of_dynamic_shape_converts_below_opset_14(target, dtype, upper) -> None:
    """Masks from the indices of both axes, read from the shape when the model runs: ``Range``
    from opset 11 on, ``NonZero`` of ones at 9 and 10; the data only selected."""
    lowered = trilu(target, dtype, upper, ("b", "n", "m"))
    assert "Trilu" not in op_types(lowered)
    for number, shape in enumerate(BATCHED_SHAPES):
        x = values(number, dtype, shape)
        for k in DIAGONALS:
            assert_computes(lowered, x, k, upper)


@pytest.mark.parametrize("given_k", [True, False], ids=["k", "no-k"])
@pytest.mark.parametrize("upper", [1, 0], ids=["triu", "tril"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
@pytest.mark.parametrize("target", [13, 9, 8], ids=lambda t: f"opset{t}")
def test_trilu_of_static_shape_converts_down_to_opset_8(target, dtype, upper, given_k) -> None:
    """A matrix of known size: the offsets of its diagonals are a constant (the whole mask, where
    ``k`` is omitted); at opset 8 the selection is that of ``Where`` (``_ops_gather``) and int64
    ``k`` is compared as two halves."""
    lowered = trilu(target, dtype, upper, (5, 3), given_k)
    assert not {"Trilu", "Shape", "Range", "NonZero", "Loop"} & op_types(lowered)
    x = values(7, dtype, (5, 3))
    for k in DIAGONALS if given_k else [None]:
        assert_computes(lowered, x, k, upper)


def refusal(reason: str) -> str:
    return (
        f"torch.onnx.export: cannot convert Trilu from opset 14 to opset 13: {reason}. Export "
        "with a newer opset_version (at opset 14 this Trilu is kept as it is), or compute it in "
        "the step with operators that opset 13 has."
    )


@pytest.mark.parametrize(
    ("elem", "shape", "target", "reason"),
    [
        (F32, ["b", "n", "m"], 8, "below opset 9 it is computed by selection without Where, "
         "which needs a static shape, and the shape of its input 'x' is not known before run "
         "time (export at opset 9 or newer, or with static shapes in the step)"),
        (F32, [2, "n", 3], 8, "below opset 9 it is computed by selection without Where, which "
         "needs a static shape, and the shape of its input 'x' is not known before run time "
         "(export at opset 9 or newer, or with static shapes in the step)"),
        (STRING, [2, 3], 13, "its elements are strings, which have no zero to set the elements "
         "outside the triangle to"),
    ],
    ids=["dynamic@8", "one-dynamic-axis@8", "string"],
)  # fmt: skip
def test_trilu_without_an_exact_form_is_refused(elem, shape, target, reason) -> None:
    model = model_at(
        18,
        [oh.make_node("Trilu", ["x"], ["y"])],
        [info("x", elem, shape)],
        [info("y", elem, shape)],
    )
    with pytest.raises(OpsetConversionError) as raised:
        converted(model, target)
    assert str(raised.value) == refusal(reason)


@pytest.mark.parametrize(
    ("declared", "reason"),
    [
        (None, "the type of its input is unknown"),
        (onnx.helper.make_tensor_type_proto(F32, None), "the rank of 't' is unknown"),
    ],
    ids=["type", "rank"],
)
def test_trilu_of_an_unknown_type_or_rank_is_refused(declared, reason) -> None:
    """The input of the Trilu declared with no type, or with no shape."""
    graph = oh.make_graph(
        [oh.make_node("Identity", ["x"], ["t"]), oh.make_node("Trilu", ["t"], ["y"])],
        "model",
        [info("x", F32, [2, 3])],
        [info("y", F32, [2, 3])],
    )
    if declared is not None:
        graph.value_info.append(oh.make_value_info("t", declared))
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10)
    with pytest.raises(OpsetConversionError) as raised:
        converted(model, 13)
    assert str(raised.value) == refusal(reason)


# -- exported from torch --------------------------------------------------------------------------

Dim = torch.export.Dim
B, H = 2, 2
T = Dim("T", min=1)


class Triangle(torch.nn.Module):
    """A scan whose step keeps a triangle of a matrix made from its element and emits it."""

    def __init__(self, upper: bool, diagonal: int, square: bool = False) -> None:
        super().__init__()
        self.upper, self.diagonal, self.square = upper, diagonal, square

    def forward(self, xs, h):
        def step(c, x):
            a = x @ x.transpose(-1, -2) if self.square else x * 2.0
            a = (torch.triu if self.upper else torch.tril)(a, self.diagonal)
            return c + a.sum((-2, -1)), a

        return torchscan.scan(step, h, xs)


class CausalAttention(torch.nn.Module):
    """Causal self-attention over a step's tokens, of a number known only at run time: torch.onnx
    builds its mask with a Trilu of a tensor of ones."""

    def forward(self, qs, h):
        def step(c, q):
            a = F.scaled_dot_product_attention(q, q * 0.5, q, is_causal=True)
            return c + a.sum(-2), a

        return torchscan.scan(step, h, qs)


@dataclasses.dataclass(frozen=True)
class Case:
    make: Callable[[], torch.nn.Module]
    inputs: Callable[[int], tuple[torch.Tensor, ...]]
    """The inputs for a sequence of the given length."""
    dynamic_shapes: Callable[[], tuple]
    static: bool = False
    """Whether the matrices of the step have a static shape (which opset 8 converts)."""


def _sequence(*shape: int) -> Callable[[int], tuple[torch.Tensor, ...]]:
    """A sequence of ``shape`` elements, and a carry of ``shape[:-2]``."""

    def inputs(t: int) -> tuple[torch.Tensor, ...]:
        generator = torch.Generator().manual_seed(t)
        return torch.randn(t, *shape, generator=generator), torch.randn(shape[:-2])

    return inputs


def _matrices(rows: Callable[[int], int], columns: Callable[[int], int]) -> Callable:
    """A sequence of (B, rows, columns) matrices, each dimension a function of the length."""

    def inputs(t: int) -> tuple[torch.Tensor, ...]:
        generator = torch.Generator().manual_seed(t)
        return torch.randn(t, B, rows(t), columns(t), generator=generator), torch.randn(B)

    return inputs


CASES = {
    # static (3, 3) matrices without a batch axis: a constant mask
    "triu": Case(
        lambda: Triangle(True, 0, square=True), _sequence(3, 4), lambda: ({0: T}, None), True
    ),
    # static (B, 3, 5) matrices: rectangular, a batch axis, a positive k
    "tril(k=2)": Case(lambda: Triangle(False, 2), _sequence(B, 3, 5), lambda: ({0: T}, None), True),
    # (B, N, 5) with N known at run time only, a negative k
    "triu(k=-1)": Case(
        lambda: Triangle(True, -1),
        _matrices(lambda t: t + 1, lambda t: 5),
        lambda: ({0: T, 2: Dim("N", min=2)}, None),
    ),
    # (B, 4, M), M known at run time only
    "tril(k=-2)": Case(
        lambda: Triangle(False, -2),
        _matrices(lambda t: 4, lambda t: t + 3),
        lambda: ({0: T, 3: Dim("M", min=2)}, None),
    ),
    # (B, H, L, 3) queries, L known at run time only
    "sdpa(is_causal)": Case(
        CausalAttention,
        lambda t: (
            torch.randn(t, B, H, t + 1, 3, generator=torch.Generator().manual_seed(t)),
            torch.zeros(B, H, 3),
        ),
        lambda: ({0: T, 3: Dim("L", min=2)}, None),
    ),
}

EXPORT_LENGTH = 3
RUN_LENGTHS = (1, 6)


@pytest.fixture(scope="module")
def exported():
    cache: dict = {}

    def get(name: str, opset: int) -> tuple[torch.nn.Module, onnx.ModelProto]:
        key = (name, opset)
        if key not in cache:
            case = CASES[name]
            torch.manual_seed(0)
            model = case.make().eval()
            try:
                program = onnx_export(
                    model,
                    case.inputs(EXPORT_LENGTH),
                    dynamo=True,
                    opset_version=opset,
                    dynamic_shapes=case.dynamic_shapes(),
                )
                cache[key] = model, program.model_proto
            except Exception as error:  # re-raised in every test that needs this export
                cache[key] = model, error
        model, result = cache[key]
        if isinstance(result, Exception):
            raise result
        return model, result

    return get


def assert_matches_eager(model: torch.nn.Module, proto: onnx.ModelProto, name: str) -> None:
    """onnxruntime at both levels and the reference evaluator give what eager PyTorch gives, at
    lengths other than the exported one."""
    for length in RUN_LENGTHS:
        inputs = CASES[name].inputs(length)
        expected = eager_outputs(model, inputs)
        assert_outputs_close(run_onnxruntime(proto, inputs), expected, proto)
        assert_outputs_close(run_reference(proto, inputs), expected, proto)


BELOW_14 = (13, 11, 10, 9)
# Each model at two of the four opsets below 14, in turn, so that every opset is exported by some
# models; every model at every one with TORCHSCAN_TEST_ALL_OPSETS=1.
EXPORTED = [
    *[
        (name, opset)
        for i, name in enumerate(CASES)
        for opset in (BELOW_14 if EVERY_PAIR else (BELOW_14[i % 4], BELOW_14[(i + 2) % 4]))
    ],
    *[(name, 8) for name, case in CASES.items() if case.static],
]


@pytest.mark.parametrize(("name", "opset"), EXPORTED, ids=[f"{n}-{o}" for n, o in EXPORTED])
def test_a_triangle_in_a_scan_step_exports_below_opset_14(exported, name: str, opset: int) -> None:
    model, proto = exported(name, opset)
    onnx.checker.check_model(proto, full_check=True)
    assert [o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")] == [opset]
    assert "Trilu" not in op_types(proto)
    assert_matches_eager(model, proto, name)
    # the control: at opset 14 the Trilu stays, and computes the same
    _, control = exported(name, 14)
    assert "Trilu" in op_types(control)
    assert_matches_eager(model, control, name)


@pytest.mark.parametrize(
    ("name", "node", "value"),
    [
        ("triu(k=-1)", "node_triu", "mul_2"),
        ("sdpa(is_causal)", "node_Trilu_21", "val_20"),
    ],
    ids=["triu", "sdpa"],
)
def test_a_triangle_of_dynamic_shape_is_refused_at_opset_8(exported, name, node, value) -> None:
    """Opset 8 has no Where, which the conversion computes by selection for static shapes only:
    the refusal says so, and names the opsets that convert it."""
    with pytest.raises(OpsetConversionError) as raised:
        exported(name, 8)
    assert str(raised.value) == (
        f"torch.onnx.export: cannot convert Trilu (node '{node}') from opset 14 to opset 13: "
        "below opset 9 it is computed by selection without Where, which needs a static shape, "
        f"and the shape of its input '{value}' is not known before run time (export at opset 9 "
        "or newer, or with static shapes in the step). Export with a newer opset_version (at "
        "opset 14 this Trilu is kept as it is), or compute it in the step with operators that "
        "opset 13 has."
    )
