"""``torch.onnx.export`` of models that call ``torchscan.scan``, at every opset.

Each model is exported once per opset (see conftest) and checked for structure, against
``onnx.checker``, and against eager PyTorch in onnxruntime and onnx's reference evaluator at
sequence lengths other than the one it was exported with.
"""

from __future__ import annotations

import pytest
import torch

import torchscan

from .._export import onnx_export
from ._models import CASES
from ._roundtrip import (
    REEXPORT_OPSET,
    check_imported,
    check_onnxruntime,
    check_reexported,
    check_reference,
    check_structure,
    check_valid,
    imported_sample,
    opset_pairs,
    pair_ids,
    reexported_sample,
)
from ._runtimes import assert_outputs_close, eager_outputs, nodes, run_onnxruntime, run_reference

NAMES = list(CASES)
PAIRS = opset_pairs(NAMES)


@pytest.mark.parametrize(("name", "opset"), PAIRS, ids=pair_ids(PAIRS))
def test_each_scan_is_one_scan_node(exported, name: str, opset: int) -> None:
    check_structure(exported(name, opset), CASES[name], opset)


@pytest.mark.parametrize(("name", "opset"), PAIRS, ids=pair_ids(PAIRS))
def test_checker_accepts(exported, name: str, opset: int) -> None:
    check_valid(exported(name, opset))


@pytest.mark.parametrize(("name", "opset"), PAIRS, ids=pair_ids(PAIRS))
def test_onnxruntime_equals_eager(exported, models, name: str, opset: int) -> None:
    check_onnxruntime(exported(name, opset), models(name), CASES[name])


@pytest.mark.parametrize(("name", "opset"), PAIRS, ids=pair_ids(PAIRS))
def test_reference_evaluator_equals_eager(exported, models, name: str, opset: int) -> None:
    check_reference(exported(name, opset), models(name), CASES[name])


IMPORT_PAIRS = imported_sample(PAIRS)


@pytest.mark.parametrize(("name", "opset"), IMPORT_PAIRS, ids=pair_ids(IMPORT_PAIRS))
def test_imported_module_equals_eager(exported, models, name: str, opset: int) -> None:
    """torchscan.onnx.to_torch of the export: the eager outputs and gradients."""
    check_imported(exported(name, opset), models(name), CASES[name])


NOT_REEXPORTED = [
    "shifted",
    "shifted-axis1-reverse",
    "shifted-fold",
    "until-inside-scan",
]
"""Models whose imported module torch.export cannot trace: a body or branch reads sizes or
positions from values computed from the data (a Slice at the loop's iteration number), which the
module computes eagerly only."""


@pytest.mark.parametrize("name", reexported_sample(NAMES, NOT_REEXPORTED))
def test_imported_module_exports_again_as_the_same_loops(exported, models, name: str) -> None:
    """The imported module, exported again at the same opset, has the same Scan and Loop nodes,
    and onnxruntime computes the eager outputs with it; or torch.export refuses it."""
    model = exported(name, REEXPORT_OPSET)
    refused = name in NOT_REEXPORTED
    check_reexported(model, models(name), CASES[name], REEXPORT_OPSET, refused)


