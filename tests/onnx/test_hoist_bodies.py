"""Moving loop-invariant and per-step work out of Scan and Loop bodies."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest
import torch

import torchscan
import torchscan.onnx
from torchscan.onnx._export import _hoist_bodies

from .._export import onnx_export
from ._runtimes import assert_runs_close, nodes, run_onnxruntime, run_reference


def export(model: torch.nn.Module, args, dynamic_shapes=None, hoist: bool = True):
    with torchscan.onnx.export_options(hoist_loop_invariants=hoist):
        return onnx_export(model, args, dynamic_shapes=dynamic_shapes).model_proto


def body_of(model: onnx.ModelProto, op: str = "Scan") -> onnx.GraphProto:
    return next(n for n, _ in nodes(model.graph) if n.op_type == op).attribute[0].g


class Recurrent(torch.nn.Module):
    def __init__(self, cell: type[torch.nn.Module], axis: int = 0, reverse: bool = False):
        super().__init__()
        self.cell, self.axis, self.reverse = cell(3, 4), axis, reverse
        self.lstm = cell is torch.nn.LSTMCell

    def forward(self, xs, h):
        def step(state, x):
            if self.lstm:
                state = self.cell(x, state)
                return state, state[0]
            state = self.cell(x, state)
            return state, state

        init = (h, torch.zeros_like(h)) if self.lstm else h
        return torchscan.scan(step, init, xs, axis=self.axis, reverse=self.reverse)


CELLS = [torch.nn.RNNCell, torch.nn.LSTMCell, torch.nn.GRUCell]


@pytest.mark.parametrize(("axis", "reverse"), [(0, False), (1, True)])
@pytest.mark.parametrize("cell", CELLS, ids=lambda c: c.__name__)
def test_input_projection_leaves_the_body(cell, axis: int, reverse: bool) -> None:
    torch.manual_seed(0)
    model = Recurrent(cell, axis, reverse)
    xs = torch.randn(5, 2, 3) if axis == 0 else torch.randn(2, 5, 3)
    args, shapes = (xs, torch.randn(2, 4)), ({axis: torch.export.Dim("T", min=1)}, None)
    hoisted, plain = export(model, args, shapes), export(model, args, shapes, hoist=False)

    def gemms_on_elements(model):
        body = body_of(model)
        elements = {i.name for i in body.input[len(body.input) - 1 :]}
        return [n for n in body.node if n.op_type == "Gemm" and n.input[0] in elements]

    assert len(gemms_on_elements(plain)) == 1
    assert not gemms_on_elements(hoisted)
    assert len(body_of(hoisted).node) < len(body_of(plain).node)
    assert "MatMul" in [n.op_type for n in hoisted.graph.node]  # the projection, batched
    onnx.checker.check_model(hoisted, full_check=True)
    for length in (1, 7):
        shape = (length, 2, 3) if axis == 0 else (2, length, 3)
        inputs = (torch.randn(*shape), torch.randn(2, 4))
        expected = run_onnxruntime(plain, inputs)
        assert_runs_close(run_onnxruntime(hoisted, inputs), expected, rtol=1e-5, atol=1e-6)


class Invariant(torch.nn.Module):
    """A body whose gain depends on nothing that changes: computed once outside."""

    def forward(self, xs, h, gain):
        def body(i, h):
            scale = torch.tanh(gain * 2) + 1  # the same at every iteration
            return h * scale + xs[i], h

        return torchscan.loop(body, h, trip_count=xs.shape[0])


def test_loop_invariant_work_leaves_a_loop_body() -> None:
    args = (torch.randn(5, 4), torch.randn(4), torch.tensor(0.5))
    shapes = ({0: torch.export.Dim("T", min=1)}, None, None)
    hoisted, plain = export(Invariant(), args, shapes), export(Invariant(), args, shapes, False)
    assert "Tanh" in {n.op_type for n in body_of(plain, "Loop").node}
    assert "Tanh" not in {n.op_type for n in body_of(hoisted, "Loop").node}
    assert "Tanh" in {n.op_type for n in hoisted.graph.node}
    inputs = (torch.randn(8, 4), torch.randn(4), torch.tensor(-0.3))
    expected = run_onnxruntime(plain, inputs)
    assert_runs_close(run_onnxruntime(hoisted, inputs), expected, rtol=1e-6, atol=1e-6)


def scan_model(body_nodes: list, body_inputs: list, extra: list | None = None) -> ir.Model:
    """A Scan over xs (T, 2, 3) with state (2, 3), its body given; y is the new state."""
    f = onnx.TensorProto.FLOAT
    body = oh.make_graph(
        body_nodes,
        "body",
        [oh.make_tensor_value_info(n, f, s) for n, s in body_inputs],
        [oh.make_tensor_value_info(n, f, [2, 3]) for n in ("s_out", "y")],
    )
    graph = oh.make_graph(
        [
            *(extra or []),
            oh.make_node(
                "Scan", ["s0", "xs"], ["final", "ys"], body=body, num_scan_inputs=1, name="scan"
            ),
        ],
        "g",
        [
            oh.make_tensor_value_info("s0", f, [2, 3]),
            oh.make_tensor_value_info("xs", f, ["T", 2, 3]),
        ],
        [oh.make_tensor_value_info("final", f, None), oh.make_tensor_value_info("ys", f, None)],
        [onnx.numpy_helper.from_array(np.arange(3, dtype=np.float32), "row")],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    return ir.from_proto(onnx.shape_inference.infer_shapes(model))


SCAN_INPUTS = [("s", [2, 3]), ("x", [2, 3])]


def run_both(model: ir.Model) -> tuple[list, list, onnx.ModelProto]:
    before = ir.serde.serialize_model(model)
    torchscan.onnx.hoist_loop_invariants(model)
    after = ir.serde.serialize_model(model)
    onnx.checker.check_model(after, full_check=True)
    inputs = (torch.randn(2, 3), torch.randn(4, 2, 3))
    return run_reference(after, inputs), run_reference(before, inputs), after


def test_elementwise_work_on_the_elements_is_batched() -> None:
    model = scan_model(
        [
            oh.make_node("Mul", ["x", "row"], ["scaled"]),  # (2, 3) * (3,): batchable
            oh.make_node("Tanh", ["scaled"], ["squashed"]),
            oh.make_node("Add", ["s", "squashed"], ["s_out"]),
            oh.make_node("Identity", ["s_out"], ["y"]),
        ],
        SCAN_INPUTS,
    )
    after_values, before_values, after = run_both(model)
    assert [n.op_type for n in after.graph.node[:2]] == ["Mul", "Tanh"]
    assert [n.op_type for n in body_of(after).node] == ["Add", "Identity"]
    for a, b in zip(after_values, before_values, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_random_work_stays_in_the_body() -> None:
    model = scan_model(
        [
            oh.make_node("RandomUniformLike", ["x"], ["noise"], seed=1.0),
            oh.make_node("Add", ["s", "noise"], ["s_out"]),
            oh.make_node("Identity", ["s_out"], ["y"]),
        ],
        SCAN_INPUTS,
    )
    torchscan.onnx.hoist_loop_invariants(model)
    body = ir.serde.serialize_model(model).graph.node[0].attribute[0].g
    assert [n.op_type for n in body.node] == ["RandomUniformLike", "Add", "Identity"]


def test_broadcasting_that_would_misalign_the_time_axis_stays_in_the_body() -> None:
    # x[0] is (3,): batched it would be (T, 3), which broadcasts against (2, 3) wrongly.
    model = scan_model(
        [
            oh.make_node("Constant", [], ["zero"], value_ints=[0]),
            oh.make_node("Gather", ["x", "zero"], ["first"], axis=0),
            oh.make_node("Squeeze", ["first", "zero"], ["row0"]),
            oh.make_node("Add", ["s", "row0"], ["s_out"]),
            oh.make_node("Identity", ["s_out"], ["y"]),
        ],
        SCAN_INPUTS,
    )
    after_values, before_values, after = run_both(model)
    assert [n.op_type for n in body_of(after).node] == ["Gather", "Squeeze", "Add", "Identity"]
    assert [n.op_type for n in after.graph.node] == ["Constant", "Scan"]  # only the constant
    for a, b in zip(after_values, before_values, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_option_off_leaves_bodies_as_translated() -> None:
    with torchscan.onnx.export_options(hoist_loop_invariants=False) as options:
        assert not options.hoist_loop_invariants
    assert torchscan.onnx.export_options  # and the default is back on:
    from torchscan.onnx._export import _options

    assert _options.current().hoist_loop_invariants


# -- element types the target's Scan does not take ----------------------------------------------

BF16 = onnx.TensorProto.BFLOAT16


def bfloat16_body() -> ir.Model:
    """A Scan of float32 inputs and outputs whose body adds in bfloat16: cast per step, the
    element's cast is batchable, and batched it would be a bfloat16 scanned input."""
    return scan_model(
        [
            oh.make_node("Cast", ["x"], ["x_bf16"], to=BF16),
            oh.make_node("Cast", ["s"], ["s_bf16"], to=BF16),
            oh.make_node("Add", ["s_bf16", "x_bf16"], ["sum_bf16"]),
            oh.make_node("Cast", ["sum_bf16"], ["s_out"], to=onnx.TensorProto.FLOAT),
            oh.make_node("Identity", ["s_out"], ["y"]),
        ],
        SCAN_INPUTS,
    )


