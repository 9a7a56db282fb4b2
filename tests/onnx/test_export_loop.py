"""``torch.onnx.export`` of models that call ``torchscan.loop``, at every opset.

Each model is exported once per opset (see conftest) and checked for structure, against
``onnx.checker``, and against eager PyTorch in onnxruntime and onnx's reference evaluator on
inputs that run different numbers of iterations.
"""

from __future__ import annotations

import pytest
import torch

import torchscan

from .._export import onnx_export
from ._loop_models import CASES
from ._roundtrip import (
    check_onnxruntime,
    check_reference,
    check_structure,
    check_valid,
    opset_pairs,
    pair_ids,
)
from ._runtimes import nodes

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
