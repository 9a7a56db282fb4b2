"""``torchscan.theano`` lowers onto scan and loop, so Theano-style code exports too."""

from __future__ import annotations

import onnx
import pytest

from ._roundtrip import OPSETS, check_onnxruntime, check_reference, check_structure
from ._theano_models import CASES

NAMES = list(CASES)


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("name", NAMES)
def test_one_loop_node_per_scan(exported, name: str, opset: int) -> None:
    model = exported(f"theano:{name}", opset)
    check_structure(model, CASES[name], opset)
    onnx.checker.check_model(model, full_check=True)


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("name", NAMES)
def test_onnxruntime_equals_eager(exported, models, name: str, opset: int) -> None:
    check_onnxruntime(exported(f"theano:{name}", opset), models(f"theano:{name}"), CASES[name])


@pytest.mark.parametrize("opset", [o for o in OPSETS if o > 8])  # onnx.reference: no Scan-8
@pytest.mark.parametrize("name", [n for n in NAMES if CASES[n].reference])
def test_reference_evaluator_equals_eager(exported, models, name: str, opset: int) -> None:
    check_reference(exported(f"theano:{name}", opset), models(f"theano:{name}"), CASES[name])
