"""Export of torchscan's loops to ONNX, and tools to check exported loops.

Importing ``torchscan`` is all ``torch.onnx.export(model, args, dynamo=True, opset_version=v)``
needs to turn every ``torchscan.scan`` into one ONNX ``Scan`` node of the version in force at
``v``. This package holds the version table and the pieces torch.onnx calls.
"""

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

__all__ = ["LOOP_VERSIONS", "SCAN_VERSIONS", "OpVersion", "loop_version", "scan_version"]
