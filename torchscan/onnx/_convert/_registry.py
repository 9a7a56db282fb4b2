"""The registry of adapters, keyed by ``(domain, operator, since version)``.

An adapter registered for ``(domain, op, b)`` carries a node of operator ``op`` across the
boundary ``b``: it receives the node valid at opset ``b`` (where the operator's version ``b``
starts) and returns nodes valid at opset ``b - 1``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import onnx_ir as ir

from torchscan._errors import TorchscanValueError
from torchscan.onnx import _ir

if TYPE_CHECKING:
    from torchscan.onnx._convert._context import Context

Adapter = Callable[[ir.Node, "Context", int], list[ir.Node]]
"""``adapter(node, ctx, boundary)``: the nodes that replace ``node`` below ``boundary``."""


def _canonical(domain: str) -> str:
    return "" if _ir.is_default_domain(domain) else domain


class AdapterRegistry:
    """The adapters, one for each ``(domain, operator, since version)`` that needs one."""

    def __init__(self) -> None:
        self._adapters: dict[tuple[str, str, int], Adapter] = {}

    def register(
        self, domain: str, ops: str | Sequence[str], *since: int
    ) -> Callable[[Adapter], Adapter]:
        """A decorator registering its adapter for every operator of ``ops`` (one name or
        several) of ``domain`` at every since version of ``since``."""

        def decorator(adapter: Adapter) -> Adapter:
            for op in [ops] if isinstance(ops, str) else ops:
                for version in since:
                    self.add(domain, op, version, adapter)
            return adapter

        return decorator

    def add(self, domain: str, op: str, since: int, adapter: Adapter) -> None:
        key = (_canonical(domain), op, since)
        if key in self._adapters:
            raise TorchscanValueError(f"torchscan.onnx: an adapter is already registered for {key}")
        self._adapters[key] = adapter

    def lookup(self, domain: str, op: str, since: int) -> Adapter | None:
        """The adapter for the boundary ``since`` of ``op`` in ``domain``, or None."""
        return self._adapters.get((_canonical(domain), op, since))

    def __iter__(self) -> Iterator[tuple[str, str, int]]:
        return iter(self._adapters)

    def __len__(self) -> int:
        return len(self._adapters)


registry = AdapterRegistry()
register = registry.register
