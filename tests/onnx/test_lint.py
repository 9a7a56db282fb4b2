"""The lint of Scan and Loop nodes: valid models at every opset, one broken model per rule."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto
from onnx import helper as oh

import torchscan.onnx
from torchscan.onnx import _opsets
from torchscan.onnx._lint import _driver as _lint
from torchscan.onnx._lint import _rules

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
    "scan-omitted-input": (
        lambda: _with_input_omitted(scan_model(9), 0),
        "initial state variable 0 is omitted (its name is empty), but only optional inputs may "
        "be, and Scan-9 has none: each state variable needs an initial value, each scan input a "
        "tensor to scan.",
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
        "opset 13) does not allow: Scan-11 allows only tensors of 15 element types (bool, "
        "complex128, complex64, double, float, float16, int16, int32, int64, int8, string, uint16, "
        "uint32, uint64, uint8); the first opset that allows it is 16.",
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
    "loop-never-ends": (
        lambda: _with_input_omitted(_with_input_omitted(loop_model(16), 0), 1),
        "M and cond are both omitted: the loop has no trip count and ignores the condition its "
        "body yields, so it never ends. The specification allows it, but no run of it can "
        "finish; give it M or cond.",
    ),
    "loop-omitted-input": (
        lambda: _with_input_omitted(loop_model(16), 2),
        "initial carried value 0 is omitted (its name is empty), but only optional inputs may be, "
        "and the optional inputs of Loop-16 are M and cond: the body's carried value 0 needs a "
        "value for the first iteration.",
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
        "opset 11) does not allow: Loop-11 allows only tensors of 15 element types (bool, "
        "complex128, complex64, double, float, float16, int16, int32, int64, int8, string, uint16, "
        "uint32, uint64, uint8); the first opset that allows it is 13.",
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
    "if-branch-shapes": (
        lambda: if_model(9, then_shape=("n", 3), else_shape=(0, 3)),
        "output 'out' is [?, 3] in then_branch but [0, 3] in else_branch; shape inference keeps "
        "one of them for the output",
    ),
    "if-output-shape": (
        lambda: if_model(13, then_shape=(2,), else_shape=(3,), out_shape=(2,)),
        "output 'out' is given shape [2], but else_branch makes it [3]",
    ),
}


def if_model(
    opset: int, *, then_shape: tuple, else_shape: tuple, out_shape: tuple | None = None
) -> onnx.ModelProto:
    """A Scan (which the lint needs to find) and an If choosing between ``x`` itself (of
    ``then_shape``) and zeros of ``else_shape``, the If's output declared ``out_shape``."""
    zeros = oh.make_tensor("zeros", FLOAT, else_shape, [0.0] * _size(else_shape))
    then_branch = oh.make_graph(
        [oh.make_node("Identity", ["x"], ["from_x"])],
        "then",
        [],
        [info("from_x", FLOAT, then_shape)],
    )
    else_branch = oh.make_graph(
        [oh.make_node("Constant", [], ["zero"], value=zeros)],
        "else",
        [],
        [info("zero", FLOAT, else_shape)],
    )
    choice = oh.make_node("If", ["c"], ["out"], then_branch=then_branch, else_branch=else_branch)
    m = scan_model(opset)
    m.graph.node.append(choice)
    m.graph.input.extend([info("c", BOOL, ()), info("x", FLOAT, then_shape)])
    m.graph.output.append(info("out", FLOAT, out_shape))
    return m


def _size(shape: tuple) -> int:
    size = 1
    for n in shape:
        size *= n
    return size


def _with_input_omitted(m: onnx.ModelProto, index: int) -> onnx.ModelProto:
    """``m`` with input ``index`` of its node given as "" (and no longer a graph input)."""
    node = m.graph.node[0]
    name, node.input[index] = node.input[index], ""
    kept = [i for i in m.graph.input if i.name != name]
    del m.graph.input[:]
    m.graph.input.extend(kept)
    return m


