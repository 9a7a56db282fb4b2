"""Eager ``torchscan.loop`` against the ONNX Loop semantics, run as a Python loop."""

from __future__ import annotations

import hypothesis
import hypothesis.strategies as st
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

import torchscan

from ._oracles import loop_loop
from .test_scan import assert_trees_equal, randn

H = 3
W = randn(H, H, dtype=torch.float64)


def decay(i, h):
    """A for-loop body: no stop flag."""
    h = torch.tanh(h @ W + i)
    return h, {"h": h, "i": i, "none": None}


def stop_at(threshold: float):
    """A body with a data-dependent stop: ends once the running sum passes ``threshold``."""

    def body(i, carry):
        total = carry["total"] + carry["step"] * (i + 1)
        return (
            {"total": total, "step": carry["step"]},
            total,
            torchscan.until(total.sum() > threshold),
        )

    return body


INIT = {
    "total": torch.zeros(2, dtype=torch.float64),
    "step": torch.tensor([0.5, 1.0], dtype=torch.float64),
}


# The five operating modes of ONNX Loop, as (body, trip_count, cond).
MODES = {
    "while (cond)": (stop_at(10.0), None, torch.tensor(True)),
    "do-while": (stop_at(10.0), None, None),
    "for": (decay, 6, None),
    "for with cond": (decay, torch.tensor(6), True),
    "for with until": (stop_at(10.0), 20, None),
    "for with until reaching the cap": (stop_at(1e9), 5, None),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_modes_equal_onnx_semantics(mode: str) -> None:
    body, trip_count, cond = MODES[mode]
    init = INIT if body is not decay else randn(2, H, dtype=torch.float64)
    actual = torchscan.loop(body, init, trip_count=trip_count, cond=cond)
    expected = loop_loop(body, init, trip_count=trip_count, cond=cond)
    assert_trees_equal(actual, expected)


def test_until_keeps_the_last_iteration() -> None:
    def body(i, c):
        return c + 1, i, torchscan.until(i == 3)

    carry, ys = torchscan.loop(body, torch.tensor(0))
    assert carry.item() == 4
    assert ys.tolist() == [0, 1, 2, 3]


def test_iteration_number_is_a_0d_int64_tensor_on_the_carry_device() -> None:
    seen = []

    def body(i, c):
        seen.append(i)
        return c, None

    torchscan.loop(body, torch.ones(2, device="meta"), trip_count=2)
    assert [(i.shape, i.dtype, i.device.type) for i in seen] == [((), torch.int64, "meta")] * 2


def test_indexing_with_the_iteration_number() -> None:
    xs = randn(5, 2)
    carry, ys = torchscan.loop(lambda i, c: (c + xs[i], xs[i] * 2), torch.zeros(2), trip_count=5)
    torch.testing.assert_close(carry, xs.sum(0))
    torch.testing.assert_close(ys, xs * 2)


@hypothesis.given(
    trip_count=st.none() | st.integers(0, 6) | st.integers(-3, 6).map(torch.tensor),
    cond=st.none() | st.booleans() | st.booleans().map(torch.tensor),
    threshold=st.floats(-1.0, 30.0),
    with_until=st.booleans(),
)
def test_random_modes_equal_onnx_semantics(trip_count, cond, threshold, with_until) -> None:
    hypothesis.assume(with_until or trip_count is not None)
    if with_until:
        body, init = stop_at(threshold), INIT
    else:
        body, init = decay, randn(2, H, dtype=torch.float64)
    runs = cond is None or bool(cond)
    runs = runs and (trip_count is None or int(trip_count) > 0)
    carry, ys = torchscan.loop(body, init, trip_count=trip_count, cond=cond)
    if runs:
        assert_trees_equal((carry, ys), loop_loop(body, init, trip_count=trip_count, cond=cond))
    else:
        assert carry is init
        leaf = ys if with_until else ys["h"]
        assert leaf.shape[0] == 0


# -- no iteration ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("trip_count", "cond"),
    [(0, None), (torch.tensor(-2), None), (3, False), (None, torch.tensor(False))],
)
def test_no_iteration_gives_empty_ys_from_fake_tensors(trip_count, cond) -> None:
    calls = []

    def body(i, carry):
        calls.append((i, carry))
        return (
            carry * 2,
            {"twice": torch.stack([carry, carry]), "none": None},
            torchscan.until(i > 2),
        )

    init = torch.ones(3, dtype=torch.float16)
    carry, ys = torchscan.loop(body, init, trip_count=trip_count, cond=cond)
    assert carry is init
    assert ys["twice"].shape == (0, 2, 3)
    assert ys["twice"].dtype == torch.float16
    assert ys["none"] is None
    assert len(calls) == 1
    assert all(isinstance(t, FakeTensor) for t in calls[0])


