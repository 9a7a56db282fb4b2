"""What ``torchscan.onnx`` needs of the ``onnx`` extra: imported first by the package, it raises
an ``ImportError`` naming the missing distributions and the command that installs them."""

from __future__ import annotations

import importlib.util

_EXTRA = {
    "onnx": "onnx",
    "onnx_ir": "onnx-ir",
    "onnxscript": "onnxscript",
    "onnxruntime": "onnxruntime",
    "rich": "rich",
    "ml_dtypes": "ml_dtypes",
    "google.protobuf": "protobuf",
}
"""The modules of the ``onnx`` extra, and the distributions that hold them."""


def _missing_distributions() -> list[str]:
    missing = []
    for module, distribution in _EXTRA.items():
        try:
            found = importlib.util.find_spec(module)
        except ModuleNotFoundError:  # google, the parent of google.protobuf, is missing
            found = None
        if found is None:
            missing.append(distribution)
    return missing


if _missing := _missing_distributions():
    raise ImportError(
        "torchscan.onnx (the ONNX export, import and check of torchscan's loops) needs "
        + (" and ".join(_missing) if len(_missing) < 3 else ", ".join(_missing))
        + f", which {'is' if len(_missing) == 1 else 'are'} not installed. "
        'Install them with: python -m pip install "torchscan-onnx[onnx]"',
        name="torchscan.onnx",
    )
