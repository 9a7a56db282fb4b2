"""Hoisting under ``torch.compile`` (``src/torchscan/_hoist/_inductor.py``): Inductor's compilation
of a scan computes the work of its steps that does not depend on the carry before the loop operator,
with the hand-written Python loop's results and gradients; steps it cannot rewrite are left as
they are."""

from __future__ import annotations

import hypothesis
import hypothesis.strategies as st
import pytest
import torch
import torch.utils._pytree as pytree

import torchscan
from torchscan._hoist import _inductor as _compiled_hoist

from ._oracles import loop_loop, scan_loop

T, B, H = 9, 3, 5
DTYPE = torch.float64  # the batched products round as the loop's do, to float64's precision


@pytest.fixture(autouse=True)
def _fresh_compiler():
    torch._dynamo.reset()
    _compiled_hoist.last.clear()
    yield
    torch._dynamo.reset()


def randn(*shape: int, grad: bool = False) -> torch.Tensor:
    return torch.randn(*shape, dtype=DTYPE).requires_grad_(grad)


def assert_gradients_equal(got, want, inputs) -> None:
    def grads(outputs):
        total = sum(leaf.pow(2).sum() for leaf in pytree.tree_leaves(outputs))
        return torch.autograd.grad(total, inputs, allow_unused=True)

    for g, w in zip(grads(got), grads(want), strict=True):
        if w is None:  # a parameter the step does not read
            assert g is None
        else:
            torch.testing.assert_close(g, w)


