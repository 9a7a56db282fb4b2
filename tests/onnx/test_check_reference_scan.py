"""The ``Scan`` that ``check`` gives onnx's reference evaluator: every version, axis and direction,
against the specification's pseudo-code (written out below as plain loops) and against
onnxruntime at both of its optimization levels, on generated attribute combinations."""

from __future__ import annotations

import dataclasses

import hypothesis
import numpy as np
import onnx
import onnx.reference
import pytest
from hypothesis import strategies as st
from onnx import TensorProto
from onnx import helper as oh

from torchscan.onnx._check._runtimes import reference_ops

from ._runtimes import run_onnxruntime_on

F32 = TensorProto.FLOAT


@dataclasses.dataclass(frozen=True)
class ScanCase:
    """One Scan node: ``n`` states of shape (2,), scan inputs of the given ranks (element shapes
    of 2s and 3s), and the scan outputs, each a copy of one scan input's element plus the sum of
    the first state (so that it depends on the order of the steps)."""

    opset: int
    n: int
    ranks: tuple[int, ...]
    in_axes: tuple[int, ...]
    in_dirs: tuple[int, ...]
    out_of: tuple[int, ...]  # the scan input each output copies
    out_axes: tuple[int, ...]
    out_dirs: tuple[int, ...]
    length: int
    batch: int = 0  # Scan-8
    lens: tuple[int, ...] | None = None  # Scan-8's sequence_lens

    @property
    def m(self) -> int:
        return len(self.ranks)

    def element_shape(self, i: int) -> tuple[int, ...]:
        return tuple(2 + (d % 2) for d in range(self.ranks[i] - 1))

    def input_shape(self, i: int) -> tuple[int, ...]:
        if self.opset < 9:
            return (self.batch, self.length, *self.element_shape(i))
        shape = list(self.element_shape(i))
        shape.insert(self.in_axes[i] % self.ranks[i], self.length)
        return tuple(shape)


def _model(case: ScanCase) -> onnx.ModelProto:
    info = oh.make_tensor_value_info
    n, m = case.n, case.m
    body_nodes = []
    states_in = [info(f"s{i}_in", F32, [2]) for i in range(n)]
    elements = [info(f"e{i}", F32, list(case.element_shape(i))) for i in range(m)]
    total = "total"
    sums = []
    for i in range(m):
        body_nodes.append(oh.make_node("ReduceSum", [f"e{i}"], [f"sum{i}"], keepdims=0))
        sums.append(f"sum{i}")
    body_nodes.append(oh.make_node("Sum", sums, [total]))
    half = oh.make_tensor("half", F32, [], [0.5])
    body_nodes.append(oh.make_node("Constant", [], ["half_c"], value=half))
    states_out = []
    for i in range(n):
        body_nodes += [
            oh.make_node("Mul", [f"s{i}_in", "half_c"], [f"s{i}_half"]),
            oh.make_node("Add", [f"s{i}_half", total], [f"s{i}_out"]),
        ]
        states_out.append(info(f"s{i}_out", F32, [2]))
    outputs = []
    for j, source in enumerate(case.out_of):
        if n:
            body_nodes += [
                oh.make_node("ReduceSum", ["s0_in"], [f"o{j}_s"], keepdims=0),
                oh.make_node("Add", [f"e{source}", f"o{j}_s"], [f"o{j}"]),
            ]
        else:
            body_nodes.append(oh.make_node("Identity", [f"e{source}"], [f"o{j}"]))
        outputs.append(info(f"o{j}", F32, list(case.element_shape(source))))
    body = oh.make_graph(body_nodes, "body", states_in + elements, states_out + outputs)
    inputs = [f"init{i}" for i in range(n)] + [f"x{i}" for i in range(m)]
    results = [f"final{i}" for i in range(n)] + [f"y{j}" for j in range(len(case.out_of))]
    if case.opset < 9:
        attributes = {"directions": list(case.in_dirs)}
        node = oh.make_node(
            "Scan", ["lens" if case.lens is not None else "", *inputs], results,
            body=body, num_scan_inputs=m, **attributes,
        )  # fmt: skip
        graph_inputs = [info("lens", TensorProto.INT64, [case.batch])] if case.lens else []
        state_shape = [case.batch, 2]
    else:
        lists = {
            "scan_input_axes": case.in_axes, "scan_input_directions": case.in_dirs,
            "scan_output_axes": case.out_axes, "scan_output_directions": case.out_dirs,
        }  # fmt: skip
        attributes = {name: list(values) for name, values in lists.items() if values}
        node = oh.make_node("Scan", inputs, results, body=body, num_scan_inputs=m, **attributes)
        graph_inputs = []
        state_shape = [2]
    graph_inputs += [info(f"init{i}", F32, state_shape) for i in range(n)]
    graph_inputs += [info(f"x{i}", F32, list(case.input_shape(i))) for i in range(m)]
    ranks = [len(state_shape)] * n + [case.ranks[i] + (case.opset < 9) for i in case.out_of]
    graph_outputs = [info(name, F32, [None] * r) for name, r in zip(results, ranks, strict=True)]
    graph = oh.make_graph([node], "main", graph_inputs, graph_outputs)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", case.opset)])
    onnx.checker.check_model(model, full_check=True)
    return model


