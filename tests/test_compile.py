"""``scan`` and ``loop`` under ``torch.compile`` (src/torchscan/_compiled.py): one loop operator in
the compiled graph, the same results and gradients as eagerly, and graph breaks in the step.

Every expected value comes from the same function run eagerly, whose own tests compare it with a
Python loop (tests/test_scan.py, tests/test_loop.py).
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree

import torchscan
import torchscan.theano

Pair = collections.namedtuple("Pair", "a b")

TORCH_2_15 = torch.__version__ >= "2.15"


@pytest.fixture(autouse=True)
def _fresh_compiler():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class GraphRecorder:
    """A ``torch.compile`` backend that keeps every graph it is given and runs it as it is."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Callable:
        self.graphs.append(gm)
        return gm.forward

    def targets(self) -> list[Any]:
        return [
            node.target
            for gm in self.graphs
            for module in gm.modules()
            if isinstance(module, torch.fx.GraphModule)
            for node in module.graph.nodes
            if node.op == "call_function"
        ]

    def loop_operators(self) -> list[Any]:
        loops = (torch.ops.higher_order.scan, torch.ops.higher_order.while_loop)
        return [t for t in self.targets() if t in loops]


def compiled(fn: Callable, backend: Any = "aot_eager", **options: Any) -> Callable:
    return torch.compile(fn, backend=backend, **options)


# -- the same results, one loop operator -------------------------------------------------------

W = torch.randn(4, 4, generator=torch.Generator().manual_seed(0)) / 2


def elman(h, x):
    h = torch.tanh(h @ W + x)
    return h, h


def dict_step(c, x):
    h = torch.tanh(c["h"] @ W + x)
    return {"h": h, "n": c["n"] + 1, "none": None}, (h, None, {"s": h.sum()})


def pair_step(c, x):
    return Pair(c.a + x, c.b * 1.5), c.a.sum()


def alias_step(c, x):
    return c, c  # the carry unchanged, returned twice


def x_step(c, x):
    return c + x, x  # x itself as output


def int_step(c, x):
    return (c[0] + 1, c[1] * x), c[0]  # an int64 carry beyond 2**32


def bool_step(c, x):
    return c + x, c > 0


def _lengths(xs: torch.Tensor) -> torch.Tensor:
    """Four examples (the columns of xs): lengths 0, a third, two thirds and all of xs."""
    return torch.arange(4) * xs.shape[0] // 3


SCANS: dict[str, Callable[[torch.Tensor], Any]] = {
    "tensor": lambda xs: torchscan.scan(elman, torch.zeros(4), xs),
    "tensor reverse": lambda xs: torchscan.scan(elman, torch.zeros(4), xs, reverse=True),
    "axis 1": lambda xs: torchscan.scan(elman, torch.zeros(4), xs.T.contiguous().T, axis=0),
    "axis -1": lambda xs: torchscan.scan(
        lambda c, x: (c + x, (c * x)[None]), torch.zeros(4), xs.T, axis=-1
    ),
    "dict carry, None leaves": lambda xs: torchscan.scan(
        dict_step, {"h": torch.zeros(4), "n": torch.zeros((), dtype=torch.int64), "none": None}, xs
    ),
    "namedtuple": lambda xs: torchscan.scan(pair_step, Pair(xs[0], torch.ones(())), xs),
    "carry returned unchanged": lambda xs: torchscan.scan(alias_step, xs[0], xs),
    "x returned": lambda xs: torchscan.scan(x_step, xs[0], xs),
    "int64 carry": lambda xs: torchscan.scan(int_step, (torch.tensor(2**40), xs[0]), xs),
    "bool y, reverse": lambda xs: torchscan.scan(bool_step, xs[0], xs, reverse=True),
    "no carry": lambda xs: torchscan.scan(lambda c, x: (None, x * 2), None, xs),
    "no xs": lambda xs: torchscan.scan(lambda c, x: (c + 1, c), torch.zeros(2), length=xs.shape[0]),
    "empty y": lambda xs: torchscan.scan(lambda c, x: (c + x, ()), xs[0], xs),
    "nested": lambda xs: torchscan.scan(
        lambda c, x: (c + x, torchscan.scan(lambda d, z: (d * z, d), c, x[:, None])[1]),
        xs[0] * 0,
        xs,
    ),
    "until": lambda xs: torchscan.scan(
        lambda c, x: (c + x, c * 2, torchscan.until(c.sum() > 2)), torch.zeros(4), xs
    ),
    "until reverse": lambda xs: torchscan.scan(
        lambda c, x: (c + x, {"c": c}, torchscan.until(c.sum() > 2)),
        torch.zeros(4),
        xs,
        reverse=True,
    ),
    "loop": lambda xs: torchscan.loop(
        lambda i, c: ((c[0] + c[1], c[1] * 0.5), (c[0], i)),
        (xs[0], xs[1]),
        trip_count=xs.shape[0],
    ),
    "loop with until": lambda xs: torchscan.loop(
        lambda i, c: (c * 1.5, c.sum(), torchscan.until(c.sum() > 20)),
        xs[0].abs() + 1,
        trip_count=xs.shape[0],
    ),
    "loop with until, no limit": lambda xs: torchscan.loop(
        lambda i, c: (c + 1, None, torchscan.until(c.sum() > 10)), xs[0]
    ),
    "lengths": lambda xs: torchscan.scan(
        lambda c, x: (c * 0.5 + x, {"c": c, "x": x}), torch.zeros(4), xs, lengths=_lengths(xs)
    ),
    "lengths reverse": lambda xs: torchscan.scan(
        elman, torch.zeros(4), xs, lengths=_lengths(xs), reverse=True
    ),
    "theano go_backwards": lambda xs: torchscan.theano.scan(
        lambda x, h: torch.tanh(h @ W + x),
        sequences=xs,
        outputs_info=torch.zeros(4),
        go_backwards=True,
    ),
}


