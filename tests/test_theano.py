"""``torchscan.theano`` against the Theano scan guide and a loop written by index arithmetic."""

from __future__ import annotations

import hypothesis
import hypothesis.strategies as st
import pytest
import torch

import torchscan
from torchscan import theano

from ._oracles import theano_scan_loop
from .test_scan_errors import errors

_gen = torch.Generator().manual_seed(1)


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen, dtype=torch.float64)


def as_list(outputs) -> list[torch.Tensor]:
    return outputs if isinstance(outputs, list) else [outputs]


def assert_same(actual, expected: list[torch.Tensor]) -> None:
    actual = as_list(actual)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=0)


# -- the guide's examples ----------------------------------------------------------------------


def power_step(prior_result, A):
    return prior_result * A


@pytest.mark.parametrize("k", [2, 4, torch.tensor(4), 0])
def test_guide_a_to_the_k(k) -> None:
    A = torch.arange(10.0)
    result, updates = theano.scan(
        fn=power_step, outputs_info=torch.ones_like(A), non_sequences=A, n_steps=k
    )
    assert updates == {}
    assert result.shape == (int(k), 10)
    if int(k):
        torch.testing.assert_close(result[-1], A ** int(k))
    assert_same(
        result, theano_scan_loop(power_step, [], [torch.ones_like(A)], [A], int(k)) or [result]
    )


def polynomial_term(coefficient, power, free_variable):
    return coefficient * (free_variable**power)


def test_guide_polynomial_stops_at_the_shortest_sequence() -> None:
    coefficients, x = torch.tensor([1.0, 0.0, 2.0]), torch.tensor(3.0)
    components, _ = theano.scan(
        fn=polynomial_term,
        outputs_info=None,
        sequences=[coefficients, torch.arange(10000)],
        non_sequences=x,
    )
    assert components.shape == (3,)
    assert components.sum().item() == 19.0


def accumulate_by_adding(arange_val, sum_to_date):
    return sum_to_date + arange_val


