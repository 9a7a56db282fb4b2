"""``torchscan.onnx.to_torch``: ONNX models as modules, against ONNX's own backend cases (their
expected outputs come from onnx's numpy implementations), onnxruntime, and the models
torchscan exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import hypothesis
import hypothesis.strategies as st
import numpy as np
import onnx
import onnx.helper as oh
import pytest
import torch
from onnxscript import FLOAT, INT64, script
from onnxscript import opset18 as op

import torchscan
import torchscan.onnx
from torchscan.onnx import OnnxImportError
from torchscan.onnx._import._registry import implemented, schema_version

from .._export import onnx_export
from ._runtimes import run_onnxruntime_on
from .test_compare import backend_cases

# ---------------------------------------------------------------------------------------------
# Models of another exporter: jax2onnx (tests/onnx/data/jax2onnx; its README says how they were
# made), with the outputs JAX computed

JAX2ONNX = Path(__file__).parent / "data" / "jax2onnx"


def _jax2onnx_cases() -> list[tuple[str, str]]:
    manifest = json.loads((JAX2ONNX / "manifest.json").read_text())
    return [(model, data) for model, entry in sorted(manifest.items()) for data in entry["data"]]


@pytest.mark.parametrize(("model", "data"), _jax2onnx_cases())
def test_a_jax2onnx_model_computes_what_jax_computed(model: str, data: str) -> None:
    """jax2onnx writes lax.scan, fori_loop and while_loop as Loop and lax.cond as If: the module
    computes JAX's outputs, and ``torchscan check`` finds onnxruntime, the reference evaluator
    and the module agreeing on them, a model with an If and no Loop too."""
    proto = onnx.load(JAX2ONNX / model)
    arrays = np.load(JAX2ONNX / data)
    inputs = [arrays[f"input_{i}"] for i in range(len(proto.graph.input))]
    outputs = [arrays[f"output_{i}"] for i in range(len(proto.graph.output))]
    module = torchscan.onnx.to_torch(proto)
    with torch.no_grad():
        got = module(*[torch.from_numpy(i) for i in inputs])
    got = [got] if len(outputs) == 1 else list(got)
    for value, want in zip(got, outputs, strict=True):
        assert value.numpy().dtype == want.dtype
        np.testing.assert_allclose(value.numpy(), want, rtol=1e-5, atol=1e-5)
    report = torchscan.onnx.check(proto, inputs=inputs, expected=outputs)
    assert report.ok, report
    assert {c.source: c.status for c in report.comparisons} == {
        "expected": "baseline",
        "onnxruntime": "ok",
        "onnxruntime-unoptimized": "ok",
        "reference": "ok",
        "imported": "ok",
    }


def test_an_imported_if_traces_as_torch_cond_and_exports_as_an_if() -> None:
    """Under torch.export, an If is torch.cond: the program keeps both branches, and computes
    JAX's outputs on inputs that take either; exported to ONNX again, it is one If."""
    proto = onnx.load(JAX2ONNX / "cond_branch.onnx")
    module = torchscan.onnx.to_torch(proto)
    data = [np.load(JAX2ONNX / name) for name in ("cond_branch.npz", "cond_branch_false.npz")]
    x = torch.from_numpy(data[0]["input_0"])
    program = torch.export.export(module, (x,))
    assert any(n.target is torch.ops.higher_order.cond for n in program.graph.nodes)
    for arrays in data:
        got = program.module()(torch.from_numpy(arrays["input_0"]))
        np.testing.assert_allclose(got.detach().numpy(), arrays["output_0"], rtol=1e-5, atol=1e-5)
    again = onnx_export(module, (x,), dynamo=True, opset_version=18).model_proto
    assert [n.op_type for n in _nodes(again.graph)].count("If") == 1
    for arrays in data:
        (got,) = run_onnxruntime_on(again, {again.graph.input[0].name: arrays["input_0"]})[
            "default"
        ]
        np.testing.assert_allclose(got, arrays["output_0"], rtol=1e-5, atol=1e-5)


def test_the_jax2onnx_models_hold_loops_and_branches_not_unrolled_code() -> None:
    ops = {
        model: {n.op_type for n in _nodes(onnx.load(JAX2ONNX / model).graph)}
        for model, _ in _jax2onnx_cases()
    }
    assert all("Loop" in found or "If" in found for found in ops.values())
    assert {"Loop", "If"} <= ops["scan_nested.onnx"]


# ---------------------------------------------------------------------------------------------
# ONNX's backend node cases


def _backend_cases() -> dict[str, Any]:
    return backend_cases()


def _nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            if attribute.HasField("g"):
                yield from _nodes(attribute.g)