def _scan_without_outputs() -> onnx.ModelProto:
    body = oh.make_graph([], "body", [info("x0")], [])
    scan = oh.make_node("Scan", ["xs0"], [], body=body, num_scan_inputs=1)
    return model([scan], [info("xs0", FLOAT, (3, 2))], [], 16)


def _with_sequence_lens(elem: int) -> onnx.ModelProto:
    m = scan_model(8)
    m.graph.node[0].input[0] = "lens"
    m.graph.input.append(info("lens", elem, (1,)))
    return m


def _loop_without_body() -> onnx.ModelProto:
    m = loop_model(16)
    del m.graph.node[0].attribute[:]
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
    for f in found:
        assert_quotes_the_spec(f)


def test_every_rule_has_a_broken_model() -> None:
    assert sorted(BROKEN) == sorted(_rules.RULES)


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
    assert generated.strip() == _rules.markdown_rules().strip()


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


# --- quotes: every finding quotes the specification pages (copies in tests/onnx/spec) ---------

SPEC = Path(__file__).parent / "spec"
ENGLISH_PAGES = ("onnx-scan-v16-v11-v9-v8.txt", "onnx-loop-v16-v13-v11-v1.txt")


def _normalized(text: str) -> str:
    """Spec text without its list bullets, on one line."""
    return " ".join(text.replace("•", " ").split())


@functools.cache
def spec_text() -> str:
    assert SPEC.is_dir(), f"the specification pages are expected in {SPEC}"
    return _normalized(" ".join((SPEC / page).read_text() for page in ENGLISH_PAGES))


def assert_quotes_the_spec(finding: torchscan.onnx.Finding) -> None:
    """The finding's quote is the specification's text, "…" marking what it leaves out; for the
    versions the pages give only in Chinese, the type list is theirs and the rest onnx.defs'."""
    quote = finding.spec
    if finding.op.startswith("If-"):  # the pages hold Scan and Loop: If's text is onnx.defs'
        schema = onnx.defs.get_schema("If", int(finding.op.split("-")[1]))
        assert _normalized(quote) in _normalized(schema.outputs[0].description), quote
        return
    if finding.source.endswith("type constraints (onnx.defs)"):
        op, since = finding.op.split("-")
        schema = onnx.defs.get_schema(op, int(since))
        variadic = next(c for c in schema.type_constraints if c.type_param_str == "V")
        listed = quote.split("( ", 1)[1].split(" ):", 1)[0]
        assert listed.split(", ") == sorted(variadic.allowed_type_strs), quote
        return
    for piece in quote.split("…"):
        assert _normalized(piece) in spec_text(), f"not in the specification: {piece!r}"


@pytest.mark.parametrize(
    "version",
    [*_opsets.SCAN_VERSIONS, *_opsets.LOOP_VERSIONS],
    ids=lambda v: f"{v.op}-{v.since}",
)
def test_the_type_constraint_quote_is_the_specification_s(version) -> None:
    quote, source = _rules._type_constraint_quote(version)
    finding = torchscan.onnx.Finding("n", f"{version.op}-{version.since}", "r", "m", quote, source)
    assert_quotes_the_spec(finding)
    english = version.since <= 16
    assert source == f"{version.op}-{version.since}, type constraints" + (
        "" if english else " (onnx.defs)"
    )


def test_a_type_not_allowed_quotes_the_whole_constraint_and_says_what_is_allowed() -> None:
    found = findings(scan_model(13, elem=TensorProto.BFLOAT16))
    assert len(found) == 4  # h0, xs0, hT, ys
    assert found[0].spec == (
        "V in ( tensor(bool), tensor(complex128), tensor(complex64), tensor(double), "
        "tensor(float), tensor(float16), tensor(int16), tensor(int32), tensor(int64), "
        "tensor(int8), tensor(string), tensor(uint16), tensor(uint32), tensor(uint64), "
        "tensor(uint8) ): All Tensor types"
    )
    assert found[0].source == "Scan-11, type constraints"


