"""Diffusion samplers: DDPM (improved-diffusion's ``p_sample_loop``, a reverse scan over the
timestep table, with the noise given or drawn in the step) and DDIM (diffusers'
``DDIMScheduler`` in the pipeline loop); the oracle is the Python loop."""

import onnxruntime
import pytest
import torch

from ..onnx._runtimes import run_onnxruntime_on
from ._cases import CASES
from ._harness import *  # noqa: F403
from ._harness import exported, feeds, module_of, warned

NAMES = ["ddpm-sample", "ddpm-sample-randn", "ddim-sample"]

OUTSIDE_TORCHSCAN = {
    # onnxruntime 1.32 has no kernel for the random operators of opset 22 on.
    ("ddpm-sample-randn", 25, "test_onnxruntime_matches_eager"): "RandomNormalLike-22",
}


@pytest.mark.parametrize("opset", [18, 21])
def test_noise_drawn_in_the_step_exports_without_a_warning_up_to_opset_21(opset: int) -> None:
    assert warned("ddpm-sample-randn", opset) == []


def test_noise_drawn_in_the_step_at_opset_25_is_named_at_export_and_refused_by_onnxruntime():
    """The user learns at export what onnxruntime will say when it loads the model."""
    (message,) = warned("ddpm-sample-randn", 25)
    assert message.startswith("torch.onnx.export: the model holds RandomNormalLike-22 (node ")
    assert message.endswith(
        "at opset 25, and onnxruntime 1.32 has no kernel for it: it refuses to run the model "
        "(NOT_IMPLEMENTED). To run it in onnxruntime 1.32, export with opset_version=21 or lower."
    )
    case, model = CASES["ddpm-sample-randn"], exported("ddpm-sample-randn", 25)
    inputs = feeds(module_of("ddpm-sample-randn"), model, case.inputs(2))
    not_implemented = onnxruntime.capi.onnxruntime_pybind11_state.NotImplemented
    with pytest.raises(not_implemented, match=r"implementation for RandomNormalLike\(22\)"):
        run_onnxruntime_on(model, inputs)
    assert torch.isfinite(module_of("ddpm-sample-randn")(*case.inputs(2))).all()
