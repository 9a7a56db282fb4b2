"""Which outputs of a model depend on a random operator, whose values no two runtimes draw alike:
``check`` compares their shapes and element types, not their values ("not compared: random").

A value depends on a random operator when a random operator computes it, when a node computes it
from a value that does, and when a node with a body (``Scan``, ``Loop``, ``If``, at any depth)
computes it and the body holds a random operator or reads such a value of an outer graph: every
output of such a node is taken to depend on it. A call of a local function whose body holds a
random operator is taken the same way.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx

from torchscan.onnx import _ir

RANDOM_OPS = frozenset(
    {
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
        "Bernoulli",
        "Multinomial",
    }
)
"""The operators of the default ONNX domain that draw random numbers."""


Functions = dict[tuple[str, str], onnx.FunctionProto]


def random_outputs(model: onnx.ModelProto) -> dict[str, str]:
    """The model's outputs whose values depend on a random operator, each with the first random
    operator it depends on, named with its path through the bodies that hold it, as in
    ``"Scan 'scan' > body > RandomNormalLike 'noise'"``."""
    functions = {(f.domain, f.name): f for f in model.functions}
    found: dict[str, str] = {}
    for index, node in enumerate(model.graph.node):
        source = _draw(node, index, functions, "", frozenset())
        if source is None:
            source = next((found[name] for name in _reads(node) if name in found), None)
        if source is not None:
            found.update((name, source) for name in node.output if name)
    return {o.name: found[o.name] for o in model.graph.output if o.name in found}


def _draw(
    node: onnx.NodeProto,
    index: int,
    functions: Functions,
    prefix: str,
    seen: frozenset[tuple[str, str]],
) -> str | None:
    """The first random operator that ``node`` is, or that its bodies or the local function it
    calls hold, at any depth; None if none. ``prefix`` is the path of the graph holding it."""
    label = (
        f"{prefix}{node.op_type} {node.name!r}" if node.name else f"{prefix}{node.op_type} #{index}"
    )
    if node.op_type in RANDOM_OPS and _ir.is_default_domain(node.domain):
        return label
    inner: list[tuple[str, list[onnx.NodeProto], frozenset[tuple[str, str]]]] = [
        (f"{label} > {attr} > ", list(body.node), seen) for attr, body in _bodies(node)
    ]
    key = (node.domain, node.op_type)
    if key in functions and key not in seen:
        inner.append((f"{label} > ", list(functions[key].node), seen | {key}))
    for where, nodes, called in inner:
        for i, child in enumerate(nodes):
            drawn = _draw(child, i, functions, where, called)
            if drawn is not None:
                return drawn
    return None


def _bodies(node: onnx.NodeProto) -> Iterator[tuple[str, onnx.GraphProto]]:
    for attr in node.attribute:
        if attr.HasField("g"):
            yield attr.name, attr.g
        for body in attr.graphs:
            yield attr.name, body


def _reads(node: onnx.NodeProto) -> Iterator[str]:
    """Every name ``node`` reads: its inputs, and the values of outer graphs its bodies read."""
    yield from (name for name in node.input if name)
    for _, body in _bodies(node):
        for inner in body.node:
            yield from _reads(inner)
