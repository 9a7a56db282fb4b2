"""A call's plan is checked once per kind of arguments (``torchscan._plan.arguments_key``): a later
call whose arguments have the same structures, shapes, dtypes, devices and options reuses it with
its own values; any other call is checked in full, and refused as it would be on its own."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import torchscan
from torchscan import _scan

from ._oracles import scan_loop


def step(h, x):
    return torch.tanh(h + x["a"] * x["b"]), h * 2


def other_step(h, x):
    return h - x["a"], x["b"] + h


def arguments(seed: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    h = torch.randn(3, 4, generator=generator, dtype=torch.float64)
    xs = {
        "a": torch.randn(5, 3, 4, generator=generator, dtype=torch.float64),
        "b": torch.randn(5, 3, 4, generator=generator, dtype=torch.float64),
    }
    return h, xs


@pytest.fixture(autouse=True)
def no_checked_plans():
    _scan._checked.clear()
    yield
    _scan._checked.clear()


@pytest.mark.parametrize("reverse", [False, True])
def test_a_call_like_a_checked_one_reuses_its_plan_with_its_own_values(reverse) -> None:
    h, xs = arguments(0)
    torchscan.scan(step, h, xs, reverse=reverse)
    assert len(_scan._checked) == 1
    for seed, fn in [(1, step), (2, other_step), (3, step), (4, other_step)]:
        h, xs = arguments(seed)
        got = torchscan.scan(fn, h, xs, reverse=reverse)
        want = scan_loop(fn, h, xs, reverse=reverse)
        torch.testing.assert_close(got, want)
    assert len(_scan._checked) == 1  # one kind of arguments, whatever the step


def test_arguments_of_another_shape_dtype_or_structure_make_another_plan() -> None:
    h, xs = arguments(0)
    torchscan.scan(step, h, xs)
    variants = [
        (h, {"a": xs["a"][:2], "b": xs["b"][:2]}),  # another length
        (h.float(), {k: v.float() for k, v in xs.items()}),  # another dtype
        (h.requires_grad_(), xs),  # gradients
        ((h,), xs),  # another structure of the carry
    ]
    for init, seqs in variants:
        carry_step = (lambda c, x: ((step(c[0], x)[0],), c[0])) if isinstance(init, tuple) else step
        got = torchscan.scan(carry_step, init, seqs)
        torch.testing.assert_close(got, scan_loop(carry_step, init, seqs))
    assert len(_scan._checked) == 1 + len(variants)


def good_call() -> dict:
    h, xs = arguments(0)
    return {"fn": step, "init": h, "xs": xs, "axis": 0, "reverse": False, "hoist": None}


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"reverse": 0}, TypeError, "reverse must be True or False, but got an int"),
        ({"axis": False}, TypeError, "axis must be an int, but got a bool"),
        ({"hoist": 1}, TypeError, "hoist must be True, False or None, but it is an int"),
        ({"unroll": 0}, ValueError, "unroll must be at least 1"),
        ({"fn": 3}, TypeError, "fn must be callable, but got an int"),
        ({"init": 0.0}, TypeError, "init must be a tensor or None"),
        ({"length": 4}, ValueError, "length must agree with it"),
        (
            {"xs": {"a": torch.zeros(5, 3, 4), "b": torch.zeros(4, 3, 4)}},
            ValueError,
            "every leaf of xs must have the same length",
        ),
        (
            {"xs": torch.nn.utils.rnn.pack_sequence([torch.zeros(5, 4), torch.zeros(3, 4)])},
            TypeError,
            "xs is a PackedSequence",
        ),
    ],
)
def test_a_call_after_a_checked_one_is_still_refused(change, error, message) -> None:
    """Options equal as values but not as kinds (``0 == False``), a step that is not callable,
    leaves of other kinds: each is checked, not taken for the checked call."""
    call = good_call()
    for _ in range(2):
        torchscan.scan(call.pop("fn"), call.pop("init"), call.pop("xs"), **call)
        call = good_call()
    call.update(change)
    with pytest.raises(error, match=message):
        torchscan.scan(call.pop("fn"), call.pop("init"), call.pop("xs"), **call)


def test_the_checked_plans_hold_no_tensor_of_a_call() -> None:
    """The plans are kept without their values: the arguments of a call are freed with it."""
    h, xs = arguments(0)
    refs = [weakref.ref(h), weakref.ref(xs["a"])]
    for _ in range(4):  # hoisted from the third call
        out = torchscan.scan(step, h, xs)
    del h, xs, out
    gc.collect()
    assert [ref() for ref in refs] == [None, None]


def test_a_plan_checked_outside_vmap_serves_a_call_under_vmap() -> None:
    """Under vmap the tensors have the per-example shapes of the plan checked before."""
    h, xs = arguments(0)
    torchscan.scan(step, h, xs)
    batch_h = torch.randn(2, 3, 4, dtype=torch.float64)
    batch_xs = {k: torch.randn(2, *v.shape, dtype=torch.float64) for k, v in xs.items()}
    got = torch.func.vmap(lambda h, xs: torchscan.scan(step, h, xs))(batch_h, batch_xs)
    want = torch.func.vmap(lambda h, xs: scan_loop(step, h, xs))(batch_h, batch_xs)
    torch.testing.assert_close(got, want)
    assert len(_scan._checked) == 1
