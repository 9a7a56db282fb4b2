"""How far the outputs of a runtime are from the baseline's, one :class:`OutputDiff` per output:
an output agrees when every element ``a`` is within ``atol + rtol * |b|`` of the baseline's ``b``
(NaNs where the baseline has NaNs), with the same shape and element type; sequences are compared
element by element, and values that are not numbers for equality. The values of an output that
depends on a random operator are not compared; its shape and element type are.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection
from typing import Any

import numpy as np

from torchscan.onnx._lint._report import RANDOM, OutputDiff


def _named_outputs(names: list[str], values: list[Any]) -> list[tuple[str, Any]]:
    return [
        (names[i] if i < len(names) else f"output {i}", value) for i, value in enumerate(values)
    ]


def _diff_all(
    names: list[str],
    actual: list[Any],
    baseline: list[Any],
    atol: float,
    rtol: float,
    random: Collection[str] = (),
) -> tuple[OutputDiff, ...]:
    """Each output against the baseline's; those named in ``random``, which depend on a random
    operator, by their shapes and element types only (``not_compared="random"``)."""
    diffs = [
        dataclasses.replace(_diff(name, a, b, atol, rtol, values=False), not_compared=RANDOM)
        if name in random
        else _diff(name, a, b, atol, rtol)
        for (name, a), b in zip(_named_outputs(names, actual), baseline, strict=False)
    ]
    if len(actual) != len(baseline):
        note = f"{len(actual)} outputs, where the baseline has {len(baseline)}"
        diffs.append(OutputDiff("(outputs)", "", None, None, False, note))
    return tuple(diffs)


def _shape_text(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, list):
        return f"seq[{len(value)}]"
    return str(tuple(np.shape(value)))


def _diff(name: str, a: Any, b: Any, atol: float, rtol: float, values: bool = True) -> OutputDiff:
    """How far ``a`` is from the baseline's ``b``; sequences element by element. Without
    ``values``, whether they are of one shape and element type (errors None)."""
    shape = _shape_text(a)
    if a is None or b is None or isinstance(a, list) != isinstance(b, list):
        same = a is None and b is None
        note = "" if same else f"{_shape_text(a)} where the baseline has {_shape_text(b)}"
        return OutputDiff(name, shape, 0.0 if same else None, 0.0 if same else None, same, note)
    if isinstance(a, list):
        if len(a) != len(b):
            note = f"{len(a)} elements, where the baseline has {len(b)}"
            return OutputDiff(name, shape, None, None, False, note)
        parts = [_diff(name, x, y, atol, rtol, values) for x, y in zip(a, b, strict=True)]
        return OutputDiff(
            name,
            shape,
            _worst(p.max_abs for p in parts),
            _worst(p.max_rel for p in parts),
            all(p.ok for p in parts),
            next((p.note for p in parts if p.note), ""),
        )
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        note = f"shape {a.shape}, where the baseline has {b.shape}"
        return OutputDiff(name, shape, None, None, False, note)
    note = "" if a.dtype == b.dtype else f"element type {a.dtype}, where the baseline has {b.dtype}"
    if not values:
        return OutputDiff(name, shape, None, None, not note, note)
    max_abs, max_rel, close = _errors(a, b, atol, rtol)
    return OutputDiff(name, shape, max_abs, max_rel, close and not note, note)


def _worst(values: Any) -> float | None:
    values = list(values)
    return None if any(v is None for v in values) else max(values, default=0.0)


def _errors(a: np.ndarray, b: np.ndarray, atol: float, rtol: float) -> tuple[float, float, bool]:
    """Largest absolute and relative errors of ``a`` against ``b``, and whether all elements
    are within ``atol + rtol * |b|`` (NaNs agreeing with NaNs)."""
    if a.size == 0:
        return 0.0, 0.0, True
    if not (_numeric(a) and _numeric(b)):
        equal = bool(np.array_equal(a, b))
        return (0.0, 0.0, True) if equal else (math.inf, math.inf, False)
    x, y = _widen(a), _widen(b)
    with np.errstate(all="ignore"):
        same = (x == y) | (np.isnan(x) & np.isnan(y))
        diff = np.where(same, 0.0, np.abs(x - y))
        diff = np.where(np.isnan(diff), np.inf, diff)
        scale = np.abs(y)
        rel = np.where(diff == 0, 0.0, np.where(scale > 0, diff / scale, np.inf))
        close = bool(np.all(same | (diff <= atol + rtol * scale)))
    return float(diff.max()), float(rel.max()), close


def _numeric(a: np.ndarray) -> bool:
    return a.dtype.kind in "biufcV"


def _widen(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "c":
        return a.astype(np.complex128)
    if a.dtype.kind == "V":  # ml_dtypes' bfloat16 and float8 types convert through float32
        return a.astype(np.float32).astype(np.float64)
    return a.astype(np.float64)
