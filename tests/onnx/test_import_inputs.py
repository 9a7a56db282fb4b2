"""The inputs of an imported module checked as onnxruntime checks them (element type, rank,
fixed dimensions), each refusal named (the input, its declared type and shape, what came) and
refused by onnxruntime too; inputs that disagree on a symbolic dimension named where the graph
then fails; and a model that declares one name for dimensions of other sizes runs, as it does
in onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper
import onnxruntime as ort
import pytest
import torch

import torchscan.onnx

F = onnx.TensorProto.FLOAT
API = "the module of torchscan.onnx.to_torch"


def _embedding(length: int | str = 5) -> onnx.ModelProto:
    """Token ids (int64, a fixed or a symbolic length) to rows of a table."""
    table = np.arange(12, dtype=np.float32).reshape(6, 2)
    graph = oh.make_graph(
        [oh.make_node("Gather", ["table", "tokens"], ["rows"])],
        "embedding",
        [oh.make_tensor_value_info("tokens", onnx.TensorProto.INT64, [length])],
        [oh.make_tensor_value_info("rows", F, [length, 2])],
        [onnx.numpy_helper.from_array(table, "table")],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def _rnn() -> onnx.ModelProto:
    """A Scan over ``xs: [T, B, 3]`` from ``h0: [B, 3]``."""
    body = oh.make_graph(
        [oh.make_node("Add", ["h", "x"], ["s"]), oh.make_node("Tanh", ["s"], ["h_out"])],
        "body",
        [oh.make_tensor_value_info("h", F, ["B", 3]), oh.make_tensor_value_info("x", F, ["B", 3])],
        [oh.make_tensor_value_info("h_out", F, ["B", 3])],
    )
    graph = oh.make_graph(
        [oh.make_node("Scan", ["h0", "xs"], ["h_last"], num_scan_inputs=1, body=body)],
        "rnn",
        [
            oh.make_tensor_value_info("h0", F, ["B", 3]),
            oh.make_tensor_value_info("xs", F, ["T", "B", 3]),
        ],
        [oh.make_tensor_value_info("h_last", F, ["B", 3])],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def _onnxruntime_refuses(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception):  # noqa: B017, PT011 (its errors have no common type)
        session.run(None, feeds)


@pytest.mark.parametrize(
    ("model", "tokens", "error", "message"),
    [
        (
            _embedding(),
            np.array([0.0, 1.7, 2.0, 3.0, 4.0], np.float32),
            TypeError,
            r"input 'tokens' is declared tensor\(int64\) of shape \[5\], but got a tensor of "
            r"torch.float32 of shape \(5,\) \(convert it: .to\(torch.int64\)\)",
        ),
        (
            _embedding(),
            np.arange(9) % 6,
            ValueError,
            r"input 'tokens' is declared tensor\(int64\) of shape \[5\], but got a tensor of "
            r"torch.int64 of shape \(9,\): dimension 0 must be 5",
        ),
        (
            _embedding("T"),
            (np.arange(6) % 6).reshape(2, 3),
            ValueError,
            r"input 'tokens' is declared tensor\(int64\) of shape \[T\] \(rank 1\), but got a "
            r"tensor of torch.int64 of shape \(2, 3\)",
        ),
    ],
    ids=["float-tokens", "static-length", "rank"],
)
def test_an_input_unlike_its_declaration_is_refused_as_onnxruntime_refuses_it(
    model, tokens, error, message
) -> None:
    module = torchscan.onnx.to_torch(model)
    with pytest.raises(error, match=f"^{API}: {message}$"):
        module(torch.from_numpy(tokens))
    _onnxruntime_refuses(model, {"tokens": tokens})


def test_an_input_that_is_no_tensor_is_refused() -> None:
    module = torchscan.onnx.to_torch(_embedding())
    with pytest.raises(
        TypeError, match=r"input 'tokens' is declared tensor\(int64\) .* got a list"
    ):
        module([0, 1, 2, 3, 4])


def test_inputs_that_disagree_on_a_symbolic_dimension_are_named_where_the_graph_fails() -> None:
    model = _rnn()
    module = torchscan.onnx.to_torch(model)
    h0, xs = np.zeros((2, 3), np.float32), np.ones((4, 3, 3), np.float32)
    with pytest.raises(ValueError, match=r"^" + API + r": the graph failed \(") as info:
        module(torch.from_numpy(h0), torch.from_numpy(xs))
    assert str(info.value).endswith(
        "and input 'xs' is declared tensor(float) of shape [T, B, 3] and has 3 at its dimension"
        " 1 ('B'), where input 'h0' has 2 (its dimension 0)"
    )
    _onnxruntime_refuses(model, {"h0": h0, "xs": xs})
    # of one batch, it runs as onnxruntime runs it
    h0 = np.full((3, 3), 0.5, np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = session.run(None, {"h0": h0, "xs": xs})
    torch.testing.assert_close(module(torch.from_numpy(h0), torch.from_numpy(xs)).numpy(), want)


def test_a_model_that_names_dimensions_of_other_sizes_alike_runs_as_in_onnxruntime() -> None:
    """A declaration is a hint: two inputs of ``[N, 3]`` whose lengths differ, concatenated, run
    in onnxruntime; so they do here."""
    graph = oh.make_graph(
        [oh.make_node("Concat", ["a", "b"], ["c"], axis=0)],
        "concat",
        [oh.make_tensor_value_info("a", F, ["N", 3]), oh.make_tensor_value_info("b", F, ["N", 3])],
        [oh.make_tensor_value_info("c", F, ["M", 3])],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    a, b = np.ones((2, 3), np.float32), np.zeros((5, 3), np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = session.run(None, {"a": a, "b": b})
    got = torchscan.onnx.to_torch(model)(torch.from_numpy(a), torch.from_numpy(b))
    np.testing.assert_array_equal(got.numpy(), want)
