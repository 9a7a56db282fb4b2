"""A batched Kalman filter (filterpy's ``predict``/``update``, Joseph form) with missing
observations masked; the oracle is the Python loop."""

import pytest
import torch

from torchscan import ExportError

from ._cases import CASES
from ._harness import *  # noqa: F403
from ._harness import assert_close, exported, module_of, run, tensors

NAMES = ["kalman-scalar"]

# The filter with a matrix observation inverts S with torch.linalg.inv, as filterpy does: eager
# PyTorch runs it (and matches the oracle), but no ONNX operator inverts a matrix, and torch's
# error check on a singular S is a side effect torch.export cannot keep in a loop step.


def test_inverting_kalman_filter_runs_eagerly() -> None:
    case, module = CASES["kalman-inv"], module_of("kalman-inv")
    for length in case.run_lengths:
        inputs = case.inputs(length)
        with torch.no_grad():
            port, oracle = run(case, module, inputs), run(case, module, inputs, oracle=True)
        assert_close(tensors(port), tensors(oracle), case, f"kalman-inv at length {length}")


@pytest.mark.parametrize("opset", [9, 18, 25])
def test_inverting_kalman_filter_export_names_the_step_the_op_and_the_remedies(opset) -> None:
    with pytest.raises(ExportError) as refused:
        exported("kalman-inv", opset)
    message = str(refused.value)
    assert message.startswith("torchscan.scan: fn (KalmanFilter.forward.<locals>.step) calls ")
    assert "torch.linalg.inv at " in message
    assert "_cases.py:" in message
    assert "torch.onnx has no translation of torch.linalg.inv" in message
    assert "custom_translation_table={torch.ops.aten.linalg_inv.default:" in message
