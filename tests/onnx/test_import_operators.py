"""``torchscan.onnx.to_torch``'s ``Resize``, quantization operators and ``ai.onnx.ml``
operators, against onnxruntime (and onnx's reference implementation where onnxruntime departs
from the specification), on single-node models built with ``onnx.helper``; and the errors of
the nodes they refuse."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper
import onnx.reference
import onnxruntime as ort
import pytest
import torch

import torchscan.onnx
from torchscan.onnx import OnnxImportError

F = onnx.TensorProto.FLOAT
D = onnx.TensorProto.DOUBLE
H = onnx.TensorProto.FLOAT16
I64 = onnx.TensorProto.INT64
I32 = onnx.TensorProto.INT32
I16 = onnx.TensorProto.INT16
U16 = onnx.TensorProto.UINT16
I8 = onnx.TensorProto.INT8
U8 = onnx.TensorProto.UINT8
B = onnx.TensorProto.BOOL
ML = "ai.onnx.ml"

Value = tuple[str, Any, Any]  # a graph input or output: name, element type, shape


def _model(
    op: str,
    inputs: list[Value],
    outputs: list[Value],
    *,
    opset: int,
    domain: str = "",
    initializers: dict[str, np.ndarray] | None = None,
    node_inputs: list[str] | None = None,
    **attributes: Any,
) -> onnx.ModelProto:
    """A model of one node ``op``: ``inputs`` are the graph's inputs, ``initializers`` its
    constant inputs (``node_inputs`` orders them all, ``""`` for an omitted one)."""
    initializers = initializers or {}
    names = node_inputs or [name for name, _, _ in inputs] + list(initializers)
    node = oh.make_node(op, names, [n for n, _, _ in outputs], domain=domain, **attributes)
    graph = oh.make_graph(
        [node],
        op,
        [oh.make_tensor_value_info(*i) for i in inputs],
        [oh.make_tensor_value_info(*o) for o in outputs],
        [onnx.numpy_helper.from_array(v, n) for n, v in initializers.items()],
    )
    opsets = [oh.make_opsetid("", opset if not domain else 21)]
    if domain:
        opsets.append(oh.make_opsetid(domain, opset))
    model = oh.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    return model


def _onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[Any]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(session.run(None, feeds))


def _reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[Any]:
    """onnx's reference implementation, which the specification's examples are computed by."""
    return list(onnx.reference.ReferenceEvaluator(model).run(None, feeds))


def _imported(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    module = torchscan.onnx.to_torch(model)
    with torch.no_grad():
        got = module(**{k: torch.from_numpy(np.array(v)) for k, v in feeds.items()})
    return [g.numpy() for g in ([got] if isinstance(got, torch.Tensor) else got)]


def _assert_same(got: list[np.ndarray], want: list[Any], tolerance: float = 1e-5) -> None:
    assert len(got) == len(want)
    for value, expected in zip(got, want, strict=True):
        expected = np.asarray(expected)
        assert value.dtype == expected.dtype, (value.dtype, expected.dtype)
        assert value.shape == expected.shape, (value.shape, expected.shape)
        if expected.dtype.kind == "f":
            scale = 1e-3 if expected.dtype == np.float16 else tolerance
            np.testing.assert_allclose(value, expected, rtol=scale, atol=scale)
        else:
            np.testing.assert_array_equal(value, expected)


def _refused(model: onnx.ModelProto, feeds: dict[str, np.ndarray], message: str) -> None:
    with pytest.raises(OnnxImportError, match=message):
        _imported(model, feeds)


RNG = np.random.default_rng(0)

# ---------------------------------------------------------------------------------------------
# Resize


def _resize(
    opset: int,
    x: np.ndarray,
    *,
    roi: list[float] | None = None,
    scales: list[float] | None = None,
    sizes: list[int] | None = None,
    **attributes: Any,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    elem = onnx.helper.np_dtype_to_tensor_dtype(x.dtype)
    constants: dict[str, np.ndarray] = {}
    if opset == 11:  # (roi and scales are not optional there: empty)
        roi, scales = roi or [], scales or []
    names = ["x"]
    for name, value, dtype in (("roi", roi, np.float32), ("scales", scales, np.float32)):
        if value is not None:
            constants[name] = np.array(value, dtype)
        names.append(name if value is not None else "")
    if sizes is not None:
        constants["sizes"] = np.array(sizes, np.int64)
        names.append("sizes")
    while names[-1] == "":
        names.pop()
    if opset == 10:
        names = ["x", "scales"]
    rank = x.ndim
    model = _model(
        "Resize",
        [("x", elem, list(x.shape))],
        [("y", elem, [f"d{i}" for i in range(rank)])],
        opset=opset,
        initializers=constants,
        node_inputs=names,
        **attributes,
    )
    return model, {"x": x}


_COORDINATES = [
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
]
_NEAREST = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]


def _resize_cases() -> list[tuple[str, str, int, bool, str]]:
    cases = []
    nearest_modes = itertools.cycle(_NEAREST)
    for mode, coordinates, by_sizes in itertools.product(
        ["nearest", "linear", "cubic"], _COORDINATES, [False, True]
    ):
        for antialias in [0] if mode == "nearest" else [0, 1]:
            rounding = next(nearest_modes) if mode == "nearest" else "round_prefer_floor"
            cases.append((mode, coordinates, antialias, by_sizes, rounding))
    return cases


@pytest.mark.parametrize(
    ("mode", "coordinates", "antialias", "by_sizes", "rounding"), _resize_cases()
)
def test_resize_computes_as_onnxruntime_and_the_reference(
    mode: str, coordinates: str, antialias: int, by_sizes: bool, rounding: str
) -> None:
    """Every mode, coordinate transformation and ``nearest_mode``, antialiased or not, by scales
    or to sizes, shrinking one axis and growing the other. The scales are exact in binary and
    give whole lengths (onnxruntime computes coordinates in float32, and ``align_corners`` and
    ``tf_crop_and_resize`` of the length rounded down, where the reference does not)."""
    x = RNG.standard_normal((2, 3, 6, 4)).astype(np.float32)
    roi = [0, 0, 0.25, -0.25, 1, 1, 0.75, 1.25] if coordinates == "tf_crop_and_resize" else None
    target = {"sizes": [2, 3, 3, 7]} if by_sizes else {"scales": [1, 1, 0.5, 1.75]}
    model, feeds = _resize(
        19,
        x,
        roi=roi,
        mode=mode,
        coordinate_transformation_mode=coordinates,
        antialias=antialias,
        nearest_mode=rounding,
        extrapolation_value=-7.0,
        **target,  # type: ignore[arg-type]
    )
    got = _imported(model, feeds)
    _assert_same(got, _onnxruntime(model, feeds))
    _assert_same(got, _reference(model, feeds))


@pytest.mark.parametrize(
    ("opset", "attributes", "target", "dtype"),
    [
        (10, {"mode": "nearest"}, {"scales": [1, 1, 2, 1.5]}, np.float32),
        (10, {"mode": "nearest"}, {"scales": [1, 1, 0.5, 0.75]}, np.float32),
        (10, {"mode": "linear"}, {"scales": [1, 1, 3, 0.5]}, np.float32),
        (
            11,
            {"coordinate_transformation_mode": "tf_half_pixel_for_nn"},
            {"scales": [1, 1, 2, 0.5]},
            np.float32,
        ),
        (
            11,
            {"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1},
            {"sizes": [1, 2, 9, 3]},
            np.float32,
        ),
        (13, {"mode": "cubic", "exclude_outside": 1}, {"sizes": [1, 2, 3, 10]}, np.float32),
        (
            13,
            {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"},
            {"sizes": [1, 2, 1, 7]},
            np.float32,
        ),
        (
            18,
            {"mode": "cubic", "coordinate_transformation_mode": "pytorch_half_pixel"},
            {"sizes": [1, 2, 1, 7]},
            np.float32,
        ),
        (
            18,
            {"mode": "linear", "axes": [3, 2], "keep_aspect_ratio_policy": "not_larger"},
            {"sizes": [5, 3]},
            np.float32,
        ),
        (
            18,
            {"mode": "nearest", "axes": [2, 3], "keep_aspect_ratio_policy": "not_smaller"},
            {"sizes": [5, 3]},
            np.float32,
        ),
        (19, {"mode": "linear", "axes": [-1]}, {"sizes": [9]}, np.float32),
        (19, {"mode": "nearest", "axes": [1]}, {"scales": [2.0]}, np.float32),
        (19, {"mode": "nearest"}, {"scales": [1, 1, 1.5, 0.5]}, np.uint8),
        (19, {"mode": "nearest", "nearest_mode": "ceil"}, {"scales": [1, 1, 0.5, 2]}, np.int8),
        (19, {"mode": "nearest"}, {"sizes": [1, 2, 7, 3]}, np.int32),
        (19, {"mode": "nearest"}, {"scales": [1, 1, 1.5, 0.5]}, np.float16),
        (19, {"mode": "linear"}, {"scales": [1, 1, 1.5, 0.5]}, np.float16),
        (19, {"mode": "cubic", "antialias": 1}, {"scales": [1, 1, 0.25, 0.5]}, np.float16),
    ],
)
def test_resize_versions_attributes_and_types_compute_as_onnxruntime(
    opset: int, attributes: dict[str, Any], target: dict[str, Any], dtype: Any
) -> None:
    """Resize-10 (``asymmetric``; ``nearest`` rounds down, or up where the axis shrinks, as
    onnxruntime does), version 11's ``tf_half_pixel_for_nn``, ``cubic_coeff_a`` and
    ``exclude_outside``, ``pytorch_half_pixel`` to one element (0, as the specification and
    onnxruntime say), ``axes`` (negative too) with ``keep_aspect_ratio_policy``, integer and
    float16 inputs."""
    x = RNG.standard_normal((1, 2, 4, 6)) * 20
    model, feeds = _resize(opset, x.astype(dtype), **attributes, **target)
    _assert_same(_imported(model, feeds), _onnxruntime(model, feeds))


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_of_integers_by_linear_or_cubic_rounds_as_the_reference(mode: str) -> None:
    """Half to even and saturated (onnxruntime truncates)."""
    x = RNG.integers(0, 256, (1, 1, 5, 4)).astype(np.uint8)
    model, feeds = _resize(19, x, scales=[1, 1, 1.4, 0.5], mode=mode)
    _assert_same(_imported(model, feeds), _reference(model, feeds))


@pytest.mark.parametrize(
    ("mode", "antialias", "coordinates"),
    [
        ("linear", 0, "half_pixel"),
        ("linear", 1, "half_pixel"),
        ("cubic", 0, "align_corners"),
        ("cubic", 1, "tf_crop_and_resize"),
    ],
)
def test_resize_has_the_gradients_of_its_weights(
    mode: str, antialias: int, coordinates: str
) -> None:
    """Differentiable in the input (float64, against finite differences), shrinking and
    growing."""
    x = torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True)
    roi = [0, 0, 0.1, 0.2, 1, 1, 0.9, 1.3] if coordinates == "tf_crop_and_resize" else None
    model, _ = _resize(
        19,
        x.detach().numpy(),
        roi=roi,
        scales=[1, 1, 0.6, 1.75],
        mode=mode,
        antialias=antialias,
        coordinate_transformation_mode=coordinates,
    )
    module = torchscan.onnx.to_torch(model)
    assert torch.autograd.gradcheck(module, (x,))


# ---------------------------------------------------------------------------------------------
# Quantization

_QUANTIZED = {np.uint8: U8, np.int8: I8, np.uint16: U16, np.int16: I16}


@pytest.mark.parametrize(
    ("opset", "qtype", "granularity"),
    [
        (10, np.uint8, "tensor"),
        (13, np.int8, "axis"),
        (19, np.uint8, "axis"),
        (21, np.int16, "axis"),
        (21, np.uint16, "blocked"),
        (23, np.int8, "blocked"),
        (24, np.uint8, "tensor"),
        (25, np.int16, "blocked"),
    ],
)
def test_quantize_and_dequantize_linear_compute_as_onnxruntime(
    opset: int, qtype: Any, granularity: str
) -> None:
    """Per tensor, per axis (axis 1) and blocked (blocks of 2 along axis 2, the last one
    short): quantized with rounding half to even (the inputs hold ties) and saturation, then
    dequantized."""
    x = (RNG.integers(-400, 400, (2, 3, 5)) / 2).astype(np.float32)
    if granularity == "tensor":
        shape: tuple[int, ...] = ()
    elif granularity == "axis":
        shape = (3,)
    else:
        shape = (2, 3, 3)
    scale = np.array(RNG.integers(1, 8, shape) / 4, np.float32)
    info = np.iinfo(qtype)
    zero = np.array(RNG.integers(info.min, info.max // 4 + 1, shape), qtype)
    attributes: dict[str, Any] = {"axis": 1} if granularity == "axis" else {}
    if granularity == "blocked":
        attributes = {"axis": 2, "block_size": 2}
    quantize = _model(
        "QuantizeLinear",
        [("x", F, [2, 3, 5]), ("scale", F, list(shape)), ("zero", _QUANTIZED[qtype], list(shape))],
        [("y", _QUANTIZED[qtype], [2, 3, 5])],
        opset=opset,
        **attributes,
    )
    feeds = {"x": x, "scale": scale, "zero": zero}
    got = _imported(quantize, feeds)
    _assert_same(got, _onnxruntime(quantize, feeds))
    dequantize = _model(
        "DequantizeLinear",
        [
            ("q", _QUANTIZED[qtype], [2, 3, 5]),
            ("scale", F, list(shape)),
            ("zero", _QUANTIZED[qtype], list(shape)),
        ],
        [("y", F, [2, 3, 5])],
        opset=opset,
        **attributes,
    )
    feeds = {"q": got[0], "scale": scale, "zero": zero}
    _assert_same(_imported(dequantize, feeds), _onnxruntime(dequantize, feeds))


def test_quantize_linear_without_a_zero_point_gives_output_dtype_and_dequantize_its_own() -> None:
    """Version 23: ``output_dtype`` without a zero point (int8 here, uint8 by default), float16
    scales, and DequantizeLinear's ``output_dtype``; against the reference (onnxruntime has no
    kernel for some of these types)."""
    x = (RNG.standard_normal((3, 4)) * 50).astype(np.float16)
    scale = np.array([0.5, 0.25, 2.0], np.float16)
    quantize = _model(
        "QuantizeLinear",
        [("x", H, [3, 4]), ("scale", H, [3])],
        [("y", I8, [3, 4])],
        opset=23,
        axis=0,
        output_dtype=I8,
    )
    feeds = {"x": x, "scale": scale}
    got = _imported(quantize, feeds)
    _assert_same(got, _reference(quantize, feeds))
    dequantize = _model(
        "DequantizeLinear",
        [("q", I8, [3, 4]), ("scale", H, [3])],
        [("y", F, [3, 4])],
        opset=23,
        axis=0,
        output_dtype=F,
    )
    feeds = {"q": got[0], "scale": scale}
    _assert_same(_imported(dequantize, feeds), _reference(dequantize, feeds))


def test_quantize_linear_adds_a_wide_zero_point_exactly() -> None:
    """float16 inputs and a uint16 zero point float16 cannot hold (40001), against the
    reference."""
    x = np.array([[-3.5, 0.5, 2.5, 1000.0]], np.float16)
    model = _model(
        "QuantizeLinear",
        [("x", H, [1, 4]), ("scale", H, []), ("zero", U16, [])],
        [("y", U16, [1, 4])],
        opset=21,
    )
    feeds = {"x": x, "scale": np.array(0.5, np.float16), "zero": np.array(40001, np.uint16)}
    _assert_same(_imported(model, feeds), _reference(model, feeds))


@pytest.mark.parametrize("kind", ["random", "positive", "zeros"])
def test_dynamic_quantize_linear_computes_as_onnxruntime(kind: str) -> None:
    """The range widened to hold 0; a tensor of zeros has scale 1, as onnxruntime gives it."""
    x = RNG.standard_normal((3, 5)).astype(np.float32) * 4
    x = {"random": x, "positive": np.abs(x) + 1, "zeros": np.zeros_like(x)}[kind]
    model = _model(
        "DynamicQuantizeLinear",
        [("x", F, [3, 5])],
        [("y", U8, [3, 5]), ("scale", F, []), ("zero", U8, [])],
        opset=11,
    )
    _assert_same(_imported(model, {"x": x}), _onnxruntime(model, {"x": x}))


@pytest.mark.parametrize(
    ("a_type", "b_type", "per_column"),
    [(np.uint8, np.uint8, False), (np.uint8, np.int8, True), (np.int8, np.int8, True)],
)
def test_matmul_integer_computes_as_onnxruntime(a_type: Any, b_type: Any, per_column: bool) -> None:
    """A zero point for ``a``, and one for ``b`` or one per column of ``b``; batched. (uint8
    by int8 below 128: onnxruntime's kernel for them adds pairs of products in 16 bits, which
    saturate beyond.)"""
    high = 128 if (a_type, b_type) == (np.uint8, np.int8) else np.iinfo(a_type).max
    a = RNG.integers(np.iinfo(a_type).min, high, (2, 3, 4)).astype(a_type)
    b = RNG.integers(np.iinfo(b_type).min, np.iinfo(b_type).max, (4, 5)).astype(b_type)
    a_zero = np.array(3, a_type)
    b_zero = np.arange(5).astype(b_type) if per_column else np.array(7, b_type)
    model = _model(
        "MatMulInteger",
        [
            ("a", _QUANTIZED[a_type], [2, 3, 4]),
            ("b", _QUANTIZED[b_type], [4, 5]),
            ("a_zero", _QUANTIZED[a_type], []),
            ("b_zero", _QUANTIZED[b_type], list(b_zero.shape)),
        ],
        [("y", I32, [2, 3, 5])],
        opset=10,
    )
    feeds = {"a": a, "b": b, "a_zero": a_zero, "b_zero": b_zero}
    _assert_same(_imported(model, feeds), _onnxruntime(model, feeds))


@pytest.mark.parametrize(
    "attributes",
    [
        {},
        {"pads": [1, 0, 2, 1], "strides": [2, 1]},
        {"auto_pad": "SAME_UPPER", "strides": [2, 2], "group": 2},
        {"dilations": [2, 1], "group": 4},
    ],
)
def test_conv_integer_and_qlinear_conv_compute_as_onnxruntime(attributes: dict[str, Any]) -> None:
    """Padding with the input's zero point, strides, dilations, groups; QLinearConv with a bias
    and a scale per output channel. (uint8 by int8 inputs below 128: onnxruntime's kernel adds
    pairs of their products in 16 bits, which saturate beyond.)"""
    x = RNG.integers(0, 128, (1, 4, 6, 5)).astype(np.uint8)
    w = RNG.integers(-128, 127, (4, 4 // attributes.get("group", 1), 3, 2)).astype(np.int8)
    x_zero, w_zero = np.array(60, np.uint8), np.array(0, np.int8)
    conv = _model(
        "ConvInteger",
        [("x", U8, [1, 4, 6, 5]), ("w", I8, list(w.shape)), ("x_zero", U8, []), ("w_zero", I8, [])],
        [("y", I32, ["n", "c", "h", "w"])],
        opset=10,
        **attributes,
    )
    feeds = {"x": x, "w": w, "x_zero": x_zero, "w_zero": w_zero}
    _assert_same(_imported(conv, feeds), _onnxruntime(conv, feeds))
    qconv = _model(
        "QLinearConv",
        [
            ("x", U8, [1, 4, 6, 5]),
            ("x_scale", F, []),
            ("x_zero", U8, []),
            ("w", I8, list(w.shape)),
            ("w_scale", F, [4]),
            ("w_zero", I8, [4]),
            ("y_scale", F, []),
            ("y_zero", U8, []),
            ("bias", I32, [4]),
        ],
        [("y", U8, ["n", "c", "h", "w"])],
        opset=10,
        **attributes,
    )
    feeds = {
        "x": x,
        "x_scale": np.array(0.05, np.float32),
        "x_zero": x_zero,
        "w": w,
        "w_scale": np.array([0.01, 0.02, 0.005, 0.03], np.float32),
        "w_zero": np.zeros(4, np.int8),
        "y_scale": np.array(0.7, np.float32),
        "y_zero": np.array(120, np.uint8),
        "bias": RNG.integers(-3000, 3000, 4).astype(np.int32),
    }
    _assert_same(_imported(qconv, feeds), _onnxruntime(qconv, feeds))


@pytest.mark.parametrize(
    ("opset", "qtype", "per_column"),
    [(10, np.uint8, False), (10, np.int8, True), (21, np.uint8, True)],
)
def test_qlinear_matmul_computes_as_onnxruntime(opset: int, qtype: Any, per_column: bool) -> None:
    info = np.iinfo(qtype)
    a = RNG.integers(info.min, info.max, (2, 3, 4)).astype(qtype)
    b = RNG.integers(info.min, info.max, (4, 5)).astype(qtype)
    columns = [5] if per_column else []
    model = _model(
        "QLinearMatMul",
        [
            ("a", _QUANTIZED[qtype], [2, 3, 4]),
            ("a_scale", F, []),
            ("a_zero", _QUANTIZED[qtype], []),
            ("b", _QUANTIZED[qtype], [4, 5]),
            ("b_scale", F, columns),
            ("b_zero", _QUANTIZED[qtype], columns),
            ("y_scale", F, []),
            ("y_zero", _QUANTIZED[qtype], []),
        ],
        [("y", _QUANTIZED[qtype], [2, 3, 5])],
        opset=opset,
    )
    feeds = {
        "a": a,
        "a_scale": np.array(0.02, np.float32),
        "a_zero": np.array(info.min // 2 + info.max // 2, qtype),
        "b": b,
        "b_scale": np.array(RNG.integers(1, 9, columns or ()) / 200, np.float32),
        "b_zero": np.zeros(columns or (), qtype),
        "y_scale": np.array(0.5, np.float32),
        "y_zero": np.array(info.max // 2, qtype),
    }
    _assert_same(_imported(model, feeds), _onnxruntime(model, feeds))


# ---------------------------------------------------------------------------------------------
# ai.onnx.ml


def _pipeline() -> onnx.ModelProto:
    """What skl2onnx writes for ``Pipeline([SimpleImputer, StandardScaler, LogisticRegression])``
    of 3 classes with ``zipmap=False``, and a column of category ids one-hot encoded beside it:
    ``ArrayFeatureExtractor`` picks the columns, ``Imputer``, ``Scaler``, ``Cast``,
    ``OneHotEncoder`` (and its ``ReduceSum`` over the column axis) and ``FeatureVectorizer``
    prepare them, ``LinearClassifier`` gives the label and probabilities; a ``Normalizer``
    and a ``LabelEncoder`` of the label follow."""
    nodes = [
        oh.make_node("ArrayFeatureExtractor", ["x", "numeric"], ["picked"], domain=ML),
        oh.make_node("ArrayFeatureExtractor", ["x", "category"], ["ids"], domain=ML),
        oh.make_node(
            "Imputer",
            ["picked"],
            ["imputed"],
            domain=ML,
            imputed_value_floats=[0.5, -1.0, 2.0],
            replaced_value_float=math.nan,
        ),
        oh.make_node(
            "Scaler",
            ["imputed"],
            ["scaled"],
            domain=ML,
            offset=[0.1, 0.2, -0.3],
            scale=[2.0, 0.5, 1.5],
        ),
        oh.make_node("Cast", ["ids"], ["ids64"], to=I64),
        oh.make_node(
            "OneHotEncoder", ["ids64"], ["hot3"], domain=ML, cats_int64s=[1, 2, 3], zeros=1
        ),
        oh.make_node("ReduceSum", ["hot3", "axis1"], ["hot"], keepdims=0),
        oh.make_node(
            "FeatureVectorizer", ["scaled", "hot"], ["features"], domain=ML, inputdimensions=[3, 3]
        ),
        oh.make_node(
            "LinearClassifier",
            ["features"],
            ["label", "probabilities"],
            domain=ML,
            classlabels_ints=[0, 1, 2],
            coefficients=RNG.standard_normal(18).round(3).tolist(),
            intercepts=[0.1, -0.2, 0.05],
            multi_class=1,
            post_transform="SOFTMAX",
        ),
        oh.make_node("Normalizer", ["features"], ["normalized"], domain=ML, norm="L2"),
        oh.make_node(
            "LabelEncoder",
            ["label"],
            ["renamed"],
            domain=ML,
            keys_int64s=[0, 1, 2],
            values_int64s=[10, 20, 30],
        ),
        oh.make_node(
            "LinearRegressor",
            ["normalized"],
            ["value"],
            domain=ML,
            coefficients=[0.5, -1.0, 2.0, 0.0, 1.0, 1.0],
            intercepts=[3.0],
        ),
    ]
    graph = oh.make_graph(
        nodes,
        "pipeline",
        [oh.make_tensor_value_info("x", F, ["n", 4])],
        [
            oh.make_tensor_value_info("renamed", I64, ["n"]),
            oh.make_tensor_value_info("probabilities", F, ["n", 3]),
            oh.make_tensor_value_info("value", F, ["n", 1]),
        ],
        [
            onnx.numpy_helper.from_array(np.array([0, 1, 3], np.int64), "numeric"),
            onnx.numpy_helper.from_array(np.array([2], np.int64), "category"),
            onnx.numpy_helper.from_array(np.array([1], np.int64), "axis1"),
        ],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid(ML, 2)])
    model.ir_version = 8
    return model


def test_a_scikit_learn_pipeline_computes_as_onnxruntime() -> None:
    x = RNG.standard_normal((6, 4)).astype(np.float32)
    x[:, 2] = [1, 2, 3, 4, 2, 1]  # the category ids (4: none of them)
    x[1, 0] = x[4, 3] = np.nan
    model = _pipeline()
    _assert_same(_imported(model, {"x": x}), _onnxruntime(model, {"x": x}))


def _ml(
    op: str, x: np.ndarray, outputs: list[Value], version: int = 1, **attributes: Any
) -> onnx.ModelProto:
    elem = onnx.helper.np_dtype_to_tensor_dtype(x.dtype)
    return _model(op, [("x", elem, list(x.shape))], outputs, opset=version, domain=ML, **attributes)


_X = (RNG.standard_normal((4, 3)) * 3).round(1).astype(np.float32)
_XN = _X.copy()
_XN[0, 1] = np.nan


@pytest.mark.parametrize(
    ("op", "x", "outputs", "attributes"),
    [
        ("Binarizer", _X, [("y", F, [4, 3])], {"threshold": 0.5}),
        ("Normalizer", _X, [("y", F, [4, 3])], {"norm": "MAX"}),
        ("Normalizer", _X.astype(np.float64), [("y", F, [4, 3])], {"norm": "L1"}),
        ("Normalizer", np.zeros((2, 3), np.float32), [("y", F, [2, 3])], {"norm": "L2"}),
        ("Normalizer", _X[0], [("y", F, [3])], {"norm": "L2"}),
        ("Scaler", _X.astype(np.float64), [("y", F, [4, 3])], {"offset": [1.5], "scale": [0.25]}),
        (
            "Scaler",
            _X.astype(np.int64),
            [("y", F, [4, 3])],
            {"offset": [1.0, 2.0, 3.0], "scale": [0.5, 2.0, 1.0]},
        ),
        (
            "Imputer",
            _XN,
            [("y", F, [4, 3])],
            {"imputed_value_floats": [7.0], "replaced_value_float": math.nan},
        ),
        (
            "Imputer",
            _X,
            [("y", F, [4, 3])],
            {"imputed_value_floats": [1.0, 2.0, 3.0], "replaced_value_float": float(_X[2, 2])},
        ),
        (
            "Imputer",
            _X.astype(np.int64),
            [("y", I64, [4, 3])],
            {"imputed_value_int64s": [9, 8, 7], "replaced_value_int64": 1},
        ),
        ("OneHotEncoder", _X, [("y", F, [4, 3, 4])], {"cats_int64s": [0, -1, 2, 4]}),
        (
            "OneHotEncoder",
            _X[0].astype(np.int64),
            [("y", F, [3, 2])],
            {"cats_int64s": [2, 3], "zeros": 1},
        ),
        (
            "LabelEncoder",
            _X,
            [("y", F, [4, 3])],
            {
                "keys_floats": [float(_X[1, 1]), 0.5],
                "values_floats": [1.0, 2.0],
                "default_float": -3.0,
            },
        ),
        (
            "LabelEncoder",
            _X.astype(np.int64),
            [("y", F, [4, 3])],
            {"keys_int64s": [0, 1, 2], "values_floats": [0.5, 0.25, 0.125]},
        ),
        (
            "LabelEncoder",
            _X.astype(np.int64),
            [("y", I64, [4, 3])],
            {"keys_int64s": [0, -1], "values_int64s": [5, 6]},
        ),
        (
            "LinearRegressor",
            _X,
            [("y", F, ["n", 2])],
            {
                "coefficients": [1.0, 2.0, 3.0, -1.0, 0.0, 0.5],
                "intercepts": [0.5, 1.0],
                "targets": 2,
                "post_transform": "SOFTMAX_ZERO",
            },
        ),
        (
            "LinearRegressor",
            _X,
            [("y", F, ["n", 1])],
            {"coefficients": [0.1, 0.2, 0.3], "post_transform": "LOGISTIC"},
        ),
        (
            "LinearRegressor",
            _X[0],
            [("y", F, ["n", 1])],
            {"coefficients": [0.1, 0.2, 0.3], "intercepts": [1.0]},
        ),
    ],
)
def test_an_ml_operator_computes_as_onnxruntime(
    op: str, x: np.ndarray, outputs: list[Value], attributes: dict[str, Any]
) -> None:
    version = 2 if op == "LabelEncoder" else 1
    model = _ml(op, x, outputs, version, **attributes)
    _assert_same(_imported(model, {"x": x}), _onnxruntime(model, {"x": x}))


@pytest.mark.parametrize("version", [2, 4])
def test_label_encoder_maps_a_nan_key_as_the_specification_says(version: int) -> None:
    """Version 2 compares keys bit by bit ("even a float NaN can be mapped"), version 4
    matches any NaN with a NaN key; onnxruntime's version 2 and the reference match none."""
    nan = np.float32(np.nan)
    other_nan = np.array([0x7FC00001], np.uint32).view(np.float32)[0]  # a NaN of other bits
    x = np.array([nan, other_nan, 1.0, 2.0], np.float32)
    model = _ml(
        "LabelEncoder",
        x,
        [("y", F, [4])],
        version,
        keys_floats=[math.nan, 1.0],
        values_floats=[5.0, 6.0],
        default_float=-1.0,
    )
    want = [5.0, -1.0 if version == 2 else 5.0, 6.0, -1.0]
    _assert_same(_imported(model, {"x": x}), [np.array(want, np.float32)])


