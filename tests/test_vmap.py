"""``torch.func.vmap`` over ``scan`` and ``loop``: equal to vmap over the Python loop for every
combination of batched and unbatched arguments (the batch axis anywhere, per-example tensors
that are not contiguous), every output axis, forward and with gradients; a loop that stops with
``until`` is refused, as vmap refuses the Python loop's ``break``."""

from __future__ import annotations

import itertools

import pytest
import torch

import torchscan

B, T, H = 5, 4, 3
torch.manual_seed(0)
W = torch.randn(H, H)


def step(c, x):
    c = torch.tanh(c @ W + x)
    return c, {"y": c * 2, "none": None}


def python_scan(init, xs):
    c, ys = init, []
    for x in xs:
        c, y = step(c, x)
        ys.append(y["y"])
    return c, torch.stack(ys)


def torchscan_scan(init, xs):
    c, ys = torchscan.scan(step, init, xs)
    assert ys["none"] is None
    return c, ys["y"]


def batched(shape: list[int], dim: int | None) -> torch.Tensor:
    """A tensor of ``shape`` per example, with the batch of B examples on ``dim``."""
    shape = list(shape)
    if dim is not None:
        shape.insert(dim, B)
    return torch.randn(*shape)


# The combinations of JAX's tests of vmap over lax.scan: the carry and the sequences each
# unbatched, batched first, or batched on another axis (their examples then not contiguous).
IN_DIMS = [d for d in itertools.product([None, 0, 1], [None, 0, 1, 2]) if d != (None, None)]


@pytest.mark.parametrize("out_dims", [0, 1, (1, 0)], ids=["out0", "out1", "out-1-0"])
@pytest.mark.parametrize("in_dims", IN_DIMS, ids=str)
def test_vmap_of_scan_is_vmap_of_the_loop(in_dims, out_dims) -> None:
    init, xs = batched([H], in_dims[0]), batched([T, H], in_dims[1])
    before = (init.clone(), xs.clone())
    got = torch.func.vmap(torchscan_scan, in_dims=in_dims, out_dims=out_dims)(init, xs)
    want = torch.func.vmap(python_scan, in_dims=in_dims, out_dims=out_dims)(init, xs)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    assert torch.equal(init, before[0])
    assert torch.equal(xs, before[1])


def loss(scan):
    def of(init, xs):
        c, ys = scan(init, xs)
        return c.sum() + (ys * ys).sum()

    return of


@pytest.mark.parametrize("in_dims", IN_DIMS, ids=str)
def test_vmap_of_the_gradient_of_scan_is_that_of_the_loop(in_dims) -> None:
    init, xs = batched([H], in_dims[0]), batched([T, H], in_dims[1])
    grad = torch.func.grad(loss(torchscan_scan), argnums=(0, 1))
    want = torch.func.grad(loss(python_scan), argnums=(0, 1))
    for g, w in zip(
        torch.func.vmap(grad, in_dims=in_dims)(init, xs),
        torch.func.vmap(want, in_dims=in_dims)(init, xs),
        strict=True,
    ):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("in_dims", IN_DIMS, ids=str)
def test_autograd_through_vmap_of_scan_is_that_of_the_loop(in_dims) -> None:
    """Gradients of the batched outputs with torch.autograd, to the inputs and a weight."""
    weight = W.clone().requires_grad_()

    def weighted(c, x):
        c = torch.tanh(c @ weight + x)
        return c, c * 2

    def scan(init, xs):
        return torchscan.scan(weighted, init, xs)

    def loop(init, xs):
        c, ys = init, []
        for x in xs:
            c, y = weighted(c, x)
            ys.append(y)
        return c, torch.stack(ys)

    values = batched([H], in_dims[0]), batched([T, H], in_dims[1])
    grads = []
    for fn in (scan, loop):
        init, xs = (v.clone().requires_grad_() for v in values)
        c, ys = torch.func.vmap(fn, in_dims=in_dims)(init, xs)
        grads.append(torch.autograd.grad(c.sum() + (ys**2).sum(), (init, xs, weight)))
    for g, w in zip(*grads, strict=True):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("reverse", [False, True])