def test_guide_triangular_numbers() -> None:
    seq = torch.arange(15)
    result, _ = theano.scan(
        fn=accumulate_by_adding, outputs_info=torch.tensor(0, dtype=seq.dtype), sequences=seq
    )
    assert result.tolist() == [n * (n + 1) // 2 for n in range(15)]


def set_value_at_position(a_location, a_value, output_model):
    zeros = torch.zeros_like(output_model)
    return zeros.index_put((a_location[0:1], a_location[1:2]), a_value.reshape(1))


def test_guide_set_values_at_positions() -> None:
    locations = torch.tensor([[1, 1], [2, 3]], dtype=torch.int32)
    values = torch.tensor([42.0, 50.0])
    result, _ = theano.scan(
        fn=set_value_at_position,
        outputs_info=None,
        sequences=[locations, values],
        non_sequences=torch.zeros(5, 5),
    )
    expected = torch.zeros(2, 5, 5)
    expected[0, 1, 1], expected[1, 2, 3] = 42.0, 50.0
    torch.testing.assert_close(result, expected, rtol=0, atol=0)


def gibbs_step(vsample, W, bvis, bhid):
    hmean = torch.sigmoid(vsample @ W + bhid)
    hsample = torch.bernoulli(hmean)
    vmean = torch.sigmoid(hsample @ W.T + bvis)
    return torch.bernoulli(vmean)


def test_guide_gibbs_chain_with_random_ops() -> None:
    W, bvis, bhid = randn(6, 4), randn(6), randn(4)
    sample = (torch.rand(6, generator=_gen) > 0.5).double()
    torch.manual_seed(1234)
    values, _ = theano.scan(
        fn=gibbs_step, outputs_info=sample, non_sequences=[W, bvis, bhid], n_steps=10, strict=True
    )
    torch.manual_seed(1234)
    expected = theano_scan_loop(gibbs_step, [], [sample], [W, bvis, bhid], 10)
    assert values.shape == (10, 6)
    assert set(values.unique().tolist()) <= {0.0, 1.0}
    assert_same(values, expected)


def rnn_step(u_tm4, u_t, x_tm3, x_tm1, y_tm1, W, W_in_1, W_in_2, W_feedback, W_out):
    x_t = torch.tanh(x_tm1 @ W + u_t @ W_in_1 + u_tm4 @ W_in_2 + y_tm1 @ W_feedback)
    y_t = x_tm3 @ W_out
    return [x_t, y_t]


def test_guide_rnn_with_taps() -> None:
    n = 3
    weights = [randn(n, n) * 0.5 for _ in range(5)]
    u, x0, y0 = randn(9, n), randn(3, n), randn(n)
    (x_vals, y_vals), _ = theano.scan(
        fn=rnn_step,
        sequences={"input": u, "taps": [-4, -0]},
        outputs_info=[{"initial": x0, "taps": [-3, -1]}, y0],
        non_sequences=weights,
        strict=True,
    )
    # uvals[0] stands for u[-4]: the scan starts at uvals[4] and runs 5 steps.
    assert x_vals.shape == y_vals.shape == (5, n)
    x_prev = [x0[0], x0[1], x0[2]]
    y_prev = y0
    for t in range(5):
        x_t, y_t = rnn_step(u[t], u[t + 4], x_prev[-3], x_prev[-1], y_prev, *weights)
        torch.testing.assert_close(x_vals[t], x_t, rtol=0, atol=0)
        torch.testing.assert_close(y_vals[t], y_t, rtol=0, atol=0)
        x_prev.append(x_t)
        y_prev = y_t


def power_of_2(previous_power, max_value):
    return previous_power * 2, theano.until(previous_power * 2 > max_value)


def test_guide_powers_of_two_until() -> None:
    values, _ = theano.scan(
        power_of_2, outputs_info=torch.tensor(1.0), non_sequences=torch.tensor(45.0), n_steps=1024
    )
    assert values.tolist() == [2.0, 4.0, 8.0, 16.0, 32.0, 64.0]


def test_until_is_torchscan_until() -> None:
    assert theano.until is torchscan.until


# -- taps, n_steps and directions, at random ---------------------------------------------------


@st.composite
def configurations(draw):
    seq_taps = draw(
        st.lists(st.lists(st.integers(-3, 3), min_size=1, max_size=3, unique=True), max_size=2)
    )
    out_taps = draw(
        st.lists(
            st.none() | st.lists(st.integers(-3, -1), min_size=1, max_size=2, unique=True),
            max_size=2,
        )
    )
    hypothesis.assume(seq_taps or any(out_taps))
    length = draw(st.integers(6, 9))  # taps reach 3 back and 3 ahead
    sequences = [{"input": randn(length, 2), "taps": taps} for taps in seq_taps]
    outputs = []
    for taps in out_taps:
        if taps is None:
            outputs.append(None)
        elif taps == [-1] and draw(st.booleans()):
            outputs.append(randn(2))  # a bare initial state: tap -1
        else:
            outputs.append({"initial": randn(-min(taps), 2), "taps": taps})
    available = [length - max(0, -min(t)) - max(0, max(t)) for t in seq_taps]
    n_steps = draw(st.none() | st.integers(0, min(available, default=5)))
    if n_steps is None and not seq_taps:
        n_steps = 3
    if n_steps is not None and draw(st.booleans()):
        n_steps = -n_steps
    return sequences, outputs, n_steps, draw(st.booleans())


def mixing_fn(n_outputs: int):
    def fn(*args):
        total = sum(args[:-1]) * 0.5 + args[-1]
        return [total * (i + 1) + i for i in range(n_outputs)]

    return fn


@hypothesis.given(configurations())
def test_random_taps_equal_the_index_arithmetic(configuration) -> None:
    sequences, outputs, n_steps, go_backwards = configuration
    fn = mixing_fn(max(len(outputs), 1))
    bias = randn(2)
    actual, _ = theano.scan(
        fn, sequences, outputs or None, bias, n_steps=n_steps, go_backwards=go_backwards
    )
    expected = theano_scan_loop(fn, sequences, outputs, [bias], n_steps, go_backwards)
    if not expected:  # no step ran: the outputs are empty
        assert all(a.shape[0] == 0 for a in as_list(actual))
    else:
        assert_same(actual, expected)


def test_go_backwards_reads_the_last_positions_in_reverse() -> None:
    seq = torch.arange(6.0)
    forward, _ = theano.scan(lambda x: x * 1, sequences=seq, n_steps=3)
    backward, _ = theano.scan(lambda x: x * 1, sequences=seq, n_steps=3, go_backwards=True)
    negative, _ = theano.scan(lambda x: x * 1, sequences=seq, n_steps=-3)
    assert forward.tolist() == [0.0, 1.0, 2.0]
    assert backward.tolist() == negative.tolist() == [5.0, 4.0, 3.0]


# -- truncate_gradient -------------------------------------------------------------------------


@pytest.mark.parametrize("go_backwards", [False, True])
@pytest.mark.parametrize("k", [0, 2, 5, 10])
def test_truncate_gradient_backpropagates_through_the_last_k_steps(k: int, go_backwards) -> None:
    weight = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)
    xs = randn(6, 3).requires_grad_()
    h0 = randn(3).requires_grad_()

    def step(x, h):
        return torch.tanh(h * weight + x)

    out, _ = theano.scan(
        step, sequences=xs, outputs_info=h0, truncate_gradient=k, go_backwards=go_backwards
    )
    got = grads(out.sum(), [weight, xs, h0])

    # The same loop by hand: steps before the last k run without gradients.
    order = list(reversed(range(6))) if go_backwards else list(range(6))
    h, outs = h0, []
    for s, t in enumerate(order):
        if s < 6 - k:
            with torch.no_grad():
                h = step(xs[t], h)
        else:
            h = step(xs[t], h.detach() if s == 6 - k else h)
        outs.append(h)
    expected = grads(torch.stack(outs).sum(), [weight, xs, h0])
    for a, e in zip(got, expected, strict=True):
        torch.testing.assert_close(a, e)


