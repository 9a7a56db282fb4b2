"""Export of torchscan's loops to ONNX, and tools to check exported loops.

Importing ``torchscan`` is all ``torch.onnx.export(model, args, dynamo=True, opset_version=v)``
needs to turn every ``torchscan.scan`` into one ONNX ``Scan`` node of the version in force at
``v``. This package holds the version table and the pieces torch.onnx calls.

An export imports only what it uses: the check tool (``check`` and its report classes, which need
``rich``) and the conversion below opset 18 (``OpsetConversionError``) are imported when first
used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from torchscan.onnx._check._compare import check as check
    from torchscan.onnx._check._report import CheckedNode as CheckedNode
    from torchscan.onnx._check._report import CheckReport as CheckReport
    from torchscan.onnx._check._report import Comparison as Comparison
    from torchscan.onnx._check._report import Finding as Finding
    from torchscan.onnx._check._report import OutputDiff as OutputDiff
    from torchscan.onnx._convert import OpsetConversionError as OpsetConversionError

_LAZY = {
    "check": "torchscan.onnx._check._compare",
    "OpsetConversionError": "torchscan.onnx._convert",
    "CheckedNode": "torchscan.onnx._check._report",
    "CheckReport": "torchscan.onnx._check._report",
    "Comparison": "torchscan.onnx._check._report",
    "Finding": "torchscan.onnx._check._report",
    "OutputDiff": "torchscan.onnx._check._report",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "LOOP_VERSIONS",
    "SCAN_VERSIONS",
    "CheckReport",
    "CheckedNode",
    "Comparison",
    "ExportOptions",
    "Finding",
    "OpVersion",
    "OpsetConversionError",
    "OutputDiff",
    "check",
    "export_options",
    "hoist_loop_invariants",
    "loop_version",
    "scan_version",
]
