"""Where the time of a loop operator compiled by Inductor on the CPU goes, and the fastest setting.

An Elman RNN step ``h = tanh(x @ W + h @ U)`` (forward under ``no_grad``, or with
``--backward`` forward and backward) runs as the eager
Python loop, the eager ``torchscan.scan``, and ``torchscan.scan`` and torch's own ``scan``
operator compiled by ``torch.compile`` with Inductor's default settings, without its size
assertions (``options={"size_asserts": False}``) and with its C++ wrapper
(``options={"cpp_wrapper": True}``), interleaved in one process (each repetition runs all of
them, in rotating order); medians and their ratio to the Python loop are reported. Every
compiled result is checked against the Python loop.

With its default Python wrapper, Inductor runs a loop operator's steps from Python: each step
calls the condition's and the body's generated functions, reads the step counter and the
condition with ``.item()``, allocates the step's buffers, and asserts the size and strides of
every input of the body (``assert_size_stride``). For a small step that costs more than the
step's kernels, which is why torch's own operator compiled with default options is slower than the
eager Python loop; torchscan's compilations leave the size assertions out, and the C++ wrapper
runs the same loop in C++. Run ``python benchmarks/compiled_loop.py --help`` for the
options.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable

import torch
from torch._higher_order_ops.scan import scan as torch_scan

import torchscan

SETTINGS = {
    "default": {},
    "size_asserts=False": {"size_asserts": False},
    "cpp_wrapper=True": {"cpp_wrapper": True},
}


def python_loop_of(step: Callable) -> Callable:
    """The Python loop a user would write over ``step``: ``(h, stacked ys)``."""

    def python_loop(h, xs):
        ys = []
        for x in xs:
            h, y = step(h, x)
            ys.append(y)
        return h, torch.stack(ys)

    return python_loop


def implementations(step: Callable) -> dict[str, Callable]:
    python_loop = python_loop_of(step)

    def hop_step(h, x):
        h, y = step(h, x)
        # torch's scan refuses outputs that alias each other or, with gradients, an input
        return h.clone(), y.clone()

    def scan(h, xs):
        return torchscan.scan(step, h, xs)

    def hop(h, xs):
        return torch_scan(hop_step, h, xs)

    found = {"eager python loop": python_loop, "eager torchscan.scan": scan}
    for name, options in SETTINGS.items():
        found[f"compiled torchscan.scan, {name}"] = torch.compile(scan, options=options)
    for name, options in SETTINGS.items():
        # fullgraph: without it, Inductor cannot compile the .item() of the loop it makes
        found[f"compiled torch scan operator, {name}"] = torch.compile(
            hop, options=options, fullgraph=True
        )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=200, help="sequence length")
    parser.add_argument("--B", type=int, default=8, help="batch size")
    parser.add_argument("--H", type=int, default=64, help="hidden size")
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--calls", type=int, default=5, help="calls per timed repetition")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument(
        "--backward", action="store_true", help="forward and backward, gradients to W, U and xs"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    warnings.filterwarnings("ignore", module="torch")

    grad = args.backward
    W = (torch.randn(args.H, args.H) / args.H**0.5).requires_grad_(grad)
    U = (torch.randn(args.H, args.H) / args.H**0.5).requires_grad_(grad)
    xs = torch.randn(args.T, args.B, args.H, requires_grad=grad)
    h0 = torch.zeros(args.B, args.H)

    def step(h, x):
        h = torch.tanh(x @ W + h @ U)
        return h, h

    def run(impl: Callable) -> list[torch.Tensor]:
        h, ys = impl(h0, xs)
        if not grad:
            return [h, ys]
        return [h, ys, *torch.autograd.grad(h.sum() + ys.sum(), [W, U, xs])]

    impls = implementations(step)
    names = list(impls)
    samples: dict[str, list[float]] = {name: [] for name in names}
    with torch.set_grad_enabled(grad):
        expected = run(impls["eager python loop"])
        for name in names:  # compiles on the first call
            for g, e in zip(run(impls[name]), expected, strict=True):
                # sums over every step and example: to float32's rounding of the largest
                scale = float(e.abs().max())
                torch.testing.assert_close(g, e, msg=name, rtol=1e-4, atol=1e-5 * scale)
        for repeat in range(args.repeats):
            order = names[repeat % len(names) :] + names[: repeat % len(names)]
            for name in order:
                start = time.perf_counter()
                for _ in range(args.calls):
                    run(impls[name])
                samples[name].append((time.perf_counter() - start) / args.calls)
    medians = {name: statistics.median(values) for name, values in samples.items()}

    mode = "forward + backward" if grad else "forward (no_grad)"
    print(
        f"Elman RNN {mode}, T={args.T}, B={args.B}, H={args.H}, "
        f"{args.threads} thread(s), median of {args.repeats}, torch {torch.__version__}\n"
    )
    print("| implementation | median (ms) | ratio to eager python loop |")
    print("| --- | ---: | ---: |")
    for name in names:
        ratio = medians[name] / medians["eager python loop"]
        print(f"| {name} | {medians[name] * 1e3:.3f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