def _all_implemented(model: onnx.ModelProto) -> bool:
    """Whether every node of ``model`` is an operator version to_torch lists (of the default
    domain or ``ai.onnx.ml``), read from the registry's table and onnx's schemas, and every
    input a tensor."""
    table = implemented()
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    for node in _nodes(model.graph):
        domain = "" if node.domain == "ai.onnx" else node.domain
        if domain not in ("", "ai.onnx.ml") or domain not in opsets:
            return False
        version = schema_version(domain, node.op_type, opsets[domain])
        name = f"{domain}.{node.op_type}" if domain else node.op_type
        if version is None or version not in table.get(name, []):
            return False
    return all(_torch_has(i.type) for i in model.graph.input)


def _torch_has(type_: onnx.TypeProto) -> bool:
    """Whether torch has the type of an input: a tensor of an element type torch has, or a
    sequence or optional of one."""
    if type_.HasField("tensor_type"):
        return type_.tensor_type.elem_type in _TORCH_TYPES
    if type_.HasField("sequence_type"):
        return _torch_has(type_.sequence_type.elem_type)
    if type_.HasField("optional_type"):
        return _torch_has(type_.optional_type.elem_type)
    return False


_TORCH_TYPES = {
    getattr(onnx.TensorProto, name)
    for name in [
        "FLOAT",
        "DOUBLE",
        "FLOAT16",
        "BFLOAT16",
        "INT8",
        "INT16",
        "INT32",
        "INT64",
        "UINT8",
        "UINT16",
        "UINT32",
        "UINT64",
        "BOOL",
    ]
}
"""The element types of the inputs of the cases run: those torch has (not strings, not the
8-, 4- and 2-bit types)."""


