"""Models that call ``torchscan.scan``, one per feature, with inputs at several lengths."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable

import torch

import torchscan

B, F, H = 2, 3, 4
_gen = torch.Generator().manual_seed(0)


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen)


Dim = torch.export.Dim


@dataclasses.dataclass
class Case:
    """A model, the inputs it is exported with, and inputs of other lengths to run it on."""

    make: Callable[[], torch.nn.Module]
    inputs: Callable[[int], tuple[torch.Tensor, ...]]
    dynamic_shapes: Callable[[], object]
    ops: dict[str, int] = dataclasses.field(default_factory=lambda: {"Scan": 1})
    """How many nodes of each loop operator the model has, bodies included."""
    export_length: int = 3
    run_lengths: tuple[int, ...] = (1, 6)
    reference_lengths: tuple[int, ...] | None = None
    """The run lengths onnx.reference can run, where they differ: it cannot run a Loop that runs
    no iteration (torchscan.onnx._check._reference_ops.spec_loop)."""


def time_major(*feature_shapes: tuple[int, ...]):
    """Inputs: one (T, B, *shape) sequence per shape, then the initial state (B, H)."""

    def inputs(t: int) -> tuple[torch.Tensor, ...]:
        return (*[randn(t, B, *shape) for shape in feature_shapes], randn(B, H))

    return inputs


def dynamic_time(n_sequences: int, axis: int = 0):
    def shapes():
        t = Dim("T", min=1)
        return (*[{axis: t} for _ in range(n_sequences)], None)

    return shapes


class Elman(torch.nn.Module):
    def __init__(self, axis: int = 0, reverse: bool = False) -> None:
        super().__init__()
        self.cell = torch.nn.RNNCell(F, H)
        self.axis, self.reverse = axis, reverse

    def forward(self, xs, h):
        def step(h, x):
            h = self.cell(x, h)
            return h, h

        return torchscan.scan(step, h, xs, axis=self.axis, reverse=self.reverse)


class DictPytrees(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(F, H)

    def forward(self, a, b, h):
        def step(carry, x):
            h = torch.tanh(self.proj(x["a"]) * x["b"] + carry["h"])
            return {"h": h, "n": carry["n"] + 1}, {"out": h.sum(-1), "skip": None, "h": h}

        carry, ys = torchscan.scan(
            step, {"h": h, "n": torch.zeros((), dtype=torch.int64)}, {"a": a, "b": b}
        )
        assert ys["skip"] is None
        return carry["h"], carry["n"], ys["out"], ys["h"]


State = collections.namedtuple("State", ["h", "c"])


class LSTMNamedTuple(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = torch.nn.LSTMCell(F, H)

    def forward(self, xs, h):
        def step(state, x):
            h, c = self.cell(x, (state.h, state.c))
            return State(h, c), h

        state, hs = torchscan.scan(step, State(h, torch.zeros_like(h)), xs)
        return state.h, state.c, hs


class Zipped(torch.nn.Module):
    def forward(self, a, b, h):
        def step(h, x):
            x_a, x_b = x
            return h * 0.5 + x_a[:, :1] * x_b, (x_a - x_b[:, :1]).abs()

        return torchscan.scan(step, h, (a, b))


class NoCarry(torch.nn.Module):
    """A map: no carry, and an output that is None."""

    def forward(self, xs, h):
        def step(carry, x):
            return None, (torch.relu(x) * 2 + 1, None)

        carry, (ys, nothing) = torchscan.scan(step, None, xs)
        assert carry is None
        assert nothing is None
        return (ys,)


class NoOutput(torch.nn.Module):
    """A fold: y is None."""

    def forward(self, xs, h):
        carry, ys = torchscan.scan(lambda c, x: (c + x.sum(-1, keepdim=True), None), h, xs)
        assert ys is None
        return (carry,)


class CarryTwice(torch.nn.Module):
    """The carry returned as two outputs and as the new carry."""

    def forward(self, xs, h):
        def step(h, x):
            h = h + x[:, :1]
            return h, (h, h)

        h, (first, second) = torchscan.scan(step, h, xs)
        return h, first, second


class CapturedState(torch.nn.Module):
    """Parameters and a buffer read by closure, and Python scalars."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(randn(F, H))
        self.register_buffer("scale", torch.full((H,), 0.5))

    def forward(self, xs, h):
        bias = self.weight.sum(0) * 0.1  # an intermediate of the outer graph

        def step(h, x):
            h = torch.tanh(x @ self.weight * self.scale + h * 0.9 + bias) - 1e-3
            return h, h * 2

        return torchscan.scan(step, h, xs)


class IntegerCarries(torch.nn.Module):
    """int64 and bool carries and outputs."""

    def forward(self, xs, h):
        def step(carry, x):
            count, seen = carry
            positive = x.sum(-1) > 0
            return (count + positive.long(), seen | positive), (count, positive)

        init = (torch.zeros(B, dtype=torch.int64), torch.zeros(B, dtype=torch.bool))
        (count, seen), (counts, flags) = torchscan.scan(step, init, xs)
        return count, seen, counts, flags


