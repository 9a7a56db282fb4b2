"""Export of torchscan's loops to ONNX, and tools to check exported loops.

Importing ``torchscan`` is all ``torch.onnx.export(model, args, dynamo=True, opset_version=v)``
needs to turn every ``torchscan.scan`` into one ONNX ``Scan`` node of the version in force at
``v``. This package holds the version table and the pieces torch.onnx calls.
"""

from torchscan.onnx._hoist import hoist_loop_invariants as hoist_loop_invariants
from torchscan.onnx._opsets import (
    LOOP_VERSIONS as LOOP_VERSIONS,
)
from torchscan.onnx._opsets import (
    SCAN_VERSIONS as SCAN_VERSIONS,
)
from torchscan.onnx._opsets import (
    OpVersion as OpVersion,
)
from torchscan.onnx._opsets import (
    loop_version as loop_version,
)
from torchscan.onnx._opsets import (
    scan_version as scan_version,
)
from torchscan.onnx._options import ExportOptions as ExportOptions
from torchscan.onnx._options import export_options as export_options

__all__ = [
    "LOOP_VERSIONS",
    "SCAN_VERSIONS",
    "ExportOptions",
    "OpVersion",
    "export_options",
    "hoist_loop_invariants",
    "loop_version",
    "scan_version",
]