def _tensor(value: Any) -> Any:
    """A case's input as the module takes it: a tensor, a list of them for a sequence, None
    for an empty optional."""
    if value is None:
        return None
    if isinstance(value, list):
        return [_tensor(v) for v in value]
    if isinstance(value, onnx.TensorProto):  # some cases give their inputs as protos
        value = onnx.numpy_helper.to_array(value)
    value = np.asarray(value)
    if value.dtype.name == "bfloat16":  # numpy has none; onnx uses ml_dtypes'
        return torch.from_numpy(value.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(value.copy())


def _implemented_cases() -> list[str]:
    return sorted(name for name, case in _backend_cases().items() if _all_implemented(case.model))


REFUSED = re.compile(
    # torch has no comparison, arithmetic, maximum or minimum of these unsigned types
    r"test_(add|sub|div|greater|greater_equal|less|less_equal|max|min)_uint(16|32|64)(_expanded)?$"
    # torch has no bitwise_not of uint16 (the input of this case)
    r"|test_bitwise_not_3d"
    # a random mask
    r"|test_training_dropout.*"
    # BatchNormalization in training mode (its statistics), which to_torch does not implement
    r"|test_batchnorm_(epsilon|example)_training_mode"
)
"""The backend cases of implemented operators that to_torch refuses, each with its reason."""


RANDOM = re.compile(r"test_bernoulli.*")
"""Backend cases of random operators: no two sources draw alike, so their outputs are held to
the expected ones by shape and element type, and their values to the operator's support."""

ROUNDED = {"test_averagepool_2d_ceil_last_window_starts_on_pad"}
"""Backend cases whose expected outputs are written by hand to 4 decimals (0.1511 for
0.151056...): they are held against onnxruntime's outputs instead, at the same tolerance."""


@pytest.mark.parametrize("name", _implemented_cases())
def test_backend_case(name: str) -> None:
    """Each backend case whose operators to_torch implements computes the case's expected
    outputs, or is refused for a reason listed in :data:`REFUSED` (never a wrong result)."""
    case = _backend_cases()[name]
    try:
        module = torchscan.onnx.to_torch(case.model)
        for inputs, expected in case.data_sets:
            if name in ROUNDED:
                feeds = dict(zip(module.input_names, inputs, strict=True))
                expected = run_onnxruntime_on(case.model, feeds)["unoptimized"]
            with torch.no_grad():
                got = module(*[_tensor(i) for i in inputs])
            got = [got] if len(module.output_names) == 1 else list(got)
            assert len(got) == len(expected)
            for value, want in zip(got, expected, strict=True):
                if RANDOM.match(name):  # Bernoulli: 0 or 1
                    want = np.asarray(want)
                    assert (value.shape, value.numpy().dtype) == (want.shape, want.dtype)
                    assert set(value.unique().tolist()) <= {0, 1}
                else:
                    _assert_value_equal(value, want)
    except OnnxImportError:
        if not REFUSED.match(name):
            raise
        return
    assert not REFUSED.match(name), "refused cases are expected to be refused"


def _assert_value_equal(value: Any, want: Any) -> None:
    """``value`` (a tensor, a list of them, None) holds what a backend case expects, within the
    tolerance of its element type."""
    if want is None or isinstance(want, list):
        assert isinstance(value, type(want)), (type(value), type(want))
        assert len(value or []) == len(want or [])
        for v, w in zip(value or [], want or [], strict=True):
            _assert_value_equal(v, w)
        return
    if isinstance(want, onnx.TensorProto):
        want = onnx.numpy_helper.to_array(want)
    want = np.asarray(want)
    assert value.shape == want.shape, (value.shape, want.shape)
    if want.dtype.name == "bfloat16":
        np.testing.assert_allclose(
            value.float().numpy(), want.astype(np.float32), rtol=1e-2, atol=1e-2
        )
    elif want.dtype.kind in "fc":
        np.testing.assert_allclose(
            value.numpy(),
            want,
            rtol=1e-3 if want.dtype == np.float16 else 1e-5,
            atol=1e-3 if want.dtype == np.float16 else 1e-6,
        )
    else:
        np.testing.assert_array_equal(value.numpy(), want)


def test_the_backend_cases_cover_scan_loop_and_if_and_most_operators() -> None:
    """The cases above are not a handful: ONNX's Scan, Loop and If cases are among them."""
    names = set(_implemented_cases())
    assert {
        "test_scan_sum",
        "test_scan9_sum",
        "test_scan9_multi_state",
        "test_scan9_scalar",
        "test_loop11",
        "test_if",
    } <= names
    assert len(names) >= 500, len(names)


# ---------------------------------------------------------------------------------------------
# Scan attributes, against onnxruntime


@st.composite
def scan_models(draw):
    """A Scan-``opset`` node with random states, scan inputs, axes and directions, whose body
    mixes every state and input, and the inputs to run it on."""
    opset = draw(st.sampled_from([9, 11, 16, 21, 25]))
    n_states = draw(st.integers(0, 2))
    m = draw(st.integers(1, 3))
    k = draw(st.integers(0 if n_states else 1, 2))
    length = draw(st.integers(1, 4))
    element = (2, 3)
    negative = opset >= 11
    in_axes = [draw(st.integers(-3 if negative else 0, 2)) for _ in range(m)]
    out_axes = [draw(st.integers(-3 if negative else 0, 2)) for _ in range(k)]
    in_dirs = [draw(st.integers(0, 1)) for _ in range(m)]
    out_dirs = [draw(st.integers(0, 1)) for _ in range(k)]
    f = onnx.TensorProto.FLOAT
    body_inputs = [oh.make_tensor_value_info(f"s{i}", f, element) for i in range(n_states)]
    body_inputs += [oh.make_tensor_value_info(f"x{j}", f, element) for j in range(m)]
    nodes = [oh.make_node("Tanh", ["x0"], ["t0"])]
    for j in range(1, m):
        nodes.append(oh.make_node("Add", [f"t{j - 1}", f"x{j}"], [f"t{j}"]))
    mixed = f"t{m - 1}"
    outputs = []
    for i in range(n_states):
        nodes.append(oh.make_node("Mul", [f"s{i}", "half"], [f"h{i}"]))
        nodes.append(oh.make_node("Add", [f"h{i}", mixed], [f"s{i}_out"]))
        outputs.append(f"s{i}_out")
    for j in range(k):
        source = f"s{j % n_states}_out" if n_states else mixed
        nodes.append(oh.make_node("Sub", [source, f"x{j % m}"], [f"y{j}"]))
        outputs.append(f"y{j}")
    body = oh.make_graph(
        nodes,
        "body",
        body_inputs,
        [oh.make_tensor_value_info(o, f, element) for o in outputs],
    )
    attributes = {"num_scan_inputs": m, "body": body}
    if draw(st.booleans()) or any(in_axes):
        attributes["scan_input_axes"] = in_axes
    if draw(st.booleans()) or any(in_dirs):
        attributes["scan_input_directions"] = in_dirs
    if k and (draw(st.booleans()) or any(out_axes)):
        attributes["scan_output_axes"] = out_axes
    if k and (draw(st.booleans()) or any(out_dirs)):
        attributes["scan_output_directions"] = out_dirs
    states = [f"init{i}" for i in range(n_states)]
    sequences = [f"seq{j}" for j in range(m)]
    graph_outputs = [f"final{i}" for i in range(n_states)] + [f"ys{j}" for j in range(k)]
    scan = oh.make_node("Scan", states + sequences, graph_outputs, **attributes)
    half = oh.make_tensor("half", f, [], [0.5])
    graph = oh.make_graph(
        [scan],
        "scan",
        [oh.make_tensor_value_info(s, f, element) for s in states]
        + [oh.make_tensor_value_info(s, f, ["a", "b", "c"]) for s in sequences],
        [oh.make_tensor_value_info(o, f, element) for o in graph_outputs[:n_states]]
        + [oh.make_tensor_value_info(o, f, ["d", "e", "g"]) for o in graph_outputs[n_states:]],
        [half],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, 10)
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    feeds = {s: rng.standard_normal(element).astype(np.float32) for s in states}
    for name, axis in zip(sequences, in_axes, strict=True):
        shape = list(element)
        shape.insert(axis % 3, length)
        feeds[name] = rng.standard_normal(shape).astype(np.float32)
    return model, feeds


@hypothesis.settings(max_examples=20, deadline=None, derandomize=True)
@hypothesis.given(problem=scan_models())
def test_scan_attributes_compute_as_onnxruntime(problem) -> None:
    """Against onnxruntime at both levels, and the specification's pseudo-code (the reference
    evaluator with the check tool's Scan, which follows it line by line)."""
    import onnx.reference

    from torchscan.onnx._check._runtimes import reference_ops

    model, feeds = problem
    module = torchscan.onnx.to_torch(model)
    got = module(**{name: torch.from_numpy(value) for name, value in feeds.items()})
    got = [got] if isinstance(got, torch.Tensor) else list(got)
    runs = dict(run_onnxruntime_on(model, feeds))
    runs["spec"] = onnx.reference.ReferenceEvaluator(model, new_ops=reference_ops()).run(
        None, feeds
    )
    for level, outputs in runs.items():
        assert len(outputs) == len(got)
        for value, want in zip(got, outputs, strict=True):
            np.testing.assert_allclose(
                value.detach().numpy(), want, rtol=1e-5, atol=1e-6, err_msg=level
            )


# ---------------------------------------------------------------------------------------------
# Loops that torchscan did not export: onnxscript


def _onnxscript_loop_model() -> onnx.ModelProto:
    @script()
    def running(x: FLOAT[None, 3], n: INT64) -> FLOAT[3]:
        total = op.ReduceSum(x, op.Constant(value_ints=[0]), keepdims=0) * 0.0
        for i in range(n):
            total = total + op.Gather(x, i, axis=0) * op.Cast(i + 1, to=1)
        return total

    return running.to_model_proto()


def test_an_onnxscript_for_loop_computes_as_onnxruntime() -> None:
    model = _onnxscript_loop_model()
    assert any(node.op_type == "Loop" for node in _nodes(model.graph))
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    for n in (0, 1, 4):
        feeds = {"x": x, "n": np.array(n, dtype=np.int64)}
        got = torchscan.onnx.to_torch(model)(torch.from_numpy(x), torch.tensor(n))
        want = sum((x[i] * (i + 1) for i in range(n)), np.zeros(3, np.float32))
        np.testing.assert_allclose(got.detach().numpy(), want)
        for outputs in run_onnxruntime_on(model, feeds).values():
            np.testing.assert_allclose(got.detach().numpy(), outputs[0])


# ---------------------------------------------------------------------------------------------
# The module


def _linear_scan_model() -> onnx.ModelProto:
    """``h = tanh(h @ W + x)`` over the sequence, W an initializer."""
    f = onnx.TensorProto.FLOAT
    body = oh.make_graph(
        [
            oh.make_node("MatMul", ["h", "W"], ["hw"]),
            oh.make_node("Add", ["hw", "x"], ["pre"]),
            oh.make_node("Tanh", ["pre"], ["h_out"]),
            oh.make_node("Identity", ["h_out"], ["y"]),
        ],
        "body",
        [oh.make_tensor_value_info("h", f, [2, 3]), oh.make_tensor_value_info("x", f, [2, 3])],
        [oh.make_tensor_value_info("h_out", f, [2, 3]), oh.make_tensor_value_info("y", f, [2, 3])],
    )
    weight = np.linspace(-1, 1, 9, dtype=np.float32).reshape(3, 3)
    graph = oh.make_graph(
        [oh.make_node("Scan", ["h0", "xs"], ["h_last", "ys"], num_scan_inputs=1, body=body)],
        "rnn",
        [
            oh.make_tensor_value_info("h0", f, [2, 3]),
            oh.make_tensor_value_info("xs", f, ["T", 2, 3]),
        ],
        [
            oh.make_tensor_value_info("h_last", f, [2, 3]),
            oh.make_tensor_value_info("ys", f, ["T", 2, 3]),
        ],
        [onnx.numpy_helper.from_array(weight, "W")],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def test_floating_initializers_are_parameters_and_train() -> None:
    """A body reads the main graph's initializer by name; the gradient of the module's
    parameter is the Python loop's."""
    module = torchscan.onnx.to_torch(_linear_scan_model())
    assert [name for name, _ in module.named_parameters()] == ["W"]
    assert module.onnx_names == {"W": "W"}
    h0, xs = torch.randn(2, 3), torch.randn(5, 2, 3)
    h_last, ys = module(h0, xs)
    (h_last.sum() + ys.square().sum()).backward()

    weight = module.W.detach().clone().requires_grad_()
    h, outs = h0, []
    for x in xs:
        h = torch.tanh(h @ weight + x)
        outs.append(h)
    (h.sum() + torch.stack(outs).square().sum()).backward()
    torch.testing.assert_close(ys, torch.stack(outs))
    torch.testing.assert_close(module.W.grad, weight.grad)


def test_a_path_and_keyword_inputs(tmp_path) -> None:
    path = tmp_path / "rnn.onnx"
    onnx.save(_linear_scan_model(), path)
    module = torchscan.onnx.to_torch(str(path))
    h0, xs = torch.randn(2, 3), torch.randn(4, 2, 3)
    torch.testing.assert_close(module(h0, xs), module(xs=xs, h0=h0))


def test_the_imported_scan_exports_again_as_one_scan() -> None:
    module = torchscan.onnx.to_torch(_linear_scan_model()).eval()
    h0, xs = torch.randn(2, 3), torch.randn(4, 2, 3)
    t = torch.export.Dim("T", min=1)
    program = torch.onnx.export(
        module, (h0, xs), dynamo=True, opset_version=17, dynamic_shapes=(None, {0: t})
    )
    exported = program.model_proto
    assert [n.op_type for n in _nodes(exported.graph)].count("Scan") == 1
    xs7 = torch.randn(7, 2, 3)
    feeds = {i.name: v.numpy() for i, v in zip(exported.graph.input, (h0, xs7), strict=True)}
    want = [o.detach().numpy() for o in module(h0, xs7)]
    for outputs in run_onnxruntime_on(exported, feeds).values():
        for got, expected in zip(outputs, want, strict=True):
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Refusals


def test_a_model_that_fails_the_checker() -> None:
    model = _linear_scan_model()
    model.graph.node[0].input[1] = "missing"
    with pytest.raises(OnnxImportError, match=r"fails onnx\.checker"):
        torchscan.onnx.to_torch(model)


def test_an_operator_not_implemented_is_named_with_its_version_and_node() -> None:
    # Mean-6 (opset 7) takes no broadcasting; to_torch implements the later versions only.
    f = onnx.TensorProto.FLOAT
    graph = oh.make_graph(
        [oh.make_node("Mean", ["x", "x"], ["y"], name="average")],
        "g",
        [oh.make_tensor_value_info("x", f, [2, 2])],
        [oh.make_tensor_value_info("y", f, [2, 2])],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 7)])
    with pytest.raises(OnnxImportError) as raised:
        torchscan.onnx.to_torch(model)
    assert str(raised.value) == (
        "torchscan.onnx.to_torch: node 'average' (Mean-6) of the main graph: Mean-6 is not "
        "implemented (implemented: versions [8, 13]). The operators and versions to_torch "
        "implements are listed in docs/import.md."
    )
    assert raised.value.not_implemented


