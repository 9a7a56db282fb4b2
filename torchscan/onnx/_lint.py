"""The lint of ``Scan`` and ``Loop`` nodes: each node against the rules of its version.

Every ``Scan`` and ``Loop`` node of a model, in its main graph, in the bodies of other nodes at
any depth, and in its local functions, is checked against the specification of the version in
force for it (read from torchscan's version table, :mod:`torchscan.onnx._opsets`). Each rule has
an id, a one-line summary and the sentence of the specification it comes from; ``RULES`` lists
them and ``docs/check.md`` documents them.

Types and shapes come from the model's own annotations, completed by ONNX shape inference where
it succeeds; a rule about a type or a shape is only applied where both sides are known, so a
finding is always a contradiction, never a guess.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
import warnings
from collections.abc import Iterator, Sequence

import onnx
import onnx.defs
import onnx.shape_inference
import onnx_ir as ir

from torchscan._errors import TorchscanValueError
from torchscan.onnx import _opsets
from torchscan.onnx._report import CheckedNode, Finding

_DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclasses.dataclass(frozen=True)
class Rule:
    """One rule of the specification of ``Scan`` or ``Loop``.

    Attributes:
      id: the rule's name in findings, as in ``"scan-axis-range"``.
      summary: what the rule requires, in one line.
      quote: the sentence of the specification the rule comes from.
      source: where that sentence is.
    """

    id: str
    summary: str
    quote: str
    source: str


_RULES = (
    Rule(
        "scan-opset",
        "Scan exists from opset 8",
        "This version of the operator has been available since version 8.",
        "Scan-8",
    ),
    Rule(
        "scan-attribute",
        "the attributes are those of the version in force, with their types, required ones set",
        "body (required): The graph run each iteration.",
        "Scan, attributes",
    ),
    Rule(
        "scan-arity",
        "the node has as many inputs and outputs as its version allows",
        "Between 1 and 2147483647 inputs.",
        "Scan, inputs",
    ),
    Rule(
        "scan-num-scan-inputs",
        "`num_scan_inputs` is at least 1 and at most the number of inputs (besides Scan-8's "
        "`sequence_lens`)",
        "The attribute num_scan_inputs indicates the number M of scan-inputs.",
        "Scan, summary",
    ),
    Rule(
        "scan-body-inputs",
        "the body has N+M inputs: N state variables, M scan input elements",
        "It has N+M inputs: (loop state variables…, scan_input_elts…).",
        "Scan, attribute body",
    ),
    Rule(
        "scan-body-outputs",
        "the body has N+K outputs, as many as the node",
        "It has N+K outputs: (loop state variables…, scan_output_elts…).",
        "Scan, attribute body",
    ),
    Rule(
        "scan-outputs",
        "the node has at least N outputs: the final state variables, then K scan outputs",
        "Final values of the loop’s N state variables followed by K scan_outputs",
        "Scan, output final_state_and_scan_outputs",
    ),
    Rule(
        "scan-omitted-input",
        "no state variable or scan input is omitted (only Scan-8's `sequence_lens` may be)",
        "initial_state_and_scan_inputs (variadic) - V: Initial values of the loop’s N state "
        "variables followed by M scan_inputs",
        "Scan, inputs",
    ),
    Rule(
        "scan-list-length",
        "`scan_input_axes`, `scan_input_directions` (Scan-8: `directions`) have M entries, "
        "`scan_output_axes`, `scan_output_directions` K",
        "An optional list of M flags.",
        "Scan, attribute scan_input_axes",
    ),
    Rule(
        "scan-direction",
        "every direction is 0 or 1",
        "0 indicates forward direction and 1 indicates reverse direction.",
        "Scan, attribute scan_input_directions",
    ),
    Rule(
        "scan-axis-negative",
        "axes are not negative in a version without negative axes (Scan-9)",
        "Negative value for an axis means counting dimensions from the back.",
        "Scan-11, attribute scan_input_axes (new in Scan-11)",
    ),
    Rule(
        "scan-axis-range",
        "every axis lies within the rank of its input or output",
        "Accepted range is [-r, r-1] where r = rank(input).",
        "Scan-11, attribute scan_input_axes",
    ),
    Rule(
        "scan-sequence-length",
        "all scan inputs have the same length along their scan axes",
        "scan_i.shape[axis_i] is required to be equal to scan_j.shape[axis_j] for all i,j.",
        "Scan, pseudo-code",
    ),
    Rule(
        "scan-element-type",
        "every input and output has a type that the type constraint V of the version in force "
        "lists",
        "V in ( tensor(bool), tensor(complex128), tensor(complex64), tensor(double), "
        "tensor(float), tensor(float16), tensor(int16), tensor(int32), tensor(int64), "
        "tensor(int8), tensor(string), tensor(uint16), tensor(uint32), tensor(uint64), "
        "tensor(uint8) ): All Tensor types",
        "Scan-8, type constraints",
    ),
    Rule(
        "scan-carried-type",
        "each state variable has one element type at the node and in the body, in and out",
        "It must return the (updated) values of the state_variables and zero or more "
        "scan_output_element tensors.",
        "Scan, summary",
    ),
    Rule(
        "scan-carried-shape",
        "each state variable keeps its shape from iteration to iteration, where known",
        "It is an error if the dimensions of these values change across loop iterations.",
        "Scan, attribute body",
    ),
    Rule(
        "scan-input-element",
        "each body scan input is its scan input without the scan axis: same type, rank - 1",
        "It will have a rank one less than the rank of the corresponding scan_input.",
        "Scan-9, summary",
    ),
    Rule(
        "scan-output-element",
        "each scan output stacks its body output: same type, rank + 1",
        "Each scan_output is created by concatenating the value of the specified scan_output_elt "
        "value at the end of each iteration of the loop.",
        "Scan, attribute body",
    ),
    Rule(
        "scan8-batch",
        "Scan-8: every state and scan input has a leading batch axis of one size, scan inputs "
        "a sequence axis 1",
        "The operation supports batching, and the batch-axis is required to be 0.",
        "Scan-8, summary",
    ),
    Rule(
        "scan8-sequence-lens",
        "Scan-8: `sequence_lens`, where given, is an int64 vector of the batch size",
        "The operation has an optional sequence_lens input (of shape [BATCH_SIZE])",
        "Scan-8, summary",
    ),
    Rule(
        "loop-attribute",
        "the attributes are those of the version in force, with their types, required ones set",
        "body (required): The graph run each iteration.",
        "Loop, attributes",
    ),
    Rule(
        "loop-arity",
        "the node has as many inputs and outputs as its version allows",
        "Between 2 and 2147483647 inputs.",
        "Loop, inputs",
    ),
    Rule(
        "loop-trip-count",
        "`M`, where given, is an int64 scalar",
        "I in ( tensor(int64) ): tensor of int64, which should be a scalar.",
        "Loop, type constraints",
    ),
    Rule(
        "loop-condition",
        "`cond`, where given, is a bool scalar",
        "B in ( tensor(bool) ): tensor of bool, which should be a scalar.",
        "Loop, type constraints",
    ),
    Rule(
        "loop-never-ends",
        "the loop can end: it has `M`, or a `cond` that its body can change",
        "input (“”, “”): for (int i=0; ; ++i) { cond = … // Note this value is ignored, but is "
        "required in the body }",
        "Loop, summary (operating modes)",
    ),
    Rule(
        "loop-omitted-input",
        "no initial carried value is omitted (only `M` and `cond` may be)",
        "v_initial (variadic) - V: The initial values of any loop-carried dependencies (values "
        "that change across loop iterations)",
        "Loop, inputs",
    ),
    Rule(
        "loop-body-inputs",
        "the body has 2+N inputs: iteration number, condition, N carried values",
        "It has 2+N inputs: (iteration_num, condition, loop carried dependencies…).",
        "Loop, attribute body",
    ),
    Rule(
        "loop-body-outputs",
        "the body has 1+N+K outputs: condition, N carried values, K scan outputs",
        "It has 1+N+K outputs: (condition, loop carried dependencies…, scan_outputs…).",
        "Loop, attribute body",
    ),
    Rule(
        "loop-outputs",
        "the node has at least N outputs: the final carried values, then K scan outputs",
        "Final N loop carried dependency values then K scan_outputs.",
        "Loop, output v_final_and_scan_outputs",
    ),
    Rule(
        "loop-body-iteration",
        "the body's first input, the iteration number, is an int64 scalar, like `M`",
        "It has 2+N inputs: (iteration_num, condition, loop carried dependencies…).",
        "Loop, attribute body",
    ),
    Rule(
        "loop-body-condition",
        "the body's second input and first output, the condition, are bool scalars",
        "The body graph must yield a value for the condition variable, whether this input is "
        "provided or not.",
        "Loop, summary",
    ),
    Rule(
        "loop-element-type",
        "every carried value and output has a type that the type constraint V of the version in "
        "force lists",
        "V in ( tensor(bool), tensor(complex128), tensor(complex64), tensor(double), "
        "tensor(float), tensor(float16), tensor(int16), tensor(int32), tensor(int64), "
        "tensor(int8), tensor(string), tensor(uint16), tensor(uint32), tensor(uint64), "
        "tensor(uint8) ): All Tensor types",
        "Loop-1, type constraints",
    ),
    Rule(
        "loop-carried-type",
        "each carried value has one type at the node and in the body, in and out (an optional "
        "may hold its element)",
        "… modelled using a pair of variables in the loop-body, consisting of an input variable "
        "(eg., b_in) and an output variable (eg., b_out).",
        "Loop, summary",
    ),
    Rule(
        "loop-scan-output",
        "each scan output is a tensor stacking its body output: same element type, rank + 1",
        "It is an error if the dimensions or data type of these scan_outputs change across loop "
        "iterations.",
        "Loop, attribute body",
    ),
)

RULES: dict[str, Rule] = {rule.id: rule for rule in _RULES}
"""Every rule the lint applies, by id."""


@dataclasses.dataclass(frozen=True)
class LintResult:
    """What :func:`lint` found: the nodes checked, the rules they break, and notes."""

    opset: int | None
    nodes: tuple[CheckedNode, ...]
    findings: tuple[Finding, ...]
    notes: tuple[str, ...]


def lint(model: onnx.ModelProto) -> LintResult:
    """Check every ``Scan`` and ``Loop`` node of ``model`` against the rules of its version.

    Args:
      model: the model; it is not modified.

    Returns:
      The nodes checked, in graph order (a node's bodies right after it), and the findings.

    Raises:
      ValueError: onnx_ir cannot read the model (it has no map types, for one), or a Scan or
        Loop node's graph imports no version of the default ONNX domain, so that the version
        in force for the node is unknown.
    """
    opset = default_opset(model.opset_import)
    graph = _deserialize(_with_inferred_types(model))
    findings: list[Finding] = []
    nodes: list[CheckedNode] = []
    notes: set[str] = set()
    scopes = [(graph.graph, "", opset)] + [
        # a function that imports no default-domain opset uses the model's
        (
            function,
            f"function '{function.name}' > ",
            _default_opset_ir(function.opset_imports) or opset,
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
    return LintResult(opset, tuple(nodes), tuple(findings), tuple(sorted(notes)))


def markdown_rules() -> str:
    """The table of rules in ``docs/check.md``; a test keeps the page current."""
    rows = ["| rule | what it checks |", "| --- | --- |"]
    rows += [f"| `{rule.id}` | {rule.summary} |" for rule in _RULES]
    return "\n".join(rows) + "\n"


# --- finding the nodes and the version in force -------------------------------------------------


def default_opset(imports: Sequence[onnx.OperatorSetIdProto]) -> int | None:
    """The version of the default ONNX domain among a model's opset imports, or None."""
    return next((i.version for i in imports if i.domain in _DEFAULT_DOMAINS), None)


def _default_opset_ir(imports: dict[str, int]) -> int | None:
    return next((v for d, v in imports.items() if d in _DEFAULT_DOMAINS), None)


def _with_inferred_types(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with the types and shapes ONNX can infer, or as it is where inference fails
    (a model broken enough to be linted is often too broken to be inferred)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False)
    except Exception:  # any failure of inference leaves the model's own annotations
        return model


def _deserialize(model: onnx.ModelProto) -> ir.Model:
    """``model`` in onnx_ir, without the log lines onnx_ir writes about a broken model: the
    lint's findings say what is broken."""
    logger = logging.getLogger(ir.serde.__name__)
    disabled, logger.disabled = logger.disabled, True
    try:
        return ir.serde.deserialize_model(model)
    except Exception as error:  # SerdeError, and whatever a corrupt model makes onnx_ir raise
        cause: BaseException = error
        while cause.__cause__ is not None:  # onnx_ir wraps the reason in errors of its own
            cause = cause.__cause__
        reason = " ".join(str(cause).split()) or type(cause).__name__
        raise TorchscanValueError(f"onnx_ir cannot read the model to lint it: {reason}") from None
    finally:
        logger.disabled = disabled


def _loop_nodes(graph: ir.Graph | ir.Function, prefix: str) -> Iterator[tuple[ir.Node, str]]:
    """Every Scan and Loop node under ``graph``, bodies included, with its path."""
    for index, node in enumerate(graph):
        label = f"{node.op_type} {node.name!r}" if node.name else f"{node.op_type} #{index}"
        path = prefix + label
        if node.domain in _DEFAULT_DOMAINS and node.op_type in ("Scan", "Loop"):
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


@dataclasses.dataclass
class _Site:
    """One node being linted: where it is, its version, and where findings go."""

    node: ir.Node
    path: str
    version: _opsets.OpVersion
    opset: int
    findings: list[Finding]

    @property
    def op(self) -> str:
        return f"{self.version.op}-{self.version.since}"

    @functools.cached_property
    def schema(self) -> onnx.defs.OpSchema:
        return onnx.defs.get_schema(self.version.op, self.version.since, "")

    def report(self, rule: str, message: str, quote: str = "", source: str = "") -> None:
        known = RULES[rule]
        self.findings.append(
            Finding(
                node=self.path,
                op=self.op,
                rule=rule,
                message=message,
                spec=quote or known.quote,
                source=source or known.source,
            )
        )


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


# --- types and shapes ----------------------------------------------------------------------------

Dims = tuple[int | None, ...]
"""A shape as the lint reads it: an int per static dimension, None per dynamic one."""


def _type_str(value: ir.Value | None) -> str | None:
    """The ONNX name of a value's type, as in ``tensor(float)`` or ``seq(tensor(int64))``."""
    if value is None or value.type is None:
        return None
    return _name_of(value.type)


def _name_of(t: ir.TypeProtocol) -> str:
    if isinstance(t, ir.TensorType):
        return f"tensor({t.dtype.name.lower()})"
    if isinstance(t, ir.SparseTensorType):
        return f"sparse_tensor({t.dtype.name.lower()})"
    if isinstance(t, ir.SequenceType):
        return f"seq({_name_of(t.elem_type)})"
    if isinstance(t, ir.OptionalType):
        return f"optional({_name_of(t.elem_type)})"
    return str(t)


def _dims(value: ir.Value | None) -> Dims | None:
    """The shape of a tensor value, or None where its rank is unknown."""
    if value is None or not isinstance(value.type, ir.TensorType) or value.shape is None:
        return None
    return tuple(d if isinstance(d, int) else None for d in value.shape)


def _n(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def _text(dims: Dims) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _named(value: ir.Value | None) -> str:
    return "an omitted input" if value is None else repr(value.name)


def _conflict(shapes: list[Dims]) -> str | None:
    """Why shapes known on several sides of one value cannot be the same shape, or None."""
    ranks = {len(s) for s in shapes}
    if len(ranks) > 1:
        return f"ranks {', '.join(str(r) for r in sorted(ranks))}"
    for axis in range(ranks.pop() if ranks else 0):
        sizes = {s[axis] for s in shapes if s[axis] is not None}
        if len(sizes) > 1:
            return f"sizes {', '.join(str(n) for n in sorted(sizes))} on axis {axis}"
    return None


def _without(dims: Dims | None, axes: Sequence[int]) -> Dims | None:
    """``dims`` with ``axes`` (non-negative, valid) removed, or None."""
    if dims is None or any(not 0 <= a < len(dims) for a in axes):
        return None
    return tuple(d for i, d in enumerate(dims) if i not in axes)


# --- rules shared by Scan and Loop ------------------------------------------------------------


def _check_attributes(site: _Site, needed: dict[str, str]) -> bool:
    """Attributes against the schema of the version in force; True when those in ``needed``
    (name -> type name) are there with their types, so that the other rules can run."""
    rule = f"{site.version.op.lower()}-attribute"
    schema_attrs = site.schema.attributes
    for name, attr in site.node.attributes.items():
        expected = schema_attrs.get(name)
        if expected is None:
            owners = _versions_with_attribute(site.version, name)
            where = f"; it is an attribute of {owners}" if owners else ""
            site.report(
                rule,
                f"{site.op} has no attribute {name!r}{where}. The attributes of {site.op} are "
                f"{_listing(sorted(schema_attrs))}.",
                _attribute_list_text(site.schema),
                f"{site.op}, attributes",
            )
        elif not attr.is_ref() and attr.type.name != expected.type.name:
            site.report(
                rule,
                f"attribute {name!r} is of type {attr.type.name}, where {site.op} expects "
                f"{expected.type.name}.",
                _attribute_text(expected),
                f"{site.op}, attribute {name}",
            )
    for name, a in schema_attrs.items():
        if a.required and name not in site.node.attributes:
            site.report(
                rule,
                f"the required attribute {name!r} is missing.",
                _attribute_text(a),
                f"{site.op}, attribute {name}",
            )
    return all(
        name in site.node.attributes
        and not site.node.attributes[name].is_ref()
        and site.node.attributes[name].type.name == type_name
        for name, type_name in needed.items()
    )


def _as_in_spec(text: str) -> str:
    """Text from ``onnx.defs`` as the specification pages print it: on one line, with an
    ellipsis character for three dots and a right single quotation mark for an apostrophe."""
    return " ".join(text.replace("...", "…").replace("'", "’").split())


def _attribute_text(attr: onnx.defs.OpSchema.Attribute) -> str:
    """An attribute's entry in the specification, as in ``"num_scan_inputs (required): An
    attribute specifying the number of scan_inputs M."``."""
    required = " (required)" if attr.required else ""
    return f"{attr.name}{required}: {_as_in_spec(attr.description)}"


def _attribute_list_text(schema: onnx.defs.OpSchema) -> str:
    """The specification's list of attributes, each entry cut after its first sentence."""
    entries = []
    for name in sorted(schema.attributes):
        text = _attribute_text(schema.attributes[name])
        head, dot, rest = text.partition(". ")
        entries.append(f"{head}. …" if dot and rest else text)
    return " ".join(entries)


def _listing(items: Sequence[str]) -> str:
    if len(items) < 3:
        return " and ".join(items)
    return ", ".join(items[:-1]) + f" and {items[-1]}"


def _versions_with_attribute(version: _opsets.OpVersion, name: str) -> str:
    versions = _opsets.SCAN_VERSIONS if version.op == "Scan" else _opsets.LOOP_VERSIONS
    owners = [
        f"{v.op}-{v.since}"
        for v in versions
        if name in onnx.defs.get_schema(v.op, v.since, "").attributes
    ]
    return ", ".join(owners)


def _check_arity(site: _Site) -> None:
    schema, rule = site.schema, f"{site.version.op.lower()}-arity"
    for what, count, low, high in (
        ("inputs", len(site.node.inputs), schema.min_input, schema.max_input),
        ("outputs", len(site.node.outputs), schema.min_output, schema.max_output),
    ):
        if not low <= count <= high:
            site.report(
                rule,
                f"the node has {count} {what}, where {site.op} takes {low} to {high}.",
                f"Between {low} and {high} {what}.",
                f"{site.op}, {what}",
            )


def _check_types(site: _Site, roles: list[tuple[str, ir.Value | None]]) -> None:
    """Each input and output of the node has a type that the version in force allows."""
    allowed = _allowed_types(site.version)
    for role, value in roles:
        name = _type_str(value)
        if name is None or name in allowed:
            continue
        first = _first_opset_allowing(site.version, value, name)
        later = (
            f"; the first opset that allows it is {first}"
            if first
            else f"; no {site.version.op} version allows it"
        )
        quote, source = _type_constraint_quote(site.version)
        site.report(
            f"{site.version.op.lower()}-element-type",
            f"{role}, {_named(value)}, is of type {name}, which {site.op} (in force at opset "
            f"{site.opset}) does not allow: {_allowed_statement(site.version)}{later}.",
            quote,
            source,
        )


@functools.cache
def _allowed_types(version: _opsets.OpVersion) -> frozenset[str]:
    """The type names constraint V of ``version`` allows, from its schema in onnx.defs (tensor
    element types, and the sequence and optional types of Loop-13 and Loop-16)."""
    return frozenset(_variadic_constraint(version).allowed_type_strs)


def _variadic_constraint(version: _opsets.OpVersion) -> onnx.defs.OpSchema.TypeConstraintParam:
    schema = onnx.defs.get_schema(version.op, version.since, "")
    variadic = schema.inputs[-1].type_str
    return next(c for c in schema.type_constraints if c.type_param_str == variadic)


_SPEC_PAGES = {"Scan": (8, 9, 11, 16), "Loop": (1, 11, 13, 16)}
"""The versions whose operator pages the quotes follow. Those pages print the type constraint
without the " up to IRv4." that onnx.defs has since added to its description; later versions are
quoted from onnx.defs."""


def _type_constraint_quote(version: _opsets.OpVersion) -> tuple[str, str]:
    """The specification's type constraint V of ``version``, and where it is.

    The list of types comes from onnx.defs, in the order the specification prints it.
    """
    constraint = _variadic_constraint(version)
    description = constraint.description.strip()
    source = f"{version.op}-{version.since}, type constraints"
    if version.since in _SPEC_PAGES[version.op]:
        description = re.sub(r" up to IRv\d+\.$", "", description)
    else:
        source += " (onnx.defs)"
    listed = ", ".join(sorted(constraint.allowed_type_strs))
    return f"V in ( {listed} ): {description}", source


_KINDS = {
    "tensor(": "tensors",
    "seq(tensor(": "sequences of tensors",
    "optional(tensor(": "optional tensors",
    "optional(seq(tensor(": "optional sequences of tensors",
}


@functools.cache
def _allowed_statement(version: _opsets.OpVersion) -> str:
    """What the type constraint V of ``version`` allows, in words: its description says "All
    Tensor types", but it means the element types it lists, no others."""
    elements: dict[str, set[str]] = {}
    for name in _allowed_types(version):
        kind, _, element = name.rpartition("tensor(")
        elements.setdefault(kind + "tensor(", set()).add(element.rstrip(")"))
    by_set: dict[frozenset[str], list[str]] = {}
    for kind in _KINDS:
        if kind in elements:
            by_set.setdefault(frozenset(elements[kind]), []).append(_KINDS[kind])
    parts = [
        f"{_listing(kinds)} of {_n(len(types), 'element type')} ({', '.join(sorted(types))})"
        for types, kinds in by_set.items()
    ]
    return f"{version.op}-{version.since} allows only {', and '.join(parts)}"


def _first_opset_allowing(version: _opsets.OpVersion, value: ir.Value, name: str) -> int | None:
    versions = _opsets.SCAN_VERSIONS if version.op == "Scan" else _opsets.LOOP_VERSIONS
    if isinstance(value.type, ir.TensorType):
        return _opsets.first_opset_allowing(versions, value.dtype)
    return next((v.since for v in versions if name in _allowed_types(v)), None)


def _check_same_type(site: _Site, rule: str, what: str, sides: list[tuple[str, ir.Value]]) -> None:
    """The values on ``sides`` (where, value) are one value: their known types must agree."""
    typed = [(where, v, _type_str(v)) for where, v in sides if _type_str(v) is not None]
    # An optional carried value holds its element once set: optional(T) and T are one type,
    # as in ONNX's own test_loop16_seq_none.
    if len({_unwrap_optional(t) for _, _, t in typed}) > 1:
        listed = "; ".join(f"{where} {v.name!r}: {t}" for where, v, t in typed)
        site.report(rule, f"{what} changes type: {listed}.")


def _unwrap_optional(name: str) -> str:
    return name[len("optional(") : -1] if name.startswith("optional(") else name


def _check_scalar(site: _Site, rule: str, what: str, value: ir.Value | None, dtype: str) -> None:
    """``value``, where given and known, is a scalar tensor of element type ``dtype``."""
    name, dims = _type_str(value), _dims(value)
    if value is None:
        return
    if name is not None and name != f"tensor({dtype})":
        site.report(rule, f"{what}, {_named(value)}, is of type {name}, not tensor({dtype}).")
    elif dims is not None and dims:
        site.report(rule, f"{what}, {_named(value)}, has shape {_text(dims)}, not a scalar.")


# --- Scan -----------------------------------------------------------------------------------


@dataclasses.dataclass
class _ScanLayout:
    """A Scan node's inputs and outputs sorted into what they are to the loop."""

    body: ir.Graph
    sequence_lens: ir.Value | None
    init: list[ir.Value | None]
    scans: list[ir.Value | None]
    finals: list[ir.Value]
    scan_outs: list[ir.Value]
    input_axes: list[int]
    output_axes: list[int]

    @property
    def n(self) -> int:
        return len(self.init)

    @property
    def m(self) -> int:
        return len(self.scans)

    @property
    def k(self) -> int:
        return len(self.scan_outs)


def _lint_scan(site: _Site) -> None:
    if not _check_attributes(site, {"body": "GRAPH", "num_scan_inputs": "INT"}):
        return
    _check_arity(site)
    layout = _scan_layout(site)
    if layout is None:
        return
    _check_scan_omitted(site, layout)
    _check_scan_lists(site, layout)
    _check_types(site, _scan_roles(layout))
    if site.version.batch_axis:
        _check_scan8_batch(site, layout)
        _check_scan8_sequence_lens(site, layout)
    else:
        _check_scan_axes(site, layout)
    _check_sequence_lengths(site, layout)
    if _check_scan_body_arity(site, layout):
        _check_scan_state(site, layout)
        _check_scan_elements(site, layout)


def _scan_layout(site: _Site) -> _ScanLayout | None:
    node, batch = site.node, site.version.batch_axis
    inputs = list(node.inputs)
    sequence_lens, variadic = (
        (inputs[0] if inputs else None, inputs[1:]) if batch else (None, inputs)
    )
    m = node.attributes["num_scan_inputs"].as_int()
    if not 1 <= m <= len(variadic):
        besides = " besides sequence_lens" if batch else ""
        why = (
            "a Scan takes its number of iterations from its first scan input"
            if m < 1
            else f"there are {len(variadic)} inputs{besides} to take them from"
        )
        site.report("scan-num-scan-inputs", f"num_scan_inputs is {m}, but {why}.")
        return None
    n = len(variadic) - m
    outputs = list(node.outputs)
    k = max(len(outputs) - n, 0)
    return _ScanLayout(
        body=node.attributes["body"].as_graph(),
        sequence_lens=sequence_lens,
        init=variadic[:n],
        scans=variadic[n:],
        finals=outputs[:n],
        scan_outs=outputs[n:],
        input_axes=_ints(node, "scan_input_axes", m),
        output_axes=_ints(node, "scan_output_axes", k),
    )


def _ints(node: ir.Node, name: str, count: int) -> list[int]:
    """An INTS attribute, or ``count`` zeros (the default) where it is absent or unusable."""
    attr = node.attributes.get(name)
    if attr is None or attr.is_ref() or attr.type != ir.AttributeType.INTS:
        return [0] * count
    return list(attr.as_ints())


def _scan_roles(layout: _ScanLayout) -> list[tuple[str, ir.Value | None]]:
    return [
        *((f"initial state variable {i}", v) for i, v in enumerate(layout.init)),
        *((f"scan input {j}", v) for j, v in enumerate(layout.scans)),
        *((f"final state variable {i}", v) for i, v in enumerate(layout.finals)),
        *((f"scan output {k}", v) for k, v in enumerate(layout.scan_outs)),
    ]


def _check_scan_omitted(site: _Site, layout: _ScanLayout) -> None:
    """Every state variable and scan input is given: they are not optional inputs."""
    for role, value in _scan_roles(layout)[: layout.n + layout.m]:
        if value is None:
            site.report(
                "scan-omitted-input",
                f"{role} is omitted (its name is empty), but only optional inputs may be, and "
                f"{_optional_inputs(site)}: each state variable needs an initial value, each "
                f"scan input a tensor to scan.",
            )


def _optional_inputs(site: _Site) -> str:
    """Which inputs of the version in force are optional, from its schema, in words."""
    optional = [
        p.name
        for p in site.schema.inputs
        if p.option == onnx.defs.OpSchema.FormalParameterOption.Optional
    ]
    if not optional:
        return f"{site.op} has none"
    if len(optional) == 1:
        return f"the only optional input of {site.op} is {optional[0]}"
    return f"the optional inputs of {site.op} are {_listing(optional)}"


def _check_scan_lists(site: _Site, layout: _ScanLayout) -> None:
    """Length and values of the axes and directions lists the version in force has."""
    lists = {
        "directions": (layout.m, "M", "scan input"),
        "scan_input_axes": (layout.m, "M", "scan input"),
        "scan_input_directions": (layout.m, "M", "scan input"),
        "scan_output_axes": (layout.k, "K", "scan output"),
        "scan_output_directions": (layout.k, "K", "scan output"),
    }
    for name, (count, letter, per) in lists.items():
        attr = site.node.attributes.get(name)
        if name not in site.schema.attributes or attr is None or attr.is_ref():
            continue
        if attr.type != ir.AttributeType.INTS:
            continue
        values = list(attr.as_ints())
        if len(values) != count:
            site.report(
                "scan-list-length",
                f"{name} has {len(values)} entries, but the node has {_n(count, per)} "
                f"({letter} = {count}).",
                f"An optional list of {letter} flags.",
                f"{site.op}, attribute {name}",
            )
        if name.endswith("directions"):
            _check_directions(site, name, values)


def _check_directions(site: _Site, name: str, values: list[int]) -> None:
    bad = [(i, d) for i, d in enumerate(values) if d not in (0, 1)]
    if not bad:
        return
    listed = ", ".join(f"{name}[{i}] is {d}" for i, d in bad)
    quote = (
        "0 indicates appending and 1 indicates prepending."
        if name == "scan_output_directions"
        else "0 indicates forward direction and 1 indicates reverse direction."
    )
    site.report(
        "scan-direction", f"{listed}: a direction is 0 or 1.", quote, f"{site.op}, attribute {name}"
    )


def _check_scan_axes(site: _Site, layout: _ScanLayout) -> None:
    """Scan-9 and later: every axis within the rank of its tensor, non-negative where the
    version requires it. Where the rank of a node's value is unknown (in a function, whose
    values have no types, or for lack of a shape), it is one more than the rank of its element
    in the body."""
    body = layout.body
    elements_in = body.inputs[layout.n :] if len(body.inputs) == layout.n + layout.m else []
    elements_out = body.outputs[layout.n :] if len(body.outputs) == layout.n + layout.k else []
    for name, axes, values, elements in (
        ("scan_input_axes", layout.input_axes[: layout.m], layout.scans, elements_in),
        ("scan_output_axes", layout.output_axes[: layout.k], layout.scan_outs, elements_out),
    ):
        for i, axis in enumerate(axes):
            dims, element = _dims(values[i]), None
            if dims is None and i < len(elements) and _dims(elements[i]) is not None:
                dims, element = (None, *_dims(elements[i])), elements[i]
            _check_axis(site, name, i, axis, values[i], dims, element)


def _check_axis(
    site: _Site,
    name: str,
    i: int,
    axis: int,
    value: ir.Value | None,
    dims: Dims | None,
    element: ir.Value | None,
) -> None:
    negative_ok = site.version.negative_axes
    if axis < 0 and not negative_ok:
        first = next(v for v in _opsets.SCAN_VERSIONS if v.negative_axes)
        site.report(
            "scan-axis-negative",
            f"{name}[{i}] is {axis}, but {site.op} takes no negative axes; they came with "
            f"Scan-{first.since} (opset {first.since}).",
        )
        return
    if dims is None:
        return
    rank = len(dims)
    low = -rank if negative_ok else 0
    if not low <= axis <= rank - 1:
        what = "scan input" if name == "scan_input_axes" else "scan output"
        quote = (
            RULES["scan-axis-range"].quote
            if name == "scan_input_axes"
            else "Accepted range is [-r, r-1]."
        )
        rank_of = (
            f"has rank {rank}"
            if element is None
            else f"whose rank is not declared, has rank {rank}, as its element in the body, "
            f"{element.name!r}, has rank {rank - 1}"
        )
        site.report(
            "scan-axis-range",
            f"{name}[{i}] is {axis}, outside [{low}, {rank - 1}]: {what} {i}, {_named(value)}, "
            f"{rank_of}.",
            quote,
            f"{site.op}, attribute {name}",
        )


def _axis(site: _Site, axis: int, dims: Dims | None) -> int | None:
    """``axis`` made non-negative for ``dims``, or None where it is unknown or invalid for the
    version (out of range, or negative where negative axes are not allowed)."""
    if dims is None or not -len(dims) <= axis < len(dims):
        return None
    if axis < 0 and not site.version.negative_axes:
        return None
    return axis % len(dims)


def _check_sequence_lengths(site: _Site, layout: _ScanLayout) -> None:
    axes = [1] * layout.m if site.version.batch_axis else layout.input_axes
    lengths = []
    for j, value in enumerate(layout.scans):
        dims = _dims(value)
        axis = _axis(site, axes[j], dims) if j < len(axes) else None
        if axis is not None and dims[axis] is not None:
            lengths.append((j, value, dims[axis]))
    if len({length for *_, length in lengths}) > 1:
        listed = "; ".join(f"scan input {j}, {_named(v)}: {n}" for j, v, n in lengths)
        site.report("scan-sequence-length", f"the scan inputs differ in length: {listed}.")


def _check_scan8_batch(site: _Site, layout: _ScanLayout) -> None:
    """Scan-8: a batch axis 0 on every state and scan value, and a sequence axis 1 on every
    scan input and output, with one batch size."""
    sides = [
        *((f"initial state variable {i}", v, 1) for i, v in enumerate(layout.init)),
        *((f"scan input {j}", v, 2) for j, v in enumerate(layout.scans)),
        *((f"final state variable {i}", v, 1) for i, v in enumerate(layout.finals)),
        *((f"scan output {k}", v, 2) for k, v in enumerate(layout.scan_outs)),
    ]
    batch = []
    for role, value, min_rank in sides:
        dims = _dims(value)
        if dims is None:
            continue
        if len(dims) < min_rank:
            axes = "a batch axis 0" if min_rank == 1 else "a batch axis 0 and a sequence axis 1"
            site.report(
                "scan8-batch",
                f"{role}, {_named(value)}, has rank {len(dims)}, but Scan-8 needs {axes}.",
                "" if min_rank == 1 else "The sequence axis or scan axis is required to be 1.",
            )
        elif dims[0] is not None:
            batch.append((role, value, dims[0]))
    if len({size for *_, size in batch}) > 1:
        listed = "; ".join(f"{role} {_named(v)}: {size}" for role, v, size in batch)
        site.report(
            "scan8-batch",
            f"the batch sizes differ: {listed}.",
            "When multiple scan_input tensors are used, they must all have the same batch-size",
        )


def _check_scan8_sequence_lens(site: _Site, layout: _ScanLayout) -> None:
    value = layout.sequence_lens
    if value is None:
        return
    name, dims = _type_str(value), _dims(value)
    if name is not None and name != "tensor(int64)":
        site.report(
            "scan8-sequence-lens",
            f"sequence_lens, {_named(value)}, is of type {name}, not tensor(int64).",
            "I in ( tensor(int64) ): Int64 tensor",
            "Scan-8, type constraints",
        )
    if dims is None:
        return
    if len(dims) != 1:
        site.report(
            "scan8-sequence-lens", f"sequence_lens, {_named(value)}, has rank {len(dims)}, not 1."
        )
        return
    batches = {d[0] for d in map(_dims, layout.scans) if d and d[0] is not None}
    if dims[0] is not None and batches and dims[0] not in batches:
        site.report(
            "scan8-sequence-lens",
            f"sequence_lens, {_named(value)}, has {dims[0]} entries, but the batch size is "
            f"{min(batches)}.",
        )


def _check_scan_body_arity(site: _Site, layout: _ScanLayout) -> bool:
    body, n, m = layout.body, layout.n, layout.m
    outputs = len(site.node.outputs)
    fine = True
    if len(body.inputs) != n + m:
        site.report(
            "scan-body-inputs",
            f"the body has {_n(len(body.inputs), 'input')}, but the node has "
            f"{_n(n, 'state variable')} and {_n(m, 'scan input')}: N+M = {n + m}.",
        )
        fine = False
    if outputs < n:
        site.report(
            "scan-outputs",
            f"the node has {_n(outputs, 'output')}, fewer than its {_n(n, 'state variable')}.",
        )
        return False
    if len(body.outputs) != outputs:
        site.report(
            "scan-body-outputs",
            f"the body has {_n(len(body.outputs), 'output')}, but the node has {outputs}: "
            f"{_n(n, 'state variable')} and {_n(outputs - n, 'scan output')}, N+K = {outputs}.",
        )
        fine = False
    return fine


def _check_scan_state(site: _Site, layout: _ScanLayout) -> None:
    """Each state variable: one type, and one shape where known, at all four places."""
    body, batch = layout.body, site.version.batch_axis
    for i in range(layout.n):
        sides = [
            ("node input", layout.init[i]),
            ("body input", body.inputs[i]),
            ("body output", body.outputs[i]),
            ("node output", layout.finals[i]),
        ]
        _check_same_type(site, "scan-carried-type", f"state variable {i}", sides)
        shapes = []
        for where, value in sides:
            dims = _dims(value)
            if dims is not None and batch and where.startswith("node"):
                dims = _without(dims, [0])
            if dims is not None:
                shapes.append((where, value, dims))
        why = _conflict([dims for *_, dims in shapes])
        if why:
            per_step = " (without the batch axis)" if batch else ""
            listed = "; ".join(f"{where} {v.name!r}: {_text(d)}" for where, v, d in shapes)
            site.report(
                "scan-carried-shape",
                f"state variable {i} changes shape{per_step}, {why}: {listed}.",
            )


def _check_scan_elements(site: _Site, layout: _ScanLayout) -> None:
    """Each body scan input and output is its node value without the scan (and batch) axes."""
    body, batch = layout.body, site.version.batch_axis
    for j, value in enumerate(layout.scans):
        axes = [0, 1] if batch else _valid_axes(site, layout.input_axes, j, _dims(value))
        _check_element(
            site, "scan-input-element", f"scan input {j}", value, body.inputs[layout.n + j], axes
        )
    for k, value in enumerate(layout.scan_outs):
        axes = [0, 1] if batch else _valid_axes(site, layout.output_axes, k, _dims(value))
        _check_element(
            site, "scan-output-element", f"scan output {k}", value, body.outputs[layout.n + k], axes
        )


def _valid_axes(site: _Site, axes: list[int], i: int, dims: Dims | None) -> list[int] | None:
    axis = _axis(site, axes[i], dims) if i < len(axes) else None
    return None if axis is None else [axis]


def _check_element(
    site: _Site,
    rule: str,
    what: str,
    outer: ir.Value | None,
    inner: ir.Value,
    axes: list[int] | None,
) -> None:
    outer_type, inner_type = _type_str(outer), _type_str(inner)
    if outer_type and inner_type and outer_type != inner_type:
        site.report(
            rule,
            f"{what} is {outer_type} at the node ({_named(outer)}) but {inner_type} in the body "
            f"({inner.name!r}).",
        )
        return
    outer_dims, inner_dims = _dims(outer), _dims(inner)
    if outer_dims is None or inner_dims is None:
        return
    drop = 2 if site.version.batch_axis else 1
    if len(outer_dims) < drop:
        return  # no scan axis to drop: scan8-batch (or scan-axis-range) says so
    if len(outer_dims) != len(inner_dims) + drop:
        site.report(
            rule,
            f"{what} has rank {len(outer_dims)} at the node ({_named(outer)}), so rank "
            f"{len(outer_dims) - drop} per iteration, but rank {len(inner_dims)} in the body "
            f"({inner.name!r}).",
        )
        return
    per_step = _without(outer_dims, axes or [])
    if axes and per_step is not None and _conflict([per_step, inner_dims]):
        site.report(
            rule,
            f"{what} has shape {_text(outer_dims)} at the node ({_named(outer)}), which is "
            f"{_text(per_step)} per iteration, but {_text(inner_dims)} in the body "
            f"({inner.name!r}).",
        )


# --- Loop -----------------------------------------------------------------------------------


def _lint_loop(site: _Site) -> None:
    if not _check_attributes(site, {"body": "GRAPH"}):
        return
    _check_arity(site)
    node, body = site.node, site.node.attributes["body"].as_graph()
    inputs = list(node.inputs)
    trip_count, cond = [*inputs, None, None][:2]
    _check_scalar(site, "loop-trip-count", "M, the trip count", trip_count, "int64")
    _check_scalar(site, "loop-condition", "cond, the condition", cond, "bool")
    init, n = inputs[2:], max(len(inputs) - 2, 0)
    finals, scan_outs = list(node.outputs[:n]), list(node.outputs[n:])
    for i, value in enumerate(init):
        if value is None:
            site.report(
                "loop-omitted-input",
                f"initial carried value {i} is omitted (its name is empty), but only optional "
                f"inputs may be, and {_optional_inputs(site)}: the body's carried value {i} "
                f"needs a value for the first iteration.",
            )
    _check_types(
        site,
        [
            *((f"initial carried value {i}", v) for i, v in enumerate(init)),
            *((f"final carried value {i}", v) for i, v in enumerate(finals)),
            *((f"scan output {k}", v) for k, v in enumerate(scan_outs)),
        ],
    )
    _check_loop_ends(site, trip_count, cond, body)
    if not _check_loop_body_arity(site, body, n):
        return
    _check_scalar(
        site, "loop-body-iteration", "the body's iteration number", body.inputs[0], "int64"
    )
    _check_scalar(site, "loop-body-condition", "the body's condition input", body.inputs[1], "bool")
    _check_scalar(
        site, "loop-body-condition", "the body's condition output", body.outputs[0], "bool"
    )
    for i in range(n):
        sides = [
            ("node input", init[i]),
            ("body input", body.inputs[2 + i]),
            ("body output", body.outputs[1 + i]),
            ("node output", finals[i]),
        ]
        _check_same_type(site, "loop-carried-type", f"carried value {i}", sides)
    for k, outer in enumerate(scan_outs):
        _check_loop_scan_output(site, k, outer, body.outputs[1 + n + k])


def _check_loop_ends(
    site: _Site, trip_count: ir.Value | None, cond: ir.Value | None, body: ir.Graph
) -> None:
    """A Loop without M ends only through its condition: it must have one, which its body can
    change."""
    if trip_count is not None:
        return
    if cond is None:
        site.report(
            "loop-never-ends",
            "M and cond are both omitted: the loop has no trip count and ignores the condition "
            "its body yields, so it never ends. The specification allows it, but no run of it "
            "can finish; give it M or cond.",
        )
    elif (
        len(body.inputs) >= 2 and body.outputs and _passes_through(body.outputs[0], body.inputs[1])
    ):
        site.report(
            "loop-never-ends",
            f"M is omitted and the body yields its condition input, {body.inputs[1].name!r}, "
            f"unchanged as its condition, {body.outputs[0].name!r}: once cond is true, the "
            f"loop never ends.",
            "input (“”, cond) // Note this is analogous to a while loop bool cond = …; for (int "
            "i=0; cond; ++i) { cond = …; }",
        )


def _passes_through(output: ir.Value, value: ir.Value) -> bool:
    """Whether ``output`` is ``value``, directly or through Identity nodes."""
    seen = 0
    while output is not value and seen < 1000:
        producer = output.producer()
        if producer is None or producer.op_type != "Identity" or not producer.inputs:
            return False
        if producer.domain not in _DEFAULT_DOMAINS or producer.inputs[0] is None:
            return False
        output, seen = producer.inputs[0], seen + 1
    return output is value


def _check_loop_body_arity(site: _Site, body: ir.Graph, n: int) -> bool:
    outputs = len(site.node.outputs)
    fine = True
    if len(body.inputs) != 2 + n:
        site.report(
            "loop-body-inputs",
            f"the body has {_n(len(body.inputs), 'input')}, but the node has "
            f"{_n(n, 'carried value')}: 2+N = {2 + n}.",
        )
        fine = False
    if outputs < n:
        site.report(
            "loop-outputs",
            f"the node has {_n(outputs, 'output')}, fewer than its {_n(n, 'carried value')}.",
        )
        return False
    if len(body.outputs) != 1 + outputs:
        site.report(
            "loop-body-outputs",
            f"the body has {_n(len(body.outputs), 'output')}, but the node has "
            f"{_n(n, 'carried value')} and {_n(outputs - n, 'scan output')}: "
            f"1+N+K = {1 + outputs}.",
        )
        fine = False
    return fine


def _check_loop_scan_output(site: _Site, k: int, outer: ir.Value, inner: ir.Value) -> None:
    inner_type = _type_str(inner)
    if inner_type is not None and not isinstance(inner.type, ir.TensorType):
        site.report(
            "loop-scan-output",
            f"scan output {k} is {inner_type} in the body ({inner.name!r}), not a tensor.",
            "Scan outputs must be Tensors.",
            "Loop-16, output v_final_and_scan_outputs",
        )
        return
    outer_type = _type_str(outer)
    if outer_type and inner_type and outer_type != inner_type:
        site.report(
            "loop-scan-output",
            f"scan output {k} is {outer_type} at the node ({outer.name!r}) but {inner_type} in "
            f"the body ({inner.name!r}).",
        )
        return
    outer_dims, inner_dims = _dims(outer), _dims(inner)
    if outer_dims is None or inner_dims is None:
        return
    if len(outer_dims) != len(inner_dims) + 1 or _conflict([outer_dims[1:], inner_dims]):
        site.report(
            "loop-scan-output",
            f"scan output {k} has shape {_text(outer_dims)} at the node ({outer.name!r}), which "
            f"does not stack {_text(inner_dims)} from the body ({inner.name!r}) on a new axis 0.",
        )
