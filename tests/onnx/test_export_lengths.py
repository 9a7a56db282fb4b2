"""``torch.onnx.export`` of scans over padded batches (``lengths``) and of scans whose sequences
and outputs have directions and axes of their own (a bidirectional RNN as one scan), at every
opset: one Scan node per scan, directions and axes as its attributes, and onnxruntime and onnx's
reference evaluator against eager PyTorch, on random lengths."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import hypothesis
import onnx
import pytest
import torch
from hypothesis import strategies as st

import torchscan
from torchscan.onnx import OpsetConversionError

from .._export import onnx_export
from ._roundtrip import OPSETS, check_structure, check_valid, opset_pairs, pair_ids
from ._runtimes import (
    assert_outputs_close,
    eager_outputs,
    nodes,
    run_onnxruntime,
    run_reference,
)

F, H = 3, 4
Dim = torch.export.Dim


def _cells(kind: type, count: int) -> torch.nn.ModuleList:
    return torch.nn.ModuleList([kind(F, H) for _ in range(count)])


class BiLSTM(torch.nn.Module):
    """A bidirectional LSTM layer as one scan over ``(x, x)``: the backward cell reads the
    sequence from its end, and its outputs are prepended so that they line up with ``x``."""

    def __init__(self, batch_first: bool = False) -> None:
        super().__init__()
        self.cells = _cells(torch.nn.LSTMCell, 2)
        self.axis = 1 if batch_first else 0

    def forward(self, x, h0):
        def step(carry, xs):
            (f, b), (xf, xb) = carry, xs
            f, b = self.cells[0](xf, f), self.cells[1](xb, b)
            return (f, b), (f[0], b[0])

        ((hf, cf), (hb, cb)), (yf, yb) = torchscan.scan(
            step,
            ((h0, h0), (h0, h0)),
            (x, x),
            axis=self.axis,
            in_reverse=(False, True),
            out_reverse=(False, True),
        )
        return torch.cat([yf, yb], -1), hf, cf, hb, cb


class PaddedGRU(torch.nn.Module):
    """A GRU over a padded batch."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = torch.nn.GRUCell(F, H)

    def forward(self, x, h0, lengths):
        def step(h, x):
            h = self.cell(x, h)
            return h, h

        return torchscan.scan(step, h0, x, lengths=lengths)


class PaddedBiRNN(torch.nn.Module):
    """A bidirectional Elman RNN over a padded batch, batch first: one scan per direction, the
    backward one starting at each example's last valid position."""

    def __init__(self) -> None:
        super().__init__()
        self.cells = _cells(torch.nn.RNNCell, 2)

    def forward(self, x, h0, lengths):
        def steps(cell):
            def step(h, x):
                h = cell(x, h)
                return h, h

            return step

        hf, yf = torchscan.scan(steps(self.cells[0]), h0, x, axis=1, lengths=lengths)
        hb, yb = torchscan.scan(steps(self.cells[1]), h0, x, axis=1, lengths=lengths, reverse=True)
        return torch.cat([yf, yb], -1), hf, hb