class LengthOnly(torch.nn.Module):
    """No sequence: a fixed number of steps over the carry."""

    def forward(self, xs, h):
        carry, ys = torchscan.scan(lambda c, _: (c * 0.5 + 1, c), h, length=4)
        return carry, ys


class LengthOfInput(torch.nn.Module):
    """No sequence, and the number of steps is a dynamic size of an input."""

    def forward(self, xs, h):
        return torchscan.scan(lambda c, _: (c * 0.5 + 1, c), h, length=xs.shape[0])


class Nested(torch.nn.Module):
    """A scan whose body runs another scan over the features of each step, reversed."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(randn(H))

    def forward(self, xs, h):
        def inner(c, v):
            c = c * 0.5 + v[:, None] * self.weight
            return c, c.sum(-1)

        def outer(h, x):
            h2, sums = torchscan.scan(inner, h, x, axis=1, reverse=True)
            return torch.tanh(h2), sums

        return torchscan.scan(outer, h, xs)


class UntilInsideScan(torch.nn.Module):
    """A scan whose body runs a scan over the features of each step that stops early: a Loop
    inside a Scan."""

    def forward(self, xs, h):
        def inner(c, v):
            c = c * 0.5 + v[:, None]
            return c, c.sum(-1), torchscan.until(c.sum() > 2.0)

        def outer(h, x):
            h2, sums = torchscan.scan(inner, h, x, axis=1)  # sums: (B, steps that ran)
            return torch.tanh(h2), sums.sum(-1)

        return torchscan.scan(outer, h, xs)


class ScanInsideUntil(torch.nn.Module):
    """A scan that stops early whose body runs a plain scan over the features: a Scan inside a
    Loop."""

    def forward(self, xs, h):
        def inner(c, v):
            c = c * 0.5 + v[:, None]
            return c, c.sum(-1)

        def outer(h, x):
            h2, sums = torchscan.scan(inner, h, x, axis=1)
            h2 = torch.tanh(h2)
            return h2, sums.sum(-1), torchscan.until(h2.sum() > 1.0)

        return torchscan.scan(outer, h, xs)


class TwoScans(torch.nn.Module):
    """Two scans in a row: forward then backward over the first one's outputs."""

    def forward(self, xs, h):
        _, ys = torchscan.scan(lambda c, x: (c + x[:, :1], c * x[:, :1]), h, xs)
        last, zs = torchscan.scan(lambda c, y: (c * 0.9 + y, c), h, ys, reverse=True)
        return last, zs


class UntilScan(torch.nn.Module):
    """A scan that stops once the state passes a threshold: a Loop over the sequence."""

    def __init__(self, axis: int = 0, reverse: bool = False) -> None:
        super().__init__()
        self.cell = torch.nn.RNNCell(F, H)
        self.axis, self.reverse = axis, reverse

    def forward(self, xs, h):
        def step(h, x):
            h = self.cell(x, h)
            return h, (h, None), torchscan.until(h.sum() > 1.0)

        h, (hs, nothing) = torchscan.scan(step, h, xs, axis=self.axis, reverse=self.reverse)
        assert nothing is None
        return h, hs


