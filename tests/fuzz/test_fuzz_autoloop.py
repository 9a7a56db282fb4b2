"""Generated loops, written as source, run as written and converted by ``torchscan.autoloop``:
the same results at every length, at the first call and once hoisted (within rounding).

Each program is a function of ``x`` (the sequence, time first), ``a`` (a captured tensor) and
``flag`` (a Python bool) whose ``for`` loop runs over a range of ``x``'s size, its rows,
``enumerate``, ``zip``, a reversed range or the rows of ``unbind``; its body assigns carries,
temporaries and lists from a menu of statements (updates from the step's slice, from other
carries and temporaries, swaps, updates under a Python ``if``, appends and inserts at the front,
``+=`` on a carry, writes into a buffer at the step number, from the row before or not, tests of
the step number, and an ``if ...: break`` or ``continue`` on a carry's value), and the function
returns every carry, every list stacked and the buffer. Converted or kept, the
function must compute what it computed."""

from __future__ import annotations

import collections
import dataclasses
import linecache

import hypothesis
import hypothesis.strategies as st
import pytest
import torch

import torchscan
from torchscan import _hoist
from torchscan._autoloop import _runtime

from ._check import RUNS

# (the short loops of these tests scanned, as a trace has them: the path under test)
pytestmark = pytest.mark.usefixtures("every_loop_scanned")

B, F = 2, 3
CARRIES = ("c0", "c1", "c2")
HEADERS = {
    "range": ("for t in range(x.shape[0]):", "x[t]"),
    "rows": ("for x_t in x:", "x_t"),
    "enumerate": ("for t, x_t in enumerate(x):", "x_t * (t + 1)"),
    "zip": ("for x_t, y_t in zip(x, x.flip(0)):", "(x_t - y_t)"),
    "reversed": ("for t in reversed(range(1, len(x))):", "x[:, :][t]"),
    "unbound": ("for t in range(len(xs)):", "xs[t]"),  # xs = x.unbind(0)
    "pieces": ("for t, p_t in enumerate(x.split(1, 0)):", "(p_t[0] + ps[t][0])"),
    "bound-range": ("for t in steps:", "x[t]"),
}
PRELUDES = {  # made just before the loop, for some headers
    "pieces": ["ps = x.flip(0).split(1, dim=0)"],  # indexed at the count of the enumerate
    "bound-range": ["steps = range(x.shape[0]) if flag else range(x.shape[0] - 1, -1, -1)"],
}


@dataclasses.dataclass(frozen=True)
class LoopProgram:
    header: str
    body: tuple[str, ...]
    carries: tuple[str, ...]
    lists: tuple[str, ...]
    temporaries_read_after: tuple[str, ...]
    buffer: bool = False
    counts: bool = False  # `steps_run += 1` in the body
    count_read: bool = False  # and the count returned

    def source(self) -> str:
        head, _ = HEADERS[self.header]
        lines = ["def program(x, a, flag):"]
        lines += [
            f"    {c} = x.new_full(({B}, {F}), {k + 1}.0)" for k, c in enumerate(self.carries)
        ]
        lines += [f"    {name} = []" for name in self.lists]
        lines += ["    xb = x.transpose(0, 1)", "    xs = x.unbind(0)"]  # batch first, rows
        if self.buffer:
            lines += [f"    buf = x.new_zeros(x.shape[0], {B}, {F})"]
        if self.counts:
            lines += ["    steps_run = 0"]
        lines += [f"    {line}" for line in PRELUDES.get(self.header, [])]
        lines += [f"    {head}"]
        lines += [f"        {s}" for s in self.body] or ["        pass"]
        results = [*self.carries, *(f"torch.stack({n})" for n in self.lists)]
        results += list(self.temporaries_read_after)
        if self.buffer:
            results.append("buf")
        if self.count_read:
            results.append("steps_run")
        lines += [f"    return ({', '.join(results)},)"]
        return "\n".join(lines) + "\n"


