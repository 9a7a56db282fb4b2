"""Loops as their authors write them, for tests/test_autoloop.py: each program is a module whose
``forward`` (or a method it calls) holds the loop, with ``inputs(n)`` for ``n`` steps and what
``torchscan.autoloop`` must make of it (``converts``: one scan per call; else the words of the
reason its report gives)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import nn

H, F, B = 5, 3, 2


@dataclasses.dataclass(frozen=True)
class Program:
    make: Callable[[], nn.Module]
    inputs: Callable[[int], tuple[torch.Tensor, ...]]
    converts: bool = True
    reason: str = ""  # words of the report's reason where it does not convert
    empty_raises: bool = False  # torch.stack of no step raises, in the original too
    time_axis: int = 0  # of the first input


def _x(n: int, batch_first: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(n)
    shape = (B, n, F) if batch_first else (n, B, F)
    return torch.randn(shape, generator=g)


# -- loops that convert ------------------------------------------------------------------------


class Elman(nn.Module):
    """range over the size, x[t], append then stack."""

    def __init__(self) -> None:
        super().__init__()
        self.wx, self.wh = nn.Linear(F, H), nn.Linear(H, H, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.zeros(x.shape[1], H)
        outputs = []
        for t in range(x.shape[0]):
            h = torch.tanh(self.wx(x[t]) + self.wh(h))
            outputs.append(h)
        return torch.stack(outputs), h


class BatchFirstGRU(nn.Module):
    """batch first: seq_len from a tuple of sizes, x[:, t, :], stacked on axis 1."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.GRUCell(F, H)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch, seq_len, _ = x.size()
        hx = x.new_zeros(batch, H)
        outs = []
        for i in range(seq_len):
            hx = self.cell(x[:, i, :], hx)
            outs.append(hx)
        return torch.stack(outs, dim=1), hx


class LSTMTuple(nn.Module):
    """rows of x, a tuple carry, two lists, cat of one."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(F, H)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        state = (x.new_zeros(x.shape[1], H), x.new_zeros(x.shape[1], H))
        hs, cs = [], []
        for x_t in x:
            state = self.cell(x_t, state)
            hs.append(state[0])
            cs += [state[1].unsqueeze(0)]
        return torch.stack(hs), torch.cat(cs, 0), state[0], state[1]


class Backward(nn.Module):
    """reversed(range(...)), the outputs reversed back before stacking."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.RNNCell(F, H)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        outputs = []
        for t in reversed(range(len(x))):
            h = self.cell(x[t], h)
            outputs.append(h)
        return torch.stack(outputs[::-1]), h


class Unbound(nn.Module):
    """unbind along axis 1, enumerate, a dict carry, the step number as a number."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(F, H)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        state = {"m": x.new_zeros(x.shape[0], H), "s": x.new_zeros(x.shape[0], H)}
        ys = []
        for t, x_t in enumerate(x.unbind(1)):
            z = self.proj(x_t)
            m = 0.9 * state["m"] + 0.1 * z
            state = {"m": m, "s": state["s"] + (z - m) ** 2 * (t + 1)}
            ys.append(torch.sigmoid(m))
        return torch.stack(ys, 1), state["m"], state["s"]


class Zipped(nn.Module):
    """zip of two sequences; a name first assigned in the loop read after it (bound before)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.randn(F, H))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        acc = torch.zeros(x.shape[1], H)
        last = acc
        for x_t, g_t in zip(x, gate):  # noqa: B905 (as written)
            update = torch.tanh(x_t @ self.a)
            acc = g_t * acc + (1 - g_t) * update
            last = update
        return acc, last