def test_label_encoder_4_maps_tensors_of_other_types_as_the_reference() -> None:
    """Keys and values as tensors (int32 to float64; onnxruntime has no kernel for them)."""
    x = np.array([[0, 1, 5], [2, 2, -1]], np.int32)
    model = _ml(
        "LabelEncoder",
        x,
        [("y", D, [2, 3])],
        4,
        keys_tensor=onnx.numpy_helper.from_array(np.array([1, 2, 5], np.int32)),
        values_tensor=onnx.numpy_helper.from_array(np.array([0.5, 0.25, 4.0])),
        default_tensor=onnx.numpy_helper.from_array(np.array([-1.0])),
    )
    _assert_same(_imported(model, {"x": x}), _reference(model, {"x": x}))


@pytest.mark.parametrize("transform", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT"])
@pytest.mark.parametrize("classes", [1, 2, 3])
def test_linear_classifier_computes_as_onnxruntime(classes: int, transform: str) -> None:
    """One score with two labels (the scores ``[1 - p, p]``), two scores, three; every
    ``post_transform``."""
    if classes == 1 and transform == "PROBIT":
        return  # (refused: onnxruntime writes one score where it declares two)
    labels = [3, 7, 9][: max(classes, 2)]
    x = (np.abs(_X) / 10).astype(np.float32)
    model = _ml(
        "LinearClassifier",
        x,
        [("label", I64, ["n"]), ("scores", F, ["n", len(labels)])],
        classlabels_ints=labels,
        coefficients=RNG.standard_normal(3 * classes).round(2).tolist(),
        intercepts=RNG.standard_normal(classes).round(2).tolist(),
        post_transform=transform,
    )
    _assert_same(_imported(model, {"x": x}), _onnxruntime(model, {"x": x}))


MODES = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]


