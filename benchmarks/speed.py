"""Speed of ``torchscan.scan`` against the loop one would write: eager, hoisted and compiled.

For an Elman RNN, an LSTM and a GRU cell (one layer; the parameters of a ``torch.nn.RNN`` /
``LSTM`` / ``GRU`` shared with the cell) at every hidden size, batch size and length asked for,
the implementations below run interleaved in one process (each repetition runs all of them, in
rotating order), forward (``no_grad``) and forward + backward, on one thread, and the medians
are reported as ratios to the Python loop:

* ``python loop``: the hand-written loop over the cell;
* ``hand-hoisted loop``: the same loop with the input projection ``x @ W_ih.T + b_ih``
  computed once for the whole sequence by hand (what hoisting does automatically);
* ``torchscan.scan``: as it runs by default (hoisted where the step allows it, from the
  third call of a signature);
* ``torchscan.scan, hoist=False``: the Python loop of every step, checked;
* ``torch.nn module``: the fused ``torch.nn.RNN`` / ``LSTM`` / ``GRU``;
* ``torch._higher_order_ops.scan``: torch's own scan operator, eagerly;
* with ``--compiled``, ``torchscan.scan`` under ``torch.compile`` with default options and
  with Inductor's C++ wrapper (``options={"cpp_wrapper": True}``), compiled before timing.

``--memory`` adds the peak of the bytes allocated during one forward (``no_grad``) and one
forward + backward of each implementation: on the CPU from the profiler's allocation events, on
a GPU from its caching allocator's peak statistics.

``--device cuda`` runs everything on the GPU (each run ends by waiting for the device; cuDNN's
TF32 is turned off, so that every implementation computes in float32 alike).

Every implementation is checked against the Python loop before it is timed.
``python benchmarks/speed.py`` prints a markdown table (and ``--json FILE`` writes the raw
medians); ``--quick`` runs tiny sizes once, to check that everything works. Run
``python benchmarks/speed.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

import suite

import torchscan

LOOP, HAND, SCAN, EAGER = "python loop", "hand-hoisted loop", "torchscan.scan", "hoist=False"
NATIVE, HOP = "torch.nn module", "torch._higher_order_ops.scan"
COMPILED, CPP = "compiled, default", "compiled, cpp_wrapper"


class HandHoisted(torch.nn.Module):
    """The loop with the input projection of every step computed at once, by hand."""

    def __init__(self, net: torch.nn.RNNBase, kind: str) -> None:
        super().__init__()
        self.net, self.kind = net, kind

    def forward(self, xs: torch.Tensor, carry: Any) -> tuple[Any, torch.Tensor]:
        net = self.net
        projected = torch.nn.functional.linear(xs, net.weight_ih_l0, net.bias_ih_l0)
        w_hh, b_hh = net.weight_hh_l0, net.bias_hh_l0
        ys = []
        if self.kind == "RNN":
            h = carry
            for p in projected:
                h = torch.tanh(p + torch.nn.functional.linear(h, w_hh, b_hh))
                ys.append(h)
            return h, torch.stack(ys)
        if self.kind == "GRU":
            h = carry
            for p in projected:
                r_i, z_i, n_i = p.chunk(3, 1)
                r_h, z_h, n_h = torch.nn.functional.linear(h, w_hh, b_hh).chunk(3, 1)
                r, z = torch.sigmoid(r_i + r_h), torch.sigmoid(z_i + z_h)
                n = torch.tanh(n_i + r * n_h)
                h = (1 - z) * n + z * h
                ys.append(h)
            return h, torch.stack(ys)
        h, c = carry
        for p in projected:
            gates = p + torch.nn.functional.linear(h, w_hh, b_hh)
            i, f, g, o = gates.chunk(4, 1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            ys.append(h)
        return (h, c), torch.stack(ys)


class Unhoisted(suite.PythonLoop):
    def forward(self, xs: torch.Tensor, carry: Any) -> tuple[Any, torch.Tensor]:
        return torchscan.scan(self.step, carry, xs, hoist=False)


def models(rec: suite.Recurrence, compiled: bool) -> dict[str, torch.nn.Module]:
    found = {
        LOOP: rec.models[suite.LOOP],
        HAND: HandHoisted(rec.models[suite.NATIVE].net, rec.kind),
        SCAN: rec.models[suite.SCAN],
        EAGER: Unhoisted(rec.models[suite.LOOP].step),
        NATIVE: rec.models[suite.NATIVE],
        HOP: rec.models[suite.HOP],
    }
    if compiled:
        found[COMPILED] = torch.compile(suite.TorchscanScan(rec.models[suite.LOOP].step))
        found[CPP] = torch.compile(
            suite.TorchscanScan(rec.models[suite.LOOP].step), options={"cpp_wrapper": True}
        )
    return found


def synchronized(run: Any, device: str) -> Any:
    """``run``, then wait for the device: a GPU's work is timed to its end, not its launch."""
    if device == "cpu":
        return run

    def run_and_wait() -> object:
        out = run()
        torch.cuda.synchronize()
        return out

    return run_and_wait


