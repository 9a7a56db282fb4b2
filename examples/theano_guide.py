"""Every example of Theano's scan guide, written with ``torchscan.theano``.

Each example keeps the guide's code and names, with Theano's symbolic tensors replaced by
PyTorch tensors and ``theano.function`` by a plain call, prints what the guide prints, and checks
its result against the same computation written as a plain Python loop.

Run it with ``python examples/theano_guide.py``.
"""

from __future__ import annotations

import torch

from torchscan import theano


def same(result: torch.Tensor, loop: list[torch.Tensor] | torch.Tensor) -> None:
    """``result`` equals what the Python loop computed: shape, dtype and every value."""
    expected = torch.stack(loop) if isinstance(loop, list) else loop
    torch.testing.assert_close(result, expected, rtol=0, atol=0)


def a_to_the_k() -> None:
    """Simple loop with accumulation: computing A**k."""

    def power(A, k):
        result, _updates = theano.scan(
            fn=lambda prior_result, A: prior_result * A,
            outputs_info=torch.ones_like(A),
            non_sequences=A,
            n_steps=k,
        )
        return result  # scan has computed A**1 to A**k; the guide keeps result[-1]

    A = torch.arange(10.0)
    print(power(A, 2)[-1])
    print(power(A, 4)[-1])
    for k in (1, 2, 4):
        result, loop = torch.ones_like(A), []
        for _ in range(k):
            result = result * A
            loop.append(result)
        same(power(A, k), loop)


def polynomial() -> None:
    """Iterating over the first dimension of a tensor: calculating a polynomial."""
    max_coefficients_supported = 10000

    def calculate_polynomial(coefficients, x):
        components, _updates = theano.scan(
            fn=lambda coefficient, power, free_variable: coefficient * (free_variable**power),
            outputs_info=None,
            sequences=[coefficients, torch.arange(max_coefficients_supported)],
            non_sequences=x,
        )
        return components

    test_coefficients = torch.tensor([1, 0, 2], dtype=torch.float32)
    test_value = torch.tensor(3.0)
    print(calculate_polynomial(test_coefficients, test_value).sum())
    print(1.0 * (3**0) + 0.0 * (3**1) + 2.0 * (3**2))
    loop = [c * test_value**power for power, c in enumerate(test_coefficients)]
    same(calculate_polynomial(test_coefficients, test_value), loop)


