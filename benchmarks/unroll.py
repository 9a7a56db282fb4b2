"""``torch.compile`` of ``torchscan.scan`` with and without ``unroll``, against the Python loop.

Inductor runs the loop operator a compiled scan becomes from its wrapper, which pays a cost at
every iteration (the condition's and the body's calls, the step counter read with ``.item()``,
the step's buffers); ``unroll=k`` runs ``k`` steps per iteration and divides that cost by ``k``.
For an Elman RNN step ``h = tanh(x @ W + h @ U)`` and an ``nn.LSTMCell``, at several lengths,
forward (under ``no_grad``) and forward + backward (gradients to the weights and ``xs``), with
Inductor's default options and with its C++ wrapper (``options={"cpp_wrapper": True}``), this
script times, interleaved in one process (each repetition runs all of them, in rotating order):

* the eager Python loop;
* the compiled ``torchscan.scan`` with ``unroll=1``: one step per iteration, as every compiled
  scan ran before ``unroll`` existed;
* the compiled ``torchscan.scan`` with its default ``unroll`` (chosen from the step's cost).

Each length is compiled on its own (``dynamic=False``), as a model trained or run at one length
is: ``unroll`` applies where the compiled graph knows the length.

Medians and their ratio to the eager Python loop are printed; every compiled result (and
gradient) is checked against the Python loop first. ``python benchmarks/unroll.py --help`` lists
the options; the figures of docs/benchmarks.md come from the defaults.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch._dynamo

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compiled_loop import python_loop_of

import torchscan

SETTINGS = {"default options": {}, "cpp_wrapper=True": {"cpp_wrapper": True}}
LOOP = "eager python loop"
BEFORE = "compiled torchscan.scan, unroll=1"
AFTER = "compiled torchscan.scan, default unroll"


def cells(batch: int, hidden: int, grad: bool) -> dict[str, tuple[Callable, Any, list]]:
    """name: (step, initial carry, parameters)."""
    W = (torch.randn(hidden, hidden) / hidden**0.5).requires_grad_(grad)
    U = (torch.randn(hidden, hidden) / hidden**0.5).requires_grad_(grad)
    lstm = torch.nn.LSTMCell(hidden, hidden).requires_grad_(grad)

    def elman(h, x):
        h = torch.tanh(x @ W + h @ U)
        return h, h

    def lstm_step(hc, x):
        h, c = lstm(x, hc)
        return (h, c), h

    zeros = torch.zeros(batch, hidden)
    return {
        "Elman": (elman, zeros, [W, U]),
        "LSTM": (lstm_step, (zeros, zeros.clone()), list(lstm.parameters())),
    }


def implementations(step: Callable, options: dict) -> dict[str, Callable]:
    def scan_by_one(h, xs):
        return torchscan.scan(step, h, xs, unroll=1)

    def scan(h, xs):
        return torchscan.scan(step, h, xs)

    # dynamic=False: a graph for each length, as a model trained or run at one length has
    # (unroll applies where the compiled graph knows the length)
    return {
        LOOP: python_loop_of(step),
        BEFORE: torch.compile(scan_by_one, options=options, dynamic=False),
        AFTER: torch.compile(scan, options=options, dynamic=False),
    }


def measure(
    impls: dict[str, Callable], run: Callable, repeats: int, budget_s: float
) -> dict[str, float]:
    """Median seconds per call of each implementation, interleaved in rotating order; each
    repetition calls each one enough times to take about ``budget_s``."""
    start = time.perf_counter()
    run(impls[LOOP])
    calls = max(1, int(budget_s / max(time.perf_counter() - start, 1e-6)))
    names = list(impls)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(repeats):
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            start = time.perf_counter()
            for _ in range(calls):
                run(impls[name])
            samples[name].append((time.perf_counter() - start) / calls)
    return {name: statistics.median(values) for name, values in samples.items()}


def runner(h0: Any, xs: torch.Tensor, params: list, grad: bool) -> Callable:
    """A call of an implementation: its outputs, and with ``grad`` the gradients of their sum."""

    def run(impl: Callable) -> list[torch.Tensor]:
        h, ys = impl(h0, xs)
        leaves = [*torch.utils._pytree.tree_leaves(h), ys]
        if not grad:
            return leaves
        loss = sum(t.sum() for t in leaves)
        return [*leaves, *torch.autograd.grad(loss, [*params, xs])]

    return run


def table(cell: str, mode: str, setting: str, args: argparse.Namespace) -> None:
    grad = mode == "backward"
    torch.manual_seed(0)
    torch._dynamo.reset()
    step, h0, params = cells(args.B, args.H, grad)[cell]
    impls = implementations(step, SETTINGS[setting])
    title = "forward + backward" if grad else "forward (no_grad)"
    print(f"### {cell}, {title}, {setting}\n")
    print("| T | implementation | median (ms) | ratio to eager python loop |")
    print("| ---: | --- | ---: | ---: |")
    for length in args.T:
        xs = torch.randn(length, args.B, args.H, requires_grad=grad)
        run = runner(h0, xs, params, grad)
        with torch.set_grad_enabled(grad):
            expected = run(impls[LOOP])
            for name in (BEFORE, AFTER):  # compiles on the first call
                for got, want in zip(run(impls[name]), expected, strict=True):
                    scale = float(want.detach().abs().max())
                    torch.testing.assert_close(got, want, msg=name, rtol=1e-4, atol=1e-5 * scale)
            medians = measure(impls, run, args.repeats, args.budget_s)
        for name, median in medians.items():
            ratio = median / medians[LOOP]
            print(f"| {length} | {name} | {median * 1e3:.3f} | {ratio:.3f} |")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", nargs="+", default=["Elman", "LSTM"], choices=["Elman", "LSTM"])
    parser.add_argument("--T", nargs="+", type=int, default=[20, 200, 2000], help="lengths")
    parser.add_argument("--B", type=int, default=8, help="batch size")
    parser.add_argument("--H", type=int, default=64, help="hidden size")
    parser.add_argument("--modes", nargs="+", default=["forward", "backward"])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--budget-s", type=float, default=0.05, help="time per repetition")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", module="torch")
    print(
        f"torch {torch.__version__}, B={args.B}, H={args.H}, {args.threads} thread(s), "
        f"medians of {args.repeats} interleaved repetitions\n"
    )
    for mode in args.modes:
        for setting in args.settings:
            for cell in args.cells:
                table(cell, mode, setting, args)


if __name__ == "__main__":
    main()