@dataclasses.dataclass
class Case:
    make: Callable[[], torch.nn.Module]
    batch_first: bool
    padded: bool
    ops: dict[str, int] = dataclasses.field(default_factory=lambda: {"Scan": 1})

    def inputs(self, t: int, b: int, lengths: list[int] | None = None, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(*((b, t) if self.batch_first else (t, b)), F, generator=gen)
        h0 = torch.randn(b, H, generator=gen)
        if not self.padded:
            return (x, h0)
        if lengths is None:
            lengths = torch.randint(0, t + 1, (b,), generator=gen).tolist()
        return (x, h0, torch.tensor(lengths, dtype=torch.int64))

    def dynamic_shapes(self, opset: int):
        t = Dim("T", min=1)
        # Below opset 9 a masked step selects with Where's stand-in, which needs static shapes.
        b = Dim("B", min=1) if opset > 8 or not self.padded else None
        x = {0: b, 1: t} if self.batch_first else {0: t, 1: b}
        if b is None:
            x = {1: t} if self.batch_first else {0: t}
        h0 = {0: b} if b is not None else None
        return (x, h0, {0: b} if b is not None else None) if self.padded else (x, h0)

    def static_batch(self, opset: int) -> bool:
        return opset == 8 and self.padded


CASES = {
    "bilstm": Case(BiLSTM, batch_first=False, padded=False),
    "bilstm-batch-first": Case(lambda: BiLSTM(batch_first=True), batch_first=True, padded=False),
    "padded-gru": Case(PaddedGRU, batch_first=False, padded=True),
    "padded-birnn": Case(PaddedBiRNN, batch_first=True, padded=True, ops={"Scan": 2}),
}
EXPORT_B, EXPORT_T = 3, 4

_models: dict[str, torch.nn.Module] = {}
_exports: dict[tuple[str, int], onnx.ModelProto | Exception] = {}


def model(name: str) -> torch.nn.Module:
    if name not in _models:
        torch.manual_seed(0)
        _models[name] = CASES[name].make().eval()
    return _models[name]


def exported(name: str, opset: int) -> onnx.ModelProto:
    """Each case exported once per opset, with dynamic time and batch."""
    key = (name, opset)
    if key not in _exports:
        case = CASES[name]
        try:
            program = onnx_export(
                model(name),
                case.inputs(EXPORT_T, EXPORT_B),
                dynamo=True,
                opset_version=opset,
                dynamic_shapes=case.dynamic_shapes(opset),
            )
            _exports[key] = program.model_proto
        except Exception as error:  # re-raised in every test that needs this export
            _exports[key] = error
    result = _exports[key]
    if isinstance(result, Exception):
        raise result
    return result


def runs(case: Case, opset: int) -> list[tuple]:
    """Inputs of other lengths and batch sizes; lengths of 0 and of the whole padded axis."""
    b = EXPORT_B if case.static_batch(opset) else 5
    full_and_empty = [0, 6, 2, 6, 1][:b]
    return [
        case.inputs(6, b, full_and_empty if case.padded else None, seed=1),
        case.inputs(1, b, [1] * b if case.padded else None, seed=2),
        case.inputs(7, b, [0] * b if case.padded else None, seed=3),
    ]


NAMES = list(CASES)
PAIRS = opset_pairs(NAMES)
ABOVE_8 = [o for o in OPSETS if o > 8]
RANDOM_PAIRS = opset_pairs(["padded-gru", "padded-birnn"])
BILSTM_PAIRS = opset_pairs(["bilstm", "bilstm-batch-first"], ABOVE_8)


@pytest.mark.parametrize(("name", "opset"), PAIRS, ids=pair_ids(PAIRS))
def test_one_scan_node_per_scan(name: str, opset: int) -> None:
    check_structure(exported(name, opset), CASES[name], opset)  # type: ignore[arg-type]
    check_valid(exported(name, opset))


@pytest.mark.parametrize(("name", "opset"), PAIRS, ids=pair_ids(PAIRS))
def test_onnxruntime_equals_eager(name: str, opset: int) -> None:
    model_proto = exported(name, opset)
    for inputs in runs(CASES[name], opset):
        expected = eager_outputs(model(name), inputs)
        assert_outputs_close(run_onnxruntime(model_proto, inputs), expected, model_proto)


@pytest.mark.parametrize(("name", "opset"), PAIRS, ids=pair_ids(PAIRS))
def test_reference_evaluator_equals_eager(name: str, opset: int) -> None:
    model_proto = exported(name, opset)
    for inputs in runs(CASES[name], opset):
        expected = eager_outputs(model(name), inputs)
        assert_outputs_close(run_reference(model_proto, inputs), expected, model_proto)


@pytest.mark.parametrize(("name", "opset"), RANDOM_PAIRS, ids=pair_ids(RANDOM_PAIRS))
@hypothesis.settings(max_examples=8, deadline=None, derandomize=True)
@hypothesis.given(data=st.data())
def test_random_lengths_in_onnxruntime(name: str, opset: int, data) -> None:
    case = CASES[name]
    t = data.draw(st.integers(1, 9), label="T")
    b = EXPORT_B if case.static_batch(opset) else data.draw(st.integers(1, 6), label="B")
    lengths = data.draw(st.lists(st.integers(0, t), min_size=b, max_size=b), label="lengths")
    inputs = case.inputs(t, b, lengths, seed=t)
    model_proto = exported(name, opset)
    expected = eager_outputs(model(name), inputs)
    assert_outputs_close(run_onnxruntime(model_proto, inputs), expected, model_proto)


def _attributes(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _scans(model_proto: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [node for node, depth in nodes(model_proto.graph) if node.op_type == "Scan"]


@pytest.mark.parametrize(("name", "opset"), BILSTM_PAIRS, ids=pair_ids(BILSTM_PAIRS))
def test_bidirectional_layer_is_one_scan_with_directions(name: str, opset: int) -> None:
    """Directions and axes are the Scan's attributes: nothing reverses, slices or transposes
    the sequence around it."""
    model_proto = exported(name, opset)
    (scan,) = _scans(model_proto)
    attributes = _attributes(scan)
    # The input projections of both cells are computed before the Scan for the whole sequence,
    # each scanned in the direction its cell reads it.
    assert attributes["scan_input_directions"] == [0, 1]
    assert attributes["scan_output_directions"] == [0, 1]
    axis = 1 if CASES[name].batch_first else 0
    assert attributes["scan_input_axes"] == [axis, axis]
    assert attributes["scan_output_axes"] == [axis, axis]
    weights = {t.name for t in model_proto.graph.initializer}
    op_types = {  # (a weight's transpose stays a node, which onnxruntime folds)
        node.op_type
        for node, _ in nodes(model_proto.graph)
        if not (node.op_type == "Transpose" and node.input[0] in weights)
    }
    assert not {"Transpose", "Slice", "ReverseSequence", "Loop", "Gather"} & op_types


def test_bidirectional_layer_equals_torch_lstm() -> None:
    """The exported one-scan layer equals ``torch.nn.LSTM(bidirectional=True)``."""
    lstm = torch.nn.LSTM(F, H, bidirectional=True)
    layer = BiLSTM()
    with torch.no_grad():
        for cell, suffix in zip(layer.cells, ("", "_reverse"), strict=True):
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                getattr(cell, name).copy_(getattr(lstm, f"{name}_l0{suffix}"))
    x, h0 = CASES["bilstm"].inputs(6, 5, seed=4)
    y, (h_n, c_n) = lstm(x, (torch.stack([h0, h0]), torch.stack([h0, h0])))
    model_proto = onnx_export(
        layer, CASES["bilstm"].inputs(EXPORT_T, EXPORT_B), dynamo=True,
        dynamic_shapes=CASES["bilstm"].dynamic_shapes(18),
    ).model_proto  # fmt: skip
    expected = [t.detach().numpy() for t in (y, h_n[0], c_n[0], h_n[1], c_n[1])]
    assert_outputs_close(run_onnxruntime(model_proto, (x, h0)), expected, model_proto)


@pytest.mark.parametrize("opset", [o for _, o in opset_pairs(["padded-gru"], ABOVE_8)])
def test_padded_scan_masks_inside_the_scan(opset: int) -> None:
    """The validity of every step is one more sequence of the Scan; the body selects with it."""
    model_proto = exported("padded-gru", opset)
    (scan,) = _scans(model_proto)
    body = _attributes(scan)["body"]
    assert "Where" in {node.op_type for node in body.node}
    elem_types = [value.type.tensor_type.elem_type for value in body.input]
    assert elem_types.count(onnx.TensorProto.BOOL) == 1  # the validity of each step


def test_padded_scan_with_a_dynamic_batch_is_refused_at_opset_8() -> None:
    """Below opset 9, Where is computed from the static shape of its result."""
    case = CASES["padded-gru"]
    with pytest.raises(OpsetConversionError, match=r"Where .*needs a static batch size"):
        onnx_export(
            model("padded-gru"), case.inputs(EXPORT_T, EXPORT_B), dynamo=True,
            opset_version=8, dynamic_shapes=case.dynamic_shapes(9),
        )  # fmt: skip


@pytest.mark.parametrize("name", NAMES)
def test_torch_export_program_and_its_lowering_compute_and_train_as_eagerly(name: str) -> None:
    """``torch.export``'s program (torchscan's operator, trained as a loop) and
    ``torchscan.lower_to_torch`` of it (torch's scan: sequences flipped and moved to axis 0, one
    tensor given as several carries copied) against the eager model."""
    case = CASES[name]
    eager = model(name)
    program = torch.export.export(
        eager, case.inputs(EXPORT_T, EXPORT_B), dynamic_shapes=case.dynamic_shapes(18)
    )
    lowered = torchscan.lower_to_torch(program)
    inputs = runs(case, 18)[0]
    expected = eager(*inputs)
    torch.testing.assert_close(program.module()(*inputs), expected)
    torch.testing.assert_close(lowered.module()(*inputs), expected)

    def input_gradient(module: Callable) -> torch.Tensor:
        x = inputs[0].clone().requires_grad_()
        out = module(x, *inputs[1:])
        return torch.autograd.grad(sum((o * (k + 1)).sum() for k, o in enumerate(out)), x)[0]

    torch.testing.assert_close(input_gradient(program.module()), input_gradient(eager))
