"""Time of ``torch.onnx.export`` for a model with a scan against the same model calling its body
once.

The two models are exported interleaved in one process (each repetition exports both, in
rotating order); medians and their ratio are reported. Run ``python benchmarks/export_time.py
--help`` for the options.
"""

from __future__ import annotations

import argparse
import gc
import logging
import statistics
import time
import warnings

import torch

import torchscan


class Step(torch.nn.Module):
    """An LSTM cell and a readout: the body of both models."""

    def __init__(self, features: int, hidden: int) -> None:
        super().__init__()
        self.cell = torch.nn.LSTMCell(features, hidden)
        self.readout = torch.nn.Linear(hidden, features)

    def forward(self, state, x):
        h, c = self.cell(x, state)
        return (h, c), self.readout(h)


class WithScan(torch.nn.Module):
    def __init__(self, step: Step) -> None:
        super().__init__()
        self.step = step

    def forward(self, xs, h, c):
        return torchscan.scan(self.step, (h, c), xs)


class BodyOnce(torch.nn.Module):
    def __init__(self, step: Step) -> None:
        super().__init__()
        self.step = step

    def forward(self, x, h, c):
        return self.step((h, c), x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=100, help="sequence length of the example")
    parser.add_argument("--B", type=int, default=8)
    parser.add_argument("--H", type=int, default=64)
    parser.add_argument("--opset", type=int, default=18)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")
    torch.manual_seed(0)

    step = Step(args.H, args.H).eval()
    h, c = torch.zeros(args.B, args.H), torch.zeros(args.B, args.H)
    xs = torch.randn(args.T, args.B, args.H)
    t, b = torch.export.Dim("T", min=1), torch.export.Dim("B", min=1)

    def export(model, inputs, dynamic_shapes=None):
        return lambda: torch.onnx.export(
            model, inputs, opset_version=args.opset, dynamic_shapes=dynamic_shapes, verbose=False
        )

    # Each scan is compared with the body called once under the same kind of shapes: symbolic
    # dimensions cost torch.export time of their own.
    exports = {
        "body called once, static shapes": export(BodyOnce(step), (xs[0], h, c)),
        "scan, static shapes": export(WithScan(step), (xs, h, c)),
        "body called once, dynamic batch": export(
            BodyOnce(step), (xs[0], h, c), ({0: b}, {0: b}, {0: b})
        ),
        "scan, dynamic batch and time": export(
            WithScan(step), (xs, h, c), ({0: t, 1: b}, {0: b}, {0: b})
        ),
    }
    baseline = {
        "scan, static shapes": "body called once, static shapes",
        "scan, dynamic batch and time": "body called once, dynamic batch",
    }
    names = list(exports)
    for name in names:  # warm-up: the first export imports and builds torch.onnx's registry
        exports[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(args.repeats):
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            # What one export leaves is collected before the next, not inside its timing.
            gc.collect()
            start = time.perf_counter()
            exports[name]()
            samples[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(v) for name, v in samples.items()}
    print(
        f"torch.onnx.export, LSTM cell + readout, B={args.B}, H={args.H}, example T={args.T}, "
        f"opset {args.opset}, median of {args.repeats}, torch {torch.__version__}\n"
    )
    print("| model | median export time (s) | ratio to the body called once |")
    print("| --- | ---: | ---: |")
    for name in names:
        ratio = medians[name] / medians[baseline.get(name, name)]
        print(f"| {name} | {medians[name]:.3f} | {ratio:.2f} |")
    if args.opset < 18:
        conversion_time(WithScan(step), (xs, h, c), ({0: t, 1: b}, {0: b}, {0: b}), args)


def conversion_time(model, inputs, dynamic_shapes, args) -> None:
    """The part of an export below opset 18 that is torchscan's conversion: the scan model as
    torch.onnx builds and optimizes it at opset 18, converted to the asked opset."""
    from torchscan.onnx._export import _convert

    built = torch.onnx.export(
        model, inputs, opset_version=18, dynamic_shapes=dynamic_shapes, verbose=False
    ).model
    samples = []
    for _ in range(2 * args.repeats + 1):
        gc.collect()
        start = time.perf_counter()
        _convert.convert_model(built, args.opset)
        samples.append(time.perf_counter() - start)
    print(
        f"\nof which the conversion of the scan model (dynamic shapes) from opset 18 to opset "
        f"{args.opset}: median {1000 * statistics.median(samples):.1f} ms"
    )


if __name__ == "__main__":
    main()
