"""The inputs of an imported model checked against what its graph declares, as onnxruntime
checks them before it runs a model: the element type, the rank and every fixed dimension. A
symbolic dimension is not checked (onnxruntime runs models whose inputs share a name for
dimensions of other sizes), but where the graph then fails, inputs that disagree on the size of
a symbolic dimension they share (``batch`` of ``h0`` and of ``xs``) are named."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import onnx_ir as ir
import torch

from torchscan._errors import TorchscanTypeError, TorchscanValueError
from torchscan.onnx._import._types import torch_dtype

Dim = int | str | None
"""A declared dimension: a size, a symbolic name, or unknown."""


@dataclasses.dataclass(frozen=True)
class Declared:
    """A graph input's declared tensor type: its element type (a torch dtype, ``None`` where
    it declares none torch has) and its dimensions (``None`` where it declares no shape)."""

    name: str
    element_type: ir.DataType
    dims: tuple[Dim, ...] | None

    @property
    def dtype(self) -> torch.dtype | None:
        return torch_dtype(self.element_type)

    def text(self) -> str:
        kind = self.element_type.name.lower()
        if self.dims is None:
            return f"tensor({kind})"
        dims = ", ".join("?" if d is None else str(d) for d in self.dims)
        return f"tensor({kind}) of shape [{dims}]"


def declared(value: ir.Value) -> Declared | None:
    """What ``value`` declares, where it declares a tensor."""
    if not isinstance(value.type, ir.TensorType):
        return None
    dims: tuple[Dim, ...] | None = None
    if value.shape is not None:
        dims = tuple(d if isinstance(d, int) else d.value for d in value.shape.dims)
    return Declared(value.name or "", value.type.dtype, dims)


def _came(value: torch.Tensor) -> str:
    return f"a tensor of {value.dtype} of shape {tuple(value.shape)}"


def check(api: str, types: Sequence[Declared | None], values: Sequence[Any]) -> None:
    """Refuse ``values`` (the graph's inputs, in order) where one is not of its declared type:
    a ``TypeError`` for another kind or element type, a ``ValueError`` for another rank or
    another size of a fixed dimension (sizes that torch traces symbolically are left to the
    trace)."""
    for kind, value in zip(types, values, strict=True):
        if kind is None:
            continue
        if not isinstance(value, torch.Tensor):
            raise TorchscanTypeError(
                f"{api}: input '{kind.name}' is declared {kind.text()}, but got a "
                f"{type(value).__name__}"
            )
        if kind.dtype is not None and value.dtype != kind.dtype:
            raise TorchscanTypeError(
                f"{api}: input '{kind.name}' is declared {kind.text()}, but got {_came(value)}"
                f" (convert it: .to({kind.dtype}))"
            )
        if kind.dims is None:
            continue
        if value.dim() != len(kind.dims):
            raise TorchscanValueError(
                f"{api}: input '{kind.name}' is declared {kind.text()} (rank {len(kind.dims)}), "
                f"but got {_came(value)}"
            )
        for axis, (dim, size) in enumerate(zip(kind.dims, value.shape, strict=True)):
            if isinstance(dim, int) and isinstance(size, int) and size != dim:
                raise TorchscanValueError(
                    f"{api}: input '{kind.name}' is declared {kind.text()}, but got "
                    f"{_came(value)}: dimension {axis} must be {dim}"
                )


def disagreement(types: Sequence[Declared | None], values: Sequence[Any]) -> str | None:
    """Where two of ``values`` (or two dimensions of one) have other sizes for a symbolic
    dimension their declarations share, which: said where the graph fails on them."""
    seen: dict[str, tuple[int, str, int]] = {}  # symbolic name -> size, input, axis
    for kind, value in zip(types, values, strict=True):
        if kind is None or kind.dims is None or not isinstance(value, torch.Tensor):
            continue
        if value.dim() != len(kind.dims):
            continue
        for axis, (dim, size) in enumerate(zip(kind.dims, value.shape, strict=True)):
            if isinstance(dim, str) and isinstance(size, int):
                before = seen.setdefault(dim, (size, kind.name, axis))
                if before[0] != size:
                    return (
                        f"input '{kind.name}' is declared {kind.text()} and has {size} at its "
                        f"dimension {axis} ('{dim}'), where input '{before[1]}' has "
                        f"{before[0]} (its dimension {before[2]})"
                    )
    return None


__all__ = ["Declared", "check", "declared", "disagreement"]
