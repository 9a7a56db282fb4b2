"""One export per model and opset for the whole session."""

from __future__ import annotations

import onnx
import pytest
import torch

from .._export import onnx_export
from ._loop_models import CASES as LOOP_CASES
from ._models import CASES as SCAN_CASES
from ._theano_models import CASES as THEANO_CASES

CASES = {
    **SCAN_CASES,
    **{f"loop:{name}": case for name, case in LOOP_CASES.items()},
    **{f"theano:{name}": case for name, case in THEANO_CASES.items()},
}

collect_ignore = ["data"]  # fixtures and the scripts that made them (another environment's)

_models: dict[str, torch.nn.Module] = {}
_exports: dict[tuple[str, int], onnx.ModelProto | Exception] = {}


def model_of(name: str) -> torch.nn.Module:
    if name not in _models:
        torch.manual_seed(0)
        _models[name] = CASES[name].make().eval()
    return _models[name]


def export(name: str, opset: int) -> onnx.ModelProto:
    """``torch.onnx.export`` of case ``name`` at ``opset``, done once per session."""
    key = (name, opset)
    if key not in _exports:
        case = CASES[name]
        try:
            program = onnx_export(
                model_of(name),
                case.inputs(case.export_length),
                dynamo=True,
                opset_version=opset,
                dynamic_shapes=case.dynamic_shapes(),
            )
            _exports[key] = program.model_proto
        except Exception as error:  # re-raised in every test that needs this export
            _exports[key] = error
    result = _exports[key]
    if isinstance(result, Exception):
        raise result
    return result


@pytest.fixture(scope="session")
def exported():
    return export


@pytest.fixture(scope="session")
def models():
    return model_of