def scan_input_types(model: onnx.ModelProto) -> list[int]:
    return [i.type.tensor_type.elem_type for i in body_of(model).input]


@pytest.mark.parametrize("opset", [13, 15, 16, 18])
def test_no_scanned_input_of_a_type_the_target_scan_refuses(opset: int) -> None:
    """bfloat16 came with Scan-16: below, the element's cast stays in the body."""
    model = bfloat16_body()
    before = ir.serde.serialize_model(model)
    torchscan.onnx.hoist_loop_invariants(model, target_opset=opset)
    after = ir.serde.serialize_model(model)
    onnx.checker.check_model(after, full_check=True)
    body_ops = [n.op_type for n in body_of(after).node]
    if opset < 16:
        assert body_ops == ["Cast", "Cast", "Add", "Cast", "Identity"]
        assert BF16 not in scan_input_types(after)
    else:
        assert body_ops == ["Cast", "Add", "Cast", "Identity"]  # the element's cast left
        assert BF16 in scan_input_types(after)
    inputs = (torch.randn(2, 3), torch.randn(4, 2, 3))
    for a, b in zip(run_reference(after, inputs), run_reference(before, inputs), strict=True):
        np.testing.assert_array_equal(a, b)


def test_target_opset_defaults_to_the_models() -> None:
    model = bfloat16_body()
    model.opset_imports[""] = 15
    torchscan.onnx.hoist_loop_invariants(model)
    assert BF16 not in scan_input_types(ir.serde.serialize_model(model))


