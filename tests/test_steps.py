"""What every step of a scan or loop is held to: no change of its arguments in place, a carry and
``y`` of the same type at every step, and ``until`` in its place (``src/torchscan/_steps.py``)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

import torchscan
from torchscan import theano

from .test_scan_errors import grown

REMEDY = (
    "An exported loop could not do the same. Compute new tensors instead: h = h * 2 rather than "
    "h.mul_(2) or h *= 2, and o = o.clone() before writing into o[i]."
)


def line_of(fn, text: str) -> str:
    """``file:line`` of the first line of ``fn``'s source that holds ``text``."""
    lines, start = inspect.getsourcelines(fn)
    offset = next(i for i, line in enumerate(lines) if text in line)
    return f"{inspect.getsourcefile(fn)}:{start + offset}"


def first_step_refusal(api: str, fn: str, what: str, step: str = "step") -> str:
    """``what``: ``carry with mul_ at FILE:LINE``: the first change of each leaf, and its line."""
    return (
        f"{api}: {fn} must not change its arguments in place, but in its first {step} it "
        f"changed {what} (that {step} ran on copies: the tensors passed to {api} are left as they "
        f"were). {REMEDY}"
    )


def refusal(api: str, fn: str, what: str, where: str, defined) -> str:
    """A refusal after the first step, which names the step function's definition."""
    where = f" in {where}" if where else ""
    qualname = fn.split("(")[1].rstrip(")")
    at = f"{inspect.getsourcefile(defined)}:{defined.__code__.co_firstlineno}"
    return (
        f"{api}: {fn} must not change its arguments in place, but{where} it changed {what} "
        f"({qualname} is defined at {at}). {REMEDY}"
    )


def scales_carry(c, x):
    c.mul_(2).add_(x)
    return c, c


def scales_x(c, x):
    x.mul_(2)
    return c + x, c


def adds_in_place(c, x):
    c += x
    return c, None


def writes_named_leaf(c, x):
    c["o"][0] = x["a"].sum()
    return c, None


def squeezes_its_argument(c, x):
    c.unsqueeze_(0)
    return c.squeeze(0) + x, None


@pytest.mark.parametrize(
    ("fn", "init", "xs", "what"),
    [
        (scales_carry, torch.zeros(4), torch.ones(4, 4), ("carry", "mul_", ".mul_")),
        (scales_x, torch.zeros(4), torch.ones(4, 4), ("x", "mul_", ".mul_")),
        (adds_in_place, torch.zeros(4), torch.ones(4, 4), ("carry", "add_", "+=")),
        (
            writes_named_leaf,
            {"h": torch.zeros(2), "o": torch.zeros(3)},
            {"a": torch.ones(4, 2)},
            ("carry['o']", "__setitem__", '["o"][0] ='),
        ),
        (
            squeezes_its_argument,
            torch.zeros(4),
            torch.ones(4, 4),
            ("the shape of carry", "unsqueeze_", "unsqueeze_"),
        ),
    ],
    ids=["mul_-add_", "x-mul_", "+=", "setitem-named-leaf", "shape-of-the-carry"],
)
@pytest.mark.parametrize("requires_grad", [False, True], ids=["no-grad", "grad"])
def test_scan_refuses_changes_in_place_and_leaves_the_inputs_alone(
    fn, init, xs, what, requires_grad
) -> None:
    init = torch.utils._pytree.tree_map(lambda t: t.requires_grad_(requires_grad), init)
    before = torch.utils._pytree.tree_map(lambda t: t.detach().clone(), (init, xs))
    with pytest.raises(torchscan.TorchscanValueError) as info:
        torchscan.scan(fn, init, xs)
    assert isinstance(info.value, ValueError)
    leaf, op, text = what
    changed = f"{leaf} with {op} at {line_of(fn, text)}"
    assert str(info.value) == first_step_refusal("torchscan.scan", f"fn ({fn.__name__})", changed)
    after = (init, xs)
    for a, b in zip(
        torch.utils._pytree.tree_leaves(after), torch.utils._pytree.tree_leaves(before), strict=True
    ):
        assert torch.equal(a, b)


