"""Models that call ``torchscan.loop``, one per feature, with inputs giving several iteration
counts."""

from __future__ import annotations

import torch

import torchscan

from ._models import B, Case, Dim, F, H, _gen, randn


def sequence_and_state(t: int) -> tuple[torch.Tensor, ...]:
    return randn(t, B, F), randn(B, H)


def dynamic_first(n: int):
    return lambda: ({0: Dim("T", min=1)}, *[None] * (n - 1))


class ForStatic(torch.nn.Module):
    """A Python int trip count; the iteration number in the arithmetic."""

    def forward(self, xs, h):
        def body(i, h):
            h = torch.tanh(h * 0.5 + i * 0.1)
            return h, (h, i)

        return torchscan.loop(body, h, trip_count=5)


class Cell(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = torch.nn.RNNCell(F, H)


class ForSequence(Cell):
    """The trip count is the length of a sequence, which the body indexes with ``xs[i]``."""

    def forward(self, xs, h):
        return torchscan.loop(
            lambda i, h: (self.cell(xs[i], h), self.cell(xs[i], h).sum(-1)),
            h,
            trip_count=xs.shape[0],
        )


class ForTensorCount(Cell):
    """The trip count is a model input (0-d int64), zero included."""

    def forward(self, n, h):
        return torchscan.loop(lambda i, h: (torch.tanh(h + i), h), h, trip_count=n)


def counts(t: int) -> tuple[torch.Tensor, ...]:
    return torch.tensor(t), randn(B, H)


class UntilThreshold(torch.nn.Module):
    """Do-while: no trip count; stops once the state passes a threshold given as input."""

    def forward(self, threshold, h):
        def body(i, carry):
            total = carry + (i + 1).to(carry.dtype)
            return (
                total,
                {"total": total, "i": i, "none": None},
                torchscan.until(total.sum() > threshold),
            )

        return torchscan.loop(body, h.abs(), cond=None)


def thresholds(t: int) -> tuple[torch.Tensor, ...]:
    return torch.tensor(float(t * 7)), randn(B, H)


class WhileCond(torch.nn.Module):
    """While: a keep-going flag given as input, and a stop from the data, with a trip cap."""

    def forward(self, flag, threshold, h):
        def body(i, carry):
            carry = carry * 1.5 + 1
            return carry, carry.max(), torchscan.until(carry.max() > threshold)

        return torchscan.loop(body, h.abs(), trip_count=50, cond=flag)


def flags(t: int) -> tuple[torch.Tensor, ...]:
    return torch.tensor(t % 3 != 0), torch.tensor(float(t * 10)), randn(B, H)


class ForWithCond(Cell):
    """For with a flag and no stop: all iterations or none (the inputs of length 6 run none)."""

    def forward(self, flag, xs, h):
        return torchscan.loop(
            lambda i, h: (self.cell(xs[i], h), h), h, trip_count=xs.shape[0], cond=flag
        )


def flag_and_sequence(t: int) -> tuple[torch.Tensor, ...]:
    return torch.tensor(t != 6), randn(t, B, F), randn(B, H)


class Pytrees(torch.nn.Module):
    """A dict carry with an integer counter and a boolean, and a pytree y with a None."""

    def forward(self, xs, h):
        def body(i, carry):
            h = carry["h"] + xs[i].sum(-1, keepdim=True)
            positive = (h.sum(-1) > 0) | carry["seen"]
            new = {"h": h, "count": carry["count"] + positive.long(), "seen": positive}
            return new, (None, {"h": h, "seen": positive})

        init = {
            "h": h,
            "count": torch.zeros(B, dtype=torch.int64),
            "seen": torch.zeros(B, dtype=torch.bool),
        }
        carry, (nothing, ys) = torchscan.loop(body, init, trip_count=xs.shape[0])
        assert nothing is None
        return carry["h"], carry["count"], carry["seen"], ys["h"], ys["seen"]


class NoCarry(torch.nn.Module):
    """A map with no carry."""

    def forward(self, xs, h):
        return torchscan.loop(
            lambda i, _: (None, torch.relu(xs[i]) + h[:, :1]), None, trip_count=xs.shape[0]
        )


class Captured(torch.nn.Module):
    """Parameters, a buffer and an outer intermediate read by closure."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(F, H)
        self.register_buffer("decay", torch.full((H,), 0.9))

    def forward(self, xs, h):
        offset = self.proj.bias * 2

        def body(i, h):
            h = torch.tanh(self.proj(xs[i]) + h * self.decay + offset)
            return h, h

        return torchscan.loop(body, h, trip_count=xs.shape[0])


class LoopInScan(torch.nn.Module):
    """A scan whose step runs a loop a data-dependent number of times."""

    def forward(self, xs, h):
        def step(h, x):
            def refine(i, h):
                h = h * 0.5 + x[:, :1]
                return h, None, torchscan.until(h.abs().sum() < 1.0)

            h, _ = torchscan.loop(refine, h, trip_count=4)
            return h, h.sum(-1)

        return torchscan.scan(step, h, xs)


class ScanInLoop(torch.nn.Module):
    """A loop whose body scans the whole sequence, forward then, at odd iterations, again."""

    def forward(self, xs, h):
        def body(i, h):
            h, ys = torchscan.scan(lambda c, x: (torch.tanh(c + x[:, :1]), c), h, xs)
            return h * 0.5, ys.sum(0)

        return torchscan.loop(body, h, trip_count=3)


class LoopInScanIndexing(torch.nn.Module):
    """A scan whose step loops over the whole sequence, reading ``xs[j]`` with the inner
    iteration number."""

    def forward(self, xs, h):
        def step(h, x):
            def refine(j, c):
                return torch.tanh(c * 0.5 + xs[j].sum(-1, keepdim=True) * x[:, :1]), None

            c, _ = torchscan.loop(refine, h, trip_count=xs.shape[0])
            return c, c.sum(-1)

        return torchscan.scan(step, h, xs)


class ScanInLoopIndexing(torch.nn.Module):
    """A loop whose body scans the sequence, each step reading ``xs[i]`` with the loop's ``i``:
    a tensor of the enclosing trace."""

    def forward(self, xs, h):
        def body(i, h):
            h, ys = torchscan.scan(
                lambda c, x: (torch.tanh(c + x[:, :1] * xs[i][:, 1:2]), c), h, xs
            )
            return h, ys.sum(0)

        return torchscan.loop(body, h, trip_count=xs.shape[0])


class LoopInLoop(torch.nn.Module):
    """A triangular loop: iteration ``i`` runs an inner loop ``i + 1`` times over ``xs[j]``."""

    def forward(self, xs, h):
        def body(i, h):
            c, _ = torchscan.loop(lambda j, c: (c * 0.9 + xs[j][:, :1], None), h, trip_count=i + 1)
            return c, c.sum(-1)

        return torchscan.loop(body, h, trip_count=xs.shape[0])


class IndexThroughIndex(torch.nn.Module):
    """``xs[order[i]]``: an index read from a tensor with the iteration number."""

    def forward(self, xs, h, order):
        return torchscan.loop(
            lambda i, h: (torch.tanh(h + xs[order[i]][:, :1]), h[:, 0]), h, trip_count=xs.shape[0]
        )


def sequence_state_and_order(t: int) -> tuple[torch.Tensor, ...]:
    return randn(t, B, F), randn(B, H), torch.randperm(t, generator=_gen)


# onnx.reference cannot run a Loop that runs no iteration
# (torchscan.onnx._check._reference_ops.spec_loop): the reference_lengths of a case leave out the
# inputs that run none.
class ForShifted(Cell):
    """``for i in range(T - 1)`` reading ``xs[i + 1]``, with a dynamic batch: at length 1 no
    iteration runs, and the outputs keep their per-iteration shape, batch included."""

    def forward(self, xs, h):
        def body(i, h):
            h = self.cell(xs[i + 1] - xs[i], h)
            return h, (h, xs[i].sum(-1) > 0)

        return torchscan.loop(body, h, trip_count=xs.shape[0] - 1)


class CountAfterFor(Cell):
    """A size read from the stacked outputs of a loop with a tensor trip count, used to make a
    tensor after it: a static shape left on the way would be folded into a constant."""

    def forward(self, n, h):
        _, hs = torchscan.loop(lambda i, h: (torch.tanh(h + i), h), h, trip_count=n)
        ran = hs.shape[0]
        return hs, torch.arange(ran, dtype=torch.float32) * 2 + ran


class CountAfterUntil(torch.nn.Module):
    """The same after a loop that stops with until, and may run no iteration."""

    def forward(self, threshold, h):
        def body(i, h):
            h = h * 1.5 + 0.1
            return h, h.sum(-1), torchscan.until(h.sum() > threshold)

        _, sums = torchscan.loop(body, h.abs(), cond=threshold > 0)
        ran = sums.shape[0]
        return sums, torch.ones(ran, 2) * ran


def signed_thresholds(t: int) -> tuple[torch.Tensor, ...]:
    """Thresholds for 0 (negative: no iteration), then ever more iterations."""
    return torch.tensor(float(t * 7) if t else -1.0), randn(B, H)


def dynamic_time_and_batch():
    batch = Dim("B", min=1)
    return ({0: Dim("T", min=1), 1: batch}, {0: batch})


CASES: dict[str, Case] = {
    "for-static": Case(ForStatic, sequence_and_state, lambda: None, {"Loop": 1}, run_lengths=()),
    "for-sequence": Case(ForSequence, sequence_and_state, dynamic_first(2), {"Loop": 1}),
    "for-tensor-count": Case(
        ForTensorCount, counts, lambda: None, {"Loop": 1}, run_lengths=(0, 1, 6),
        reference_lengths=(1, 6),
    ),
    "until-do-while": Case(
        UntilThreshold, thresholds, lambda: None, {"Loop": 1}, run_lengths=(0, 1, 6)
    ),
    "while-cond": Case(
        WhileCond, flags, lambda: None, {"Loop": 1}, run_lengths=(0, 1, 5), reference_lengths=(1, 5)
    ),
    "for-with-cond": Case(
        ForWithCond, flag_and_sequence, lambda: (None, {0: Dim("T", min=1)}, None), {"Loop": 1},
        run_lengths=(1, 5, 6),
        reference_lengths=(1, 5),
    ),
    "count-after-for": Case(
        CountAfterFor, counts, lambda: None, {"Loop": 1}, run_lengths=(0, 1, 6),
        reference_lengths=(1, 6),
    ),
    "count-after-until": Case(
        CountAfterUntil, signed_thresholds, lambda: None, {"Loop": 1}, run_lengths=(0, 1, 6),
        reference_lengths=(1, 6),
    ),
    "for-shifted": Case(
        ForShifted, sequence_and_state, dynamic_time_and_batch, {"Loop": 1},
        run_lengths=(1, 2, 6), reference_lengths=(2, 6),
    ),
    "pytrees": Case(Pytrees, sequence_and_state, dynamic_first(2), {"Loop": 1}),
    "no-carry": Case(NoCarry, sequence_and_state, dynamic_first(2), {"Loop": 1}),
    "captured": Case(Captured, sequence_and_state, dynamic_first(2), {"Loop": 1}),
    "loop-in-scan": Case(LoopInScan, sequence_and_state, dynamic_first(2), {"Scan": 1, "Loop": 1}),
    "scan-in-loop": Case(ScanInLoop, sequence_and_state, dynamic_first(2), {"Scan": 1, "Loop": 1}),
    "loop-in-scan-indexing": Case(
        LoopInScanIndexing, sequence_and_state, dynamic_first(2), {"Scan": 1, "Loop": 1}
    ),
    "scan-in-loop-indexing": Case(
        ScanInLoopIndexing, sequence_and_state, dynamic_first(2), {"Scan": 1, "Loop": 1}
    ),
    "loop-in-loop": Case(LoopInLoop, sequence_and_state, dynamic_first(2), {"Loop": 2}),
    "index-through-index": Case(
        IndexThroughIndex, sequence_state_and_order,
        lambda: ({0: Dim("T", min=1)}, None, {0: Dim("T", min=1)}), {"Loop": 1},
    ),
}  # fmt: skip
