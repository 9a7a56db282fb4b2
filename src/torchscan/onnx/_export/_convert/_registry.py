"""The registry of adapters, keyed by ``(domain, operator, since version)``, and the declaration
of an operator's adapters.

An adapter registered for ``(domain, op, b)`` carries a node of operator ``op`` across the
boundary ``b``: it receives the node valid at opset ``b`` (where the operator's version ``b``
starts) and returns nodes valid at opset ``b - 1``.

Every adapter of an operator, at all its boundaries, is declared in one class decorated with
:func:`adapters`: its attribute ``below_N`` is the adapter for the boundary ``N``, which takes
the operator from opset ``N`` down to below it (opset ``N - 1``; tf2onnx's ``version_N`` is
instead the handler of the version starting at ``N``). A class
declares one operator, or several that share every version, and no operator is declared by two
classes. The classes are in the ``_ops_*`` modules, one module for each family of operators.
An adapter that cannot express its node exactly below the boundary raises the context's refusal,
saying what is missing; each adapter's docstring quotes the change of the specification it
undoes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

import onnx_ir as ir

from torchscan._errors import TorchscanValueError
from torchscan.onnx._opsets import OpKey, op_key

if TYPE_CHECKING:
    from torchscan.onnx._export._convert._context import Context

Adapter = Callable[[ir.Node, "Context", int], list[ir.Node]]
"""``adapter(node, ctx, boundary)``: the nodes that replace ``node`` below ``boundary``."""

_Class = TypeVar("_Class", bound=type)

_VERSION = re.compile(r"below_(\d+)")


def _canonical(domain: str) -> str:
    return op_key(domain, "", 0)[0]


def versions_of(cls: type) -> dict[int, Adapter]:
    """The adapters a class declares: its own attributes ``below_N``, by boundary ``N``."""
    found = {}
    for name in vars(cls):
        match = _VERSION.fullmatch(name)
        if match:
            found[int(match.group(1))] = getattr(cls, name)
    return dict(sorted(found.items()))


class AdapterRegistry:
    """The adapters, one for each ``(domain, operator, since version)`` that needs one, and the
    class that declares each operator's adapters."""

    def __init__(self) -> None:
        self._adapters: dict[OpKey, Adapter] = {}
        self._declared: dict[tuple[str, str], type] = {}

    def declare(self, *ops: str, domain: str = "") -> Callable[[_Class], _Class]:
        """A class decorator: the class holds every adapter of the operators ``ops`` of
        ``domain``, its attribute ``below_N`` (a function, or a static method) the one for the
        boundary ``N``. Each is registered, and the class is recorded as the one that declares
        those operators; an operator that another class declares already is refused."""

        def decorator(cls: _Class) -> _Class:
            versions = versions_of(cls)
            if not ops or not versions:
                raise TorchscanValueError(
                    f"torchscan.onnx: {cls.__qualname__} declares no adapter of an operator"
                )
            for op in ops:
                declared = self._declared.get((_canonical(domain), op))
                if declared is not None:
                    raise TorchscanValueError(
                        f"torchscan.onnx: the adapters of {op} are declared by "
                        f"{declared.__module__}.{declared.__qualname__} already"
                    )
            for op in ops:
                self._declared[(_canonical(domain), op)] = cls
                for since, adapter in versions.items():
                    self.add(domain, op, since, adapter)
            return cls

        return decorator

    def register(
        self, domain: str, ops: str | Sequence[str], *since: int
    ) -> Callable[[Adapter], Adapter]:
        """A decorator registering its adapter for every operator of ``ops`` (one name or
        several) of ``domain`` at every since version of ``since``, declared by no class."""

        def decorator(adapter: Adapter) -> Adapter:
            for op in [ops] if isinstance(ops, str) else ops:
                for version in since:
                    self.add(domain, op, version, adapter)
            return adapter

        return decorator

    def add(self, domain: str, op: str, since: int, adapter: Adapter) -> None:
        key = op_key(domain, op, since)
        if key in self._adapters:
            raise TorchscanValueError(f"torchscan.onnx: an adapter is already registered for {key}")
        self._adapters[key] = adapter

    def lookup(self, domain: str, op: str, since: int) -> Adapter | None:
        """The adapter for the boundary ``since`` of ``op`` in ``domain``, or None."""
        return self._adapters.get(op_key(domain, op, since))

    def declared_by(self, domain: str, op: str) -> type | None:
        """The class that declares the adapters of ``op`` in ``domain``, or None."""
        return self._declared.get((_canonical(domain), op))

    def __iter__(self) -> Iterator[OpKey]:
        return iter(self._adapters)

    def __len__(self) -> int:
        return len(self._adapters)


registry = AdapterRegistry()
adapters = registry.declare
