"""``in_axes``, ``out_axes``, ``in_reverse`` and ``out_reverse`` of ``torchscan.scan``: an axis and
a direction for each sequence and each output, against the Python loop of their definition and
against ``torch.nn.LSTM(bidirectional=True)``."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import hypothesis
import hypothesis.strategies as st
import pytest
import torch
import torch.utils._pytree as pytree

import torchscan

from .test_scan_errors import errors

DTYPE = torch.float64
F, H = 3, 4
_gen = torch.Generator().manual_seed(0)


def randn(*shape: int, generator: torch.Generator | None = None) -> torch.Tensor:
    return torch.randn(shape, generator=generator or _gen, dtype=DTYPE)


# -- the oracle ---------------------------------------------------------------------------------


def laid_out_loop(
    fn: Callable,
    init: Any,
    xs: Any,
    in_axes: list[int],
    in_reverse: list[bool],
    out_axes: list[int],
    out_reverse: list[bool],
) -> tuple[Any, Any]:
    """The definition, with one value per leaf (of ``xs``, and of ``y``)::

    for t in range(n):
        x = {leaf i: take(xs_i, n-1-t if in_reverse_i else t, in_axes_i)}
        carry, y = fn(carry, x)
        ys_j[n-1-t if out_reverse_j else t] = y_j      # stacked along out_axes_j

    ``n == 0`` returns ``None`` for ``ys`` (the caller knows their shapes)."""
    leaves, spec = pytree.tree_flatten(xs)
    n = leaves[0].shape[in_axes[0]]
    carry, outputs = init, []
    for t in range(n):
        x = [
            leaf.select(a, n - 1 - t if r else t)
            for leaf, a, r in zip(leaves, in_axes, in_reverse, strict=True)
        ]
        carry, y = fn(carry, pytree.tree_unflatten(x, spec))
        outputs.append(y)
    if n == 0:
        return carry, None
    y_spec = pytree.tree_structure(outputs[0])
    columns = zip(*(pytree.tree_leaves(y) for y in outputs), strict=True)
    stacked = []
    for column, a, r in zip(columns, out_axes, out_reverse, strict=True):
        placed = [None] * n
        for t, value in enumerate(column):
            placed[n - 1 - t if r else t] = value
        stacked.append(torch.stack(placed, a))
    return carry, pytree.tree_unflatten(stacked, y_spec)


def assert_trees_close(actual: Any, expected: Any) -> None:
    actual_leaves, actual_spec = pytree.tree_flatten(actual)
    expected_leaves, expected_spec = pytree.tree_flatten(expected)
    assert actual_spec == expected_spec
    for a, e in zip(actual_leaves, expected_leaves, strict=True):
        assert a.shape == e.shape
        assert a.dtype == e.dtype
        torch.testing.assert_close(a, e)


# -- random layouts -----------------------------------------------------------------------------


@st.composite
def layouts(draw) -> dict[str, Any]:
    """Sequences ``{"a": A, "b": (B1[, B2])}`` of random ranks and outputs ``(P, {"q": Q})``,
    with per-leaf axes and directions given as one value, a prefix or a full tree (or through
    ``axis`` and ``reverse``), and what they resolve to for every leaf."""
    n = draw(st.integers(0, 4))
    ranks = draw(st.lists(st.integers(1, 3), min_size=2, max_size=3))
    k = len(ranks)

    def axis_for(rs: list[int], out: bool = False) -> int:
        r = min(rs) + out
        return draw(st.integers(-r, r - 1))

    kwargs: dict[str, Any] = {}
    mode = draw(st.sampled_from(["axis", "one", "prefix", "full"]))
    if mode in ("axis", "one"):
        axes = [axis_for(ranks)] * k
        kwargs["axis" if mode == "axis" else "in_axes"] = axes[0]
    elif mode == "prefix":
        axes = [axis_for(ranks[:1])] + [axis_for(ranks[1:])] * (k - 1)
        kwargs["in_axes"] = {"a": axes[0], "b": axes[1]}
    else:
        axes = [axis_for([r]) for r in ranks]
        kwargs["in_axes"] = {"a": axes[0], "b": tuple(axes[1:])}

    mode = draw(st.sampled_from(["default", "one", "prefix", "full"]))
    if mode == "default":
        in_reverse = [False] * k
    elif mode == "one":
        in_reverse = [draw(st.booleans())] * k
        kwargs["in_reverse"] = in_reverse[0]
    elif mode == "prefix":
        a, b = draw(st.booleans()), draw(st.booleans())
        in_reverse = [a] + [b] * (k - 1)
        kwargs["in_reverse"] = {"a": a, "b": b}
    else:
        in_reverse = draw(st.lists(st.booleans(), min_size=k, max_size=k))
        kwargs["in_reverse"] = {"a": in_reverse[0], "b": tuple(in_reverse[1:])}

    y_ranks = draw(st.lists(st.integers(0, 2), min_size=2, max_size=2))
    mode = draw(st.sampled_from(["default", "one", "prefix", "full"]))
    if mode == "default":
        out_axes = [kwargs.get("axis", 0)] * 2
        if not all(-r - 1 <= out_axes[0] <= r for r in y_ranks):
            out_axes = [axis_for(y_ranks, out=True)] * 2
            kwargs["out_axes"] = out_axes[0]
    elif mode == "one":
        out_axes = [axis_for(y_ranks, out=True)] * 2
        kwargs["out_axes"] = out_axes[0]
    else:
        out_axes = [axis_for([r], out=True) for r in y_ranks]
        kwargs["out_axes"] = (
            tuple(out_axes) if mode == "prefix" else (out_axes[0], {"q": out_axes[1]})
        )

    mode = draw(st.sampled_from(["default", "one", "prefix", "full"]))
    if mode == "default":
        out_reverse = [False] * 2
    elif mode == "one":
        out_reverse = [draw(st.booleans())] * 2
        kwargs["out_reverse"] = out_reverse[0]
    else:
        out_reverse = draw(st.lists(st.booleans(), min_size=2, max_size=2))
        kwargs["out_reverse"] = (
            tuple(out_reverse) if mode == "prefix" else (out_reverse[0], {"q": out_reverse[1]})
        )

    if "in_reverse" not in kwargs and "out_reverse" not in kwargs and draw(st.booleans()):
        kwargs["reverse"] = True
        in_reverse, out_reverse = [True] * k, [True] * 2

    def shape(rank: int, axis: int) -> list[int]:
        dims = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
        dims[axis] = n
        return dims

    return {
        "n": n,
        "xs_shapes": [shape(r, a) for r, a in zip(ranks, axes, strict=True)],
        "y_shapes": [draw(st.lists(st.integers(1, 3), min_size=r, max_size=r)) for r in y_ranks],
        "kwargs": kwargs,
        "per_leaf": (axes, in_reverse, out_axes, out_reverse),
        "seed": draw(st.integers(0, 2**16)),
    }


def make_problem(layout: dict[str, Any]):
    """``(step, init, xs, weight)`` for ``layout``: every ``y`` depends on the carry, which
    depends on every ``x`` read so far, so any misplaced index shows."""
    generator = torch.Generator().manual_seed(layout["seed"])
    leaves = [randn(*s, generator=generator) for s in layout["xs_shapes"]]
    xs = {"a": leaves[0], "b": tuple(leaves[1:])}
    bases = [randn(*s, generator=generator) for s in layout["y_shapes"]]
    weight = randn(2, generator=generator)

    def step(carry, x):
        total = x["a"].sum() * 0.3 + sum(b.mean() for b in x["b"])
        carry = torch.tanh(carry * weight + total)
        return carry, (carry[0] * bases[0] + x["a"].mean(), {"q": carry[1] * bases[1]})

    return step, randn(2, generator=generator), xs, weight


def expected_empty(layout: dict[str, Any]) -> Any:
    _, _, out_axes, _ = layout["per_leaf"]
    p, q = (
        torch.empty(s, dtype=DTYPE).unsqueeze(a).narrow(a, 0, 0)
        for s, a in zip(layout["y_shapes"], out_axes, strict=True)
    )
    return p, {"q": q}


@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(layouts())
def test_random_layouts_equal_python_loop(layout) -> None:
    step, init, xs, _ = make_problem(layout)
    carry, ys = torchscan.scan(step, init, xs, **layout["kwargs"])
    expected_carry, expected_ys = laid_out_loop(step, init, xs, *layout["per_leaf"])
    if layout["n"] == 0:
        assert carry is init
        expected_ys = expected_empty(layout)
    torch.testing.assert_close(carry, expected_carry)
    assert_trees_close(ys, expected_ys)


@hypothesis.settings(max_examples=20, deadline=None)
@hypothesis.given(layouts())
def test_random_layouts_gradients_equal_python_loop(layout) -> None:
    step, init, xs, weight = make_problem(layout)
    hypothesis.assume(layout["n"] > 0)
    inputs = [init.requires_grad_(), weight.requires_grad_()]
    inputs += [leaf.requires_grad_() for leaf in pytree.tree_leaves(xs)]

    def loss(carry: torch.Tensor, ys: Any) -> torch.Tensor:
        total = carry.pow(2).sum()
        for i, leaf in enumerate(pytree.tree_leaves(ys)):
            scale = torch.linspace(-1.0, 1.0 + i, leaf.numel(), dtype=DTYPE).reshape(leaf.shape)
            total = total + (leaf * scale).sum()
        return total

    actual = torch.autograd.grad(loss(*torchscan.scan(step, init, xs, **layout["kwargs"])), inputs)
    expected = torch.autograd.grad(
        loss(*laid_out_loop(step, init, xs, *layout["per_leaf"])), inputs
    )
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e)


def test_a_sequence_read_backwards_next_to_one_read_forwards() -> None:
    xs = {"up": torch.arange(4.0), "down": torch.arange(4.0) * 10}

    def step(c, x):
        return c + 1, {"up": x["up"], "down": x["down"], "step": c}

    carry, ys = torchscan.scan(
        step,
        torch.tensor(0.0),
        xs,
        in_reverse={"up": False, "down": True},
        out_reverse={"up": False, "down": True, "step": False},
    )
    assert carry.item() == 4.0
    assert ys["up"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert ys["down"].tolist() == [0.0, 10.0, 20.0, 30.0]  # read and stacked from the end
    assert ys["step"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_zero_length_ys_take_their_shapes_from_out_axes() -> None:
    calls = []

    def step(c, x):
        calls.append(x)
        return c, {"p": x["a"] * c, "q": x["b"], "r": None}

    init = torch.ones(3, dtype=DTYPE)
    xs = {"a": randn(0, 3), "b": randn(2, 0, 4)}
    carry, ys = torchscan.scan(
        step, init, xs, in_axes={"a": 0, "b": 1}, out_axes={"p": -1, "q": 1, "r": 0}
    )
    assert carry is init
    assert ys["p"].shape == (3, 0)
    assert ys["q"].shape == (2, 0, 4)
    assert ys["r"] is None
    assert ys["p"].dtype == ys["q"].dtype == DTYPE
    assert len(calls) == 1


# -- a bidirectional LSTM as one scan ------------------------------------------------------------


@pytest.mark.parametrize("batch_first", [False, True], ids=["time-major", "batch-first"])
def test_bidirectional_lstm_as_one_scan(batch_first: bool) -> None:
    lstm = torch.nn.LSTM(F, H, bidirectional=True, batch_first=batch_first, dtype=DTYPE)
    cells = []
    for suffix in ("", "_reverse"):
        cell = torch.nn.LSTMCell(F, H, dtype=DTYPE)
        with torch.no_grad():
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                getattr(cell, name).copy_(getattr(lstm, f"{name}_l0{suffix}"))
        cells.append(cell)
    forward_cell, backward_cell = cells
    n_steps, batch = 5, 3
    x = randn(batch, n_steps, F) if batch_first else randn(n_steps, batch, F)
    h0, c0 = randn(2, batch, H), randn(2, batch, H)

    def step(carry, x):
        forward, backward = carry
        forward = forward_cell(x[0], forward)
        backward = backward_cell(x[1], backward)
        return (forward, backward), (forward[0], backward[0])

    with torch.no_grad():
        (forward, backward), (ys_forward, ys_backward) = torchscan.scan(
            step,
            ((h0[0], c0[0]), (h0[1], c0[1])),
            (x, x),
            axis=1 if batch_first else 0,
            in_reverse=(False, True),
            out_reverse=(False, True),
        )
        out, (h_n, c_n) = lstm(x, (h0, c0))
    torch.testing.assert_close(torch.cat([ys_forward, ys_backward], -1), out)
    torch.testing.assert_close(torch.stack([forward[0], backward[0]]), h_n)
    torch.testing.assert_close(torch.stack([forward[1], backward[1]]), c_n)


# -- errors -------------------------------------------------------------------------------------

XS = torch.ones(4, 3, 2)


def both(c, x):
    return c + x["a"] + x["b"], {"p": x["a"], "q": x["a"].sum()}


def assert_no_tensor_values(message: str) -> None:
    """Messages describe tensors by type (``float32[4, 3, 2] on cpu``), never by their values."""
    assert "tensor(" not in message


@pytest.mark.parametrize(
    ("xs", "in_axes", "structure"),
    [((XS, XS), (0, 0, 0), "(*, *)"), ({"a": XS, "b": XS}, {"a": 0}, "{'a': *, 'b': *}")],
    ids=["tuple", "dict"],
)
def test_in_axes_not_a_prefix_of_xs(xs: Any, in_axes: Any, structure: str) -> None:
    prefix = (
        "torchscan.scan: in_axes must be one int or a pytree that is a prefix of the structure "
        f"of xs, but:\n  * xs has structure {structure}\n  * in_axes has structure "
    )
    with pytest.raises(ValueError, match="^" + re.escape(prefix)) as info:
        torchscan.scan(lambda c, x: (c, None), None, xs, in_axes=in_axes)
    assert_no_tensor_values(str(info.value))


def test_in_axes_out_of_range_for_a_leaf() -> None:
    with errors(
        ValueError,
        "torchscan.scan: in_axes does not fit every leaf of xs:",
        "  * in_axes gives it 3: xs['b'][0] has shape (4, 3, 2), so axis must be in [-3, 2]",
        "  * in_axes gives it -4: xs['b'][1] has shape (3, 4, 2), so axis must be in [-3, 2]",
    ):
        torchscan.scan(
            lambda c, x: (c, None),
            None,
            {"a": XS, "b": (XS, XS.transpose(0, 1))},
            in_axes={"a": 0, "b": (3, -4)},
        )


@pytest.mark.parametrize(
    ("in_reverse", "leaf", "description"),
    [({"a": 1, "b": True}, "xs['a']", "an int"), ({"a": False, "b": None}, "xs['b']", "None")],
    ids=["int", "None"],
)
def test_in_reverse_not_a_bool(in_reverse: dict, leaf: str, description: str) -> None:
    with errors(
        TypeError,
        f"torchscan.scan: in_reverse gives {leaf} {description}, but it must be a bool.",
    ):
        torchscan.scan(both, torch.zeros(3, 2), {"a": XS, "b": XS}, in_reverse=in_reverse)


def test_out_axes_not_fitting_y() -> None:
    with errors(
        ValueError,
        "torchscan.scan: out_axes does not fit every leaf of y:",
        "  * y['q'] has shape (), so ys gets rank 1 and its axis must be in [-1, 0], but "
        "out_axes gives it 1",
    ):
        torchscan.scan(both, torch.zeros(3, 2), {"a": XS, "b": XS}, out_axes={"p": 0, "q": 1})


def test_out_axes_not_a_prefix_of_y() -> None:
    prefix = (
        "torchscan.scan: out_axes must be one int or a pytree that is a prefix of the structure "
        "of y, but:\n  * y has structure {'p': *, 'q': *}\n  * out_axes has structure (*, *)"
    )
    with pytest.raises(ValueError, match="^" + re.escape(prefix)) as info:
        torchscan.scan(both, torch.zeros(3, 2), {"a": XS, "b": XS}, out_axes=(1, 0))
    assert_no_tensor_values(str(info.value))


@pytest.mark.parametrize("out_reverse", [{"p": True}, (True, False)], ids=["dict", "tuple"])
def test_out_reverse_not_a_prefix_of_y(out_reverse: Any) -> None:
    prefix = (
        "torchscan.scan: out_reverse must be one bool or a pytree that is a prefix of the "
        "structure of y, but:\n  * y has structure {'p': *, 'q': *}\n  * out_reverse has "
        "structure "
    )
    with pytest.raises(ValueError, match="^" + re.escape(prefix)) as info:
        torchscan.scan(both, torch.zeros(3, 2), {"a": XS, "b": XS}, out_reverse=out_reverse)
    assert_no_tensor_values(str(info.value))


@pytest.mark.parametrize(
    "directions",
    [{"in_reverse": True}, {"in_reverse": {"a": False, "b": True}}, {"out_reverse": False}],
    ids=["in-reverse", "in-reverse-tree", "out-reverse"],
)
def test_reverse_with_in_reverse_or_out_reverse(directions: dict[str, Any]) -> None:
    with errors(
        ValueError,
        "torchscan.scan: reverse=True reverses every sequence and every output; give directions "
        "either with reverse or with in_reverse and out_reverse, not both.",
    ):
        torchscan.scan(both, torch.zeros(3, 2), {"a": XS, "b": XS}, reverse=True, **directions)


UNTIL = (
    "torchscan.scan: fn returned until, which cannot be combined with in_axes, out_axes, "
    "in_reverse or out_reverse given leaf by leaf: give every leaf the same axis and direction "
    "(axis=, reverse=)."
)


def stops_after(limit: float) -> Callable:
    def step(c, x):
        c = c + x["a"] + x["b"]
        return c, c, torchscan.until(c.sum() > limit)

    return step


@pytest.mark.parametrize(
    "directions",
    [{"in_reverse": {"a": False, "b": True}}, {"out_reverse": True}],
    ids=["in-reverse", "out-reverse"],
)
def test_until_with_differing_directions(directions: dict[str, Any]) -> None:
    with errors(ValueError, UNTIL):
        torchscan.scan(stops_after(10.0), torch.zeros(3, 2), {"a": XS, "b": XS}, **directions)


@pytest.mark.parametrize(
    "directions",
    [{"in_reverse": {"a": False, "b": True}}, {"out_reverse": True}],
    ids=["in-reverse", "out-reverse"],
)
@pytest.mark.parametrize("limit", [1e9, 39.0], ids=["never", "in-the-last-step"])
def test_until_with_differing_directions_whatever_it_says(
    directions: dict[str, Any], limit: float
) -> None:
    """The refusal is one of the arguments, not of the data: it holds when the scan would have
    stopped at its last step anyway, or never."""
    with errors(ValueError, UNTIL):
        torchscan.scan(stops_after(limit), torch.zeros(3, 2), {"a": XS, "b": XS}, **directions)
