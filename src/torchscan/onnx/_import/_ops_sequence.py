"""Sequences and optionals, in torch: an ONNX sequence is a Python list of tensors, an empty
optional ``None``. An operator whose one output is a sequence returns it in a 1-tuple, as a
list returned is a node's outputs.

A sequence's length and its elements' shapes may change from one step of a ``Loop`` to the next,
which a ``torchscan.loop`` carry cannot: a ``Loop`` that carries a sequence or an optional runs
as a Python loop (:mod:`._ops_control`).
"""

from __future__ import annotations

from typing import Any

import torch

from torchscan.onnx._import._graph import Call
from torchscan.onnx._import._registry import implements


def _position(call: Call, position: torch.Tensor, length: int, *, insert: bool = False) -> int:
    """A position in a sequence of ``length`` elements, a negative one counted from the end:
    within ``[-length, length - 1]``, or ``[-length, length]`` to insert."""
    index = int(position.reshape(()))
    high = length if insert else length - 1
    if not -length <= index <= high:
        raise call.refuse(
            f"position {index} is outside [{-length}, {high}] for a sequence of {length} elements"
        )
    return index + length if index < 0 else index


@implements("SequenceEmpty", 11)
def sequence_empty(call: Call) -> tuple[list[torch.Tensor]]:
    return ([],)


@implements("SequenceConstruct", 11)
def sequence_construct(call: Call, *tensors: torch.Tensor) -> tuple[list[torch.Tensor]]:
    return (list(tensors),)


@implements("SequenceInsert", 11)
def sequence_insert(
    call: Call, sequence: list[torch.Tensor], tensor: torch.Tensor, position: Any = None
) -> tuple[list[torch.Tensor]]:
    """The sequence with ``tensor`` at ``position`` (at the end by default)."""
    n = len(sequence)
    at = n if position is None else _position(call, position, n, insert=True)
    return ([*sequence[:at], tensor, *sequence[at:]],)


@implements("SequenceAt", 11)
def sequence_at(call: Call, sequence: list[torch.Tensor], position: torch.Tensor) -> torch.Tensor:
    return sequence[_position(call, position, len(sequence))]


@implements("SequenceErase", 11)
def sequence_erase(
    call: Call, sequence: list[torch.Tensor], position: Any = None
) -> tuple[list[torch.Tensor]]:
    """The sequence without the element at ``position`` (the last by default)."""
    n = len(sequence)
    at = n - 1 if position is None else _position(call, position, n)
    if n == 0:
        raise call.refuse("SequenceErase of an empty sequence")
    return ([*sequence[:at], *sequence[at + 1 :]],)


@implements("SequenceLength", 11)
def sequence_length(call: Call, sequence: list[torch.Tensor]) -> torch.Tensor:
    return torch.tensor(len(sequence), dtype=torch.int64)


@implements("ConcatFromSequence", 11)
def concat_from_sequence(call: Call, sequence: list[torch.Tensor]) -> torch.Tensor:
    """The elements concatenated along ``axis``, or stacked along a new one (``new_axis=1``)."""
    if not sequence:
        raise call.refuse("ConcatFromSequence of an empty sequence")
    axis = call.attribute("axis")
    if call.attribute("new_axis", 0):
        return torch.stack(sequence, dim=axis)
    return torch.cat(sequence, dim=axis)


@implements("SplitToSequence", 11, 24)
def split_to_sequence(
    call: Call, x: torch.Tensor, split: torch.Tensor | None = None
) -> tuple[list[torch.Tensor]]:
    """``x`` cut along ``axis``: into parts of 1 (squeezed unless ``keepdims``) without
    ``split``, into parts of ``split`` (the last one shorter) for a scalar, else into parts of
    the lengths listed."""
    axis = call.attribute("axis", 0)
    if split is None:
        parts = list(torch.split(x, 1, dim=axis))
        return (parts if call.attribute("keepdims", 1) else [p.squeeze(axis) for p in parts],)
    if split.dim() == 0:
        return (list(torch.split(x, int(split), dim=axis)),)
    sizes = [int(s) for s in split.tolist()]
    if sum(sizes) != x.shape[axis]:
        raise call.refuse(f"split {sizes} does not add up to {x.shape[axis]}, the size of axis")
    return (list(torch.split(x, sizes, dim=axis)),)


@implements("SequenceMap", 17)
def sequence_map(call: Call, first: list[torch.Tensor], *others: Any) -> list[list[Any]]:
    """The body applied to each position of the sequences (tensors given whole to each)."""
    n = len(first)
    for other in others:
        if isinstance(other, list) and len(other) != n:
            raise call.refuse(f"the input sequences have {n} and {len(other)} elements")
    count = len(call.node.outputs)
    outputs: list[list[Any]] = [[] for _ in range(count)]
    for i in range(n):
        inputs = [first[i], *(o[i] if isinstance(o, list) else o for o in others)]
        for j, value in enumerate(call.run_graph("body", inputs)):
            outputs[j].append(value)
    return outputs


@implements("Optional", 15)
def optional(call: Call, value: Any = None) -> tuple[Any]:
    return (value,)


@implements("OptionalHasElement", 15, 18)
def optional_has_element(call: Call, value: Any = None) -> torch.Tensor:
    return torch.tensor(value is not None)


@implements("OptionalGetElement", 15, 18)
def optional_get_element(call: Call, value: Any) -> tuple[Any]:
    if value is None:
        raise call.refuse("OptionalGetElement of an empty optional")
    return (value,)
