"""``torch.onnx.export`` as the tests call it: for inference, without torch.onnx's log, and with
warnings left to the project's filters (``pyproject.toml``), which turn them into errors, but for
the two that torch.onnx gives about the test models' dynamic shapes."""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch

DYNAMIC_SHAPE_NAMING = [
    # Several inputs share one torch.export.Dim: torch.onnx names the axis once.
    r"# The axis name: .* will not be used, since it shares the same shape constraints",
    # torch.export dropped an input the graph never reads: torch.onnx keeps its default names.
    r"# ONNX model has different number of inputs than the flatten dynamic_shapes",
]


def onnx_export(model: Any, args: tuple, **kwargs: Any) -> Any:
    """``torch.onnx.export(model.eval(), args, verbose=False, **kwargs)``."""
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    if isinstance(model, torch.nn.Module):
        model.eval()
    kwargs.setdefault("verbose", False)
    with warnings.catch_warnings():
        for message in DYNAMIC_SHAPE_NAMING:
            warnings.filterwarnings("ignore", message=message, category=UserWarning)
        return torch.onnx.export(model, args, **kwargs)
