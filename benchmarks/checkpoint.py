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

A second table measures a ``loop`` over the same steps that ``until`` ends after ``T``
iterations (its body reads ``xs[i]``): without checkpointing, with ``Checkpoint(snapshots=c)``
and no ``trip_count`` (the online schedule), and with ``trip_count=T`` (the binomial schedule of
a known length); beside the iterations run, equinox's ``checkpointed_while_loop``'s count for
``c + 1`` checkpoints (``tests/_oracles.py`` counts its schedule) and revolve's optimum.

``--rss`` adds each implementation's peak resident memory: one forward + backward in a process of
its own, the process's peak (``VmHWM``, reset before the run) less its resident memory before
the run (Linux).

Every implementation's gradients are checked against the scan's before anything is measured
(within 1e-4 of the largest gradient: float32 sums over thousands of steps, in other orders
where a segment's products are hoisted; ``tests/test_checkpoint.py`` compares in float64).
Ratios are to the scan (the loop) without checkpointing. ``--plot PATH`` also draws kept memory
against time (needs matplotlib). Run ``python benchmarks/checkpoint.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils import checkpoint as torch_checkpoint

import torchscan

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests._oracles import equinox_online


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


def loop_implementations(snapshots: int) -> dict[str, Callable[..., Any]]:
    """Loops over the steps of ``xs`` that ``until`` ends after ``xs.shape[0]`` iterations."""

    def loop(trip_count: bool, **options: Any) -> Callable[..., Any]:
        def run(step: Callable, init: Any, xs: torch.Tensor, **_: Any) -> Any:
            last = xs.shape[0] - 1

            def body(i: torch.Tensor, carry: Any) -> Any:
                carry, y = step(carry, xs[i])
                return carry, y, torchscan.until(i >= last)

            count = xs.shape[0] if trip_count else None
            return torchscan.loop(body, init, trip_count=count, **options)

        return run

    binomial = torchscan.Checkpoint(snapshots=snapshots)
    return {
        "loop": loop(False),
        f"loop, Checkpoint(snapshots={snapshots}), online": loop(False, checkpoint=binomial),
        f"loop, trip_count=T, Checkpoint(snapshots={snapshots})": loop(True, checkpoint=binomial),
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


def _setup(cell_name: str, length: int, args: argparse.Namespace) -> tuple:
    torch.manual_seed(0)
    cell = cells(args.H)[cell_name]
    xs = torch.randn(length, args.B, args.H)
    zeros = torch.zeros(args.B, args.H)
    init = (zeros, zeros) if cell_name == "LSTM" else zeros
    return cell, xs, init


def peak_rss(cell_name: str, length: int, table: str, name: str, args: argparse.Namespace) -> int:
    """The peak resident bytes of one forward + backward of implementation ``name``, in a
    process of its own, less its resident memory before the run."""
    options = ["--B", str(args.B), "--H", str(args.H), "--snapshots", str(args.snapshots)]
    child = [sys.executable, __file__, *options, "--child", cell_name, str(length), table, name]
    done = subprocess.run(child, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def _status(field: str) -> int:
    """A size in bytes from ``/proc/self/status`` (``VmRSS``, ``VmHWM``: Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def child_rss(cell_name: str, length: int, table: str, name: str, args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    cell, xs, init = _setup(cell_name, length, args)
    impls = (implementations if table == "scan" else loop_implementations)(args.snapshots)
    step = step_of(cell)
    gc.collect()
    # the peak reset to what is resident now (Linux's clear_refs), the run's own peak read after
    Path("/proc/self/clear_refs").write_text("5")
    before = _status("VmRSS")
    loss_of(impls[name](step, init, xs)).backward()
    return _status("VmHWM") - before


def measure(cell_name: str, length: int, args: argparse.Namespace, table: str = "scan") -> dict:
    counter = [0]
    cell, xs, init = _setup(cell_name, length, args)
    step = step_of(cell)
    impls = (implementations if table == "scan" else loop_implementations)(args.snapshots)
    names = list(impls)
    record: dict[str, dict[str, Any]] = {name: {} for name in names}

    def gradients(name: str) -> list[torch.Tensor]:
        cell.zero_grad()
        loss_of(impls[name](step, init, xs)).backward()
        return [p.grad.clone() for p in cell.parameters()]

    expected = gradients(names[0])
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
        if args.rss:
            record[name]["rss"] = peak_rss(cell_name, length, table, name, args)
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
    parser.add_argument("--rss", action="store_true", help="measure peak resident memory too")
    parser.add_argument("--tables", nargs="+", default=["scan", "loop"], choices=["scan", "loop"])
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        cell_name, length, table, name = args.child
        print(json.dumps(child_rss(cell_name, int(length), table, name, args)))
        return
    torch.set_num_threads(1)
    results, loops = {}, {}
    for cell_name in args.cells:
        for length in args.T:
            if "scan" in args.tables:
                results[cell_name, length] = measure(cell_name, length, args)
            if "loop" in args.tables:
                loops[cell_name, length] = measure(cell_name, length, args, table="loop")
    print(
        f"forward + backward, B={args.B}, H={args.H}, 1 thread, median of {args.repeats}, "
        f"torch {torch.__version__}\n"
    )
    rss = " peak RSS (MiB) |" if args.rss else ""
    align = " ---: |" if args.rss else ""
    if results:
        print(
            f"| cell | T | implementation | kept (MiB) |{rss} time (s) | steps run | kept ratio "
            "| time ratio |"
        )
        print(f"| --- | ---: | --- | ---: |{align} ---: | ---: | ---: | ---: |")
        for (cell_name, length), record in results.items():
            for name, row in record.items():
                steps = str(row["steps"])
                if "snapshots" in name:
                    steps += f" (optimum {revolve_evaluations(length, args.snapshots)})"
                print(_row(cell_name, length, name, row, record["scan"], steps, args.rss))
    if loops:
        print(
            "\nA loop that until ends after T iterations; equinox's count for "
            f"{args.snapshots + 1} checkpoints\n"
        )
        print(
            f"| cell | T | implementation | kept (MiB) |{rss} time (s) | iterations run "
            "| equinox's | revolve's optimum | kept ratio | time ratio |"
        )
        print(f"| --- | ---: | --- | ---: |{align} ---: | ---: | ---: | ---: | ---: | ---: |")
        for (cell_name, length), record in loops.items():
            for name, row in record.items():
                if "snapshots" in name:
                    equinox = str(equinox_online(args.snapshots + 1, length)[0])
                    optimum = str(revolve_evaluations(length, args.snapshots))
                else:
                    equinox = optimum = "-"
                steps = f"{row['steps']} | {equinox} | {optimum}"
                print(_row(cell_name, length, name, row, record["loop"], steps, args.rss))
    if args.plot and results:
        plot(results, args.plot)


def _row(cell: str, length: int, name: str, row: dict, base: dict, steps: str, rss: bool) -> str:
    peak = f" {row['rss'] / 2**20:.1f} |" if rss else ""
    return (
        f"| {cell} | {length} | {name} | {row['kept'] / 2**20:.3f} |{peak} {row['time']:.3f} "
        f"| {steps} | {row['kept'] / base['kept']:.4f} | {row['time'] / base['time']:.3f} |"
    )


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
