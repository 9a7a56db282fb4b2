"""Which tensors of an imported model are its weights (the module's parameters, which training
changes) and which are constants (its buffers, which it never does), by how the graph uses them.

ONNX does not say which of a model's tensors were trained: every floating-point tensor, an
initializer or the value of a ``Constant`` node, is taken for a weight (a CRF's transitions, an
SSM's ``A_log`` and ``D`` train as a product's weights do), except the model's constants:

* a tensor of one element: an exponent (``x ** 2``'s ``2.0``, whose gradient is NaN for a
  negative ``x``), the ``1`` of ``1 - z``, a ``0.0`` that a mask's comparison and the arithmetic
  share;
* a tensor that holds an infinity or a NaN (an attention mask);
* a tensor the graph uses, directly or through layout operators (``Transpose``, ``Reshape``,
  ``Slice``, ``Cast``...), as an operand of a comparison, as an exponent, as the bounds of
  ``Clip``, the value of ``Pad``, the scales of ``Resize`` or of quantization, or as shape and
  index arithmetic;
* a table of rank 1 that a ``Gather`` reads items of (a diffusion schedule read at a step);
* a tensor no operator computes with, directly or through layout operators, but that is only
  held (``Identity``, ``SequenceConstruct``...): an output as it is (a branch of ``If`` that
  gives a constant, a slice of a constant put in a sequence).

A model that torchscan exported says which of its tensors were the module's parameters (its
initializers' ``metadata_props``, as torch.onnx knows them): those, and only those, are its
weights.

``to_torch(model, trainable=...)`` overrides the rule.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from typing import Any

import onnx_ir as ir
import torch

from torchscan._errors import TorchscanTypeError, TorchscanValueError
from torchscan.onnx import _ir
from torchscan.onnx._import._types import torch_tensor

_API = "torchscan.onnx.to_torch"

_CONSTANT_INPUTS: dict[str, tuple[int, ...] | None] = {
    "Less": None,  # None: every input
    "LessOrEqual": None,
    "Greater": None,
    "GreaterOrEqual": None,
    "Equal": None,
    "Pow": (1,),
    "Clip": (1, 2),
    "Pad": (1, 2, 3),
    "Resize": (1, 2, 3),
    "Upsample": (1,),
    "Reshape": (1,),
    "Expand": (1,),
    "Tile": (1,),
    "Slice": (1, 2, 3, 4),
    "Range": None,
    "ConstantOfShape": None,
    "OneHot": (1, 2),
    "TopK": (1,),
    "Where": (0,),
    # the scales of quantization (and a float zero point), which training would move off the
    # integers they were chosen for
    "QuantizeLinear": (1, 2),
    "DequantizeLinear": (1, 2),
    "QLinearMatMul": (1, 2, 4, 5, 6, 7),
    "QLinearConv": (1, 2, 4, 5, 6, 7),
}
"""The inputs of each operator that hold constants of the model, never weights."""

_HOLDERS = frozenset(
    {"Identity", "Optional", "SequenceConstruct", "SequenceInsert", "ConcatFromSequence"}
)
"""Operators that hold a tensor as it is: one that only they read (or none) is an output of
the model as it is, never a weight."""

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


def _graphs(graph: ir.Graph) -> Iterator[ir.Graph]:
    """``graph`` and every graph nested in its nodes' attributes."""
    yield graph
    for node in graph:
        for attribute in node.attributes.values():
            if attribute.type == ir.AttributeType.GRAPH:
                yield from _graphs(attribute.as_graph())
            elif attribute.type == ir.AttributeType.GRAPHS:
                for inner in attribute.as_graphs():
                    yield from _graphs(inner)


def _sources(model: ir.Model) -> dict[str, tuple[ir.Value, ir.TensorProtocol]]:
    """The tensors of ``model`` given by value, by name: its initializers (in every graph) and
    the ``value`` of its ``Constant`` nodes, each with the value the graph reads it as."""
    found: dict[str, tuple[ir.Value, ir.TensorProtocol]] = {}
    for graph in _graphs(model.graph):
        for value in graph.initializers.values():
            if value.const_value is not None:
                found[_ir.name_of(value)] = (value, value.const_value)
        for node in graph:
            given = node.attributes.get("value")
            if (
                node.op_type == "Constant"
                and _ir.is_default_domain(node.domain)
                and node.outputs
                and given is not None
                and given.type == ir.AttributeType.TENSOR
            ):
                found[_ir.name_of(node.outputs[0])] = (node.outputs[0], given.as_tensor())
    return found