def test_loop_16_says_which_kinds_of_values_it_allows() -> None:
    m = loop_model(16)
    for value in (*m.graph.input[2:], m.graph.output[0]):
        _retype(value, TensorProto.FLOAT8E4M3FN)
    m.graph.node[0].attribute[0].g.input[2].type.tensor_type.elem_type = TensorProto.FLOAT8E4M3FN
    m.graph.node[0].attribute[0].g.output[1].type.tensor_type.elem_type = TensorProto.FLOAT8E4M3FN
    found = findings(m)
    assert {f.rule for f in found} == {"loop-element-type"}
    assert found[0].message == (
        "initial carried value 0, 'h0', is of type tensor(float8e4m3fn), which Loop-16 (in force "
        "at opset 16) does not allow: Loop-16 allows only tensors, sequences of tensors, optional "
        "tensors and optional sequences of tensors of 16 element types (bfloat16, bool, "
        "complex128, complex64, double, float, float16, int16, int32, int64, int8, string, "
        "uint16, uint32, uint64, uint8); the first opset that allows it is 19."
    )
    assert found[0].spec.endswith(
        "): All Tensor, Sequence(Tensor), Optional(Tensor), and Optional(Sequence(Tensor)) types"
    )
    assert_quotes_the_spec(found[0])


def test_an_unknown_attribute_quotes_the_attributes_of_the_version() -> None:
    (finding,) = findings(scan_model(9, directions=[0]))
    assert finding.message == (
        "Scan-9 has no attribute 'directions'; it is an attribute of Scan-8. The attributes of "
        "Scan-9 are body, num_scan_inputs, scan_input_axes, scan_input_directions, "
        "scan_output_axes and scan_output_directions."
    )
    assert finding.spec == (
        "body (required): The graph run each iteration. … num_scan_inputs (required): An "
        "attribute specifying the number of scan_inputs M. scan_input_axes: An optional list of M "
        "flags. … scan_input_directions: An optional list of M flags. … scan_output_axes: An "
        "optional list of K flags. … scan_output_directions: An optional list of K flags, one for "
        "each scan_output. …"
    )
    assert finding.source == "Scan-9, attributes"


@pytest.mark.parametrize(
    ("make", "message", "quote"),
    [
        (
            lambda: _with_attribute(scan_model(16), oh.make_attribute("scan_input_axes", 0)),
            "attribute 'scan_input_axes' is of type INT, where Scan-16 expects INTS.",
            "scan_input_axes: An optional list of M flags. The i-th element of the list specifies "
            "the axis to be scanned (the sequence axis) for the i-th scan_input. If omitted, 0 "
            "will be used as the scan axis for every scan_input. Negative value for an axis means "
            "counting dimensions from the back. Accepted range is [-r, r-1] where r = "
            "rank(input).",
        ),
        (
            _loop_without_body,
            "the required attribute 'body' is missing.",
            "body (required): The graph run each iteration. It has 2+N inputs: (iteration_num, "
            "condition, loop carried dependencies…). It has 1+N+K outputs: (condition, loop "
            "carried dependencies…, scan_outputs…). Each scan_output is created by concatenating "
            "the value of the specified output value at the end of each iteration of the loop. It "
            "is an error if the dimensions or data type of these scan_outputs change across loop "
            "iterations.",
        ),
    ],
    ids=["wrong-type", "missing"],
)
def test_an_attribute_finding_quotes_the_attribute_s_text(make, message, quote) -> None:
    (finding,) = findings(make())
    assert (finding.message, finding.spec) == (message, quote)
    assert_quotes_the_spec(finding)


def _with_attribute(m: onnx.ModelProto, attr: onnx.AttributeProto) -> onnx.ModelProto:
    m.graph.node[0].attribute.append(attr)
    return m


# --- ranks from the body, functions, omitted inputs, loops that never end -----------------------


