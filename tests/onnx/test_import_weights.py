"""Which tensors of an imported model train (``torchscan.onnx.to_torch``'s ``trainable``): the
weights the graph uses as weights, whether initializers or ``Constant`` nodes, and never its
constants (an exponent, the ``1`` of ``1 - z``, a zero shared by a mask and arithmetic, an
attention mask), so that fine-tuning keeps the model's meaning; each case against the model it
was made from."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper
import pytest
import torch

import torchscan.onnx

from .._export import onnx_export

F = onnx.TensorProto.FLOAT


def _sgd(module: torch.nn.Module, loss_of, steps: int = 1, lr: float = 1e-4) -> None:
    optimizer = torch.optim.SGD(module.parameters(), lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        loss_of(module).backward()
        optimizer.step()


def _buffers(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.named_buffers()}


def _masked_model(zero_as_constant_node: bool = False, weight_as_constant_node: bool = False):
    """As tf2onnx writes a masked layer: one ``0.0`` for the comparison that makes the mask
    and for the arithmetic, ``y = where(x < 0, 0, x @ W + 0)``."""
    weight = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    nodes = [
        oh.make_node("MatMul", ["x", "W"], ["xw"]),
        oh.make_node("Add", ["xw", "zero"], ["shifted"]),
        oh.make_node("Slice", ["x", "starts", "ends", "axes"], ["first"]),
        oh.make_node("Less", ["first", "zero"], ["masked"]),
        oh.make_node("Where", ["masked", "zero", "shifted"], ["y"]),
    ]
    initializers = [
        onnx.numpy_helper.from_array(np.array([0], np.int64), "starts"),
        onnx.numpy_helper.from_array(np.array([1], np.int64), "ends"),
        onnx.numpy_helper.from_array(np.array([1], np.int64), "axes"),
    ]
    for name, value, as_node in (
        ("zero", np.array(0.0, np.float32), zero_as_constant_node),
        ("W", weight, weight_as_constant_node),
    ):
        tensor = onnx.numpy_helper.from_array(value, name)
        if as_node:
            nodes.insert(0, oh.make_node("Constant", [], [name], value=tensor))
        else:
            initializers.append(tensor)
    graph = oh.make_graph(
        nodes,
        "masked",
        [oh.make_tensor_value_info("x", F, ["N", 3])],
        [oh.make_tensor_value_info("y", F, ["N", 4])],
        initializers,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]), weight


def _masked_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.where(x[:, :1] < 0, torch.zeros(()), x @ weight)


@pytest.mark.parametrize("as_node", [False, True], ids=["initializers", "constant-nodes"])
def test_a_zero_shared_by_a_mask_and_arithmetic_stays_zero_while_training(as_node: bool) -> None:
    model, weight = _masked_model(zero_as_constant_node=as_node, weight_as_constant_node=as_node)
    module = torchscan.onnx.to_torch(model)
    assert sorted(module.onnx_names.values()) == ["W", "axes", "ends", "starts", "zero"]
    assert [module.onnx_names[n] for n, _ in module.named_parameters()] == ["W"]
    x = torch.tensor([[-1.0, 2.0, 3.0], [1.0, -2.0, 0.5]])
    torch.testing.assert_close(module(x), _masked_reference(x, torch.from_numpy(weight)))
    _sgd(module, lambda m: m(x).square().sum(), steps=3, lr=0.1)
    trained = module.get_parameter(next(n for n, _ in module.named_parameters()))
    assert not torch.equal(trained, torch.from_numpy(weight))  # the weight trained
    # what the model means is unchanged: the masked row is still exactly zero
    torch.testing.assert_close(module(x), _masked_reference(x, trained.detach()))
    assert torch.equal(module(x)[0], torch.zeros(4))


def test_every_floating_tensor_trains_with_trainable_all_and_none_with_none() -> None:
    model, _ = _masked_model()
    everything = torchscan.onnx.to_torch(model, trainable="all")
    assert sorted(everything.onnx_names[n] for n, _ in everything.named_parameters()) == [
        "W",
        "zero",
    ]
    nothing = torchscan.onnx.to_torch(model, trainable="none")
    assert list(nothing.named_parameters()) == []
    named = torchscan.onnx.to_torch(model, trainable={"zero"})
    assert [named.onnx_names[n] for n, _ in named.named_parameters()] == ["zero"]
    chosen = torchscan.onnx.to_torch(model, trainable=lambda name, t: t.dim() == 2)
    assert [chosen.onnx_names[n] for n, _ in chosen.named_parameters()] == ["W"]
    # the weights held in Constant nodes, too
    held, _ = _masked_model(weight_as_constant_node=True)
    assert len(list(torchscan.onnx.to_torch(held, trainable="all").parameters())) == 2
    assert list(torchscan.onnx.to_torch(held, trainable="none").parameters()) == []


@pytest.mark.parametrize(
    ("trainable", "error", "message"),
    [
        ("some", ValueError, "trainable must be 'weights', 'all', 'none', .* but got 'some'"),
        ({"W", "nowhere"}, ValueError, r"trainable names \['nowhere'\], which are no floating"),
        ({"starts"}, ValueError, r"trainable names \['starts'\], which are no floating"),
        ([1], TypeError, r"trainable holds names of tensors \(str\), but it holds \['int'\]"),
        (3, TypeError, "trainable must be .* but got a int"),
    ],
)
def test_a_bad_trainable_is_refused_naming_what_came(trainable, error, message) -> None:
    model, _ = _masked_model()
    with pytest.raises(error, match=message):
        torchscan.onnx.to_torch(model, trainable=trainable)


class _Gated(torch.nn.Module):
    """A GRU-like update with ``1 - z`` and a square, as torch.onnx writes them: the ``1`` and
    the ``2.0`` are scalar initializers."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(3, 4)
        self.cand = torch.nn.Linear(3, 4)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        z = torch.sigmoid(self.gate(x))
        return (1 - z) * h + z * torch.tanh(self.cand(x)) ** 2


