"""QRNN's forget-mult (salesforce/pytorch-qrnn ``CPUForgetMult``), as indexing ``fx[i]`` and as
the original's ``split(1)`` slices; the oracle is the Python loop of the original."""

from ._harness import *  # noqa: F403

NAMES = ["qrnn-forget-mult", "qrnn-forget-mult-split"]
