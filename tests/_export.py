"""``torch.onnx.export`` as the tests call it: for inference, without torch.onnx's log, and with
warnings left to the project's filters (``pyproject.toml``), which turn them into errors, but for
the two that torch.onnx gives about the test models' dynamic shapes.

:func:`share_torch_onnx_registry` (called by ``tests/conftest.py``) has torch.onnx build its
registry of translations once per opset in a test process instead of at every export: half of
an export's time, which makes the suite's hundreds of exports fit its time budget."""

from __future__ import annotations

import functools
import inspect
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


def share_torch_onnx_registry() -> bool:
    """Have ``ONNXRegistry.from_torchlib`` (which every ``torch.onnx.export`` calls, and which
    reads the source of every torchlib function) build each opset's registry once, and return
    a copy of it at every later call: its lists of translations are copied, so that what an
    export registers (``custom_translation_table``, torchscan's translations) stays in that
    export's registry. Whether it could: nothing is changed where torch's registry is not as
    expected (another torch release), and the exports take their usual time."""
    try:
        from torch.onnx._internal.exporter import _registration
    except ImportError:
        return False
    registry_class = getattr(_registration, "ONNXRegistry", None)
    build = getattr(registry_class, "from_torchlib", None)
    if build is None or list(inspect.signature(build).parameters) != ["opset_version"]:
        return False
    if getattr(build, "__shared__", False):
        return True
    original = build.__func__
    default = inspect.signature(build).parameters["opset_version"].default

    @functools.cache
    def template(cls: type, opset_version: int) -> Any:
        return original(cls, opset_version)

    def from_torchlib(cls: type, opset_version: int = default) -> Any:
        shared = template(cls, opset_version)
        registry = cls()
        registry._opset_version = shared._opset_version
        registry.functions = {target: list(metas) for target, metas in shared.functions.items()}
        return registry

    from_torchlib.__shared__ = True  # type: ignore[attr-defined]
    registry_class.from_torchlib = classmethod(from_torchlib)
    return True
