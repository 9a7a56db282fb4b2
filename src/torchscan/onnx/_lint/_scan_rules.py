"""The rules of ``Scan``, on a node whose inputs and outputs are first sorted into what they are
to the loop (a :class:`_ScanLayout`): ``num_scan_inputs``, no omitted input, the lengths and
values of the axes and directions lists, axes within the ranks of their tensors, one length for
all scan inputs, Scan-8's batch axis and ``sequence_lens``, the arity of the body, and the state
variables, scan inputs and scan outputs at the node and in the body.
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from torchscan.onnx import _opsets
from torchscan.onnx._lint._rules import RULES, _n
from torchscan.onnx._lint._shared_rules import (
    _check_arity,
    _check_attributes,
    _check_same_type,
    _check_types,
    _optional_inputs,
)
from torchscan.onnx._lint._site import (
    Dims,
    _conflict,
    _dims,
    _named,
    _Site,
    _text,
    _type_str,
    _without,
)


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
            element_dims = _dims(elements[i]) if dims is None and i < len(elements) else None
            if element_dims is not None:
                dims, element = (None, *element_dims), elements[i]
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
        if axis is not None and dims is not None and dims[axis] is not None:
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
