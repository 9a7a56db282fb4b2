"""The operators ``to_torch`` implements: one function per operator and set of versions, found
by the version of the operator's schema in force at the model's opset.

An implementation is registered for the exact ``since_version`` of every schema it follows
(``@implements("Add", 7, 13, 14)``); a version that no implementation lists is refused, never
computed by the implementation of an older or newer version, whose meaning may differ.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import onnx.defs

from torchscan._errors import TorchscanValueError

Implementation = Callable[..., Any]

_IMPLEMENTATIONS: dict[tuple[str, str, int], Implementation] = {}


def implements(op_type: str, *versions: int, domain: str = "") -> Callable[[Any], Any]:
    """Register the decorated function as ``op_type`` at each of ``versions`` (the
    ``since_version`` of the schemas it follows)."""

    def register(function: Implementation) -> Implementation:
        for version in versions:
            key = (domain, op_type, version)
            if key in _IMPLEMENTATIONS:
                raise TorchscanValueError(f"{op_type}-{version} is implemented twice")
            _IMPLEMENTATIONS[key] = function
        return function

    return register


def schema_version(domain: str, op_type: str, opset: int) -> int | None:
    """The ``since_version`` of the schema of ``op_type`` in force at ``opset`` (``None`` where
    onnx knows no such operator there)."""
    try:
        return onnx.defs.get_schema(op_type, opset, domain).since_version
    except onnx.defs.SchemaError:
        return None


def lookup(domain: str, op_type: str, version: int) -> Implementation | None:
    return _IMPLEMENTATIONS.get((domain, op_type, version))


def implemented() -> dict[str, list[int]]:
    """The versions implemented of every operator of the default domain, for the docs."""
    table: dict[str, list[int]] = {}
    for domain, op_type, version in sorted(_IMPLEMENTATIONS):
        if domain == "":
            table.setdefault(op_type, []).append(version)
    return table


def markdown_table() -> str:
    """The operators and versions implemented, as the table of docs/import.md."""
    rows = ["| operator | versions |", "| --- | --- |"]
    rows += [f"| {op} | {', '.join(map(str, v))} |" for op, v in sorted(implemented().items())]
    return "\n".join(rows) + "\n"
