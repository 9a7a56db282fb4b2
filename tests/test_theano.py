"""``torchscan.theano`` against the Theano scan guide and loops written by hand from it."""

from __future__ import annotations

import hypothesis
import hypothesis.strategies as st
import numpy as np
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
    """Exactly equal, shapes and dtypes included."""
    actual = as_list(actual)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=0)


# -- the guide's examples ----------------------------------------------------------------------


def power_step(prior_result, A):
    return prior_result * A


@pytest.mark.parametrize("k", [2, 4, torch.tensor(4), np.int64(3), np.array(3), 0, torch.tensor(0)])
def test_guide_a_to_the_k(k) -> None:
    A = torch.arange(10.0)
    result, updates = theano.scan(
        fn=power_step, outputs_info=torch.ones_like(A), non_sequences=A, n_steps=k
    )
    # result = 1; for i in range(k): result = result * A  -- keeping every value
    value, rows = torch.ones_like(A), []
    for _ in range(int(k)):
        value = value * A
        rows.append(value)
    expected = torch.stack(rows) if rows else torch.ones(0, 10)
    assert updates == {}
    assert_same(result, [expected])


def test_guide_a_to_the_k_prints_the_guides_values() -> None:
    A = torch.arange(10.0)
    squares, _ = theano.scan(
        power_step, outputs_info=torch.ones_like(A), non_sequences=A, n_steps=2
    )
    fourth, _ = theano.scan(power_step, outputs_info=torch.ones_like(A), non_sequences=A, n_steps=4)
    assert squares[-1].tolist() == [0.0, 1.0, 4.0, 9.0, 16.0, 25.0, 36.0, 49.0, 64.0, 81.0]
    assert fourth[-1].tolist() == [
        0.0,
        1.0,
        16.0,
        81.0,
        256.0,
        625.0,
        1296.0,
        2401.0,
        4096.0,
        6561.0,
    ]


def polynomial_term(coefficient, power, free_variable):
    return coefficient * (free_variable**power)


@pytest.mark.parametrize("n_coefficients", [0, 1, 3, 7])
def test_guide_polynomial_stops_at_the_shortest_sequence(n_coefficients: int) -> None:
    coefficients, x = randn(n_coefficients), torch.tensor(1.5, dtype=torch.float64)
    components, _ = theano.scan(
        fn=polynomial_term,
        outputs_info=None,
        sequences=[coefficients, torch.arange(10000)],
        non_sequences=x,
    )
    terms = [coefficients[p] * x**p for p in range(n_coefficients)]
    expected = torch.stack(terms) if terms else torch.ones(0, dtype=torch.float64)
    assert_same(components, [expected])


def test_guide_polynomial_prints_19() -> None:
    components, _ = theano.scan(
        fn=polynomial_term,
        outputs_info=None,
        sequences=[torch.tensor([1.0, 0.0, 2.0]), torch.arange(10000)],
        non_sequences=torch.tensor(3.0),
    )
    assert components.sum().item() == 1.0 * (3**0) + 0.0 * (3**1) + 2.0 * (3**2) == 19.0


def accumulate_by_adding(arange_val, sum_to_date):
    return sum_to_date + arange_val


