"""``torchscan.theano`` lowers onto scan and loop, so Theano-style code exports too."""

from __future__ import annotations

import onnxruntime as ort
import pytest
import torch

from ._roundtrip import (
    OPSETS,
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
from ._runtimes import assert_outputs_close, eager_outputs, run_onnxruntime
from ._theano_models import CASES

NAMES = list(CASES)
PAIRS = opset_pairs(NAMES)


@pytest.mark.parametrize(("name", "opset"), PAIRS, ids=pair_ids(PAIRS))
def test_one_loop_node_per_scan(exported, name: str, opset: int) -> None:
    model = exported(f"theano:{name}", opset)
    check_structure(model, CASES[name], opset)
    check_valid(model)


@pytest.mark.parametrize(("name", "opset"), PAIRS, ids=pair_ids(PAIRS))
def test_onnxruntime_equals_eager(exported, models, name: str, opset: int) -> None:
    check_onnxruntime(exported(f"theano:{name}", opset), models(f"theano:{name}"), CASES[name])


@pytest.mark.parametrize(("name", "opset"), PAIRS, ids=pair_ids(PAIRS))
def test_reference_evaluator_equals_eager(exported, models, name: str, opset: int) -> None:
    check_reference(exported(f"theano:{name}", opset), models(f"theano:{name}"), CASES[name])


IMPORT_PAIRS = imported_sample(PAIRS)


@pytest.mark.parametrize(("name", "opset"), IMPORT_PAIRS, ids=pair_ids(IMPORT_PAIRS))
def test_imported_module_equals_eager(exported, models, name: str, opset: int) -> None:
    """torchscan.onnx.to_torch of the export: the eager outputs and gradients."""
    check_imported(exported(f"theano:{name}", opset), models(f"theano:{name}"), CASES[name])


NOT_REEXPORTED = [
    "positive-taps",
    "taps-until",
    "tensor-n-steps",
    "tensor-n-steps-go-backwards",
]
"""Models whose imported module torch.export cannot trace: a body or branch reads sizes or
positions from values computed from the data (a Slice at the loop's iteration number), which the
module computes eagerly only."""


@pytest.mark.parametrize("name", reexported_sample(NAMES, NOT_REEXPORTED))
def test_imported_module_exports_again_as_the_same_loops(exported, models, name: str) -> None:
    """The imported module, exported again at the same opset, has the same Scan and Loop nodes,
    and onnxruntime computes the eager outputs with it; or torch.export refuses it."""
    model = exported(f"theano:{name}", REEXPORT_OPSET)
    refused = name in NOT_REEXPORTED
    check_reexported(model, models(f"theano:{name}"), CASES[name], REEXPORT_OPSET, refused)


@pytest.mark.parametrize("opset", [18, OPSETS[-1]])
@pytest.mark.parametrize("name", ["tensor-n-steps", "tensor-n-steps-go-backwards"])
@pytest.mark.parametrize("n_steps", [4, -4, 5, -5])
def test_tensor_n_steps_past_a_sequence_fails_at_run_time(
    exported, models, name: str, opset: int, n_steps: int
) -> None:
    """Eagerly such an n_steps is refused with a ValueError; exported, the value is known only
    when the model runs, and the runtime fails rather than read the wrong elements."""
    model = exported(f"theano:{name}", opset)
    u, h0, _ = CASES[name].inputs(3)  # 6 elements, taps [-1, 1]: 4 steps
    inputs = (u, h0, torch.tensor(n_steps))
    if abs(n_steps) <= 4:
        assert_outputs_close(
            run_onnxruntime(model, inputs), eager_outputs(models(f"theano:{name}"), inputs), model
        )
        return
    with pytest.raises(ValueError, match=r"n_steps=-?5, but not every sequence is long enough"):
        models(f"theano:{name}")(*inputs)
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidArgument, match="out of data"):
        run_onnxruntime(model, inputs)