def triangular_numbers() -> None:
    """Simple accumulation into a scalar, ditching lambda."""

    def accumulate_by_adding(arange_val, sum_to_date):
        return sum_to_date + arange_val

    def triangular_sequence(up_to):
        seq = torch.arange(up_to)
        # The initial state has the dtype of the sequence, so no implicit cast is needed.
        outputs_info = torch.tensor(0, dtype=seq.dtype)
        scan_result, _scan_updates = theano.scan(
            fn=accumulate_by_adding, outputs_info=outputs_info, sequences=seq
        )
        return scan_result

    some_num = 15
    print(triangular_sequence(some_num))
    print([n * (n + 1) // 2 for n in range(some_num)])
    total, loop = torch.tensor(0), []
    for n in range(some_num):
        total = total + n
        loop.append(total)
    same(triangular_sequence(some_num), loop)


def set_values_at_positions() -> None:
    """Another simple example: arrays of zeros with values set at given positions."""

    def set_value_at_position(a_location, a_value, output_model):
        zeros = torch.zeros_like(output_model)
        return zeros.index_put((a_location[0:1], a_location[1:2]), a_value.reshape(1))

    def assign_values_at_positions(location, values, output_model):
        result, _updates = theano.scan(
            fn=set_value_at_position,
            outputs_info=None,
            sequences=[location, values],
            non_sequences=output_model,
        )
        return result

    test_locations = torch.tensor([[1, 1], [2, 3]], dtype=torch.int32)
    test_values = torch.tensor([42, 50], dtype=torch.float32)
    test_output_model = torch.zeros((5, 5), dtype=torch.float32)
    result = assign_values_at_positions(test_locations, test_values, test_output_model)
    print(result)
    loop = []
    for (row, column), value in zip(test_locations.tolist(), test_values, strict=True):
        array = torch.zeros((5, 5), dtype=torch.float32)
        array[row, column] = value
        loop.append(array)
    same(result, loop)


def gibbs_sampling() -> None:
    """Using shared variables: Gibbs sampling. Parameters are plain tensors, passed in
    non_sequences (strict=True checks that nothing else is read); torch's random generator
    stands for Theano's RandomStreams."""
    torch.manual_seed(1234)
    W = torch.randn(6, 4)
    bvis, bhid = torch.zeros(6), torch.zeros(4)

    def OneStep(vsample, W, bvis, bhid):
        hmean = torch.sigmoid(vsample @ W + bhid)
        hsample = torch.bernoulli(hmean)
        vmean = torch.sigmoid(hsample @ W.T + bvis)
        return torch.bernoulli(vmean)

    sample = torch.ones(6)
    torch.manual_seed(10)
    values, updates = theano.scan(
        fn=OneStep, outputs_info=sample, non_sequences=[W, bvis, bhid], n_steps=10, strict=True
    )
    print(values[-1])
    assert updates == {}
    torch.manual_seed(10)  # the same random numbers, drawn in the same order
    vsample, loop = sample, []
    for _ in range(10):
        vsample = OneStep(vsample, W, bvis, bhid)
        loop.append(vsample)
    same(values, loop)


def rnn_with_taps() -> None:
    """Multiple outputs, several taps values: recurrent neural network with scan."""
    torch.manual_seed(0)

    def oneStep(u_tm4, u_t, x_tm3, x_tm1, y_tm1, W, W_in_1, W_in_2, W_feedback, W_out):
        x_t = torch.tanh(x_tm1 @ W + u_t @ W_in_1 + u_tm4 @ W_in_2 + y_tm1 @ W_feedback)
        y_t = x_tm3 @ W_out
        return [x_t, y_t]

    W, W_in_1, W_in_2, W_feedback, W_out = (torch.randn(2, 2) * 0.5 for _ in range(5))
    u = torch.arange(9.0)[:, None].repeat(1, 2)  # uvals = [0, 1, ..., 8], as vectors
    x0 = torch.randn(3, 2)  # covers x[-3]
    y0 = torch.randn(2)  # covers y[-1]
    ([x_vals, y_vals], _updates) = theano.scan(
        fn=oneStep,
        sequences={"input": u, "taps": [-4, -0]},
        outputs_info=[{"initial": x0, "taps": [-3, -1]}, y0],
        non_sequences=[W, W_in_1, W_in_2, W_feedback, W_out],
        strict=True,
    )
    print(x_vals.shape, y_vals.shape)
    # uvals[0] stands for u[-4]: the scan starts from uvals[4] and runs 5 steps.
    x, y, x_loop, y_loop = list(x0), y0, [], []
    for t in range(4, 9):
        x_t, y = oneStep(u[t - 4], u[t], x[-3], x[-1], y, W, W_in_1, W_in_2, W_feedback, W_out)
        x.append(x_t)
        x_loop.append(x_t)
        y_loop.append(y)
    same(x_vals, x_loop)
    same(y_vals, y_loop)


def powers_of_two() -> None:
    """Conditional ending of scan: all powers of two smaller than some value."""

    def power_of_2(previous_power, max_value):
        return previous_power * 2, theano.until(previous_power * 2 > max_value)

    def f(max_value):
        values, _ = theano.scan(
            power_of_2, outputs_info=torch.tensor(1.0), non_sequences=max_value, n_steps=1024
        )
        return values

    print(f(torch.tensor(45.0)))
    power, loop = torch.tensor(1.0), []
    for _ in range(1024):
        power = power * 2
        loop.append(power)
        if power > 45.0:
            break
    same(f(torch.tensor(45.0)), loop)


def main() -> None:
    for example in (
        a_to_the_k,
        polynomial,
        triangular_numbers,
        set_values_at_positions,
        gibbs_sampling,
        rnn_with_taps,
        powers_of_two,
    ):
        print(f"-- {example.__doc__.splitlines()[0]}")
        example()


if __name__ == "__main__":
    main()