def test_guide_triangular_numbers() -> None:
    seq = torch.arange(15)
    result, _ = theano.scan(
        fn=accumulate_by_adding, outputs_info=torch.tensor(0, dtype=seq.dtype), sequences=seq
    )
    total, expected = torch.tensor(0), []
    for n in seq:
        total = accumulate_by_adding(n, total)
        expected.append(total)
    assert_same(result, [torch.stack(expected)])
    assert result.tolist() == [n * (n + 1) // 2 for n in range(15)]  # the guide's check


def set_value_at_position(a_location, a_value, output_model):
    zeros = torch.zeros_like(output_model)
    return zeros.index_put((a_location[0:1], a_location[1:2]), a_value.reshape(1))


def test_guide_set_values_at_positions() -> None:
    locations = torch.tensor([[1, 1], [2, 3]], dtype=torch.int32)
    values = torch.tensor([42.0, 50.0])
    model = torch.zeros(5, 5)
    result, _ = theano.scan(
        fn=set_value_at_position,
        outputs_info=None,
        sequences=[locations, values],
        non_sequences=model,
    )
    expected = []
    for (row, col), value in zip(locations.tolist(), values.tolist(), strict=True):
        array = torch.zeros(5, 5)
        array[row, col] = value
        expected.append(array)
    assert_same(result, [torch.stack(expected)])


def gibbs_step(vsample, W, bvis, bhid):
    hmean = torch.sigmoid(vsample @ W + bhid)
    hsample = torch.bernoulli(hmean)
    vmean = torch.sigmoid(hsample @ W.T + bvis)
    return torch.bernoulli(vmean)


@pytest.mark.parametrize("strict", [False, True])
def test_guide_gibbs_chain_with_random_ops(strict: bool) -> None:
    W, bvis, bhid = randn(6, 4), randn(6), randn(4)
    sample = (torch.rand(6, generator=_gen) > 0.5).double()
    torch.manual_seed(1234)
    values, updates = theano.scan(
        fn=gibbs_step, outputs_info=sample, non_sequences=[W, bvis, bhid], n_steps=10, strict=strict
    )
    torch.manual_seed(1234)
    v, expected = sample, []
    for _ in range(10):
        v = gibbs_step(v, W, bvis, bhid)
        expected.append(v)
    assert updates == {}
    assert_same(values, [torch.stack(expected)])
    assert set(values.unique().tolist()) <= {0.0, 1.0}


def test_guide_gibbs_chain_reading_its_parameters_by_closure() -> None:
    """The guide's first version: W, bvis and bhid are not passed (allowed without strict)."""
    W, bvis, bhid = randn(6, 4), randn(6), randn(4)

    def one_step(vsample):
        return gibbs_step(vsample, W, bvis, bhid)

    sample = torch.ones(6, dtype=torch.float64)
    torch.manual_seed(5)
    values, _ = theano.scan(one_step, outputs_info=sample, n_steps=10)
    torch.manual_seed(5)
    v, expected = sample, []
    for _ in range(10):
        v = one_step(v)
        expected.append(v)
    assert_same(values, [torch.stack(expected)])


def rnn_step(u_tm4, u_t, x_tm3, x_tm1, y_tm1, W, W_in_1, W_in_2, W_feedback, W_out):
    x_t = torch.tanh(x_tm1 @ W + u_t @ W_in_1 + u_tm4 @ W_in_2 + y_tm1 @ W_feedback)
    y_t = x_tm3 @ W_out
    return [x_t, y_t]


def test_guide_rnn_with_taps() -> None:
    n = 3
    weights = [randn(n, n) * 0.5 for _ in range(5)]
    u = torch.arange(9.0, dtype=torch.float64)[:, None].repeat(1, n)  # the guide's uvals
    x0, y0 = randn(3, n), randn(n)
    (x_vals, y_vals), _ = theano.scan(
        fn=rnn_step,
        sequences={"input": u, "taps": [-4, -0]},
        outputs_info=[{"initial": x0, "taps": [-3, -1]}, y0],
        non_sequences=weights,
        strict=True,
    )
    # "scan will consider uvals[0] as u[-4], and will start scanning from uvals[4]"
    xs, y_prev, x_out, y_out = [x0[0], x0[1], x0[2]], y0, [], []
    for t in range(4, 9):
        x_t, y_t = rnn_step(u[t - 4], u[t], xs[-3], xs[-1], y_prev, *weights)
        xs.append(x_t)
        y_prev = y_t
        x_out.append(x_t)
        y_out.append(y_t)
    assert_same([x_vals, y_vals], [torch.stack(x_out), torch.stack(y_out)])


def power_of_2(previous_power, max_value):
    return previous_power * 2, theano.until(previous_power * 2 > max_value)


@pytest.mark.parametrize("max_value", [45.0, 0.5, 2.0, 1e9])
def test_guide_powers_of_two_until(max_value: float) -> None:
    values, _ = theano.scan(
        power_of_2,
        outputs_info=torch.tensor(1.0),
        non_sequences=torch.tensor(max_value),
        n_steps=20,
    )
    power, expected = 1.0, []
    for _ in range(20):  # n_steps is the most steps
        power *= 2
        expected.append(power)
        if power > max_value:
            break
    assert values.tolist() == expected
    if max_value == 45.0:
        assert values.tolist() == [2.0, 4.0, 8.0, 16.0, 32.0, 64.0]  # the guide's output


def test_until_is_torchscan_until() -> None:
    assert theano.until is torchscan.until


def test_until_takes_a_python_bool() -> None:
    values, _ = theano.scan(lambda x: (x * 2, theano.until(bool(x > 2))), sequences=torch.arange(6))
    assert values.tolist() == [0, 2, 4, 6]


# -- taps, n_steps, directions and until, at random, against the guide's loop -------------------


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
    sequences = [
        {"input": randn(draw(st.integers(0, 9)), 2), "taps": taps} for taps in seq_taps
    ]  # lengths from 0: some are too short for their taps
    outputs = []
    for taps in out_taps:
        if taps is None:
            outputs.append(None)
        elif taps == [-1] and draw(st.booleans()):
            outputs.append(randn(2))  # a bare initial state: tap -1
        else:
            depth = () if taps == [-1] else (-min(taps),)  # tap -1 alone: no extra axis
            outputs.append({"initial": randn(*depth, 2), "taps": taps})
    n_steps = draw(st.none() | st.integers(-9, 9)) if seq_taps else draw(st.integers(-5, 5))
    stop_above = draw(st.none() | st.floats(-2.0, 6.0))
    return sequences, outputs, n_steps, draw(st.booleans()), stop_above


def mixing_fn(n_outputs: int, stop_above: float | None):
    def fn(*args):
        total = sum(args[:-1]) * 0.5 + args[-1]
        outputs = [total * (i + 1) + i for i in range(n_outputs)]
        if stop_above is None:
            return outputs
        return outputs, theano.until(total.sum() > stop_above)

    return fn


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(configurations())
def test_random_taps_equal_the_guides_loop(configuration) -> None:
    sequences, outputs, n_steps, go_backwards, stop_above = configuration
    fn = mixing_fn(max(len(outputs), 1), stop_above)
    bias = randn(2)
    try:
        expected = theano_scan_loop(fn, sequences, outputs, [bias], n_steps, go_backwards)
    except ValueError as error:  # a sequence too short: the scan must refuse it, naming it
        expected, short = None, str(error).split()[0]
    if expected is None:
        with pytest.raises(ValueError, match=r"sequences\[\d\] has \d elements? and taps") as info:
            theano.scan(
                fn, sequences, outputs or None, bias, n_steps=n_steps, go_backwards=go_backwards
            )
        assert f"* {short} has" in str(info.value)
        return
    actual, _ = theano.scan(
        fn, sequences, outputs or None, bias, n_steps=n_steps, go_backwards=go_backwards
    )
    if not expected:  # no step ran: every output is empty, with the shape of one step
        assert all(a.shape == (0, 2) and a.dtype == torch.float64 for a in as_list(actual))
    else:
        assert_same(actual, expected)


def test_go_backwards_reads_the_last_positions_in_reverse() -> None:
    seq = torch.arange(6.0)
    forward, _ = theano.scan(lambda x: x * 1, sequences=seq, n_steps=3)
    backward, _ = theano.scan(lambda x: x * 1, sequences=seq, n_steps=3, go_backwards=True)
    negative, _ = theano.scan(lambda x: x * 1, sequences=seq, n_steps=-3)
    both, _ = theano.scan(lambda x: x * 1, sequences=seq, n_steps=-3, go_backwards=True)
    assert forward.tolist() == both.tolist() == [0.0, 1.0, 2.0]
    assert backward.tolist() == negative.tolist() == [5.0, 4.0, 3.0]


def test_sequence_taps_none_are_tap_zero() -> None:
    u = torch.arange(5.0)
    given, _ = theano.scan(lambda a: a * 2, sequences={"input": u, "taps": None})
    missing, _ = theano.scan(lambda a: a * 2, sequences={"input": u})
    assert given.tolist() == missing.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]


