"""What Theano's step function returns, read for :func:`torchscan.theano.scan`: its outputs (a
tensor, or a list or tuple of them), perhaps updates (refused: PyTorch has no shared variables)
and perhaps ``until`` last, with the description of a wrong return used in messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from torchscan import _checks
from torchscan._errors import TorchscanTypeError, TorchscanValueError
from torchscan._steps import Until
from torchscan.theano._args import _API


def _split_result(result: Any, n_outputs: int | None) -> tuple[list[torch.Tensor], Until | None]:
    """Theano's step results: outputs (a tensor, or a list or tuple of them), perhaps updates,
    perhaps ``until`` last."""
    parts = list(result) if isinstance(result, tuple) else [result]
    stop = parts.pop() if parts and isinstance(parts[-1], Until) else None
    if any(isinstance(p, Until) for p in parts) or any(
        isinstance(o, Until) for p in parts if isinstance(p, list) for o in p
    ):
        raise TorchscanValueError(
            f"{_API}: until(stop) must be the last thing fn returns, after its outputs: return "
            f"(outputs, theano.until(stop)), but fn returned {_describe_returned(result)}."
        )
    updates = [p for p in parts if isinstance(p, Mapping) or _is_update_list(p)]
    if any(updates):  # an empty dict of updates updates nothing
        raise TorchscanTypeError(
            f"{_API}: fn returned updates, but PyTorch has no shared variables to update. Keep "
            "that state in outputs_info and return its new value as an output."
        )
    parts = [p for p in parts if not (isinstance(p, Mapping) or _is_update_list(p))]
    returned = parts[0] if len(parts) == 1 and isinstance(parts[0], list) else parts
    outputs: list[Any] = list(returned) if isinstance(returned, (list, tuple)) else [returned]
    if n_outputs is not None and len(outputs) != n_outputs:
        raise TorchscanValueError(
            f"{_API}: fn returned {len(outputs)} outputs, but outputs_info describes "
            f"{n_outputs}; give one entry per output (None for an output that is not fed back)."
        )
    if stop is not None and isinstance(stop.stop, (bool, np.bool_)):
        stop = Until(torch.tensor(bool(stop.stop)))  # Theano's until takes Python booleans
    return outputs, stop


def _is_update_list(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(v, tuple) and len(v) == 2 for v in value)
    )


def _describe_returned(result: Any) -> str:
    def kind(value: Any) -> str:
        if isinstance(value, Until):
            return "until(...)"
        if isinstance(value, torch.Tensor):
            return "a tensor"
        if isinstance(value, list):
            return "[" + ", ".join(kind(v) for v in value) + "]"
        return _checks.describe(value)

    if isinstance(result, tuple):
        return "(" + ", ".join(kind(v) for v in result) + ")"
    return kind(result)