def _in_function(axis: int, function_opset: int | None = 16) -> onnx.ModelProto:
    """scan_model(16) with its Scan in a model-local function, whose values have no types."""
    inner = scan_model(16, scan_input_axes=[axis])
    imports = [] if function_opset is None else [oh.make_opsetid("", function_opset)]
    function = oh.make_function(
        "local", "fscan", ["h0", "xs0"], ["hT", "ys"], list(inner.graph.node), imports
    )
    call = oh.make_node("fscan", ["h0", "xs0"], ["hT", "ys"], domain="local", name="call")
    m = model([call], list(inner.graph.input), list(inner.graph.output), 16)
    m.functions.append(function)
    m.opset_import.append(oh.make_opsetid("local", 1))
    return m


def test_an_axis_out_of_range_in_a_function_is_read_from_the_body() -> None:
    (finding,) = findings(_in_function(5))
    assert finding.node == "function 'fscan' > Scan #0"
    assert (finding.rule, finding.message) == (
        "scan-axis-range",
        "scan_input_axes[0] is 5, outside [-2, 1]: scan input 0, 'xs0', whose rank is not "
        "declared, has rank 2, as its element in the body, 'x0', has rank 1.",
    )
    assert findings(_in_function(1)) == ()


def test_a_function_without_its_own_opset_import_uses_the_model_s() -> None:
    report = torchscan.onnx.check(_in_function(5, function_opset=None), runtimes=())
    assert [(n.node, n.op) for n in report.nodes] == [("function 'fscan' > Scan #0", "Scan-16")]
    assert [f.rule for f in report.findings] == ["scan-axis-range"]


def test_an_axis_out_of_range_of_an_input_without_a_shape_is_read_from_the_body() -> None:
    m = scan_model(16, scan_input_axes=[5])
    m.graph.input[1].type.tensor_type.ClearField("shape")
    (finding,) = findings(m)
    assert finding.message == (
        "scan_input_axes[0] is 5, outside [-2, 1]: scan input 0, 'xs0', whose rank is not "
        "declared, has rank 2, as its element in the body, 'x0', has rank 1."
    )


def test_a_scan_8_sequence_lens_may_be_omitted_but_not_a_state() -> None:
    assert findings(scan_model(8)) == ()  # sequence_lens is ""
    (finding,) = findings(_with_input_omitted(scan_model(8), 1))
    assert finding.message == (
        "initial state variable 0 is omitted (its name is empty), but only optional inputs may "
        "be, and the only optional input of Scan-8 is sequence_lens: each state variable needs an "
        "initial value, each scan input a tensor to scan."
    )


def test_a_loop_without_m_whose_body_passes_its_condition_through_never_ends() -> None:
    m = _with_input_omitted(loop_model(16), 0)  # c_out = Identity(c_in)
    (finding,) = findings(m)
    assert (finding.rule, finding.message) == (
        "loop-never-ends",
        "M is omitted and the body yields its condition input, 'c_in', unchanged as its "
        "condition, 'c_out': once cond is true, the loop never ends.",
    )
    assert finding.spec == (
        "input (“”, cond) // Note this is analogous to a while loop bool cond = …; for (int i=0; "
        "cond; ++i) { cond = …; }"
    )
    assert_quotes_the_spec(finding)
    assert findings(loop_model(16)) == ()  # with M, it ends
    ends = _with_input_omitted(loop_model(16), 0)
    body = ends.graph.node[0].attribute[0].g
    body.node[0].CopyFrom(oh.make_node("Not", ["c_in"], ["c_out"]))
    assert findings(ends) == ()  # its body changes the condition


@pytest.mark.parametrize("opset", [9, 11])
def test_a_loop_carried_value_may_change_shape_in_every_version(opset: int) -> None:
    # Neither Loop-1 nor Loop-11 says a carried value keeps its shape: only scan outputs must.
    m = loop_model(opset)
    body = m.graph.node[0].attribute[0].g
    body.node[1].CopyFrom(oh.make_node("Concat", ["h0_in", "h0_in"], ["h0_out"], axis=0))
    body.output[1].CopyFrom(info("h0_out", FLOAT, (4,)))
    body.node[2].CopyFrom(oh.make_node("Identity", ["h0_in"], ["y"]))
    m.graph.output[0].type.tensor_type.ClearField("shape")
    report = torchscan.onnx.check(m, runtimes=())
    assert report.nodes[0].op == ("Loop-1" if opset == 9 else "Loop-11")
    assert report.findings == ()