def _trees(
    rng: np.random.Generator,
    prefix: str,
    outputs: int,
    *,
    weighed: int | None = None,
    positive: bool = False,
) -> dict[str, Any]:
    """The attributes of 3 random trees of depth up to 3 over 3 features, every branch mode,
    NaNs sent either way; each leaf weighs some outputs (only ``weighed`` where given)."""
    nodes: dict[str, list[Any]] = {
        name: []
        for name in (
            "treeids",
            "nodeids",
            "featureids",
            "modes",
            "values",
            "truenodeids",
            "falsenodeids",
            "missing_value_tracks_true",
        )
    }
    leaves: dict[str, list[Any]] = {name: [] for name in ("treeids", "nodeids", "ids", "weights")}
    for tree in range(3):
        count = itertools.count()

        def build(depth: int, tree: int = tree, count: Any = count) -> int:
            node = next(count)
            row = len(nodes["nodeids"])
            for values in nodes.values():
                values.append(0)
            nodes["treeids"][row], nodes["nodeids"][row] = tree, node
            if depth == 0 or rng.random() < 0.2:
                nodes["modes"][row] = "LEAF"
                weighs = (
                    [weighed]
                    if weighed is not None
                    else rng.choice(outputs, rng.integers(1, outputs + 1), replace=False)
                )
                for output in sorted(int(o) for o in weighs):
                    weight = round(float(rng.standard_normal()), 2)
                    for name, value in zip(
                        leaves,
                        (tree, node, output, abs(weight) if positive else weight),
                        strict=True,
                    ):
                        leaves[name].append(value)
                return node
            nodes["featureids"][row] = int(rng.integers(3))
            nodes["modes"][row] = str(rng.choice(MODES))
            nodes["values"][row] = round(float(rng.standard_normal()), 1)
            nodes["missing_value_tracks_true"][row] = int(rng.integers(2))
            nodes["truenodeids"][row] = build(depth - 1)
            nodes["falsenodeids"][row] = build(depth - 1)
            return node

        build(3)
    attributes = {f"nodes_{name}": values for name, values in nodes.items()}
    attributes |= {f"{prefix}_{name}": values for name, values in leaves.items()}
    return attributes