def test_the_issue_example_no_longer_gives_aliased_outputs() -> None:
    """``c.mul_(2).add_(x); return c, c`` gave ys all equal to the last carry eagerly and
    [1, 3, 7, 15] exported; now it is refused, and its out-of-place form gives the loop's."""
    init, xs = torch.zeros(4), torch.ones(4, 4)
    with pytest.raises(ValueError, match="must not change its arguments in place"):
        torchscan.scan(scales_carry, init, xs)
    _, ys = torchscan.scan(lambda c, x: (c * 2 + x, c * 2 + x), init, xs)
    assert ys[:, 0].tolist() == [1.0, 3.0, 7.0, 15.0]


def test_scan_refuses_a_change_in_place_at_a_later_step_naming_it() -> None:
    def late(c, x):
        if bool(c.sum() > 20):
            c.add_(1)
        return c * 2 + x, None

    with pytest.raises(torchscan.TorchscanValueError) as info:
        torchscan.scan(late, torch.zeros(4), torch.ones(5, 4))
    fn = "fn (test_scan_refuses_a_change_in_place_at_a_later_step_naming_it.<locals>.late)"
    assert str(info.value) == refusal("torchscan.scan", fn, "carry", "step 3", late)


def test_scan_refuses_a_change_of_a_slice_at_a_later_step_naming_the_sequence() -> None:
    """xs is watched once, when the scan ends: every x is a view of it."""

    def late(c, x):
        if bool(c["h"].sum() > 20):
            x["b"].add_(1)
        return {"h": c["h"] * 2 + x["a"]}, None

    xs = {"a": torch.ones(5, 4), "b": torch.ones(5, 4)}
    with pytest.raises(torchscan.TorchscanValueError) as info:
        torchscan.scan(late, {"h": torch.zeros(4)}, xs)
    fn = (
        "fn (test_scan_refuses_a_change_of_a_slice_at_a_later_step_naming_the_sequence.<locals>"
        ".late)"
    )
    assert str(info.value) == refusal(
        "torchscan.scan", fn, "a slice of xs['b']", "a later step", late
    )


def test_a_buffer_cloned_in_the_step_may_be_written_in_place() -> None:
    def fill(o, x):
        o = o.clone()
        o[x.long()] = x
        return o, o.sum()

    xs = torch.arange(4.0)
    o, sums = torchscan.scan(fill, torch.zeros(4), xs)
    assert o.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert sums.tolist() == [0.0, 1.0, 3.0, 6.0]


def heads(q: torch.Tensor) -> torch.Tensor:
    """xLSTM's step: a view of a projection made in the step, squeezed in place."""
    q = q.view(2, 1, 2)
    q.squeeze_(1)
    return q.transpose_(0, 1).reshape(-1)


W = torch.randn(4, 4, requires_grad=True)


def views_squeezed_in_place(c, x):
    """Shape-only changes of views of the step's own tensors and of its carry: the carry does
    not change."""
    of_c = c.unsqueeze(0)
    of_c.squeeze_(0).t_()
    own = heads(x @ W)
    return c * 0.5 + own + of_c, own


@pytest.mark.parametrize("calls", [1, 3])
def test_shape_only_changes_of_views_are_accepted_as_the_python_loop_runs_them(calls) -> None:
    # torch refuses in-place changes of views of a leaf that requires grad, in a Python loop too
    base, xs = torch.randn(4, requires_grad=True), torch.randn(5, 4)
    init = base * 1.0
    before = (init.detach().clone(), xs.clone())
    for _ in range(calls):  # later calls hold every step to what the first call recorded
        carry, ys = torchscan.scan(views_squeezed_in_place, init, xs)
    c, expected = init, []
    for x in xs:
        c, y = views_squeezed_in_place(c, x)
        expected.append(y)
    torch.testing.assert_close(carry, c)
    torch.testing.assert_close(ys, torch.stack(expected))
    grads = torch.autograd.grad(carry.sum() + ys.sum(), (base, W), retain_graph=True)
    loop = torch.autograd.grad(c.sum() + torch.stack(expected).sum(), (base, W))
    for g, want in zip(grads, loop, strict=True):
        torch.testing.assert_close(g, want)
    assert torch.equal(init.detach(), before[0])
    assert torch.equal(xs, before[1])


