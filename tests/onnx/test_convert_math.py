"""``torchscan.onnx._export._convert``: Mod below opset 10 and Einsum below opset 12, with dynamic
shapes.

Mod must give exactly what onnxruntime gives for the original Mod, bit for bit, for every value:
integers of every width with their extremes, and floats drawn as random bit patterns (every
magnitude, subnormals, infinities, NaN and -0.0). Einsum must give what onnxruntime's Einsum
gives, floats within rounding (the sums may be made in another order), integers exactly.
"""

from __future__ import annotations

import functools

import hypothesis
import hypothesis.strategies as st
import numpy as np
import onnx
import onnx.helper as oh
import pytest
import torch

import torchscan

from .._export import onnx_export
from ._runtimes import eager_outputs, run_onnxruntime
from .test_convert import F32, converted, info
from .test_convert_gather import Pair, assert_identical, elem_of, model_at, seeds

EXAMPLES = hypothesis.settings(max_examples=20)

# -- Mod ------------------------------------------------------------------------------------------


@functools.cache
def mod(source: int, target: int, dtype: type, fmod: int) -> Pair:
    """``a % b`` with ``b`` broadcast along the last axis of ``a``."""
    elem = elem_of(dtype)
    model = model_at(
        source,
        [oh.make_node("Mod", ["a", "b"], ["r"], fmod=fmod)],
        [info("a", elem, ["n", "m"]), info("b", elem, ["m"])],
        [info("r", elem, ["n", "m"])],
    )
    return Pair(model, target)


def integers(rng: np.random.Generator, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    extremes = np.iinfo(dtype)
    edges = [extremes.min, extremes.min + 1, extremes.max, extremes.max - 1, 0, 1, 2, 3, 7]
    if extremes.min < 0:
        edges += [-1, -2, -3, -7]
    pool = np.concatenate(
        [np.array(edges, dtype), rng.integers(extremes.min, extremes.max, 16, dtype, True)]
    )
    return rng.choice(pool, shape)


@pytest.mark.parametrize("target", [9, 8], ids=lambda t: f"opset{t}")
@pytest.mark.parametrize("source", [10, 18], ids=lambda s: f"from{s}")
@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int8, np.uint8, np.uint64])
@EXAMPLES
@hypothesis.given(shape=st.tuples(st.integers(1, 4), st.integers(1, 4)), seed=seeds)
def test_integer_mod_converts_below_opset_10(dtype, fmod, source, target, shape, seed) -> None:
    """``V % k`` in a beam search: Python's remainder (fmod=0, the sign of the divisor) and C's
    (fmod=1, the sign of the dividend), from the truncating integer Div, for every value."""
    rng = np.random.default_rng(seed)
    a, b = integers(rng, dtype, shape), integers(rng, dtype, shape[1:])
    b[b == 0] = 3  # division by zero is undefined
    if np.iinfo(dtype).min < 0:  # and so is the quotient of the smallest value by -1
        a[(a == np.iinfo(dtype).min) & (b == -1)] = 5
    expected = np.fmod(a, b) if fmod else np.mod(a, b)
    mod(source, target, dtype, fmod).check({"a": a, "b": b}, expected)


def float_bits(rng: np.random.Generator, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    """Random bit patterns of a float type: every sign, magnitude and special value."""
    unsigned = {np.float32: np.uint32, np.float16: np.uint16}[dtype]
    bits = rng.integers(0, np.iinfo(unsigned).max, shape, unsigned, endpoint=True)
    drawn = bits.view(dtype)
    special = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1.0, -1.0, 3.0], dtype)
    mask = rng.random(shape) < 0.2
    return np.where(mask, rng.choice(special, shape), drawn).astype(dtype)


@pytest.mark.parametrize("target", [9, 8], ids=lambda t: f"opset{t}")
@pytest.mark.parametrize("source", [10, 18], ids=lambda s: f"from{s}")
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@hypothesis.settings(max_examples=30)
@hypothesis.given(shape=st.tuples(st.integers(1, 8), st.integers(1, 8)), seed=seeds)
def test_float_fmod_converts_below_opset_10_bit_for_bit(dtype, source, target, shape, seed) -> None:
    """``torch.fmod`` of floats, computed exactly in double: the same bits as C's fmod."""
    rng = np.random.default_rng(seed)
    a, b = float_bits(rng, dtype, shape), float_bits(rng, dtype, shape[1:])
    with np.errstate(invalid="ignore"):
        expected = np.fmod(a, b)
    mod(source, target, dtype, 1).check({"a": a, "b": b}, expected)