class InvariantOutputs(torch.nn.Module):
    """A per-step output that is a captured parameter, another that is a constant, and a new
    carry that does not depend on the loop: values no node of the body computes until export
    adds one."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(randn(B, H))

    def forward(self, xs, h):
        def step(carry, x):
            h, z = carry
            h = torch.tanh(h + z + x.sum(-1, keepdim=True))
            return (h, torch.zeros_like(z)), (h, self.weight, torch.ones(B, H))

        return torchscan.scan(step, (h, h * 2), xs)


class IntegerMasks(torch.nn.Module):
    """Integer work old opsets lack: int64 clamps (Clip before 12 takes floats) and an
    ``arange < k`` mask (Less before 9 compares floats)."""

    def forward(self, xs, h):
        def step(c, x):
            bucket = (x * 3).long().clamp(0, 2)
            mask = torch.arange(F) < bucket.sum(-1, keepdim=True)
            return c + (x * mask).sum(-1, keepdim=True), bucket

        return torchscan.scan(step, h, xs)


class ViewsReshapedInPlace(torch.nn.Module):
    """xLSTM's step: the heads of a projection made in the step, a view squeezed in place
    (``q.squeeze_(2)``), and a view of the carry squeezed in place; no argument changes."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(F, H)

    def forward(self, xs, h):
        def step(c, x):
            q = self.proj(x).view(B, 2, 1, H // 2)
            q.squeeze_(2)
            q.unsqueeze_(0)
            q.squeeze_(0)
            of_c = c.unsqueeze(0)
            of_c.squeeze_(0)
            c = torch.tanh(of_c + q.reshape(B, H))
            return c, q.sum(-1)

        return torchscan.scan(step, h, xs)


class Shifted(torch.nn.Module):
    """A fixed-grid ODE step over ``zip(t[:-1], t[1:])``: at length 1 the scanned sequences are
    empty, and the scan must return the initial state and empty outputs."""

    def forward(self, xs, h):
        def step(y, pair):
            x0, x1 = pair
            y = y + (x1 - x0).sum(-1, keepdim=True) * torch.tanh(y)
            return y, (y, x1 * 2)

        return torchscan.scan(step, h, (xs[:-1], xs[1:]))


class ShiftedAxis1Reverse(torch.nn.Module):
    """A batch-first scan over ``e[:, 1:]`` backwards (a CRF's emissions after the first): empty
    at length 1 along axis 1, and a per-step output the export computes on the whole sequence."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = torch.nn.RNNCell(F, H)

    def forward(self, xs, h):
        def step(h, x):
            return self.cell(x, h), (x * 3, h)

        return torchscan.scan(step, h, xs[:, 1:], axis=1, reverse=True)


class ShiftedFold(torch.nn.Module):
    """A fold over ``xs[1:]``: only a carry, which an empty scan passes through."""

    def forward(self, xs, h):
        h, _ = torchscan.scan(lambda h, x: (h * 0.5 + x.sum(-1, keepdim=True), None), h, xs[1:])
        return h


def batch_first(t: int) -> tuple[torch.Tensor, ...]:
    return randn(B, t, F), randn(B, H)


def dynamic_time_from(minimum: int, axis: int = 0):
    def shapes():
        return ({axis: Dim("T", min=minimum)}, None)

    return shapes


CASES: dict[str, Case] = {
    "elman": Case(Elman, time_major((F,)), dynamic_time(1)),
    "axis1": Case(
        lambda: Elman(axis=1),
        lambda t: (randn(B, t, F), randn(B, H)),
        dynamic_time(1, axis=1),
    ),
    "reverse": Case(lambda: Elman(reverse=True), time_major((F,)), dynamic_time(1)),
    "axis-1-reverse": Case(
        lambda: Elman(axis=-1, reverse=True),
        lambda t: (randn(B, F, t), randn(B, H)),
        dynamic_time(1, axis=2),
    ),
    "dict-pytrees": Case(DictPytrees, time_major((F,), (1,)), dynamic_time(2)),
    "lstm-namedtuple": Case(LSTMNamedTuple, time_major((F,)), dynamic_time(1)),
    "zipped": Case(Zipped, time_major((H,), (1,)), dynamic_time(2)),
    "no-carry": Case(NoCarry, time_major((F,)), dynamic_time(1)),
    "no-output": Case(NoOutput, time_major((H,)), dynamic_time(1)),
    "carry-twice": Case(CarryTwice, time_major((H,)), dynamic_time(1)),
    "captured": Case(CapturedState, time_major((F,)), dynamic_time(1)),
    "integer-carries": Case(IntegerCarries, time_major((F,)), dynamic_time(1)),
    "length-only": Case(LengthOnly, time_major((F,)), lambda: None, run_lengths=()),
    "length-of-input": Case(LengthOfInput, time_major((F,)), dynamic_time(1)),
    "nested": Case(Nested, time_major((H,)), dynamic_time(1), ops={"Scan": 2}),
    "until-inside-scan": Case(
        UntilInsideScan, time_major((H,)), dynamic_time(1), ops={"Scan": 1, "Loop": 1}
    ),
    "scan-inside-until": Case(
        ScanInsideUntil,
        time_major((H,)),
        dynamic_time(1),
        ops={"Scan": 1, "Loop": 1},
    ),
    "until": Case(UntilScan, time_major((F,)), dynamic_time(1), ops={"Loop": 1}),
    "until-axis1-reverse": Case(
        lambda: UntilScan(axis=1, reverse=True),
        lambda t: (randn(B, t, F), randn(B, H)),
        dynamic_time(1, axis=1),
        ops={"Loop": 1},
    ),
    "two-scans": Case(TwoScans, time_major((1,)), dynamic_time(1), ops={"Scan": 2}),
    "invariant-outputs": Case(InvariantOutputs, time_major((F,)), dynamic_time(1)),
    "integer-masks": Case(IntegerMasks, time_major((F,)), dynamic_time(1)),
    "views-reshaped-in-place": Case(ViewsReshapedInPlace, time_major((F,)), dynamic_time(1)),
    "shifted": Case(Shifted, time_major((F,)), dynamic_time(1), run_lengths=(1, 2, 6)),
    "shifted-axis1-reverse": Case(
        ShiftedAxis1Reverse,
        batch_first,
        dynamic_time(1, axis=1),
        run_lengths=(1, 2, 6),
    ),
    "shifted-fold": Case(ShiftedFold, time_major((F,)), dynamic_time(1), run_lengths=(1, 2, 6)),
    "may-be-empty": Case(Elman, time_major((F,)), dynamic_time_from(0), run_lengths=(0, 1, 6)),
}
