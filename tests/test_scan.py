"""Eager ``torchscan.scan`` against the hand-written Python loop."""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import hypothesis
import hypothesis.strategies as st
import pytest
import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor

import torchscan

from ._oracles import scan_loop

T, B, H = 5, 3, 4
_gen = torch.Generator().manual_seed(0)


def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen, dtype=dtype)


W, U = randn(H, H), randn(H, H)
LINEAR = torch.nn.Linear(H, H)
State = collections.namedtuple("State", ["h", "count"])


def elman(h, x):
    h = torch.tanh(x @ W + h @ U)
    return h, h


def dict_carry(carry, x):
    h = torch.tanh(LINEAR(x["a"]) + carry["h"])
    return {"h": h, "n": carry["n"] + 1}, {"out": h * x["b"], "nothing": None}


def namedtuple_carry(state, x):
    h = state.h * 0.5 + x
    return State(h, state.count + 1), (h.sum(-1), state.count)


def no_carry(carry, x):
    return None, x * 2.0


def no_y(carry, x):
    return carry + x, None


def int_carry(carry, x):
    return carry + (x.sum(-1) > 0).long(), carry * 2


def bool_carry(carry, x):
    return carry ^ (x.sum(-1) > 0), carry


def python_scalars(carry, x):
    return carry * 0.5 + x * 2 + 1, carry * 3


def zipped(carry, x):
    a, b = x
    return carry + a * b, a - b


def skip_none_leaf(carry, x):
    assert x["skip"] is None
    return carry + x["a"], carry


def counter(carry, x):
    assert x is None
    return carry + 1, carry * carry


def carry_as_y_twice(carry, x):
    h = carry + x
    return h, (h, h)


# (fn, init, xs as time-major, extra kwargs). Every xs leaf has rank >= 2 and every y leaf rank
# >= 1 so that each case also runs with axis 1 and -1.
CASES: dict[str, tuple[Callable, Any, Any, dict]] = {
    "elman": (elman, randn(B, H), randn(T, B, H), {}),
    "dict": (
        dict_carry,
        {"h": randn(B, H), "n": torch.zeros(B, dtype=torch.int64)},
        {"a": randn(T, B, H), "b": randn(T, B, 1)},
        {},
    ),
    "namedtuple": (
        namedtuple_carry,
        State(randn(B, H), torch.zeros(B)),
        randn(T, B, H),
        {},
    ),
    "no-carry": (no_carry, None, randn(T, B, H), {}),
    "no-y": (no_y, randn(B, H), randn(T, B, H), {}),
    "int-carry": (int_carry, torch.arange(B), randn(T, B, H), {}),
    "bool-carry": (bool_carry, torch.zeros(B, dtype=torch.bool), randn(T, B, H), {}),
    "python-scalars": (python_scalars, randn(B, H), randn(T, B, H), {}),
    "zipped": (zipped, randn(B, H), (randn(T, B, H), randn(T, B, H)), {}),
    "none-leaf-in-xs": (skip_none_leaf, randn(B, H), {"a": randn(T, B, H), "skip": None}, {}),
    "length-only": (counter, randn(B, H), None, {"length": T}),
    "carry-as-y-twice": (carry_as_y_twice, randn(B, H), randn(T, B, H), {}),
}


def move_time_axis(xs: Any, axis: int) -> Any:
    return pytree.tree_map(lambda leaf: None if leaf is None else leaf.movedim(0, axis), xs)


def assert_trees_equal(actual: Any, expected: Any) -> None:
    actual_leaves, actual_spec = pytree.tree_flatten(actual)
    expected_leaves, expected_spec = pytree.tree_flatten(expected)
    assert actual_spec == expected_spec
    for a, e in zip(actual_leaves, expected_leaves, strict=True):
        if e is None:
            assert a is None
        else:
            torch.testing.assert_close(a, e, rtol=0, atol=0)


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_scan_equals_python_loop(case: str, axis: int, reverse: bool) -> None:
    fn, init, xs, kwargs = CASES[case]
    xs = move_time_axis(xs, axis)
    actual = torchscan.scan(fn, init, xs, axis=axis, reverse=reverse, **kwargs)
    expected = scan_loop(fn, init, xs, axis=axis, reverse=reverse, **kwargs)
    assert_trees_equal(actual, expected)


def test_reverse_aligns_ys_with_xs() -> None:
    xs = torch.arange(1.0, 5.0)
    carry, ys = torchscan.scan(lambda c, x: (c + x, c + x), torch.tensor(0.0), xs, reverse=True)
    assert carry.item() == 10.0
    assert ys.tolist() == [10.0, 9.0, 7.0, 4.0]


