"""One contract, every strategy: each way a scan can run (the checked Python loop, hoisted at the
first or the third call of a signature, under ``torch.compile``, under ``torch.export``) accepts
the in-place idioms the guide accepts (docs/scan.md, "In-place changes") and gives the Python
loop's results and gradients, at lengths 0, 1, 6 (hoisted, unbatched) and 40 (batched)."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import torchscan
from torchscan import _hoist

from ._oracles import scan_loop

B, F = 3, 4
torch.manual_seed(0)
W = (torch.randn(F, F) * 0.3).requires_grad_()


# -- the idioms --------------------------------------------------------------------------------


def clone_then_write(c, x):
    """A carried buffer cloned, then written into."""
    o = c.clone()
    o[:, 0] = x[:, 1]
    return torch.tanh(o + x @ W), o.sum(-1)


def view_of_own_reshaped(c, x):
    """xLSTM: the heads of a projection made in the step, a view squeezed in place."""
    q = (x @ W).view(B, 2, 1, F // 2)
    q = q.squeeze_(2).unsqueeze(-1)
    return torch.tanh(c + q.reshape(B, F)), q.sum((-1, -2))


def view_of_carry_reshaped(c, x):
    """A view of the carry squeezed in place (the carry keeps its shape)."""
    of_c = c.unsqueeze(0)
    of_c.squeeze_(0)
    return of_c * 0.5 + x @ W, of_c * 2


def view_of_x_reshaped(c, x):
    """xLSTM's ``q.squeeze_(2).unsqueeze(-1)`` on a view of the step's own slice of xs."""
    q = x.unsqueeze(2)
    q = q.squeeze_(2).unsqueeze(-1)
    return torch.tanh(c + (q * 2).squeeze(-1) @ W), (q * 3).squeeze(-1)


def own_values_written(c, x):
    """Values the step makes, changed in place."""
    h = x @ W
    h.add_(1.0).mul_(0.5)
    h += c
    return torch.tanh(h), h


IDIOMS = [
    clone_then_write,
    view_of_own_reshaped,
    view_of_carry_reshaped,
    view_of_x_reshaped,
    own_values_written,
]
LENGTHS = [0, 1, 6, 40]


# -- the strategies ----------------------------------------------------------------------------


def checked_loop(fn, init, xs):
    return torchscan.scan(fn, init, xs, hoist=False)


def first_call(fn, init, xs):
    _hoist.clear()
    return torchscan.scan(fn, init, xs)


def third_call(fn, init, xs):
    _hoist.clear()
    for _ in range(_hoist.TRACE_AT_CALL - 1):
        torchscan.scan(fn, init, xs)
    return torchscan.scan(fn, init, xs)


def hoisted_now(fn, init, xs):
    _hoist.clear()
    return torchscan.scan(fn, init, xs, hoist=True)  # or warns, and runs the Python loop


@functools.cache
def _compiled(fn):
    """One compiled function per idiom, called at every length (recompiled where needed), as a
    model's compiled forward is."""
    return torch.compile(lambda i, x: torchscan.scan(fn, i, x), backend="aot_eager")


def compiled(fn, init, xs):
    return _compiled(fn)(init, xs)


def exported(fn, init, xs):
    class Model(torch.nn.Module):
        def forward(self, i, x):
            return torchscan.scan(fn, i, x)

    with warnings.catch_warnings():
        # the steps capture W, a tensor that requires grad, which the program holds as a constant
        warnings.filterwarnings("ignore", "A model attribute `lifted_tensor_0` requires gradient")
        program = torch.export.export(Model(), (init.detach(), xs.detach()))
        return program.module()(init, xs)


STRATEGIES: dict[str, Callable] = {
    "hoist=False": checked_loop,
    "first call": first_call,
    "third call": third_call,
    "hoist=True": hoisted_now,
    "torch.compile": compiled,
    "torch.export": exported,
}


@pytest.fixture(autouse=True)
def _fresh_cache():
    _hoist.clear()
    yield
    _hoist.clear()


def python_loop(fn, init, xs):
    """The Python loop; of no step: ``init``, and ``ys`` of length 0 shaped by a step run on
    zeros."""
    if len(xs):
        return scan_loop(fn, init, xs)
    _, y = fn(torch.zeros_like(init), torch.zeros(xs.shape[1:]))
    return init, y.detach().new_zeros((0, *y.shape))