class Elman(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.input = torch.nn.Linear(H, H, dtype=DTYPE)
        self.hidden = torch.nn.Linear(H, H, bias=False, dtype=DTYPE)
        self.out = torch.nn.Linear(H, 2, dtype=DTYPE)

    def forward(self, h, x):
        h = torch.tanh(self.input(x) + self.hidden(h))
        return h, {"logits": self.out(h), "x": torch.relu(x) * 2}


@pytest.mark.parametrize("reverse", [False, True])
def test_the_input_projection_leaves_the_loop_with_the_loops_results_and_gradients(reverse):
    torch.manual_seed(0)
    step = Elman()
    h, xs = randn(B, H, grad=True), randn(T, B, H, grad=True)
    got = torch.compile(lambda h, xs: torchscan.scan(step, h, xs, reverse=reverse))(h, xs)
    (moved, stayed), *others = _compiled_hoist.last
    assert not others
    assert moved >= 3  # the input projection, relu(x) * 2
    assert stayed >= 3  # the hidden product, the sum, tanh, the output layer
    want = scan_loop(step, h, xs, reverse=reverse)
    torch.testing.assert_close(got, want)
    assert_gradients_equal(got, want, [h, xs, *step.parameters()])


def test_unrolled_steps_leave_their_input_projections_out_of_the_loop():
    # 22 steps unrolled by 4, backward: the last 2 in the graph itself, then 5 blocks of 4 steps
    reverse = True
    torch.manual_seed(0)
    step = Elman()
    h, xs = randn(B, H, grad=True), randn(22, B, H, grad=True)

    def run(h, xs):
        return torchscan.scan(step, h, xs, reverse=reverse, unroll=4)

    got = torch.compile(run)(h, xs)
    (moved, stayed), *others = _compiled_hoist.last
    assert not others
    assert moved >= 3 * 4
    assert stayed >= 3 * 4
    want = scan_loop(step, h, xs, reverse=reverse)
    torch.testing.assert_close(got, want)
    assert_gradients_equal(got, want, [h, xs, *step.parameters()])


def test_a_loop_bodys_work_on_the_iteration_number_alone_leaves_the_loop():
    torch.manual_seed(1)
    w, U = randn(H, grad=True), (randn(H, H) / 3).requires_grad_()
    h = randn(B, H, grad=True)

    def body(i, h):
        h = torch.tanh(torch.sin(i * 0.1) * w + h @ U)
        return h, h

    got = torch.compile(lambda h: torchscan.loop(body, h, trip_count=T))(h)
    assert len(_compiled_hoist.last) == 1
    assert _compiled_hoist.last[0][0] >= 3  # i * 0.1, sin, * w
    want = loop_loop(body, h, trip_count=T)
    torch.testing.assert_close(got, want)
    assert_gradients_equal(got, want, [h, w, U])


def test_a_step_that_draws_random_numbers_is_left_as_it_is():
    lin = torch.nn.Linear(H, H, dtype=DTYPE)

    def step(h, x):
        h = torch.tanh(torch.nn.functional.dropout(lin(x), 0.5) + h)
        return h, h

    _, ys = torch.compile(lambda h, xs: torchscan.scan(step, h, xs))(randn(B, H), randn(T, B, H))
    assert _compiled_hoist.last == []
    assert ys.shape == (T, B, H)


def test_hoist_false_leaves_the_loop_as_it_is_and_the_setting_is_put_back():
    step = Elman()
    h, xs = randn(B, H), randn(T, B, H)
    got = torch.compile(lambda h, xs: torchscan.scan(step, h, xs, hoist=False))(h, xs)
    assert _compiled_hoist.last == []
    torch.testing.assert_close(got, scan_loop(step, h, xs))
    assert torch._inductor.config.pre_grad_custom_pass is None


def test_a_pre_grad_pass_of_the_users_runs_after_it_and_is_put_back():
    from torch._inductor.custom_graph_pass import CustomGraphPass

    seen = []

    class Count(CustomGraphPass):
        def __call__(self, graph: torch.fx.Graph) -> None:
            seen.append(len(graph.nodes))

        def uuid(self) -> str:
            return "count"

    mine = Count()
    step = Elman()
    h, xs = randn(B, H), randn(T, B, H)
    with torch._inductor.config.patch(pre_grad_custom_pass=mine):
        got = torch.compile(lambda h, xs: torchscan.scan(step, h, xs))(h, xs)
        assert torch._inductor.config.pre_grad_custom_pass is mine
    assert seen
    assert _compiled_hoist.last
    torch.testing.assert_close(got, scan_loop(step, h, xs))


SEQUENCE_WORK = {
    "linear": lambda m, x: m.lin(x),
    "tanh of linear": lambda m, x: torch.tanh(m.lin(x)),
    "scaled relu": lambda m, x: torch.relu(x) * 0.5 + 1.0,
    "layer norm": lambda m, x: torch.nn.functional.layer_norm(x, (H,)),
    "chunks": lambda m, x: torch.cat(m.lin(x).chunk(H, dim=-1)[::-1], dim=-1),
    "products": lambda m, x: (x @ m.W).sigmoid() * (x @ m.W.t()),
    "a reduction": lambda m, x: x - x.mean(dim=-1, keepdim=True),
}
MIXING = {
    "added": lambda h, p: torch.tanh(p + h @ torch.ones(H, H, dtype=DTYPE) / H),
    "multiplied": lambda h, p: h * torch.sigmoid(p) + p,
    "concatenated": lambda h, p: torch.cat([h, p], -1)[..., ::2] + h[..., :1],
}


class RandomStep(torch.nn.Module):
    def __init__(self, work: list[str], mixing: str) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(H, H, dtype=DTYPE)
        self.W = torch.nn.Parameter(randn(H, H) / H**0.5)
        self.work, self.mixing = work, mixing

    def forward(self, h, x):
        p = x
        for name in self.work:
            p = SEQUENCE_WORK[name](self, p)
        h = MIXING[self.mixing](h, p)
        return h, (h, p)


@hypothesis.given(
    work=st.lists(st.sampled_from(list(SEQUENCE_WORK)), min_size=1, max_size=3),
    mixing=st.sampled_from(list(MIXING)),
    reverse=st.booleans(),
    length=st.integers(1, 6),
)
@hypothesis.settings(max_examples=3, deadline=None, derandomize=True)
def test_random_work_on_x_alone_leaves_the_loop_with_the_loops_gradients(
    work, mixing, reverse, length
):
    torch._dynamo.reset()
    _compiled_hoist.last.clear()
    torch.manual_seed(len(work))
    step = RandomStep(work, mixing)
    h, xs = randn(B, H, grad=True), randn(length, B, H, grad=True)
    got = torch.compile(lambda h, xs: torchscan.scan(step, h, xs, reverse=reverse))(h, xs)
    assert len(_compiled_hoist.last) == 1
    assert _compiled_hoist.last[0][0] >= len(work)
    want = scan_loop(step, h, xs, reverse=reverse)
    torch.testing.assert_close(got, want)
    assert_gradients_equal(got, want, [h, xs, *step.parameters()])


def test_work_on_x_that_nothing_reads_leaves_the_loop_with_a_sequence():
    """The step computes a value of x that nothing reads, beside a carry update that reads
    none of x: the dead work is dropped before the step is split, and the loop operator keeps
    the sequence it needs (torch's scan refuses one of no sequence)."""

    def step(c, x):
        unused = c / (1 + x.abs())  # noqa: F841  (read by nothing, as in a step being written)
        c = torch.tanh(0.5 * c + 1)
        return c, c * 2

    xs, h = randn(5, 3), randn(3)
    with torch.no_grad():
        got = torch.compile(lambda h, xs: torchscan.scan(step, h, xs))(h, xs)
    torch.testing.assert_close(got, scan_loop(step, h, xs))


def test_constants_the_loop_reads_are_computed_once_before_it_with_the_loops_gradients():
    """Keys and values of a fixed memory, read by the carry's attention at every step, leave the
    loop (computed once from the outside values); the results and the gradients to the memory,
    the weights, the sequence and the carry are the Python loop's. The pass runs on the graph
    TorchDynamo captures, which then runs as it is (no Inductor compilation)."""
    torch.manual_seed(0)
    memory, wk, wv, wq = randn(B, 3, H, grad=True), *(randn(H, H, grad=True) for _ in range(3))

    def step(h, x):
        keys, values = memory @ wk, memory @ wv
        scores = ((h @ wq).unsqueeze(1) @ keys.transpose(1, 2)).squeeze(1)
        h = torch.tanh((scores.softmax(-1).unsqueeze(1) @ values).squeeze(1) + x)
        return h, h * 2

    def backend(gm, _inputs):
        _compiled_hoist.hoist_scans(gm.graph)
        return gm.forward

    h, xs = randn(B, H, grad=True), randn(T, B, H, grad=True)
    got = torch.compile(lambda h, xs: torchscan.scan(step, h, xs), backend=backend)(h, xs)
    (moved, _), *others = _compiled_hoist.last
    assert not others
    assert moved >= 3  # the keys' and the values' products, the keys transposed
    want = scan_loop(step, h, xs)
    torch.testing.assert_close(got, want)
    assert_gradients_equal(got, want, [h, xs, memory, wk, wv, wq])


@pytest.mark.parametrize("length", [1, 4])
def test_a_step_of_constants_alone_keeps_a_sequence_for_the_length(length):
    """A step that reads no carry and no ``x`` (``length=`` without sequences): its work leaves
    the loop, which keeps a sequence to take its length from (a fuzzed program)."""
    w = randn(3, grad=True)

    def backend(gm, _inputs):
        _compiled_hoist.hoist_scans(gm.graph)
        return gm.forward

    def fn(w):
        return torchscan.scan(lambda c, x: (None, w + w), None, length=length)

    got = torch.compile(fn, backend=backend)(w)
    assert _compiled_hoist.last
    torch.testing.assert_close(got, fn(w))
