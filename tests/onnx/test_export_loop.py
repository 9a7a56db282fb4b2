"""``torch.onnx.export`` of models that call ``torchscan.loop``, at every opset.

Each model is exported once per opset (see conftest) and checked for structure, against
``onnx.checker``, and against eager PyTorch in onnxruntime and onnx's reference evaluator on
inputs that run different numbers of iterations.
"""

from __future__ import annotations

import pytest
import torch

import torchscan
import torchscan.onnx

from .._export import onnx_export
from ._loop_models import CASES
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
from ._runtimes import assert_outputs_close, eager_outputs, nodes

NAMES = list(CASES)
PAIRS = opset_pairs(NAMES)


@pytest.mark.parametrize(("name", "opset"), PAIRS, ids=pair_ids(PAIRS))
def test_each_loop_is_one_loop_node(exported, name: str, opset: int) -> None:
    check_structure(exported(f"loop:{name}", opset), CASES[name], opset)


@pytest.mark.parametrize(("name", "opset"), PAIRS, ids=pair_ids(PAIRS))
def test_checker_accepts(exported, name: str, opset: int) -> None:
    check_valid(exported(f"loop:{name}", opset))


@pytest.mark.parametrize(("name", "opset"), PAIRS, ids=pair_ids(PAIRS))
def test_onnxruntime_equals_eager(exported, models, name: str, opset: int) -> None:
    check_onnxruntime(exported(f"loop:{name}", opset), models(f"loop:{name}"), CASES[name])


@pytest.mark.parametrize(("name", "opset"), PAIRS, ids=pair_ids(PAIRS))
def test_reference_evaluator_equals_eager(exported, models, name: str, opset: int) -> None:
    check_reference(exported(f"loop:{name}", opset), models(f"loop:{name}"), CASES[name])


IMPORT_PAIRS = imported_sample(PAIRS)


@pytest.mark.parametrize(("name", "opset"), IMPORT_PAIRS, ids=pair_ids(IMPORT_PAIRS))
def test_imported_module_equals_eager(exported, models, name: str, opset: int) -> None:
    """torchscan.onnx.to_torch of the export: the eager outputs and gradients."""
    check_imported(exported(f"loop:{name}", opset), models(f"loop:{name}"), CASES[name])


NOT_REEXPORTED = []
"""Models whose imported module torch.export cannot trace: a body or branch reads sizes or
positions from values computed from the data (a Slice at the loop's iteration number), which the
module computes eagerly only."""


@pytest.mark.parametrize("name", reexported_sample(NAMES, NOT_REEXPORTED))
def test_imported_module_exports_again_as_the_same_loops(exported, models, name: str) -> None:
    """The imported module, exported again at the same opset, has the same Scan and Loop nodes,
    and onnxruntime computes the eager outputs with it; or torch.export refuses it."""
    model = exported(f"loop:{name}", REEXPORT_OPSET)
    refused = name in NOT_REEXPORTED
    check_reexported(model, models(f"loop:{name}"), CASES[name], REEXPORT_OPSET, refused)


@pytest.mark.parametrize("opset", [o for n, o in PAIRS if n == "for-shifted"])
def test_an_imported_loop_that_runs_no_iteration_computes_eager(
    exported, models, opset: int
) -> None:
    """At length 1 the Loop of "for-shifted" runs no iteration: its body's first iteration
    would read past the end of the sequence, and its body declares no static shapes, so the
    shapes of its empty outputs come from the body run on fake tensors, where its Reshape reads
    a constant of the main graph (known in Python). It computes the eager outputs at every
    length."""
    name = "loop:for-shifted"
    model, eager, case = exported(name, opset), models(name), CASES["for-shifted"]
    module = torchscan.onnx.to_torch(model)
    for length in (1, 2, 6):
        inputs = case.inputs(length)
        with torch.no_grad():
            got = module(*inputs)
        got = [got] if isinstance(got, torch.Tensor) else list(got)
        assert_outputs_close([g.numpy() for g in got], eager_outputs(eager, inputs), model)


class Repeat(torch.nn.Module):
    def __init__(self, trips: int) -> None:
        super().__init__()
        self.trips = trips
        self.cell = torch.nn.RNNCell(3, 3)

    def forward(self, h):
        return torchscan.loop(lambda i, h: (self.cell(h, h), h), h, trip_count=self.trips)


@pytest.mark.parametrize("opset", [18, 25])
def test_graph_does_not_grow_with_the_trip_count(opset: int) -> None:
    sizes, counts = [], []
    for trips in (2, 40):
        proto = onnx_export(Repeat(trips), (torch.zeros(1, 3),), opset_version=opset).model_proto
        counts.append(sum(1 for _ in nodes(proto.graph)))
        sizes.append(proto.ByteSize())
    assert counts[0] == counts[1]
    assert abs(sizes[0] - sizes[1]) < 16