def grads(loss: torch.Tensor, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Gradients, zero where none flows (also when nothing flows at all)."""
    if not loss.requires_grad:
        return [torch.zeros_like(t) for t in inputs]
    found = torch.autograd.grad(loss, inputs, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for t, g in zip(inputs, found, strict=True)]


def test_truncate_gradient_keeps_the_values() -> None:
    xs, h0 = randn(6, 3), randn(3)
    full, _ = theano.scan(lambda x, h: h * 0.5 + x, sequences=xs, outputs_info=h0)
    cut, _ = theano.scan(
        lambda x, h: h * 0.5 + x, sequences=xs, outputs_info=h0, truncate_gradient=2
    )
    torch.testing.assert_close(cut, full, rtol=0, atol=0)


# -- map, reduce, folds ------------------------------------------------------------------------


def test_map_reduce_and_folds() -> None:
    xs = torch.arange(1.0, 6.0)
    squares, updates = theano.map(lambda x: x * x, xs)
    assert squares.tolist() == [1.0, 4.0, 9.0, 16.0, 25.0]
    assert updates == {}
    backwards, _ = theano.map(lambda x: x * x, xs, go_backwards=True)
    assert backwards.tolist() == [25.0, 16.0, 9.0, 4.0, 1.0]
    total, _ = theano.reduce(lambda x, acc: acc + x, xs, torch.tensor(0.0))
    assert total.item() == 15.0
    left, _ = theano.foldl(lambda x, acc: acc * 10 + x, xs, torch.tensor(0.0))
    right, _ = theano.foldr(lambda x, acc: acc * 10 + x, xs, torch.tensor(0.0))
    assert left.item() == 12345.0
    assert right.item() == 54321.0
    pair, _ = theano.reduce(
        lambda x, a, b: [a + x, b * x], xs, [torch.tensor(0.0), torch.tensor(1.0)]
    )
    assert [p.item() for p in pair] == [15.0, 120.0]


# -- strict and errors -------------------------------------------------------------------------


def test_strict_names_what_fn_reads_by_closure() -> None:
    A = torch.arange(3.0)
    cell = torch.nn.Linear(3, 3)
    with errors(
        ValueError,
        "torchscan.theano.scan: strict=True, but fn uses tensors that are not among its arguments:",
        "  * A (float32[3] on cpu)",
        "  * cell.weight (float32[3, 3] on cpu)",
        "  * cell.bias (float32[3] on cpu)",
        "Pass them in non_sequences (fn then receives them last), or use strict=False.",
    ):
        theano.scan(lambda p: cell(p * A), outputs_info=torch.ones(3), n_steps=2, strict=True)


def test_strict_accepts_constants_made_inside_fn() -> None:
    out, _ = theano.scan(
        lambda p: p * torch.tensor(2.0) + torch.ones(3),
        outputs_info=torch.ones(3),
        n_steps=2,
        strict=True,
    )
    assert out[-1].tolist() == [7.0, 7.0, 7.0]


def test_updates_are_refused() -> None:
    counter = torch.zeros(())
    with errors(
        TypeError,
        "torchscan.theano.scan: fn returned updates, but PyTorch has no shared variables to "
        "update. Keep that state in outputs_info and return its new value as an output.",
    ):
        theano.scan(lambda x: (x, {counter: counter + 1}), sequences=torch.ones(3))


def test_n_steps_needed_without_sequences() -> None:
    with errors(
        ValueError, "torchscan.theano.scan: n_steps is needed when there are no sequences."
    ):
        theano.scan(lambda p: p, outputs_info=torch.ones(2))


def test_sequences_too_short_for_n_steps() -> None:
    with errors(
        ValueError,
        "torchscan.theano.scan: n_steps=5, but not every sequence is long enough:",
        "  * sequences[1] has 6 elements and taps [-2, 1], so 3 steps",
    ):
        theano.scan(
            lambda a, b, c: a + b + c,
            sequences=[torch.ones(9), {"input": torch.ones(6), "taps": [-2, 1]}],
            n_steps=5,
        )


def test_output_taps_must_be_negative() -> None:
    with errors(
        ValueError,
        "torchscan.theano.scan: the taps of outputs_info[0] must be negative (past values), but "
        "got [-1, 1].",
    ):
        theano.scan(
            lambda x, a, b: a,
            sequences=torch.ones(3),
            outputs_info=[{"initial": torch.ones(2, 1), "taps": [-1, 1]}],
        )


def test_initial_state_must_cover_the_deepest_tap() -> None:
    with errors(
        ValueError,
        "torchscan.theano.scan: outputs_info[0] reads 3 steps back (taps [-3, -1]), so its "
        "initial state needs a leading axis of at least 3 holding those past values, but it "
        "has shape (2, 4).",
    ):
        theano.scan(
            lambda x, a, b: a,
            sequences=torch.ones(3),
            outputs_info=[{"initial": torch.ones(2, 4), "taps": [-3, -1]}],
        )


def test_output_count_must_match_outputs_info() -> None:
    with errors(
        ValueError,
        "torchscan.theano.scan: fn returned 2 outputs, but outputs_info describes 1; give one "
        "entry per output (None for an output that is not fed back).",
    ):
        theano.scan(lambda x, h: [h + x, h], sequences=torch.ones(3), outputs_info=torch.zeros(()))


def test_sequence_must_be_a_tensor() -> None:
    with errors(
        TypeError,
        "torchscan.theano.scan: sequences[0] must be a tensor with a time axis, or a dict with "
        "such a tensor as 'input', but got a list.",
    ):
        theano.scan(lambda x: x, sequences=[[1.0, 2.0]])


def test_n_steps_must_be_an_int() -> None:
    with errors(
        TypeError,
        "torchscan.theano.scan: n_steps must be an int or a 0-d integer tensor, but got a float.",
    ):
        theano.scan(lambda p: p, outputs_info=torch.ones(2), n_steps=2.0)


def test_truncate_gradient_must_be_minus_one_or_more() -> None:
    with errors(
        ValueError,
        "torchscan.theano.scan: truncate_gradient must be -1 (no truncation) or a number of "
        "steps >= 0, but got -2.",
    ):
        theano.scan(lambda x: x, sequences=torch.ones(3), truncate_gradient=-2)
