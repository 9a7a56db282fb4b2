"""``torchscan.scan(..., lengths=...)``: padded batches of sequences of different lengths, against
torch's RNNs on packed sequences and against each example run alone on its valid prefix."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import hypothesis
import hypothesis.strategies as st
import pytest
import torch
import torch.utils._pytree as pytree
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import torchscan

from .test_scan_errors import errors

F, H = 3, 4
DTYPE = torch.float64
_gen = torch.Generator().manual_seed(0)


def randn(*shape: int, generator: torch.Generator | None = None) -> torch.Tensor:
    return torch.randn(shape, generator=generator or _gen, dtype=DTYPE)


# -- the oracle: every example alone, on its valid prefix ---------------------------------------


def tree_map(fn: Callable, *trees: Any) -> Any:
    """``fn`` on every tensor of ``trees``, leaving ``None`` leaves as they are."""
    return pytree.tree_map(lambda *ts: None if ts[0] is None else fn(*ts), *trees)


def per_example_loop(
    fn: Callable,
    init: Any,
    xs: Any,
    lengths: torch.Tensor,
    *,
    axis: int = 0,
    reverse: bool = False,
    batch_axis: int = 0,
    length: int | None = None,
) -> tuple[Any, Any]:
    """``scan`` with ``lengths`` as the Python of its definition: example ``b`` (a batch of one,
    cut from ``init`` along ``batch_axis`` and from every step's ``x`` along its axis 0) runs
    steps ``0 .. lengths[b] - 1`` (read backwards with ``reverse``); the ``y`` of padded positions
    are zeros, and ``ys`` are stacked along ``axis``."""
    leaves = [leaf for leaf in pytree.tree_leaves(xs) if leaf is not None]
    n_steps = leaves[0].shape[axis] if leaves else length

    def one(tree: Any, b: int, dim: int) -> Any:
        return tree_map(lambda t: t.narrow(dim, b, 1), tree)

    def take(t: int) -> Any:
        return tree_map(lambda leaf: leaf.select(axis, t), xs)

    def zero_x() -> Any:  # an x of zeros, only to learn the type of y
        def without_axis(leaf: torch.Tensor) -> torch.Tensor:
            shape = list(leaf.shape)
            del shape[axis]
            return torch.zeros(shape, dtype=leaf.dtype)

        return tree_map(without_axis, xs)

    template = fn(one(init, 0, batch_axis), one(zero_x(), 0, 0))[1]
    zeros = tree_map(torch.zeros_like, template)
    finals, outputs = [], []
    for b in range(len(lengths)):
        carry, n, ys_b = one(init, b, batch_axis), int(lengths[b]), [zeros] * n_steps
        for t in range(n):
            position = n - 1 - t if reverse else t
            carry, ys_b[position] = fn(carry, one(take(position), b, 0))
        finals.append(carry)
        outputs.append(ys_b)

    def cat(*examples: torch.Tensor) -> torch.Tensor:
        return torch.cat(examples, batch_axis)

    carry = tree_map(cat, *finals)
    rows = [tree_map(cat, *(ys_b[t] for ys_b in outputs)) for t in range(n_steps)]
    if rows:
        ys = tree_map(lambda *column: torch.stack(column, axis), *rows)
    else:
        batched = tree_map(cat, *([zeros] * len(lengths)))
        ys = tree_map(lambda leaf: leaf.unsqueeze(axis).narrow(axis, 0, 0), batched)
    return carry, ys


def assert_trees_close(actual: Any, expected: Any) -> None:
    actual_leaves, actual_spec = pytree.tree_flatten(actual)
    expected_leaves, expected_spec = pytree.tree_flatten(expected)
    assert actual_spec == expected_spec
    for a, e in zip(actual_leaves, expected_leaves, strict=True):
        if e is None:
            assert a is None
        else:
            assert a.shape == e.shape
            assert a.dtype == e.dtype
            torch.testing.assert_close(a, e)


def valid_positions(lengths: torch.Tensor, n_steps: int) -> torch.Tensor:
    """``(T, B)``: whether position ``t`` of example ``b`` is within its length."""
    return torch.arange(n_steps)[:, None] < lengths[None, :]


# -- torch's RNNs on packed sequences ----------------------------------------------------------

RNNS: dict[str, tuple[type[torch.nn.Module], type[torch.nn.Module]]] = {
    "lstm": (torch.nn.LSTM, torch.nn.LSTMCell),
    "gru": (torch.nn.GRU, torch.nn.GRUCell),
    "rnn": (torch.nn.RNN, torch.nn.RNNCell),
}


def cell_like(module: torch.nn.Module, cell_type: type[torch.nn.Module], suffix: str):
    """A cell with the weights of one direction of the one-layer ``module``."""
    cell = cell_type(F, H, dtype=DTYPE)
    with torch.no_grad():
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(cell, name).copy_(getattr(module, f"{name}_l0{suffix}"))
    return cell


def step_of(cell: torch.nn.Module) -> Callable:
    if isinstance(cell, torch.nn.LSTMCell):

        def lstm_step(carry, x):
            h, c = cell(x, carry)
            return (h, c), h

        return lstm_step

    def step(h, x):
        h = cell(x, h)
        return h, h

    return step


DIRECTIONS = [("", False), ("_reverse", True)]


@pytest.mark.parametrize("batch_first", [False, True], ids=["time-major", "batch-first"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["unidirectional", "bidirectional"])
@pytest.mark.parametrize("kind", list(RNNS))
def test_scans_with_lengths_equal_torch_rnn_on_packed_sequences(
    kind: str, bidirectional: bool, batch_first: bool
) -> None:
    module_type, cell_type = RNNS[kind]
    module = module_type(F, H, bidirectional=bidirectional, batch_first=batch_first, dtype=DTYPE)
    n_steps, lengths = 6, torch.tensor([4, 1, 6, 3, 4])
    batch = len(lengths)
    axis = 1 if batch_first else 0
    x = randn(batch, n_steps, F) if batch_first else randn(n_steps, batch, F)
    directions = DIRECTIONS[: 2 if bidirectional else 1]
    h0 = randn(len(directions), batch, H)
    c0 = randn(len(directions), batch, H)
    packed = pack_padded_sequence(x, lengths, batch_first=batch_first, enforce_sorted=False)
    with torch.no_grad():
        packed_out, state = module(packed, (h0, c0) if kind == "lstm" else h0)
    expected_out, _ = pad_packed_sequence(packed_out, batch_first=batch_first, total_length=n_steps)

    outputs, finals = [], []
    for d, (suffix, reverse) in enumerate(directions):
        step = step_of(cell_like(module, cell_type, suffix))
        init = (h0[d], c0[d]) if kind == "lstm" else h0[d]
        with torch.no_grad():
            carry, ys = torchscan.scan(step, init, x, axis=axis, reverse=reverse, lengths=lengths)
        outputs.append(ys)
        finals.append(carry)

    out = torch.cat(outputs, -1)
    assert out.shape == expected_out.shape
    torch.testing.assert_close(out, expected_out)
    padded = ~valid_positions(lengths, n_steps)
    assert (out.movedim(axis, 0)[padded] == 0).all()
    if kind == "lstm":
        torch.testing.assert_close(torch.stack([h for h, _ in finals]), state[0])
        torch.testing.assert_close(torch.stack([c for _, c in finals]), state[1])
    else:
        torch.testing.assert_close(torch.stack(finals), state)


PADDINGS = {
    "nan": lambda shape: torch.full(shape, float("nan"), dtype=DTYPE),
    "inf": lambda shape: torch.full(shape, float("inf"), dtype=DTYPE),
    "garbage": lambda shape: (
        torch.empty(shape, dtype=DTYPE).view(torch.int64).random_().view(DTYPE)
    ),
}
"""What padding may hold: NaN, infinity, or whatever memory held (bit patterns of every kind,
NaNs and huge values among them)."""


@pytest.mark.parametrize("padding", list(PADDINGS))
@pytest.mark.parametrize("batch_first", [False, True], ids=["time-major", "batch-first"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["unidirectional", "bidirectional"])
@pytest.mark.parametrize("kind", list(RNNS))
def test_padding_reaches_neither_values_nor_gradients_as_in_packed_sequences(
    kind: str, bidirectional: bool, batch_first: bool, padding: str
) -> None:
    """Values and the gradients of every weight, of the initial states and of the valid inputs
    equal torch's RNN on a packed sequence, whatever the padding holds; padded inputs get zero
    gradients."""
    module_type, cell_type = RNNS[kind]
    module = module_type(F, H, bidirectional=bidirectional, batch_first=batch_first, dtype=DTYPE)
    n_steps, lengths = 6, torch.tensor([4, 1, 6, 0, 3])
    batch, axis = len(lengths), 1 if batch_first else 0
    valid = valid_positions(lengths, n_steps)
    x = randn(n_steps, batch, F)
    x[~valid] = PADDINGS[padding]((int((~valid).sum()), F))
    x = x.transpose(0, 1).contiguous() if batch_first else x
    directions = DIRECTIONS[: 2 if bidirectional else 1]
    h0 = randn(len(directions), batch, H)

    # torch's RNN on the packed valid positions; an example of length 0 keeps its state
    nonempty = lengths > 0
    x_torch = x.clone().requires_grad_()
    h0_torch = h0.clone().requires_grad_()
    state_in = (h0_torch, h0_torch * 0.5) if kind == "lstm" else h0_torch
    taken = x_torch[nonempty] if batch_first else x_torch[:, nonempty]
    packed = pack_padded_sequence(taken, lengths[nonempty], batch_first, enforce_sorted=False)
    picked = tuple(s[:, nonempty] for s in state_in) if kind == "lstm" else state_in[:, nonempty]
    packed_out, state = module(packed, picked)
    some, _ = pad_packed_sequence(packed_out, batch_first=batch_first, total_length=n_steps)
    width = H * len(directions)
    out = torch.zeros(n_steps, batch, width, dtype=DTYPE).movedim(0, axis)  # ys of 0 for none
    out = out.index_copy(1 - axis, nonempty.nonzero()[:, 0], some)
    final = state[0] if kind == "lstm" else state
    loss = out.pow(2).sum() + final.sum()
    expected = torch.autograd.grad(loss, [x_torch, h0_torch, *module.parameters()])

    x_scan = x.clone().requires_grad_()
    h0_scan = h0.clone().requires_grad_()
    cells = [cell_like(module, cell_type, suffix) for suffix, _ in directions]
    outputs, finals = [], []
    for d, ((_, reverse), cell) in enumerate(zip(directions, cells, strict=True)):
        init = (h0_scan[d], h0_scan[d] * 0.5) if kind == "lstm" else h0_scan[d]
        carry, ys = torchscan.scan(
            step_of(cell), init, x_scan, axis=axis, reverse=reverse, lengths=lengths
        )
        outputs.append(ys)
        finals.append(carry[0] if kind == "lstm" else carry)
    ys = torch.cat(outputs, -1)
    torch.testing.assert_close(ys, out)
    torch.testing.assert_close(torch.stack(finals)[:, nonempty], final)
    loss = ys.pow(2).sum() + torch.stack(finals)[:, nonempty].sum()
    weights = [p for cell in cells for p in cell.parameters()]
    actual = torch.autograd.grad(loss, [x_scan, h0_scan, *weights])
    assert all(torch.isfinite(g).all() for g in actual)
    grad_x, grad_h0, *grad_weights = actual
    torch.testing.assert_close(grad_x, expected[0])
    time_major = grad_x.movedim(axis, 0)
    assert (time_major[~valid] == 0).all()
    torch.testing.assert_close(grad_h0[:, nonempty], expected[1][:, nonempty])
    by_name = dict(zip([n for n, _ in module.named_parameters()], expected[2:], strict=True))
    for d, (suffix, _) in enumerate(directions):
        for k, name in enumerate(("weight_ih", "weight_hh", "bias_ih", "bias_hh")):
            torch.testing.assert_close(grad_weights[4 * d + k], by_name[f"{name}_l0{suffix}"])


def test_an_element_with_two_axes_of_the_batch_size_gets_only_its_non_finite_padding_replaced():
    """Where the examples could be along either of two axes of x (both of the batch's size),
    only non-finite padding is replaced, along batch_axis: no finite value changes."""
    lengths = torch.tensor([2, 3, 1])
    xs = randn(3, 3, 3)  # (T, B, B): each x is (3, 3)
    valid = valid_positions(lengths, 3)
    xs[~valid] = float("nan")
    weight = randn(3).requires_grad_()

    def step(h, x):
        h = torch.tanh(x @ weight + h)
        return h, h

    carry, ys = torchscan.scan(step, torch.zeros(3, dtype=DTYPE), xs, lengths=lengths)
    expected = per_example_loop(step, torch.zeros(3, dtype=DTYPE), xs, lengths)
    assert_trees_close((carry, ys), expected)
    (grad,) = torch.autograd.grad(ys.sum() + carry.sum(), [weight])
    assert torch.isfinite(grad).all()


def test_a_sequence_shared_by_every_example_is_read_as_it_is() -> None:
    """A leaf of xs with no axis of the batch's size (a time embedding) is no padded batch."""
    lengths = torch.tensor([2, 4])
    xs = {"x": randn(4, 2, 3), "t": torch.arange(4, dtype=DTYPE)}

    def step(h, x):
        return h + x["x"].sum(-1) * x["t"], h

    carry, ys = torchscan.scan(step, torch.zeros(2, dtype=DTYPE), xs, lengths=lengths)
    expected_ys = torch.zeros(4, 2, dtype=DTYPE)
    for b in range(2):
        h = torch.zeros((), dtype=DTYPE)
        for t in range(int(lengths[b])):
            expected_ys[t, b] = h
            h = h + xs["x"][t, b].sum() * xs["t"][t]
        torch.testing.assert_close(carry[b], h)
    torch.testing.assert_close(ys, expected_ys)


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("kind", list(RNNS))
def test_zero_lengths_equal_per_example_loop(kind: str, reverse: bool) -> None:
    """Packed sequences refuse lengths of 0: the scan keeps those examples' carry and gives them
    zeros, as the example run alone for no step."""
    _, cell_type = RNNS[kind]
    step = step_of(cell_type(F, H, dtype=DTYPE))
    lengths = torch.tensor([0, 3, 0, 5])
    x = randn(5, len(lengths), F)
    init = (randn(4, H), randn(4, H)) if kind == "lstm" else randn(4, H)
    with torch.no_grad():
        actual = torchscan.scan(step, init, x, reverse=reverse, lengths=lengths)
        expected = per_example_loop(step, init, x, lengths, reverse=reverse)
    assert_trees_close(actual, expected)
    carry, ys = actual
    h = carry[0] if kind == "lstm" else carry
    h0 = init[0] if kind == "lstm" else init
    assert torch.equal(h[[0, 2]], h0[[0, 2]])
    assert (ys[:, [0, 2]] == 0).all()


# -- random padded batches against the per-example loop -----------------------------------------


@st.composite
def padded_batches(draw) -> dict[str, Any]:
    n_steps = draw(st.integers(0, 6))
    batch = draw(st.integers(1, 4))
    return {
        "n_steps": n_steps,
        "lengths": draw(st.lists(st.integers(0, n_steps), min_size=batch, max_size=batch)),
        "lengths_dtype": draw(st.sampled_from([torch.int64, torch.int32])),
        "reverse": draw(st.booleans()),
        "batch_first": draw(st.booleans()),
        "batch_axis": draw(st.sampled_from([0, -1])),
        "seed": draw(st.integers(0, 2**16)),
    }


def make_problem(problem: dict[str, Any]):
    """``(step, init, xs, lengths, axis, weight)``: an Elman step over ``{"x": ..., "gate": ...}``
    carrying ``{"h": ..., "n": step counter (int64)}`` with the batch on ``batch_axis``, and
    returning ``(h, None, n)``."""
    generator = torch.Generator().manual_seed(problem["seed"])
    n_steps, batch = problem["n_steps"], len(problem["lengths"])
    batch_axis, batch_first = problem["batch_axis"], problem["batch_first"]
    weight = randn(F, H, generator=generator)
    recurrent = randn(H, H, generator=generator)

    def step(carry, x):
        h = carry["h"] if batch_axis == 0 else carry["h"].T
        h = torch.tanh(x["x"] @ weight + h @ recurrent) * torch.sigmoid(x["gate"])[:, None]
        h = h if batch_axis == 0 else h.T
        return {"h": h, "n": carry["n"] + 1}, (h * 2.0, None, carry["n"])

    h0 = randn(batch, H, generator=generator)
    init = {
        "h": h0 if batch_axis == 0 else h0.T.contiguous(),
        "n": torch.arange(batch, dtype=torch.int64) * 10,
    }
    shape = (batch, n_steps) if batch_first else (n_steps, batch)
    xs = {"x": randn(*shape, F, generator=generator), "gate": randn(*shape, generator=generator)}
    lengths = torch.tensor(problem["lengths"], dtype=problem["lengths_dtype"])
    return step, init, xs, lengths, 1 if batch_first else 0, weight


@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(padded_batches())
def test_random_padded_batches_equal_per_example_loop(problem) -> None:
    step, init, xs, lengths, axis, _ = make_problem(problem)
    kwargs = {"axis": axis, "reverse": problem["reverse"], "batch_axis": problem["batch_axis"]}
    actual = torchscan.scan(step, init, xs, lengths=lengths, **kwargs)
    expected = per_example_loop(step, init, xs, lengths, **kwargs)
    assert_trees_close(actual, expected)
    carry, (_, nothing, counts) = actual
    assert nothing is None
    # the int carry of every example stopped at its length, and its ys are 0 past it
    assert torch.equal(carry["n"], init["n"] + lengths.long())
    padded = ~valid_positions(lengths.long(), problem["n_steps"])
    assert (counts.movedim(axis, 0)[padded] == 0).all()


@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(padded_batches())
def test_random_padded_batches_gradients_equal_per_example_loop(problem) -> None:
    step, init, xs, lengths, axis, weight = make_problem(problem)
    kwargs = {"axis": axis, "reverse": problem["reverse"], "batch_axis": problem["batch_axis"]}
    weight.requires_grad_()
    h0 = init["h"].clone().requires_grad_()
    xs = pytree.tree_map(lambda leaf: leaf.clone().requires_grad_(), xs)
    inputs = [xs["x"], xs["gate"], h0, weight]

    def grads(implementation: Callable) -> list[torch.Tensor]:
        carry, (ys, _, _) = implementation(
            step, {"h": h0, "n": init["n"]}, xs, lengths=lengths, **kwargs
        )
        scale = torch.linspace(-1.0, 2.0, ys.numel(), dtype=DTYPE).reshape(ys.shape)
        loss = (ys * scale).sum() + carry["h"].pow(2).sum()
        return list(torch.autograd.grad(loss, inputs, allow_unused=True, materialize_grads=True))

    actual = grads(torchscan.scan)
    for a, e in zip(actual, grads(per_example_loop), strict=True):
        torch.testing.assert_close(a, e)
    padded = ~valid_positions(lengths.long(), problem["n_steps"])
    for grad in actual[:2]:
        assert (grad.movedim(axis, 0)[padded] == 0).all()


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_padding_values_never_reach_the_results(reverse: bool) -> None:
    """Padded positions hold NaN: the carry and ys of every example are those of its valid
    prefix."""
    lengths = torch.tensor([2, 4, 0])
    xs = randn(4, 3, F)
    xs[~valid_positions(lengths, 4)] = float("nan")
    weight = randn(F, H)

    def step(h, x):
        h = torch.tanh(x @ weight + h)
        return h, h

    init = randn(3, H)
    actual = torchscan.scan(step, init, xs, lengths=lengths, reverse=reverse)
    expected = per_example_loop(step, init, xs, lengths, reverse=reverse)
    assert_trees_close(actual, expected)
    assert not actual[1].isnan().any()


def test_lengths_with_per_leaf_axes() -> None:
    """``lengths`` with ``in_axes`` and ``out_axes``: the per-example loop on time-major copies,
    with its ``ys`` moved to their ``out_axes``."""
    lengths = torch.tensor([3, 0, 1])
    time_major = {"a": randn(3, 3, F), "b": randn(3, 3)}
    xs = {"a": time_major["a"], "b": time_major["b"].T.contiguous()}  # b: (B, T)
    weight = randn(F, H)

    def step(h, x):
        h = torch.tanh(x["a"] @ weight + h * x["b"][:, None])
        return h, {"h": h, "s": h.sum(-1)}

    init = randn(3, H)
    actual = torchscan.scan(
        step, init, xs, lengths=lengths, in_axes={"a": 0, "b": 1}, out_axes={"h": -1, "s": 1}
    )
    carry, ys = per_example_loop(step, init, time_major, lengths)
    expected = carry, {"h": ys["h"].movedim(0, -1), "s": ys["s"].movedim(0, 1)}
    assert_trees_close(actual, expected)


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_lengths_without_xs(reverse: bool) -> None:
    lengths = torch.tensor([0, 2, 5])

    def count(c, x):
        assert x is None
        return c + 1, c

    carry, ys = torchscan.scan(count, torch.zeros(3), length=5, reverse=reverse, lengths=lengths)
    assert torch.equal(carry, lengths.float())
    expected = torch.tensor([[0, 0, 0, 0, 0], [0, 1, 0, 0, 0], [0, 1, 2, 3, 4]]).float().T
    if reverse:
        expected = torch.tensor([[0, 0, 0, 0, 0], [1, 0, 0, 0, 0], [4, 3, 2, 1, 0]]).float().T
    assert torch.equal(ys, expected)


# -- PackedSequence -----------------------------------------------------------------------------


def test_a_packed_sequence_is_refused_with_its_conversion() -> None:
    packed = pack_padded_sequence(randn(4, 2, F), torch.tensor([4, 2]), enforce_sorted=False)
    with errors(
        TypeError,
        "torchscan.scan: xs is a PackedSequence, whose data has no time axis to scan. Pad it and "
        "pass its lengths:\n"
        "    xs, lengths = torch.nn.utils.rnn.pad_packed_sequence(packed)\n"
        "    carry, ys = torchscan.scan(fn, init, xs, lengths=lengths)\n"
        "(with pad_packed_sequence(packed, batch_first=True), scan with axis=1 as well).",
    ):
        torchscan.scan(step_of(torch.nn.RNNCell(F, H, dtype=DTYPE)), randn(2, H), packed)


@pytest.mark.parametrize("batch_first", [False, True], ids=["time-major", "batch-first"])
def test_the_documented_conversion_of_a_packed_sequence_equals_torch_rnn(
    batch_first: bool,
) -> None:
    rnn = torch.nn.RNN(F, H, batch_first=batch_first, dtype=DTYPE)
    lengths = torch.tensor([2, 5, 1, 4])
    x = randn(4, 6, F) if batch_first else randn(6, 4, F)
    packed = pack_padded_sequence(x, lengths, batch_first=batch_first, enforce_sorted=False)
    h0 = randn(1, 4, H)
    with torch.no_grad():
        out, h_n = rnn(packed, h0)
        expected, _ = pad_packed_sequence(out, batch_first=batch_first)

        xs, xs_lengths = pad_packed_sequence(packed, batch_first=batch_first)
        step = step_of(cell_like(rnn, torch.nn.RNNCell, ""))
        carry, ys = torchscan.scan(
            step, h0[0], xs, axis=1 if batch_first else 0, lengths=xs_lengths
        )
    torch.testing.assert_close(ys, expected)
    torch.testing.assert_close(carry, h_n[0])


# -- errors -------------------------------------------------------------------------------------


def elman(h, x):
    h = torch.tanh(h + x)
    return h, h


INIT, XS = torch.zeros(3, 2), torch.ones(4, 3, 2)


def test_lengths_not_a_tensor() -> None:
    with errors(
        TypeError,
        "torchscan.scan: lengths must be a 1-d tensor of integers (one length per example), but "
        "got a list.",
    ):
        torchscan.scan(elman, INIT, XS, lengths=[1, 2, 3])


@pytest.mark.parametrize(
    ("lengths", "description"),
    [
        (torch.ones(3), "float32[3] on cpu"),
        (torch.ones(3, dtype=torch.bool), "bool[3] on cpu"),
        (torch.ones(3, dtype=torch.complex64), "complex64[3] on cpu"),
    ],
    ids=["float", "bool", "complex"],
)
def test_lengths_not_integers(lengths: torch.Tensor, description: str) -> None:
    with errors(
        TypeError,
        f"torchscan.scan: lengths must be a tensor of integers, but got {description}; convert "
        "it with lengths.long().",
    ):
        torchscan.scan(elman, INIT, XS, lengths=lengths)


@pytest.mark.parametrize(
    ("lengths", "description"),
    [
        (torch.ones(3, 1, dtype=torch.int64), "int64[3, 1] on cpu"),
        (torch.tensor(2), "int64[] on cpu"),
    ],
    ids=["2-d", "0-d"],
)
def test_lengths_not_1d(lengths: torch.Tensor, description: str) -> None:
    with errors(
        ValueError,
        "torchscan.scan: lengths must be 1-d, one length per example of the batch, but got "
        f"{description}.",
    ):
        torchscan.scan(elman, INIT, XS, lengths=lengths)


@pytest.mark.parametrize(
    ("lengths", "index", "value"),
    [([1, -1, 2], 1, -1), ([3, 4, -2], 2, -2), ([1, 5, 2], 1, 5), ([4, 4, 7], 2, 7)],
)
def test_length_out_of_range(lengths: list[int], index: int, value: int) -> None:
    with errors(
        ValueError,
        "torchscan.scan: every length must be in [0, 4] (the padded axis has 4 steps), but "
        f"lengths[{index}] is {value}.",
    ):
        torchscan.scan(elman, INIT, XS, lengths=torch.tensor(lengths))


def test_lengths_on_another_device() -> None:
    with errors(
        ValueError,
        "torchscan.scan: lengths is on meta, but init and xs are on cpu; move it with "
        "lengths.to(xs.device).",
    ):
        torchscan.scan(elman, INIT, XS, lengths=torch.tensor([1, 2, 3], device="meta"))


def test_a_carry_leaf_with_another_batch_size() -> None:
    with errors(
        ValueError,
        "torchscan.scan: with lengths of 3 examples, every tensor of the carry must have 3 "
        "examples along batch_axis=0, but:",
        "  * init['n'] is float32[2] on cpu, with 2 along axis 0",
        "  * init['s'] is float32[] on cpu, which has no axis 0",
    ):
        torchscan.scan(
            lambda c, x: (c, None),
            {"h": INIT, "n": torch.zeros(2), "s": torch.zeros(())},
            XS,
            lengths=torch.tensor([1, 2, 2]),
        )


def test_a_carry_leaf_with_another_batch_size_along_batch_axis() -> None:
    with errors(
        ValueError,
        "torchscan.scan: with lengths of 3 examples, every tensor of the carry must have 3 "
        "examples along batch_axis=1, but:",
        "  * init[0] is float32[3, 2] on cpu, with 2 along axis 1",
    ):
        torchscan.scan(
            lambda c, x: (c, None),
            (INIT, INIT.T),
            XS,
            lengths=torch.tensor([1, 2, 2]),
            batch_axis=1,
        )


def test_a_y_leaf_without_batch_axis() -> None:
    with errors(
        ValueError,
        "torchscan.scan: with lengths of 3 examples, every tensor of the y of every step must "
        "have 3 examples along batch_axis=0, but:",
        "  * y['s'] is float32[] on cpu, which has no axis 0",
    ):
        torchscan.scan(
            lambda c, x: (c + x, {"h": c, "s": x.sum()}), INIT, XS, lengths=torch.tensor([1, 2, 2])
        )


def test_a_y_leaf_whose_batch_changes_in_a_later_step() -> None:
    """``torch.where`` would broadcast it back to the batch: refused instead."""
    calls = []

    def step(c, x):
        calls.append(None)
        return c + x, (c if len(calls) < 2 else c[:1])

    with errors(
        ValueError,
        "torchscan.scan: with lengths of 3 examples, every tensor of the y of every step must "
        "have 3 examples along batch_axis=0, but:",
        "  * y is float32[1, 2] on cpu, with 1 along axis 0",
    ):
        torchscan.scan(
            step, torch.zeros(3, 2), torch.ones(4, 3, 2), lengths=torch.tensor([4, 1, 0])
        )


def test_a_carry_that_would_broadcast_is_still_refused() -> None:
    with errors(
        TypeError,
        "torchscan.scan: the carry must keep its type, but fn changed it:",
        "  * carry has shape (3, 2) but fn returned shape (2,)",
        "Return a carry with the shape, dtype and device of init (cast or reshape it, or change "
        "init).",
    ):
        torchscan.scan(
            lambda c, x: (c.sum(0), c),
            torch.zeros(3, 2),
            torch.ones(4, 3, 2),
            lengths=torch.tensor([4, 1, 0]),
        )


MIXED = (
    "torchscan.scan: with lengths, every sequence and output must have the same direction (each "
    "example runs its own first lengths[b] steps, or its last ones read backwards), but "
    "in_reverse and out_reverse give them different ones. Run each direction as its own scan "
    "(reverse=False and reverse=True), as a bidirectional RNN over padded sequences does."
)


@pytest.mark.parametrize(
    "directions",
    [
        {"in_reverse": (False, True)},
        {"out_reverse": True},
        {"in_reverse": True},
        {"in_reverse": (True, True), "out_reverse": (True, False)},
    ],
    ids=["in-reverse-differ", "out-reverse", "in-reverse", "out-reverse-differ"],
)
def test_mixed_directions_with_lengths(directions: dict[str, Any]) -> None:
    def step(c, x):
        return c + x[0] + x[1], (c, c)

    with errors(ValueError, MIXED):
        torchscan.scan(step, INIT, (XS, XS), lengths=torch.tensor([1, 2, 2]), **directions)


def test_until_with_lengths() -> None:
    def step(c, x):
        return c + x, c, torchscan.until(c.sum() > 1e9)  # never stops

    with errors(
        ValueError,
        "torchscan.scan: fn returned until, which cannot be combined with lengths: every "
        "example stops at its own length.",
    ):
        torchscan.scan(step, INIT, XS, lengths=torch.tensor([1, 2, 2]))


@pytest.mark.parametrize(
    ("batch_axis", "description"), [(1.0, "a float"), (True, "a bool"), ("0", "a str")]
)
def test_batch_axis_not_an_int(batch_axis: Any, description: str) -> None:
    with errors(TypeError, f"torchscan.scan: batch_axis must be an int, but got {description}."):
        torchscan.scan(elman, INIT, XS, lengths=torch.tensor([1, 2, 2]), batch_axis=batch_axis)


# -- the user's tensors are left alone ---------------------------------------------------------


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_xs_init_and_lengths_are_not_modified(reverse: bool) -> None:
    init = {"h": randn(3, H), "n": torch.zeros(3, dtype=torch.int64)}
    xs = randn(5, 3, F)
    lengths = torch.tensor([5, 0, 2])
    weight = randn(F, H)

    def step(c, x):
        h = torch.tanh(x @ weight + c["h"])
        return {"h": h, "n": c["n"] + 1}, h

    leaves = [*pytree.tree_leaves((init, xs)), lengths]
    before = [(leaf.clone(), leaf._version) for leaf in leaves]
    torchscan.scan(step, init, xs, lengths=lengths, reverse=reverse)
    for leaf, (copy, version) in zip(leaves, before, strict=True):
        assert leaf._version == version
        assert torch.equal(leaf, copy)