def test_a_fault_of_the_model_is_not_said_not_implemented() -> None:
    f, i64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    graph = oh.make_graph(
        [
            oh.make_node("SequenceConstruct", ["x"], ["s"]),
            oh.make_node("SequenceAt", ["s", "i"], ["y"], name="at"),
        ],
        "g",
        [oh.make_tensor_value_info("x", f, [2]), oh.make_tensor_value_info("i", i64, [])],
        [oh.make_tensor_value_info("y", f, [2])],
    )
    module = torchscan.onnx.to_torch(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)]))
    assert module(torch.ones(2), torch.tensor(-1)).tolist() == [1.0, 1.0]
    with pytest.raises(OnnxImportError) as raised:
        module(torch.ones(2), torch.tensor(1))
    assert str(raised.value) == (
        "torchscan.onnx.to_torch: node 'at' (SequenceAt-11) of the main graph: position 1 is "
        "outside [-1, 0] for a sequence of 1 elements"
    )
    assert not raised.value.not_implemented


def test_a_loop_whose_body_changes_a_carried_values_rank_is_refused_naming_the_node() -> None:
    f, i64, b = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64, onnx.TensorProto.BOOL
    body = oh.make_graph(
        [
            oh.make_node("Identity", ["cond"], ["cond_out"]),
            oh.make_node("Unsqueeze", ["v", "zero"], ["v_out"]),
        ],
        "body",
        [
            oh.make_tensor_value_info("i", i64, []),
            oh.make_tensor_value_info("cond", b, []),
            oh.make_tensor_value_info("v", f, ["n"]),
        ],
        [
            oh.make_tensor_value_info("cond_out", b, []),
            oh.make_tensor_value_info("v_out", f, [1, "n"]),
        ],
        [oh.make_tensor("zero", i64, [1], [0])],
    )
    graph = oh.make_graph(
        [oh.make_node("Loop", ["M", "", "v0"], ["v_final"], body=body, name="grow")],
        "g",
        [oh.make_tensor_value_info("M", i64, []), oh.make_tensor_value_info("v0", f, [3])],
        [oh.make_tensor_value_info("v_final", f, ["m"])],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    module = torchscan.onnx.to_torch(model)
    with pytest.raises(OnnxImportError, match=r"node 'grow' \(Loop-16\).*carry must keep its"):
        module(torch.tensor(2), torch.zeros(3))


def test_a_loop_that_never_ends_is_refused() -> None:
    model = onnx.load_from_string(_onnxscript_loop_model().SerializeToString())
    loop = next(n for n in model.graph.node if n.op_type == "Loop")
    loop.input[0] = ""
    loop.input[1] = ""
    with pytest.raises(OnnxImportError, match=r"\[loop-never-ends\]: M and cond are both omitted"):
        torchscan.onnx.to_torch(model)
    # the check tool's runtime, which imports what it has linted already: refused when it runs
    from torchscan.onnx._import._graph import compile_model

    module = compile_model(model, lint=False)
    with pytest.raises(OnnxImportError, match="neither a trip count nor a condition"):
        module(torch.zeros(2, 3), torch.tensor(1))


def test_what_torch_cannot_compute_names_the_node_and_the_inputs() -> None:
    u16 = onnx.TensorProto.UINT16
    graph = oh.make_graph(
        [oh.make_node("Add", ["a", "b"], ["c"], name="sum")],
        "g",
        [oh.make_tensor_value_info("a", u16, [2]), oh.make_tensor_value_info("b", u16, [2])],
        [oh.make_tensor_value_info("c", u16, [2])],
    )
    module = torchscan.onnx.to_torch(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)]))
    with pytest.raises(OnnxImportError, match=r"'sum' \(Add-14\).*uint16\[2\], uint16\[2\]"):
        module(torch.zeros(2, dtype=torch.uint16), torch.zeros(2, dtype=torch.uint16))


