"""torchscan.autoloop: the loops of tests/_autoloop_corpus.py converted, against the same
modules unconverted (forward and gradients, lengths 0, 1 and several), exported with a dynamic
length (one Scan per loop, onnxruntime at both optimization levels equal to eager at other
lengths); the loops that stay Python with their reasons; the report, the source, strict."""

from __future__ import annotations

import copy
import re
import traceback
from pathlib import Path

import onnx
import pytest
import torch
from torch.utils.checkpoint import checkpoint

import torchscan
from torchscan import _autoloop, _hoist
from torchscan._autoloop import _runtime

from . import _autoloop_corpus as corpus
from ._export import onnx_export
from .onnx._runtimes import run_onnxruntime

# (the short loops of these tests scanned, as a trace has them: the path under test)
pytestmark = pytest.mark.usefixtures("every_loop_scanned")

NAMES = list(corpus.PROGRAMS)
CONVERTING = [n for n in NAMES if corpus.PROGRAMS[n].converts]
DIFFERENTIABLE = [n for n in CONVERTING if corpus.PROGRAMS[n].differentiable]
EXPORTING = [n for n in CONVERTING if not corpus.PROGRAMS[n].export_error]
LENGTHS = [0, 1, 5]


@pytest.fixture(autouse=True)
def _converted_function(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(corpus, "DECAY", torchscan.autoloop(corpus._decay))


def pair(name: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The program's module as written, and a copy of it converted."""
    torch.manual_seed(0)
    original = corpus.PROGRAMS[name].make()
    converted = torchscan.autoloop(copy.deepcopy(original))
    return original, converted


def run(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> object:
    try:
        return module(*inputs)
    except RuntimeError as error:
        return error


def _grads(
    module: torch.nn.Module, leaves: tuple[torch.Tensor, ...], inputs: tuple[torch.Tensor, ...]
) -> list[torch.Tensor]:
    """The gradients to ``leaves`` and the parameters of a weighted sum of the outputs; the
    module's floating inputs made from the leaves anew (not leaves: a loop may change them in
    place)."""
    made = iter(leaves)
    out = module(*[next(made) * 1 if i.is_floating_point() else i for i in inputs])
    outputs = [o for o in torch.utils._pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
    total = sum((o.float() * (k + 1)).sum() for k, o in enumerate(outputs) if o.is_floating_point())
    wrt = [*leaves, *module.parameters()]
    return list(torch.autograd.grad(total, wrt, allow_unused=True))  # type: ignore[arg-type]


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("name", NAMES)
def test_the_converted_module_computes_as_the_original(name: str, n: int) -> None:
    program = corpus.PROGRAMS[name]
    original, converted = pair(name)
    inputs = program.inputs(n)
    theirs = tuple(i.clone() for i in inputs)
    want = run(original, theirs)
    got = run(converted, inputs)
    if isinstance(want, RuntimeError):
        assert isinstance(got, RuntimeError)
        assert str(got) == str(want)
        assert n == 0
        assert program.empty_raises
        return
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    # the inputs as the original left them (unchanged, or changed in place alike)
    for mine, original_input in zip(inputs, theirs, strict=True):
        assert torch.equal(mine, original_input)
    report = torchscan.autoloop_report(converted)
    if name == "function":  # the loop is in a function the module calls
        report += torchscan.autoloop_report(corpus.DECAY)
    time_loops = [r for r in report if r.converted]
    if program.converts:
        assert time_loops, report
    else:
        assert not time_loops, report
        assert any(program.reason in r.reason for r in report), report


def _rows(module: object) -> list[tuple[int, bool, str]]:
    report = torchscan.autoloop_report(module)
    if module is not corpus.DECAY:
        report += torchscan.autoloop_report(corpus.DECAY)
    return [(r.lineno, r.converted, r.reason) for r in report]


@pytest.mark.parametrize("name", NAMES)
def test_a_short_loop_runs_as_written_and_leaves_the_report_as_its_scan_left_it(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eagerly, with nothing tracing it, a converted loop of fewer steps than
    AS_WRITTEN_BELOW runs as written: no scan or loop operator runs, the results and gradients
    are the original's exactly, and the report stays what the scan of the same call said."""
    program = corpus.PROGRAMS[name]
    original, converted = pair(name)
    inputs = program.inputs(5)
    run(converted, inputs)  # scanned (the fixture's threshold)
    scanned = _rows(converted)

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("a scan ran")

    monkeypatch.setattr(_runtime, "AS_WRITTEN_BELOW", 10**6)  # (a fixed point's 40 steps too)
    monkeypatch.setattr(torchscan._scan, "scan", refused)
    monkeypatch.setattr(torchscan._loop, "loop", refused)
    converted.load_state_dict(original.state_dict())  # (a loop may change a buffer in place)
    want = run(original, tuple(i.clone() for i in inputs))
    got = run(converted, tuple(i.clone() for i in inputs))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert _rows(converted) == scanned
    if program.differentiable:
        leaves = tuple(i.clone().requires_grad_() for i in inputs if i.is_floating_point())
        got_grads = _grads(converted, leaves, inputs)
        for g, w in zip(got_grads, _grads(original, leaves, inputs), strict=True):
            if w is None:
                assert g is None
            else:
                torch.testing.assert_close(g, w, rtol=0, atol=0)


AS_WRITTEN_BELOW = _runtime.AS_WRITTEN_BELOW  # (as the package sets it: the fixture sets 0)


def test_a_loop_is_scanned_from_as_written_below_steps_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_runtime, "AS_WRITTEN_BELOW", AS_WRITTEN_BELOW)
    original, converted = pair("elman")
    for n, scanned in ((AS_WRITTEN_BELOW - 1, False), (AS_WRITTEN_BELOW, True)):
        (x,) = corpus.PROGRAMS["elman"].inputs(n)
        for _ in range(_hoist.TRACE_AT_CALL):
            _hoist.last.what = ""
            torch.testing.assert_close(converted(x), original(x))
        assert (_hoist.last.what == "hoisted") == scanned, (n, _hoist.last)
        assert [r.converted for r in torchscan.autoloop_report(converted)] == [True]


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_gradients_match_the_original_at_every_call(name: str) -> None:
    """At the first call (the step run as written) and the third (hoisted, its work on x
    batched over the steps: within rounding)."""
    program = corpus.PROGRAMS[name]
    original, converted = pair(name)
    inputs = program.inputs(4)
    leaves = tuple(i.clone().requires_grad_() for i in inputs if i.is_floating_point())
    want = _grads(original, leaves, inputs)
    for _ in range(3):
        _hoist.last.what = ""
        got = _grads(converted, leaves, inputs)
        for g, w in zip(got, want, strict=True):
            if w is None:
                assert g is None
            else:
                torch.testing.assert_close(g, w)
    if program.hoists:  # (the others too on some torch releases)
        assert _hoist.last.what == "hoisted", _hoist.last.reason


# one program of each kind the runtime runs apart: a first step run as Python, a break, a
# buffer, a while, tests of the step number, a carry changed in place
COMPILED = ["none-state", "break", "buffer", "conjugate-gradient", "first-step", "in-place"]


# TorchDynamo reads .grad of the non-leaf tensors a graph break hands it (its own warning)
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")
@pytest.mark.parametrize("name", COMPILED)
def test_torch_compile_of_the_converted_module_computes_as_the_original(name: str) -> None:
    program = corpus.PROGRAMS[name]
    original, converted = pair(name)
    compiled = torch.compile(converted, backend="aot_eager")
    for n in (1, 5):  # the second length compiled with a dynamic one
        inputs = program.inputs(n)
        theirs = tuple(i.clone() for i in inputs)
        torch.testing.assert_close(compiled(*inputs), original(*theirs))
        for mine, original_input in zip(inputs, theirs, strict=True):
            torch.testing.assert_close(mine, original_input)


def _dynamic(name: str) -> tuple[dict[int, torch.export.Dim], ...]:
    program = corpus.PROGRAMS[name]
    t = torch.export.Dim("T", min=2, max=64)
    inputs = program.inputs(3)
    shapes = []
    for k, tensor in enumerate(inputs):
        axis = program.time_axis if k == 0 else 0
        grows = tensor.shape[axis] != program.inputs(4)[k].shape[axis]
        shapes.append({axis: t} if grows else {})
    return tuple(shapes)


_EXPORTS: dict[str, onnx.ModelProto] = {}


def exported(name: str) -> onnx.ModelProto:
    if name not in _EXPORTS:
        _, converted = pair(name)
        program = corpus.PROGRAMS[name]
        _EXPORTS[name] = onnx_export(
            converted.eval(), program.inputs(3), dynamo=True, dynamic_shapes=_dynamic(name)
        ).model_proto
    return _EXPORTS[name]


@pytest.mark.parametrize("name", EXPORTING)
def test_the_unchanged_model_exports_one_scan_per_loop_with_a_dynamic_length(name: str) -> None:
    model = exported(name)
    loops = [n.op_type for n in model.graph.node if n.op_type in ("Scan", "Loop")]
    program = corpus.PROGRAMS[name]
    assert len(loops) == program.loops, [n.op_type for n in model.graph.node]
    original, _ = pair(name)
    for n in (2, 7):
        inputs = program.inputs(n)
        runs = run_onnxruntime(model, inputs)  # before the original, which may change them
        want = torch.utils._pytree.tree_leaves(original(*inputs))
        assert len(runs) == 2  # the default and disabled optimizations
        for got in runs.values():
            for g, w in zip(got, want, strict=True):
                torch.testing.assert_close(torch.as_tensor(g), w.detach())


@pytest.mark.parametrize("name", [n for n in CONVERTING if n not in EXPORTING])
def test_a_step_that_cannot_be_exported_is_refused_naming_its_line(name: str) -> None:
    with pytest.raises(torchscan.ExportError) as info:
        exported(name)
    assert corpus.PROGRAMS[name].export_error in str(info.value)
    assert f"{corpus.__file__}:" in str(info.value)


def test_split_of_no_rows_runs_as_python_over_its_one_empty_piece() -> None:
    original, converted = pair("split-rows")
    f, x = torch.rand(0, corpus.B, corpus.F), torch.randn(0, corpus.B, corpus.F)
    assert len(x.split(1, dim=0)) == 1  # torch's split gives one piece, empty
    got, want = converted(f, x), original(f.clone(), x.clone())
    assert got[0].shape == want[0].shape == (0, corpus.B, corpus.F)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    (row,) = torchscan.autoloop_report(converted)
    assert not row.converted
    assert row.reason == "it iterates over `split(1, axis)` of no rows, which gives one empty piece"


def test_the_layer_loop_in_the_step_stays_python_and_the_time_loop_converts() -> None:
    _, converted = pair("helper")
    converted(*corpus.PROGRAMS["helper"].inputs(3))
    rows = {r.lineno: r for r in torchscan.autoloop_report(converted)}
    assert sorted(r.converted for r in rows.values()) == [False, True]
    kept = next(r for r in rows.values() if not r.converted)
    assert kept.reason == "it iterates over a ModuleList, not along a tensor's axis"
    assert kept.function == "Helper.run"


def test_the_report_names_the_file_and_line_of_each_for() -> None:
    _, converted = pair("elman")
    (row,) = torchscan.autoloop_report(converted)
    assert row.filename == corpus.__file__
    lines = Path(corpus.__file__).read_text().splitlines()
    assert lines[row.lineno - 1].strip() == "for t in range(x.shape[0]):"
    assert row.function == "Elman.forward"


def test_the_source_shows_the_scan() -> None:
    _, converted = pair("elman")
    source = torchscan.autoloop_source(converted)
    assert "__autoloop__.for_(" in source
    assert "h = torch.tanh(self.wx(__autoloop_x_0) + self.wh(h))" in source
    assert "slices=((x, 0),)" in source
    assert "__autoloop__.stack(outputs)" in source


@pytest.mark.parametrize("threshold", [0, AS_WRITTEN_BELOW], ids=["scanned", "as-written"])
def test_a_traceback_from_the_step_shows_the_users_line(
    threshold: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_runtime, "AS_WRITTEN_BELOW", threshold)

    def broken(x: torch.Tensor) -> torch.Tensor:
        h = torch.zeros(3)
        for x_t in x:
            h = h + x_t @ torch.ones(7, 7)  # the line at fault
        return h

    converted = torchscan.autoloop(broken)
    with pytest.raises(RuntimeError) as info:
        converted(torch.randn(4, 3))
    frames = traceback.extract_tb(info.tb)
    assert any(f.line and f.line.endswith("# the line at fault") for f in frames)


def test_a_function_is_converted_once() -> None:
    converted = torchscan.autoloop(corpus._decay)
    assert torchscan.autoloop(converted) is converted
    assert torchscan.autoloop(corpus._decay) is not corpus._decay


def test_the_decorator_form() -> None:
    @torchscan.autoloop(strict=True)
    def cumulative(x: torch.Tensor) -> torch.Tensor:
        s = x[0] * 0
        outs = []
        for x_t in x:
            s = s + x_t
            outs.append(s)
        return torch.stack(outs)

    x = torch.randn(5, 2)
    torch.testing.assert_close(cumulative(x), x.cumsum(0), rtol=0, atol=1e-6)
    assert [r.converted for r in torchscan.autoloop_report(cumulative)] == [True]


def test_strict_refuses_a_time_loop_that_stays_python_at_conversion() -> None:
    with pytest.raises(TypeError, match=r"line \d+\) stays Python: `continue` skips the rest"):
        torchscan.autoloop(corpus.SkipsTwice(), strict=True)


def test_strict_refuses_a_time_loop_that_runs_as_python() -> None:
    module = torchscan.autoloop(corpus.Counter(), strict=True)
    with pytest.raises(TypeError, match="runs as Python: `count` is an int after the first step"):
        module(torch.randn(3, 2, 3))


def test_strict_refuses_a_while_whose_carry_is_no_tensor_though_it_runs_as_written() -> None:
    def counted(x: torch.Tensor) -> tuple[torch.Tensor, int]:
        steps = 0
        while x.sum() > 1:
            x = x * 0.5
            steps += 1
        return x, steps

    x = torch.full((3,), 4.0)
    with pytest.raises(TypeError, match="runs as Python: `steps` is an int before the loop"):
        torchscan.autoloop(counted, strict=True)(x)
    lenient = torchscan.autoloop(counted)
    got, want = lenient(x), counted(x)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    assert got[1] == want[1] == 4
    (row,) = torchscan.autoloop_report(lenient)
    assert not row.converted
    assert row.reason.startswith("`steps` is an int before the loop")
    assert "as_written" in torchscan.autoloop_source(lenient)  # (nothing traces it here)


def test_the_report_of_a_while_run_as_written_follows_each_run() -> None:
    def halve(x, limit):
        while x > limit:
            x = x * 0.5
        return x

    converted = torchscan.autoloop(halve)
    x = torch.tensor(4.0)

    def run(start, limit):
        got, want = converted(start, limit), halve(start, limit)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        (row,) = torchscan.autoloop_report(converted)
        return row

    assert run(x, 1.0).converted
    assert run(x, 1.0).converted  # (the second run of a known loop records nothing anew)
    row = run(4.0, 1.0)  # a Python float: the condition is a bool
    assert not row.converted
    assert row.reason == "its condition is a bool, not a tensor: it counts in Python"
    assert run(x, 1.0).converted
    assert run(x, 100.0).converted  # (no step at all)


def test_strict_keeps_loops_over_layers() -> None:
    module = torchscan.autoloop(corpus.Layers(), strict=True)
    x = torch.randn(4, 2, 3)
    torch.testing.assert_close(module(x), corpus.Layers.forward(module, x), rtol=0, atol=0)


def test_a_list_not_empty_before_the_loop_runs_as_python() -> None:
    def prefixed(x: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        outs = []
        outs.append(first)
        for x_t in x:
            outs.append(x_t)
        return torch.stack(outs)

    converted = torchscan.autoloop(prefixed)
    x, first = torch.randn(3, 2), torch.randn(2)
    torch.testing.assert_close(converted(x, first), prefixed(x, first), rtol=0, atol=0)
    (row,) = torchscan.autoloop_report(converted)
    assert not row.converted
    assert row.reason.startswith("`outs.append(x_t)` changes `outs`, made outside the loop")


def test_the_lists_of_a_scan_are_lists() -> None:
    def steps(x: torch.Tensor) -> tuple[int, torch.Tensor, list[torch.Tensor]]:
        outs = []
        for x_t in x:
            outs.append(x_t * 2)
        first = outs[0]
        outs.append(first)
        return len(outs), torch.stack(outs), list(reversed(outs))

    converted = torchscan.autoloop(steps)
    x = torch.randn(4, 3)
    got, want = converted(x), steps(x)
    assert got[0] == want[0]
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)
    torch.testing.assert_close(got[2], want[2], rtol=0, atol=0)


def test_a_carry_unbound_before_the_loop_is_bound_by_the_first_step() -> None:
    def last_of(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        outs = []
        for x_t in x:
            last = x_t * 2 + (last if x_t.sum() > 100 else 0)  # noqa: F821 (bound by step 1)
            outs.append(last)
        return last, torch.stack(outs)

    converted = torchscan.autoloop(last_of)
    x = torch.randn(3, 2)
    torch.testing.assert_close(converted(x), (x[-1] * 2, x * 2), rtol=0, atol=0)
    assert [r.converted for r in torchscan.autoloop_report(converted)] == [True]
    with pytest.raises(UnboundLocalError):
        converted(torch.randn(0, 2))
    with pytest.raises(UnboundLocalError, match="'last'"):  # read at the first step, as Python
        converted(torch.full((3, 2), 100.0))


def test_a_python_number_before_the_loop_becomes_a_tensor_at_the_first_step() -> None:
    def total_loss(x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = 0
        h = None
        for x_t, y_t in zip(x, target):  # noqa: B905 (as written)
            h = torch.tanh(x_t if h is None else x_t + h)
            loss = loss + ((h - y_t) ** 2).mean()
        return loss

    converted = torchscan.autoloop(total_loss)
    x, target = torch.randn(5, 2, 3), torch.randn(5, 2, 3)
    torch.testing.assert_close(converted(x, target), total_loss(x, target), rtol=0, atol=0)
    assert [r.converted for r in torchscan.autoloop_report(converted)] == [True]
    assert converted(x[:0], target[:0]) == 0


def test_a_list_made_while_torch_traces_can_only_be_stacked() -> None:
    def lengths(x: torch.Tensor) -> torch.Tensor:
        outs = []
        for x_t in x:
            outs.append(x_t + 1)
        return torch.stack(outs) * len(outs)

    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torchscan.autoloop(lengths)(x)

    with pytest.raises(TypeError, match=r"use it only in torch\.stack"):
        torch.export.export(
            Model(), (torch.randn(3, 2),), dynamic_shapes=({0: torch.export.Dim("T")},)
        )


def test_what_is_not_a_function_or_module_is_refused() -> None:
    with pytest.raises(TypeError, match=r"expected a function, a method or an nn\.Module, got int"):
        torchscan.autoloop(3)


def test_the_report_of_what_was_not_converted_is_refused() -> None:
    with pytest.raises(TypeError, match=r"was not converted by torchscan\.autoloop"):
        torchscan.autoloop_report(len)


def test_the_public_names() -> None:
    assert torchscan.autoloop is _autoloop.autoloop
    assert torchscan.LoopReport is _autoloop.LoopReport


def test_a_loop_whose_target_is_not_names_stays_python() -> None:
    def into_a_list(x: torch.Tensor) -> list[torch.Tensor]:
        rows = [x[0]]
        for rows[0] in x:
            pass
        return rows

    converted = torchscan.autoloop(into_a_list)
    x = torch.randn(3, 2)
    torch.testing.assert_close(converted(x), into_a_list(x), rtol=0, atol=0)
    (row,) = torchscan.autoloop_report(converted)
    assert row.reason == (
        "its target `rows[0]` is not a name or a tuple of names (a starred name, an attribute "
        "or a subscript)"
    )


def test_the_loop_variable_read_after_the_loop_keeps_it_python() -> None:
    def last_step(x: torch.Tensor) -> tuple[torch.Tensor, int]:
        s = x[0] * 0
        for t in range(x.shape[0]):
            s = s + x[t]
        return s, t

    converted = torchscan.autoloop(last_step)
    x = torch.randn(3, 2)
    assert converted(x)[1] == 2
    (row,) = torchscan.autoloop_report(converted)
    assert row.reason == "the loop variable `t` is read outside the loop"


def test_stack_and_cat_of_the_lists_take_their_arguments_as_torch_does() -> None:
    def joined(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a, b = [], []
        for x_t in x:
            a.append(x_t * 2)
            b.append(x_t[None])
        return (
            torch.cat(a, axis=-1),
            torch.cat(b, dim=0),
            torch.stack(a, -1),
            torch.concat(b),
            torch.stack(a[::-1], dim=1),
        )

    converted = torchscan.autoloop(joined)
    x = torch.randn(4, 2, 3)
    torch.testing.assert_close(converted(x), joined(x), rtol=0, atol=0)
    assert [r.converted for r in torchscan.autoloop_report(converted)] == [True]


def test_names_that_are_not_the_builtins_are_left_as_the_function_binds_them() -> None:
    def shadowing(x: torch.Tensor) -> tuple[torch.Tensor, str]:
        def list(items: object) -> str:  # a list of its own
            return "mine"

        outs = []
        for x_t in x:
            outs.append(x_t)
        return torch.stack(outs), list(outs)

    converted = torchscan.autoloop(shadowing)
    x = torch.randn(3, 2)
    got, want = converted(x), shadowing(x)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    assert got[1] == "mine"
    assert "list(outs)" in torchscan.autoloop_source(converted)


def test_split_other_than_in_pieces_of_one_is_the_call_as_written() -> None:
    def pieces(x: torch.Tensor, name: str) -> tuple[object, ...]:
        halves = x.split(2, dim=0)
        ones = x.split(1, 1)
        words = name.split(".")
        h = x[0] * 0
        for t in range(x.shape[0]):
            h = h + x[t] * len(words)
        return halves, ones, words, h

    converted = torchscan.autoloop(pieces)
    x = torch.randn(5, 3)
    got, want = converted(x, "a.b.c"), pieces(x, "a.b.c")
    assert type(got[0]) is tuple  # pieces of 2: torch's split
    assert isinstance(got[1], tuple)  # pieces of 1: a tuple that also knows its tensor
    assert got[2] == want[2] == ["a", "b", "c"]
    torch.testing.assert_close(got[:2], want[:2], rtol=0, atol=0)
    torch.testing.assert_close(got[3], want[3], rtol=0, atol=0)
    assert "split_rows" in torchscan.autoloop_source(converted)


def test_a_range_bound_before_the_loop_converts_where_only_the_loop_reads_it() -> None:
    def both_ways(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = x.shape[0]
        results = []
        for forward in (True, False):
            steps = range(n) if forward else range(n - 1, -1, -1)
            h = x[0] * 0
            for t in steps:
                h = torch.tanh(h + x[t])
            results.append(h)
        return results[0], results[1]

    def read_again(x: torch.Tensor) -> tuple[torch.Tensor, int]:
        steps = range(x.shape[0])
        h = x[0] * 0
        for t in steps:
            h = h + x[t]
        return h, len(steps)

    x = torch.randn(6, 3)
    converted = torchscan.autoloop(both_ways)
    torch.testing.assert_close(converted(x), both_ways(x), rtol=0, atol=0)
    rows = sorted(torchscan.autoloop_report(converted), key=lambda r: r.lineno)
    assert [r.converted for r in rows] == [False, True]  # over directions, over time
    kept = torchscan.autoloop(read_again)
    got, want = kept(x), read_again(x)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    assert got[1] == want[1] == 6
    (row,) = torchscan.autoloop_report(kept)
    assert not row.converted
    assert row.reason == "it iterates over a range, not along a tensor's axis"


def test_a_break_keeps_a_carry_changed_in_place_as_it_was_at_the_test() -> None:
    # (found by the generated programs) c1, changed only in place, goes back into the tensor
    # the loop started from: as it was at the test of the step that breaks
    def program(x: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c0 = x.new_full((2, 3), 1.0)
        c1 = x.new_full((2, 3), 2.0)
        for t, x_t in enumerate(x):
            if not (c0.sum() > 8):
                break
            c0 = torch.tanh(c0 * a + x_t * (t + 1))
            c1 += x_t * (t + 1) * 0.5
        return c0, c1

    converted = torchscan.autoloop(program)
    a = torch.full((2, 3), 0.7)
    for x in (torch.randn(1, 2, 3), torch.full((5, 2, 3), 2.0), torch.full((5, 2, 3), -0.3)):
        want = program(x, a)
        for _ in range(_hoist.TRACE_AT_CALL):
            torch.testing.assert_close(converted(x.clone(), a), want)
    assert [r.converted for r in torchscan.autoloop_report(converted)] == [True]


def _checkpointed(module: torch.nn.Module, reentrant: bool) -> torch.nn.Module:
    class Checkpointed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = module

        def forward(self, *inputs: torch.Tensor) -> object:
            return checkpoint(self.inner, *inputs, use_reentrant=reentrant)

    return Checkpointed()


def _backward_grads(
    module: torch.nn.Module, leaves: tuple[torch.Tensor, ...], inputs: tuple[torch.Tensor, ...]
) -> list[torch.Tensor | None]:
    """The gradients of :func:`_grads`, by ``backward()`` (a reentrant checkpoint takes no
    ``torch.autograd.grad``)."""
    for p in [*leaves, *module.parameters()]:
        p.grad = None
    made = iter(leaves)
    out = module(*[next(made) * 1 if i.is_floating_point() else i for i in inputs])
    outputs = [o for o in torch.utils._pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
    total = sum((o.float() * (k + 1)).sum() for k, o in enumerate(outputs) if o.is_floating_point())
    total.backward()  # type: ignore[union-attr]
    return [p.grad for p in [*leaves, *module.parameters()]]


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_a_checkpoint_of_the_converted_module_recomputes_it_alike(
    name: str, reentrant: bool
) -> None:
    """torch.utils.checkpoint runs the converted loops again in backward (the non-reentrant
    one stops that recomputation early, through the scan): the gradients of the original."""
    program = corpus.PROGRAMS[name]
    original, converted = pair(name)
    inputs = program.inputs(4)
    leaves = tuple(i.clone().requires_grad_() for i in inputs if i.is_floating_point())
    want = _backward_grads(original, leaves, inputs)
    try:
        _backward_grads(_checkpointed(original, reentrant), leaves, inputs)
    except RuntimeError as error:  # (a reentrant one makes the inputs leaves: no change in place)
        refusal = str(error)
        with pytest.raises(RuntimeError, match=re.escape(refusal)):
            _backward_grads(_checkpointed(converted, reentrant), leaves, inputs)
        return
    wrapped = _checkpointed(converted, reentrant)
    for _ in range(_hoist.TRACE_AT_CALL):
        got = _backward_grads(wrapped, leaves, inputs)
        for g, w in zip(got, want, strict=True):
            if w is None:
                assert g is None
            else:
                torch.testing.assert_close(g, w)


# torch's own warning where vmap has no batching rule for an operator (it loops over the batch)
@pytest.mark.filterwarnings("ignore:There is a performance drop because we have not yet")
@pytest.mark.parametrize("name", CONVERTING)
def test_vmap_of_the_converted_module_computes_as_that_of_the_original(name: str) -> None:
    """torch.func.vmap over a batch of inputs computes what the loop as written computes for
    each; where vmap refuses the loop as written (a value read, an operator it cannot batch),
    the converted one computes that or is refused too."""
    program = corpus.PROGRAMS[name]
    original, converted = pair(name)
    examples = [
        tuple(i * 0.5 if k and i.is_floating_point() else i for i in program.inputs(4))
        for k in range(2)
    ]
    each = [original(*copy.deepcopy(example)) for example in examples]
    want = torch.utils._pytree.tree_map(lambda *v: torch.stack(v), *each)
    inputs = tuple(torch.stack(list(parts)) for parts in zip(*examples, strict=True))
    try:
        torch.func.vmap(original)(*copy.deepcopy(inputs))
    except RuntimeError:
        refused = True
    else:
        refused = False
    for _ in range(_hoist.TRACE_AT_CALL):
        try:
            got = torch.func.vmap(converted)(*copy.deepcopy(inputs))
        except (RuntimeError, TypeError):
            assert refused
            continue
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("name", ["elman", "lstm-tuple", "break", "zip", "split-rows", "buffer"])
def test_a_hoisted_step_is_traced_once_for_every_length(name: str) -> None:
    """The step a converted loop hands the scan captures nothing whose shape holds the number
    of steps: one trace serves every length (each length traced anew would never hoist a model
    fed sequences of varying lengths)."""
    program = corpus.PROGRAMS[name]
    _, converted = pair(name)
    _hoist.clear()
    before = _hoist._signature.traces
    for n in (3, 4, 5, 6, 7):
        for _ in range(_hoist.TRACE_AT_CALL):
            converted(*program.inputs(n))
        assert _hoist.last.what == "hoisted", (n, _hoist.last.reason)
    assert _hoist._signature.traces - before == 1


def test_out_is_refused_alike_where_autograd_records_or_the_result_does_not_fit() -> None:
    def scaled(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(x.shape)
        for t in range(x.shape[0]):
            torch.mul(x[t], w, out=out[t])
        return out

    def norms(x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float64)
        for t in range(x.shape[0]):
            torch.linalg.vector_norm(x[t], dim=-1, out=out[t])  # a float result, a double out
        return out

    x, w = torch.randn(4, 2, 3), torch.ones(3, requires_grad=True)
    for fn, inputs in ((scaled, (x, w)), (norms, (x,))):
        with pytest.raises(RuntimeError) as original:
            fn(*inputs)
        converted = torchscan.autoloop(fn)
        for _ in range(_hoist.TRACE_AT_CALL):
            with pytest.raises(RuntimeError, match=re.escape(str(original.value))):
                converted(*inputs)
        (row,) = torchscan.autoloop_report(converted)
        assert not row.converted
        assert "out=" in row.reason
    converted = torchscan.autoloop(scaled)
    with torch.no_grad():  # where torch takes it: the scan's result
        want = scaled(x, w)
        for _ in range(_hoist.TRACE_AT_CALL):
            torch.testing.assert_close(converted(x, w), want, rtol=0, atol=0)
        assert [r.converted for r in torchscan.autoloop_report(converted)] == [True]


def test_every_name_converted_code_calls_is_in_its_namespace() -> None:
    """The rewrite emits ``__autoloop__.<name>`` calls; each name is in the namespace bound
    there (``_calls``), for any loop a rewrite can emit."""
    import ast
    import inspect

    from torchscan._autoloop import _calls, _rewrite

    source = inspect.getsource(_rewrite)
    emitted = {
        node.args[0].value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", None) == "_runtime_attr"
        and isinstance(node.args[0], ast.Constant)
    }
    emitted |= {*_rewrite._Calls._TORCH.values(), *_rewrite._Calls._BUILTINS.values()}
    emitted |= {"unbind", "split_", "chunk_", "enumerate_", "zip_"}
    assert len(emitted) > 25
    assert sorted(n for n in emitted if not hasattr(_calls, n)) == []