def test_shape_only_changes_of_views_of_x_are_accepted() -> None:
    """Every x is a view of xs and shares its version counter: a shape-only change of a view of
    one bumps it for all, which autograd refuses where an earlier x is saved for backward (in
    the Python loop too); without gradients it is harmless."""

    def step(c, x):
        of_x = x.view(1, -1)
        of_x.squeeze_(0)
        return c + of_x, of_x * 2

    xs = torch.randn(5, 4)
    before = xs.clone()
    carry, ys = torchscan.scan(step, torch.zeros(4), xs)
    torch.testing.assert_close(carry, xs.sum(0))
    torch.testing.assert_close(ys, xs * 2)
    assert torch.equal(xs, before)


def test_a_later_call_that_writes_where_the_first_one_did_not_is_refused() -> None:
    def sometimes(c, x, write=[False]):  # noqa: B006  (the switch between the two calls)
        if write[0]:
            c.add_(1)
        return c + x, None

    torchscan.scan(sometimes, torch.zeros(2), torch.ones(3, 2))
    sometimes.__defaults__[0][0] = True
    init = torch.zeros(2)
    with pytest.raises(torchscan.TorchscanValueError, match="in its first step it changed carry "):
        torchscan.scan(sometimes, init, torch.ones(3, 2))
    assert torch.equal(init, torch.zeros(2))


def test_a_step_whose_x_skips_elements_computes_as_on_a_view() -> None:
    """The first step runs on a copy of x with the strides of the view, so that a reduction
    adds in the same order as over the view the Python loop passes."""
    torch.manual_seed(1)  # a draw for which a dense copy of xs[:, 0] adds up differently
    xs = torch.randn(2, 7, 3, 3, dtype=torch.float64)

    def step(c, x):
        return c + x.sum(), x.sum().reshape(1)

    _, ys = torchscan.scan(step, torch.tensor(0.0, dtype=torch.float64), xs, axis=1)
    expected = torch.stack([xs[:, t].sum().reshape(1) for t in range(7)], 1)
    assert torch.equal(ys, expected)
    assert not torch.equal(xs[:, 0].sum(), xs[:, 0].clone().sum())  # what a dense copy gives


def test_loop_refuses_changes_in_place_of_the_carry_and_of_i() -> None:
    h = torch.zeros(3)

    def scales(i, h):
        h.mul_(2)
        return h, None

    with pytest.raises(torchscan.TorchscanValueError) as info:
        torchscan.loop(scales, h, trip_count=3)
    qualname = "test_loop_refuses_changes_in_place_of_the_carry_and_of_i.<locals>"
    assert str(info.value) == first_step_refusal(
        "torchscan.loop",
        f"body ({qualname}.scales)",
        f"carry with mul_ at {line_of(scales, 'h.mul_')}",
        "iteration",
    )

    def counts(i, h):
        i += 1
        return h + i, None

    with pytest.raises(torchscan.TorchscanValueError) as info:
        torchscan.loop(counts, h, trip_count=3)
    assert str(info.value) == first_step_refusal(
        "torchscan.loop",
        f"body ({qualname}.counts)",
        f"i with add_ at {line_of(counts, 'i += 1')}",
        "iteration",
    )
    assert torch.equal(h, torch.zeros(3))


def test_loop_refuses_a_write_into_a_carried_buffer_at_a_later_iteration() -> None:
    def body(i, carry):
        h, o = carry
        if int(i) == 2:
            o[i] = h
        return (h + 1, o), None

    with pytest.raises(torchscan.TorchscanValueError) as info:
        torchscan.loop(body, (torch.zeros(2), torch.zeros(4, 2)), trip_count=4)
    fn = "body (test_loop_refuses_a_write_into_a_carried_buffer_at_a_later_iteration.<locals>.body)"
    assert str(info.value) == refusal("torchscan.loop", fn, "carry[1]", "iteration 2", body)


def theano_state(x, h):
    return h.mul_(2).add_(x)