class Offset(nn.Module):
    """range(1, T): the first step peeled by hand, as the CRF forward algorithm does."""

    def __init__(self) -> None:
        super().__init__()
        self.transitions = nn.Parameter(torch.randn(H, H))
        self.emit = nn.Linear(F, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        emissions = self.emit(x)
        score = emissions[0]
        for i in range(1, emissions.size(0)):
            next_score = score.unsqueeze(2) + self.transitions + emissions[i].unsqueeze(1)
            score = torch.logsumexp(next_score, dim=1)
        return torch.logsumexp(score, dim=1)


class Helper(nn.Module):
    """the loop in a method forward calls, a layer loop inside the time loop."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.GRUCell(F, H)
        self.layers = nn.ModuleList(nn.Linear(H, H) for _ in range(2))

    def run(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        outs = []
        for x_t in x:
            h = self.cell(x_t, h)
            for layer in self.layers:
                h = h + torch.relu(layer(h))
            outs.append(h)
        return torch.stack(outs), h

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.run(x, x.new_zeros(x.shape[1], H))


class _Scaled(nn.Module):
    def scale(self, h: torch.Tensor) -> torch.Tensor:
        return h * 2


class Private(_Scaled):
    """enumerate of zip with a nested target, super() in a method the step calls, a private
    attribute (mangled as in the class)."""

    def __init__(self) -> None:
        super().__init__()
        self.__w = nn.Parameter(torch.randn(H, H) / H)
        self.proj = nn.Linear(F, H)

    def scale(self, h: torch.Tensor) -> torch.Tensor:
        return super().scale(h) + 1

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.zeros(x.shape[1], H)
        outs = []
        for t, (x_t, y_t) in enumerate(zip(x, y)):  # noqa: B905 (as written)
            h = torch.tanh(self.scale(h) @ self.__w + self.proj(x_t * y_t) + t)
            outs.append(h)
        return torch.stack(outs), h


class NoneState(nn.Module):
    """a state that is None before the loop (the first step makes it), a loss from 0."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.GRUCell(F, H)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = None
        loss = 0
        outs = []
        for x_t in x:
            h = self.cell(x_t, h)
            loss = loss + h.pow(2).mean()
            outs.append(h)
        return torch.stack(outs), h, loss


def _decay(x: torch.Tensor, alpha: float) -> torch.Tensor:
    y = x[0] * 0
    for x_t in x:
        y = alpha * y + x_t
    return y


class Function(nn.Module):
    """a plain function with a loop, converted on its own and called by the module."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return DECAY(x, 0.5)


DECAY = _decay  # replaced by its conversion in the tests


# -- loops that stay Python --------------------------------------------------------------------


class Layers(nn.Module):
    """a range of a Python number: layers, not steps."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(F, F) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(len(self.layers)):
            x = torch.tanh(self.layers[i](x))
        return x


class Stops(nn.Module):
    """break on a tensor's value."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = torch.zeros(x.shape[1:])
        for t in range(x.shape[0]):
            total = total + x[t].abs()
            if total.sum() > 1e9:
                break
        return total


class Buffer(nn.Module):
    """a buffer written at the step number."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(x.shape[0], x.shape[1], F)
        h = torch.zeros(x.shape[1], F)
        for t in range(x.shape[0]):
            h = torch.tanh(x[t] + h)
            out[t] = h
        return out


class InPlace(nn.Module):
    """a carry changed in place."""

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        for x_t in x:
            h += x_t
        return h


class Counter(nn.Module):
    """an int carried: runs as Python, the reason at run time."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        count = 0
        s = x[0] * 0
        for x_t in x:
            s = s + x_t
            count = count + 1
        return s, count


class Attribute(nn.Module):
    """state kept on the module."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.last = x[0]
        for x_t in x:
            self.last = self.last * 0.5 + x_t
        return self.last


PROGRAMS: dict[str, Program] = {
    "elman": Program(Elman, lambda n: (_x(n),), empty_raises=True),
    "gru-batch-first": Program(
        BatchFirstGRU, lambda n: (_x(n, batch_first=True),), empty_raises=True, time_axis=1
    ),
    "lstm-tuple": Program(LSTMTuple, lambda n: (_x(n),), empty_raises=True),
    "backward": Program(Backward, lambda n: (_x(n), torch.randn(B, H)), empty_raises=True),
    "unbind-enumerate": Program(
        Unbound, lambda n: (_x(n, batch_first=True),), empty_raises=True, time_axis=1
    ),
    "zip": Program(Zipped, lambda n: (_x(n), torch.rand(n, B, 1))),
    "offset": Program(Offset, lambda n: (_x(n + 1),)),
    "none-state": Program(NoneState, lambda n: (_x(n),), empty_raises=True),
    "private": Program(Private, lambda n: (_x(n), _x(n) + 1), empty_raises=True),
    "helper": Program(Helper, lambda n: (_x(n),), empty_raises=True),
    "function": Program(Function, lambda n: (_x(n + 1),)),
    "layers": Program(Layers, lambda n: (_x(n),), False, "counts to a Python number"),
    "break": Program(Stops, lambda n: (_x(n),), False, "`break` leaves the loop early (line"),
    "buffer": Program(Buffer, lambda n: (_x(n)[..., :F],), False, "writes into `out` at an index"),
    "in-place": Program(
        InPlace, lambda n: (_x(n), torch.randn(B, F)), False, "changes the carried `h` in place"
    ),
    "counter": Program(
        Counter, lambda n: (_x(n + 1),), False, "`count` is an int after the first step"
    ),
    "attribute": Program(Attribute, lambda n: (_x(n + 1),), False, "sets the attribute"),
}
