"""Loops written once in PyTorch that run at eager speed and export to ONNX Scan and Loop."""

from torchscan import _torch_onnx_hook
from torchscan._autoloop import LoopReport as LoopReport
from torchscan._autoloop import autoloop as autoloop
from torchscan._autoloop import autoloop_report as autoloop_report
from torchscan._autoloop import autoloop_source as autoloop_source
from torchscan._checkpoint import Checkpoint as Checkpoint
from torchscan._errors import ExportError as ExportError
from torchscan._errors import HoistWarning as HoistWarning
from torchscan._errors import TorchscanError as TorchscanError
from torchscan._errors import TorchscanTypeError as TorchscanTypeError
from torchscan._errors import TorchscanValueError as TorchscanValueError
from torchscan._errors import TorchscanWarning as TorchscanWarning
from torchscan._loop import loop as loop
from torchscan._lowering import lower_to_torch as lower_to_torch
from torchscan._scan import scan as scan
from torchscan._steps import Until as Until
from torchscan._steps import until as until

__all__ = [
    "Checkpoint",
    "ExportError",
    "HoistWarning",
    "LoopReport",
    "TorchscanError",
    "TorchscanTypeError",
    "TorchscanValueError",
    "TorchscanWarning",
    "Until",
    "autoloop",
    "autoloop_report",
    "autoloop_source",
    "loop",
    "lower_to_torch",
    "scan",
    "until",
]
__version__ = "0.1.0"

# Wraps torch.onnx.export and hooks into torch.onnx's exporter, unless
# TORCHSCAN_PATCH_TORCH_ONNX=0: see torchscan.onnx.install_export_hooks and docs/export.md.
_torch_onnx_hook.install_at_import()
