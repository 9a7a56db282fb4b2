"""Loops converted by ``torchscan.autoloop`` against the same loops as written.

Five models as their authors write them (an Elman RNN with ``x[t]`` and a GRU cell over the rows
of ``x``, outputs appended to a list and stacked; a batch-first GRU cell writing its states into
a buffer, ``out[:, t] = h``; a fixed-point iteration that stops at a tolerance, ``if ...:
break``, at most T steps; conjugate gradient, ``while`` on the residual), run as written and
converted by ``torchscan.autoloop``, interleaved in one process (each repetition runs both, in
rotating order) on one thread: forward (``no_grad``) and forward + backward. The medians are
reported, and the converted loop's ratio to the loop as written (below 1: faster). The converted
model is checked against the original before it is timed, and called three times first (a scan's
step is hoisted from its third call). Options: ``--T --B --H --repeats --threads``.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

import suite

import torchscan


class Elman(torch.nn.Module):
    def __init__(self, features: int, hidden: int) -> None:
        super().__init__()
        self.wx = torch.nn.Linear(features, hidden)
        self.wh = torch.nn.Linear(hidden, hidden, bias=False)
        self.hidden = hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.new_zeros(x.shape[1], self.hidden)
        outputs = []
        for t in range(x.shape[0]):
            h = torch.tanh(self.wx(x[t]) + self.wh(h))
            outputs.append(h)
        return torch.stack(outputs)


class GRU(torch.nn.Module):
    def __init__(self, features: int, hidden: int) -> None:
        super().__init__()
        self.cell = torch.nn.GRUCell(features, hidden)
        self.hidden = hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.new_zeros(x.shape[1], self.hidden)
        outs = []
        for x_t in x:
            h = self.cell(x_t, h)
            outs.append(h)
        return torch.stack(outs)


class Buffer(torch.nn.Module):
    def __init__(self, features: int, hidden: int) -> None:
        super().__init__()
        self.cell = torch.nn.GRUCell(features, hidden)
        self.hidden = hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.transpose(0, 1)  # batch first
        batch, seq_len, _ = x.shape
        out = x.new_zeros(batch, seq_len, self.hidden)
        h = x.new_zeros(batch, self.hidden)
        for t in range(seq_len):
            h = self.cell(x[:, t], h)
            out[:, t] = h
        return out


class FixedPoint(torch.nn.Module):
    def __init__(self, features: int, hidden: int) -> None:
        super().__init__()
        self.w = torch.nn.Linear(hidden, hidden)
        with torch.no_grad():  # a contraction: some 50 steps to the tolerance
            self.w.weight.copy_(torch.randn(hidden, hidden) * 0.9 / hidden**0.5)
        self.tol = 1e-5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = x.mean(0) * 4
        z = torch.zeros_like(u)
        for _ in range(x.shape[0]):
            z_next = torch.tanh(self.w(z) + u)
            if (z_next - z).abs().max() < self.tol:
                break
            z = z_next
        return z


class ConjugateGradient(torch.nn.Module):
    def __init__(self, features: int, hidden: int) -> None:
        super().__init__()
        m = torch.randn(hidden, hidden) / hidden**0.5
        self.a = torch.nn.Parameter(m @ m.T + torch.eye(hidden))  # some 20 steps to the tolerance

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.mean(0)
        z = torch.zeros_like(b)
        r = b - z @ self.a
        p = r
        rs = (r * r).sum()
        tol = 1e-8 * rs
        while rs > tol:
            ap = p @ self.a
            alpha = rs / (p * ap).sum()
            z = z + alpha * p
            r = r - alpha * ap
            rs_new = (r * r).sum()
            p = r + (rs_new / rs) * p
            rs = rs_new
        return z


MODELS = (
    ("Elman (x[t])", Elman),
    ("GRUCell (rows of x)", GRU),
    ("GRUCell (out[:, t] = h)", Buffer),
    ("fixed point (break)", FixedPoint),
    ("conjugate gradient (while)", ConjugateGradient),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=256)
    parser.add_argument("--B", type=int, default=16)
    parser.add_argument("--H", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x = torch.randn(args.T, args.B, args.H)
    print(
        f"*{suite.measured_on()}; T={args.T}, B={args.B}, H={args.H}, {args.threads} "
        f"thread(s), median of {args.repeats}, torch {torch.__version__}*\n"
    )
    print("| model | mode | as written (ms) | converted (ms) | ratio |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name, cls in MODELS:
        written = cls(args.H, args.H)
        converted = torchscan.autoloop(copy.deepcopy(written))
        for mode in ("forward, no_grad", "forward + backward"):
            backward = mode == "forward + backward"

            def run(model, backward=backward):
                with torch.set_grad_enabled(backward):
                    out = model(x)
                    if backward:
                        out.sum().backward()
                return out.detach()

            want = run(written)
            for _ in range(3):  # hoisted from the third call
                suite.check_close(name, [run(converted)], [want])
            runs = {
                "written": lambda m=written: run(m),
                "converted": lambda m=converted: run(m),
            }
            medians = suite.interleaved_medians(runs, args.repeats)
            ratio = medians["converted"] / medians["written"]
            print(
                f"| {name} | {mode} | {medians['written'] * 1e3:.2f} | "
                f"{medians['converted'] * 1e3:.2f} | {ratio:.3f} |"
            )


if __name__ == "__main__":
    main()