class BodyOnlyBfloat16(torch.nn.Module):
    """float32 in and out; only the body computes in bfloat16."""

    def forward(self, xs, h):
        return torchscan.scan(lambda c, x: ((c.bfloat16() + x.bfloat16()).float(), c), h, xs)


@pytest.mark.parametrize("opset", [13, 15])
def test_bfloat16_inside_a_body_exports_below_opset_16(opset: int) -> None:
    args = (torch.randn(3, 2, 4), torch.randn(2, 4))
    shapes = ({0: torch.export.Dim("T", min=1)}, None)
    models = []
    for hoist in (True, False):
        with torchscan.onnx.export_options(hoist_loop_invariants=hoist):
            program = onnx_export(
                BodyOnlyBfloat16(), args, opset_version=opset, dynamic_shapes=shapes
            )
        models.append(program.model_proto)
    for model in models:
        onnx.checker.check_model(model, full_check=True)
        assert next(o.version for o in model.opset_import if o.domain == "") == opset
    inputs = (torch.randn(5, 2, 4), torch.randn(2, 4))
    hoisted, plain = (run_reference(model, inputs) for model in models)
    for a, b in zip(hoisted, plain, strict=True):
        np.testing.assert_array_equal(a, b)


def test_scanned_inputs_the_body_no_longer_reads_are_dropped() -> None:
    """A Scan whose body reads one of its two sequences keeps that one only, with its axis and
    direction, and computes the same."""
    body = oh.make_graph(
        [oh.make_node("Add", ["s", "b_t"], ["s_out"]), oh.make_node("Identity", ["s_out"], ["y"])],
        "body",
        [
            oh.make_tensor_value_info("s", onnx.TensorProto.FLOAT, [2]),
            oh.make_tensor_value_info("a_t", onnx.TensorProto.FLOAT, [2]),
            oh.make_tensor_value_info("b_t", onnx.TensorProto.FLOAT, [2]),
        ],
        [
            oh.make_tensor_value_info("s_out", onnx.TensorProto.FLOAT, [2]),
            oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2]),
        ],
    )
    scan = oh.make_node(
        "Scan", ["s0", "a", "b"], ["s_final", "ys"], body=body, num_scan_inputs=2,
        scan_input_axes=[0, 1], scan_input_directions=[0, 1],
    )  # fmt: skip
    graph = oh.make_graph(
        [scan],
        "g",
        [
            oh.make_tensor_value_info("s0", onnx.TensorProto.FLOAT, [2]),
            oh.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [3, 2]),
            oh.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [2, 3]),
        ],
        [
            oh.make_tensor_value_info("s_final", onnx.TensorProto.FLOAT, [2]),
            oh.make_tensor_value_info("ys", onnx.TensorProto.FLOAT, [3, 2]),
        ],
    )
    before = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    model = ir.serde.deserialize_model(before)
    assert _hoist_bodies.drop_unread_sequences(model.graph) == 1
    after = ir.serde.serialize_model(model)
    onnx.checker.check_model(after, full_check=True)
    (node,) = after.graph.node
    attributes = {a.name: oh.get_attribute_value(a) for a in node.attribute}
    assert list(node.input) == ["s0", "b"]
    assert (attributes["num_scan_inputs"], attributes["scan_input_axes"]) == (1, [1])
    assert attributes["scan_input_directions"] == [1]
    inputs = [torch.randn(2), torch.randn(3, 2), torch.randn(2, 3)]
    expected = run_onnxruntime(before, inputs)
    assert_runs_close(run_onnxruntime(after, inputs), expected, rtol=0, atol=0)
    assert _hoist_bodies.drop_unread_sequences(model.graph) == 0