@pytest.mark.filterwarnings("ignore::torchscan.HoistWarning")
# TorchDynamo reads .grad of the non-leaf inputs, hiding torch's warning from being shown but
# not from an error filter
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("fn", IDIOMS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_every_strategy_runs_the_idioms_as_the_python_loop(strategy, fn, n) -> None:
    xs0, init0 = torch.randn(n, B, F), torch.randn(B, F)
    # xs and init are not leaves, as the outputs of a layer before the scan are
    base_xs, base_init = xs0.clone().requires_grad_(), init0.clone().requires_grad_()
    want_c, want_ys = python_loop(fn, base_init * 1, base_xs * 1)
    xs, init = xs0.clone().requires_grad_(), init0.clone().requires_grad_()
    given_xs, given_init = xs * 1, init * 1
    before = (given_xs.detach().clone(), given_init.detach().clone())
    carry, ys = STRATEGIES[strategy](fn, given_init, given_xs)
    torch.testing.assert_close(carry, want_c)
    torch.testing.assert_close(ys, want_ys)
    assert torch.equal(given_xs, before[0])
    assert torch.equal(given_init, before[1])
    if n == 0:
        return
    # the exported program holds W as a constant
    captured = () if strategy == "torch.export" else (W,)
    got = torch.autograd.grad(carry.sum() + ys.sum(), (xs, init, *captured))
    want = torch.autograd.grad(want_c.sum() + want_ys.sum(), (base_xs, base_init, *captured))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


def test_the_idiom_of_a_view_of_x_reshaped_runs_as_python_does_under_inductor() -> None:
    xs0, init0 = torch.randn(40, B, F), torch.randn(B, F)
    want_c, want_ys = scan_loop(view_of_x_reshaped, init0, xs0)
    torch._dynamo.reset()
    run = torch.compile(lambda i, x: torchscan.scan(view_of_x_reshaped, i, x), fullgraph=True)
    with torch.no_grad():
        carry, ys = run(init0, xs0)
    torch.testing.assert_close(carry, want_c)
    torch.testing.assert_close(ys, want_ys)


# -- torch.utils.checkpoint: a recomputation takes the path of its forward ---------------------


U = (torch.randn(F, F) * 0.3).requires_grad_()


def elman(h, x):
    h = torch.tanh(x @ W + h @ U)
    return h, h


def elman_dropout(h, x):
    h = torch.tanh(torch.nn.functional.dropout(x @ W, 0.3) + h @ U)
    return h, h


def chunked(scan, h, xs, reentrant, size=4):
    outs = []
    for c in range(0, len(xs), size):
        h, ys = checkpoint(scan, h, xs[c : c + size], use_reentrant=reentrant)
        outs.append(ys)
    return h, torch.cat(outs)


# a step that calls torch.utils.checkpoint is not hoisted: hoist=True warns
@pytest.mark.filterwarnings("ignore::torchscan.HoistWarning")
@pytest.mark.parametrize("hoist", [None, True, False])
@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("how", ["whole", "chunked", "nested"])
@pytest.mark.parametrize("step", [elman, elman_dropout], ids=lambda f: f.__name__)
def test_checkpointed_scans_have_the_gradients_of_the_scan(step, how, reentrant, hoist) -> None:
    xs0, h0 = torch.randn(20, B, F), torch.randn(B, F)

    def gradients(run):
        xs, h = xs0.clone().requires_grad_(), h0.clone().requires_grad_()
        torch.manual_seed(1)  # the same dropout masks; checkpoint draws them again as they were
        carry, ys = run(h * 1, xs * 1)
        # reentrant checkpoints need backward(), not autograd.grad
        for t in (xs, h, W, U):
            t.grad = None
        (carry.sum() + ys.sum()).backward()
        return [t.grad.clone() for t in (xs, h, W, U)]

    want = gradients(lambda h, xs: torchscan.scan(step, h, xs, hoist=False))

    def scan(h, xs):
        return torchscan.scan(step, h, xs, hoist=hoist)

    def inner(c, x):
        return checkpoint(step, c, x, use_reentrant=reentrant)

    runs = {
        "whole": lambda h, xs: checkpoint(scan, h, xs, use_reentrant=reentrant),
        "chunked": lambda h, xs: chunked(scan, h, xs, reentrant),
        "nested": lambda h, xs: torchscan.scan(inner, h, xs, hoist=hoist),
    }
    _hoist.clear()
    for _ in range(_hoist.TRACE_AT_CALL + 1):  # across the call at which a signature is traced
        for got, expected in zip(gradients(runs[how]), want, strict=True):
            torch.testing.assert_close(got, expected)
