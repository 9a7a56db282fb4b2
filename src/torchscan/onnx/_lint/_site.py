"""The node being linted, a :class:`_Site`: where it is, the version in force for it, and where
its findings go; and how the rules read the node's values: the ONNX name of a value's type, its
shape as one int per static dimension and None per dynamic one (:data:`Dims`), and the words a
finding names them in.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import onnx
import onnx.defs
import onnx_ir as ir

from torchscan.onnx import _opsets
from torchscan.onnx._lint._report import Finding
from torchscan.onnx._lint._rules import RULES


@dataclasses.dataclass
class _Site:
    """One node being linted: where it is, its version, and where findings go."""

    node: ir.Node
    path: str
    version: _opsets.OpVersion
    opset: int
    findings: list[Finding]

    @property
    def op(self) -> str:
        return f"{self.version.op}-{self.version.since}"

    @functools.cached_property
    def schema(self) -> onnx.defs.OpSchema:
        return onnx.defs.get_schema(self.version.op, self.version.since, "")

    def report(self, rule: str, message: str, quote: str = "", source: str = "") -> None:
        known = RULES[rule]
        self.findings.append(
            Finding(
                node=self.path,
                op=self.op,
                rule=rule,
                message=message,
                spec=quote or known.quote,
                source=source or known.source,
            )
        )


# --- types and shapes ----------------------------------------------------------------------------


Dims = tuple[int | None, ...]
"""A shape as the lint reads it: an int per static dimension, None per dynamic one."""


def _type_str(value: ir.Value | None) -> str | None:
    """The ONNX name of a value's type, as in ``tensor(float)`` or ``seq(tensor(int64))``."""
    if value is None or value.type is None:
        return None
    return _name_of(value.type)


def _name_of(t: ir.TypeProtocol) -> str:
    if isinstance(t, ir.TensorType):
        return f"tensor({t.dtype.name.lower()})"
    if isinstance(t, ir.SparseTensorType):
        return f"sparse_tensor({t.dtype.name.lower()})"
    if isinstance(t, ir.SequenceType):
        return f"seq({_name_of(t.elem_type)})"
    if isinstance(t, ir.OptionalType):
        return f"optional({_name_of(t.elem_type)})"
    return str(t)


def _dims(value: ir.Value | None) -> Dims | None:
    """The shape of a tensor value, or None where its rank is unknown."""
    if value is None or not isinstance(value.type, ir.TensorType) or value.shape is None:
        return None
    return tuple(d if isinstance(d, int) else None for d in value.shape)


def _text(dims: Dims) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _named(value: ir.Value | None) -> str:
    return "an omitted input" if value is None else repr(value.name)


def _conflict(shapes: list[Dims]) -> str | None:
    """Why shapes known on several sides of one value cannot be the same shape, or None."""
    ranks = {len(s) for s in shapes}
    if len(ranks) > 1:
        return f"ranks {', '.join(str(r) for r in sorted(ranks))}"
    for axis in range(ranks.pop() if ranks else 0):
        sizes = {n for s in shapes if (n := s[axis]) is not None}
        if len(sizes) > 1:
            return f"sizes {', '.join(str(n) for n in sorted(sizes))} on axis {axis}"
    return None


def _without(dims: Dims | None, axes: Sequence[int]) -> Dims | None:
    """``dims`` with ``axes`` (non-negative, valid) removed, or None."""
    if dims is None or any(not 0 <= a < len(dims) for a in axes):
        return None
    return tuple(d for i, d in enumerate(dims) if i not in axes)
