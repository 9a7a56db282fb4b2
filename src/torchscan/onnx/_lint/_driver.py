"""The lint of ``Scan`` and ``Loop`` nodes: every one of a model, in its main graph, in the bodies
of other nodes at any depth, and in its local functions, is checked against the specification of
the version in force for it (read from torchscan's version table, :mod:`torchscan.onnx._opsets`,
and from ``onnx.defs`` outside the opsets torchscan exports to) by the rules of
:mod:`torchscan.onnx._lint._scan_rules` and :mod:`torchscan.onnx._lint._loop_rules`; every
``If`` node, by the shape rules of :mod:`torchscan.onnx._lint._if_rules`. Types and
shapes come from the model's own annotations, completed by ONNX shape inference where it
succeeds; a rule about a type or a shape is only applied where both sides are known, so a finding
is always a contradiction, never a guess. The ``RNN``, ``GRU`` and ``LSTM`` nodes are listed, with
no rule to apply.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import onnx
import onnx.defs
import onnx_ir as ir

from torchscan._errors import TorchscanValueError
from torchscan.onnx import _ir, _opsets
from torchscan.onnx._lint import _load
from torchscan.onnx._lint._if_rules import if_nodes, lint_if
from torchscan.onnx._lint._loop_rules import _lint_loop
from torchscan.onnx._lint._report import CheckedNode, Finding
from torchscan.onnx._lint._rules import RULES
from torchscan.onnx._lint._scan_rules import _lint_scan
from torchscan.onnx._lint._site import _Site


@dataclasses.dataclass(frozen=True)
class LintResult:
    """What :func:`lint` found: the nodes checked, the rules they break, and notes; ``others``:
    the If nodes (linted too) and the RNN, GRU and LSTM nodes (no rule lints them)."""

    opset: int | None
    nodes: tuple[CheckedNode, ...]
    findings: tuple[Finding, ...]
    notes: tuple[str, ...]
    others: tuple[CheckedNode, ...] = ()


def lint(model: ir.Model | onnx.ModelProto) -> LintResult:
    """Check every ``Scan`` and ``Loop`` node of ``model`` against the rules of its version.

    Args:
      model: the model with the types and shapes ONNX shape inference adds, in onnx_ir
        (:attr:`~torchscan.onnx._lint._load.LoadedModel.typed`); it is not modified. An
        ``onnx.ModelProto`` is first inferred and read into onnx_ir
        (:func:`~torchscan.onnx._lint._load.typed_model`).

    Returns:
      The Scan and Loop nodes checked, in graph order (a node's bodies right after it), the
      If, RNN, GRU and LSTM nodes (``others``), and the findings.

    Raises:
      ValueError: onnx_ir cannot read the model (it has no map types, for one), or a Scan or
        Loop node's graph imports no version of the default ONNX domain, so that the version
        in force for the node is unknown.
    """
    graph = model if isinstance(model, ir.Model) else _load.typed_model(model)
    opset = _ir.default_opset(graph.opset_imports)
    findings: list[Finding] = []
    nodes: list[CheckedNode] = []
    others: list[CheckedNode] = []
    notes: set[str] = set()
    scopes = [(graph.graph, "", opset)] + [
        # a function that imports no default-domain opset uses the model's
        (
            function,
            f"function '{function.name}' > ",
            _ir.default_opset(function.opset_imports) or opset,
        )
        for function in graph.functions.values()
    ]
    for nodes_of, prefix, scope_opset in scopes:
        for node, path in _loop_nodes(nodes_of, prefix):
            if scope_opset is None:
                raise TorchscanValueError(
                    f'imports no version of the default ONNX domain (no opset_import for "" '
                    f'or "ai.onnx"), so the version in force for {path} is unknown and it '
                    f"cannot be checked"
                )
            site = _site(node, path, scope_opset, findings, notes)
            nodes.append(CheckedNode(path, site.op if site else f"{node.op_type} (not checked)"))
            if site is not None:
                (_lint_scan if node.op_type == "Scan" else _lint_loop)(site)
        if scope_opset is not None:
            for node, path in if_nodes(nodes_of, prefix):
                lint_if(node, path, scope_opset, findings)
        for node, path in _other_nodes(nodes_of, prefix):
            others.append(CheckedNode(path, _version_text(node.op_type, scope_opset)))
    return LintResult(opset, tuple(nodes), tuple(findings), tuple(sorted(notes)), tuple(others))


OTHER_OPS = ("If", "RNN", "GRU", "LSTM")
"""The operators besides Scan and Loop that the report lists: ``If``, which the If rules lint,
and the recurrent operators, which no rule lints."""


def _other_nodes(graph: ir.Graph | ir.Function, prefix: str) -> Iterator[tuple[ir.Node, str]]:
    """Every node of :data:`OTHER_OPS` under ``graph``, bodies included, with its path."""
    for index, node in enumerate(graph):
        label = f"{node.op_type} {node.name!r}" if node.name else f"{node.op_type} #{index}"
        path = prefix + label
        if _ir.is_default_domain(node.domain) and node.op_type in OTHER_OPS:
            yield node, path
        for attr in node.attributes.values():
            if attr.is_ref():
                continue
            if attr.type == ir.AttributeType.GRAPH:
                yield from _other_nodes(attr.as_graph(), f"{path} > {attr.name} > ")
            elif attr.type == ir.AttributeType.GRAPHS:
                for i, body in enumerate(attr.as_graphs()):
                    yield from _other_nodes(body, f"{path} > {attr.name}[{i}] > ")


def _version_text(op: str, opset: int | None) -> str:
    """``"LSTM-14"``: the version of ``op`` in force at ``opset``, as onnx.defs says, or
    ``"LSTM (no version in force)"`` where the graph imports no default-domain opset."""
    if opset is not None:
        try:
            return f"{op}-{onnx.defs.get_schema(op, opset, '').since_version}"
        except onnx.defs.SchemaError:
            pass
    return f"{op} (no version in force)"


# --- finding the nodes and the version in force -------------------------------------------------


def _loop_nodes(graph: ir.Graph | ir.Function, prefix: str) -> Iterator[tuple[ir.Node, str]]:
    """Every Scan and Loop node under ``graph``, bodies included, with its path."""
    for index, node in enumerate(graph):
        label = f"{node.op_type} {node.name!r}" if node.name else f"{node.op_type} #{index}"
        path = prefix + label
        if _ir.is_default_domain(node.domain) and node.op_type in ("Scan", "Loop"):
            yield node, path
        for attr in node.attributes.values():
            if attr.is_ref():
                continue
            if attr.type == ir.AttributeType.GRAPH:
                yield from _loop_nodes(attr.as_graph(), f"{path} > {attr.name} > ")
            elif attr.type == ir.AttributeType.GRAPHS:
                for i, body in enumerate(attr.as_graphs()):
                    yield from _loop_nodes(body, f"{path} > {attr.name}[{i}] > ")


def version_in_force(op: str, opset: int) -> _opsets.OpVersion | None:
    """The version of ``op`` (Scan or Loop) in force at ``opset``, or None where there is none
    or it is not in torchscan's table.

    The table answers for the opsets torchscan exports to; outside them, onnx.defs says which
    version is in force, and the table gives its rules.
    """
    return _in_table(op, opset) or _by_since(op, _since_in_defs(op, opset))


def _in_table(op: str, opset: int) -> _opsets.OpVersion | None:
    in_force = _opsets.scan_version if op == "Scan" else _opsets.loop_version
    try:
        return in_force(opset)
    except ValueError:  # an opset torchscan does not export to
        return None


def _since_in_defs(op: str, opset: int) -> int | None:
    try:
        return onnx.defs.get_schema(op, opset, "").since_version
    except onnx.defs.SchemaError:
        return None


def _by_since(op: str, since: int | None) -> _opsets.OpVersion | None:
    versions = _opsets.SCAN_VERSIONS if op == "Scan" else _opsets.LOOP_VERSIONS
    return next((v for v in versions if v.since == since), None)


def _version_noted(op: str, opset: int, notes: set[str]) -> _opsets.OpVersion | None:
    """:func:`version_in_force`, with a note where onnx.defs had to be asked."""
    version = _in_table(op, opset)
    if version is not None:
        return version
    since = _since_in_defs(op, opset)
    if since is None:
        return None
    version = _by_since(op, since)
    if version is None:
        notes.add(
            f"{op}-{since}, in force at opset {opset}, is not in torchscan's version table: "
            f"its nodes are not checked"
        )
    else:
        notes.add(
            f"opset {opset} is outside the opsets torchscan exports to "
            f"({_opsets.MIN_OPSET} to {_opsets.MAX_OPSET}); onnx.defs puts {op}-{since} in "
            f"force there, and its rules are applied"
        )
    return version


def _site(
    node: ir.Node, path: str, opset: int, findings: list[Finding], notes: set[str]
) -> _Site | None:
    version = _version_noted(node.op_type, opset, notes)
    if version is None:
        if node.op_type == "Scan" and _since_in_defs("Scan", opset) is None:
            findings.append(
                Finding(
                    node=path,
                    op=f"Scan (opset {opset})",
                    rule="scan-opset",
                    message=f"the model's opset is {opset}, which has no Scan operator.",
                    spec=RULES["scan-opset"].quote,
                    source=RULES["scan-opset"].source,
                )
            )
        return None
    return _Site(node, path, version, opset, findings)