def test_float_fmod_of_every_magnitude_pair() -> None:
    """Each power of two of float against each, with a mantissa: the widest quotients."""
    powers = np.ldexp(np.float32(1.0), np.arange(-149, 128)).astype(np.float32)
    mantissas = np.float32([1.0, 1.2345678, 1.9999999])
    values = (powers[:, None] * mantissas).reshape(-1).astype(np.float32)
    b = values[::7].copy()
    a = np.broadcast_to(np.concatenate([values, -values])[:, None], (2 * len(values), len(b)))
    mod(10, 8, np.float32, 1).check({"a": a, "b": b}, np.fmod(a, b))


def mod_model(source: int, elem: int, fmod: int) -> onnx.ModelProto:
    return model_at(
        source,
        [oh.make_node("Mod", ["a", "b"], ["r"], fmod=fmod)],
        [info("a", elem, ["n"]), info("b", elem, ["n"])],
        [info("r", elem, ["n"])],
    )


@pytest.mark.parametrize(
    ("elem", "fmod", "reason"),
    [
        (onnx.TensorProto.DOUBLE, 1, "the remainder of double values is computed exactly in a "
         "wider type, and none holds every double"),
        (onnx.TensorProto.BFLOAT16, 1, "the remainder of bfloat16 values is computed exactly in "
         "double, and no Cast before opset 13 reads them"),
        (F32, 0, "fmod=0 is not defined for float inputs at Mod-10"),
    ],
)  # fmt: skip
def test_mod_without_an_exact_form_is_refused(elem: int, fmod: int, reason: str) -> None:
    model = mod_model(13, elem, fmod)
    with pytest.raises(torchscan.onnx.OpsetConversionError) as raised:
        converted(model, 9)
    assert str(raised.value) == (
        f"torch.onnx.export: cannot convert Mod from opset 10 to opset 9: {reason}. Export with a "
        f"newer "
        "opset_version (at opset 10 this Mod is kept as it is), or compute it in the step with "
        "operators that opset 9 has."
    )


# -- Einsum ---------------------------------------------------------------------------------------

EQUATIONS = [
    "bij,bjk->bik", "bhd,bhe->bhde", "bdl,dn->bdln", "ibnd,jbnd->ijbn", "ij->ji", "ij->",
    "ij,jk", "i,i->", "i,j->ij", "ab,bc,cd->ad", "bn,anm,bm->ba", "...ij,...jk->...ik",
    "...ij,jk->...ik", "bi,i->b",
]  # fmt: skip


def operand_subscripts(equation: str) -> list[str]:
    """The subscripts of each operand, an ellipsis standing for two axes ``y`` and ``z``."""
    return [t.replace("...", "yz") for t in equation.split("->")[0].split(",")]


@functools.cache
def einsum(source: int, target: int, equation: str, dtype: type) -> Pair:
    elem = elem_of(dtype)
    names = [f"x{i}" for i in range(len(operand_subscripts(equation)))]
    inputs = [
        info(name, elem, [f"{s}_{name}" for s in term])
        for name, term in zip(names, operand_subscripts(equation), strict=True)
    ]
    node = oh.make_node("Einsum", names, ["out"], equation=equation)
    return Pair(model_at(source, [node], inputs, [info("out", elem, None)]), target)


@pytest.mark.parametrize("target", [11, 9, 8], ids=lambda t: f"opset{t}")
@pytest.mark.parametrize("source", [12, 18], ids=lambda s: f"from{s}")
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
@pytest.mark.parametrize("equation", EQUATIONS)
@hypothesis.settings(max_examples=8)
@hypothesis.given(sizes=st.dictionaries(st.sampled_from("abdehijklmnyz"), st.integers(1, 4)),
                  broadcast=st.booleans(), seed=seeds)  # fmt: skip
def test_einsum_converts_below_opset_12(
    equation, dtype, source, target, sizes, broadcast, seed
) -> None:
    """Batch axes, contractions and outer products, as MatMul (as Mul and ReduceSum for
    integers at opset 8), with axes of every length; an ellipsis broadcasts a length of 1."""
    rng = np.random.default_rng(seed)
    terms = operand_subscripts(equation)
    feeds = {}
    for i, term in enumerate(terms):
        shape = [sizes.get(s, 3) for s in term]
        if broadcast and "..." in equation and i == 0:
            shape[term.index("y")] = 1
        if dtype == np.float32:
            feeds[f"x{i}"] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[f"x{i}"] = rng.integers(-(2**40), 2**40, shape, dtype)
    pair = einsum(source, target, equation, dtype)
    (want,), (got,) = pair.run(feeds)
    with np.errstate(over="ignore"):
        expected = np.einsum(equation, *feeds.values())
    if dtype == np.float32:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
        assert (got.dtype, got.shape) == (want.dtype, want.shape)
    else:
        assert_identical(got, want)
        assert_identical(got, expected.astype(np.int64))