def sequences(length: int) -> torch.Tensor:
    return torch.randn(length, 4, generator=torch.Generator().manual_seed(length))


@pytest.mark.parametrize("name", list(SCANS))
def test_fullgraph_compiles_one_loop_operator_with_the_eager_results(name: str) -> None:
    fn = SCANS[name]
    recorder = GraphRecorder()
    run = compiled(fn, recorder, fullgraph=True, dynamic=True)
    for length in (5, 9):
        xs = sequences(length)
        torch.testing.assert_close(run(xs), fn(xs), rtol=0, atol=0)
    assert len(recorder.graphs) == 1  # one compilation serves both lengths
    # A nested scan is in the outer body, and in its first step traced on its own, which the
    # compiler drops later.
    assert len(recorder.loop_operators()) == (3 if name == "nested" else 1)


def bidirectional(xs):
    """Two sequences laid out leaf by leaf (one read backwards, on axis 1), and two outputs (one
    stacked backwards, on the last axis)."""
    return torchscan.scan(
        lambda c, x: ((c[0] + x[0], c[1] * 0.5 + x[1]), {"f": c[0], "b": c[1] * x[1]}),
        (torch.zeros(4), torch.zeros(4)),
        (xs, xs.T),
        in_axes=(0, 1),
        in_reverse=(False, True),
        out_reverse={"f": False, "b": True},
        out_axes={"f": 0, "b": -1},
    )


def test_sequences_with_axes_and_directions_of_their_own_run_as_one_loop_operator() -> None:
    """A bidirectional scan (one sequence read backwards, its output stacked backwards) compiles
    to one loop operator for every length, with the eager results and gradients."""
    recorder = GraphRecorder()
    run = compiled(bidirectional, recorder, fullgraph=True, dynamic=True)
    for length in (5, 9):
        xs = sequences(length).requires_grad_()
        got, want = run(xs), bidirectional(xs)
        torch.testing.assert_close(got, want)
        grads = [
            torch.autograd.grad(sum(leaf.sum() for leaf in pytree.tree_leaves(out)), xs)[0]
            for out in (got, want)
        ]
        torch.testing.assert_close(*grads)
    assert len(recorder.graphs) == 1
    assert len(recorder.loop_operators()) == 1


def test_until_with_directions_given_leaf_by_leaf_is_refused_as_eagerly() -> None:
    def stops(xs):
        return torchscan.scan(
            lambda c, x: (c + x[0], c, torchscan.until(c.sum() > 1e9)),
            torch.zeros(4),
            (xs, xs.T),
            in_axes=(0, 1),
            in_reverse=(False, True),
        )

    refusal = "returned until, which cannot be combined with in_axes"
    with pytest.raises(ValueError, match=refusal) as eager:
        stops(sequences(5))
    with pytest.raises(ValueError, match=refusal) as under_compile:
        compiled(stops)(sequences(5))  # (under fullgraph=True, torch.compile's own error)
    assert str(under_compile.value) == str(eager.value)