def _tree_input(dtype: Any = np.float32) -> np.ndarray:
    x = RNG.standard_normal((8, 3)).round(1).astype(dtype)
    x[1, 0] = x[5, 2] = np.nan
    return x


@pytest.mark.parametrize(
    ("aggregate", "targets", "transform", "dtype", "version"),
    [
        ("SUM", 1, "NONE", np.float32, 3),
        ("SUM", 2, "LOGISTIC", np.float64, 3),
        ("AVERAGE", 2, "SOFTMAX", np.float32, 3),
        ("AVERAGE", 1, "PROBIT", np.float64, 3),
        ("MIN", 2, "NONE", np.float32, 3),
        ("MAX", 3, "SOFTMAX_ZERO", np.float32, 3),
        ("MAX", 1, "LOGISTIC", np.float32, 1),
    ],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_tree_ensemble_regressor_computes_as_onnxruntime(
    aggregate: str, targets: int, transform: str, dtype: Any, version: int, seed: int
) -> None:
    """Every aggregate and post_transform, one target or several (a target no leaf reached
    weighs is 0, its base value not added, as onnxruntime gives it)."""
    rng = np.random.default_rng(seed)
    attributes = _trees(rng, "target", targets)
    if seed:
        attributes["base_values"] = rng.standard_normal(targets).round(2).tolist()
    x = _tree_input().astype(dtype)
    model = _ml(
        "TreeEnsembleRegressor",
        x,
        [("y", F, ["n", targets])],
        version,
        n_targets=targets,
        aggregate_function=aggregate,
        post_transform=transform,
        **attributes,
    )
    _assert_same(_imported(model, {"x": x}), _onnxruntime(model, {"x": x}))


@pytest.mark.parametrize(
    ("classes", "leaves", "base"),
    [
        (3, "all", 0),
        (3, "all", 3),
        (2, "all", 0),
        (2, "all", 2),
        (2, "first positive", 1),
        (2, "second positive", 0),
        (2, "first", 0),
        (2, "first", 1),
        (2, "second", 2),
    ],
)
@pytest.mark.parametrize("transform", ["NONE", "LOGISTIC", "SOFTMAX"])
def test_tree_ensemble_classifier_computes_as_onnxruntime(
    classes: int, leaves: str, base: int, transform: str
) -> None:
    """Several classes; two classes whose leaves weigh both, or one of them (positive weights
    only, or any), with 0, 1 or 2 base values: the cases of onnxruntime's binary finalization."""
    rng = np.random.default_rng(classes * 10 + base)
    weighed = {"all": None, "first": 0, "second": 1}[leaves.split()[0]]
    attributes = _trees(
        rng, "class", classes, weighed=weighed, positive=leaves.endswith("positive")
    )
    if base:
        attributes["base_values"] = rng.standard_normal(base).round(2).tolist()
    x = _tree_input()
    model = _ml(
        "TreeEnsembleClassifier",
        x,
        [("label", I64, ["n"]), ("scores", F, ["n", classes])],
        3,
        classlabels_int64s=[4, 5, 6][:classes],
        post_transform=transform,
        **attributes,
    )
    _assert_same(_imported(model, {"x": x}), _onnxruntime(model, {"x": x}))


def _forest_5(rng: np.random.Generator, targets: int, dtype: Any) -> dict[str, Any]:
    """The attributes of a TreeEnsemble-5 of 3 random trees of depth up to 3, every mode
    (integer sets: onnxruntime's ``BRANCH_MEMBER`` takes no others)."""
    a: dict[str, list[Any]] = {
        name: []
        for name in (
            "featureids",
            "modes",
            "splits",
            "missing",
            "true",
            "trueleaf",
            "false",
            "falseleaf",
        )
    }
    leaf_targets: list[int] = []
    leaf_weights: list[float] = []
    members: list[float] = []
    roots = []

    def leaf() -> int:
        leaf_targets.append(int(rng.integers(targets)))
        leaf_weights.append(round(float(rng.standard_normal()), 2))
        return len(leaf_weights) - 1

    def node(depth: int) -> int:
        row = len(a["featureids"])
        for values in a.values():
            values.append(0)
        a["featureids"][row] = int(rng.integers(3))
        a["modes"][row] = mode = int(rng.integers(7))
        if mode == 6:
            members.extend([*sorted({float(v) for v in rng.integers(-2, 3, 2)}), math.nan])
        a["splits"][row] = (
            float(rng.integers(-2, 3)) if mode >= 4 else round(float(rng.standard_normal()), 1)
        )
        a["missing"][row] = int(rng.integers(2))
        for side in ("true", "false"):
            if depth == 0 or rng.random() < 0.3:
                a[side][row], a[side + "leaf"][row] = leaf(), 1
            else:
                a[side][row], a[side + "leaf"][row] = node(depth - 1), 0
        return row

    for _ in range(3):
        roots.append(node(2))

    def tensor(values: list[float]) -> onnx.TensorProto:
        return onnx.numpy_helper.from_array(np.array(values, dtype))

    attributes: dict[str, Any] = {
        "nodes_featureids": a["featureids"],
        "nodes_modes": onnx.numpy_helper.from_array(np.array(a["modes"], np.uint8)),
        "nodes_splits": tensor(a["splits"]),
        "nodes_missing_value_tracks_true": a["missing"],
        "nodes_truenodeids": a["true"],
        "nodes_trueleafs": a["trueleaf"],
        "nodes_falsenodeids": a["false"],
        "nodes_falseleafs": a["falseleaf"],
        "leaf_targetids": leaf_targets,
        "leaf_weights": tensor(leaf_weights),
        "tree_roots": roots,
        "n_targets": targets,
    }
    if members:
        attributes["membership_values"] = tensor(members)
    return attributes


@pytest.mark.parametrize(
    ("aggregate", "transform", "targets", "dtype"),
    [
        (1, 0, 1, np.float32),
        (0, 1, 3, np.float32),
        (2, 2, 3, np.float64),
        (3, 3, 2, np.float32),
        (1, 4, 1, np.float64),
    ],
)
def test_tree_ensemble_5_computes_as_onnxruntime(
    aggregate: int, transform: int, targets: int, dtype: Any
) -> None:
    """Every aggregate, post_transform and mode (set membership too). onnxruntime reads
    ``post_transform`` 1 as LOGISTIC and 2 as SOFTMAX, its own enumeration, where the
    specification says 1 is SOFTMAX and 2 LOGISTIC: it runs the model with the two swapped."""
    rng = np.random.default_rng(aggregate * 7 + transform)
    attributes = _forest_5(rng, targets, dtype)
    x = RNG.integers(-3, 4, (8, 3)).astype(dtype)
    x[2, 1] = np.nan
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    model = _ml(
        "TreeEnsemble",
        x,
        [("y", elem, ["n", targets])],
        5,
        aggregate_function=aggregate,
        post_transform=transform,
        **attributes,
    )
    swapped = _ml(
        "TreeEnsemble",
        x,
        [("y", elem, ["n", targets])],
        5,
        aggregate_function=aggregate,
        post_transform={1: 2, 2: 1}.get(transform, transform),
        **attributes,
    )
    _assert_same(_imported(model, {"x": x}), _onnxruntime(swapped, {"x": x}))


# ---------------------------------------------------------------------------------------------
# What is refused, and the words of the refusal


def _case(
    op: str,
    arrays: dict[str, np.ndarray],
    outputs: list[Value],
    opset: int,
    *,
    domain: str = "",
    node_inputs: list[str] | None = None,
    **attributes: Any,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A model of one node whose inputs are ``arrays`` (graph inputs), and the feeds."""
    inputs = [
        (name, onnx.helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape))
        for name, value in arrays.items()
    ]
    model = _model(
        op, inputs, outputs, opset=opset, domain=domain, node_inputs=node_inputs, **attributes
    )
    return model, dict(arrays)


def _resize_case(
    x: np.ndarray, opset: int = 19, **kwargs: Any
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    return _resize(opset, x, **kwargs)


_F4 = np.zeros((1, 1, 2, 3), np.float32)
_F23 = np.zeros((2, 3), np.float32)


def _legacy_trees(**changes: Any) -> dict[str, Any]:
    """A tree of one branch and two leaves (TreeEnsembleRegressor), with ``changes``."""
    attributes: dict[str, Any] = {
        "nodes_treeids": [0, 0, 0],
        "nodes_nodeids": [0, 1, 2],
        "nodes_featureids": [0, 0, 0],
        "nodes_modes": ["BRANCH_LEQ", "LEAF", "LEAF"],
        "nodes_values": [0.5, 0.0, 0.0],
        "nodes_truenodeids": [1, 0, 0],
        "nodes_falsenodeids": [2, 0, 0],
        "target_treeids": [0, 0],
        "target_nodeids": [1, 2],
        "target_ids": [0, 0],
        "target_weights": [1.0, 2.0],
    }
    return attributes | changes


def _classes(**changes: Any) -> dict[str, Any]:
    attributes = _legacy_trees()
    for name in ("treeids", "nodeids", "ids", "weights"):
        attributes[f"class_{name}"] = attributes.pop(f"target_{name}")
    attributes |= {"class_ids": [0, 1], "classlabels_int64s": [3, 4]}
    return attributes | changes


def _trees_5(**changes: Any) -> dict[str, Any]:
    """A TreeEnsemble-5 of one branch and two leaves, with ``changes``."""
    attributes: dict[str, Any] = {
        "nodes_featureids": [0],
        "nodes_modes": onnx.numpy_helper.from_array(np.array([0], np.uint8)),
        "nodes_splits": onnx.numpy_helper.from_array(np.array([0.5], np.float32)),
        "nodes_truenodeids": [0],
        "nodes_trueleafs": [1],
        "nodes_falsenodeids": [1],
        "nodes_falseleafs": [1],
        "leaf_targetids": [0, 0],
        "leaf_weights": onnx.numpy_helper.from_array(np.array([1.0, 2.0], np.float32)),
        "tree_roots": [0],
    }
    return attributes | changes


def _regressor(x: np.ndarray = _F23, version: int = 3, **attributes: Any) -> Any:
    return _case(
        "TreeEnsembleRegressor", {"x": x}, [("y", F, ["n", 1])], version, domain=ML, **attributes
    )


def _classifier(**attributes: Any) -> Any:
    outputs = [("label", I64, ["n"]), ("scores", F, ["n", "c"])]
    return _case("TreeEnsembleClassifier", {"x": _F23}, outputs, 3, domain=ML, **attributes)


def _tree_ensemble(**attributes: Any) -> Any:
    return _case("TreeEnsemble", {"x": _F23}, [("y", F, ["n", 1])], 5, domain=ML, **attributes)


def _q(op: str, opset: int, arrays: dict[str, np.ndarray], output: int, **attributes: Any) -> Any:
    shape = list(next(iter(arrays.values())).shape)
    return _case(op, arrays, [("y", output, shape)], opset, **attributes)


_X3 = np.zeros((2, 3, 4), np.float32)
_S3 = np.ones(3, np.float32)
_Z3 = np.zeros(3, np.uint8)
_LINEAR: dict[str, Any] = {"coefficients": [1.0, 2.0, 3.0]}

REFUSALS: dict[str, tuple[Any, str]] = {
    # Resize
    "resize-empty-axis": (
        lambda: _resize_case(np.zeros((1, 1, 0, 3), np.float32), sizes=[1, 1, 2, 3]),
        "an axis of length 0 resized to 2",
    ),
    "resize-mode": (
        lambda: _resize_case(_F4, scales=[1, 1, 2, 2], mode="area"),
        "mode 'area' \\(one of 'nearest', 'linear', 'cubic'\\)",
    ),
    "resize-axes-range": (
        lambda: _resize_case(_F4, sizes=[2], axes=[4]),
        "axes \\[4\\] are out of range",
    ),
    "resize-axes-repeat": (lambda: _resize_case(_F4, sizes=[2, 2], axes=[2, -2]), "repeat an axis"),
    "resize-both": (
        lambda: _resize_case(_F4, scales=[1, 1, 2, 2], sizes=[1, 1, 4, 6]),
        "both scales and sizes",
    ),
    "resize-neither": (lambda: _resize_case(_F4, opset=13), "neither scales nor sizes"),
    "resize-count": (
        lambda: _resize_case(_F4, scales=[2.0, 2.0]),
        "do not give one value for each of the 4 resized axes",
    ),
    "resize-roi": (
        lambda: _resize_case(
            _F4,
            roi=[0.0, 1.0],
            sizes=[1, 1, 2, 2],
            coordinate_transformation_mode="tf_crop_and_resize",
        ),
        "does not give a start and an end for each of the 4",
    ),
    "resize-scale-sign": (lambda: _resize_case(_F4, scales=[1, 1, 0, 2]), "must be positive"),
    "resize-size-sign": (lambda: _resize_case(_F4, sizes=[1, 1, -1, 2]), "must not be negative"),
    "resize-policy": (
        lambda: _resize_case(_F4, sizes=[1, 1, 4, 4], keep_aspect_ratio_policy="fit"),
        "keep_aspect_ratio_policy 'fit'",
    ),
    "resize-bool-linear": (
        lambda: _resize_case(np.zeros((1, 1, 2, 2), bool), scales=[1, 1, 2, 2], mode="linear"),
        "mode 'linear' of a torch.bool tensor",
    ),
    "resize-coordinates": (
        lambda: _resize_case(
            _F4,
            opset=18,
            scales=[1, 1, 2, 2],
            coordinate_transformation_mode="half_pixel_symmetric",
        ),
        "Resize-18 has half_pixel",
    ),
    "resize-nearest-mode": (
        lambda: _resize_case(_F4, scales=[1, 1, 2, 2], nearest_mode="round"),
        "nearest_mode 'round'",
    ),
    "resize-10-mode": (
        lambda: _resize_case(_F4, opset=10, scales=[1, 1, 2, 2], mode="cubic"),
        "mode 'cubic' \\(one of 'nearest', 'linear'\\)",
    ),
    # Quantization
    "quantize-type": (
        lambda: _q(
            "QuantizeLinear",
            21,
            {"x": _X3, "scale": np.ones((), np.float32)},
            onnx.TensorProto.INT4,
            output_dtype=onnx.TensorProto.INT4,
        ),
        "quantization to element type 22",
    ),
    "quantize-int32": (
        lambda: _q(
            "QuantizeLinear",
            21,
            {"x": _X3, "scale": np.ones((), np.float32), "zero": np.zeros((), np.int32)},
            I32,
        ),
        "quantization to torch.int32",
    ),
    "quantize-10-scale": (
        lambda: _q("QuantizeLinear", 10, {"x": _X3, "scale": _S3}, U8),
        "this version takes a scalar",
    ),
    "quantize-axis": (
        lambda: _q("QuantizeLinear", 13, {"x": _X3, "scale": _S3}, U8, axis=5),
        "axis 5 is out of range",
    ),
    "quantize-per-axis": (
        lambda: _q("QuantizeLinear", 13, {"x": _X3, "scale": np.ones(4, np.float32)}, U8),
        "is neither one element nor one for each of the 3 elements of axis 1",
    ),
    "quantize-block-size": (
        lambda: _q(
            "QuantizeLinear",
            21,
            {"x": _X3, "scale": np.ones((2, 2, 4), np.float32)},
            U8,
            block_size=-2,
        ),
        "block_size -2 must be positive",
    ),
    "quantize-blocks": (
        lambda: _q(
            "QuantizeLinear",
            21,
            {"x": _X3, "scale": np.ones((2, 1, 4), np.float32)},
            U8,
            block_size=2,
        ),
        "does not block the input \\[2, 3, 4\\] in blocks of 2 along axis 1 "
        "\\(shape \\[2, 2, 4\\]\\)",
    ),
    "quantize-pair": (
        lambda: _q(
            "QuantizeLinear", 13, {"x": _X3, "scale": _S3, "zero": np.zeros((), np.uint8)}, U8
        ),
        "the zero point's shape \\[\\] is not the scale's \\[3\\]",
    ),
    "quantize-output-dtype": (
        lambda: _q(
            "QuantizeLinear",
            21,
            {"x": _X3, "scale": _S3, "zero": np.zeros(3, np.int8)},
            I8,
            output_dtype=U8,
        ),
        "output_dtype 2 is not the type of the zero point",
    ),
    "quantize-precision": (
        lambda: _q("QuantizeLinear", 23, {"x": _X3, "scale": _S3}, U8, precision=I8),
        "precision 3 \\(a floating-point type",
    ),
    "dequantize-type": (
        lambda: _q(
            "DequantizeLinear",
            21,
            {"x": np.zeros((2, 3), np.int64), "scale": np.ones((), np.float32)},
            F,
        ),
        "dequantization of torch.int64",
    ),
    "dequantize-zero-type": (
        lambda: _q(
            "DequantizeLinear", 21, {"x": np.zeros((2, 3), np.int8), "scale": _S3, "zero": _Z3}, F
        ),
        "the zero point \\(torch.uint8\\) is not of x's type \\(torch.int8\\)",
    ),
    "dequantize-output-dtype": (
        lambda: _q(
            "DequantizeLinear",
            23,
            {"x": np.zeros((2, 3), np.int8), "scale": _S3},
            I8,
            output_dtype=I8,
        ),
        "output_dtype 3 \\(float, float16 or bfloat16\\)",
    ),
    "conv-integer-x-zero": (
        lambda: _case(
            "ConvInteger",
            {
                "x": np.zeros((1, 2, 3, 3), np.uint8),
                "w": np.zeros((4, 2, 1, 1), np.uint8),
                "x_zero": np.zeros(2, np.uint8),
            },
            [("y", I32, [1, 4, 3, 3])],
            10,
        ),
        "x_zero_point of shape \\[2\\] \\(this operator takes one zero point for the input\\)",
    ),
    "conv-integer-w-zero": (
        lambda: _case(
            "ConvInteger",
            {
                "x": np.zeros((1, 2, 3, 3), np.uint8),
                "w": np.zeros((4, 2, 1, 1), np.uint8),
                "x_zero": np.zeros((), np.uint8),
                "w_zero": _Z3,
            },
            [("y", I32, [1, 4, 3, 3])],
            10,
        ),
        "w_zero_point of shape \\[3\\] is neither one element nor one for each of the 4 "
        "output channels",
    ),
    "qlinear-matmul-y-scale": (
        lambda: _case(
            "QLinearMatMul",
            {
                "a": np.zeros((2, 3), np.uint8),
                "a_scale": np.ones((), np.float32),
                "a_zero": np.zeros((), np.uint8),
                "b": np.zeros((3, 2), np.uint8),
                "b_scale": np.ones((), np.float32),
                "b_zero": np.zeros((), np.uint8),
                "y_scale": np.ones(2, np.float32),
                "y_zero": np.zeros((), np.uint8),
            },
            [("y", U8, [2, 2])],
            10,
        ),
        "y_scale of shape \\[2\\] \\(this operator takes a scalar\\)",
    ),
    # ai.onnx.ml
    "ml-strings": (
        lambda: _case(
            "LabelEncoder",
            {"x": np.zeros(3, np.int64)},
            [("y", I64, [3])],
            2,
            domain=ML,
            keys_strings=["a"],
            values_int64s=[1],
        ),
        "attribute keys_strings: strings have no torch type",
    ),
    "ml-rank": (
        lambda: _case("Normalizer", {"x": _X3}, [("y", F, [2, 3, 4])], 1, domain=ML),
        "an input of rank 3 \\(the operator takes a vector or a matrix\\)",
    ),
    "ml-transform": (
        lambda: _case(
            "LinearRegressor",
            {"x": _F23},
            [("y", F, [2, 1])],
            1,
            domain=ML,
            post_transform="EXP",
            **_LINEAR,
        ),
        "post_transform 'EXP' \\(one of NONE, LOGISTIC",
    ),
    "ml-extractor": (
        lambda: _case(
            "ArrayFeatureExtractor",
            {"x": _F23, "i": np.array([5])},
            [("y", F, [2, 1])],
            1,
            domain=ML,
        ),
        "indices \\[5\\] out of range for a last axis of 3 elements",
    ),
    "ml-norm": (
        lambda: _case("Normalizer", {"x": _F23}, [("y", F, [2, 3])], 1, domain=ML, norm="L3"),
        "norm 'L3' \\(one of 'MAX', 'L1', 'L2'\\)",
    ),
    "ml-per-feature": (
        lambda: _case(
            "Scaler",
            {"x": _F23},
            [("y", F, [2, 3])],
            1,
            domain=ML,
            scale=[1.0, 2.0],
            offset=[0.0, 0.0],
        ),
        "scale gives 2 values for 3 features",
    ),
    "ml-scaler": (
        lambda: _case("Scaler", {"x": _F23}, [("y", F, [2, 3])], 1, domain=ML, scale=[1.0]),
        "scale \\(1 values\\) and offset \\(0\\) must give as many values",
    ),
    "ml-imputer": (
        lambda: _case(
            "Imputer",
            {"x": _F23},
            [("y", F, [2, 3])],
            1,
            domain=ML,
            imputed_value_floats=[1.0],
            imputed_value_int64s=[1],
        ),
        "exactly one of imputed_value_floats and imputed_value_int64s",
    ),
    "ml-vectorizer": (
        lambda: _case(
            "FeatureVectorizer",
            {"a": _F23, "b": _F23},
            [("y", F, [2, 2])],
            1,
            domain=ML,
            inputdimensions=[2],
        ),
        "inputdimensions \\[2\\] do not give one size for each of the 2 inputs",
    ),
    "ml-label-encoder": (
        lambda: _case(
            "LabelEncoder",
            {"x": np.zeros(3, np.int64)},
            [("y", I64, [3])],
            2,
            domain=ML,
            keys_int64s=[1, 2],
            values_int64s=[1],
        ),
        "the keys and values must be given, as many of each",
    ),
    "ml-label-encoder-keys": (
        lambda: _case(
            "LabelEncoder",
            {"x": np.zeros(3, np.int64)},
            [("y", I64, [3])],
            2,
            domain=ML,
            keys_floats=[1.0],
            values_int64s=[1],
        ),
        "keys of torch.float32 for an input of torch.int64",
    ),
    "ml-label-encoder-tensor": (
        lambda: _case(
            "LabelEncoder",
            {"x": np.zeros(3, np.int64)},
            [("y", I64, [3])],
            4,
            domain=ML,
            keys_tensor=onnx.numpy_helper.from_array(np.array([1], np.uint8)),
            values_int64s=[1],
        ),
        "keys_tensor of torch.uint8",
    ),
    "ml-one-hot-categories": (
        lambda: _case(
            "OneHotEncoder", {"x": np.zeros(3, np.int64)}, [("y", F, [3, 1])], 1, domain=ML
        ),
        "no categories",
    ),
    "ml-one-hot-rank": (
        lambda: _case(
            "OneHotEncoder",
            {"x": np.zeros((1, 1, 1), np.int64)},
            [("y", F, [1, 1, 1, 1])],
            1,
            domain=ML,
            cats_int64s=[0],
        ),
        "an input of rank 3 \\(the operator takes at most 2\\)",
    ),
    "ml-one-hot-zeros": (
        lambda: _case(
            "OneHotEncoder",
            {"x": np.array([0, 5])},
            [("y", F, [2, 1])],
            1,
            domain=ML,
            cats_int64s=[0],
            zeros=0,
        ),
        "an element of no category, with zeros=0",
    ),
    "ml-coefficients": (
        lambda: _case(
            "LinearRegressor",
            {"x": _F23},
            [("y", F, [2, 1])],
            1,
            domain=ML,
            coefficients=[1.0, 2.0],
        ),
        "2 coefficients for 1 targets of 3 features",
    ),
    "ml-intercepts": (
        lambda: _case(
            "LinearRegressor",
            {"x": _F23},
            [("y", F, [2, 1])],
            1,
            domain=ML,
            intercepts=[1.0, 2.0],
            **_LINEAR,
        ),
        "2 intercepts for 1 targets",
    ),
    "ml-classifier-labels": (
        lambda: _case(
            "LinearClassifier",
            {"x": _F23},
            [("y", I64, [2]), ("z", F, [2, 1])],
            1,
            domain=ML,
            classlabels_ints=[1],
            **_LINEAR,
        ),
        "1 classlabels_ints for one score \\(0 or 2\\)",
    ),
    "ml-classifier-probit": (
        lambda: _case(
            "LinearClassifier",
            {"x": _F23},
            [("y", I64, [2]), ("z", F, [2, 2])],
            1,
            domain=ML,
            classlabels_ints=[1, 2],
            post_transform="PROBIT",
            **_LINEAR,
        ),
        "post_transform PROBIT of one score for two labels",
    ),
    "ml-classifier-classes": (
        lambda: _case(
            "LinearClassifier",
            {"x": _F23},
            [("y", I64, [2]), ("z", F, [2, 3])],
            1,
            domain=ML,
            classlabels_ints=[1, 2],
            coefficients=[1.0] * 9,
        ),
        "2 classlabels_ints for 3 classes",
    ),
    "tree-feature": (
        lambda: _regressor(
            nodes_featureids=[5, 0, 0],
            **{k: v for k, v in _legacy_trees().items() if k != "nodes_featureids"},
        ),
        "a node reads feature 5 of inputs of 3 features",
    ),
    "tree-aggregate": (
        lambda: _regressor(aggregate_function="MEDIAN", **_legacy_trees()),
        "aggregate_function 'MEDIAN' \\(one of AVERAGE, SUM, MIN, MAX\\)",
    ),
    "tree-cycle": (
        lambda: _regressor(
            **_legacy_trees(
                nodes_modes=["BRANCH_LEQ", "BRANCH_LEQ", "LEAF"],
                nodes_truenodeids=[1, 0, 0],
                nodes_falsenodeids=[2, 2, 0],
                target_nodeids=[2, 2],
            )
        ),
        "the nodes of a tree form a cycle",
    ),
    "tree-lengths": (
        lambda: _regressor(**_legacy_trees(nodes_values=[0.5])),
        "the nodes_\\* attributes must give a value for each of the nodes",
    ),
    "tree-mode": (
        lambda: _regressor(**_legacy_trees(nodes_modes=["BRANCH_MEMBER", "LEAF", "LEAF"])),
        "node mode 'BRANCH_MEMBER'",
    ),
    "tree-child": (
        lambda: _regressor(**_legacy_trees(nodes_truenodeids=[7, 0, 0])),
        "node 0 of tree 0: its truenodeids node is not a node of the tree",
    ),
    "tree-leaf-lengths": (
        lambda: _regressor(**_legacy_trees(target_ids=[0])),
        "the target_\\* attributes must give as many values each",
    ),
    "tree-leaf": (
        lambda: _regressor(**_legacy_trees(target_nodeids=[0, 2])),
        "a weight for output 0 of node 0 of tree 0, which is no leaf or no output of the 1",
    ),
    "tree-base-values": (
        lambda: _regressor(base_values=[1.0, 2.0], **_legacy_trees()),
        "2 base_values for 1 targets",
    ),
    "tree-labels": (
        lambda: _classifier(**_classes(classlabels_int64s=[3], class_ids=[0, 0])),
        "1 classlabels_int64s \\(at least 2\\)",
    ),
    "tree-classes-base": (
        lambda: _classifier(**_classes(classlabels_int64s=[3, 4, 5], base_values=[1.0] * 4)),
        "4 base_values for 3 classes",
    ),
    "tree-binary-base": (
        lambda: _classifier(**_classes(base_values=[1.0] * 3)),
        "3 base_values for 2 classes",
    ),
    "tree-binary-probit": (
        lambda: _classifier(**_classes(class_ids=[0, 0], post_transform="PROBIT")),
        "an example whose trees score only the first of two classes, with post_transform PROBIT",
    ),
    "tree-5-lengths": (
        lambda: _tree_ensemble(**_trees_5(nodes_featureids=[0, 1])),
        "the nodes_\\* attributes must give a value for each of the nodes",
    ),
    "tree-5-targets": (
        lambda: _tree_ensemble(**_trees_5(leaf_targetids=[0, 1])),
        "leaf_targetids \\[0, 1\\] and leaf_weights must give as many values, each target "
        "below n_targets 1",
    ),
    "tree-5-modes": (
        lambda: _tree_ensemble(
            **_trees_5(nodes_modes=onnx.numpy_helper.from_array(np.array([7], np.uint8)))
        ),
        "nodes_modes \\[7\\] \\(0 to 6\\)",
    ),
    "tree-5-members": (
        lambda: _tree_ensemble(
            **_trees_5(nodes_modes=onnx.numpy_helper.from_array(np.array([6], np.uint8)))
        ),
        "membership_values must give a set, ended by a NaN, for each BRANCH_MEMBER node",
    ),
    "tree-5-child": (
        lambda: _tree_ensemble(**_trees_5(nodes_falsenodeids=[9])),
        "a child leaf 9 out of range",
    ),
    "tree-5-root": (lambda: _tree_ensemble(**_trees_5(tree_roots=[5])), "tree root 5 out of range"),
    "tree-5-aggregate": (
        lambda: _tree_ensemble(aggregate_function=7, **_trees_5()),
        "aggregate_function 7 \\(0 to 3\\) or post_transform 0 \\(0 to 4\\)",
    ),
}
"""Each refusal of the Resize, quantization and ai.onnx.ml nodes: a model that triggers it, and
the words of its message."""


def _no_roots() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    model, feeds = _tree_ensemble(**_trees_5(tree_roots=[0]))
    node = model.graph.node[0]
    for attribute in node.attribute:
        if attribute.name == "tree_roots":
            del attribute.ints[:]
    return model, feeds


REFUSALS["tree-5-no-root"] = (_no_roots, "no tree_roots")


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_what_is_refused_is_named_in_the_error(name: str) -> None:
    build, message = REFUSALS[name]
    model, feeds = build()
    _refused(model, feeds, message)