def inner_until(i, c):
    inner, _ = torchscan.loop(
        lambda j, a: (a + 1, a, torchscan.until(a.sum() > 5)), c, trip_count=9
    )
    return inner, c


def inner_count(i, c):
    inner, _ = torchscan.loop(lambda j, a: (a + 1, a), c, trip_count=i + 1)
    return inner, c


def inner_scan_until(i, c):
    inner, _ = torchscan.scan(
        lambda a, x: (a + x, a, torchscan.until(a.sum() > 5)), c, torch.ones(4, 3)
    )
    return inner, c


@pytest.mark.parametrize("body", [inner_until, inner_count, inner_scan_until])
@pytest.mark.parametrize(("trip_count", "cond"), [(0, None), (3, False)])
def test_no_iteration_of_a_body_with_loops_whose_length_needs_data(body, trip_count, cond) -> None:
    """On fake tensors an inner loop cannot know when it stops: it describes its outputs as it
    does when exported, instead of reading values fake tensors do not have."""
    init = torch.zeros(3)
    carry, ys = torchscan.loop(body, init, trip_count=trip_count, cond=cond)
    assert carry is init
    assert ys.shape == (0, 3)
    assert torch.equal(
        torchscan.loop(body, init, trip_count=2)[1], loop_loop(body, init, trip_count=2)[1]
    )


def test_no_iteration_of_a_body_indexing_with_the_iteration_number() -> None:
    """``em[batch, i, tags[:, i]]`` (a 0-d index among tensor indices) on fake tensors, where
    eager torch would read ``i``."""
    em, tags, batch = randn(2, 4, 3), torch.randint(0, 3, (2, 4)), torch.arange(2)

    def body(i, s):
        return s + em[batch, i, tags[:, i]], (em[batch, i, tags[:, i]] * s, em[:, i : i + 2])

    carry, ys = torchscan.loop(body, torch.ones(2), trip_count=0)
    assert torch.equal(carry, torch.ones(2))
    assert [(y.shape, y.dtype) for y in ys] == [
        ((0, 2), torch.float32),
        ((0, 2, 2, 3), torch.float32),
    ]
    _, ys = torchscan.loop(body, torch.ones(2), trip_count=2)
    assert [y.shape for y in ys] == [(2, 2), (2, 2, 2, 3)]


def test_a_large_cap_costs_only_the_iterations_that_run() -> None:
    """The iteration numbers are made as they are needed: a cap of 10**12 with an early stop
    must not allocate 10**12 of them."""
    carry, ys = torchscan.loop(
        lambda i, c: (c + 1, i, torchscan.until(c >= 4)), torch.zeros(()), trip_count=10**12
    )
    assert carry.item() == 5
    assert ys.tolist() == [0, 1, 2, 3, 4]


# -- autograd ----------------------------------------------------------------------------------


@pytest.mark.parametrize("last", [0, 2, 3], ids=["stops after 1", "stops after 3", "runs all 4"])
def test_gradients_equal_python_loop(last: int) -> None:
    cell = torch.nn.GRUCell(H, H, dtype=torch.float64)
    xs = randn(4, 2, H, dtype=torch.float64).requires_grad_()
    init = randn(2, H, dtype=torch.float64).requires_grad_()

    def body(i, h):
        h = cell(xs[i], h)
        return h, h.sum(-1), torchscan.until((i >= last) & (h.sum() > -1e9))

    def grads(implementation):
        carry, ys = implementation(body, init, trip_count=4)
        return torch.autograd.grad(carry.pow(2).sum() + ys.sum(), [init, xs, *cell.parameters()])

    actual, expected = grads(torchscan.loop), grads(loop_loop)
    for got, want in zip(actual, expected, strict=True):
        torch.testing.assert_close(got, want)
    # the steps after the stop read nothing: their slices of xs get no gradient
    assert actual[1][last + 1 :].abs().sum() == 0
    assert actual[1][: last + 1].abs().sum() > 0


def test_gradcheck() -> None:
    def run(init, weight):
        body = lambda i, c: (torch.sin(c @ weight) + i, c * c)  # noqa: E731
        return torchscan.loop(body, init, trip_count=3)

    args = (
        randn(2, 2, dtype=torch.float64).requires_grad_(),
        randn(2, 2, dtype=torch.float64).requires_grad_(),
    )
    assert torch.autograd.gradcheck(run, args)
    assert torch.autograd.gradgradcheck(run, args)


def test_inputs_are_not_modified() -> None:
    init = {"total": INIT["total"].clone(), "step": INIT["step"].clone()}
    versions = [t._version for t in init.values()]
    torchscan.loop(stop_at(5.0), init, trip_count=10)
    assert [t._version for t in init.values()] == versions
    assert_trees_equal(init, INIT)