def theano_sequence(x, h):
    return h + x.add_(1)


def theano_tap(xm1, x, h):
    return h + x + xm1.mul_(2)


@pytest.mark.parametrize(
    ("fn", "sequences", "outputs_info", "what"),
    [
        (
            theano_state,
            [torch.ones(4, 3)],
            [torch.zeros(3)],
            ("outputs_info[0] at tap -1", "mul_"),
        ),
        (theano_sequence, [torch.ones(4, 3)], [torch.zeros(3)], ("sequences[0] at tap 0", "add_")),
        (
            theano_tap,
            [{"input": torch.ones(5, 3), "taps": [-1, 0]}],
            [torch.zeros(3)],
            ("sequences[0] at tap -1", "mul_"),
        ),
    ],
    ids=["state", "sequence", "sequence-tap"],
)
def test_theano_scan_refuses_changes_in_place_naming_the_argument(
    fn, sequences, outputs_info, what
) -> None:
    before = [s.clone() if isinstance(s, torch.Tensor) else s["input"].clone() for s in sequences]
    with pytest.raises(torchscan.TorchscanValueError) as info:
        theano.scan(fn, sequences=sequences, outputs_info=outputs_info)
    leaf, op = what
    assert str(info.value) == (
        f"torchscan.theano.scan: fn ({fn.__name__}) must not change its arguments in place, but "
        f"it changed {leaf} with {op} at {line_of(fn, op)}. {REMEDY}"
    )
    for seq, old in zip(sequences, before, strict=True):
        assert torch.equal(seq if isinstance(seq, torch.Tensor) else seq["input"], old)
    assert torch.equal(outputs_info[0], torch.zeros(3))


def test_theano_scan_accepts_shape_only_changes_of_views() -> None:
    def step(x, h):
        of_x = x.view(1, -1)
        of_x.squeeze_(0)
        return h + of_x

    xs = torch.arange(6.0).reshape(3, 2)
    ys, _ = theano.scan(step, sequences=[xs], outputs_info=[torch.zeros(2)])
    assert ys.tolist() == [[0.0, 1.0], [2.0, 4.0], [6.0, 9.0]]


# -- the type of the carry and of y, at every step ---------------------------------------------


def test_a_carry_that_changes_dtype_at_a_later_step_is_named_with_the_step() -> None:
    def widens(c, x):
        c = c * 2 + x
        return (c.double() if bool(c.sum() > 20) else c), None

    with pytest.raises(torchscan.TorchscanTypeError) as info:
        torchscan.scan(widens, torch.zeros(4), torch.ones(5, 4))
    assert str(info.value) == (
        "torchscan.scan: the carry must keep its type, but fn changed it in step 2:\n"
        "  * carry has dtype torch.float32 but fn returned dtype torch.float64\n"
        "Return a carry with the shape, dtype and device of init (cast or reshape it, or change "
        "init)."
    )


def test_a_loop_carry_that_changes_shape_at_a_later_iteration_is_named() -> None:
    def grows(i, carry):
        return {"h": carry["h"].repeat(2) if int(i) == 3 else carry["h"] + 1}, None

    with pytest.raises(torchscan.TorchscanTypeError) as info:
        torchscan.loop(grows, {"h": torch.zeros(2)}, trip_count=6)
    assert str(info.value) == (
        "torchscan.loop: the carry must keep its type, but body changed it in iteration 3:\n"
        "  * carry['h'] has shape (2,) but body returned shape (4,)\n"
        + "\n".join(grown("carry['h']", 0, "body", "def body(i, carry):", "i"))
    )


@pytest.mark.parametrize(
    ("first", "later"), [(torch.float32, torch.int64), (torch.int64, torch.float32)]
)
def test_a_y_whose_dtype_changes_at_a_later_step_is_refused(first, later) -> None:
    def step(c, x):
        return c + 1, {"y": (x if int(c) < 2 else x.to(later)).to(first if int(c) < 2 else later)}

    with pytest.raises(torchscan.TorchscanTypeError) as info:
        torchscan.scan(step, torch.tensor(0), torch.ones(4, 2, dtype=first))
    f, lt = str(first).removeprefix("torch."), str(later).removeprefix("torch.")
    assert str(info.value) == (
        "torchscan.scan: fn must return y of the same type at every step, but y['y'] is "
        f"{f}[2] on cpu for xs index 0 and {lt}[2] on cpu for xs index 2."
    )


