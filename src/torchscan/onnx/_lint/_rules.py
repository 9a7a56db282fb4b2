"""The rules of the specifications of ``Scan``, ``Loop`` and ``If`` that the lint applies, and the
words it quotes them in: each rule has an id, a one-line summary and the sentence of the
specification it comes from; ``RULES`` lists them, and ``docs/check.md`` documents them in the table
:func:`markdown_rules` writes. A finding quotes its rule's sentence or, where the specification
says more than the rule's sentence, a text of ``onnx.defs`` (an attribute's description, a type
constraint) in the words the specification pages print it in.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Sequence

import onnx.defs

from torchscan.onnx import _opsets


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
    Rule(
        "if-branch-shapes",
        "before opset 11 (If-1), the two branches of an If give each output one shape",
        "The return values in the `then_branch` and `else_branch` must be of the same shape and "
        "same data type.",
        "If-1, outputs",
    ),
    Rule(
        "if-output-shape",
        "from opset 11, the shape given to an If's output is compatible with both branches'",
        "If corresponding outputs from the then-branch and the else-branch have static shapes S1 "
        "and S2, then the shape of the corresponding output variable of the if-node (if present) "
        "must be compatible with both S1 and S2 as it represents the union of both possible "
        "shapes.",
        "If-11, outputs",
    ),
)


RULES: dict[str, Rule] = {rule.id: rule for rule in _RULES}
"""Every rule the lint applies, by id."""


def markdown_rules() -> str:
    """The table of rules in ``docs/check.md``; a test keeps the page current."""
    rows = ["| rule | what it checks |", "| --- | --- |"]
    rows += [f"| `{rule.id}` | {rule.summary} |" for rule in _RULES]
    return "\n".join(rows) + "\n"


# --- the words of the specification -----------------------------------------------------------


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


def _listing(items: Sequence[str]) -> str:
    if len(items) < 3:
        return " and ".join(items)
    return ", ".join(items[:-1]) + f" and {items[-1]}"


def _n(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")
