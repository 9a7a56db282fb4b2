"""Moving work out of loop bodies that does not need to be there.

An RNN step computes ``x_t @ W_ih + b`` from the sequence alone, and ``h @ W_hh`` from the
carried state. Run inside a ``Scan``, the first is one small matrix product per step; run once
over the whole sequence, it is one large product, which is what cuDNN and onnxruntime's own RNN
kernels do. This pass finds, in every ``Scan`` and ``Loop`` body:

* work that reads only values from outside the loop (a weight's transpose, constants): it is
  computed once, before the loop;
* in a ``Scan``, work that reads the scanned elements and outside values but no carried state:
  it is computed for every step at once, on the whole sequence, before the ``Scan``, and the
  results become new scanned inputs. The time axis stays where the sequence has it, so no
  transpose is added: the new inputs are scanned along the same axis, in the same direction.

Results are the same up to floating-point rounding (a batched matrix product may sum in another
order). The pass changes nothing it does not know how to batch: an operator is batched only when
adding a leading time axis to its per-step inputs gives the per-step results stacked. Nor does it
give a ``Scan`` a new input of an element type that the ``Scan`` version in force at the target
opset does not allow (a per-step cast to bfloat16 stays in the body below opset 16).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import onnx_ir as ir

from torchscan._errors import TorchscanValueError
from torchscan._hoist import _policy
from torchscan.onnx import _ir, _opsets

# Operators applied element by element, with numpy broadcasting between their inputs.
_ELEMENTWISE = frozenset(
    {
        "Abs", "Acos", "Acosh", "Add", "And", "Asin", "Asinh", "Atan", "Atanh", "BitwiseAnd",
        "BitwiseNot", "BitwiseOr", "BitwiseXor", "Cast", "CastLike", "Ceil", "Celu", "Clip",
        "Cos", "Cosh", "Div", "Elu", "Equal", "Erf", "Exp", "Floor", "Gelu", "Greater",
        "GreaterOrEqual", "HardSigmoid", "HardSwish", "Identity", "IsInf", "IsNaN",
        "LeakyRelu", "Less", "LessOrEqual", "Log", "Max", "Mean", "Min", "Mish", "Mod", "Mul",
        "Neg", "Not", "Or", "Pow", "PRelu", "Reciprocal", "Relu", "Round", "Selu", "Sigmoid",
        "Sign", "Sin", "Sinh", "Softplus", "Softsign", "Sqrt", "Sub", "Sum", "Tan", "Tanh",
        "ThresholdedRelu", "Where", "Xor",
    }
)  # fmt: skip


def hoist_loop_invariants(model: ir.Model, *, target_opset: int | None = None) -> int:
    """Move loop-invariant and per-step work out of every Scan and Loop body of ``model``, in
    place. Returns how many body nodes were moved or batched.

    ``target_opset`` is the default-domain opset the model is meant for (the model's own by
    default): no Scan or Loop gets an input or output of an element type its version there does
    not allow."""
    if target_opset is None:
        target_opset = _ir.default_opset(model.opset_imports)
        if target_opset is None:
            raise TorchscanValueError("the model imports no default-domain opset")
    # An opset newer than the version table allows at least what its newest entry allows.
    opset = min(target_opset, _opsets.MAX_OPSET)
    allowed = {
        "Scan": _opsets.scan_version(opset).element_types,
        "Loop": _opsets.loop_version(opset).element_types,
    }
    names = _ir.Names.of(model.graph)
    return _visit(model.graph, names, allowed)


def _visit(graph: ir.Graph, names: _ir.Names, allowed: dict[str, frozenset[ir.DataType]]) -> int:
    moved = 0
    for node in list(graph):
        for attribute in node.attributes.values():
            if attribute.type == ir.AttributeType.GRAPH:
                moved += _visit(attribute.as_graph(), names, allowed)
        if node.domain in _ir.DEFAULT_DOMAINS and node.op_type in ("Scan", "Loop"):
            moved += _hoist(graph, node, names, allowed[node.op_type])
    return moved


def drop_unread_sequences(graph: ir.Graph) -> int:
    """Remove, from every Scan (version 9 on) in ``graph`` and its subgraphs, the scanned inputs
    that its body no longer reads once the optimizer has simplified it (a shape read from a
    sequence whose work was moved out, then folded). A Scan keeps at least one, which counts its
    steps. Returns how many were removed."""
    removed = 0
    for node in list(graph):
        for attribute in node.attributes.values():
            if attribute.type == ir.AttributeType.GRAPH:
                removed += drop_unread_sequences(attribute.as_graph())
        if not (node.domain in _ir.DEFAULT_DOMAINS and node.op_type == "Scan"):
            continue
        if "directions" in node.attributes or "num_scan_inputs" not in node.attributes:
            continue  # Scan-8: a batch axis and sequence_lens, left as they are
        body = node.attributes["body"].as_graph()
        n_scanned = node.attributes["num_scan_inputs"].as_int()
        n_state = len(body.inputs) - n_scanned
        elements = list(body.inputs[n_state:])
        keep = [
            i for i, element in enumerate(elements) if element.uses() or element in body.outputs
        ] or [n_scanned - 1]
        if len(keep) == n_scanned:
            continue
        _set_scanned(
            node,
            body,
            list(node.inputs),
            n_state,
            keep,
            _ints(node, "scan_input_axes", [0] * n_scanned),
            _ints(node, "scan_input_directions", [0] * n_scanned),
        )
        removed += n_scanned - len(keep)
    return removed


# -- classification ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Step:
    """A value that changes with the step but not through the carried state: batchable. Its
    sequence over all steps has the time axis at ``axis`` and is scanned in ``direction``."""

    direction: int
    axis: int


# The kinds of _policy: a value of the carry's depends on the carried state (or cannot be moved);
# a constant's is the same at every step; a sequence's is a _Step, with its layout.
_VARYING = _policy.Kind.CARRY
_OUTSIDE = _policy.Kind.CONSTANT


def _hoist(
    graph: ir.Graph, loop: ir.Node, names: _ir.Names, allowed: frozenset[ir.DataType]
) -> int:
    body = loop.attributes["body"].as_graph()
    # A per-step value the rest of the body reads becomes a new scanned input: where its element
    # type is one the loop does not take (or is unknown), its node stays in the body, and the
    # classification is redone without it.
    kept: set[ir.Node] = set()
    while True:
        kinds, invariant, per_step = _classify_body(loop, body, kept)
        refused = [
            producer
            for v in _frontier(body, per_step)
            if v.dtype not in allowed and (producer := v.producer()) is not None
        ]
        if not refused:
            break
        kept.update(refused)

    for node in invariant:
        _keep_outputs_in_body(body, node, names)
        body.remove(node)
        graph.insert_before(loop, node)
    moved = len(invariant)
    if per_step:
        moved += _batch_steps(graph, loop, body, per_step, kinds, names)
    return moved


def _classify_body(
    loop: ir.Node, body: ir.Graph, kept: set[ir.Node]
) -> tuple[dict[ir.Value, object], list[ir.Node], list[ir.Node]]:
    """The kind of every value of ``body``, its invariant nodes and its per-step nodes; the
    nodes in ``kept`` count as varying."""
    kinds: dict[ir.Value, object] = {}
    if loop.op_type == "Scan":
        n_scanned = loop.attributes["num_scan_inputs"].as_int()
        n_state = len(body.inputs) - n_scanned
        directions = _ints(loop, "scan_input_directions", [0] * n_scanned)
        axes = _ints(loop, "scan_input_axes", [0] * n_scanned)
        for value in body.inputs[:n_state]:
            kinds[value] = _VARYING
        for value, sequence, direction, axis in zip(
            body.inputs[n_state:], loop.inputs[n_state:], directions, axes, strict=True
        ):
            rank = _rank(_given(sequence))
            kinds[value] = _VARYING if rank is None else _Step(direction, axis % rank)
    else:
        for value in body.inputs:  # iteration number, condition, carried values
            kinds[value] = _VARYING

    invariant, per_step = [], []
    for node in body:
        kind = _VARYING if node in kept else _classify(node, kinds, body)
        for output in node.outputs:
            kinds[output] = kind
        if kind is _OUTSIDE:
            invariant.append(node)
        elif isinstance(kind, _Step):
            per_step.append(node)
    return kinds, invariant, per_step


def _frontier(body: ir.Graph, per_step: list[ir.Node]) -> list[ir.Value]:
    """The per-step values that the body goes on reading, or emits: its new scanned inputs."""
    batched = set(per_step)
    return [
        v
        for v in (node.outputs[0] for node in per_step)
        if v in body.outputs or any(use.node not in batched for use in v.uses())
    ]


def _classify(node: ir.Node, kinds: dict[ir.Value, object], body: ir.Graph) -> object:
    if (
        node.domain not in _ir.DEFAULT_DOMAINS
        or node.op_type in _policy.RANDOM_ONNX_OPS
        or any(
            a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
            for a in node.attributes.values()
        )
    ):
        return _VARYING
    input_kinds = [_kind(v, kinds, body) for v in node.inputs]
    if _VARYING in input_kinds:
        return _VARYING
    steps = {k for k in input_kinds if isinstance(k, _Step)}
    if not steps:
        return _OUTSIDE
    if len(steps) > 1 or not _batchable(node, kinds):
        return _VARYING
    return steps.pop()


def _kind(value: ir.Value | None, kinds: dict[ir.Value, object], body: ir.Graph) -> object:
    if value is None:
        return _OUTSIDE
    if value in kinds:
        return kinds[value]
    # A constant of the body itself cannot leave with a node that reads it.
    return _VARYING if value.graph is body else _OUTSIDE


def _batchable(node: ir.Node, kinds: dict[ir.Value, object]) -> bool:
    """Whether giving the per-step inputs of ``node`` their time axis gives its results stacked
    along the same axis."""
    steps = [v for v in node.inputs if v is not None and isinstance(kinds.get(v), _Step)]
    if len(node.outputs) != 1 or node.outputs[0].shape is None:
        return False  # a value the body reads must be declared with its shape
    if any(_rank(v) is None for v in node.inputs if v is not None):
        return False
    first = kinds[steps[0]]
    assert isinstance(first, _Step)  # steps holds the inputs of a _Step kind
    axis = first.axis
    outside = [v for v in node.inputs if v is not None and v not in steps]
    rank = _known_rank(node.outputs[0])
    if node.op_type in _ELEMENTWISE:
        # Broadcasting aligns trailing axes: per-step inputs of the output's rank keep their
        # time axis together, and an outside input must not reach back to it.
        return all(_rank(v) == rank for v in steps) and all(
            _known_rank(v) <= rank - axis for v in outside
        )
    if node.op_type == "MatMul":
        a, b = node.inputs
        # The time axis may be a batch axis or the rows, never the summed axis.
        return (
            steps == [a]
            and _known_rank(a) >= 2
            and axis <= _known_rank(a) - 1
            and _known_rank(b) == 2
        )
    if node.op_type == "Gemm":
        c = node.inputs[2] if len(node.inputs) > 2 else None
        return (
            steps == [node.inputs[0]]
            and not _int_attribute(node, "transA", 0)
            and axis <= 1
            and (c is None or _known_rank(c) <= 2 - axis)
        )
    return node.op_type == "Transpose" and axis == 0


def _rank(value: ir.Value) -> int | None:
    return None if value.shape is None else value.shape.rank()


def _given(value: ir.Value | None) -> ir.Value:
    """An input that its operator requires (a Scan's sequences, a MatMul's operands)."""
    assert value is not None, "a required input is omitted"
    return value


def _known_rank(value: ir.Value | None) -> int:
    """The rank of an input or output whose rank is known (checked before)."""
    rank = _rank(_given(value))
    assert rank is not None, "a value of unknown rank"
    return rank


def _ints(node: ir.Node, name: str, default: list[int]) -> list[int]:
    attribute = node.attributes.get(name)
    return list(attribute.as_ints()) if attribute is not None else default


def _int_attribute(node: ir.Node, name: str, default: int) -> int:
    attribute = node.attributes.get(name)
    return attribute.as_int() if attribute is not None else default


def _float_attribute(node: ir.Node, name: str, default: float) -> float:
    attribute = node.attributes.get(name)
    return attribute.as_float() if attribute is not None else default


def _keep_outputs_in_body(body: ir.Graph, node: ir.Node, names: _ir.Names) -> None:
    """A body output that leaves the body with its node is passed on by an ``Identity``."""
    for output in node.outputs:
        if output in body.outputs:
            _output_through_identity(body, output, output, node.version, names)


def _output_through_identity(
    body: ir.Graph, output: ir.Value, source: ir.Value, version: int | None, names: _ir.Names
) -> None:
    """Make the body output ``output`` an ``Identity`` of ``source``: a body's outputs must be
    values of its own, and distinct."""
    copy = ir.node("Identity", [source], version=version)
    copy.outputs[0].name = names.fresh(f"{output.name}_out")
    copy.outputs[0].type, copy.outputs[0].shape = output.type, output.shape
    body.append(copy)
    for i, value in enumerate(body.outputs):
        if value is output:
            body.outputs[i] = copy.outputs[0]


# -- batching ----------------------------------------------------------------------------------


def _batch_steps(
    graph: ir.Graph,
    scan: ir.Node,
    body: ir.Graph,
    per_step: list[ir.Node],
    kinds: dict[ir.Value, object],
    names: _ir.Names,
) -> int:
    n_scanned = scan.attributes["num_scan_inputs"].as_int()
    n_state = len(body.inputs) - n_scanned
    axes = _ints(scan, "scan_input_axes", [0] * n_scanned)
    directions = _ints(scan, "scan_input_directions", [0] * n_scanned)
    sequences = [_given(v) for v in scan.inputs[n_state:]]
    elements = list(body.inputs[n_state:])

    # Every scanned element, as its whole sequence.
    batched: dict[ir.Value, ir.Value] = dict(zip(elements, sequences, strict=True))
    new_nodes: list[ir.Node] = []
    for node in per_step:
        made, output = _batched_node(node, batched, names)
        new_nodes.extend(made)
        batched[node.outputs[0]] = output

    # Values computed per step that the rest of the body reads become new scanned inputs.
    frontier = _frontier(body, per_step)
    graph_inputs = list(scan.inputs)
    for value in frontier:
        element = ir.Value(name=names.fresh(f"{value.name}_t"), type=value.type, shape=value.shape)
        for use in list(value.uses()):
            if use.node not in per_step:
                use.node.replace_input_with(use.idx, element)
        if value in body.outputs:
            _output_through_identity(body, value, element, scan.version, names)
        body.inputs.append(element)
        graph_inputs.append(batched[value])
        kind = kinds[value]
        assert isinstance(kind, _Step)  # the output of a per-step node
        axes.append(kind.axis)
        directions.append(kind.direction)

    for node in reversed(per_step):
        body.remove(node, safe=True)
    graph.insert_before(scan, new_nodes)

    # Drop the scanned inputs the body no longer reads; a Scan keeps at least one.
    keep = [
        i
        for i, element in enumerate(body.inputs[n_state:])
        if element.uses() or element in body.outputs
    ] or [len(body.inputs) - n_state - 1]
    _set_scanned(scan, body, graph_inputs, n_state, keep, axes, directions)
    _fold_into_gemm(graph, scan, body, names)
    return len(per_step)


def _fold_into_gemm(graph: ir.Graph, scan: ir.Node, body: ir.Graph, names: _ir.Names) -> None:
    """``Add(Gemm(h, W, c), x_t)`` per step, with ``x_t`` a scanned element, is ``Gemm(h, W,
    x_t + c)``: adding ``c`` once to the whole sequence saves an ``Add`` at every step. This is
    what a hoisted input projection next to the recurrent product looks like."""
    n_scanned = scan.attributes["num_scan_inputs"].as_int()
    n_state = len(body.inputs) - n_scanned
    for add in list(body):
        if add.op_type != "Add" or add.domain not in _ir.DEFAULT_DOMAINS:
            continue
        pair = _gemm_and_element(add, body, n_state)
        if pair is None:
            continue
        gemm, element = pair
        position = list(body.inputs[n_state:]).index(element)
        sequence_index = n_state + position
        sequence = _given(scan.inputs[sequence_index])
        c = gemm.inputs[2] if len(gemm.inputs) > 2 else None
        axis = _ints(scan, "scan_input_axes", [0] * n_scanned)[position] % 3
        c_rank = _rank(c) if c is not None else None
        if c is not None and (c_rank is None or c_rank > 2 - axis):
            continue  # c would not broadcast along the sequence as it does along one step
        if c is not None:
            beta = _float_attribute(gemm, "beta", 1.0)
            made = []
            if beta != 1.0:
                scale = ir.node("Constant", [], {"value": ir.tensor(beta, dtype=c.dtype)})
                c = ir.node("Mul", [c, scale.outputs[0]]).outputs[0]
                made += [scale, c.producer()]
            biased = _biased_sequence(sequence, scan)
            if biased is not None:
                # The sequence already ends with a bias: sum the two biases, a small Add, rather
                # than add a second one to every element of the sequence.
                add_node, bias_index = biased
                total = ir.node("Add", [add_node.inputs[bias_index], c])
                made.append(total)
                graph.insert_before(add_node, made)
                add_node.replace_input_with(bias_index, total.outputs[0])
            else:
                total = ir.node("Add", [sequence, c])
                made.append(total)
                graph.insert_before(scan, made)
                scan.replace_input_with(sequence_index, total.outputs[0])
            for node in made:
                node.outputs[0].name = names.fresh(f"{sequence.name}_with_bias")
        if len(gemm.inputs) < 3:
            gemm.resize_inputs(3)
        gemm.replace_input_with(2, element)
        gemm.attributes["beta"] = ir.AttrFloat32("beta", 1.0)
        _replace_value(body, add.outputs[0], gemm.outputs[0])
        body.remove(add, safe=True)


def _biased_sequence(sequence: ir.Value, scan: ir.Node) -> tuple[ir.Node, int] | None:
    """The ``Add`` that gives ``sequence`` its bias, and which of its inputs is the bias, when
    only the ``Scan`` reads the sum and the bias is a vector of its last axis."""
    add = sequence.producer()
    if add is None or add.op_type != "Add" or len(sequence.uses()) != 1:
        return None
    for index, bias in enumerate(add.inputs):
        if bias is not None and _rank(bias) == 1 and bias.producer() is not add:
            other = add.inputs[1 - index]
            if other is not None and _rank(other) == _rank(sequence):
                return add, index
    return None


def _gemm_and_element(
    add: ir.Node, body: ir.Graph, n_state: int
) -> tuple[ir.Node, ir.Value] | None:
    """The ``Gemm`` and the scanned element an ``Add`` sums, when folding them is exact."""
    elements = set(body.inputs[n_state:])
    for element, other in (add.inputs, reversed(add.inputs)):
        gemm = other.producer() if other is not None else None
        if element is None or other is None:  # never: both inputs of an Add are required
            continue
        if element not in elements or gemm is None or gemm.op_type != "Gemm":
            continue
        if len(element.uses()) != 1 or len(other.uses()) != 1 or other in body.outputs:
            continue
        if element.shape is None or other.shape is None or element.shape != other.shape:
            continue
        return gemm, element
    return None


def _replace_value(body: ir.Graph, old: ir.Value, new: ir.Value) -> None:
    for use in list(old.uses()):
        use.node.replace_input_with(use.idx, new)
    for i, output in enumerate(body.outputs):
        if output is old:
            new.name, old.name = old.name, None
            body.outputs[i] = new


def _set_scanned(scan, body, graph_inputs, n_state, keep, axes, directions) -> None:
    elements = list(body.inputs[n_state:])
    sequences = graph_inputs[n_state:]
    del body.inputs[n_state:]
    body.inputs.extend(elements[i] for i in keep)
    scan.resize_inputs(n_state + len(keep))
    for position, i in enumerate(keep):
        scan.replace_input_with(n_state + position, sequences[i])
    scan.attributes["num_scan_inputs"] = ir.AttrInt64("num_scan_inputs", len(keep))
    scan.attributes["scan_input_axes"] = ir.AttrInt64s("scan_input_axes", [axes[i] for i in keep])
    scan.attributes["scan_input_directions"] = ir.AttrInt64s(
        "scan_input_directions", [directions[i] for i in keep]
    )


def _batched_node(
    node: ir.Node, batched: dict[ir.Value, ir.Value], names: _ir.Names
) -> tuple[list[ir.Node], ir.Value]:
    """The nodes computing ``node`` for all steps at once, and their result."""
    inputs = [batched.get(v, v) if v is not None else None for v in node.inputs]
    base = names.fresh(f"{node.outputs[0].name}_seq")
    if node.op_type == "Gemm":
        return _batched_gemm(node, inputs, base, names)
    attributes = dict(node.attributes)
    if node.op_type == "Transpose":
        rank = _known_rank(node.inputs[0])
        perm = _ints(node, "perm", list(reversed(range(rank))))
        attributes["perm"] = ir.AttrInt64s("perm", [0] + [p + 1 for p in perm])
    copy = ir.Node(
        node.domain,
        node.op_type,
        inputs,
        attributes=list(attributes.values()),
        version=node.version,
    )
    copy.outputs[0].name = base
    if node.outputs[0].dtype is not None:  # else unknown, as a new value's is
        copy.outputs[0].dtype = node.outputs[0].dtype
    return [copy], copy.outputs[0]


def _batched_gemm(
    node: ir.Node, inputs: list[ir.Value | None], base: str, names: _ir.Names
) -> tuple[list[ir.Node], ir.Value]:
    """``Gemm`` takes matrices only: ``alpha * A @ B' + beta * C`` as MatMul, Mul and Add."""
    a, b, c = (*inputs, None)[:3]
    made = []

    def add(op: str, args: Sequence[ir.Value | None], **attributes) -> ir.Value:
        new = ir.node(op, args, attributes, version=node.version)
        new.outputs[0].name = names.fresh(f"{base}_{op.lower()}")
        made.append(new)
        return new.outputs[0]

    if _int_attribute(node, "transB", 0):
        b = add("Transpose", [b], perm=[1, 0])
    result = add("MatMul", [a, b])
    dtype = node.outputs[0].dtype
    alpha, beta = _float_attribute(node, "alpha", 1.0), _float_attribute(node, "beta", 1.0)
    if alpha != 1.0:
        result = add("Mul", [result, add("Constant", [], value=ir.tensor(alpha, dtype=dtype))])
    if c is not None:
        if beta != 1.0:
            c = add("Mul", [c, add("Constant", [], value=ir.tensor(beta, dtype=dtype))])
        result = add("Add", [result, c])
    made[-1].outputs[0].name = base
    made[-1].outputs[0].dtype = dtype
    return made, made[-1].outputs[0]
