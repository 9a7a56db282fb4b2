"""Export of torchscan's loops to ONNX, the check tool, and ONNX models imported as modules.

Importing ``torchscan`` is all ``torch.onnx.export(model, args, dynamo=True, opset_version=v)``
needs to turn every ``torchscan.scan`` into one ONNX ``Scan`` node of the version in force at
``v`` (docs/export.md); what the import changes in torch, and how to import it without those
changes, is listed there, under "What importing torchscan changes in torch". ``check`` is
``torchscan check`` (docs/check.md) and ``to_torch`` imports an ONNX model as a module
(docs/import.md).

This package needs the ``onnx`` extra (``pip install "torchscan-onnx[onnx]"``); importing it
without it raises an ``ImportError`` that names what is missing and that command. An export
imports only what it uses: the check tool, the importer and the conversion below opset 18 are
imported when first used (docs/architecture.md).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from torchscan._torch_onnx_hook import export as export
from torchscan._torch_onnx_hook import export_hooks_installed as export_hooks_installed
from torchscan._torch_onnx_hook import install_export_hooks as install_export_hooks
from torchscan._torch_onnx_hook import uninstall_export_hooks as uninstall_export_hooks
from torchscan.onnx import _extra as _extra  # says what to install where the extra is missing
from torchscan.onnx._export._hoist_bodies import hoist_loop_invariants as hoist_loop_invariants
from torchscan.onnx._export._options import ExportOptions as ExportOptions
from torchscan.onnx._export._options import export_options as export_options
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

if TYPE_CHECKING:
    from torchscan.onnx._check._compare import check as check
    from torchscan.onnx._export._convert import OpsetConversionError as OpsetConversionError
    from torchscan.onnx._import import OnnxImportError as OnnxImportError
    from torchscan.onnx._import import OnnxModule as OnnxModule
    from torchscan.onnx._import import to_torch as to_torch
    from torchscan.onnx._lint._report import CheckedNode as CheckedNode
    from torchscan.onnx._lint._report import CheckReport as CheckReport
    from torchscan.onnx._lint._report import Comparison as Comparison
    from torchscan.onnx._lint._report import Finding as Finding
    from torchscan.onnx._lint._report import OutputDiff as OutputDiff

_LAZY = {
    "check": "torchscan.onnx._check._compare",
    "OpsetConversionError": "torchscan.onnx._export._convert",
    "OnnxImportError": "torchscan.onnx._import",
    "OnnxModule": "torchscan.onnx._import",
    "to_torch": "torchscan.onnx._import",
    "CheckedNode": "torchscan.onnx._lint._report",
    "CheckReport": "torchscan.onnx._lint._report",
    "Comparison": "torchscan.onnx._lint._report",
    "Finding": "torchscan.onnx._lint._report",
    "OutputDiff": "torchscan.onnx._lint._report",
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
    "OnnxImportError",
    "OnnxModule",
    "OpVersion",
    "OpsetConversionError",
    "OutputDiff",
    "check",
    "export",
    "export_hooks_installed",
    "export_options",
    "hoist_loop_invariants",
    "install_export_hooks",
    "loop_version",
    "scan_version",
    "to_torch",
    "uninstall_export_hooks",
]