@pytest.mark.parametrize("second", ["same", "transposed"])
def test_until_over_one_tensor_given_twice_compiles(second: str) -> None:
    """torch.while_loop refuses inputs that alias each other: the sequences are not handed to
    it as views of one tensor."""

    def stops(xs):
        return torchscan.scan(
            lambda c, x: (c + x[0] * x[1], c, torchscan.until(c.sum() > 3.0)),
            torch.zeros(4),
            (xs, xs if second == "same" else xs.T),
            in_axes=(0, 0 if second == "same" else 1),
        )

    xs = sequences(9)
    torch.testing.assert_close(compiled(stops, fullgraph=True)(xs), stops(xs))


def test_the_compiled_graph_does_not_grow_with_the_length() -> None:
    sizes = {}
    for length in (40, 400):
        torch._dynamo.reset()
        recorder = GraphRecorder()
        compiled(SCANS["dict carry, None leaves"], recorder, fullgraph=True)(sequences(length))
        sizes[length] = len(recorder.targets())
    assert sizes[40] == sizes[400]


@pytest.mark.parametrize("unroll", [1, None, 4])
def test_many_lengths_need_two_compilations_by_default(unroll: int | None) -> None:
    # torch.compile's default: the first length static, then one dynamic graph for the others,
    # far below the recompile limit after which torch would fall back to eager.
    recorder = GraphRecorder()

    def fn(xs: torch.Tensor) -> Any:
        return torchscan.scan(elman, torch.zeros(4), xs, unroll=unroll)

    run = compiled(fn, recorder)
    for length in range(3, 45, 2):
        torch.testing.assert_close(run(sequences(length)), fn(sequences(length)))
    assert len(recorder.graphs) == 2


def loop_of(trips: int) -> Callable:
    def fn(xs):
        return torchscan.loop(
            lambda i, c: (c * 1.5, {"c": c, "i": i}, torchscan.until(c.sum() > 20)),
            xs[0],
            trip_count=trips,
        )

    return fn


def none_in_xs(xs):
    """A scan whose sequences hold a ``None`` leaf."""
    return torchscan.scan(
        lambda c, x: (c + x["a"], {"y": c * x["a"], "b": x["b"]}),
        torch.zeros(4),
        {"a": xs, "b": None},
    )


@pytest.mark.parametrize("length", [0, 1])
@pytest.mark.parametrize(
    "name", ["dict carry, None leaves", "None in xs", "until", "loop with until"]
)
def test_zero_steps_and_one_step_compile(name: str, length: int) -> None:
    if name == "None in xs":
        fn = none_in_xs
    else:
        fn = loop_of(length) if name.startswith("loop") else SCANS[name]
    xs = sequences(max(length, 1) if name.startswith("loop") else length)
    torch.testing.assert_close(compiled(fn, fullgraph=True)(xs), fn(xs), rtol=0, atol=0)


# Inductor compiles torch's scan as a while_loop that reads its counter with .item(), which
# torch allows by default only under fullgraph=True: both settings are tested.
@pytest.mark.parametrize("fullgraph", [True, False], ids=["fullgraph", "default"])
def test_inductor_compiles_the_scan_as_a_loop_for_every_length(fullgraph: bool) -> None:
    fn = SCANS["tensor reverse"]
    run = compiled(fn, "inductor", fullgraph=fullgraph, dynamic=True)
    for length in (3, 50):
        torch.testing.assert_close(run(sequences(length)), fn(sequences(length)))


@pytest.mark.parametrize("fullgraph", [True, False], ids=["fullgraph", "default"])
def test_inductor_compiles_until_as_a_while_loop(fullgraph: bool) -> None:
    fn = SCANS["until reverse"]
    run = compiled(fn, "inductor", fullgraph=fullgraph)
    with torch.no_grad():
        for length in (3, 50):
            torch.testing.assert_close(run(sequences(length)), fn(sequences(length)))


# -- gradients ---------------------------------------------------------------------------------


class RNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = torch.nn.RNNCell(4, 4)
        self.readout = torch.nn.Linear(4, 2)

    def forward(self, h: torch.Tensor, xs: torch.Tensor) -> Any:
        def step(h, x):
            h = self.cell(x, h)
            return h, self.readout(h)

        return torchscan.scan(step, h, xs, axis=1)


def gradients(model: torch.nn.Module, out: Any, inputs: tuple[torch.Tensor, ...]) -> tuple:
    loss = out[0].sum() + out[1].pow(2).sum()
    return torch.autograd.grad(loss, (*model.parameters(), *inputs))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("donated_buffer", [True, False], ids=["donated", "not donated"])
def test_gradients_match_eager(backend: str, donated_buffer: bool) -> None:
    torch.manual_seed(0)
    model = RNN()
    h = torch.randn(3, 4, requires_grad=True)
    xs = torch.randn(3, 6, 4, requires_grad=True)
    recorder = GraphRecorder()

    def record(gm, example_inputs):
        recorder(gm, example_inputs)
        return gm.forward if backend == "aot_eager" else _inductor(gm, example_inputs)

    options = torch._functorch.config.patch(donated_buffer=donated_buffer)
    with options:
        out = compiled(model, record)(h, xs)
        actual = gradients(model, out, (h, xs))
        # turned off for the compilation alone, where it had to be
        assert torch._functorch.config.donated_buffer is donated_buffer
    expected = gradients(model, model(h, xs), (h, xs))
    torch.testing.assert_close(actual, expected)
    # Before torch 2.15, Inductor gets these gradients wrong through a loop operator while it
    # donates buffers (pytorch#153679): torchscan has the compilation of the scan turn them off.
    assert recorder.loop_operators()


@pytest.mark.parametrize("donated_buffer", [True, False], ids=["donated", "not donated"])
def test_training_at_several_lengths_compiles_one_loop_not_an_unrolled_graph_per_length(
    donated_buffer: bool,
) -> None:
    torch.manual_seed(0)
    model = RNN()
    recorder = GraphRecorder()
    aot_eager = torch._dynamo.lookup_backend("aot_eager")

    def backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Callable:
        recorder(gm, example_inputs)
        return aot_eager(gm, example_inputs)  # AOTAutograd decides which buffers are donated

    fn = compiled(model, backend)
    with torch._functorch.config.patch(donated_buffer=donated_buffer):
        for length in (20, 60, 180):
            h = torch.randn(3, 4, requires_grad=True)
            xs = torch.randn(3, length, 4, requires_grad=True)
            actual = gradients(model, fn(h, xs), (h, xs))
            torch.testing.assert_close(actual, gradients(model, model(h, xs), (h, xs)))
            assert torch._functorch.config.donated_buffer is donated_buffer
    # one graph, and one more where the length becomes dynamic; unrolled, the graph of 20 steps
    # alone has over 80 nodes. (The first, of the known length 20, runs its first 4 steps in the
    # graph itself and the others in 2 blocks of 8: the default unrolling of this small step.)
    assert len(recorder.graphs) <= 2
    assert all(len(gm.graph.nodes) < 60 for gm in recorder.graphs)
    assert len(recorder.loop_operators()) == len(recorder.graphs)


def _inductor(gm: torch.fx.GraphModule, example_inputs: Any) -> Callable:
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, example_inputs)


def _cells() -> dict[str, Any]:
    torch.manual_seed(0)
    gru, lstm, W = torch.nn.GRUCell(4, 4), torch.nn.LSTMCell(4, 4), torch.randn(4, 4) / 2

    def elman(h, x):
        h = torch.tanh(h @ W + x)
        return h, h

    return {
        "elman": (elman, torch.randn(3, 4), [W.requires_grad_()]),
        "GRUCell": (lambda h, x: (gru(x, h),) * 2, torch.zeros(3, 4), list(gru.parameters())),
        "LSTMCell": (
            lambda hc, x: (lstm(x, hc), lstm(x, hc)[0] * 2),
            (torch.zeros(3, 4), torch.zeros(3, 4)),
            list(lstm.parameters()),
        ),
    }


_LOSSES = {
    "h.sum()": lambda h, ys: sum(t.sum() for t in pytree.tree_leaves(h)),
    "h.sum() + ys.sum()": lambda h, ys: sum(t.sum() for t in pytree.tree_leaves(h)) + ys.sum(),
    "ys.pow(2).mean()": lambda h, ys: ys.pow(2).mean(),
}