# -- flags and until ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: torchscan.scan(
                lambda c, x: (c, x), torch.zeros(1), torch.ones(2, 1), reverse="yes"
            ),
            "torchscan.scan: reverse must be True or False, but got a str.",
        ),
        (
            lambda: torchscan.scan(
                lambda c, x: (c, x), torch.zeros(1), torch.ones(2, 1), reverse=1
            ),
            "torchscan.scan: reverse must be True or False, but got an int.",
        ),
        (
            lambda: theano.scan(lambda x: x, sequences=[torch.ones(2)], go_backwards="yes"),
            "torchscan.theano.scan: go_backwards must be True or False, but got a str.",
        ),
        (
            lambda: theano.map(lambda x: x, sequences=[torch.ones(2)], go_backwards=0),
            "torchscan.theano.scan: go_backwards must be True or False, but got an int.",
        ),
        (
            lambda: theano.scan(lambda x: x, sequences=[torch.ones(2)], strict="no"),
            "torchscan.theano.scan: strict must be True or False, but got a str.",
        ),
        (
            lambda: theano.scan(lambda x: x, sequences=[torch.ones(2)], profile=None),
            "torchscan.theano.scan: profile must be True or False, but got None.",
        ),
        (
            lambda: theano.scan(lambda x: x, sequences=[torch.ones(2)], allow_gc="x"),
            "torchscan.theano.scan: allow_gc must be True or False, but got a str.",
        ),
    ],
    ids=[
        "reverse-str",
        "reverse-int",
        "go_backwards",
        "map-go_backwards",
        "strict",
        "profile",
        "allow_gc",
    ],
)
def test_flags_refuse_what_is_not_a_bool(call, message) -> None:
    with pytest.raises(torchscan.TorchscanTypeError) as info:
        call()
    assert str(info.value) == message


def test_export_options_refuse_what_is_not_a_bool() -> None:
    import torchscan.onnx

    with pytest.raises(torchscan.TorchscanTypeError) as info:  # noqa: SIM117
        with torchscan.onnx.export_options(hoist_loop_invariants="no"):
            pass
    assert str(info.value) == (
        "torchscan.onnx.export_options: hoist_loop_invariants must be True or False, but got a str."
    )


def test_numpy_bools_are_bools() -> None:
    _, ys = torchscan.scan(
        lambda c, x: (c, x), torch.zeros(()), torch.arange(3.0), reverse=np.True_
    )
    assert ys.tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize(
    ("returned", "position", "length"),
    [
        (lambda c, s: (c, torchscan.until(s), c), 1, 3),
        (lambda c, s: (torchscan.until(s), c, c), 0, 3),
        (lambda c, s: (c, c, c, torchscan.until(s)), 3, 4),
    ],
    ids=["middle", "first", "after-two-ys"],
)
def test_until_in_the_wrong_place_says_it_must_be_last(returned, position, length) -> None:
    def body(i, c):
        return returned(c + 1, i >= 2)

    with pytest.raises(torchscan.TorchscanTypeError) as info:
        torchscan.loop(body, torch.tensor(0), trip_count=5)
    assert str(info.value) == (
        "torchscan.loop: until(...) must be the last item of what body returns, (carry, y, "
        f"torchscan.until(stop)), but it is item {position} of a tuple of length {length}."
    )


def test_until_inside_y_says_it_must_be_last() -> None:
    def step(c, x):
        return c + x, (c, torchscan.until(c > 2))

    with pytest.raises(torchscan.TorchscanTypeError) as info:
        torchscan.scan(step, torch.tensor(0.0), torch.ones(4))
    assert str(info.value) == (
        "torchscan.scan: every leaf of y must be a tensor or None, but:\n"
        "  * y[1] is until(...), which must be the last item of what the function returns\n"
        "Return (carry, y, torchscan.until(stop))."
    )
