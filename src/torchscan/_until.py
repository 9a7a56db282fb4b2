"""``torchscan.until``: the stop flag a step function returns last."""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class Until:
    """The stop flag a step function returns last: see :func:`until`."""

    stop: torch.Tensor | bool


def until(stop: torch.Tensor | bool) -> Until:
    """Mark ``stop`` as the flag that ends a loop after the current step.

    A ``loop`` body or a ``scan`` step function returns ``(carry, y, torchscan.until(stop))``:
    when ``stop`` (a 0-d bool tensor) is true, the step that computed it is the last one, and its
    carry and ``y`` are kept. Exported, the loop becomes an ONNX ``Loop`` whose body returns
    ``Not(stop)`` as its condition.
    """
    return Until(stop)
