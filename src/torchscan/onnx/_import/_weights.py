"""Which tensors of an imported model are its weights (the module's parameters, which training
changes) and which are constants (its buffers, which it never does), by how the graph uses them.

A floating-point tensor, an initializer or the value of a ``Constant`` node, is a weight where
the graph uses it, directly or through layout operators (``Transpose``, ``Reshape``, ``Slice``,
``Split``, ``Concat``, ``Cast``...), as:

* an operand of ``MatMul``, ``Gemm`` or ``Einsum``;
* the weight or bias of ``Conv``/``ConvTranspose``, the weights, recurrences, biases and
  peepholes of ``RNN``/``GRU``/``LSTM``, the scale and bias of a normalization
  (``BatchNormalization``, ``LayerNormalization``, ``InstanceNormalization``,
  ``GroupNormalization``), the slope of ``PRelu``;
* the table of a ``Gather`` (an embedding: rank 2 or more);
* the other operand of an ``Add`` to the result of one of the products above (a bias).

Everything else is a constant: a tensor of one element (an exponent, ``x ** 2``'s ``2.0``; the
``1`` of ``1 - z``; a scalar shared between a comparison and arithmetic), a tensor holding an
infinity or a NaN (an attention mask), and the operands of comparisons, masks, shape and index
arithmetic. ``to_torch(model, trainable=...)`` overrides the rule.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Collection, Iterator
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
import torch

from torchscan._errors import TorchscanTypeError, TorchscanValueError

_API = "torchscan.onnx.to_torch"

_WEIGHT_INPUTS: dict[str, tuple[int, ...] | None] = {
    "MatMul": None,  # None: every input
    "Gemm": None,
    "Einsum": None,
    "Conv": (1, 2),
    "ConvTranspose": (1, 2),
    "RNN": (1, 2, 3),
    "GRU": (1, 2, 3),
    "LSTM": (1, 2, 3, 7),
    "BatchNormalization": (1, 2),
    "LayerNormalization": (1, 2),
    "InstanceNormalization": (1, 2),
    "GroupNormalization": (1, 2),
    "PRelu": (1,),
}
"""The inputs of each operator that hold weights."""

_PRODUCTS = frozenset({"MatMul", "Gemm", "Einsum", "Conv", "ConvTranspose"})
"""The operators whose result an ``Add`` of a weight adds a bias to."""

_LAYOUT: dict[str, tuple[int, ...] | None] = {
    "Transpose": (0,),
    "Reshape": (0,),
    "Squeeze": (0,),
    "Unsqueeze": (0,),
    "Flatten": (0,),
    "Cast": (0,),
    "Identity": (0,),
    "Slice": (0,),
    "Split": (0,),
    "Concat": None,
    "Expand": (0,),
    "Tile": (0,),
}
"""The operators through which a weight reaches where it is used, and their inputs that carry
it (their outputs are the weight, rearranged)."""

Trainable = str | Collection[str] | Callable[[str, torch.Tensor], bool]


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every graph nested in its nodes' attributes."""
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attribute.g)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for g in attribute.graphs:
                    yield from _graphs(g)


def candidates(model: onnx.ModelProto) -> dict[str, torch.Tensor]:
    """The floating-point tensors of ``model`` that could be weights, by name: its initializers
    (in every graph) and the ``value`` of its ``Constant`` nodes."""
    found: dict[str, torch.Tensor] = {}
    for graph in _graphs(model.graph):
        for tensor in graph.initializer:
            found[tensor.name] = _tensor(tensor)
        for node in graph.node:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and node.output:
                value = next((a.t for a in node.attribute if a.name == "value"), None)
                if value is not None:
                    found[node.output[0]] = _tensor(value)
    return {k: v for k, v in found.items() if v.is_floating_point() or v.is_complex()}


def _tensor(proto: onnx.TensorProto) -> torch.Tensor:
    return torch.from_numpy(np.array(onnx.numpy_helper.to_array(proto)))


def weights(model: onnx.ModelProto) -> set[str]:
    """The names of the tensors of ``model`` that the rule of this module's docstring makes
    weights."""
    users: dict[str, list[tuple[onnx.NodeProto, int]]] = collections.defaultdict(list)
    producer: dict[str, onnx.NodeProto] = {}
    for graph in _graphs(model.graph):
        for node in graph.node:
            if node.domain not in ("", "ai.onnx"):
                continue
            for position, name in enumerate(node.input):
                if name:
                    users[name].append((node, position))
            for name in node.output:
                producer[name] = node

    def used_as_weight(name: str, seen: set[str]) -> bool:
        if name in seen:
            return False
        seen.add(name)
        for node, position in users.get(name, ()):
            op = node.op_type
            if op in _WEIGHT_INPUTS:
                positions = _WEIGHT_INPUTS[op]
                if positions is None or position in positions:
                    return True
            if op == "Add":
                other = node.input[1 - position] if len(node.input) == 2 else ""
                made = producer.get(other)
                if made is not None and made.op_type in _PRODUCTS:
                    return True
            through = _LAYOUT.get(op, ())
            carried = op in _LAYOUT and (through is None or position in through)
            if carried and any(used_as_weight(out, seen) for out in node.output if out):
                return True
        return False

    def gathered(name: str) -> bool:
        return any(n.op_type == "Gather" and p == 0 for n, p in users.get(name, ()))

    found = set()
    for name, value in candidates(model).items():
        if value.numel() <= 1 or not bool(torch.isfinite(value).all()):
            continue
        if used_as_weight(name, set()) or (value.dim() >= 2 and gathered(name)):
            found.add(name)
    return found


def trainable_names(model: onnx.ModelProto, trainable: Any) -> set[str]:
    """The names of the tensors of ``model`` that ``trainable`` makes parameters: ``"weights"``
    (:func:`weights`), ``"all"`` (every floating-point initializer and ``Constant``),
    ``"none"``, a collection of names (each a floating-point initializer or ``Constant`` of the
    model), or a predicate of a name and the tensor."""
    floating = candidates(model)
    if isinstance(trainable, str):
        if trainable == "weights":
            return weights(model)
        if trainable == "all":
            return set(floating)
        if trainable == "none":
            return set()
        raise TorchscanValueError(
            f"{_API}: trainable must be 'weights', 'all', 'none', a collection of names or a "
            f"predicate, but got {trainable!r}"
        )
    if callable(trainable):
        return {name for name, value in floating.items() if trainable(name, value)}
    if isinstance(trainable, Collection):
        names = list(trainable)
        if not all(isinstance(n, str) for n in names):
            kinds = sorted({type(n).__name__ for n in names if not isinstance(n, str)})
            raise TorchscanTypeError(
                f"{_API}: trainable holds names of tensors (str), but it holds {kinds}"
            )
        unknown = sorted(set(names) - set(floating))
        if unknown:
            known = sorted(floating)
            shown = ", ".join(map(repr, known[:8])) + (", ..." if len(known) > 8 else "")
            raise TorchscanValueError(
                f"{_API}: trainable names {unknown}, which are no floating-point initializer "
                f"or Constant of the model; its {len(known)} are {shown}"
            )
        return set(names)
    raise TorchscanTypeError(
        f"{_API}: trainable must be 'weights', 'all', 'none', a collection of names or a "
        f"predicate, but got a {type(trainable).__name__}"
    )


__all__ = ["Trainable", "candidates", "trainable_names", "weights"]
