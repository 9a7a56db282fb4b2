"""The loop ``scan`` and ``loop`` share: call the step function, check it, stop, stack.

Both public functions describe their step function the same way: it returns ``(carry, y)`` or
``(carry, y, torchscan.until(stop))``. This module holds that protocol, the eager loop that runs
it, and the checks, worded for the function that calls them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import torch

from torchscan import _checks, _outputs
from torchscan._errors import TorchscanTypeError, TorchscanValueError


@dataclasses.dataclass(frozen=True)
class Until:
    """The stop flag a step function returns last: see :func:`until`."""

    stop: Any


def until(stop: torch.Tensor) -> Until:
    """Mark ``stop`` as the flag that ends a loop after the current step.

    A ``loop`` body or a ``scan`` step function returns ``(carry, y, torchscan.until(stop))``:
    when ``stop`` (a 0-d bool tensor) is true, the step that computed it is the last one, and its
    carry and ``y`` are kept. Exported, the loop becomes an ONNX ``Loop`` whose body returns
    ``Not(stop)`` as its condition.
    """
    return Until(stop)


@dataclasses.dataclass(frozen=True)
class Protocol:
    """How one public function words the step protocol in its messages."""

    outputs: _outputs.Outputs
    step_name: str  # "step", "iteration"

    @property
    def api(self) -> str:
        return self.outputs.api

    @property
    def fn_name(self) -> str:
        return self.outputs.fn_name

    def has_until(self, out: Any, expected: bool | None = None) -> bool:
        """Whether ``out`` ends with ``until``; refuse anything but the two forms, and a change
        of form after the first step (``expected``)."""
        if not (
            isinstance(out, tuple) and (len(out) == 2 or (len(out) == 3 and type(out[2]) is Until))
        ):
            raise TorchscanTypeError(
                f"{self.api}: {self.fn_name} must return (carry, y) or "
                f"(carry, y, torchscan.until(stop)), but it returned {_describe_result(out)}."
            )
        has_until = len(out) == 3
        if expected is not None and has_until != expected:
            raise TorchscanTypeError(
                f"{self.api}: {self.fn_name} must return torchscan.until(stop) at every "
                f"{self.step_name} or at none, but it returned "
                f"{'it only in a later' if has_until else 'no until in a later'} "
                f"{self.step_name}."
            )
        return has_until

    def check_stop(self, stop: Any, index: int) -> torch.Tensor:
        if not (isinstance(stop, torch.Tensor) and stop.ndim == 0 and stop.dtype == torch.bool):
            raise TorchscanTypeError(
                f"{self.api}: until(stop) needs stop to be a 0-d bool tensor, but "
                f"{self.fn_name} returned {_checks.describe(stop)} in {self.step_name} {index}."
            )
        return stop

    def run(
        self,
        call: Callable[[Any, Any], Any],
        items: Iterable[Any],
        carry_type: _checks.CarryType,
        axis: int,
        refuse_without_until: str | None = None,
    ) -> tuple[Any, list[Any]]:
        """``carry, y = call(carry, item)`` for every item until a stop; the ``y`` of each step.

        The first step is checked in full; later steps can only differ from it through
        data-dependent Python in the step function, which the final carry check and the stacking
        of ``ys`` catch. ``refuse_without_until`` is the error to raise when the first step
        returns no ``until`` and nothing else would end the loop.
        """
        items = iter(items)
        out = call(carry_type.init, next(items))
        has_until = self.has_until(out)
        if refuse_without_until and not has_until:
            raise TorchscanValueError(refuse_without_until)
        carry, y = out[0], out[1]
        carry_type.check(carry, f" in its first {self.step_name}")
        self.outputs.check_first(y, axis)
        ys = [y]
        append = ys.append
        if not has_until:
            for item in items:
                out = call(carry, item)
                try:
                    carry, y = out
                except (TypeError, ValueError):
                    self.has_until(out, expected=False)
                    raise
                append(y)
        elif not self.check_stop(out[2].stop, 0):
            for item in items:
                out = call(carry, item)
                try:
                    carry, y, flag = out
                    stop = flag.stop
                except (TypeError, ValueError, AttributeError):
                    self.has_until(out, expected=True)
                    raise
                append(y)
                if self.check_stop(stop, len(ys) - 1):
                    break
        carry_type.check(carry, f" in a later {self.step_name}")
        return carry, ys

    def check_fake_result(self, out: Any, carry_type: _checks.CarryType, axis: int) -> Any:
        """Check what the step function returned on fake tensors; return its ``y``."""
        if self.has_until(out):
            self.check_stop(out[2].stop, 0)
        carry_type.check(out[0], "")
        self.outputs.check_first(out[1], axis)
        return out[1]


def _describe_result(out: Any) -> str:
    if isinstance(out, tuple) and len(out) == 3:
        return f"a tuple whose last item is {_checks.describe(out[2])}"
    if isinstance(out, tuple):
        return f"a tuple of length {len(out)}"
    return _checks.describe(out)
