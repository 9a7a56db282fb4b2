"""Transformer-XL's segment loop: attention over ``cat([mems, h])`` with the memory mask, and
the memory update under ``no_grad``; the oracle is the Python loop."""

from ._harness import *  # noqa: F403

NAMES = ["transformer-xl-mems"]
