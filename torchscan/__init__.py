"""Loops written once in PyTorch that run at eager speed and export to ONNX Scan and Loop."""

from torchscan._scan import scan as scan

__all__ = ["scan"]
__version__ = "0.1.0"