@pytest.mark.parametrize(
    ("cell", "loss"),
    [("elman", name) for name in _LOSSES] + [("GRUCell", "h.sum()"), ("LSTMCell", "h.sum()")],
)
def test_a_loss_computed_in_the_compiled_function_gets_the_python_loop_s_gradients(
    cell: str, loss: str
) -> None:
    """``h.sum()`` in the compiled function passes a broadcast gradient back to the final carry,
    for which torch's loop operator computes wrong gradients under Inductor (off by 62 for
    this Elman; ``_compat.dense_gradient``)."""
    step, init, weights = _cells()[cell]
    xs = torch.randn(6, 3, 4)

    def run(h, xs):
        return _LOSSES[loss](*torchscan.scan(step, h, xs))

    def python_loop(h, xs):
        ys = []
        for x in xs:
            h, y = step(h, x)
            ys.append(y)
        return _LOSSES[loss](h, torch.stack(ys))

    recorder = GraphRecorder()

    def backend(gm, example_inputs):
        recorder(gm, example_inputs)
        return _inductor(gm, example_inputs)

    actual = torch.autograd.grad(compiled(run, backend)(init, xs), weights)
    expected = torch.autograd.grad(python_loop(init, xs), weights)
    torch.testing.assert_close(actual, expected)
    assert recorder.loop_operators()


def test_gradients_through_int_and_bool_leaves_match_eager() -> None:
    xs = torch.randn(6, 4, requires_grad=True)

    def fn(xs):
        carry, (n, positive) = torchscan.scan(
            lambda c, x: ((c[0] + 1, c[1] * x), (c[0], c[1] > 0)), (torch.tensor(2**40), xs[0]), xs
        )
        return carry, n, positive

    with torch._functorch.config.patch(donated_buffer=False):
        actual = compiled(fn, fullgraph=True)(xs)
        grad = torch.autograd.grad(actual[0][1].sum(), xs)
    expected = fn(xs)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    torch.testing.assert_close(grad, torch.autograd.grad(expected[0][1].sum(), xs))


@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
def test_until_while_recording_gradients_traces_the_steps_with_the_eager_gradients() -> None:
    # torch.while_loop's gradients reach only the last iteration's use of what its body reads
    # from outside, so with until the steps are traced one by one while gradients are recorded.
    xs = torch.rand(6, 4, requires_grad=True)
    fn = SCANS["until"]
    recorder = GraphRecorder()
    out = compiled(fn, recorder)(xs)
    expected = fn(xs)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(
        torch.autograd.grad(out[1].sum(), xs), torch.autograd.grad(expected[1].sum(), xs)
    )
    assert recorder.loop_operators() == []


# -- graph breaks ------------------------------------------------------------------------------


def graph_break(h: torch.Tensor) -> torch.Tensor:
    torch._dynamo.graph_break()
    return h


def printed(h: torch.Tensor) -> torch.Tensor:
    print(end="")
    return h


def branch_on_a_tensor(h: torch.Tensor) -> torch.Tensor:
    return h * 0.5 if h.sum() > 0 else h


BREAKS = {"graph_break()": graph_break, "print": printed, "if on a tensor": branch_on_a_tensor}


def breaking_programs(brk: Callable) -> dict[str, Callable]:
    def scan_step(c, x):
        h = brk(torch.tanh(c["h"] @ W + x))
        return {"h": h, "n": c["n"] + 1}, (h, None)

    def until_step(c, x):
        c = brk(c + x)
        return c, c * 2, torchscan.until(c.sum() > 2)

    def loop_body(i, c):
        c = Pair(brk(c.a * 0.5 + 1), c.b + c.a)
        return c, c.a

    def theano_step(x, h):
        return brk(h + x)

    init = {"h": torch.zeros(4), "n": torch.zeros((), dtype=torch.int64)}
    return {
        "scan": lambda xs: torchscan.scan(scan_step, init, xs, reverse=True),
        "scan until": lambda xs: torchscan.scan(until_step, torch.zeros(4), xs),
        "loop": lambda xs: torchscan.loop(loop_body, Pair(xs[0], xs[1]), trip_count=5),
        "loop until": lambda xs: torchscan.loop(
            lambda i, c: (brk(c + 1), c, torchscan.until(c.sum() > 9)), xs[0], trip_count=9
        ),
        "theano": lambda xs: torchscan.theano.scan(
            theano_step, sequences=xs, outputs_info=torch.zeros(4), go_backwards=True
        ),
    }