def _feeds(case: ScanCase, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    state_shape = (case.batch, 2) if case.opset < 9 else (2,)
    feeds = {f"init{i}": rng.standard_normal(state_shape, np.float32) for i in range(case.n)}
    feeds |= {f"x{i}": rng.standard_normal(case.input_shape(i), np.float32) for i in range(case.m)}
    if case.opset < 9 and case.lens is not None:
        feeds["lens"] = np.array(case.lens, np.int64)
    return feeds


def _body(case: ScanCase, states: list, elements: list) -> tuple[list, list]:
    total = np.float32(sum(np.float32(e.sum(dtype=np.float32)) for e in elements))
    new = [(s * np.float32(0.5) + total).astype(np.float32) for s in states]
    shift = states[0].sum(dtype=np.float32) if case.n else np.float32(0)
    return new, [(elements[j] + shift).astype(np.float32) for j in case.out_of]


def _pseudo_code_9(case: ScanCase, feeds: dict) -> list[np.ndarray]:
    """Scan-9 and later, as the specification's pseudo-code writes it, with its attributes
    applied as their descriptions say (reading reversed inputs from the end, prepending to
    reversed outputs, and accumulating along each output's axis)."""
    states = [feeds[f"init{i}"] for i in range(case.n)]
    scans = [feeds[f"x{i}"] for i in range(case.m)]
    axes = [a % r for a, r in zip(case.in_axes, case.ranks, strict=True)]
    sequence_length = scans[0].shape[axes[0]]
    scan_out: list[list[np.ndarray]] = [[] for _ in case.out_of]
    for t in range(sequence_length):
        si = []
        for scan, axis, direction in zip(scans, axes, case.in_dirs, strict=True):
            position = sequence_length - 1 - t if direction else t
            index = [slice(None)] * scan.ndim
            index[axis] = position
            si.append(scan[tuple(index)])
        states, so = _body(case, states, si)
        for j, element in enumerate(so):
            if case.out_dirs[j]:
                scan_out[j].insert(0, element)  # prepended
            else:
                scan_out[j].append(element)  # appended
    results = list(states)
    for j, column in enumerate(scan_out):
        rank = column[0].ndim + 1
        results.append(np.stack(column, axis=case.out_axes[j] % rank))
    return results


def _pseudo_code_8(case: ScanCase, feeds: dict) -> list[np.ndarray]:
    """Scan-8, as the specification's pseudo-code writes it: one loop per example of the batch,
    of ``sequence_lens[batch]`` steps; outputs padded to the longest (here with zeros, as
    onnxruntime writes them: the specification leaves them undefined)."""
    scans = [feeds[f"x{i}"] for i in range(case.m)]
    batch_size, max_sequence_length = scans[0].shape[:2]
    finals: list[list[np.ndarray]] = [[] for _ in range(case.n)]
    outs = [
        np.zeros((batch_size, max_sequence_length, *case.element_shape(source)), np.float32)
        for source in case.out_of
    ]
    for batch in range(batch_size):
        st = [feeds[f"init{i}"][batch] for i in range(case.n)]
        n_steps = case.lens[batch] if case.lens is not None else max_sequence_length
        for t in range(n_steps):
            si = [
                scan[batch][n_steps - 1 - t if direction else t]
                for scan, direction in zip(scans, case.in_dirs, strict=True)
            ]
            st, so = _body(case, st, si)
            for j, element in enumerate(so):
                outs[j][batch, t] = element
        for i, value in enumerate(st):
            finals[i].append(value)
    return [np.stack(f) for f in finals] + outs


@st.composite
def scan_cases(draw, opsets=(9, 11, 16, 21, 25)) -> ScanCase:
    opset = draw(st.sampled_from(opsets))
    n = draw(st.integers(0, 2))
    m = draw(st.integers(1, 3))
    ranks = tuple(draw(st.lists(st.integers(1, 3), min_size=m, max_size=m)))
    low = (lambda r: -r) if opset >= 11 else (lambda r: 0)  # negative axes from Scan-11
    in_axes = tuple(draw(st.integers(low(r), r - 1)) for r in ranks)
    in_dirs = tuple(draw(st.lists(st.integers(0, 1), min_size=m, max_size=m)))
    out_of = tuple(draw(st.lists(st.integers(0, m - 1), min_size=0 if n else 1, max_size=2)))
    out_axes = tuple(draw(st.integers(low(ranks[s]), ranks[s] - 1)) for s in out_of)
    out_dirs = tuple(draw(st.lists(st.integers(0, 1), min_size=len(out_of), max_size=len(out_of))))
    length = draw(st.integers(1, 4))
    return ScanCase(opset, n, ranks, in_axes, in_dirs, out_of, out_axes, out_dirs, length)


@st.composite
def scan_8_cases(draw) -> ScanCase:
    n = draw(st.integers(0, 2))
    m = draw(st.integers(1, 2))
    ranks = tuple(draw(st.lists(st.integers(1, 2), min_size=m, max_size=m)))
    in_dirs = tuple(draw(st.lists(st.integers(0, 1), min_size=m, max_size=m)))
    out_of = tuple(draw(st.lists(st.integers(0, m - 1), min_size=0 if n else 1, max_size=2)))
    length, batch = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    lens = draw(
        st.none() | st.lists(st.integers(1, length), min_size=batch, max_size=batch).map(tuple)
    )
    zeros = (0,) * len(out_of)
    return ScanCase(8, n, ranks, (1,) * m, in_dirs, out_of, zeros, zeros, length, batch, lens)


def _reference(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    evaluator = onnx.reference.ReferenceEvaluator(model, new_ops=reference_ops())
    return evaluator.run(None, feeds)


def _assert_all_close(case: ScanCase, expected: list, feeds: dict) -> None:
    model = _model(case)
    runs = {"reference": _reference(model, feeds)}
    runs |= {f"onnxruntime {level}": out for level, out in run_onnxruntime_on(model, feeds).items()}
    for source, outputs in runs.items():
        assert len(outputs) == len(expected), source
        for k, (got, want) in enumerate(zip(outputs, expected, strict=True)):
            assert got.shape == want.shape, f"{source}, output {k}: {case}"
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{source} {k}")


@hypothesis.settings(max_examples=60, deadline=None, derandomize=True)
@hypothesis.given(case=scan_cases(), seed=st.integers(0, 2**16))
@hypothesis.example(  # batch-first, reversed, negative axes, a prepended output on axis -1
    case=ScanCase(11, 2, (3, 2), (-2, 1), (1, 0), (0, 1), (-1, 1), (1, 0), 4), seed=1
)
def test_scan_9_to_25_follows_the_pseudo_code_and_onnxruntime(case: ScanCase, seed: int) -> None:
    feeds = _feeds(case, seed)
    _assert_all_close(case, _pseudo_code_9(case, feeds), feeds)


@hypothesis.settings(max_examples=30, deadline=None, derandomize=True)
@hypothesis.given(case=scan_8_cases(), seed=st.integers(0, 2**16))
@hypothesis.example(  # sequence_lens shorter than the longest, one input read backwards
    case=ScanCase(8, 1, (2, 1), (1, 1), (1, 0), (0, 1), (0, 0), (0, 0), 4, 3, (4, 1, 2)), seed=2
)
def test_scan_8_follows_the_pseudo_code_and_onnxruntime(case: ScanCase, seed: int) -> None:
    feeds = _feeds(case, seed)
    _assert_all_close(case, _pseudo_code_8(case, feeds), feeds)


def test_onnx_s_own_scan_refuses_what_the_replacement_runs() -> None:
    """What the replacement is for: onnx 1.23 raises on a reversed Scan or one along axis 1."""
    case = ScanCase(16, 1, (2,), (1,), (1,), (0,), (1,), (1,), 3)
    model, feeds = _model(case), _feeds(case, 0)
    with pytest.raises(RuntimeError, match="not implemented"):
        onnx.reference.ReferenceEvaluator(model).run(None, feeds)
    expected = _pseudo_code_9(case, feeds)
    for got, want in zip(_reference(model, feeds), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_scan_that_runs_no_step_gives_outputs_of_the_shapes_its_body_declares() -> None:
    """The specification's scan outputs after no step: empty along the scan axis, the element
    shape around it (onnxruntime 1.32 fails on a sequence of length 0)."""
    case = ScanCase(16, 1, (3,), (1,), (0,), (0, 0), (0, -1), (0, 1), 0)
    feeds = _feeds(case, 0)
    final, first, last = _reference(_model(case), feeds)
    np.testing.assert_array_equal(final, feeds["init0"])
    assert (first.shape, last.shape) == ((0, 2, 3), (2, 3, 0))


def test_a_scan_that_runs_no_step_with_outputs_of_unknown_shape_is_not_implemented() -> None:
    case = ScanCase(16, 1, (2,), (0,), (0,), (0,), (0,), (0,), 0)
    model = _model(case)
    del model.graph.node[0].attribute[0].g.output[1].type.tensor_type.shape.dim[:]
    model.graph.node[0].attribute[0].g.output[1].type.tensor_type.ClearField("shape")
    with pytest.raises(NotImplementedError, match="its body does not declare"):
        _reference(model, _feeds(case, 0))
