"""The state of an imported model under the names of the module it was exported from: export,
import with ``torchscan.onnx.to_torch``, fine-tune, and load the result back into the original
module by name, where it computes what the imported module computes."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper
import pytest
import torch

import torchscan
import torchscan.onnx

from .._export import onnx_export

F = onnx.TensorProto.FLOAT


class _Tagger(torch.nn.Module):
    """A tagger as people write one: a recurrence whose input projection (a ``Linear`` of a
    3-D input, which torch.onnx computes with the weight transposed) torchscan's export moves
    out of the loop, a normalization with running statistics (persistent buffers), and a
    non-persistent buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.ModuleDict(
            {"inp": torch.nn.Linear(3, 5), "rec": torch.nn.Linear(5, 5, bias=False)}
        )
        self.norm = torch.nn.BatchNorm1d(5)
        self.head = torch.nn.Linear(5, 2)
        self.register_buffer("scale", torch.tensor([0.5, 2.0]), persistent=False)
        with torch.no_grad():
            for statistic, low, high in (("running_mean", -0.5, 0.5), ("running_var", 0.5, 1.5)):
                getattr(self.norm, statistic).uniform_(low, high)

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        def step(h, x):
            h = torch.tanh(self.encoder["inp"](x) + self.encoder["rec"](h))
            return h, h

        hs = torchscan.scan(step, xs.new_zeros(xs.shape[1], 5), xs)[1]
        normed = self.norm(hs.flatten(0, 1)).unflatten(0, hs.shape[:2])
        return self.head(normed) * self.scale


_SHARED: dict[int, tuple[torch.nn.Module, onnx.ModelProto]] = {}


def _exported(opset: int) -> tuple[torch.nn.Module, onnx.ModelProto]:
    if opset not in _SHARED:
        torch.manual_seed(0)
        module = _Tagger().eval()
        xs = torch.randn(6, 2, 3)
        program = onnx_export(
            module,
            (xs,),
            dynamo=True,
            opset_version=opset,
            dynamic_shapes=({0: torch.export.Dim("T")},),
        )
        _SHARED[opset] = module, program.model_proto
    return _SHARED[opset]


@pytest.mark.parametrize("opset", [13, 18])
def test_every_parameter_and_persistent_buffer_is_an_initializer_under_its_state_dict_name(
    opset: int,
) -> None:
    """A weight torch.onnx's optimizer would fold (``Transpose(encoder.inp.weight)``, stored
    under a new name) stays an initializer under its name, its transpose a node."""
    module, model = _exported(opset)
    initializers = {t.name for t in model.graph.initializer}
    assert set(module.state_dict()) <= initializers
    transposed = [n.input[0] for n in model.graph.node if n.op_type == "Transpose"]
    assert "encoder.inp.weight" in transposed


@pytest.mark.parametrize("opset", [13, 18])
def test_fine_tuned_weights_load_back_into_the_original_module_by_name(opset: int) -> None:
    original, model = _exported(opset)
    imported = torchscan.onnx.to_torch(model)
    assert set(imported.state_dict()) == set(original.state_dict())
    xs = torch.randn(9, 2, 3)
    optimizer = torch.optim.SGD(imported.parameters(), lr=0.5)
    imported(xs).square().sum().backward()
    optimizer.step()
    tuned = copy.deepcopy(original)
    tuned.load_state_dict(imported.state_dict())  # strict: every name, no other
    moved = tuned.get_parameter("encoder.inp.weight") - original.get_parameter("encoder.inp.weight")
    assert moved.abs().max() > 1e-3
    with torch.no_grad():
        torch.testing.assert_close(tuned(xs), imported(xs))
        assert not torch.allclose(original(xs), imported(xs))


def test_the_model_s_constants_are_buffers_left_out_of_the_state_dict() -> None:
    """The exporter's constants (shapes, the scan's empty-sequence branch) and the module's
    non-persistent buffer are buffers of the import, but not of its ``state_dict``."""
    _, model = _exported(18)
    imported = torchscan.onnx.to_torch(model)
    buffers = {imported.onnx_names[n] for n, _ in imported.named_buffers()}
    kept = set(imported.state_dict())
    assert {"norm.running_mean", "norm.running_var"} <= kept
    assert buffers - kept  # the constants
    assert all(not name.startswith("norm.") for name in buffers - kept)


def _model_with_initializers(names: list[str]) -> onnx.ModelProto:
    """``y = x + t_0 + t_1 + ...``, an initializer of two elements for each name."""
    nodes, last = [], "x"
    for i, name in enumerate(names):
        nodes.append(oh.make_node("Add", [last, name], [f"s{i}"]))
        last = f"s{i}"
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", F, [2])],
        [oh.make_tensor_value_info(last, F, [2])],
        [
            onnx.numpy_helper.from_array(np.full(2, i + 1, np.float32), name)
            for i, name in enumerate(names)
        ],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def test_names_that_are_no_module_path_or_are_taken_get_a_name_of_their_own() -> None:
    names = ["a.b", "a", "a.b.c", "forward", "graph", "training", "onnx::Add_3", "3d", "x.0.w"]
    module = torchscan.onnx.to_torch(_model_with_initializers(names))
    assert module.onnx_names == {
        "a.b": "a.b",
        "init_a": "a",  # (``a`` holds ``a.b``)
        "init_a_b_c": "a.b.c",  # (``a.b`` is a tensor)
        "init_forward": "forward",
        "init_graph": "graph",
        "init_training": "training",
        "init_onnx__Add_3": "onnx::Add_3",
        "3d": "3d",
        "x.0.w": "x.0.w",
    }
    assert set(module.state_dict()) == set(module.onnx_names)
    torch.testing.assert_close(module(torch.zeros(2)), torch.full((2,), 45.0))
    assert isinstance(module.graph, torchscan.onnx._import._graph.Graph)  # (its own, untouched)
    assert module.training is True