def test_the_guides_operator_table_is_the_registrys() -> None:
    from pathlib import Path

    from torchscan.onnx._import._registry import markdown_table

    text = (Path(__file__).parents[2] / "docs" / "import.md").read_text()
    table = text.split("<!-- operator-table", 1)[1].split("-->\n", 1)[1]
    assert table.split("<!-- end of operator-table -->")[0] == markdown_table()


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((1, 2, 3), {}, r"takes 2 inputs \(\['h0', 'xs'\]\), but 3 were given"),
        ((1,), {"h0": 2}, r"'h0' is not an input of the model or is given twice"),
        ((), {"h": 1}, r"'h' is not an input of the model"),
        ((1,), {}, r"inputs \['xs'\] are missing"),
    ],
)
def test_the_modules_inputs_are_checked(args, kwargs, message) -> None:
    """``OnnxModule.forward``, which each model's subclass calls with its inputs by name."""
    module = torchscan.onnx.to_torch(_linear_scan_model())
    with pytest.raises(TypeError, match=message):
        torchscan.onnx.OnnxModule.forward(module, *args, **kwargs)


def _scan_8_sum(lens: bool = True, **attributes: Any) -> onnx.ModelProto:
    """A Scan-8 that sums the rows of each example of ``xs`` [2, 3, 2] (within ``lens``)."""
    f = onnx.TensorProto.FLOAT
    body = oh.make_graph(
        [oh.make_node("Add", ["s", "x"], ["s_out"]), oh.make_node("Identity", ["s_out"], ["y"])],
        "body",
        [oh.make_tensor_value_info("s", f, [2]), oh.make_tensor_value_info("x", f, [2])],
        [oh.make_tensor_value_info("s_out", f, [2]), oh.make_tensor_value_info("y", f, [2])],
    )
    inputs = ["lens" if lens else "", "s0", "xs"]
    scan = oh.make_node(
        "Scan", inputs, ["s_last", "ys"], num_scan_inputs=1, body=body, name="sc", **attributes
    )
    declared = [oh.make_tensor_value_info("lens", onnx.TensorProto.INT64, [2])] if lens else []
    graph = oh.make_graph(
        [scan],
        "g",
        [
            *declared,
            oh.make_tensor_value_info("s0", f, [2, 2]),
            oh.make_tensor_value_info("xs", f, [2, 3, 2]),
        ],
        [
            oh.make_tensor_value_info("s_last", f, [2, 2]),
            oh.make_tensor_value_info("ys", f, [2, 3, 2]),
        ],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 8)])
    model.ir_version = 3
    return model


