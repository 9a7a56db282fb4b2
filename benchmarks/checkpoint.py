"""Memory and time of ``scan(..., checkpoint=...)``, against the scan without it and against
``torch.utils.checkpoint`` applied by hand to chunks of a Python loop.

For a GRU cell and an LSTM cell (``--H`` units, a batch of ``--B``) over each length of ``--T``,
one thread, forward + backward of ``h.sum() + ys.sum()``:

* kept: the bytes the forward pass keeps for the backward pass: the storages of the tensors it
  made that are alive when it returns, less the outputs ``h`` and ``ys`` (counted through the
  garbage collector, which makes it exact and the same at every run);
* time: the median of forward + backward, every implementation of a configuration interleaved
  in rotating order;
* steps run: the calls of the step function, forward and backward (counted on a run without
  hoisting); for the binomial schedule, Griewank's optimum beside it.

Every implementation's gradients are checked against the scan's before anything is measured
(within 1e-4 of the largest gradient: float32 sums over thousands of steps, in other orders
where a segment's products are hoisted; ``tests/test_checkpoint.py`` compares in float64).
Ratios are to the scan without checkpointing. ``--plot PATH`` also draws kept memory against time
(needs matplotlib). Run ``python benchmarks/checkpoint.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import checkpoint as torch_checkpoint

import torchscan


def cells(hidden: int) -> dict[str, torch.nn.Module]:
    return {"GRU": torch.nn.GRUCell(hidden, hidden), "LSTM": torch.nn.LSTMCell(hidden, hidden)}


def step_of(cell: torch.nn.Module) -> Callable[[Any, torch.Tensor], Any]:
    """The cell's step written out of place with its parameters (``torch.nn.GRUCell`` and
    ``LSTMCell`` add into the products they take, which ``save=`` may not keep)."""
    w_ih, w_hh, b_ih, b_hh = cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh

    def gru(h: torch.Tensor, x: torch.Tensor) -> Any:
        i_r, i_z, i_n = torch.nn.functional.linear(x, w_ih, b_ih).chunk(3, -1)
        h_r, h_z, h_n = torch.nn.functional.linear(h, w_hh, b_hh).chunk(3, -1)
        r, z = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
        h = (1 - z) * torch.tanh(i_n + r * h_n) + z * h
        return h, h

    def lstm(carry: Any, x: torch.Tensor) -> Any:
        h, c = carry
        gates = torch.nn.functional.linear(x, w_ih, b_ih) + torch.nn.functional.linear(
            h, w_hh, b_hh
        )
        i, f, g, o = gates.chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        return (h, c), h

    return lstm if isinstance(cell, torch.nn.LSTMCell) else gru


def counting(step: Callable[[Any, torch.Tensor], Any], counter: list[int]) -> Callable[..., Any]:
    """``step``, counting its calls in ``counter[0]`` (a step that changes state is never
    hoisted: the timed runs use ``step`` itself)."""

    def counted(carry: Any, x: torch.Tensor) -> Any:
        counter[0] += 1
        return step(carry, x)

    return counted


def chunked_python_loop(step: Callable, init: Any, xs: torch.Tensor, chunk: int) -> Any:
    """``torch.utils.checkpoint`` by hand: each chunk of a Python loop checkpointed."""

    def run(carry: Any, piece: torch.Tensor) -> Any:
        ys = []
        for x in piece:
            carry, y = step(carry, x)
            ys.append(y)
        return carry, torch.stack(ys)

    carry, pieces = init, []
    for start in range(0, xs.shape[0], chunk):
        carry, ys = torch_checkpoint.checkpoint(
            run, carry, xs[start : start + chunk], use_reentrant=False
        )
        pieces.append(ys)
    return carry, torch.cat(pieces)


def implementations(snapshots: int) -> dict[str, Callable[..., Any]]:
    def scan(**options: Any) -> Callable[..., Any]:
        return lambda step, init, xs, **extra: torchscan.scan(step, init, xs, **options, **extra)

    save = [torch.ops.aten.mm, torch.ops.aten.addmm]
    return {
        "scan": scan(),
        'scan, checkpoint="sqrt"': scan(checkpoint="sqrt"),
        f"scan, Checkpoint(snapshots={snapshots})": scan(
            checkpoint=torchscan.Checkpoint(snapshots=snapshots)
        ),
        'scan, Checkpoint(every="sqrt", save=mm)': scan(
            checkpoint=torchscan.Checkpoint(every="sqrt", save=save)
        ),
        "Python loop, torch.utils.checkpoint per sqrt(T) chunk": lambda step, init, xs, **_: (
            chunked_python_loop(step, init, xs, math.isqrt(xs.shape[0] - 1) + 1)
        ),
    }


def loss_of(out: Any) -> torch.Tensor:
    carry, ys = out
    return sum(leaf.sum() for leaf in torch.utils._pytree.tree_leaves(carry)) + ys.sum()


_TENSORS = (torch.Tensor, torch.nn.Parameter)  # (isinstance would ask deprecated objects)


def kept_bytes(run: Callable[[], Any]) -> int:
    """The bytes of the storages of the tensors that ``run`` made and that are still alive when
    it returns, less its outputs: what the forward pass keeps for the backward pass, carries
    and random generators' states included (deterministic, unlike the process's memory)."""
    gc.collect()
    before = [t for t in gc.get_objects() if type(t) in _TENSORS]
    old = {id(t) for t in before}
    # (a new view of an old storage, such as a step of xs, keeps no new memory)
    old_storages = {t.untyped_storage().data_ptr() for t in before}
    del before
    out = run()
    gc.collect()
    outputs = {
        t.untyped_storage().data_ptr()
        for t in torch.utils._pytree.tree_leaves(out)
        if isinstance(t, torch.Tensor)
    }
    storages = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
        for t in gc.get_objects()
        if type(t) in _TENSORS and id(t) not in old
    }
    return sum(
        size
        for address, size in storages.items()
        if address not in outputs and address not in old_storages
    )


def revolve_evaluations(n: int, snapshots: int) -> int:
    s, r = snapshots + 1, 0
    while math.comb(s + r, s) < n:
        r += 1
    return r * n - math.comb(s + 1 + r - 1, s + 1) + n


def measure(cell_name: str, cell: torch.nn.Module, length: int, args: argparse.Namespace) -> dict:
    torch.manual_seed(0)
    counter = [0]
    step = step_of(cell)
    xs = torch.randn(length, args.B, args.H)
    zeros = torch.zeros(args.B, args.H)
    init = (zeros, zeros) if cell_name == "LSTM" else zeros
    impls = implementations(args.snapshots)
    names = list(impls)
    record: dict[str, dict[str, Any]] = {name: {} for name in names}

    def gradients(name: str) -> list[torch.Tensor]:
        cell.zero_grad()
        loss_of(impls[name](step, init, xs)).backward()
        return [p.grad.clone() for p in cell.parameters()]

    expected = gradients("scan")
    for name in names:
        for got, want in zip(gradients(name), expected, strict=True):
            # float32 sums over T steps in other orders (a segment's hoisted products)
            scale = want.abs().max().item()
            torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4 * scale)
        counter[0] = 0
        options = {"hoist": False} if name.startswith("scan") else {}
        cell.zero_grad()
        loss_of(impls[name](counting(step, counter), init, xs, **options)).backward()
        record[name]["steps"] = counter[0]
        record[name]["kept"] = kept_bytes(lambda name=name: impls[name](step, init, xs))
    samples: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(args.repeats):
        order = names[repeat % len(names) :] + names[: repeat % len(names)]
        for name in order:
            cell.zero_grad()
            start = time.perf_counter()
            loss_of(impls[name](step, init, xs)).backward()
            samples[name].append(time.perf_counter() - start)
    for name in names:
        record[name]["time"] = statistics.median(samples[name])
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, nargs="+", default=[1000, 4000, 16000])
    parser.add_argument("--B", type=int, default=16)
    parser.add_argument("--H", type=int, default=128)
    parser.add_argument("--snapshots", type=int, default=10, help="of the binomial schedule")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cells", nargs="+", default=["GRU", "LSTM"])
    parser.add_argument("--plot", help="write kept memory against time to this PNG")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = {}
    for cell_name in args.cells:
        cell = cells(args.H)[cell_name]
        for length in args.T:
            results[cell_name, length] = measure(cell_name, cell, length, args)
    print(
        f"forward + backward, B={args.B}, H={args.H}, 1 thread, median of {args.repeats}, "
        f"torch {torch.__version__}\n"
    )
    print(
        "| cell | T | implementation | kept (MiB) | time (s) | steps run | kept ratio "
        "| time ratio |"
    )
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for (cell_name, length), record in results.items():
        base = record["scan"]
        for name, row in record.items():
            steps = str(row["steps"])
            if "snapshots" in name:
                steps += f" (optimum {revolve_evaluations(length, args.snapshots)})"
            print(
                f"| {cell_name} | {length} | {name} | {row['kept'] / 2**20:.3f} "
                f"| {row['time']:.3f} | {steps} | {row['kept'] / base['kept']:.4f} "
                f"| {row['time'] / base['time']:.3f} |"
            )
    if args.plot:
        plot(results, args.plot)


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    keys = list(results)
    figure, axes = pyplot.subplots(1, len(keys), figsize=(4 * len(keys), 3.6), squeeze=False)
    for axis, key in zip(axes[0], keys, strict=True):
        for name, row in results[key].items():
            axis.scatter(row["time"], row["kept"] / 2**20, label=name)
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_title(f"{key[0]} cell, T={key[1]}")
        axis.set_xlabel("forward + backward (s)")
        axis.set_ylabel("kept for backward (MiB)")
    axes[0][0].legend(fontsize=6)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
