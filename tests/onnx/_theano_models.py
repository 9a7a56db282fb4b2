"""Models written with ``torchscan.theano``, as the Theano guide writes them."""

from __future__ import annotations

import torch

from torchscan import theano

from ._models import Case, Dim, randn

N = 3


class TapsRNN(torch.nn.Module):
    """The guide's RNN: x(n) reads u(n), u(n-4), x(n-1), y(n-1); y(n) reads x(n-3)."""

    def __init__(self) -> None:
        super().__init__()
        self.weights = torch.nn.ParameterList(
            [torch.nn.Parameter(randn(N, N) * 0.5) for _ in range(5)]
        )

    def forward(self, u, x0, y0):
        def step(u_tm4, u_t, x_tm3, x_tm1, y_tm1, W, W_in_1, W_in_2, W_feedback, W_out):
            x_t = torch.tanh(x_tm1 @ W + u_t @ W_in_1 + u_tm4 @ W_in_2 + y_tm1 @ W_feedback)
            return [x_t, x_tm3 @ W_out]

        (x_vals, y_vals), _ = theano.scan(
            fn=step,
            sequences={"input": u, "taps": [-4, -0]},
            outputs_info=[{"initial": x0, "taps": [-3, -1]}, y0],
            non_sequences=list(self.weights),
            strict=True,
        )
        return x_vals, y_vals


def rnn_inputs(t: int) -> tuple[torch.Tensor, ...]:
    return randn(t + 4, N), randn(3, N), randn(N)


class Power(torch.nn.Module):
    """A**k with k a model input: a Loop whose trip count is read at run time."""

    def forward(self, A, k):
        result, _ = theano.scan(
            fn=lambda prior, A: prior * A,
            outputs_info=torch.ones_like(A),
            non_sequences=A,
            n_steps=k,
        )
        return (result,)


def power_inputs(t: int) -> tuple[torch.Tensor, ...]:
    return torch.linspace(-1.5, 1.5, 6), torch.tensor(t)


class PowersOfTwo(torch.nn.Module):
    """Powers of two below a bound given as input: until, with n_steps as a cap."""

    def forward(self, max_value):
        def power_of_2(previous_power, max_value):
            return previous_power * 2, theano.until(previous_power * 2 > max_value)

        values, _ = theano.scan(
            power_of_2, outputs_info=torch.tensor(1.0), non_sequences=max_value, n_steps=1024
        )
        return (values,)


def bounds(t: int) -> tuple[torch.Tensor, ...]:
    return (torch.tensor(float(2 ** (t + 2) + 3)),)


class Backwards(torch.nn.Module):
    """A map that goes backwards: outputs in the order the steps ran."""

    def forward(self, xs, h):
        ys, _ = theano.map(lambda x, h: x * h + 1, xs, non_sequences=h, go_backwards=True)
        return (ys,)


def backwards_inputs(t: int) -> tuple[torch.Tensor, ...]:
    return randn(t, N), randn(N)


CASES: dict[str, Case] = {
    "taps-rnn": Case(TapsRNN, rnn_inputs, lambda: ({0: Dim("T", min=5)}, None, None)),
    "a-to-the-k": Case(
        Power,
        power_inputs,
        lambda: None,
        {"Loop": 1},
        run_lengths=(0, 2, 5),
        reference_lengths=(2, 5),
    ),
    "powers-of-two-until": Case(PowersOfTwo, bounds, lambda: None, {"Loop": 1}, run_lengths=(1, 6)),
    "go-backwards": Case(
        Backwards, backwards_inputs, lambda: ({0: Dim("T", min=1)}, None), reference=False
    ),
}
