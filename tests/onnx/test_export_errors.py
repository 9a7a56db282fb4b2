"""What torchscan refuses to export, each with its full message."""

from __future__ import annotations

import inspect
import io
import logging
import warnings
from pathlib import Path

import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest
import torch
from onnxscript import opset18

import torchscan
import torchscan.onnx
import torchscan.theano
from torchscan.onnx._export._convert import OpsetConversionError
from torchscan.onnx._export._element_types import check_loop_types

from .._export import onnx_export
from ._runtimes import assert_outputs_close, eager_outputs, run_onnxruntime

logging.getLogger("torch.onnx").setLevel(logging.ERROR)


class Identity(torch.nn.Module):
    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, xs, h):
        # No arithmetic: ONNX has none on float8, only moves and casts.
        carry, ys = torchscan.scan(lambda c, x: (x, c), h.to(self.dtype), xs.to(self.dtype))
        return carry.float(), ys.float()


ARGS = (torch.randn(3, 2), torch.zeros(2))


def export(model: torch.nn.Module, opset: int | None = 18, **kwargs):
    return onnx_export(model, ARGS, opset_version=opset, **kwargs)


TORCHSCRIPT = (
    "torchscan.scan cannot be exported by the TorchScript-based exporter "
    "(torch.onnx.export(..., dynamo=False) or torch.jit.trace): it would unroll the loop into a "
    "graph fixed to the traced length. Use torch.onnx.export(..., dynamo=True), which exports it "
    "as one ONNX loop."
)


# torch.onnx's own deprecations of the TorchScript-based exporter and of what it calls
@pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:The feature will be removed. Please remove:DeprecationWarning")
def test_torchscript_exporter_is_refused() -> None:
    with pytest.raises(torchscan.ExportError) as info:
        export(Identity(), dynamo=False, f=io.BytesIO())
    assert str(info.value) == TORCHSCRIPT