@st.composite
def scan_problems(draw) -> tuple[Any, int, int, bool]:
    """A pytree of sequences that share a length along a common axis, with that axis."""
    length = draw(st.integers(0, 4))
    rank = draw(st.integers(1, 3))
    axis = draw(st.integers(-rank, rank - 1))

    structure = draw(
        st.recursive(
            st.sampled_from(["tensor", "tensor", None]),
            lambda children: (
                st.lists(children, min_size=1, max_size=3)
                | st.tuples(children, children)
                | st.dictionaries(st.sampled_from("abc"), children, min_size=1)
            ),
            max_leaves=4,
        )
    )
    hypothesis.assume("tensor" in pytree.tree_leaves(structure))

    def tensor(_placeholder):
        shape = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
        shape[axis] = length
        return randn(*shape, dtype=torch.float64)

    tree = pytree.tree_map(lambda p: None if p is None else tensor(p), structure)
    return tree, length, axis, draw(st.booleans())


def mix(carry: torch.Tensor, x: Any) -> tuple[torch.Tensor, Any]:
    total = sum(leaf.sum() for leaf in pytree.tree_leaves(x) if leaf is not None)
    carry = carry * 0.5 + total
    return carry, pytree.tree_map(lambda leaf: None if leaf is None else leaf * carry, x)


@hypothesis.given(scan_problems())
def test_random_pytrees_equal_python_loop(problem) -> None:
    xs, length, axis, reverse = problem
    init = torch.tensor(1.0, dtype=torch.float64)
    carry, ys = torchscan.scan(mix, init, xs, axis=axis, reverse=reverse)
    if length == 0:
        assert carry is init
        expected_ys = pytree.tree_map(lambda leaf: leaf, xs)  # mix keeps the shape of x
    else:
        expected_carry, expected_ys = scan_loop(mix, init, xs, axis=axis, reverse=reverse)
        torch.testing.assert_close(carry, expected_carry, rtol=0, atol=0)
    assert_trees_equal(ys, expected_ys)


# -- zero-length sequences ---------------------------------------------------------------------


def recording(fn: Callable, calls: list) -> Callable:
    def wrapped(carry, x):
        calls.append(pytree.tree_leaves((carry, x)))
        return fn(carry, x)

    return wrapped


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_zero_length_gives_empty_ys_of_the_right_type(axis: int) -> None:
    calls: list = []
    init = {"h": randn(B, H), "n": torch.zeros(B, dtype=torch.int64)}
    xs = move_time_axis({"a": randn(0, B, H), "b": randn(0, B, 1)}, axis)
    carry, ys = torchscan.scan(recording(dict_carry, calls), init, xs, axis=axis)
    assert carry is init
    expected = torch.empty(B, H).unsqueeze(axis % 3)
    assert ys["out"].shape == (*expected.shape[: axis % 3], 0, *expected.shape[axis % 3 + 1 :])
    assert ys["out"].shape[axis] == 0
    assert ys["out"].dtype == torch.float32
    assert ys["nothing"] is None
    assert len(calls) == 1
    assert all(leaf is None or isinstance(leaf, FakeTensor) for leaf in calls[0])


def test_zero_length_without_xs() -> None:
    init = torch.ones(2, dtype=torch.int32)
    carry, ys = torchscan.scan(lambda c, _: (c, (c.double(), None)), init, length=0)
    assert carry is init
    assert ys[0].shape == (0, 2)
    assert ys[0].dtype == torch.float64
    assert ys[1] is None


@pytest.mark.parametrize("xs", [(), [], {}], ids=repr)
@pytest.mark.parametrize("length", [0, 3])
def test_an_empty_container_of_sequences(xs, length: int) -> None:
    """Like ``xs=None``: ``length`` steps, each given an empty container like ``xs``."""
    seen = []

    def step(c, x):
        seen.append(x)
        return c + 1, (c, x)

    carry, (ys, empties) = torchscan.scan(step, torch.zeros(()), xs, length=length)
    assert carry.item() == length
    assert ys.tolist() == list(range(length))
    assert empties == xs
    assert all(x == xs for x in seen[: length or 0])


@pytest.mark.parametrize("item", [False, True], ids=["bool", "item"])
def test_zero_length_with_python_control_flow_on_values_runs_as_the_loop(item: bool) -> None:
    """A Python loop of length 0 never calls the step; scan learns the shapes of ys by calling
    it once, on zeros where it reads values (fake tensors have none), without gradients and with
    the random stream left as it was."""

    def step(h, x):
        noise = torch.randn(())  # draws a number: the caller's stream must not move
        if (x.sum().item() == 0) if item else torch.all(x == 0):
            return h, (h * 2).long()
        return h + x + noise, (h + x).long()

    init = torch.ones(3, requires_grad=True)
    state = torch.get_rng_state()
    carry, ys = torchscan.scan(step, init, torch.zeros(0, 3))
    assert torch.equal(torch.get_rng_state(), state)
    assert carry is init
    assert (ys.shape, ys.dtype) == ((0, 3), torch.int64)
    i_carry, i_ys = torchscan.loop(lambda i, h: step(h, h), init, trip_count=0)
    assert i_carry is init
    assert (i_ys.shape, i_ys.dtype) == ((0, 3), torch.int64)


