"""Small helpers for ``onnx_ir`` models: the default domain, fresh names, and walks over the
graphs nested in a graph.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping

import onnx_ir as ir

DEFAULT_DOMAINS = frozenset({"", "ai.onnx"})
"""The names of the default ONNX domain: ``""`` and its alias ``"ai.onnx"``."""

STATE_KIND = "pkg.torch.export.graph_signature.InputSpec.kind"
PERSISTENT = "pkg.torch.export.graph_signature.InputSpec.persistent"
"""The keys of the ``metadata_props`` where torch.onnx writes what of the module's state an
initializer is (``PARAMETER``, ``BUFFER``, ``CONSTANT_TENSOR``) and whether a buffer is
persistent (``"True"``); torchscan's export writes them into the file, where
``torchscan.onnx.to_torch`` reads them."""


def is_default_domain(domain: str) -> bool:
    """Whether ``domain`` names the default ONNX domain (``""`` or its alias ``"ai.onnx"``)."""
    return domain in DEFAULT_DOMAINS


def default_opset(imports: Mapping[str, int]) -> int | None:
    """The version of the default ONNX domain among ``{domain: version}`` imports (``""``
    before its alias), or None."""
    return imports.get("", imports.get("ai.onnx"))


def name_of(value: ir.Value) -> str:
    """The name of ``value``, which every value of a graph has: a graph names the values put in
    it without one."""
    assert value.name is not None, "a value of a graph without a name"
    return value.name


def subgraphs(node: ir.Node) -> Iterator[ir.Graph]:
    """The graphs held by the attributes of ``node`` (a Scan's body, an If's branches)."""
    for attribute in node.attributes.values():
        if attribute.type == ir.AttributeType.GRAPH:
            yield attribute.as_graph()
        elif attribute.type == ir.AttributeType.GRAPHS:
            yield from attribute.as_graphs()


def graphs(graph: ir.Graph) -> Iterator[ir.Graph]:
    """``graph`` and every graph nested in it, at any depth, outer ones first."""
    yield graph
    for node in graph:
        for subgraph in subgraphs(node):
            yield from graphs(subgraph)


def used_names(graph: ir.Graph) -> set[str]:
    """Every value and node name of ``graph`` and of the graphs nested in it."""
    names: set[str] = set()
    for found in graphs(graph):
        names.update(v.name for v in found.inputs if v.name)
        names.update(v.name for v in found.outputs if v.name)
        names.update(found.initializers)
        for node in found:
            names.update(v.name for v in node.inputs if v is not None and v.name)
            names.update(v.name for v in node.outputs if v.name)
            if node.name:
                names.add(node.name)
    return names


class Names:
    """Fresh names: ONNX wants every value name unique across a model and its subgraphs."""

    def __init__(self, taken: Iterable[str] = ()) -> None:
        self._taken = set(taken)
        self._counter = itertools.count()

    @classmethod
    def of(cls, graph: ir.Graph) -> Names:
        """Names fresh in ``graph`` and in every graph nested in it."""
        return cls(used_names(graph))

    def fresh(self, base: str) -> str:
        """A name used nowhere yet: ``base``, or ``base`` with a number; it is taken now."""
        name = base
        while name in self._taken:
            name = f"{base}_{next(self._counter)}"
        self._taken.add(name)
        return name