def test_torch_jit_trace_is_refused() -> None:
    with warnings.catch_warnings():
        # torch.jit.trace's own deprecation: a DeprecationWarning up to torch 2.14, a
        # FutureWarning from 2.15 on.
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.trace(_method)?` is deprecated")
        with pytest.raises(torchscan.ExportError) as info:
            torch.jit.trace(Identity(), ARGS)
    assert str(info.value) == TORCHSCRIPT


def test_export_error_is_a_not_implemented_error() -> None:
    assert issubclass(torchscan.ExportError, NotImplementedError)
    assert issubclass(torchscan.onnx.OpsetConversionError, torchscan.ExportError)


class ChangesCarry(torch.nn.Module):
    def forward(self, xs, h):
        return torchscan.scan(lambda c, x: (c.double() + x, c), h, xs)


def test_carry_errors_surface_as_in_eager() -> None:
    with pytest.raises(TypeError) as info:
        export(ChangesCarry())
    assert str(info.value) == (
        "torchscan.scan: the carry must keep its type, but fn changed it:\n"
        "  * carry has dtype torch.float32 but fn returned dtype torch.float64\n"
        "Return a carry with the shape, dtype and device of init (cast or reshape it, or change "
        "init)."
    )


class CountsInBuffer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(2))

    def forward(self, xs, h):
        def step(c, x):
            self.count.add_(1)
            return c + x * self.count, c

        return torchscan.scan(step, h, xs)


class ScalesSlice(torch.nn.Module):
    def forward(self, xs, h):
        def step(c, x):
            x.mul_(2)
            return c + x, c

        return torchscan.scan(step, h, xs)


class ScalesNamedSlice(torch.nn.Module):
    def forward(self, xs, h):
        def step(c, x):
            x["b"].mul_(2)
            return c + x["a"] + x["b"], c

        return torchscan.scan(step, h, {"a": xs, "b": xs * 1})


def source_line(fn, text: str) -> str:
    """``file:line`` of the first line of ``fn``'s source that holds ``text``."""
    lines, start = inspect.getsourcelines(fn)
    offset = next(i for i, line in enumerate(lines) if text in line)
    return f"{inspect.getsourcefile(fn)}:{start + offset}"


def test_in_place_writes_into_a_captured_tensor_are_refused() -> None:
    with pytest.raises(torchscan.ExportError) as info:
        export(CountsInBuffer())
    assert str(info.value) == (
        "torchscan.scan: fn (CountsInBuffer.forward.<locals>.step) modifies in place self.count "
        f"(float32[2] on cpu) with add_ at {source_line(CountsInBuffer.forward, 'add_')}, which an "
        "exported loop cannot do (the model would compute something else than eager PyTorch). "
        "Return the new value as part of the carry instead (a running statistic or a counter "
        "updated at every step is a carry of the loop)."
    )


def in_place_refusal(api: str, fn: str, what: str) -> str:
    return (
        f"{api}: {fn} must not change its arguments in place, but it changed {what}. An exported "
        "loop could not do the same. Compute new tensors instead: h = h * 2 rather than "
        "h.mul_(2) or h *= 2, and o = o.clone() before writing into o[i]."
    )


class ScalesCarry(torch.nn.Module):
    def forward(self, xs, h):
        def step(c, x):
            c.mul_(2).add_(x)
            return c, c

        return torchscan.scan(step, h, xs)


class WritesIntoCarriedBuffer(torch.nn.Module):
    def forward(self, xs, h):
        def body(i, carry):
            h, o = carry
            o[i] = h
            return (h + xs[i], o), None

        return torchscan.loop(body, (h, torch.zeros_like(xs)), trip_count=xs.shape[0])


class IncrementsCounter(torch.nn.Module):
    def forward(self, xs, h):
        def body(i, h):
            i += 1
            return h + xs[i - 1], None

        return torchscan.loop(body, h, trip_count=xs.shape[0])


class TheanoScalesState(torch.nn.Module):
    def forward(self, xs, h):
        def step(x, h):
            return h.mul_(2).add_(x)

        return torchscan.theano.scan(step, sequences=[xs], outputs_info=[h])[0]


class TheanoScalesTap(torch.nn.Module):
    def forward(self, xs, h):
        def step(x_prev, x, h):
            x_prev.mul_(2)
            return h + x + x_prev

        return torchscan.theano.scan(
            step, sequences=[{"input": xs, "taps": [-1, 0]}], outputs_info=[h]
        )[0]


@pytest.mark.parametrize(
    ("model", "api", "fn", "what"),
    [
        (ScalesSlice, "torchscan.scan", "fn", ("x", "mul_", "mul_")),
        (ScalesNamedSlice, "torchscan.scan", "fn", ("x['b']", "mul_", "mul_")),
        (ScalesCarry, "torchscan.scan", "fn", ("carry", "mul_", "mul_")),
        (WritesIntoCarriedBuffer, "torchscan.loop", "body", ("carry[1]", "__setitem__", "o[i]")),
        (IncrementsCounter, "torchscan.loop", "body", ("i", "add_", "i += 1")),
        (
            TheanoScalesState,
            "torchscan.theano.scan",
            "fn",
            ("outputs_info[0] at tap -1", "mul_", "mul_"),
        ),
        (
            TheanoScalesTap,
            "torchscan.theano.scan",
            "fn",
            ("sequences[0] at tap -1", "mul_", "mul_"),
        ),
    ],
    ids=[
        "slice",
        "named-slice",
        "carry",
        "carried-buffer",
        "counter",
        "theano-state",
        "theano-tap",
    ],
)
def test_in_place_changes_of_the_arguments_are_refused_as_eagerly(model, api, fn, what) -> None:
    """The export refuses what eager execution refuses, with the same words (less the step):
    the step function, the leaf, the operator and the line."""
    leaf, op, text = what
    step = "body" if fn == "body" else "step"
    fn = f"{fn} ({model.__name__}.forward.<locals>.{step})"
    what = f"{leaf} with {op} at {source_line(model.forward, text)}"
    xs, h = torch.ones(4, 3), torch.zeros(3)
    with pytest.raises(torchscan.TorchscanValueError) as info:
        model()(xs, h)
    assert str(info.value).startswith(f"{api}: {fn} must not change its arguments in place")
    assert what in str(info.value)
    assert torch.equal(xs, torch.ones(4, 3))
    assert torch.equal(h, torch.zeros(3))
    with pytest.raises(torchscan.TorchscanValueError) as info:
        torch.export.export(model(), (xs, h))
    assert str(info.value) == in_place_refusal(api, fn, what)
    with pytest.raises(torchscan.TorchscanValueError) as info:
        export(model())
    assert str(info.value) == in_place_refusal(api, fn, what)


def type_refusal(api: str, leaf: str, dtype: str, op: str, opset: int, version: int, first: int):
    return (
        f"{api}: {leaf} has dtype torch.{dtype}, which ONNX {op}-{version} (the version in force "
        f"at opset {opset}) does not allow; the first opset that allows it is {first}. To export "
        f"it, export with opset_version={first} or newer, or cast {leaf} to a type that opset "
        f"{opset} allows."
    )


@pytest.mark.parametrize(
    ("dtype", "opset", "version", "first"),
    [
        (torch.bfloat16, 13, 11, 16),
        (torch.bfloat16, 15, 11, 16),
        (torch.float8_e4m3fn, 18, 16, 19),
        (torch.float8_e5m2, 18, 16, 19),
    ],
    ids=["bfloat16@13", "bfloat16@15", "float8e4m3fn@18", "float8e5m2@18"],
)
def test_element_types_the_target_scan_refuses(dtype, opset: int, version: int, first: int):
    with pytest.raises(torchscan.ExportError) as info:
        export(Identity(dtype), opset)
    name = str(dtype).removeprefix("torch.")
    assert str(info.value) == type_refusal(
        "torchscan.scan", "carry", name, "Scan", opset, version, first
    )


class NestedLeaves(torch.nn.Module):
    """Leaves of several types in dicts: the refusal names the first the Scan cannot take."""

    def __init__(self, xs_type: torch.dtype, y_type: torch.dtype) -> None:
        super().__init__()
        self.xs_type, self.y_type = xs_type, y_type

    def forward(self, xs, h):
        def step(c, x):
            h = c["h"] + x["a"] + x["b"].float()
            return {"h": h}, {"out": (h, h.to(self.y_type))}

        sequences = {"a": xs, "b": xs.to(self.xs_type)}
        carry, ys = torchscan.scan(step, {"h": h}, sequences)
        return carry["h"], ys["out"][1].float()


@pytest.mark.parametrize(
    ("xs_type", "y_type", "leaf"),
    [
        (torch.bfloat16, torch.float32, "xs['b']"),
        (torch.float32, torch.bfloat16, "y['out'][1]"),
    ],
    ids=["sequence", "output"],
)
def test_type_refusals_name_the_leaf_by_its_path(xs_type, y_type, leaf: str) -> None:
    with pytest.raises(torchscan.ExportError) as info:
        export(NestedLeaves(xs_type, y_type), 13)
    assert str(info.value) == type_refusal("torchscan.scan", leaf, "bfloat16", "Scan", 13, 11, 16)


def test_an_export_that_names_no_opset_is_checked_at_torch_onnx_s_default(monkeypatch) -> None:
    """An export that names no opset gets torch.onnx's default (20 in torch 2.13), where Scan
    allows float8; the types are checked against that default, resolved once per export."""
    from torchscan import _compat

    default = _compat.onnx_default_opset()
    assert default >= 19
    model = export(Identity(torch.float8_e5m2), opset=None).model_proto
    assert [o.version for o in model.opset_import if o.domain == ""] == [default]
    monkeypatch.setattr(_compat, "onnx_default_opset", lambda: 18)
    with pytest.raises(torchscan.ExportError) as info:
        export(Identity(torch.float8_e5m2), opset=None)
    assert str(info.value) == type_refusal(
        "torchscan.scan", "carry", "float8_e5m2", "Scan", 18, 16, 19
    )


@pytest.mark.parametrize(
    ("dtype", "opset"),
    [(torch.bfloat16, 18), (torch.float8_e4m3fn, 19), (torch.float8_e5m2, 21)],
    ids=["bfloat16@18", "float8e4m3fn@19", "float8e5m2@21"],
)
def test_element_types_allowed_from_their_first_opset(dtype, opset: int) -> None:
    model = export(Identity(dtype), opset).model_proto
    onnx.checker.check_model(model, full_check=True)
    scan = next(n for n in model.graph.node if n.op_type == "Scan")
    assert scan.input


# Types torch cannot export yet are checked on graphs built by hand.
ONNX_ONLY = [
    (onnx.TensorProto.INT4, 21),
    (onnx.TensorProto.UINT4, 21),
    (onnx.TensorProto.FLOAT4E2M1, 23),
    (onnx.TensorProto.FLOAT8E8M0, 24),
    (onnx.TensorProto.INT2, 25),
    (onnx.TensorProto.UINT2, 25),
]


def hand_built(op: str, elem_type: int, opset: int) -> ir.Graph:
    state = oh.make_tensor_value_info("state", elem_type, [2])
    if op == "Scan":
        body = oh.make_graph(
            [oh.make_node("Identity", ["s_in"], ["s_out"]), oh.make_node("Identity", ["x"], ["y"])],
            "body",
            [oh.make_tensor_value_info(n, elem_type, [2]) for n in ("s_in", "x")],
            [oh.make_tensor_value_info(n, elem_type, [2]) for n in ("s_out", "y")],
        )
        node = oh.make_node(
            "Scan", ["state", "xs"], ["final", "ys"], name="the_loop", body=body, num_scan_inputs=1
        )
        inputs = [state, oh.make_tensor_value_info("xs", elem_type, [3, 2])]
        outputs = [oh.make_tensor_value_info(n, elem_type, None) for n in ("final", "ys")]
    else:
        body = oh.make_graph(
            [
                oh.make_node("Identity", ["c_in"], ["c_out"]),
                oh.make_node("Identity", ["s_in"], ["s_out"]),
            ],
            "body",
            [
                oh.make_tensor_value_info("i", onnx.TensorProto.INT64, []),
                oh.make_tensor_value_info("c_in", onnx.TensorProto.BOOL, []),
                oh.make_tensor_value_info("s_in", elem_type, [2]),
            ],
            [
                oh.make_tensor_value_info("c_out", onnx.TensorProto.BOOL, []),
                oh.make_tensor_value_info("s_out", elem_type, [2]),
            ],
        )
        node = oh.make_node("Loop", ["m", "", "state"], ["final"], name="the_loop", body=body)
        inputs = [oh.make_tensor_value_info("m", onnx.TensorProto.INT64, []), state]
        outputs = [oh.make_tensor_value_info("final", elem_type, None)]
    graph = oh.make_graph([node], "g", inputs, outputs)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])
    return ir.from_proto(model).graph


@pytest.mark.parametrize("op", ["Scan", "Loop"])
@pytest.mark.parametrize(("elem_type", "first"), ONNX_ONLY, ids=[str(t) for t, _ in ONNX_ONLY])
def test_hand_built_loops_are_checked_against_their_version(op: str, elem_type: int, first: int):
    check_loop_types(hand_built(op, elem_type, first), first)
    with pytest.raises(torchscan.ExportError) as info:
        check_loop_types(hand_built(op, elem_type, first - 1), first - 1)
    name = ir.DataType(elem_type).name.lower()
    assert str(info.value).startswith(
        f"torch.onnx.export: the {op} node 'the_loop' has initial carried value 0, tensor "
        f"'state', of "
        f"element type {name}, which {op}-"
    )
    assert f"the first opset that allows it is {first}." in str(info.value)


class LoopIdentity(torch.nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, xs, h):
        carry, ys = torchscan.loop(lambda i, c: (c, c), h.to(self.dtype), trip_count=3)
        return carry.float(), ys.float()


def test_loop_element_types_are_checked_too() -> None:
    with pytest.raises(torchscan.ExportError) as info:
        export(LoopIdentity(torch.bfloat16), 13)
    assert str(info.value) == type_refusal(
        "torchscan.loop", "carry", "bfloat16", "Loop", 13, 13, 16
    )


class StopsEarlyOnBfloat16(torch.nn.Module):
    """A scan with until is a Loop that reads xs by index: only the carry and y are the Loop's."""

    def forward(self, xs, h):
        def step(c, x):
            c = c + x.float()
            return c, c.bfloat16(), torchscan.until(c.sum() > 100)

        carry, ys = torchscan.scan(step, h, xs.bfloat16())
        return carry, ys.float()


def test_a_scan_that_stops_early_is_checked_as_a_loop() -> None:
    with pytest.raises(torchscan.ExportError) as info:
        export(StopsEarlyOnBfloat16(), 13)
    assert str(info.value) == type_refusal("torchscan.scan", "y", "bfloat16", "Loop", 13, 13, 16)


class Bfloat16Sequence(torch.nn.Module):
    """A bfloat16 sequence whose per-step cast to float the hoisting pass would batch, leaving
    the Scan a float32 input: the check holds the scan as written, with or without hoisting."""

    def forward(self, xs, h):
        return torchscan.scan(lambda c, x: (c + x.float() * 2, c), h, xs.bfloat16())


@pytest.mark.parametrize("hoist", [True, False], ids=["hoisted", "not-hoisted"])
def test_element_types_are_checked_on_the_scan_as_written(hoist: bool) -> None:
    with (
        torchscan.onnx.export_options(hoist_loop_invariants=hoist),
        pytest.raises(torchscan.ExportError) as info,
    ):
        export(Bfloat16Sequence(), 15)
    assert str(info.value) == type_refusal("torchscan.scan", "xs", "bfloat16", "Scan", 15, 11, 16)


# -- conversion below opset 18 --------------------------------------------------------------------


class GRUThenGelu(torch.nn.Module):
    """At opset 8 the model as built holds a SplitToSequence (torch's chunk of the GRU gates),
    which the optimizer turns into a Split; the real blocker is GELU's Erf."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = torch.nn.GRUCell(2, 2)

    def forward(self, xs, h):
        ys = torchscan.scan(lambda h, x: (self.cell(x, h),) * 2, h, xs)[1]
        return torch.nn.functional.gelu(ys)


@pytest.mark.parametrize(
    ("model", "opset", "message"),
    [
        (
            GRUThenGelu, 8,
            "torch.onnx.export: cannot convert Erf (node 'node_Erf_2') from opset 9 to opset 8: "
            "Erf "
            "does not exist before opset 9 and its inputs are not constants. Export with a newer "
            "opset_version (at opset 9 this Erf is kept as it is), or compute it in the step "
            "with operators that opset 8 has.",
        ),
    ],
    ids=["erf@8"],
)  # fmt: skip
def test_conversion_refusals_name_the_real_blocker(model, opset: int, message: str) -> None:
    with pytest.raises(OpsetConversionError) as info:
        export(model().eval(), opset)
    assert str(info.value) == message


# -- what torch cannot trace or translate in a step ---------------------------------------------

T = torch.export.Dim("T", min=1)


def export_dynamic(model: torch.nn.Module, args: tuple, **kwargs):
    """At opset 18, the sequences (the first argument) of any length."""
    dynamic = ({0: T}, *[None] * (len(args) - 1))
    return onnx_export(model, args, opset_version=18, dynamic_shapes=dynamic, **kwargs)


def line_of(mark: str) -> str:
    """``file:line`` of the line of this file that ends with the comment ``# <mark>``."""
    lines = Path(__file__).read_text().splitlines()
    (number,) = [i for i, line in enumerate(lines, 1) if line.endswith(f"  # <{mark}>")]
    return f"{__file__}:{number}"


class Linalg(torch.nn.Module):
    """A Kalman-like step that inverts, solves with or factors the matrix it computes."""

    def __init__(self, function: str) -> None:
        super().__init__()
        self.function = function

    def forward(self, Ss, P):
        def step(P, S):
            A = S + P
            if self.function == "linalg.inv":
                return torch.linalg.inv(A), P  # <linalg.inv>
            if self.function == "linalg.solve":
                return torch.linalg.solve(A, P), P  # <linalg.solve>
            return torch.linalg.cholesky(A), P  # <linalg.cholesky>

        return torchscan.scan(step, P, Ss)


MATRICES = (torch.eye(2).repeat(3, 1, 1) * 2, torch.eye(2))


@pytest.mark.parametrize(
    ("function", "invalid", "closed_form"),
    [
        (
            "linalg.inv", "a singular matrix",
            "for a 2x2 or 3x3 matrix, the adjugate divided by torch.linalg.det, which exports",
        ),
        (
            "linalg.solve", "a singular matrix",
            "for a small system A x = b, the adjugate of A times b divided by "
            "torch.linalg.det(A), which exports",
        ),
        (
            "linalg.cholesky", "a matrix that is not positive-definite",
            "for a 2x2 matrix [[a, b], [b, d]], [[sqrt(a), 0], [b / sqrt(a), "
            "sqrt(d - b * b / a)]]",
        ),
    ],
    ids=["inv", "solve", "cholesky"],
)  # fmt: skip
def test_linalg_functions_that_check_their_input_are_refused(function, invalid, closed_form):
    """torch decomposes them into their ``_ex`` form and an error check with an effect token,
    which a loop step cannot hold; torch.onnx has no translation of them either."""
    with pytest.raises(torchscan.ExportError) as info:
        export_dynamic(Linalg(function), MATRICES)
    aten = function.replace(".", "_")
    assert str(info.value) == (
        f"torchscan.scan: fn (Linalg.forward.<locals>.step) calls torch.{function} at "
        f"{line_of(function)}, which cannot be exported in a loop step: torch raises an error on "
        f"{invalid}, a side effect that torch.export cannot keep inside a loop, and torch.onnx "
        f"has no translation of torch.{function}. Write it out in closed form ({closed_form}), "
        "or give torch.onnx.export a translation: custom_translation_table="
        f"{{torch.ops.aten.{aten}.default: <an ONNX Script function>}}."
    )


def stand_in(a, *args, **kwargs):
    """A translation in custom_translation_table: the first input as it is."""
    return opset18.Identity(a)


@pytest.mark.parametrize(
    ("model", "args", "op"),
    [
        (Linalg("linalg.inv"), MATRICES, torch.ops.aten.linalg_inv.default),
        (Linalg("linalg.cholesky"), MATRICES, torch.ops.aten.linalg_cholesky.default),
    ],
    ids=["inv", "cholesky"],
)
def test_the_translation_the_refusal_names_exports(model, args, op) -> None:
    program = export_dynamic(model, args, custom_translation_table={op: stand_in})
    assert [node.op_type for node in program.model_proto.graph.node] == ["Scan"]


class ClosedFormInverse(torch.nn.Module):
    def forward(self, Ss, P):
        def step(P, S):
            A = S + P
            adjugate = torch.stack([A[1, 1], -A[0, 1], -A[1, 0], A[0, 0]]).reshape(2, 2)
            return adjugate / torch.linalg.det(A), P

        return torchscan.scan(step, P, Ss)


def test_the_closed_form_the_refusal_names_exports() -> None:
    model = ClosedFormInverse()
    program = export_dynamic(model, MATRICES).model_proto
    inputs = (torch.eye(2).repeat(5, 1, 1) * 2 + torch.rand(5, 2, 2), MATRICES[1])
    assert_outputs_close(run_onnxruntime(program, inputs), eager_outputs(model, inputs), program)


class Kthvalue(torch.nn.Module):
    def forward(self, xs, h):
        def step(c, x):
            c = c + torch.kthvalue(x, 1).values  # <kthvalue>
            return c, c

        return torchscan.scan(step, h, xs)


class Digamma(torch.nn.Module):
    def forward(self, xs, h):
        return torchscan.loop(
            lambda i, c: (torch.digamma(c + xs[i]), c),  # <digamma>
            h,
            trip_count=xs.shape[0],
        )


class NestedDigamma(torch.nn.Module):
    def forward(self, xs, h):
        def outer(i, c):
            def inner(d, x):
                return d + torch.digamma(x), d  # <nested digamma>

            return torchscan.scan(inner, c, xs)[0], None

        return torchscan.loop(outer, h, trip_count=2)[0]


@pytest.mark.parametrize(
    ("model", "called", "message"),
    [
        (Kthvalue, "aten.kthvalue.default", "torchscan.scan: fn (Kthvalue.forward.<locals>.step) "
         f"calls aten.kthvalue.default at {line_of('kthvalue')}, which torch.onnx cannot translate "
         "to ONNX."),
        (Digamma, "aten.digamma.default",
         f"torchscan.loop: body (Digamma.forward.<locals>.<lambda>) calls aten.digamma.default "
         f"at {line_of('digamma')}, which torch.onnx cannot translate "
         "to ONNX (torch decomposes it into prims.digamma.default, which has none)."),
        (NestedDigamma, "aten.digamma.default", "torchscan.scan: fn "
         "(NestedDigamma.forward.<locals>.outer.<locals>.inner) calls aten.digamma.default at "
         f"{line_of('nested digamma')}, which torch.onnx cannot translate to ONNX (torch "
         "decomposes it into prims.digamma.default, which has none)."),
    ],
    ids=["scan", "loop-decomposed", "nested"],
)  # fmt: skip
def test_operators_without_translation_name_the_step(model, called: str, message: str) -> None:
    with pytest.raises(torchscan.ExportError) as info:
        export_dynamic(model(), ARGS)
    assert str(info.value) == (
        f"{message} Compute it with operators that torch.onnx translates, or give "
        f"torch.onnx.export a translation: custom_translation_table={{torch.ops.{called}: <an "
        "ONNX Script function>}."
    )


def lstm_step(carry, x):  # a step whose LSTM cell torch runs as a GPU's own kernel there
    return carry, x


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_an_operator_of_one_device_names_the_export_on_the_cpu(device: str) -> None:
    """On a GPU, ``torch.nn.LSTMCell`` is ``aten._thnn_fused_lstm_cell``, which torch.onnx does
    not translate; exported on the CPU, the cell is ordinary operators. The refusal says so
    (fake tensors stand for the GPU's, so that this runs on any machine)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from torchscan._source import StepSource
    from torchscan._traced._step_errors import STEP_KEY, untranslatable

    graph = torch.fx.Graph()
    with FakeTensorMode():
        values = [torch.empty(2, 12, device=device) for _ in range(2)]
        values.append(torch.empty(2, 3, device=device))
    inputs = []
    for name, value in zip(("input_gates", "hidden_gates", "cx"), values, strict=True):
        node = graph.placeholder(name)
        node.meta["val"] = value
        inputs.append(node)
    cell = graph.call_function(torch.ops.aten._thnn_fused_lstm_cell.default, tuple(inputs))
    graph.output(cell)
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    gm.meta[STEP_KEY] = StepSource.of(lstm_step, "torchscan.scan", "fn")
    error = untranslatable(cell)
    assert isinstance(error, torchscan.ExportError)
    remedy = (
        "with operators that torch.onnx translates, or give torch.onnx.export a translation: "
        "custom_translation_table={torch.ops.aten._thnn_fused_lstm_cell.default: <an ONNX "
        "Script function>}."
    )
    refusal = (
        "torchscan.scan: fn (lstm_step) calls aten._thnn_fused_lstm_cell.default, which "
        "torch.onnx cannot translate to ONNX."
    )
    if device == "cuda":
        assert str(error) == (
            f"{refusal} It is a kernel of the cuda device, which torch chose because the "
            "model's tensors are on it: export a copy of the model on the CPU "
            "(copy.deepcopy(model).cpu() and CPU inputs), whose ONNX graph runs anywhere, or "
            f"compute it {remedy}"
        )
    else:
        assert str(error) == f"{refusal} Compute it {remedy}"


def test_the_operator_the_refusal_names_is_the_one_to_translate() -> None:
    """A translation of the operator called keeps torch from decomposing it."""
    table = {torch.ops.aten.digamma.default: stand_in}
    program = export_dynamic(Digamma(), ARGS, custom_translation_table=table)
    assert [node.op_type for node in program.model_proto.graph.node].count("Loop") == 1


class ComplexExp(torch.nn.Module):
    def forward(self, xs, h):
        def step(c, x):
            z = torch.exp(torch.complex(c, x))  # <complex>
            return z.real, z.imag

        return torchscan.scan(step, h, xs)


def test_complex_operators_without_translation_name_the_step() -> None:
    with pytest.raises(torchscan.ExportError) as info:
        export_dynamic(ComplexExp(), ARGS)
    assert str(info.value) == (
        "torchscan.scan: fn (ComplexExp.forward.<locals>.step) calls aten.exp.default on a "
        f"complex tensor at {line_of('complex')}, which torch.onnx cannot translate: it exports "
        "few operators of complex tensors. Carry the real and imaginary parts as two real tensors "
        "and write the complex arithmetic out with them: (a + ib)(c + id) = (ac - bd) + "
        "i(ad + bc), exp(a + ib) = exp(a)(cos b + i sin b)."
    )


def positive(h):
    if h.sum() > 0:  # <helper>
        return h
    return -h


class BranchesOnValue(torch.nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how

    def forward(self, xs, h):
        def step(c, x):
            if self.how == "if":
                if x.sum() > 0:  # <if>
                    c = c + x
            elif self.how == "int":
                c = c * (2.0, 3.0)[int(x.argmax())]  # <int>
            else:
                c = positive(c + x)  # <calls helper>
            return c, c

        if self.how == "loop":
            return torchscan.loop(
                lambda i, c: (c + 1 if c.sum() > 0 else c, c),  # <loop>
                h,
                trip_count=xs.shape[0],
            )
        return torchscan.scan(step, h, xs)


@pytest.mark.parametrize(
    ("how", "who", "where"),
    [
        ("if", "torchscan.scan: fn (BranchesOnValue.forward.<locals>.step)", line_of("if")),
        ("int", "torchscan.scan: fn (BranchesOnValue.forward.<locals>.step)", line_of("int")),
        ("helper", "torchscan.scan: fn (BranchesOnValue.forward.<locals>.step)",
         f"{line_of('calls helper')} (in positive, {line_of('helper')})"),
        ("loop", "torchscan.loop: body (BranchesOnValue.forward.<locals>.<lambda>)",
         line_of("loop")),
    ],
    ids=["if", "int", "helper", "loop"],
)  # fmt: skip
def test_python_control_flow_on_tensor_values_names_the_line(how: str, who: str, where: str):
    with pytest.raises(torchscan.ExportError) as info:
        export_dynamic(BranchesOnValue(how), ARGS)
    assert str(info.value) == (
        f"{who} reads the value of a tensor at {where}, which is known only when the exported "
        "model runs: the step is traced once for all steps, so Python control flow on a tensor "
        "(if, while, bool(), int(), .item()) cannot be exported. Choose between values with "
        "torch.where(condition, a, b), or between two computations with "
        "torch.cond(condition, true_fn, false_fn, operands)."
    )


class StrictScan(torch.nn.Module):
    def forward(self, xs, h):
        return torchscan.scan(lambda h, x: (h + x, h * 2), h, xs)


class StrictLoop(torch.nn.Module):
    def forward(self, xs, h):
        return torchscan.loop(lambda i, h: (h + xs[i], h), h, trip_count=xs.shape[0])


class StrictTheano(torch.nn.Module):
    def forward(self, xs, h):
        return torchscan.theano.scan(lambda x, h: h + x, sequences=xs, outputs_info=h)[0]


@pytest.mark.parametrize(
    ("model", "api"),
    [
        (BranchesOnValue("if"), "torchscan.scan"),
        (StrictScan(), "torchscan.scan"),
        (StrictLoop(), "torchscan.loop"),
        (StrictTheano(), "torchscan.theano.scan"),
    ],
    ids=["scan-before-its-step", "scan", "loop", "theano-scan"],
)
def test_strict_export_is_refused_with_torchscans_error(model: torch.nn.Module, api: str) -> None:
    """torch.export.export(..., strict=True) gets torchscan's error itself, not TorchDynamo's
    report of an exception, before the step is traced (torch.onnx.export tries strict mode after
    a failed non-strict export, and tracing a step with TorchDynamo can take minutes)."""
    with pytest.raises(torchscan.ExportError) as info:
        torch.export.export(model, ARGS, strict=True)
    assert str(info.value) == (
        f"{api} cannot be exported by torch.export.export(..., strict=True): TorchDynamo, "
        "which strict mode runs, does not support torchscan's loop operators. Export with "
        "strict=False, torch.export.export's default and what torch.onnx.export(..., "
        "dynamo=True) tries first."
    )


class TheanoBranches(torch.nn.Module):
    def forward(self, xs, h):
        def step(x, c):
            return c + x if x.sum() > 0 else c  # <theano>

        outputs, _ = torchscan.theano.scan(step, sequences=xs, outputs_info=h)
        return outputs


def test_theano_refusals_name_the_users_fn() -> None:
    with pytest.raises(torchscan.ExportError) as info:
        export_dynamic(TheanoBranches(), ARGS)
    assert str(info.value).startswith(
        "torchscan.scan: fn (TheanoBranches.forward.<locals>.step) reads the value of a tensor at "
        f"{line_of('theano')}, which is known only when the exported model runs"
    )


class CondCallsSubmodule(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)

    def forward(self, xs, h):
        def step(c, x):
            c = torch.cond(x.sum() > 0, lambda: self.linear(c + x), lambda: c - x)  # <cond>
            return c, c

        return torchscan.scan(step, h, xs)


def test_cond_whose_branch_calls_a_submodule_names_the_line() -> None:
    """torch.cond traces its branches with TorchDynamo, which fails on fx's wrapper of module
    calls while the step is traced; a branch that only reads tensors exports."""
    with pytest.raises(torchscan.ExportError) as info:
        export_dynamic(CondCallsSubmodule(), ARGS)
    assert str(info.value) == (
        "torchscan.scan: fn (CondCallsSubmodule.forward.<locals>.step) calls torch.cond at "
        f"{line_of('cond')}, whose branches torch could not trace inside the loop step: "
        "TorchDynamo, which traces them, fails on a branch that calls a submodule "
        "(self.linear(x)) there. Use the submodule's parameters in the branch "
        "(x @ self.linear.weight.T + self.linear.bias), call the submodule outside torch.cond, "
        "or choose between values with torch.where(condition, a, b)."
    )


def test_the_refusal_raised_from_torch_onnx_is_not_in_its_own_context() -> None:
    """Code that follows ``__cause__`` and ``__context__`` reaches the end."""
    with pytest.raises(torchscan.ExportError) as info:
        export_dynamic(BranchesOnValue("if"), ARGS)
    refusal = info.value
    assert refusal.__cause__ is None
    assert refusal.__suppress_context__
    chain, current = [], refusal.__context__
    while current is not None and len(chain) < 20:
        chain.append(current)
        current = current.__cause__ or current.__context__
    assert current is None
    assert refusal not in chain


class UntilOnlySometimes(torch.nn.Module):
    """A step that returns until in one call and not in the next: no one operator fits it."""

    def forward(self, xs, h):
        calls = []

        def step(c, x):
            calls.append(None)
            c = c + x
            if len(calls) == 1:
                return c, c
            return c, c, torchscan.until(c.sum() > 100)

        return torchscan.scan(step, h, xs)


def test_a_step_that_returns_until_only_sometimes_is_refused() -> None:
    with pytest.raises(torchscan.TorchscanValueError) as info:
        export(UntilOnlySometimes())
    assert (
        "torchscan.scan: fn returned until in one call and not in another on the same shapes: "
        "return until from every call, or from none"
    ) in str(info.value)


def test_a_nested_scan_is_traced_a_bounded_number_of_times() -> None:
    """The operator of a scan is chosen by one run of its step on fake tensors; within that run,
    a nested scan is not traced again, so the innermost step runs a number of times that grows
    with the depth of nesting, not exponentially."""
    runs = {"inner": 0}

    def innermost(c, x):
        runs["inner"] += 1
        return torch.tanh(c + x), c

    def level(step):
        def outer(c, x):
            c, _ = torchscan.scan(step, c, x.unsqueeze(0).expand(2, *x.shape))
            return c, c

        return outer

    class Nested(torch.nn.Module):
        def forward(self, xs, h):
            return torchscan.scan(level(level(innermost)), h, xs)

    h, xs = torch.zeros(2, 3), torch.randn(4, 2, 3)
    expected = Nested()(xs, h)
    runs["inner"] = 0
    torch.export.export(Nested(), (xs, h))
    assert runs["inner"] <= 6  # 2 ** 3 = 8 where every level traced its step twice
    with torch.no_grad():
        got = torch.export.export(Nested(), (xs, h)).module()(xs, h)
    torch.testing.assert_close(got, expected)


class Likelihood(torch.nn.Module):
    """A step that scores its carry under a distribution made from x, as samplers and filters
    do; ``validate_args`` as given (True checks the arguments' values)."""

    def __init__(self, validate_args: bool) -> None:
        super().__init__()
        self.validate_args = validate_args

    def forward(self, xs, h):
        def step(c, x):
            checks = self.validate_args
            d = torch.distributions.Normal(x, torch.ones_like(x), validate_args=checks)  # <normal>
            return c + d.log_prob(c), c

        return torchscan.scan(step, h, xs)


def test_a_distribution_that_checks_its_arguments_is_refused_naming_validate_args():
    # torch's default, which TorchDynamo turns off for the whole process when it first runs
    with pytest.raises(torchscan.ExportError) as info:
        export_dynamic(Likelihood(True), ARGS)
    fix = (
        "make it with validate_args=False (torch.distributions.Normal(loc, scale, "
        "validate_args=False)), or turn the checks off for every distribution with "
        "torch.distributions.Distribution.set_default_validate_args(False)."
    )
    who = "torchscan.scan: fn (Likelihood.forward.<locals>.step)"
    if hasattr(torch.distributions.distribution, "_all_true_or_runtime_assert"):
        # from torch 2.15, the check is an assertion at run time while torch exports
        assert str(info.value) == (
            f"{who} makes a torch.distributions object that checks its arguments (validate_args) "
            f"at {line_of('normal')}: torch exports the check as an assertion at run time "
            "(aten._is_all_true.default), which torch.onnx cannot translate to ONNX. To export "
            f"it, {fix}"
        )
    else:  # which reads the arguments' values
        assert str(info.value) == (
            f"{who} reads the value of a tensor at {line_of('normal')}, which is known only when "
            "the exported model runs: the step is traced once for all steps, so Python control "
            "flow on a tensor (if, while, bool(), int(), .item()) cannot be exported. "
            "torch.distributions checks the values of a distribution's arguments when it is made "
            f"(validate_args), which reads them: {fix}"
        )


def test_a_distribution_made_with_validate_args_false_exports():
    model = Likelihood(False)
    exported = export_dynamic(model, ARGS).model_proto
    inputs = (torch.randn(5, 2), torch.randn(2))  # another length than the exported one
    assert_outputs_close(run_onnxruntime(exported, inputs), eager_outputs(model, inputs), exported)