def test_torch_exports_one_minus_z_and_a_square_whose_constants_stay_while_training() -> None:
    torch.manual_seed(0)
    original = _Gated()
    x, h = torch.randn(5, 3), torch.randn(5, 4)
    model = onnx_export(original, (x, h), dynamo=True).model_proto
    module = torchscan.onnx.to_torch(model)
    names = sorted(module.onnx_names[n] for n, _ in module.named_parameters())
    assert names == sorted(n for n, _ in original.named_parameters())
    constants = _buffers(module)
    assert sorted(float(v) for v in constants.values()) == [1.0, 2.0]
    # ten steps on inputs where the square's base is negative: with the exponent a parameter,
    # its gradient (log of a negative number) made every output NaN after one step
    negative = torch.full((5, 3), -3.0)
    _sgd(module, lambda m: m(negative, h).sum(), steps=10, lr=1e-2)
    _sgd(original, lambda m: m(negative, h).sum(), steps=10, lr=1e-2)
    assert dict(module.named_buffers()).keys() == constants.keys()
    for key, value in module.named_buffers():
        assert torch.equal(value, constants[key])
    # the same training as the module it came from
    torch.testing.assert_close(module(x, h), original(x, h))
    assert bool(torch.isfinite(module(negative, h)).all())


def test_an_attention_mask_and_an_embedding_table() -> None:
    """An additive mask of ``-inf`` on a product stays as it is; a table ``Gather`` reads rows
    of is a weight (an embedding)."""
    mask = np.triu(np.full((3, 3), -np.inf, np.float32), 1)
    table = np.arange(12, dtype=np.float32).reshape(6, 2)
    graph = oh.make_graph(
        [
            oh.make_node("Gather", ["table", "tokens"], ["e"]),  # (3, 2)
            oh.make_node("Transpose", ["e"], ["et"], perm=[1, 0]),
            oh.make_node("MatMul", ["e", "et"], ["scores"]),
            oh.make_node("Add", ["scores", "mask"], ["y"]),
        ],
        "attention",
        [oh.make_tensor_value_info("tokens", onnx.TensorProto.INT64, [3])],
        [oh.make_tensor_value_info("y", F, [3, 3])],
        [
            onnx.numpy_helper.from_array(mask, "mask"),
            onnx.numpy_helper.from_array(table, "table"),
        ],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    module = torchscan.onnx.to_torch(model)
    assert [module.onnx_names[n] for n, _ in module.named_parameters()] == ["table"]
    assert [module.onnx_names[n] for n, _ in module.named_buffers()] == ["mask"]
    tokens = torch.tensor([0, 5, 2])
    e = torch.from_numpy(table)[tokens]
    torch.testing.assert_close(module(tokens), e @ e.T + torch.from_numpy(mask))


@pytest.mark.parametrize("case", ["crf-loglik", "greedy-decode"])
def test_every_parameter_of_the_exported_module_trains_in_the_import(case: str) -> None:
    """A CRF's transitions (added to emissions, no product's weight) and a decoder's
    embedding and projections: every parameter of the module torch exported (by its name,
    which the export keeps here) is a weight of the import, and no constant of one element."""
    from ..zoo._harness import exported, module_of

    module = torchscan.onnx.to_torch(exported(case, 18))
    weights = {module.onnx_names[n]: p for n, p in module.named_parameters()}
    assert {n for n, _ in module_of(case).named_parameters()} <= weights.keys()
    assert all(p.numel() > 1 for p in weights.values())


def test_the_scales_of_a_quantized_weight_are_constants() -> None:
    """``x @ DequantizeLinear(W_q, scale per column)``: the per-channel scales and zero points
    are constants (training would move them off the integers they were chosen for)."""
    weight = np.array([[1, -2], [3, 4], [-5, 6]], np.int8)
    scale = np.array([0.5, 0.25], np.float32)
    graph = oh.make_graph(
        [
            oh.make_node("DequantizeLinear", ["W_q", "scale", "zero"], ["W"], axis=1),
            oh.make_node("MatMul", ["x", "W"], ["y"]),
        ],
        "g",
        [oh.make_tensor_value_info("x", F, [2, 3])],
        [oh.make_tensor_value_info("y", F, [2, 2])],
        [
            onnx.numpy_helper.from_array(weight, "W_q"),
            onnx.numpy_helper.from_array(scale, "scale"),
            onnx.numpy_helper.from_array(np.zeros(2, np.int8), "zero"),
        ],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    module = torchscan.onnx.to_torch(model)
    assert list(module.named_parameters()) == []
    assert {module.onnx_names[n] for n, _ in module.named_buffers()} == {"W_q", "scale", "zero"}
    x = torch.randn(2, 3)
    want = x @ (torch.from_numpy(weight).float() * torch.from_numpy(scale))
    torch.testing.assert_close(module(x), want)