def candidates(model: ir.Model) -> dict[str, tuple[ir.Value, torch.Tensor]]:
    """The floating-point tensors of ``model`` that could be weights, by name: its initializers
    (in every graph) and the ``value`` of its ``Constant`` nodes, each with the value the graph
    reads it as."""
    found = {}
    for name, (read, tensor) in _sources(model).items():
        value = torch_tensor(tensor)
        if value is not None and (value.is_floating_point() or value.is_complex()):
            found[name] = (read, value)
    return found


def state_kind(tensor: ir.TensorProtocol) -> str | None:
    """What of the state of the module that torch exported ``tensor`` was, where the file says
    (torchscan's export writes it): ``"PARAMETER"``, ``"BUFFER (persistent)"``, ``"BUFFER"``
    or ``"CONSTANT_TENSOR"``; else None."""
    marks = tensor.metadata_props
    kind = marks.get(_ir.STATE_KIND)
    if kind == "BUFFER" and marks.get(_ir.PERSISTENT) == "True":
        return "BUFFER (persistent)"
    return kind


def weights(model: ir.Model, floating: dict[str, tuple[ir.Value, torch.Tensor]]) -> set[str]:
    """The names of the tensors of ``model`` (its :func:`candidates`, ``floating``) that the
    rule of this module's docstring makes weights: the module's parameters where the file says
    which tensors they were."""
    kinds = {
        _ir.name_of(v): state_kind(v.const_value)
        for v in model.graph.initializers.values()
        if v.const_value is not None
    }
    if any(kind is not None for kind in kinds.values()):
        return {name for name, kind in kinds.items() if kind == "PARAMETER"} & set(floating)

    def uses(
        value: ir.Value, seen: set[ir.Value], direct: bool = True
    ) -> Iterator[tuple[str, int, bool]]:
        """What reads the tensor, through layout operators: each operator, the input it reads
        and whether it reads the tensor itself (not rearranged)."""
        if value in seen:
            return
        seen.add(value)
        for node, position in value.uses():
            if not _ir.is_default_domain(node.domain):
                continue
            through = _LAYOUT.get(node.op_type, ())
            if node.op_type in _LAYOUT and (through is None or position in through):
                for out in node.outputs:
                    yield from uses(out, seen, False)
            else:
                yield node.op_type, position, direct

    def constant(op: str, position: int, direct: bool, rank: int) -> bool:
        positions = _CONSTANT_INPUTS.get(op, ())
        if op in _CONSTANT_INPUTS and (positions is None or position in positions):
            return True
        # a schedule read at a step (an embedding table is of rank 2)
        return op == "Gather" and position == 0 and direct and rank == 1

    found = set()
    for name, (value, tensor) in floating.items():
        if tensor.numel() <= 1 or not bool(torch.isfinite(tensor).all()):
            continue
        read = list(uses(value, set()))
        computed = any(op not in _HOLDERS for op, _, _ in read)  # (else an output as it is)
        if computed and not any(constant(op, at, direct, tensor.dim()) for op, at, direct in read):
            found.add(name)
    return found


def trainable_names(model: ir.Model, trainable: Any) -> set[str]:
    """The names of the tensors of ``model`` that ``trainable`` makes parameters: ``"weights"``
    (:func:`weights`), ``"all"`` (every floating-point initializer and ``Constant``),
    ``"none"``, a collection of names (each a floating-point initializer or ``Constant`` of the
    model), or a predicate of a name and the tensor."""
    floating = candidates(model)
    if isinstance(trainable, str):
        if trainable == "weights":
            return weights(model, floating)
        if trainable == "all":
            return set(floating)
        if trainable == "none":
            return set()
        raise TorchscanValueError(
            f"{_API}: trainable must be 'weights', 'all', 'none', a collection of names or a "
            f"predicate, but got {trainable!r}"
        )
    if callable(trainable):
        return {name for name, (_, value) in floating.items() if trainable(name, value)}
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