def test_output_dicts_follow_the_reference() -> None:
    """Without taps an initial state is tap -1; ``dict(initial=Output2, taps=None)`` (the
    reference's example) passes no past value; a dict without initial is not fed back."""
    xs = torch.arange(3.0)
    fed, _ = theano.scan(lambda x, h: h + x, sequences=xs, outputs_info={"initial": torch.ones(())})
    assert fed.tolist() == [1.0, 2.0, 4.0]
    for info in ({"initial": torch.ones(()), "taps": None}, {}, {"taps": None}):
        unfed, _ = theano.scan(lambda x: x + 1, sequences=xs, outputs_info=[info])
        assert unfed.tolist() == [1.0, 2.0, 3.0]


def test_numpy_inputs_are_tensors() -> None:
    """As in Theano, numpy arrays and integers are accepted where tensors and ints are."""
    out, _ = theano.scan(
        lambda x, h: h + x,
        sequences=[np.arange(4.0)],
        outputs_info=np.float64(1.0),
        n_steps=np.int32(3),
    )
    assert out.dtype == torch.float64
    assert out.tolist() == [1.0, 2.0, 4.0]
    power, _ = theano.scan(lambda p: p * 2, outputs_info=torch.tensor(1), n_steps=np.array(4))
    assert power.tolist() == [2, 4, 8, 16]


def test_an_empty_dict_of_updates_is_no_update() -> None:
    out, updates = theano.scan(
        lambda x, h: ([h + x], {}), sequences=torch.ones(3), outputs_info=torch.zeros(())
    )
    assert out.tolist() == [1.0, 2.0, 3.0]
    assert updates == {}


