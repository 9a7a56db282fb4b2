"""Eager speed of ``torchscan.scan`` against the hand-written loop and torch's own scan.

An Elman RNN step ``h = tanh(x @ W + h @ U)`` is run by three implementations, interleaved in one
process (each repetition runs all of them, in rotating order), and the medians are reported with
their ratio to the Python loop. Run ``python benchmarks/eager_scan.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch._higher_order_ops.scan import scan as torch_scan

import torchscan


def python_loop(step: Callable, h: torch.Tensor, xs: torch.Tensor):
    ys = []
    for x in xs:
        h, y = step(h, x)
        ys.append(y)
    return h, torch.stack(ys)


def implementations(step: Callable) -> dict[str, Callable]:
    def hop_step(h, x):
        h, y = step(h, x)
        return h, y.clone()  # torch's scan refuses an output that aliases the carry

    return {
        "python loop": lambda h, xs: python_loop(step, h, xs),
        "torchscan.scan": lambda h, xs: torchscan.scan(step, h, xs),
        "torch._higher_order_ops.scan": lambda h, xs: torch_scan(hop_step, h, xs),
    }


def measure(run: Callable[[], None], repeats: int, names: list[str]) -> dict[str, float]:
    """Median seconds of ``run(name)`` for every name, interleaved in rotating order."""
    samples: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(repeats):
        order = names[repeat % len(names) :] + names[: repeat % len(names)]
        for name in order:
            start = time.perf_counter()
            run(name)
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=1000, help="sequence length")
    parser.add_argument("--B", type=int, default=8, help="batch size")
    parser.add_argument("--H", type=int, default=64, help="hidden size")
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    W = (torch.randn(args.H, args.H) / args.H**0.5).requires_grad_()
    U = (torch.randn(args.H, args.H) / args.H**0.5).requires_grad_()
    xs = torch.randn(args.T, args.B, args.H, requires_grad=True)
    h0 = torch.zeros(args.B, args.H, requires_grad=True)

    def step(h, x):
        h = torch.tanh(x @ W + h @ U)
        return h, h

    impls = implementations(step)
    names = list(impls)

    def forward_no_grad(name):
        with torch.no_grad():
            impls[name](h0, xs)

    def forward(name):
        impls[name](h0, xs)

    def forward_backward(name):
        h, ys = impls[name](h0, xs)
        (h.sum() + ys.sum()).backward()

    for name in names:  # warm-up: torch's scan compiles on its first call
        forward_backward(name)
        forward_no_grad(name)

    print(
        f"Elman RNN, T={args.T}, B={args.B}, H={args.H}, {args.threads} thread(s), "
        f"median of {args.repeats}, torch {torch.__version__}\n"
    )
    print("| mode | implementation | median (ms) | ratio to python loop |")
    print("| --- | --- | ---: | ---: |")
    for mode, run in [
        ("forward, no_grad", forward_no_grad),
        ("forward, autograd on", forward),
        ("forward + backward", forward_backward),
    ]:
        medians = measure(run, args.repeats, names)
        for name in names:
            ratio = medians[name] / medians["python loop"]
            print(f"| {mode} | {name} | {medians[name] * 1e3:.2f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