class StaticElman(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = torch.nn.RNNCell(3, 4)

    def forward(self, xs, h):
        return torchscan.scan(lambda h, x: (self.cell(x, h), self.cell(x, h)), h, xs)


@pytest.mark.parametrize("opset", [18, 25])
def test_graph_does_not_grow_with_the_sequence_length(opset: int) -> None:
    """Exported with static shapes at two lengths: the same nodes, the same size."""
    model = StaticElman().eval()
    sizes, counts = [], []
    for length in (2, 40):
        args = (torch.randn(length, 2, 3), torch.zeros(2, 4))
        proto = onnx_export(model, args, opset_version=opset).model_proto
        counts.append(sum(1 for _ in nodes(proto.graph)))
        sizes.append(proto.ByteSize())
    assert counts[0] == counts[1]
    assert abs(sizes[0] - sizes[1]) < 16  # the length appears in a few shapes


@pytest.mark.parametrize("opset", [18, 25])
def test_captured_parameters_stay_in_the_outer_graph(exported, opset: int) -> None:
    model = exported("captured", opset)
    outer = {init.name for init in model.graph.initializer}
    scan = next(node for node, depth in nodes(model.graph) if node.op_type == "Scan")
    body = scan.attribute[0].g
    assert not body.initializer
    assert not [node for node, _ in nodes(body) if node.op_type == "Constant"]
    read_from_outside = {name for node, _ in nodes(body) for name in node.input} & outer
    # the weight and the scale buffer; `bias`, computed outside from the weight, is a value
    assert len(read_from_outside) >= 2


@pytest.mark.parametrize("opset", [9, 18])
def test_only_a_scan_that_may_run_no_step_is_guarded(exported, opset: int) -> None:
    """onnxruntime cannot run a Scan of length 0: a Scan whose length the exported program lets
    reach 0 (``xs[1:]`` with ``T >= 1``, or ``T >= 0``) runs behind an ``If`` on the length; one
    whose length is at least 1 is left as it is, with no cost at run time."""

    def top_level_ops(name: str) -> list[str]:
        return [node.op_type for node in exported(name, opset).graph.node]

    assert "If" not in top_level_ops("elman")
    for name in ("shifted", "shifted-axis1-reverse", "may-be-empty"):
        assert top_level_ops(name).count("If") == 2, name


class CondOverClosures(torch.nn.Module):
    """torch.cond in the step, whose branches read a parameter and a value of the outer graph."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.rand(2))

    def forward(self, xs, h):
        v = h * 3

        def step(c, x):
            c = torch.cond(x.sum() > 0, lambda: c + x * self.w, lambda: c - self.w * v)
            return c, c

        return torchscan.scan(step, h, xs)


class ComplexCarry(torch.nn.Module):
    """An LRU-like step, h = lambda * h + x on complex tensors, which torch.onnx translates."""

    def forward(self, xs, h):
        lam = torch.complex(h, h * 0.5)
        zeros = torch.zeros_like(h)
        carry, ys = torchscan.scan(
            lambda c, x: (lam * c + x, torch.view_as_real(lam * c + x)),
            torch.complex(zeros, zeros),
            torch.complex(xs, torch.zeros_like(xs)),
        )
        return torch.view_as_real(carry), ys


@pytest.mark.parametrize("model", [CondOverClosures, ComplexCarry], ids=["cond", "complex"])
def test_steps_torch_onnx_translates_export(model) -> None:
    torch.manual_seed(0)
    eager = model().eval()
    time = torch.export.Dim("T", min=1)
    args = (torch.randn(5, 2), torch.rand(2))
    program = onnx_export(
        eager, args, opset_version=18, dynamic_shapes=({0: time}, None)
    ).model_proto
    assert [node.op_type for node in program.graph.node].count("Scan") == 1
    for length in (1, 5, 8):
        inputs = (torch.randn(length, 2), torch.rand(2))
        assert_outputs_close(
            run_onnxruntime(program, inputs), eager_outputs(eager, inputs), program
        )


class ViewOfXReshapedInPlace(torch.nn.Module):
    """xLSTM's ``q.squeeze_(2).unsqueeze(-1)`` on a view of the step's own slice of xs: no
    argument changes (kept out of the shared models, whose gradients are taken with respect to
    leaves, where torch refuses this idiom in the Python loop too)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, xs, h):
        def step(c, x):
            q = x.unsqueeze(2)
            q = q.squeeze_(2).unsqueeze(-1)
            c = torch.tanh(self.proj(c) + q.squeeze(-1))
            return c, q.sum(-1)

        return torchscan.scan(step, h, xs)


@pytest.mark.parametrize("opset", [8, 18, 25])
def test_a_view_of_x_reshaped_in_place_exports_with_the_python_loops_results(opset: int) -> None:
    model = ViewOfXReshapedInPlace().eval()
    args = (torch.randn(3, 2, 4), torch.randn(2, 4))
    dynamic = ({0: torch.export.Dim("T")}, None)
    exported = onnx_export(model, args, opset_version=opset, dynamic_shapes=dynamic).model_proto
    assert [node.op_type for node, _ in nodes(exported.graph)].count("Scan") == 1
    inputs = (torch.randn(7, 2, 4), torch.randn(2, 4))  # another length than the exported one
    want = eager_outputs(model, inputs)
    assert_outputs_close(run_onnxruntime(exported, inputs), want, exported)
    if opset > 8:  # onnx's reference evaluator does not run Scan-8
        assert_outputs_close(run_reference(exported, inputs), want, exported)