def test_zero_length_uses_captured_tensors() -> None:
    _, ys = torchscan.scan(elman, randn(B, H), randn(B, 0, H), axis=1)
    assert ys.shape == (B, 0, H)


def test_zero_length_with_indices_read_from_the_step() -> None:
    """A step that indexes with a 0-d tensor of xs, on fake tensors, where eager torch would
    read it: a write, slices of a fixed length, a negative index, a running sum."""
    x = randn(B, 5, H)

    def step(c, i):
        o = torch.zeros(B, 5)
        o[:, i] = 1.0
        return c, (o, x[:, i : i + 2], x.narrow(1, i, 1), x[:, i - 1], x[:, :i].sum(1))

    _, ys = torchscan.scan(step, torch.zeros(B), torch.arange(0))
    assert [y.shape for y in ys] == [(0, B, 5), (0, B, 2, H), (0, B, 1, H), (0, B, H), (0, B, H)]
    _, ys = torchscan.scan(step, torch.zeros(B), torch.arange(3))
    assert [y.shape for y in ys] == [(3, B, 5), (3, B, 2, H), (3, B, 1, H), (3, B, H), (3, B, H)]


# -- autograd ----------------------------------------------------------------------------------


def make_rnn(dtype: torch.dtype = torch.float64):
    cell = torch.nn.RNNCell(H, H, dtype=dtype)

    def step(h, x):
        h = cell(x, h)
        return h, h

    return cell, step


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("axis", [0, 1])
def test_gradients_equal_python_loop(axis: int, reverse: bool) -> None:
    cell, step = make_rnn()
    init = randn(B, H, dtype=torch.float64).requires_grad_()
    xs = move_time_axis(randn(T, B, H, dtype=torch.float64), axis).requires_grad_()
    inputs = [init, xs, *cell.parameters()]

    def grads(implementation):
        carry, ys = implementation(step, init, xs, axis=axis, reverse=reverse)
        loss = (ys * torch.linspace(0, 1, ys.shape[-1], dtype=ys.dtype)).sum() + carry.pow(2).sum()
        return torch.autograd.grad(loss, inputs)

    for actual, expected in zip(grads(torchscan.scan), grads(scan_loop), strict=True):
        torch.testing.assert_close(actual, expected)


def test_double_backward_equals_python_loop() -> None:
    cell, step = make_rnn()
    init = randn(B, H, dtype=torch.float64).requires_grad_()
    xs = randn(T, B, H, dtype=torch.float64).requires_grad_()

    def second_order(implementation):
        carry, ys = implementation(step, init, xs)
        (g,) = torch.autograd.grad(ys.pow(2).sum() + carry.sum(), xs, create_graph=True)
        return torch.autograd.grad(g.pow(2).sum(), [init, xs, cell.weight_hh])

    for actual, expected in zip(second_order(torchscan.scan), second_order(scan_loop), strict=True):
        torch.testing.assert_close(actual, expected)


def test_gradcheck_and_gradgradcheck() -> None:
    weight = randn(3, 3, dtype=torch.float64).requires_grad_()

    def run(init, xs, weight):
        def fn(c, x):
            c = torch.sin(c @ weight + x)
            return c, {"y": c * x, "none": None}

        carry, ys = torchscan.scan(fn, init, xs, reverse=True)
        return carry, ys["y"]

    args = (
        randn(2, 3, dtype=torch.float64).requires_grad_(),
        randn(4, 2, 3, dtype=torch.float64).requires_grad_(),
        weight,
    )
    assert torch.autograd.gradcheck(run, args)
    assert torch.autograd.gradgradcheck(run, args)


def test_gradient_through_carry_returned_as_y() -> None:
    init = torch.ones(3, requires_grad=True)
    xs = torch.arange(6.0).reshape(2, 3).requires_grad_()
    carry, ys = torchscan.scan(lambda h, x: (h * x, h * x), init, xs)
    (ys.sum() + carry.sum()).backward()
    # carry = init * x0 * x1; ys = [init * x0, init * x0 * x1]
    torch.testing.assert_close(init.grad, xs[0].detach() + 2 * xs[0].detach() * xs[1].detach())


def test_no_grad_is_respected() -> None:
    _, step = make_rnn()
    init = randn(B, H, dtype=torch.float64).requires_grad_()
    with torch.no_grad():
        carry, ys = torchscan.scan(step, init, randn(T, B, H, dtype=torch.float64))
    assert not carry.requires_grad
    assert not ys.requires_grad