def peak_bytes(run: Any, device: str) -> int:
    """The peak of the bytes allocated while ``run`` runs, above the level it started from."""
    if device == "cpu":
        return suite.peak_allocated_bytes(run)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    run()
    return torch.cuda.max_memory_allocated() - before


def check(found: dict[str, torch.nn.Module], xs: torch.Tensor, carry: Any) -> None:
    with torch.no_grad():
        want = suite.flat(found[LOOP](xs, carry))
        for name, model in found.items():
            for _ in range(3):  # the third call of torchscan.scan is the hoisted one
                got = suite.flat(model(xs, carry))
            suite.check_close(name, got, want)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", nargs="+", default=["RNN", "LSTM", "GRU"])
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1, 10, 100, 1000])
    parser.add_argument("--budget", type=float, default=2.0, help="seconds per configuration")
    parser.add_argument("--max-repeats", type=int, default=51)
    parser.add_argument("--compiled", action="store_true", help="add torch.compile's variants")
    parser.add_argument("--memory", action="store_true", help="add the peak bytes allocated")
    parser.add_argument("--no-hop", action="store_true", help="leave out torch's scan operator")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, once each")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--json", type=Path, help="write the raw medians here")
    args = parser.parse_args()
    if args.quick:
        args.hidden, args.batch, args.lengths, args.budget = [4], [2], [1, 3], 0.0
    settings = suite.Settings(
        lengths=tuple(args.lengths),
        hiddens=tuple(args.hidden),
        batch=0,
        unroll_max=0,
        budget_s=args.budget,
        min_repeats=1 if args.quick else 5,
        max_repeats=1 if args.quick else args.max_repeats,
        export_repeats=0,
        export_hidden=0,
    )
    torch.set_num_threads(1)
    device = args.device
    where = "1 thread"
    if device != "cpu":
        torch.backends.cudnn.allow_tf32 = False
        where = f"{torch.cuda.get_device_name(device)}, cuDNN TF32 off"
    records = []
    print(f"torch {torch.__version__}, {where}, ratios of medians to the Python loop\n")
    for kind in args.cells:
        for hidden in args.hidden:
            rec = suite.Recurrence.make(kind, hidden)
            found = {name: model.to(device) for name, model in models(rec, args.compiled).items()}
            if args.no_hop:
                del found[HOP]
            names = list(found)
            memory: list[str] = []
            print(f"### {kind}, H={hidden}\n")
            print("| B | T | mode | " + " | ".join(names) + " |")
            print("| ---: | ---: | --- | " + " | ".join("---:" for _ in names) + " |")
            for batch in args.batch:
                for length in args.lengths:
                    xs, carry = rec.inputs(length, batch, grad=True, device=device)
                    check(found, xs, carry)
                    for mode in suite.MODES:
                        timed = {
                            name: synchronized(run, device)
                            for name, run in suite.runs_of(found, xs, carry, mode).items()
                        }
                        repeats = suite.warm_up(timed, settings)
                        medians = suite.interleaved_medians(timed, repeats)
                        record: dict[str, Any] = {
                            "cell": kind, "H": hidden, "B": batch, "T": length, "mode": mode,
                            "repeats": repeats, "median_s": medians,
                        }  # fmt: skip
                        cells = [f"{medians[n] / medians[LOOP]:.2f}" for n in names]
                        if args.memory:
                            peaks = {n: peak_bytes(run, device) for n, run in timed.items()}
                            record["peak_bytes"] = peaks
                            memory.append(
                                f"| {batch} | {length} | {mode} | "
                                + " | ".join(f"{peaks[n] / 2**10:.1f}" for n in names)
                                + " |"
                            )
                        records.append(record)
                        loop_us = medians[LOOP] * 1e6
                        print(
                            f"| {batch} | {length} | {mode} ({loop_us:.0f} µs) | "
                            + " | ".join(cells)
                            + " |",
                            flush=True,
                        )
            print()
            if memory:
                print(f"Peak KiB allocated ({device}), {kind}, H={hidden}:\n")
                print("| B | T | mode | " + " | ".join(names) + " |")
                print("| ---: | ---: | --- | " + " | ".join("---:" for _ in names) + " |")
                print("\n".join(memory) + "\n")
            print()
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
