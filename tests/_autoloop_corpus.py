"""Loops as their authors write them, for tests/test_autoloop.py: each program is a module whose
``forward`` (or a method it calls) holds the loop, with ``inputs(n)`` for ``n`` steps and what
``torchscan.autoloop`` must make of it (``converts``: one scan per call; else the words of the
reason its report gives)."""

from __future__ import annotations

import dataclasses
import random
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
    hoists: bool = True  # a scan whose step torchscan hoists from its third call (on every
    # torch release)
    loops: int = 1  # the Scan and Loop nodes of its export
    export_error: str = ""  # words of the error its export raises, where it cannot export
    differentiable: bool = True  # its outputs have gradients (not under torch.no_grad)


def _g(n: int) -> torch.Generator:
    return torch.Generator().manual_seed(n)


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


class Stops(nn.Module):
    """break on a tensor's value as the body's last statement."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = torch.zeros(x.shape[1:])
        for t in range(x.shape[0]):
            total = total + x[t].abs()
            if total.sum() > 6:
                break
        return total


V, EOS = 7, 3


class GreedyDecoder(nn.Module):
    """greedy decoding: a range of a Python number, the token fed back, stop at EOS."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, H)
        self.cell = nn.GRUCell(H, H)
        self.out = nn.Linear(H, V)
        self.max_len = 8

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        tok = torch.zeros(h.shape[0], dtype=torch.long)
        tokens, logits = [], []
        for _ in range(self.max_len):
            h = self.cell(self.embed(tok), h)
            step_logits = self.out(h)
            tok = step_logits.argmax(-1)
            tokens.append(tok)
            logits.append(step_logits)
            if (tok == EOS).all():
                break
        return torch.stack(tokens, 1), torch.stack(logits, 1), h


class FixedPoint(nn.Module):
    """a fixed-point iteration (as deep equilibrium models solve): break before the update."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Linear(H, H, bias=False)
        with torch.no_grad():
            self.w.weight.mul_(0.3)
        self.max_iter, self.tol = 40, 1e-3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = torch.zeros_like(x)
        for _ in range(self.max_iter):
            z_next = torch.tanh(self.w(z) + x)
            if torch.norm(z_next - z) < self.tol:
                break
            z = z_next
        return z


class ConjugateGradient(nn.Module):
    """conjugate gradient: `while` on the residual's norm."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.zeros_like(b)
        r = b - a @ x
        p = r
        rs = r @ r
        steps = torch.zeros((), dtype=torch.long)
        while rs > 1e-6:
            ap = a @ p
            alpha = rs / (p @ ap)
            x = x + alpha * p
            r = r - alpha * ap
            rs_new = r @ r
            p = r + (rs_new / rs) * p
            rs = rs_new
            steps = steps + 1
        return x, steps


