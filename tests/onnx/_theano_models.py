"""Models written with ``torchscan.theano``, as the Theano guide writes them."""

from __future__ import annotations

import torch

from torchscan import theano

from ._models import Case, Dim, randn

_gen = torch.Generator().manual_seed(2)

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


class Polynomial(torch.nn.Module):
    """The guide's polynomial: two sequences, one of them as long as the model's input, so the
    number of steps is the smaller of two lengths. The power is cast to the base's type, as
    Theano's ``**`` upcasts it: ONNX's ``Pow`` before opset 12 takes no integer exponent."""

    def forward(self, coefficients, x):
        components, _ = theano.scan(
            fn=lambda coefficient, power, free_variable: (
                coefficient * (free_variable ** power.to(free_variable.dtype))
            ),
            outputs_info=None,
            sequences=[coefficients, torch.arange(10000)],
            non_sequences=x,
        )
        return components, components.sum()


def polynomial_inputs(t: int) -> tuple[torch.Tensor, ...]:
    return randn(t), torch.tensor(1.1)


class PositiveTaps(torch.nn.Module):
    """Sequence taps before and after the step (-1, 1, 3) and an output fed back."""

    def forward(self, u, h0):
        def step(u_tm1, u_tp1, u_tp3, h):
            return torch.tanh(h * 0.5 + u_tm1 - u_tp1 + 0.25 * u_tp3)

        out, _ = theano.scan(step, sequences={"input": u, "taps": [-1, 1, 3]}, outputs_info=h0)
        return (out,)


def positive_taps_inputs(t: int) -> tuple[torch.Tensor, ...]:
    return randn(t + 4, N), randn(N)


class TapsUntil(torch.nn.Module):
    """Sequence taps, output taps and until, going backwards: one Loop."""

    def forward(self, u, x0):
        def step(u_t, u_tp2, x_tm2, x_tm1):
            x_t = x_tm1 + 0.5 * x_tm2 + u_t - u_tp2
            return x_t, theano.until(x_t > 3.0)

        out, _ = theano.scan(
            step,
            sequences={"input": u, "taps": [0, 2]},
            outputs_info={"initial": x0, "taps": [-2, -1]},
            go_backwards=True,
        )
        return (out,)


def taps_until_inputs(t: int) -> tuple[torch.Tensor, ...]:
    return torch.rand(t + 2, generator=_gen) * 2, torch.tensor([0.0, 1.0])


class StepsInput(torch.nn.Module):
    """n_steps a model input, with a sequence: one Loop that gathers what each step reads. A
    negative n_steps flips the direction."""

    def __init__(self, go_backwards: bool) -> None:
        super().__init__()
        self.go_backwards = go_backwards

    def forward(self, u, h0, n_steps):
        out, _ = theano.scan(
            lambda u_tm1, u_tp1, h: torch.tanh(h * 0.5 + u_tm1 - u_tp1),
            sequences={"input": u, "taps": [-1, 1]},
            outputs_info=h0,
            n_steps=n_steps,
            go_backwards=self.go_backwards,
        )
        return (out,)


def steps_input_inputs(t: int) -> tuple[torch.Tensor, ...]:
    """``t`` steps (forward for even ``t``, backward for odd) of a sequence long enough for
    ``t + 1``: going backwards reads its last positions."""
    return randn(t + 3, N), randn(N), torch.tensor(t if t % 2 == 0 else -t)


class BackwardsOverSequences(torch.nn.Module):
    """``go_backwards`` over two sequences of their own dynamic lengths, one read at two taps:
    the steps are the last positions that every tap of every sequence can read."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(randn(N, N) * 0.5)

    def forward(self, a, b, h0):
        def step(a_tm2, a_t, b_t, h):
            return torch.tanh(h @ self.weight + a_t - 0.5 * a_tm2 + b_t)

        out, _ = theano.scan(
            step,
            sequences=[{"input": a, "taps": [-2, 0]}, b],
            outputs_info=[h0],
            go_backwards=True,
        )
        return (out,)


def two_lengths_inputs(t: int) -> tuple[torch.Tensor, ...]:
    """``a`` long enough for ``t + 1`` steps at its taps, ``b`` for ``t``: ``t`` steps."""
    return randn(t + 3, N), randn(t, N), randn(N)


CASES: dict[str, Case] = {
    "go-backwards-sequences-of-their-own-lengths": Case(
        BackwardsOverSequences,
        two_lengths_inputs,
        lambda: ({0: Dim("A", min=4)}, {0: Dim("B", min=1)}, None),
        run_lengths=(1, 2, 7),
    ),
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
    "go-backwards": Case(Backwards, backwards_inputs, lambda: ({0: Dim("T", min=1)}, None)),
    "polynomial": Case(
        Polynomial, polynomial_inputs, lambda: ({0: Dim("T", min=1)}, None), run_lengths=(1, 3, 7)
    ),
    "positive-taps": Case(PositiveTaps, positive_taps_inputs, lambda: ({0: Dim("T", min=4)}, None)),
    "taps-until": Case(
        TapsUntil,
        taps_until_inputs,
        lambda: ({0: Dim("T", min=3)}, None),
        {"Loop": 1},
        run_lengths=(1, 4, 12),
    ),
    "tensor-n-steps": Case(
        lambda: StepsInput(go_backwards=False),
        steps_input_inputs,
        lambda: ({0: Dim("T", min=2)}, None, None),
        {"Loop": 1},
        run_lengths=(0, 2, 5),
        reference_lengths=(2, 5),
    ),
    "tensor-n-steps-go-backwards": Case(
        lambda: StepsInput(go_backwards=True),
        steps_input_inputs,
        lambda: ({0: Dim("T", min=2)}, None, None),
        {"Loop": 1},
        run_lengths=(0, 2, 5),
        reference_lengths=(2, 5),
    ),
}
