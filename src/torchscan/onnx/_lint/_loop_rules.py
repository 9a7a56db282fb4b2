"""The rules of ``Loop``: ``M`` and ``cond`` scalars of their element types, no omitted carried
value, a loop that can end, the arity of the body, the body's iteration number and condition, and
the carried values and scan outputs at the node and in the body.
"""

from __future__ import annotations

import onnx_ir as ir

from torchscan.onnx import _ir
from torchscan.onnx._lint._rules import _n
from torchscan.onnx._lint._shared_rules import (
    _check_arity,
    _check_attributes,
    _check_same_type,
    _check_scalar,
    _check_types,
    _optional_inputs,
)
from torchscan.onnx._lint._site import _conflict, _dims, _Site, _text, _type_str


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
        if not _ir.is_default_domain(producer.domain) or producer.inputs[0] is None:
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
