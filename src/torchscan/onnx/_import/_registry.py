"""The operators ``to_torch`` implements: one function per operator and set of versions, found
by the version of the operator's schema in force at the model's opset.

An implementation is registered for the exact ``since_version`` of every schema it follows
(``@implements("Add", 7, 13, 14)``); a version that no implementation lists is refused, never
computed by the implementation of an older or newer version, whose meaning may differ.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from torchscan._errors import TorchscanValueError
from torchscan.onnx._opsets import OpKey, op_key, schema_since

Implementation = Callable[..., Any]

_IMPLEMENTATIONS: dict[OpKey, Implementation] = {}


def implements(op_type: str, *versions: int, domain: str = "") -> Callable[[Any], Any]:
    """Register the decorated function as ``op_type`` at each of ``versions`` (the
    ``since_version`` of the schemas it follows)."""

    def register(function: Implementation) -> Implementation:
        for version in versions:
            key = op_key(domain, op_type, version)
            if key in _IMPLEMENTATIONS:
                raise TorchscanValueError(f"{op_type}-{version} is implemented twice")
            _IMPLEMENTATIONS[key] = function
        return function

    return register


def schema_version(domain: str, op_type: str, opset: int) -> int | None:
    """The ``since_version`` of the schema of ``op_type`` in force at ``opset`` (``None`` where
    onnx knows no such operator there)."""
    return schema_since(domain, op_type, opset)


def lookup(domain: str, op_type: str, version: int) -> Implementation | None:
    return _IMPLEMENTATIONS.get(op_key(domain, op_type, version))


def keys() -> Iterator[OpKey]:
    """The operator versions implemented, as the registries key them."""
    return iter(sorted(_IMPLEMENTATIONS))


def implemented() -> dict[str, list[int]]:
    """The versions implemented of every operator, for the docs: those of the default domain by
    name, the others' after their domain (``ai.onnx.ml.Scaler``)."""
    table: dict[str, list[int]] = {}
    for domain, op_type, version in sorted(_IMPLEMENTATIONS):
        table.setdefault(f"{domain}.{op_type}" if domain else op_type, []).append(version)
    return table


def markdown_table() -> str:
    """The operators and versions implemented, as the table of docs/import.md."""
    rows = ["| operator | versions |", "| --- | --- |"]
    rows += [f"| {op} | {', '.join(map(str, v))} |" for op, v in sorted(implemented().items())]
    return "\n".join(rows) + "\n"