def test_scan_8_with_a_sequence_length_out_of_range_is_refused() -> None:
    module = torchscan.onnx.to_torch(_scan_8_sum())
    xs = torch.arange(12.0).reshape(2, 3, 2)
    s_last, ys = module(torch.tensor([3, 1]), torch.zeros(2, 2), xs)
    torch.testing.assert_close(s_last, torch.stack([xs[0].sum(0), xs[1, :1].sum(0)]))
    torch.testing.assert_close(ys[1, 1:], torch.zeros(2, 2))  # padded with zeros
    with pytest.raises(OnnxImportError, match=r"'sc' \(Scan-8\).*sequence_lens \[4, 1\]"):
        module(torch.tensor([4, 1]), torch.zeros(2, 2), xs)


def test_a_scan_8_that_breaks_its_rules_is_refused_at_import_in_the_lint_s_words() -> None:
    """Two directions for one scanned input: refused when the model is imported, as
    ``torchscan check`` reports it, not when the module first runs."""
    model = _scan_8_sum(lens=False, directions=[0, 1])
    report = torchscan.onnx.check(model, runtimes=())
    assert [finding.rule for finding in report.findings] == ["scan-list-length"]
    with pytest.raises(OnnxImportError) as refused:
        torchscan.onnx.to_torch(model)
    assert str(refused.value) == (
        f"torchscan.onnx.to_torch: the model breaks the ONNX specification: {report.findings[0]}"
    )