def test_inference_mode_is_respected() -> None:
    _, step = make_rnn()
    with torch.inference_mode():
        carry, ys = torchscan.scan(
            step, randn(B, H, dtype=torch.float64), randn(T, B, H, dtype=torch.float64)
        )
    assert carry.is_inference()
    assert ys.is_inference()


# -- devices, inputs left alone, torch.compile --------------------------------------------------


def test_runs_on_the_device_of_its_inputs(device: str) -> None:
    init, xs = randn(B, H).to(device), randn(T, B, H).to(device)
    weight = W.to(device)
    carry, ys = torchscan.scan(lambda h, x: (torch.tanh(x @ weight + h), h), init, xs, reverse=True)
    assert carry.device == ys.device == init.device
    expected = scan_loop(lambda h, x: (torch.tanh(x @ weight + h), h), init, xs, reverse=True)
    assert_trees_equal((carry, ys), expected)


def test_runs_on_the_meta_device() -> None:
    carry, ys = torchscan.scan(
        lambda h, x: (h + x, h), torch.ones(3, device="meta"), torch.ones(7, 3, device="meta")
    )
    assert carry.device.type == ys.device.type == "meta"
    assert ys.shape == (7, 3)


def test_inputs_are_not_modified() -> None:
    fn, init, xs, _ = CASES["dict"]
    leaves = pytree.tree_leaves((init, xs))
    before = [(leaf.clone(), leaf._version) for leaf in leaves]
    torchscan.scan(fn, init, xs, reverse=True)
    for leaf, (copy, version) in zip(leaves, before, strict=True):
        assert leaf._version == version
        torch.testing.assert_close(leaf, copy, rtol=0, atol=0)


class ScanRNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = torch.nn.RNNCell(H, H)
        self.readout = torch.nn.Linear(H, 2)

    def forward(self, h, xs):
        def step(h, x):
            h = self.cell(x, h)
            return h, self.readout(h)

        return torchscan.scan(step, h, xs, axis=1)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_gives_the_same_results(backend: str) -> None:
    torch._dynamo.reset()
    model = ScanRNN()
    h, xs = randn(B, H), randn(B, T, H)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    actual = compiled(h, xs)
    expected = model(h, xs)
    torch.testing.assert_close(actual, expected)
    actual[1].sum().backward()
    compiled_grad = model.cell.weight_hh.grad.clone()
    model.zero_grad()
    expected[1].sum().backward()
    torch.testing.assert_close(compiled_grad, model.cell.weight_hh.grad)


# -- until -------------------------------------------------------------------------------------


def stop_when_total_exceeds(limit: float):
    def fn(total, x):
        total = total + x
        return total, {"total": total, "x": x}, torchscan.until(total.sum() > limit)

    return fn


@pytest.mark.parametrize("limit", [-1.0, 3.0, 1e9], ids=["first step", "middle", "never"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("axis", [0, 1])
def test_until_ends_the_scan_after_the_step_that_stops(limit, reverse, axis) -> None:
    xs = move_time_axis(torch.rand(6, 2, dtype=torch.float64), axis)
    init = torch.zeros(2, dtype=torch.float64)
    fn = stop_when_total_exceeds(limit)
    actual = torchscan.scan(fn, init, xs, axis=axis, reverse=reverse)
    assert_trees_equal(actual, scan_loop(fn, init, xs, axis=axis, reverse=reverse))


def test_until_keeps_ys_aligned_with_the_xs_they_consumed() -> None:
    xs = torch.arange(1.0, 7.0)
    fn = lambda c, x: (c + x, x, torchscan.until(c + x > 10))  # noqa: E731
    _, forward = torchscan.scan(fn, torch.tensor(0.0), xs)
    _, backward = torchscan.scan(fn, torch.tensor(0.0), xs, reverse=True)
    assert forward.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert backward.tolist() == [5.0, 6.0]  # 6 then 5 ran, and 6 + 5 > 10


def test_until_with_zero_length_uses_fake_tensors() -> None:
    fn = stop_when_total_exceeds(1.0)
    _, ys = torchscan.scan(fn, torch.zeros(3), torch.empty(0, 3))
    assert ys["total"].shape == (0, 3)
    assert ys["x"].shape == (0, 3)


def test_gradients_through_until_equal_python_loop() -> None:
    weight = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    xs = torch.rand(8, dtype=torch.float64, requires_grad=True)

    def fn(c, x):
        c = c * weight + x
        return c, c * c, torchscan.until(c > 1.5)

    def grads(implementation):
        carry, ys = implementation(fn, torch.tensor(0.0, dtype=torch.float64), xs)
        return torch.autograd.grad(carry + ys.sum(), [weight, xs])

    for actual, expected in zip(grads(torchscan.scan), grads(scan_loop), strict=True):
        torch.testing.assert_close(actual, expected)