def _spd(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(n)
    m = torch.randn(H, H, generator=g)
    return m @ m.T / H + torch.eye(H), torch.randn(H, generator=g)


class PowerIteration(nn.Module):
    """`while True:` ended by `if ...: break`: the dominant eigenvector."""

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        v = torch.ones(a.shape[0]) / a.shape[0] ** 0.5
        while True:
            w = a @ v
            w = w / w.norm()
            done = (w - v).abs().max() < 1e-4
            v = w
            if done:
                break
        return v


def _gapped(n: int) -> tuple[torch.Tensor]:
    g = torch.Generator().manual_seed(n)
    q, _ = torch.linalg.qr(torch.randn(H, H, generator=g))
    return (q @ torch.diag(torch.tensor([4.0, 1.0, 0.5, 0.3, 0.1])) @ q.T,)


class Buffer(nn.Module):
    """batch first, the hidden state written into a buffer at the step number."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.GRUCell(F, H)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch, seq_len, _ = x.shape
        out = x.new_zeros(batch, seq_len, H)
        h = x.new_zeros(batch, H)
        for t in range(seq_len):
            h = self.cell(x[:, t], h)
            out[:, t] = h
        return out, h


class ForwardTable(nn.Module):
    """an HMM's forward algorithm, the table filled row by row from the row before."""

    def __init__(self) -> None:
        super().__init__()
        self.start = nn.Parameter(torch.randn(H))
        self.trans = nn.Parameter(torch.randn(H, H))
        self.emit = nn.Linear(F, H)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        emissions = self.emit(x).log_softmax(-1)
        T = emissions.shape[0]
        alpha = torch.full((T, x.shape[1], H), -1e4)
        alpha[0] = self.start + emissions[0]
        for t in range(1, T):
            alpha[t] = torch.logsumexp(alpha[t - 1].unsqueeze(2) + self.trans, 1) + emissions[t]
        return torch.logsumexp(alpha[-1], -1), alpha


class Accumulate(nn.Module):
    """a buffer added to at the step number (`+=`), made with a value before the loop."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(F, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.ones(x.shape[0], x.shape[1], H)
        h = torch.zeros(x.shape[1], H)
        for t in range(x.shape[0]):
            h = torch.tanh(self.proj(x[t]) + h)
            out[t] += h * 2
        return out


class FirstStep(nn.Module):
    """`if t == 0:` (no state yet) else the recurrence; h unbound before the loop."""

    def __init__(self) -> None:
        super().__init__()
        self.w_x, self.w_h = nn.Linear(F, H), nn.Linear(H, H, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        outputs = []
        for t in range(x.size(1)):
            if t == 0:
                h = torch.tanh(self.w_x(x[:, t]))
            else:
                h = torch.tanh(self.w_x(x[:, t]) + self.w_h(h))
            outputs.append(h)
        return torch.stack(outputs, dim=1), h


class LastStep(nn.Module):
    """the step number compared with the last one and used as a number."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        T = x.shape[0]
        h = torch.zeros(x.shape[1:])
        outs = []
        for t in range(T):
            h = h * 0.5 + x[t] * (t / T)
            outs.append(h * 2 if t == T - 1 else h)
        return torch.stack(outs), h


class ForgetMult(nn.Module):
    """QRNN's forget-mult: enumerate of `split(1, dim=0)`, the gates indexed at the step, a
    state that is None before the loop."""

    def forward(self, f: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        result = []
        forgets = f.split(1, dim=0)
        prev_h = None
        for i, h in enumerate((f * x).split(1, dim=0)):
            if prev_h is not None:
                h = h + (1 - forgets[i]) * prev_h
            h = h.view(h.size()[1:])
            result.append(h)
            prev_h = h
        return torch.stack(result)


class Bidirectional(nn.Module):
    """a forward and a backward loop reusing `t`, the backward outputs reversed."""

    def __init__(self) -> None:
        super().__init__()
        self.fw, self.bw = nn.RNNCell(F, H), nn.RNNCell(F, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h_f = h_b = x.new_zeros(x.shape[1], H)
        fw_outs, bw_outs = [], []
        for t in range(x.shape[0]):
            h_f = self.fw(x[t], h_f)
            fw_outs.append(h_f)
        for t in reversed(range(x.shape[0])):
            h_b = self.bw(x[t], h_b)
            bw_outs.append(h_b)
        return torch.cat([torch.stack(fw_outs), torch.stack(bw_outs[::-1])], -1)


class Euler(nn.Module):
    """a fixed-step ODE solver: the solution list starts with y0, zip of the time grid."""

    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Linear(F, F)

    def forward(self, y0: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        solution = [y0]
        y = y0
        for t0, t1 in zip(t[:-1], t[1:]):  # noqa: B905, RUF007 (as written)
            y = y + (t1 - t0) * torch.tanh(self.f(y))
            solution.append(y)
        return torch.stack(solution)


class NoGradSampler(nn.Module):
    """a sampler under @torch.no_grad(): noise drawn at every step, the loop reversed."""

    def __init__(self) -> None:
        super().__init__()
        self.denoise = nn.Linear(F, F)

    @torch.no_grad()
    def forward(self, x: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        for i in reversed(range(noise.shape[0])):
            x = x - 0.1 * self.denoise(x) + 0.01 * noise[i]
        return x


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


class Skips(nn.Module):
    """continue: a step skipped on a tensor's value."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = torch.zeros(x.shape[1:])
        for t in range(x.shape[0]):
            if x[t].sum() < 0:
                continue
            total = total + x[t]
        return total


class SkipsTwice(nn.Module):
    """continue inside a branch that also changes a carry."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = torch.zeros(x.shape[1:])
        for t in range(x.shape[0]):
            if x[t].sum() < 0:
                total = total * 0.5
                continue
            total = total + x[t]
        return total


class ListBuffer(nn.Module):
    """a Python list written at the step number."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [None] * x.shape[0]
        h = torch.zeros(x.shape[1:])
        for t in range(x.shape[0]):
            h = torch.tanh(x[t] + h)
            outs[t] = h
        return torch.stack(outs) if outs else h


class SearchElse(nn.Module):
    """break with an else clause (which runs where the loop does not break)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        found = torch.zeros(x.shape[1:])
        for t in range(x.shape[0]):
            found = x[t]
            if found.sum() > 0:
                break
        else:
            found = torch.zeros(x.shape[1:])
        return found


class Countdown(nn.Module):
    """while on a Python int: runs as Python, the reason at run time."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        i, h = 0, torch.zeros(x.shape[1:])
        while i < x.shape[0]:
            h = h * 0.5 + x[i]
            i += 1
        return h


class PythonRandom(nn.Module):
    """teacher forcing decided by Python's random at every step."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        random.seed(0)
        h = torch.zeros(x.shape[1:])
        for t in range(x.shape[0]):
            step_input = x[t] if random.random() < 0.5 else h
            h = torch.tanh(step_input + h)
        return h


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


class ItemTolerance(nn.Module):
    """a count of steps nobody reads, `if err.item() < tol: break` (the tensor compared in a
    scan, as Python compares the float)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.zeros(x.shape[1:])
        nits = 0
        for t in range(x.shape[0]):
            previous = h
            h = 0.5 * h + x[t]
            err = (h - previous).abs().sum(-1).mean()
            nits += 1  # noqa: SIM113 (as its authors count)
            if err.item() < 0.9:
                break
        return h


class IntItem(nn.Module):
    """`if hits.item() > 2: break` on an int64 count: its value read, which an export cannot do
    (nor the trace that finds the shapes of a loop of no step: that one runs as Python)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.zeros(x.shape[1:])
        for x_t in x:
            h = h + x_t
            if (h > 1).sum().item() > 2:
                break
        return h


class SplitRows(nn.Module):
    """pieces of split(1, 0) made before the loop, indexed at the count of an enumerate of other
    pieces."""

    def forward(self, f: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        forgets = f.split(1, dim=0)
        h = torch.zeros(1, *x.shape[1:])
        outs = []
        for i, x_t in enumerate(x.split(1, dim=0)):
            h = forgets[i] * h + (1 - forgets[i]) * x_t
            outs.append(h)
        return torch.cat(outs), h


class BufferSeenBetweenRuns(nn.Module):
    """a buffer made before an outer loop, written by an inner one, and viewed after it: the next
    run reads the view, which sees each write as it is made (so the inner loop stays Python)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(x.shape[0], 2, *x.shape[1:])
        previous = torch.zeros_like(x)
        for k in range(2):
            for t in range(x.shape[0]):
                out[t, k] = x[t] + previous[t - 1]
            previous = out[:, 1]
        return out


class OutArgument(nn.Module):
    """torch functions writing a step's results with out= into buffers made before the loop,
    under no_grad (out= takes no part in autograd)."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.RNNCell(F, H)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.zeros(x.shape[1], H)
        hs = x.new_empty(x.shape[0], x.shape[1], H)
        norms = torch.zeros(x.shape[1], x.shape[0])
        with torch.no_grad():
            for t in range(x.shape[0]):
                h = self.cell(x[t], h)
                torch.tanh(h, out=hs[t])
                torch.linalg.vector_norm(h, dim=-1, out=norms[:, t])
        return hs, norms


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
    "break": Program(Stops, lambda n: (_x(n),)),
    "greedy-decoding": Program(GreedyDecoder, lambda n: (torch.randn(B, H, generator=_g(n)),)),
    "fixed-point": Program(FixedPoint, lambda n: (torch.randn(B, H, generator=_g(n)),)),
    "conjugate-gradient": Program(ConjugateGradient, _spd, hoists=False),  # a while loop
    "power-iteration": Program(PowerIteration, _gapped, hoists=False),
    "buffer": Program(Buffer, lambda n: (_x(n, batch_first=True),), time_axis=1),
    # indexing the table at a step number computed from t reads t's value before torch 2.15
    "forward-table": Program(ForwardTable, lambda n: (_x(n + 1),), hoists=False),
    "accumulate": Program(Accumulate, lambda n: (_x(n),)),
    "first-step": Program(
        FirstStep, lambda n: (_x(n, batch_first=True),), True, time_axis=1, empty_raises=True
    ),
    "last-step": Program(LastStep, lambda n: (_x(n),), empty_raises=True),
    # the gates indexed at the step number, a tuple: read as a number in each step
    "forget-mult": Program(
        ForgetMult,
        lambda n: (torch.rand(n, B, F, generator=_g(n)), _x(n)),
        empty_raises=True,
        hoists=False,
    ),
    "bidirectional": Program(Bidirectional, lambda n: (_x(n),), empty_raises=True, loops=2),
    "euler": Program(Euler, lambda n: (_x(1)[0], torch.linspace(0, 1, n + 1))),
    "no-grad-sampler": Program(
        NoGradSampler, lambda n: (_x(1)[0], _x(n)), time_axis=0, differentiable=False
    ),
    "layers": Program(Layers, lambda n: (_x(n),), False, "counts to a Python number"),
    "python-random": Program(
        PythonRandom, lambda n: (_x(n),), False, "draws a number with Python's random"
    ),
    "continue": Program(Skips, lambda n: (_x(n),)),
    "continue-in-branch": Program(
        SkipsTwice, lambda n: (_x(n),), False, "`continue` skips the rest of a step"
    ),
    "list-buffer": Program(ListBuffer, lambda n: (_x(n),), False, "writes into `outs` at an index"),
    "break-else": Program(SearchElse, lambda n: (_x(n),), False, "its `else` clause (line"),
    "countdown": Program(
        Countdown, lambda n: (_x(n),), False, "its condition is a bool, not a tensor"
    ),
    "in-place": Program(InPlace, lambda n: (_x(n), torch.randn(B, F))),
    "counter": Program(
        Counter, lambda n: (_x(n + 1),), False, "`count` is an int after the first step"
    ),
    "attribute": Program(Attribute, lambda n: (_x(n + 1),), False, "sets the attribute"),
    "split-rows": Program(
        SplitRows, lambda n: (torch.rand(n + 1, B, F, generator=_g(n)), _x(n + 1))
    ),
    "buffer-seen-between-runs": Program(
        BufferSeenBetweenRuns, lambda n: (_x(n),), False, "writes into `out` at an index"
    ),
    "out-argument": Program(OutArgument, lambda n: (_x(n),), differentiable=False),
    "item-tolerance": Program(ItemTolerance, lambda n: (_x(n),)),
    "int-item-break": Program(
        IntItem,
        lambda n: (_x(n + 1),),
        hoists=False,  # reads a value
        export_error="is a Python bool made from a tensor's value",
    ),
}