# ---------------------------------------------------------------------------------------------
# Products of small float32 matrices, rounded as onnxruntime and numpy round them


def _product_model(op: str, shapes: list[tuple[int, ...]], out: tuple[int, ...], **attributes):
    names = ["a", "b", "c"][: len(shapes)]
    f = onnx.TensorProto.FLOAT
    graph = oh.make_graph(
        [oh.make_node(op, names, ["y"], **attributes)],
        "g",
        [oh.make_tensor_value_info(n, f, s) for n, s in zip(names, shapes, strict=True)],
        [oh.make_tensor_value_info("y", f, out)],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


PRODUCTS = {
    "batch of 2x2 by 2x2": ((256, 2, 2), (2, 2)),
    "2x2 by batch of 2x2": ((2, 2), (256, 2, 2)),
    "batches broadcast": ((8, 1, 3, 5), (4, 5, 3)),
    "rows by 2x2": ((1000, 2), (2, 2)),
    "inner 16": ((40, 16), (16, 9)),
    "matrix by vector": ((300, 2), (2,)),
    "vector by matrix": ((2,), (2, 300)),
    "one row by matrix": ((1, 5), (5, 300)),
    "matrix by one column": ((300, 3), (3, 1)),
    "batch by vector": ((10, 30, 4), (4,)),
    "batch of matrices by columns": ((100, 3, 2), (100, 2, 1)),
}


@pytest.mark.parametrize("case", list(PRODUCTS))
def test_matmul_of_float32_gives_onnxruntime_s_and_numpy_s_bits(case: str) -> None:
    """onnxruntime's CPU kernel and numpy's matmul add each term of a small product with one
    rounding (a fused multiply-add); torch's rounds the term first, one unit in the last place
    apart in about half the elements, which a computation that cancels makes much larger."""
    a_shape, b_shape = PRODUCTS[case]
    rng = np.random.default_rng(0)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    model = _product_model("MatMul", [a_shape, b_shape], np.matmul(a, b).shape)
    with torch.no_grad():
        got = torchscan.onnx.to_torch(model)(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    for onnxruntime in run_onnxruntime_on(model, {"a": a, "b": b}).values():
        np.testing.assert_array_equal(got, onnxruntime[0])
    matrices = len(a_shape) >= 2 and len(b_shape) >= 2 and a_shape[-2] > 1 and b_shape[-1] > 1
    if matrices and a_shape[-1] <= 5:
        # numpy's own loop; a BLAS library computes larger ones, and every product with one row
        # or column (in its matrix-vector kernel, which rounds as the CPU's kernel does)
        np.testing.assert_array_equal(got, np.matmul(a, b))
    if not matrices:  # the terms rounded, then added in order, each sum rounded
        left = a if a.ndim > 1 else a[None]
        right = b if b.ndim > 1 else b[:, None]
        expected = np.zeros(np.broadcast_shapes(left[..., :1].shape, right[..., :1, :].shape))
        expected = expected.astype(np.float32)
        for k in range(a_shape[-1]):
            expected = expected + left[..., :, k : k + 1] * right[..., k : k + 1, :]
        assert expected.dtype == np.float32
        np.testing.assert_array_equal(got, expected.reshape(got.shape))


def test_matmul_rounds_each_term_once_where_float64_would_round_twice() -> None:
    """1 + a * b with a * b = 2**-24 + 2**-60 exactly (4097 * 16773121 = 2**36 + 1): the sum lies
    just above the float32 midpoint 1 + 2**-24, and a fused multiply-add rounds it up, to
    1 + 2**-23. Rounded to float64 first, it would be the midpoint itself, and then 1.0."""
    small, large = np.float32(4097 * 2.0**-30), np.float32(16773121 * 2.0**-30)
    a = np.array([[1.0, small], [1.0, small]], np.float32)
    b = np.array([[1.0, 1.0], [large, large]], np.float32)
    model = _product_model("MatMul", [(2, 2), (2, 2)], (2, 2))
    with torch.no_grad():
        got = torchscan.onnx.to_torch(model)(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    np.testing.assert_array_equal(got, np.full((2, 2), 1 + 2.0**-23, np.float32))
    np.testing.assert_array_equal(got, np.matmul(a, b))
    for onnxruntime in run_onnxruntime_on(model, {"a": a, "b": b}).values():
        np.testing.assert_array_equal(got, onnxruntime[0])


@pytest.mark.parametrize("bias", [(3, 4), (4,), ()])
def test_gemm_of_float32_gives_onnxruntime_s_bits(bias: tuple[int, ...]) -> None:
    rng = np.random.default_rng(1)
    rows = 3 if bias == (3, 4) else 300
    a = rng.standard_normal((rows, 3)).astype(np.float32)
    b = rng.standard_normal((4, 3)).astype(np.float32)
    c = rng.standard_normal(bias).astype(np.float32)
    model = _product_model("Gemm", [a.shape, b.shape, c.shape], (len(a), 4), transB=1)
    with torch.no_grad():
        got = torchscan.onnx.to_torch(model)(*map(torch.from_numpy, (a, b, c))).numpy()
    for onnxruntime in run_onnxruntime_on(model, {"a": a, "b": b, "c": c}).values():
        np.testing.assert_array_equal(got, onnxruntime[0])
    np.testing.assert_array_equal(got, a @ b.T + c)  # numpy, as the reference evaluator


def test_matmul_has_torch_s_gradients_and_exports_with_a_dynamic_batch() -> None:
    model = _product_model("MatMul", [("n", 2, 2), (2, 2)], ("n", 2, 2))
    module = torchscan.onnx.to_torch(model)
    a, b = torch.randn(64, 2, 2, requires_grad=True), torch.randn(2, 2, requires_grad=True)
    got = module(a, b)
    got.pow(2).sum().backward()
    want_a, want_b = a.detach().requires_grad_(), b.detach().requires_grad_()
    (want_a @ want_b).pow(2).sum().backward()
    torch.testing.assert_close(a.grad, want_a.grad)
    torch.testing.assert_close(b.grad, want_b.grad)
    with torch.no_grad():
        torch.testing.assert_close(got, module(a, b))  # the same values with autograd
    batch = torch.export.Dim("batch", min=2)
    program = torch.export.export(
        module, (a.detach(), b.detach()), dynamic_shapes=({0: batch}, None)
    )
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert any("matmul" in t or "bmm" in t for t in targets), targets
    assert not any("nextafter" in t for t in targets), targets
    torch.testing.assert_close(program.module()(a[:5].detach(), b.detach()), a[:5] @ b)


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "wrap"])
@pytest.mark.parametrize("pads", [[0, -1, 0, 1], [0, 1, 0, -2], [-1, 2, 1, -1]])
def test_pad_removes_the_elements_of_a_negative_pad_before_it_pads(mode, pads) -> None:
    """``wrap`` wraps around the elements kept, as onnxruntime does."""
    f, i64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    rows, cols = 3 + pads[0] + pads[2], 4 + pads[1] + pads[3]
    graph = oh.make_graph(
        [oh.make_node("Pad", ["x", "pads"], ["y"], mode=mode)],
        "g",
        [oh.make_tensor_value_info("x", f, [3, 4]), oh.make_tensor_value_info("pads", i64, [4])],
        [oh.make_tensor_value_info("y", f, [rows, cols])],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 19)])
    x, p = np.arange(12, dtype=np.float32).reshape(3, 4), np.array(pads, np.int64)
    got = torchscan.onnx.to_torch(model)(torch.from_numpy(x), torch.from_numpy(p)).numpy()
    for onnxruntime in run_onnxruntime_on(model, {"x": x, "pads": p}).values():
        np.testing.assert_array_equal(got, onnxruntime[0])
