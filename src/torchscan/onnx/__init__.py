"""Export of torchscan's loops to ONNX, and tools to check exported loops.

Importing ``torchscan`` is all ``torch.onnx.export(model, args, dynamo=True, opset_version=v)``
needs to turn every ``torchscan.scan`` into one ONNX ``Scan`` node of the version in force at
``v``. This package holds the version table and the pieces torch.onnx calls.

What ``import torchscan`` changes in torch, unless the environment variable
``TORCHSCAN_PATCH_TORCH_ONNX`` is ``0`` (or ``false``, ``no``, ``off``) when it runs; all of it
is made by :func:`torchscan.onnx.install_export_hooks` and undone by
:func:`torchscan.onnx.uninstall_export_hooks`:

* ``torch.onnx.export`` is replaced (once torch.onnx is imported: at once where it is, else when
  it is) by a wrapper with its signature and docstring, which passes
  torchscan's translations in ``custom_translation_table`` (your entries win), records
  ``opset_version`` for the checks of element types, and raises torchscan's refusals as they
  are rather than wrapped in torch.onnx's errors;
* ``sys.meta_path`` gets a finder, first, that wraps ``torch.onnx.export`` once torch.onnx has been
  imported and installs the hooks below once torch.onnx's exporter
  (``torch.onnx._internal.exporter._core``) has been, then leaves; where a module is loaded
  already, what it needs is done at once;
* ``torch.onnx._internal.exporter._registration.ONNXRegistry.get_decomps`` answers torchscan's
  two operators where the registry has no custom translation of them (an export through a
  reference to ``torch.onnx.export`` kept from before the import);
* ``torch.onnx._internal.exporter._dispatching.dispatch`` refuses a node of a loop body that
  has no translation, naming the step function and its line;
* ``torch.onnx._internal.exporter._core.onnxscript_apis`` and
  ``torch.onnx._internal.exporter._onnx_program.onnxscript_apis`` get torchscan's
  ``convert_version`` and ``optimize``: in every export, with or without a torchscan loop,
  functions are inlined, every ``Scan`` and ``Loop`` is checked against the opset asked for and
  its loop-invariant work moved out (:func:`export_options`), a model asked below opset 18 is
  converted by torchscan, and a warning names the operators onnxruntime has no kernel for;
* the loggers ``torch.onnx._internal.exporter._compat`` and
  ``torch.onnx._internal.exporter._registration`` each get a filter that drops one warning: that a
  model asked below opset 18 may stay at opset 18, and that a translation of torchscan's takes no
  ONNX signature.

With the hooks off, a model with a torchscan loop exports with :func:`torchscan.onnx.export`, and
plain ``torch.onnx.export`` refuses it: torch.onnx's error holds (and shows) a
``torchscan.ExportError`` that says how to export it. Whatever the setting, ``import
torchscan`` registers two higher-order operators with torch,
``torch.ops.higher_order.torchscan_scan`` and ``torchscan_loop`` (new names, with their kernels
and fake kernels; nothing of torch's is replaced), which ``scan`` and ``loop`` call under
``torch.export``; it tells TorchDynamo to run one function of torchscan's own untraced when a
graph break makes it the root of a frame (``torch._dynamo.eval_frame.skip_code`` on the code of
``torchscan._compiled.first_step``: how ``torch.compile`` finds a step that breaks its graph);
and each loop traced (by ``torch.export``, or on fake tensors for the output shapes of a loop
that runs no step) adds the file and name of its step function to the frames torch keeps in the
stack traces of exported nodes (``torch.fx.proxy._register_stack_trace_anchor``).

This package needs the ``onnx`` extra (``pip install "torchscan-onnx[onnx]"``: onnx, onnx-ir,
onnxscript, onnxruntime, rich, ml_dtypes, protobuf); importing it without them raises an
``ImportError`` that names what is missing and that command. ``import torchscan`` needs none of
them. An export imports only what it uses: the check tool (``check`` and its report classes,
which need ``rich``) and the conversion below opset 18 (``OpsetConversionError``) are imported
when first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from torchscan._torch_onnx_hook import export as export
from torchscan._torch_onnx_hook import export_hooks_installed as export_hooks_installed
from torchscan._torch_onnx_hook import install_export_hooks as install_export_hooks
from torchscan._torch_onnx_hook import uninstall_export_hooks as uninstall_export_hooks
from torchscan.onnx import _extra as _extra  # says what to install where the extra is missing
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
    from torchscan.onnx._import import OnnxImportError as OnnxImportError
    from torchscan.onnx._import import OnnxModule as OnnxModule
    from torchscan.onnx._import import to_torch as to_torch

_LAZY = {
    "check": "torchscan.onnx._check._compare",
    "OpsetConversionError": "torchscan.onnx._convert",
    "OnnxImportError": "torchscan.onnx._import",
    "OnnxModule": "torchscan.onnx._import",
    "to_torch": "torchscan.onnx._import",
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