_PROGRAMS = ["scan", "scan until", "loop", "loop until", "theano"]
# every kind of break in a scan; one in each other program, in turn (about 5 s a compilation)
_BREAK_POINTS = [
    *[("scan", brk) for brk in BREAKS],
    *[(program, list(BREAKS)[i % len(BREAKS)]) for i, program in enumerate(_PROGRAMS[1:])],
]


@pytest.mark.parametrize(
    ("program", "brk"), _BREAK_POINTS, ids=[f"{b}-{p}" for p, b in _BREAK_POINTS]
)
def test_a_graph_break_in_the_step_runs_with_the_eager_results(program: str, brk: str) -> None:
    fn = breaking_programs(BREAKS[brk])[program]
    xs = torch.rand(6, 4)
    with contextlib.redirect_stdout(None):
        torch.testing.assert_close(compiled(fn)(xs), fn(xs), rtol=0, atol=0)


def test_a_graph_break_under_fullgraph_is_torch_compile_s_error() -> None:
    fn = breaking_programs(graph_break)["scan"]
    with pytest.raises(torch._dynamo.exc.Unsupported):
        compiled(fn, fullgraph=True)(torch.rand(6, 4))


def test_a_graph_break_still_checks_the_carry() -> None:
    def step(c, x):
        torch._dynamo.graph_break()
        return (c, c), x

    with pytest.raises(TypeError, match=r"the carry must keep its structure"):
        compiled(lambda xs: torchscan.scan(step, torch.zeros(4), xs))(torch.rand(3, 4))


@pytest.mark.parametrize("donated_buffer", [True, False], ids=["donated", "not donated"])
def test_outside_a_compilation_donated_buffers_are_left_as_they_are(donated_buffer: bool) -> None:
    from torchscan import _compat

    with torch._functorch.config.patch(donated_buffer=donated_buffer):
        right = _compat.train_loops_correctly_in_this_compile()
        assert torch._functorch.config.donated_buffer is donated_buffer
    assert right is (TORCH_2_15 or not donated_buffer)


def test_the_compiled_loop_asserts_no_sizes_at_every_step_unless_the_options_ask() -> None:
    from torch._inductor.utils import run_and_get_code

    def fn(xs):
        return torchscan.scan(elman, torch.zeros(4), xs)

    xs = torch.randn(6, 4)
    before = torch._inductor.config.size_asserts
    with torch.no_grad():
        out, code = run_and_get_code(torch.compile(fn), xs)
        torch.testing.assert_close(out, fn(xs))
        assert "while_loop" in code[0]
        assert "assert_size_stride(" not in "".join(code)
        assert torch._inductor.config.size_asserts is before
        # the user's own options are Inductor's last word
        torch._dynamo.reset()
        asked = torch.compile(fn, options={"size_asserts": True})
        out, code = run_and_get_code(asked, xs)
    torch.testing.assert_close(out, fn(xs))
    assert "assert_size_stride(" in "".join(code)
    assert torch._inductor.config.size_asserts is before


# -- unroll ------------------------------------------------------------------------------------


def _python_scan(step: Callable, h: Any, xs: torch.Tensor, reverse: bool = False) -> Any:
    """The Python loop ``scan`` means, as the docstring of ``torchscan.scan`` writes it."""
    ys: list[Any] = [None] * len(xs)
    for t in reversed(range(len(xs))) if reverse else range(len(xs)):
        h, ys[t] = step(h, xs[t])
    return h, torch.stack(ys)


def _bodies_steps(recorder: GraphRecorder, target: Any) -> list[int]:
    """How many times ``target`` (or a function of that name) is called in the body of every
    loop operator compiled."""
    counts = []
    for gm in recorder.graphs:
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target is torch.ops.higher_order.scan:
                body = getattr(gm, node.args[0].target)
                counts.append(sum(_calls(n, target) for n in body.graph.nodes))
    return counts


def _calls(node: torch.fx.Node, target: Any) -> bool:
    if isinstance(target, str):
        return getattr(node.target, "__name__", None) == target
    return node.target is target


