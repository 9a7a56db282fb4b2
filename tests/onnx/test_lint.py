"""The lint of Scan and Loop nodes: valid models at every opset, one broken model per rule."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto
from onnx import helper as oh

import torchscan.onnx
from torchscan.onnx import _lint

FLOAT, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
ROOT = Path(__file__).resolve().parents[2]


def info(name: str, elem: int = FLOAT, shape: tuple | None = (2,)) -> onnx.ValueInfoProto:
    return oh.make_tensor_value_info(name, elem, shape)


def model(nodes, inputs, outputs, opset: int) -> onnx.ModelProto:
    graph = oh.make_graph(nodes, "main", inputs, outputs)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])


def scan_model(
    opset: int = 16,
    *,
    elem: int = FLOAT,
    xs_shapes: tuple[tuple, ...] = ((3, 2),),
    body_inputs: list | None = None,
    body_outputs: list | None = None,
    outputs: list | None = None,
    **attributes,
) -> onnx.ModelProto:
    """``h, ys = scan(h + x)`` over ``len(xs_shapes)`` sequences: h (2,), x (2,) per step.

    At opset 8 every value gets Scan-8's batch axis of size 1 and the empty sequence_lens input.
    """
    batch = (1,) if opset < 9 else ()
    xs = [f"xs{j}" for j in range(len(xs_shapes))]
    body = oh.make_graph(
        [
            oh.make_node("Sum", ["h_in", *[f"x{j}" for j in range(len(xs))]], ["h_out"]),
            oh.make_node("Identity", ["h_out"], ["y"]),
        ],
        "body",
        body_inputs or [info("h_in", elem), *[info(f"x{j}", elem) for j in range(len(xs))]],
        body_outputs or [info("h_out", elem), info("y", elem)],
    )
    node_outputs = outputs if outputs is not None else ["hT", "ys"]
    attributes.setdefault("num_scan_inputs", len(xs))
    scan = oh.make_node(
        "Scan", ([""] if batch else []) + ["h0", *xs], node_outputs, body=body, **attributes
    )
    declared = {"hT": info("hT", elem, (*batch, 2)), "ys": info("ys", elem, (*batch, 3, 2))}
    return model(
        [scan],
        [
            info("h0", elem, (*batch, 2)),
            *[info(x, elem, (*batch, *s)) for x, s in zip(xs, xs_shapes, strict=True)],
        ],
        [declared.get(o, info(o, elem, None)) for o in node_outputs],
        opset,
    )


def loop_model(
    opset: int = 16,
    *,
    m: onnx.ValueInfoProto | None = None,
    cond: onnx.ValueInfoProto | None = None,
    body_inputs: list | None = None,
    body_outputs: list | None = None,
    ys: onnx.ValueInfoProto | None = None,
    carried: int = 1,
    **attributes,
) -> onnx.ModelProto:
    """``h, ys = loop(M, cond, h0)``: h doubles, ys stacks it; ``carried`` copies of h."""
    hs = [f"h{i}" for i in range(carried)]
    body = oh.make_graph(
        [
            oh.make_node("Identity", ["c_in"], ["c_out"]),
            *[oh.make_node("Add", [f"{h}_in", f"{h}_in"], [f"{h}_out"]) for h in hs],
            oh.make_node("Identity", ["h0_out"], ["y"]),
        ],
        "body",
        body_inputs
        or [info("i", INT64, ()), info("c_in", BOOL, ()), *[info(f"{h}_in") for h in hs]],
        body_outputs or [info("c_out", BOOL, ()), *[info(f"{h}_out") for h in hs], info("y")],
    )
    finals = [f"{h}_T" for h in hs]
    loop = oh.make_node("Loop", ["M", "cond", *hs], [*finals, "ys"], body=body, **attributes)
    return model(
        [loop],
        [m or info("M", INT64, ()), cond or info("cond", BOOL, ()), *[info(h) for h in hs]],
        [*[info(f) for f in finals], ys or info("ys", FLOAT, (None, 2))],
        opset,
    )


def findings(m: onnx.ModelProto) -> tuple[torchscan.onnx.Finding, ...]:
    return torchscan.onnx.check(m, runtimes=()).findings


@pytest.mark.parametrize("opset", range(8, 26), ids=lambda v: f"opset{v}")
@pytest.mark.parametrize("make", [scan_model, loop_model], ids=["scan", "loop"])
def test_a_valid_model_has_no_findings(make: Callable, opset: int) -> None:
    report = torchscan.onnx.check(make(opset), runtimes=())
    assert report.findings == ()
    assert report.ok


def nested_model(**attributes) -> onnx.ModelProto:
    """A Loop named 'outer' whose body holds a Scan named 'inner' over a sequence it builds."""
    inner = scan_model(16, **attributes).graph.node[0]
    outer = loop_model(16)
    body = outer.graph.node[0].attribute[0].g
    body.node.insert(0, oh.make_node("Expand", ["h0_in", "shape"], ["xs0"]))
    body.node.insert(1, oh.make_node("Identity", ["h0_in"], ["h0"]))
    body.initializer.append(oh.make_tensor("shape", INT64, (2,), [3, 2]))
    inner.input[:] = ["h0", "xs0"]
    inner.output[:] = ["hT", "ys_inner"]
    inner.name = "inner"
    body.node.insert(2, inner)
    outer.graph.node[0].name = "outer"
    return outer


def test_a_valid_nested_model_names_both_nodes() -> None:
    report = torchscan.onnx.check(nested_model(), runtimes=())
    assert report.findings == ()
    assert [(n.node, n.op) for n in report.nodes] == [
        ("Loop 'outer'", "Loop-16"),
        ("Loop 'outer' > body > Scan 'inner'", "Scan-16"),
    ]


def _retype(value: onnx.ValueInfoProto, elem: int) -> onnx.ValueInfoProto:
    value.type.tensor_type.elem_type = elem
    return value


def _sequence_loop() -> onnx.ModelProto:
    """A Loop carrying a sequence, which Loop-13 allows and Loop-11 does not."""
    seq = oh.make_tensor_sequence_value_info
    body = oh.make_graph(
        [
            oh.make_node("Identity", ["c_in"], ["c_out"]),
            oh.make_node("Identity", ["s_in"], ["s_out"]),
        ],
        "body",
        [info("i", INT64, ()), info("c_in", BOOL, ()), seq("s_in", FLOAT, None)],
        [info("c_out", BOOL, ()), seq("s_out", FLOAT, None)],
    )
    nodes = [
        oh.make_node("SequenceEmpty", [], ["s0"]),
        oh.make_node("Loop", ["M", "cond", "s0"], ["sT"], body=body),
    ]
    return model(
        nodes, [info("M", INT64, ()), info("cond", BOOL, ())], [seq("sT", FLOAT, None)], 11
    )


# Each case: the rule, a model that breaks it (and nothing else), and a piece of the message.
BROKEN: dict[str, tuple[Callable[[], onnx.ModelProto], str]] = {
    "scan-opset": (lambda: scan_model(7), "opset is 7, which has no Scan"),
    "scan-attribute": (
        lambda: scan_model(9, directions=[0]),
        "Scan-9 has no attribute 'directions'; it is an attribute of Scan-8",
    ),
    "scan-arity": (
        lambda: _scan_without_outputs(),
        "the node has 0 outputs, where Scan-16 takes 1 to 2147483647",
    ),
    "scan-num-scan-inputs": (
        lambda: scan_model(16, num_scan_inputs=3),
        "num_scan_inputs is 3, but there are 2 inputs to take them from",
    ),
    "scan-body-inputs": (
        lambda: scan_model(16, body_inputs=[info("h_in")]),
        "the body has 1 input, but the node has 1 state variable and 1 scan input: N+M = 2",
    ),
    "scan-body-outputs": (
        lambda: scan_model(16, body_outputs=[info("h_out"), info("y"), info("h_in")]),
        "the body has 3 outputs, but the node has 2",
    ),
    "scan-outputs": (
        lambda: scan_model(
            16,
            xs_shapes=((2,), (3, 2)),
            num_scan_inputs=1,
            body_inputs=[info("h_in"), info("x0"), info("x1")],
            outputs=["hT"],
        ),
        "the node has 1 output, fewer than its 2 state variables",
    ),
    "scan-list-length": (
        lambda: scan_model(16, scan_input_axes=[0, 0]),
        "scan_input_axes has 2 entries, but the node has 1 scan input (M = 1)",
    ),
    "scan-direction": (
        lambda: scan_model(16, scan_output_directions=[2]),
        "scan_output_directions[0] is 2: a direction is 0 or 1",
    ),
    "scan-axis-negative": (
        lambda: scan_model(9, scan_input_axes=[-2]),
        "scan_input_axes[0] is -2, but Scan-9 takes no negative axes; they came with Scan-11",
    ),
    "scan-axis-range": (
        lambda: scan_model(11, scan_input_axes=[2]),
        "scan_input_axes[0] is 2, outside [-2, 1]: scan input 0, 'xs0', has rank 2",
    ),
    "scan-sequence-length": (
        lambda: scan_model(16, xs_shapes=((3, 2), (4, 2))),
        "the scan inputs differ in length: scan input 0, 'xs0': 3; scan input 1, 'xs1': 4",
    ),
    "scan-element-type": (
        lambda: scan_model(13, elem=TensorProto.BFLOAT16),
        "initial state variable 0, 'h0', is of type tensor(bfloat16), which Scan-11 (in force at "
        "opset 13) does not allow; the first opset that allows it is 16",
    ),
    "scan-carried-type": (
        lambda: scan_model(16, body_outputs=[info("h_out", TensorProto.DOUBLE), info("y")]),
        "state variable 0 changes type: node input 'h0': tensor(float); body input 'h_in': "
        "tensor(float); body output 'h_out': tensor(double); node output 'hT': tensor(float)",
    ),
    "scan-carried-shape": (
        lambda: scan_model(16, body_outputs=[info("h_out", FLOAT, (3,)), info("y")]),
        "state variable 0 changes shape, sizes 2, 3 on axis 0",
    ),
    "scan-input-element": (
        lambda: scan_model(16, body_inputs=[info("h_in"), info("x0", FLOAT, (3, 2))]),
        "scan input 0 has rank 2 at the node ('xs0'), so rank 1 per iteration, but rank 2 in the "
        "body ('x0')",
    ),
    "scan-output-element": (
        lambda: scan_model(16, body_outputs=[info("h_out"), info("y", FLOAT, (5,))]),
        "scan output 0 has shape [3, 2] at the node ('ys'), which is [2] per iteration, but [5] "
        "in the body ('y')",
    ),
    "scan8-batch": (
        lambda: scan_model(8, xs_shapes=((),), body_inputs=[info("h_in"), info("x0", FLOAT, None)]),
        "scan input 0, 'xs0', has rank 1, but Scan-8 needs a batch axis 0 and a sequence axis 1",
    ),
    "scan8-sequence-lens": (
        lambda: _with_sequence_lens(TensorProto.INT32),
        "sequence_lens, 'lens', is of type tensor(int32), not tensor(int64)",
    ),
    "loop-attribute": (
        lambda: loop_model(16, num_scan_inputs=1),
        "Loop-16 has no attribute 'num_scan_inputs'",
    ),
    "loop-arity": (
        lambda: _loop_without_carried(9),
        "the node has 2 inputs, where Loop-1 takes 3 to 2147483647",
    ),
    "loop-trip-count": (
        lambda: loop_model(16, m=info("M", TensorProto.INT32, ())),
        "M, the trip count, 'M', is of type tensor(int32), not tensor(int64)",
    ),
    "loop-condition": (
        lambda: loop_model(16, cond=info("cond", BOOL, (1,))),
        "cond, the condition, 'cond', has shape [1], not a scalar",
    ),
    "loop-body-inputs": (
        lambda: loop_model(16, body_inputs=[info("i", INT64, ()), info("c_in", BOOL, ())]),
        "the body has 2 inputs, but the node has 1 carried value: 2+N = 3",
    ),
    "loop-body-outputs": (
        lambda: loop_model(16, body_outputs=[info("c_out", BOOL, ()), info("h0_out")]),
        "the body has 2 outputs, but the node has 1 carried value and 1 scan output: 1+N+K = 3",
    ),
    "loop-outputs": (
        lambda: _loop_with_outputs(["h0_T"], carried=2),
        "the node has 1 output, fewer than its 2 carried values",
    ),
    "loop-body-iteration": (
        lambda: loop_model(
            16,
            body_inputs=[info("i", TensorProto.INT32, ()), info("c_in", BOOL, ()), info("h0_in")],
        ),
        "the body's iteration number, 'i', is of type tensor(int32), not tensor(int64)",
    ),
    "loop-body-condition": (
        lambda: loop_model(16, body_outputs=[info("c_out", FLOAT, ()), info("h0_out"), info("y")]),
        "the body's condition output, 'c_out', is of type tensor(float), not tensor(bool)",
    ),
    "loop-element-type": (
        _sequence_loop,
        "initial carried value 0, 's0', is of type seq(tensor(float)), which Loop-11 (in force at "
        "opset 11) does not allow; the first opset that allows it is 13",
    ),
    "loop-carried-type": (
        lambda: loop_model(
            16,
            body_outputs=[info("c_out", BOOL, ()), info("h0_out", TensorProto.DOUBLE), info("y")],
        ),
        "carried value 0 changes type",
    ),
    "loop-scan-output": (
        lambda: loop_model(16, ys=info("ys", FLOAT, (None, 3))),
        "scan output 0 has shape [?, 3] at the node ('ys'), which does not stack [2] from the body "
        "('y') on a new axis 0",
    ),
}


def _scan_without_outputs() -> onnx.ModelProto:
    body = oh.make_graph([], "body", [info("x0")], [])
    scan = oh.make_node("Scan", ["xs0"], [], body=body, num_scan_inputs=1)
    return model([scan], [info("xs0", FLOAT, (3, 2))], [], 16)


def _with_sequence_lens(elem: int) -> onnx.ModelProto:
    m = scan_model(8)
    m.graph.node[0].input[0] = "lens"
    m.graph.input.append(info("lens", elem, (1,)))
    return m


def _loop_without_carried(opset: int) -> onnx.ModelProto:
    body = oh.make_graph(
        [
            oh.make_node("Identity", ["c_in"], ["c_out"]),
            oh.make_node("Cast", ["i"], ["y"], to=FLOAT),
        ],
        "body",
        [info("i", INT64, ()), info("c_in", BOOL, ())],
        [info("c_out", BOOL, ()), info("y", FLOAT, ())],
    )
    loop = oh.make_node("Loop", ["M", "cond"], ["ys"], body=body)
    inputs = [info("M", INT64, ()), info("cond", BOOL, ())]
    return model([loop], inputs, [info("ys", FLOAT, (None,))], opset)


def _loop_with_outputs(outputs: list[str], carried: int) -> onnx.ModelProto:
    m = loop_model(16, carried=carried)
    m.graph.node[0].output[:] = outputs
    del m.graph.output[:]
    m.graph.output.extend(info(o) for o in outputs)
    return m


@pytest.mark.parametrize("rule", sorted(BROKEN))
def test_a_broken_model_is_reported_under_its_rule(rule: str) -> None:
    make, message = BROKEN[rule]
    found = findings(make())
    assert {f.rule for f in found} == {rule}, "\n".join(map(str, found))
    assert any(message in f.message for f in found), "\n".join(f.message for f in found)
    assert all(f.spec and f.source and f.node and f.op for f in found)


def test_every_rule_has_a_broken_model() -> None:
    assert sorted(BROKEN) == sorted(_lint.RULES)


def test_a_finding_names_the_node_the_rule_and_quotes_the_spec() -> None:
    (finding,) = findings(scan_model(11, scan_input_axes=[2]))
    assert finding == torchscan.onnx.Finding(
        node="Scan #0",
        op="Scan-11",
        rule="scan-axis-range",
        message="scan_input_axes[0] is 2, outside [-2, 1]: scan input 0, 'xs0', has rank 2.",
        spec="Accepted range is [-r, r-1] where r = rank(input).",
        source="Scan-11, attribute scan_input_axes",
    )
    assert str(finding) == (
        "Scan #0 (Scan-11) [scan-axis-range]: scan_input_axes[0] is 2, outside [-2, 1]: scan "
        "input 0, 'xs0', has rank 2. Spec (Scan-11, attribute scan_input_axes): “Accepted range "
        "is [-r, r-1] where r = rank(input).”"
    )


def test_a_broken_scan_in_a_loop_body_is_named_by_its_path() -> None:
    (finding,) = findings(nested_model(scan_input_directions=[3]))
    assert finding.node == "Loop 'outer' > body > Scan 'inner'"
    assert finding.rule == "scan-direction"


def test_negative_axes_are_accepted_from_scan_11() -> None:
    assert findings(scan_model(11, scan_input_axes=[-2], scan_output_axes=[-2])) == ()


def test_an_axis_out_of_range_on_an_output_is_read_from_the_body() -> None:
    m = scan_model(16, scan_output_axes=[-3])
    m.graph.output[1].type.tensor_type.ClearField("shape")
    (finding,) = findings(m)
    assert finding.rule == "scan-axis-range"
    assert "scan_output_axes[0] is -3, outside [-2, 1]" in finding.message


def test_an_optional_carried_value_may_carry_its_element() -> None:
    opt = oh.make_tensor_sequence_value_info("x", FLOAT, None)
    optional_seq = oh.make_value_info("o_in", oh.make_optional_type_proto(opt.type))
    seq = oh.make_tensor_sequence_value_info
    body = oh.make_graph(
        [
            oh.make_node("Identity", ["c_in"], ["c_out"]),
            oh.make_node("SequenceEmpty", [], ["s_out"]),
        ],
        "body",
        [info("i", INT64, ()), info("c_in", BOOL, ()), optional_seq],
        [info("c_out", BOOL, ()), seq("s_out", FLOAT, None)],
    )
    nodes = [
        oh.make_node("Optional", [], ["o0"], type=opt.type),
        oh.make_node("Loop", ["M", "cond", "o0"], ["sT"], body=body),
    ]
    m = model(nodes, [info("M", INT64, ()), info("cond", BOOL, ())], [seq("sT", FLOAT, None)], 16)
    assert findings(m) == ()


def test_an_opset_newer_than_the_table_is_linted_with_a_note() -> None:
    report = torchscan.onnx.check(scan_model(27), runtimes=())
    assert report.findings == ()
    assert report.nodes[0].op == "Scan-25"
    assert report.notes == (
        "opset 27 is outside the opsets torchscan exports to (8 to 25); onnx.defs puts Scan-25 in "
        "force there, and its rules are applied",
    )


def test_docs_list_every_rule() -> None:
    page = (ROOT / "docs" / "check.md").read_text()
    generated = page.split("<!-- rule-table", 1)[1].split("-->", 1)[1]
    generated = generated.split("<!-- end of rule-table -->", 1)[0]
    assert generated.strip() == _lint.markdown_rules().strip()


def test_scan8_batch_sizes_must_agree() -> None:
    m = scan_model(8)
    m.graph.input[1].type.tensor_type.shape.dim[0].dim_value = 2
    (finding,) = findings(m)
    assert (finding.rule, finding.message, finding.spec) == (
        "scan8-batch",
        "the batch sizes differ: initial state variable 0 'h0': 1; scan input 0 'xs0': 2; final "
        "state variable 0 'hT': 1; scan output 0 'ys': 1.",
        "When multiple scan_input tensors are used, they must all have the same batch-size",
    )