# -- truncate_gradient -------------------------------------------------------------------------


def grads(loss: torch.Tensor, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Gradients, zero where none flows (also when nothing flows at all)."""
    if not loss.requires_grad:
        return [torch.zeros_like(t) for t in inputs]
    found = torch.autograd.grad(loss, inputs, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for t, g in zip(inputs, found, strict=True)]


def truncated_by_hand(step, h0, xs, k: int, stops=None) -> torch.Tensor:
    """Truncated BPTT written out: run the steps (until ``stops``); then the last ``k`` that ran
    again from the state before them, detached; the earlier outputs without gradients."""
    h, values = h0, []
    with torch.no_grad():
        for x in xs:
            h = step(x, h)
            values.append(h)
            if stops is not None and stops(h):
                break
    ran = len(values)
    start = max(ran - k, 0)
    h = h0 if start == 0 else values[start - 1].detach()
    tail = []
    for x in xs[start:ran]:
        h = step(x, h)
        tail.append(h)
    return torch.stack([*values[:start], *tail])


@pytest.mark.parametrize("go_backwards", [False, True])
@pytest.mark.parametrize("k", [0, 1, 2, 5, 6, 10])
def test_truncate_gradient_backpropagates_through_the_last_k_steps(k: int, go_backwards) -> None:
    weight = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)
    xs = randn(6, 3).requires_grad_()
    h0 = randn(3).requires_grad_()

    def step(x, h):
        return torch.tanh(h * weight + x)

    out, _ = theano.scan(
        step, sequences=xs, outputs_info=h0, truncate_gradient=k, go_backwards=go_backwards
    )
    order = xs.flip(0) if go_backwards else xs
    expected = truncated_by_hand(step, h0, list(order), k)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    for a, e in zip(
        grads(out.sum(), [weight, xs, h0]), grads(expected.sum(), [weight, xs, h0]), strict=True
    ):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("n_steps", [6, torch.tensor(6)])
@pytest.mark.parametrize("k", [0, 2, 6])
def test_truncate_gradient_without_sequences(k: int, n_steps) -> None:
    A = randn(3).requires_grad_()
    h0 = randn(3).requires_grad_()

    def step(h, A):
        return torch.tanh(h * A + 0.1)

    out, _ = theano.scan(
        step, outputs_info=h0, non_sequences=A, n_steps=n_steps, truncate_gradient=k
    )
    expected = truncated_by_hand(lambda _, h: step(h, A), h0, [None] * 6, k)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    for a, e in zip(grads(out.sum(), [A, h0]), grads(expected.sum(), [A, h0]), strict=True):
        torch.testing.assert_close(a, e)
    if k < 6:
        assert grads(out.sum(), [h0])[0].abs().sum() == 0


@pytest.mark.parametrize("go_backwards", [False, True])
@pytest.mark.parametrize("stop_at", [0, 1, 3, 7, None])  # the step after which until stops
@pytest.mark.parametrize("k", [0, 1, 3, 5])
def test_truncate_gradient_counts_back_from_the_steps_that_ran(k, stop_at, go_backwards) -> None:
    w = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    xs = (randn(10).abs() * 0.1).requires_grad_()
    if stop_at is not None:  # a big element where the scan should stop
        position = 9 - stop_at if go_backwards else stop_at
        xs = xs.detach().index_fill(0, torch.tensor(position), 5.0).requires_grad_()
    h0 = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)

    def step(x, h):
        return h * w + x

    out, _ = theano.scan(
        lambda x, h: (step(x, h), theano.until(x > 1)),
        sequences=xs,
        outputs_info=h0,
        truncate_gradient=k,
        go_backwards=go_backwards,
    )
    order = list(xs.flip(0) if go_backwards else xs)
    ran = 10 if stop_at is None else stop_at + 1
    expected = truncated_by_hand(step, h0, order[:ran], k)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    for a, e in zip(grads(out.sum(), [xs, w, h0]), grads(expected.sum(), [xs, w, h0]), strict=True):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("k", [0, 1, 3, 9])
def test_truncate_gradient_with_until_and_no_sequences(k: int) -> None:
    w = torch.tensor(1.5, dtype=torch.float64, requires_grad=True)
    h0 = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)

    def step(h):
        return h * w

    out, _ = theano.scan(
        lambda h: (step(h), theano.until(step(h) > 7.0)),
        outputs_info=h0,
        n_steps=10,
        truncate_gradient=k,
    )
    expected = truncated_by_hand(lambda _, h: step(h), h0, [None] * 10, k, stops=lambda h: h > 7.0)
    assert len(expected) == 5  # 1.5**5 > 7: stops in step 4
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    for a, e in zip(grads(out.sum(), [w, h0]), grads(expected.sum(), [w, h0]), strict=True):
        torch.testing.assert_close(a, e)


def test_truncate_gradient_with_output_taps_cuts_the_whole_window() -> None:
    xs = randn(7).requires_grad_()
    init = randn(2).requires_grad_()
    w = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)

    def f(x, a, b, w):
        return torch.tanh(a * w + b * 0.5 + x)

    out, _ = theano.scan(
        f,
        sequences=xs,
        outputs_info={"initial": init, "taps": [-2, -1]},
        non_sequences=w,
        truncate_gradient=3,
    )
    history, expected = [init[0], init[1]], []
    for s in range(7):
        if s == 4:  # the window's first step reads a detached history
            history = [v.detach() for v in history]
        if s < 4:
            with torch.no_grad():
                value = f(xs[s], history[-2], history[-1], w)
        else:
            value = f(xs[s], history[-2], history[-1], w)
        history.append(value)
        expected.append(value)
    expected = torch.stack(expected)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    for a, e in zip(
        grads(out.sum(), [xs, init, w]), grads(expected.sum(), [xs, init, w]), strict=True
    ):
        torch.testing.assert_close(a, e)


def test_truncate_gradient_keeps_the_values() -> None:
    xs, h0 = randn(6, 3), randn(3).requires_grad_()
    full, _ = theano.scan(lambda x, h: h * 0.5 + x, sequences=xs, outputs_info=h0)
    cut, _ = theano.scan(
        lambda x, h: h * 0.5 + x, sequences=xs, outputs_info=h0, truncate_gradient=2
    )
    h, expected = h0.detach(), []
    for x in xs:
        h = h * 0.5 + x
        expected.append(h)
    assert_same([full.detach(), cut.detach()], [torch.stack(expected)] * 2)


# -- map, reduce, folds ------------------------------------------------------------------------


def test_map_reduce_and_folds_equal_python_loops() -> None:
    xs = randn(5)
    squares, updates = theano.map(lambda x: x * x, xs)
    assert updates == {}
    assert_same(squares, [torch.stack([x * x for x in xs])])
    backwards, _ = theano.map(lambda x: x * x, xs, go_backwards=True)
    assert_same(backwards, [torch.stack([x * x for x in reversed(list(xs))])])

    def digits(x, acc):
        return acc * 10 + x

    total = torch.tensor(0.0, dtype=torch.float64)
    for x in xs:
        total = digits(x, total)
    left, _ = theano.foldl(digits, xs, torch.tensor(0.0, dtype=torch.float64))
    reduced, _ = theano.reduce(digits, xs, torch.tensor(0.0, dtype=torch.float64))
    assert_same([left, reduced], [total, total])
    total = torch.tensor(0.0, dtype=torch.float64)
    for x in reversed(list(xs)):
        total = digits(x, total)
    right, _ = theano.foldr(digits, xs, torch.tensor(0.0, dtype=torch.float64))
    assert_same(right, [total])
    pair, _ = theano.reduce(
        lambda x, a, b: [a + x, b * x],
        xs,
        [torch.tensor(0.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)],
    )
    a, b = torch.tensor(0.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)
    for x in xs:
        a, b = a + x, b * x
    assert_same(pair, [a, b])


@pytest.mark.parametrize("fold", [theano.reduce, theano.foldl, theano.foldr])
def test_folds_over_no_element_give_the_initial_value(fold) -> None:
    """Python's reduce and Haskell's folds: no element gives the initial value back."""
    z = torch.tensor(7.0)
    value, _ = fold(lambda x, acc: acc + x, torch.zeros(0), z)
    assert_same(value, [z])
    window = torch.tensor([1.0, 2.0, 3.0])  # taps [-2, -1]: window[1] is output[-1]
    value, _ = fold(
        lambda x, a, b: a + b + x, torch.zeros(0), {"initial": window, "taps": [-2, -1]}
    )
    assert_same(value, [torch.tensor(2.0)])
    value, _ = fold(lambda x, a, b: a + b + x, torch.ones(3), {"initial": window, "taps": [-2, -1]})
    a, b = window[0], window[1]
    for _ in range(3):
        a, b = b, a + b + 1
    assert_same(value, [b])


def test_reduce_over_no_element_without_an_initial_value() -> None:
    with errors(
        ValueError,
        "torchscan.theano.foldr: no step runs (the sequences have no element to reduce), so "
        "output 1 has no value: outputs_info[1] is None, so it is not fed back and has no "
        "initial value either. Give it an initial state, which is then the result.",
    ):
        theano.foldr(lambda x, acc: [acc + x, x * 2], torch.zeros(0), [torch.tensor(0.0), None])


# -- strict ------------------------------------------------------------------------------------


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
    ) as info:
        theano.scan(lambda p: cell(p * A), outputs_info=torch.ones(3), n_steps=2, strict=True)
    assert type(info.value) is torchscan.TorchscanValueError


W = torch.tensor(2.0)


@pytest.mark.parametrize(
    ("name", "fn", "kwargs"),
    [
        # read only from step 2 on: every step is checked
        (
            "later step",
            lambda x, h: h + (x * W if x > 1 else x),
            {"outputs_info": torch.tensor(0.0)},
        ),
        (
            "backwards",
            lambda x, h: h + x * W,
            {"outputs_info": torch.tensor(0.0), "go_backwards": True},
        ),
        (
            "truncated",
            lambda x, h: h + x * W,
            {"outputs_info": torch.tensor(0.0), "truncate_gradient": 2},
        ),
        ("until", lambda x: (x * W, theano.until(x > 2)), {}),
        ("item", lambda x: x * W.item(), {}),
        ("condition", lambda x: torch.where(W > 1, x, -x), {}),
        ("zero steps", lambda x: x * W, {"n_steps": 0}),
    ],
)
def test_strict_refuses_a_global_wherever_fn_reads_it(name, fn, kwargs) -> None:
    with errors(
        ValueError,
        "torchscan.theano.scan: strict=True, but fn uses tensors that are not among its arguments:",
        "  * W (float32[] on cpu)",
        "Pass them in non_sequences (fn then receives them last), or use strict=False.",
    ) as info:
        theano.scan(fn, sequences=torch.arange(5.0), strict=True, **kwargs)
    assert type(info.value) is torchscan.TorchscanValueError


class Stepper(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(()))
        self.offset = torch.tensor(1.0)  # a plain tensor attribute

    def step(self, x):
        return x * self.weight + self.offset


def test_strict_names_what_a_bound_method_reads_from_self() -> None:
    with errors(
        ValueError,
        "torchscan.theano.scan: strict=True, but fn uses tensors that are not among its arguments:",
        "  * self.weight (float32[] on cpu)",
        "  * self.offset (float32[] on cpu)",
        "Pass them in non_sequences (fn then receives them last), or use strict=False.",
    ):
        theano.scan(Stepper().step, sequences=torch.arange(3.0), strict=True)


def test_strict_without_sequences_and_zero_steps() -> None:
    with errors(
        ValueError,
        "torchscan.theano.scan: strict=True, but fn uses tensors that are not among its arguments:",
        "  * W (float32[] on cpu)",
        "Pass them in non_sequences (fn then receives them last), or use strict=False.",
    ):
        theano.scan(lambda h: h * W, outputs_info=torch.tensor(1.0), n_steps=0, strict=True)


def test_strict_counts_a_sequence_as_passed_through_its_slices_only() -> None:
    u = torch.arange(4.0)
    with errors(
        ValueError,
        "torchscan.theano.scan: strict=True, but fn uses tensors that are not among its arguments:",
        "  * u (float32[4] on cpu)",
        "Pass them in non_sequences (fn then receives them last), or use strict=False.",
    ):
        theano.scan(lambda x: x * u.sum(), sequences=u, strict=True)
    out, _ = theano.scan(lambda x, u: x * u.sum(), sequences=u, non_sequences=u, strict=True)
    assert out.tolist() == [0.0, 6.0, 12.0, 18.0]


def test_strict_accepts_modules_and_nested_tensors_in_non_sequences() -> None:
    torch.manual_seed(0)
    cell = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2).eval())
    cell.scale = torch.tensor(3.0)  # a plain tensor attribute

    def fn(x, h, cell, extra):
        return torch.tanh(cell(x[None] + h[None])[0] * cell.scale + extra["bias"][0])

    xs, h0, extra = torch.randn(4, 2), torch.zeros(2), {"bias": [torch.ones(2)]}
    out, _ = theano.scan(
        fn, sequences=xs, outputs_info=h0, non_sequences=[cell, extra], strict=True
    )
    h, expected = h0, []
    with torch.no_grad():
        for x in xs:
            h = fn(x, h, cell, extra)
            expected.append(h)
    torch.testing.assert_close(out.detach(), torch.stack(expected), rtol=0, atol=0)


def test_strict_accepts_constants_made_inside_fn() -> None:
    out, _ = theano.scan(
        lambda p: (
            p * torch.tensor(2.0) + torch.ones(3) - torch.as_tensor(1.0) + torch.full((), 1.0)
        ),
        outputs_info=torch.ones(3),
        n_steps=2,
        strict=True,
    )
    assert out[-1].tolist() == [7.0, 7.0, 7.0]


def test_strict_cannot_see_tensors_made_from_numpy_inside_fn() -> None:
    """Documented: torch does not report torch.from_numpy to the check."""
    with pytest.raises(ValueError, match=r"strict=True, .*\n  \* a tensor float64\[\] on cpu"):
        theano.scan(
            lambda x: x * torch.from_numpy(np.array(2.0)), sequences=torch.arange(3.0), strict=True
        )


# -- errors ------------------------------------------------------------------------------------


def test_updates_are_refused() -> None:
    counter = torch.zeros(())
    with errors(
        TypeError,
        "torchscan.theano.scan: fn returned updates, but PyTorch has no shared variables to "
        "update. Keep that state in outputs_info and return its new value as an output.",
    ) as info:
        theano.scan(lambda x: (x, {counter: counter + 1}), sequences=torch.ones(3))
    assert type(info.value) is torchscan.TorchscanTypeError


def test_n_steps_needed_without_sequences() -> None:
    with errors(
        ValueError, "torchscan.theano.scan: n_steps is needed when there are no sequences."
    ):
        theano.scan(lambda p: p, outputs_info=torch.ones(2))


@pytest.mark.parametrize("go_backwards", [False, True])
def test_sequence_too_short_for_its_taps(go_backwards: bool) -> None:
    with errors(
        ValueError,
        "torchscan.theano.scan: n_steps is not given, so the scan runs as many steps as the "
        "shortest sequence allows, but a sequence is too short for its taps:",
        "  * sequences[0] has 3 elements and taps [-4], which read 4 elements before the first "
        "step and 0 after the last, so it needs at least 4 elements (4 + 0 + one per step)",
    ):
        theano.scan(
            lambda a, h: h + a,
            sequences={"input": torch.arange(3.0), "taps": [-4]},
            outputs_info=torch.tensor(0.0),
            go_backwards=go_backwards,
        )


def test_several_sequences_too_short_for_their_taps() -> None:
    with errors(
        ValueError,
        "torchscan.theano.scan: n_steps is not given, so the scan runs as many steps as the "
        "shortest sequence allows, but a sequence is too short for its taps:",
        "  * sequences[1] has 2 elements and taps [-1, 2], which read 1 element before the "
        "first step and 2 after the last, so it needs at least 3 elements (1 + 2 + one per step)",
        "  * sequences[2] has 0 elements and taps [1], which read 0 elements before the first "
        "step and 1 after the last, so it needs at least 1 element (0 + 1 + one per step)",
    ):
        theano.scan(
            lambda a, b, c, d: a + b + c + d,
            sequences=[
                torch.ones(9),
                {"input": torch.ones(2), "taps": [-1, 2]},
                {"input": torch.ones(0), "taps": 1},
            ],
        )


def test_a_sequence_exactly_as_long_as_its_taps_reach_gives_zero_steps() -> None:
    out, _ = theano.scan(
        lambda a, b: a + b, sequences={"input": torch.arange(4.0), "taps": [-4, 0]}
    )
    assert out.shape == (0,)


@pytest.mark.parametrize("n_steps", [5, -5])
def test_sequences_too_short_for_n_steps(n_steps: int) -> None:
    with errors(
        ValueError,
        f"torchscan.theano.scan: n_steps={n_steps}, but not every sequence is long enough:",
        "  * sequences[1] has 6 elements and taps [-2, 1], which read 2 elements before the "
        "first step and 1 after the last, so 5 steps need 2 + 1 + 5 = 8 elements",
    ):
        theano.scan(
            lambda a, b, c: a + b + c,
            sequences=[torch.ones(9), {"input": torch.ones(6), "taps": [-2, 1]}],
            n_steps=n_steps,
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


def test_output_taps_must_differ() -> None:
    with errors(
        ValueError,
        "torchscan.theano.scan: the taps of outputs_info[0] must each read a different past "
        "step, but -1 appears more than once in [-2, -1, -1].",
    ):
        theano.scan(
            lambda a, b, c: a + b + c,
            outputs_info={"initial": torch.ones(2), "taps": [-2, -1, -1]},
            n_steps=3,
        )


@pytest.mark.parametrize(
    ("where", "kwargs"),
    [
        ("sequences[0]", {"sequences": {"input": torch.ones(3), "taps": []}}),
        (
            "outputs_info[0]",
            {"sequences": torch.ones(3), "outputs_info": {"initial": torch.ones(()), "taps": []}},
        ),
    ],
)
def test_taps_must_not_be_empty(where: str, kwargs) -> None:
    with errors(
        ValueError,
        f"torchscan.theano.scan: {where} has no taps ([]); give at least one, or leave taps out "
        "for the default.",
    ):
        theano.scan(lambda *args: args[0], **kwargs)


def test_taps_must_be_ints() -> None:
    with errors(
        TypeError, "torchscan.theano.scan: the taps of sequences[0] must be ints, but got [0.5]."
    ):
        theano.scan(lambda x: x, sequences={"input": torch.ones(3), "taps": [0.5]})


def test_output_taps_need_an_initial_state() -> None:
    with errors(
        ValueError,
        "torchscan.theano.scan: outputs_info[0] has taps [-2] but no initial state; the past "
        "values the taps read before step 0 come from 'initial'. Give it, or drop 'taps' for an "
        "output that is not fed back.",
    ):
        theano.scan(lambda x: x, sequences=torch.ones(3), outputs_info={"taps": [-2]})


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


def test_initial_state_must_be_a_tensor() -> None:
    with errors(
        TypeError,
        "torchscan.theano.scan: the initial state of outputs_info[0] must be a tensor, but got "
        "a float.",
    ):
        theano.scan(lambda x, h: h + x, sequences=torch.ones(3), outputs_info=[0.0])


@pytest.mark.parametrize("n_steps", [None, 0])  # 0: fn only runs on fake tensors
def test_output_count_must_match_outputs_info(n_steps) -> None:
    with errors(
        ValueError,
        "torchscan.theano.scan: fn returned 2 outputs, but outputs_info describes 1; give one "
        "entry per output (None for an output that is not fed back).",
    ) as info:
        theano.scan(
            lambda x, h: [h + x, h],
            sequences=torch.ones(3),
            outputs_info=torch.zeros(()),
            n_steps=n_steps,
        )
    assert type(info.value) is torchscan.TorchscanValueError


@pytest.mark.parametrize(
    ("fn", "returned"),
    [
        (lambda x, h: (theano.until(x > 1), h + x), "(until(...), a tensor)"),
        (lambda x, h: [h + x, theano.until(x > 1)], "[a tensor, until(...)]"),
        (lambda x, h: ([h + x], theano.until(x > 1), {}), "([a tensor], until(...), a dict)"),
    ],
)
def test_until_must_be_returned_last(fn, returned: str) -> None:
    with errors(
        ValueError,
        "torchscan.theano.scan: until(stop) must be the last thing fn returns, after its "
        f"outputs: return (outputs, theano.until(stop)), but fn returned {returned}.",
    ):
        theano.scan(fn, sequences=torch.ones(3), outputs_info=torch.zeros(()))


def test_sequence_must_be_a_tensor() -> None:
    with errors(
        TypeError,
        "torchscan.theano.scan: sequences[0] must be a tensor with a time axis, or a dict with "
        "such a tensor as 'input', but got a list.",
    ):
        theano.scan(lambda x: x, sequences=[[1.0, 2.0]])


def test_fn_must_be_callable() -> None:
    with errors(TypeError, "torchscan.theano.scan: fn must be callable, but got an int."):
        theano.scan(3, sequences=torch.ones(3))


@pytest.mark.parametrize(
    ("n_steps", "got"),
    [
        (2.0, "a float"),
        (True, "a bool"),
        (torch.ones(2, dtype=torch.int64), "int64[2] on cpu"),
        (torch.tensor(2.0), "float32[] on cpu"),
    ],
)
def test_n_steps_must_be_an_int(n_steps, got: str) -> None:
    with errors(
        TypeError,
        f"torchscan.theano.scan: n_steps must be an int or a 0-d integer tensor, but got {got}.",
    ):
        theano.scan(lambda p: p, outputs_info=torch.ones(2), n_steps=n_steps)


def test_truncate_gradient_must_be_an_int() -> None:
    with errors(
        TypeError, "torchscan.theano.scan: truncate_gradient must be an int, but got True."
    ):
        theano.scan(lambda x: x, sequences=torch.ones(3), truncate_gradient=True)


def test_truncate_gradient_must_be_minus_one_or_more() -> None:
    with errors(
        ValueError,
        "torchscan.theano.scan: truncate_gradient must be -1 (no truncation) or a number of "
        "steps >= 0, but got -2.",
    ):
        theano.scan(lambda x: x, sequences=torch.ones(3), truncate_gradient=-2)