@pytest.mark.parametrize(
    ("equation", "shapes", "reason"),
    [
        ("ii->i", [[3, 3]], "its equation 'ii->i' repeats the subscript 'i' within one operand "
         "(a diagonal), which is not decomposed"),
        ("bii,bi->b", [[2, 3, 3], [2, 3]], "its equation 'bii,bi->b' repeats the subscript 'i' "
         "within one operand (a diagonal), which is not decomposed"),
        ("...ij->ij", [[2, 3, 4]], "its equation '...ij->ij' sums over the axes of its ellipsis"),
    ],
)  # fmt: skip
def test_einsum_without_a_decomposition_is_refused(equation, shapes, reason) -> None:
    names = [f"x{i}" for i in range(len(shapes))]
    model = model_at(
        12,
        [oh.make_node("Einsum", names, ["out"], equation=equation)],
        [info(n, F32, s) for n, s in zip(names, shapes, strict=True)],
        [info("out", F32, None)],
    )
    with pytest.raises(torchscan.onnx.OpsetConversionError) as raised:
        converted(model, 11)
    assert str(raised.value) == (
        f"torch.onnx.export: cannot convert Einsum from opset 12 to opset 11: {reason}. Export "
        f"with a "
        "newer opset_version (at opset 12 this Einsum is kept as it is), or compute it in the "
        "step with operators that opset 11 has."
    )


# -- exported from torch ---------------------------------------------------------------------------


class BeamStep(torch.nn.Module):
    """A scan whose step takes ``% V`` of int64 tokens, ``torch.fmod`` of floats, and an
    ``einsum`` of the state with a weight."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 4, 5))

    def forward(self, tokens, xs, h):
        def step(carry, x):
            state, token = carry
            token_x, feature = x
            token = (token * 31 + token_x) % 7
            state = torch.tanh(torch.einsum("bi,ijk,bk->bj", state, self.weight, feature))
            return (state, token), (token % -3, torch.fmod(feature * 8, -0.75))

        return torchscan.scan(step, (h, tokens[0]), (tokens, xs))


def beam_inputs(length: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(length)
    tokens = torch.randint(-50, 50, (length, 3), generator=generator)
    return tokens, torch.randn(length, 3, 5, generator=generator), torch.randn(3, 4)


@pytest.mark.parametrize("opset", [9, 8])
def test_mod_and_einsum_in_a_scan_export_below_their_opsets(opset: int) -> None:
    torch.manual_seed(0)
    model = BeamStep().eval()
    time = torch.export.Dim("T", min=1)
    program = onnx_export(
        model, beam_inputs(3), dynamo=True, opset_version=opset,
        dynamic_shapes=({0: time}, {0: time}, None),
    )  # fmt: skip
    proto = program.model_proto
    assert [(o.domain, o.version) for o in proto.opset_import if o.domain == ""] == [("", opset)]
    for length in (1, 5):
        inputs = beam_inputs(length)
        expected = eager_outputs(model, inputs)
        for outputs in run_onnxruntime(proto, inputs).values():
            for got, want in zip(outputs, expected, strict=True):
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# -- IsInf ----------------------------------------------------------------------------------------


@functools.cache
def isinf(source: int, target: int, dtype: type, positive: int, negative: int) -> Pair:
    elem = elem_of(dtype)
    model = model_at(
        source,
        [oh.make_node("IsInf", ["x"], ["y"], detect_positive=positive, detect_negative=negative)],
        [info("x", elem, ["n"])],
        [info("y", onnx.TensorProto.BOOL, ["n"])],
    )
    return Pair(model, target)


@pytest.mark.parametrize("target", [9, 8], ids=lambda t: f"opset{t}")
@pytest.mark.parametrize("detect", [(1, 1), (1, 0), (0, 1), (0, 0)], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])  # IsInf-10's types
def test_isinf_converts_below_opset_10(dtype, detect, target) -> None:
    """``torch.isinf`` in a log-space recursion (CTC's unreachable states): exact for every value,
    the largest finite ones, NaN and both infinities included."""
    finfo = np.finfo(dtype)
    x = np.array([np.inf, -np.inf, np.nan, finfo.max, finfo.min, 0.0, -0.0, 1.5, finfo.tiny], dtype)
    positive, negative = detect
    expected = (np.isposinf(x) & bool(positive)) | (np.isneginf(x) & bool(negative))
    isinf(10, target, dtype, positive, negative).check({"x": x}, expected)