def test_vmap_of_a_scan_along_another_axis_and_backwards(reverse) -> None:
    init, xs = batched([H], 0), batched([H, T], 1)  # xs is (H, T) per example: axis=1

    def scan(init, xs):
        return torchscan.scan(lambda c, x: (c + x, c * x), init, xs, axis=1, reverse=reverse)

    def loop(init, xs):
        c, ys = init, [None] * T
        for t in reversed(range(T)) if reverse else range(T):
            ys[t] = c * xs[:, t]
            c = c + xs[:, t]
        return c, torch.stack(ys, 1)

    got = torch.func.vmap(scan, in_dims=(0, 1))(init, xs)
    want = torch.func.vmap(loop, in_dims=(0, 1))(init, xs)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("in_dims", [0, 1], ids=["in0", "in1"])
def test_vmap_of_loop_is_vmap_of_the_python_loop(in_dims) -> None:
    def loop(init):
        return torchscan.loop(lambda i, h: (torch.sin(h) + i, {"h": h}), init, trip_count=3)

    def python(init):
        h, ys = init, []
        for i in range(3):
            ys.append(h)
            h = torch.sin(h) + i
        return h, {"h": torch.stack(ys)}

    init = batched([H], in_dims)
    got = torch.func.vmap(loop, in_dims=in_dims, out_dims=1)(init)
    want = torch.func.vmap(python, in_dims=in_dims, out_dims=1)(init)
    torch.testing.assert_close(got, want)
    grad = torch.func.vmap(torch.func.grad(lambda h: loop(h)[0].sum()), in_dims=in_dims)(init)
    expected = torch.func.vmap(torch.func.grad(lambda h: python(h)[0].sum()), in_dims=in_dims)
    torch.testing.assert_close(grad, expected(init))


def body_that_stops(i, h):
    h = h * 2
    return h, None, torchscan.until(h.sum() > 10)


def step_that_stops(h, x):
    h = h * 2 + x
    return h, None, torchscan.until(h.sum() > 10)


REFUSAL = (
    "{api}: {fn} returned until(stop) under torch.func.vmap, where each example would stop at "
    "its own step, and a vmapped function runs every example through the same steps. {remedy}: "
    "done = done | stop; h = torch.where(done, h, new_h)."
)
BOUNDED = (
    "Return no until, and keep a done flag in the carry instead, so that every example runs "
    "every step and an example that is done keeps its carry"
)


@pytest.mark.parametrize(
    ("run", "api", "fn", "remedy"),
    [
        (
            lambda h: torchscan.loop(body_that_stops, h, trip_count=10)[0],
            "torchscan.loop",
            "body",
            BOUNDED,
        ),
        (
            lambda h: torchscan.loop(body_that_stops, h)[0],
            "torchscan.loop",
            "body",
            "Give the loop a bound (trip_count=) and return no until, keeping a done flag in the "
            "carry instead",
        ),
        (
            lambda h: torchscan.scan(step_that_stops, h, torch.ones(5, 3))[0],
            "torchscan.scan",
            "fn",
            BOUNDED,
        ),
    ],
    ids=["loop with trip_count", "loop without", "scan"],
)
def test_vmap_of_a_loop_that_stops_with_until_is_refused(run, api, fn, remedy) -> None:
    """Every example would stop at its own step, which a vmapped function cannot do; vmap refuses
    the Python loop's ``if stop: break`` as well. A loop with a bound is told to drop until, one
    without to take a bound."""
    with pytest.raises(torchscan.TorchscanValueError) as info:
        torch.func.vmap(run)(torch.rand(4, 3))
    assert str(info.value) == REFUSAL.format(api=api, fn=fn, remedy=remedy)


def test_vmap_of_a_scan_of_no_step_whose_step_runs_a_loop() -> None:
    """The shapes of ys of no step come from a call of the step, which fake tensors cannot run
    under vmap where the step has a loop of its own: it runs on zeros."""

    def step(c, x):
        inner, _ = torchscan.scan(lambda a, b: (a + b, None), c, x.unsqueeze(0))
        return inner, inner * 2

    def scan(init, xs):
        return torchscan.scan(step, init, xs)

    carry, ys = torch.func.vmap(scan)(torch.ones(B, H), torch.ones(B, 0, H))
    torch.testing.assert_close(carry, torch.ones(B, H))
    assert ys.shape == (B, 0, H)