# unroll, reverse, lengths: by 3, 8 steps are 2 first and then 2 blocks, 9 are 3 blocks; by
# default (8 for this small step), 20 steps are 4 first and 2 blocks
UNROLLED = {
    "unroll=3": (3, False, (8, 9)),
    "unroll=3, reverse": (3, True, (8, 9)),
    "default, reverse": (None, True, (20,)),
    "unroll=True": (True, False, (7,)),
}


@pytest.mark.parametrize("case", list(UNROLLED))
def test_unrolled_scans_give_the_python_loop_s_results_and_gradients(case: str) -> None:
    unroll, reverse, lengths = UNROLLED[case]
    step, init, weights = _cells()["LSTMCell"]
    # dynamic=False: unroll applies where the compiled graph knows the length
    run = compiled(
        lambda h, xs: torchscan.scan(step, h, xs, reverse=reverse, unroll=unroll), dynamic=False
    )
    for length in lengths:
        xs = torch.randn(length, 3, 4, requires_grad=True)
        out = run(init, xs)
        expected = _python_scan(step, init, xs, reverse)
        torch.testing.assert_close(out, expected)
        loss, expected_loss = out[1].pow(2).sum(), expected[1].pow(2).sum()
        torch.testing.assert_close(
            torch.autograd.grad(loss, [xs, *weights]),
            torch.autograd.grad(expected_loss, [xs, *weights]),
        )


@pytest.mark.parametrize(("unroll", "lengths"), [(2, (5, 6)), (5, (13,))])
def test_unrolled_loops_and_per_leaf_directions_give_the_eager_results(
    unroll: int, lengths: tuple[int, ...]
) -> None:
    def programs(xs: torch.Tensor) -> Any:
        return (
            torchscan.loop(
                lambda i, c: (
                    (c[0] * 0.9 + c[1].index_select(0, (i % 3)[None])[0], c[1]),
                    c[0] * i,
                ),
                (xs[0], xs[:3]),
                trip_count=xs.shape[0],
                unroll=unroll,
            ),
            torchscan.scan(
                lambda c, x: (torch.tanh(c @ W + x[0] - x[1]), {"a": c, "b": x[1] * 2}),
                torch.zeros(4),
                (xs, xs.T),
                in_axes=(0, 1),
                in_reverse=(False, True),
                out_reverse={"a": True, "b": False},
                unroll=unroll,
            ),
            torchscan.scan(
                lambda c, x: (c * 0.5 + x, c),
                torch.zeros(4),
                xs,
                lengths=torch.tensor([0, 1, 5, xs.shape[0]]),
                unroll=unroll,
            ),
            torchscan.loop(  # with until: one iteration per iteration of the while_loop
                lambda i, c: (c * 1.5, c.sum(), torchscan.until(c.sum() > 20)),
                xs[0].abs() + 1,
                trip_count=xs.shape[0],
                unroll=unroll,
            ),
        )

    run = compiled(programs, "aot_eager", fullgraph=True, dynamic=False)
    # by 2: 1 step first, then 2 blocks (5); 3 whole blocks (6). By 5: 3 steps first, then 2
    # blocks (13)
    for length in lengths:
        xs = sequences(length)
        torch.testing.assert_close(run(xs), programs(xs))


def test_unroll_puts_that_many_steps_in_each_iteration() -> None:
    def fn(xs, unroll):
        return torchscan.scan(elman, torch.zeros(4), xs, unroll=unroll)

    found = {}
    for length, unroll, dynamic in [
        (11, 1, False), (11, "False", False), (11, 4, False), (12, 4, False), (11, "True", False),
        (11, 4, True), (7, 4, False),
    ]:  # fmt: skip
        torch._dynamo.reset()
        recorder = GraphRecorder()
        xs = sequences(length)
        asked = {"True": True, "False": False}.get(unroll, unroll)  # (True == 1 as keys)
        torch.testing.assert_close(
            compiled(fn, recorder, dynamic=dynamic)(xs, asked), fn(xs, 1), rtol=0, atol=0
        )
        found[length, unroll, dynamic] = (
            _bodies_steps(recorder, torch.tanh),
            sum(node.target is torch.tanh for node in recorder.graphs[0].graph.nodes),
        )
    # (the steps of each loop operator's body, the steps in the graph itself, where the first
    # step traced on its own is one)
    assert found == {
        (11, 1, False): ([1], 1),
        (11, "False", False): ([1], 1),
        (11, 4, False): ([4], 1 + 3),  # the first 3 steps, then 2 blocks of 4
        (12, 4, False): ([4], 1),  # 3 blocks
        (11, "True", False): ([], 1 + 11),  # every step in the graph
        (11, 4, True): ([1], 1),  # a symbolic length runs one step per iteration
        (7, 4, False): ([1], 1),  # one block and the 3 steps before it run one by one
    }