@st.composite
def loop_programs(draw: st.DrawFn) -> LoopProgram:
    header = draw(st.sampled_from(sorted(HEADERS)))
    _, slice_ = HEADERS[header]
    carries = CARRIES[: draw(st.integers(1, 3))]
    lists: list[str] = []
    temporaries: list[str] = []
    body: list[str] = []
    buffer = stops = counts = count_read = False
    kinds = ["update", "temporary", "from-temporary", "swap", "flag", "append", "augment"]
    kinds += ["buffer", "break", "step-test", "indexed", "count"]
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(kinds))
        target, source = draw(st.sampled_from(carries)), draw(st.sampled_from(carries))
        if kind == "update":
            body.append(f"{target} = torch.tanh({source} * a + {slice_})")
        elif kind == "temporary":
            name = f"v{len(temporaries)}"
            temporaries.append(name)
            body.append(f"{name} = {source} + 0.5 * {slice_}")
        elif kind == "from-temporary" and temporaries:
            body.append(f"{target} = {draw(st.sampled_from(temporaries))} * 0.5 + {target}")
        elif kind == "swap" and len(carries) > 1:
            body.append(f"{carries[0]}, {carries[1]} = {carries[1]}, {carries[0]}")
        elif kind == "flag":
            body.append(f"if flag: {target} = {target} - {source} * 0.25")
        elif kind == "append" and len(lists) < 2:
            name = f"out{len(lists)}"
            lists.append(name)
            value = f"{draw(st.sampled_from([*carries, *temporaries]))} * 2"
            if draw(st.booleans()):
                body.append(f"{name}.append({value})")
            else:  # filled from the front
                body.append(f"{name}.insert(0, {value})")
        elif kind == "augment":
            body.append(f"{target} += {slice_} * 0.5")
        elif kind == "buffer" and not buffer and HEADERS[header][0].split()[1].rstrip(",") == "t":
            buffer = True
            previous = draw(st.booleans())
            rest = draw(st.sampled_from(["", ", :, 1:"]))  # the whole row or a part
            part = "[:, 1:]" if rest else ""
            value = (
                f"buf[t - 1{rest}] * 0.5 + {source}{part}" if previous else f"{source}{part} * 2"
            )
            body.append(f"buf[t{rest}] = {value}")
        elif kind == "indexed" and HEADERS[header][0].split()[1] == "t":
            part = draw(st.sampled_from(["x[t, :, 0:1]", "x[t, 1]", "xb[:, t, 1:2]", "xb[:, t]"]))
            body.append(f"{target} = {target} * 0.5 + {part}")
        elif kind == "step-test" and HEADERS[header][0].split()[1] == "t":
            test = draw(st.sampled_from(["t == 0", "t > 1", "t == len(x) - 1", "t != 2"]))
            if draw(st.booleans()):
                body.append(f"if {test}: {target} = {target} * 0.5 - {source}")
            else:
                body.append(f"{target} = {target} + {source} if {test} else {target} - 0.25")
        elif kind == "break" and not stops:
            stops = True
            leave = draw(st.sampled_from(["break", "continue"]))
            value = draw(st.sampled_from([".sum()", ".sum().item()"]))  # a tensor or its value
            test = f"{source}{value} > {draw(st.sampled_from([4, 8, 16]))}"
            test = f"not ({test})" if draw(st.booleans()) else test
            body.append(f"if {test}: {leave}")
        elif kind == "count" and not counts:
            counts = True
            count_read = draw(st.booleans())  # read after the loop, or a count nobody reads
            body.append("steps_run += 1")
    read_after = tuple(t for t in temporaries if draw(st.booleans()))
    return LoopProgram(
        header, tuple(body), carries, tuple(lists), read_after, buffer, counts, count_read
    )


def _compile(program: LoopProgram):
    scope = {"torch": torch}
    exec(compile(program.source(), "<generated loop>", "exec"), scope)
    return scope["program"]


def _call(fn, x: torch.Tensor, a: torch.Tensor, flag: bool) -> object:
    try:
        return fn(x, a, flag)
    except (RuntimeError, UnboundLocalError, NameError, IndexError) as error:
        return error


def _same(got: object, want: object, exact: bool, where: str) -> None:
    if isinstance(want, BaseException):
        assert type(got) is type(want), f"{where}: {got!r} where the original raised {want!r}"
        assert str(got) == str(want), where
        return
    assert not isinstance(got, BaseException), f"{where}: {got!r}"
    tolerance = {"rtol": 0, "atol": 0} if exact else {}
    torch.testing.assert_close(got, want, msg=lambda m: f"{where}: {m}", **tolerance)


def test_converted_loops_compute_as_written(fuzz_settings) -> None:
    outcomes: collections.Counter[str] = collections.Counter()

    @fuzz_settings("autoloop")
    @hypothesis.given(program=loop_programs(), flag=st.booleans())
    def run(program: LoopProgram, flag: bool) -> None:
        RUNS["autoloop"] += 1
        written = _compile(program)
        source = program.source()
        # the conversion reads the source through linecache, as it reads a file's
        linecache.cache["<generated loop>"] = (len(source), None, source.splitlines(True), "")
        converted = torchscan.autoloop(written)
        a = torch.full((B, F), 0.7)
        for n in (0, 1, 4):
            x = torch.randn(n, B, F, generator=torch.Generator().manual_seed(n))
            want = _call(written, x, a, flag)
            for call in range(_hoist.TRACE_AT_CALL):
                got = _call(converted, x.clone(), a, flag)
                where = f"length {n}, call {call + 1}:\n{source}"
                _same(got, want, exact=call == 0, where=where)
                if n == 4 and call == 0:
                    (row,) = torchscan.autoloop_report(converted)
                    outcomes["scan" if row.converted else row.reason] += 1
            # eagerly, as the package has it: so short a loop runs as written, and leaves the
            # report as the scan left it
            scanned = torchscan.autoloop_report(converted)
            every = _runtime.AS_WRITTEN_BELOW
            _runtime.AS_WRITTEN_BELOW = 32
            try:
                got = _call(converted, x.clone(), a, flag)
            finally:
                _runtime.AS_WRITTEN_BELOW = every
            _same(got, want, exact=True, where=f"length {n}, as written:\n{source}")
            assert torchscan.autoloop_report(converted) == scanned, source

    run()
    # most run as scans (a temporary read after the loop is bound by the first step, run as
    # Python)
    assert outcomes["scan"] >= sum(outcomes.values()) // 2, outcomes


def test_a_generated_program_runs_and_converts() -> None:
    program = LoopProgram(
        "range", ("c0 = torch.tanh(c0 * a + x[t])", "out0.append(c0 * 2)"), ("c0",), ("out0",), ()
    )
    written = _compile(program)
    x, a = torch.randn(5, B, F), torch.ones(B, F)
    c0, out0 = written(x, a, True)
    assert c0.shape == (B, F)
    assert out0.shape == (5, B, F)
    source = program.source()
    linecache.cache["<generated loop>"] = (len(source), None, source.splitlines(True), "")
    converted = torchscan.autoloop(written)
    torch.testing.assert_close(converted(x, a, True), (c0, out0), rtol=0, atol=0)
    assert [r.converted for r in torchscan.autoloop_report(converted)] == [True]
