"""What ``torchscan.onnx.to_torch`` reads (a ModelProto, a path, bytes), with the check tool's
messages for files that are not models; and the imported module pickled, saved and copied."""

from __future__ import annotations

import copy
import io
import pickle

import numpy as np
import onnx
import onnx.helper as oh
import pytest
import torch

import torchscan.onnx
from torchscan.onnx import OnnxImportError

from .test_import_inputs import _rnn
from .test_import_weights import _masked_model

API = "torchscan.onnx.to_torch"


def test_a_model_is_read_from_a_path_or_bytes(tmp_path) -> None:
    model = _rnn()
    path = tmp_path / "rnn.onnx"
    path.write_bytes(model.SerializeToString())
    h0, xs = torch.randn(2, 3), torch.randn(4, 2, 3)
    want = torchscan.onnx.to_torch(model)(h0, xs)
    for given in (path, str(path), model.SerializeToString()):
        torch.testing.assert_close(torchscan.onnx.to_torch(given)(h0, xs), want, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "is empty, not an ONNX model"),
        (
            b"\xff\xfe garbage",
            r"is not an ONNX model \(byte 0 does not start a field of ModelProto\)",
        ),
        (None, "is truncated: its graph field declares .* bytes, but the file ends"),
    ],
    ids=["empty", "garbage", "truncated"],
)
def test_a_file_that_is_no_model_is_refused_in_the_check_tools_words(
    tmp_path, content, message
) -> None:
    if content is None:
        data = _rnn().SerializeToString()
        content = data[: len(data) // 2]
    path = tmp_path / "model.onnx"
    path.write_bytes(content)
    with pytest.raises(OnnxImportError, match=f"^{API}: {path}: {message}"):
        torchscan.onnx.to_torch(path)


def test_a_missing_file_and_another_kind_are_refused() -> None:
    with pytest.raises(FileNotFoundError, match=r"nowhere\.onnx: no such file"):
        torchscan.onnx.to_torch("nowhere.onnx")
    with pytest.raises(
        TypeError, match=f"^{API}: model must be an onnx.ModelProto, a path or bytes, but got int$"
    ):
        torchscan.onnx.to_torch(3)  # type: ignore[arg-type]


def test_the_module_pickles_saves_and_copies_with_its_trained_weights() -> None:
    model, _ = _masked_model()
    module = torchscan.onnx.to_torch(model)
    x = torch.tensor([[-1.0, 2.0, 3.0], [1.0, -2.0, 0.5]])
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    module(x).square().sum().backward()
    optimizer.step()  # (the weights the copies must hold are trained ones)
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    copies = [
        pickle.loads(pickle.dumps(module)),
        torch.load(buffer, weights_only=False),
        copy.deepcopy(module),
    ]
    for made in copies:
        assert type(made).__name__ == "OnnxModule"
        assert made.input_names == ("x",)
        assert [n for n, _ in made.named_parameters()] == [n for n, _ in module.named_parameters()]
        torch.testing.assert_close(made(x), module(x), rtol=0, atol=0)
        torch.testing.assert_close(made(x=x), module(x), rtol=0, atol=0)


def _onnxruntime(model, feeds):
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


F = onnx.TensorProto.FLOAT


def test_an_output_without_a_type_imports_as_onnxruntime_runs_it() -> None:
    graph = oh.make_graph(
        [oh.make_node("Relu", ["x"], ["y"])],
        "untyped",
        [oh.make_tensor_value_info("x", F, [2])],
        [onnx.ValueInfoProto(name="y")],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    x = np.array([-1.0, 2.0], np.float32)
    (want,) = _onnxruntime(model, {"x": x})
    np.testing.assert_array_equal(torchscan.onnx.to_torch(model)(torch.from_numpy(x)).numpy(), want)


def test_an_output_no_inference_can_type_is_named() -> None:
    graph = oh.make_graph(
        [oh.make_node("Relu", ["x"], ["y"])],
        "untyped",
        [oh.make_tensor_value_info("x", F, [2])],
        [onnx.ValueInfoProto(name="z")],  # (no node makes it)
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    with pytest.raises(OnnxImportError, match="output 'z' of the main graph declares no type"):
        torchscan.onnx.to_torch(model)


def test_a_local_function_of_another_opset_is_inlined_as_onnxruntime_runs_it() -> None:
    function = oh.make_function(
        "custom", "Gelu14", ["a"], ["b"], [oh.make_node("Relu", ["a"], ["b"])],
        [oh.make_opsetid("", 14)],
    )  # fmt: skip
    graph = oh.make_graph(
        [oh.make_node("Gelu14", ["x"], ["y"], domain="custom")],
        "calls",
        [oh.make_tensor_value_info("x", F, [2])],
        [oh.make_tensor_value_info("y", F, [2])],
    )
    model = oh.make_model(
        graph,
        opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("custom", 1)],
        functions=[function],
    )
    x = np.array([-1.0, 2.0], np.float32)
    (want,) = _onnxruntime(model, {"x": x})
    np.testing.assert_array_equal(torchscan.onnx.to_torch(model)(torch.from_numpy(x)).numpy(), want)


# What onnx_ir or torch cannot hold, refused by name when the model is imported


def _identity_model(value: onnx.ValueInfoProto, **graph: object) -> onnx.ModelProto:
    nodes = [oh.make_node("Identity", [value.name], ["out"])]
    output = oh.make_value_info("out", value.type)
    return oh.make_model(
        oh.make_graph(nodes, "g", [value], [output], **graph),  # type: ignore[arg-type]
        opset_imports=[oh.make_opsetid("", 17)],
    )


@pytest.mark.parametrize(
    ("type_", "words"),
    [
        (oh.make_map_type_proto(onnx.TensorProto.INT64, oh.make_tensor_type_proto(1, [])), "a map"),
        (
            oh.make_sequence_type_proto(
                oh.make_map_type_proto(onnx.TensorProto.STRING, oh.make_tensor_type_proto(1, []))
            ),
            "a sequence of maps",
        ),
        (oh.make_sparse_tensor_type_proto(onnx.TensorProto.FLOAT, [2, 2]), "a sparse tensor"),
    ],
)
def test_maps_and_sparse_tensors_are_refused_naming_the_value(type_, words: str) -> None:
    model = _identity_model(oh.make_value_info("m", type_))
    with pytest.raises(OnnxImportError, match=f"the main graph: 'm' is {words} \\(maps") as error:
        torchscan.onnx.to_torch(model)
    assert error.value.not_implemented


def test_a_sparse_initializer_is_refused_naming_it() -> None:
    values = onnx.numpy_helper.from_array(np.array([1.0], np.float32), "s")
    indices = onnx.numpy_helper.from_array(np.array([0], np.int64), "s_indices")
    sparse = oh.make_sparse_tensor(values, indices, [2])
    x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])
    model = _identity_model(x, sparse_initializer=[sparse])
    with pytest.raises(OnnxImportError, match="the main graph has a sparse initializer 's'"):
        torchscan.onnx.to_torch(model)


def test_an_initializer_of_an_element_type_torch_lacks_is_refused_naming_it() -> None:
    x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])
    w = oh.make_tensor("w", onnx.TensorProto.INT4, [2], [1, -2])
    nodes = [oh.make_node("Cast", ["w"], ["wf"], to=onnx.TensorProto.FLOAT)]
    nodes.append(oh.make_node("Add", ["x", "wf"], ["y"]))
    y = oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])
    model = oh.make_model(
        oh.make_graph(nodes, "g", [x], [y], [w]), opset_imports=[oh.make_opsetid("", 21)]
    )
    with pytest.raises(
        OnnxImportError,
        match="initializer 'w' of the main graph is of element type int4, which torch has no",
    ):
        torchscan.onnx.to_torch(model)