@pytest.mark.parametrize("cell", ["tanh(h @ W + x)", "LSTMCell"])
def test_the_default_unrolls_small_steps_and_leaves_large_ones(cell: str) -> None:
    def fn(h, xs, model):
        if cell == "LSTMCell":
            return torchscan.scan(lambda c, x: (model(x, c), c[0]), h, xs)
        return torchscan.scan(lambda c, x: (torch.tanh(c @ model + x), c), h, xs)

    found = {}
    for name, (batch, hidden) in {"small": (64, 16), "large": (16, 512)}.items():
        torch._dynamo.reset()
        recorder = GraphRecorder()
        model = (
            torch.nn.LSTMCell(hidden, hidden) if cell == "LSTMCell" else torch.randn(hidden, hidden)
        )
        h = torch.zeros(batch, hidden)
        h = (h, h) if cell == "LSTMCell" else h
        xs = torch.randn(40, batch, hidden)
        with torch.no_grad():
            torch.testing.assert_close(compiled(fn, recorder)(h, xs, model), fn(h, xs, model))
        target = "lstm_cell" if cell == "LSTMCell" else torch.tanh
        found[name] = max(_bodies_steps(recorder, target))
    assert found == {"small": 8, "large": 1}


def test_the_chosen_unrolling_falls_as_the_step_grows() -> None:
    from torchscan import _compiled

    chosen = [_compiled._chosen_now(4, 2, flops, "cpu") for flops in (10**3, 10**5, 10**6, 10**7)]
    assert chosen == sorted(chosen, reverse=True)
    assert chosen[0] == _compiled.MOST_UNROLLED
    assert chosen[-1] == 1
    # no more operations in an iteration than MOST_OPERATIONS
    assert _compiled._chosen_now(100, 2, 10**3, "cpu") * 100 <= _compiled.MOST_OPERATIONS
    assert _compiled._chosen_now(4, 2, 10**3, "a device without figures") == 1


def test_unroll_changes_nothing_eagerly_or_in_an_export() -> None:
    def fn(xs, unroll=None):
        return torchscan.scan(elman, torch.zeros(4), xs, unroll=unroll)

    xs = sequences(9)
    assert torch.equal(fn(xs, 4)[1], fn(xs)[1])

    class Model(torch.nn.Module):
        def __init__(self, unroll: Any) -> None:
            super().__init__()
            self.unroll = unroll

        def forward(self, xs):
            return fn(xs, self.unroll)

    codes = [
        torch.export.export(Model(unroll), (xs,)).graph_module.print_readable(print_output=False)
        for unroll in (None, 4, True)
    ]
    assert codes[0] == codes[1] == codes[2]


@pytest.mark.parametrize("api", ["torchscan.scan", "torchscan.loop"])
@pytest.mark.parametrize(
    ("unroll", "error", "message"),
    [
        (0, ValueError, r"unroll must be at least 1 \(the steps each iteration of the compiled "
         r"loop runs\), but it is 0\."),
        (-3, ValueError, "unroll must be at least 1 .* but it is -3."),
        (2.0, TypeError, "unroll must be an int of at least 1, True, False or None, but got a "
         "float"),
        ("4", TypeError, "unroll must be an int of at least 1, True, False or None, but got a "
         "str"),
        (torch.tensor(4), TypeError, r"unroll must be an int .* but got int64\[\] on cpu"),
    ],
)  # fmt: skip
def test_a_wrong_unroll_is_refused_eagerly_and_compiled(
    api: str, unroll: Any, error: type, message: str
) -> None:
    def fn(xs):
        if api == "torchscan.scan":
            return torchscan.scan(elman, torch.zeros(4), xs, unroll=unroll)
        return torchscan.loop(lambda i, c: (c + 1, c), xs[0], trip_count=3, unroll=unroll)

    for run in (fn, compiled(fn)):
        with pytest.raises(error, match=f"^{api}: {message}"):
            run(sequences(3))