def test_a_model_that_imports_no_default_opset_cannot_be_checked() -> None:
    m = scan_model(16)
    m.opset_import[0].domain = "com.example"
    with pytest.raises(
        ValueError, match=r"^torchscan\.onnx\.check: <ModelProto>: imports no"
    ) as raised:
        torchscan.onnx.check(m, runtimes=())
    assert str(raised.value) == (
        "torchscan.onnx.check: <ModelProto>: imports no version of the default ONNX domain (no "
        'opset_import for "" or '
        '"ai.onnx"), so the version in force for Scan #0 is unknown and it cannot be checked'
    )


def _sequence_lens_of_rank_2() -> onnx.ModelProto:
    m = _with_sequence_lens(INT64)
    m.graph.input[-1].CopyFrom(info("lens", INT64, (1, 1)))
    return m


def _loop_with_a_sequence_scan_output() -> onnx.ModelProto:
    m = loop_model(16)
    body = m.graph.node[0].attribute[0].g
    body.node[2].CopyFrom(oh.make_node("SequenceConstruct", ["h0_out"], ["y"]))
    body.output[2].CopyFrom(oh.make_tensor_sequence_value_info("y", FLOAT, (2,)))
    return m


# Findings whose quote is not their rule's own: each must quote the specification too.
OTHER_QUOTES = {
    "output axis": lambda: scan_model(16, scan_output_axes=[2]),
    "output direction": lambda: scan_model(16, scan_output_directions=[2]),
    "output list length": lambda: scan_model(16, scan_output_axes=[0, 1]),
    "scan-8 batch sizes": lambda: _scan8_two_batches(),
    "scan-8 sequence_lens type": lambda: _with_sequence_lens(TensorProto.INT32),
    "scan-8 sequence_lens rank": _sequence_lens_of_rank_2,
    "loop arity": lambda: _loop_without_carried(9),
    "loop scan output of a sequence": _loop_with_a_sequence_scan_output,
}


def _scan8_two_batches() -> onnx.ModelProto:
    m = scan_model(8)
    m.graph.input[1].type.tensor_type.shape.dim[0].dim_value = 2
    return m


@pytest.mark.parametrize("case", sorted(OTHER_QUOTES))
def test_other_findings_quote_the_specification(case: str) -> None:
    found = findings(OTHER_QUOTES[case]())
    assert found
    for finding in found:
        assert_quotes_the_spec(finding)


def test_any_failure_of_onnx_ir_to_read_a_model_is_a_value_error(monkeypatch) -> None:
    def fails(model):
        raise TypeError("a bytes-like object is required, not 'str'")

    monkeypatch.setattr(_lint.ir.serde, "deserialize_model", fails)
    with pytest.raises(
        ValueError, match=r"^torchscan\.onnx\.check: <ModelProto>: onnx_ir"
    ) as raised:
        torchscan.onnx.check(scan_model(16), runtimes=())
    assert str(raised.value) == (
        "torchscan.onnx.check: <ModelProto>: onnx_ir cannot read the model to lint it: a "
        "bytes-like object is required, not 'str'"
    )


def test_an_if_branch_size_that_shape_inference_names_is_no_finding() -> None:
    """ONNX shape inference names the sizes it does not know ``unk__N``: such a name says
    nothing of the size, so against a static size it is no contradiction."""
    assert findings(if_model(9, then_shape=("unk__0", 3), else_shape=(2, 3))) == ()
    (finding,) = findings(if_model(9, then_shape=("T", 3), else_shape=(2, 3)))
    assert finding.rule == "if-branch-shapes"
