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

import onnx_ir as ir

from torchscan._hoist import _policy
from torchscan.onnx import _ir

RANDOM_OPS = _policy.RANDOM_ONNX_OPS
"""The operators of the default ONNX domain that draw random numbers."""


Functions = dict[tuple[str, str], ir.Function]


def random_outputs(model: ir.Model) -> dict[str, str]:
    """The model's outputs whose values depend on a random operator, each with the first random
    operator it depends on, named with its path through the bodies that hold it, as in
    ``"Scan 'scan' > body > RandomNormalLike 'noise'"``."""
    functions = {(domain, name): f for (domain, name, _), f in model.functions.items()}
    found: dict[str, str] = {}
    for index, node in enumerate(model.graph):
        source = _draw(node, index, functions, "", frozenset())
        if source is None:
            source = next((found[name] for name in _reads(node) if name in found), None)
        if source is not None:
            found.update((value.name, source) for value in node.outputs if value.name)
    outputs = [o.name for o in model.graph.outputs if o.name is not None]
    return {name: found[name] for name in outputs if name in found}


def _draw(
    node: ir.Node,
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
    inner: list[tuple[str, list[ir.Node], frozenset[tuple[str, str]]]] = [
        (f"{label} > {attr} > ", list(body), seen) for attr, body in _bodies(node)
    ]
    key = (node.domain, node.op_type)
    if key in functions and key not in seen:
        inner.append((f"{label} > ", list(functions[key]), seen | {key}))
    for where, nodes, called in inner:
        for i, child in enumerate(nodes):
            drawn = _draw(child, i, functions, where, called)
            if drawn is not None:
                return drawn
    return None


def _bodies(node: ir.Node) -> Iterator[tuple[str, ir.Graph]]:
    for attr in node.attributes.values():
        if attr.is_ref():
            continue
        if attr.type == ir.AttributeType.GRAPH:
            yield attr.name, attr.as_graph()
        elif attr.type == ir.AttributeType.GRAPHS:
            for body in attr.as_graphs():
                yield attr.name, body


def _reads(node: ir.Node) -> Iterator[str]:
    """Every name ``node`` reads: its inputs, and the values of outer graphs its bodies read."""
    yield from (value.name for value in node.inputs if value is not None and value.name)
    for _, body in _bodies(node):
        for inner in body:
            yield from _reads(inner)
