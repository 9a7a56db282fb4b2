"""Two source trees of torchscan side by side: eager, compiled, export and import times.

``python benchmarks/revisions.py OLD_SRC NEW_SRC`` measures a fixed set of workloads with the
torchscan found in each directory (a ``src`` folder of a checkout, e.g. one made by ``git worktree
add /tmp/old <commit>``). Each round runs one process per tree, in alternating order, and each
process measures every workload, interleaved, and reports its medians; the table gives the median
over rounds of each tree's medians and their ratio (new / old). The workloads use the public API
only, so any two revisions that have it can be compared:

* an Elman RNN step ``h = tanh(x @ W + h @ U)``, eager: T=1000 forward without autograd and
  forward + backward, and T=20 forward (where a call's fixed cost shows);
* an ``nn.LSTMCell`` (H=128, B=16, T=500) forward + backward;
* ``torch.compile`` of the Elman scan: the first call (compilation, Inductor's caches off) and a
  steady call (T=200);
* ``torch.onnx.export`` of an LSTM-cell scan at opsets 18 and 11 (the version conversion);
* the exported Elman scan imported by ``torchscan.onnx.to_torch``: a forward at T=20.

``--quick`` runs each workload once in one round, to check that the script works.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

# Every compilation is measured cold: Inductor's caches on disk would hide the passes' cost.
NO_COMPILE_CACHES = {"TORCHINDUCTOR_FX_GRAPH_CACHE": "0", "TORCHINDUCTOR_AUTOGRAD_CACHE": "0"}

WORKLOADS = [
    "elman T=1000 no_grad",
    "elman T=1000 fwd+bwd",
    "elman T=20 no_grad",
    "lstm T=500 fwd+bwd",
    "compile elman: first call",
    "compile elman T=200: steady",
    "export lstm opset 18",
    "export lstm opset 11",
    "imported elman T=20",
]


def _median_seconds(run: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def child(repeats: int) -> dict[str, float]:
    """Every workload's median seconds with the torchscan on ``sys.path``."""
    import logging
    import warnings

    import torch

    import torchscan
    import torchscan.onnx

    torch.set_num_threads(1)
    torch.manual_seed(0)
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    H, B = 64, 8
    W = (torch.randn(H, H) / H**0.5).requires_grad_()
    U = (torch.randn(H, H) / H**0.5).requires_grad_()

    def elman(h, x):
        h = torch.tanh(x @ W + h @ U)
        return h, h

    h0 = torch.zeros(B, H, requires_grad=True)
    xs_long = torch.randn(1000, B, H, requires_grad=True)
    xs_short = torch.randn(20, B, H)

    cell = torch.nn.LSTMCell(128, 128)
    lstm_xs = torch.randn(500, 16, 128, requires_grad=True)
    lstm_init = (torch.zeros(16, 128), torch.zeros(16, 128))

    def lstm_step(state, x):
        h, c = cell(x, state)
        return (h, c), h

    def no_grad_long():
        with torch.no_grad():
            torchscan.scan(elman, h0, xs_long)

    def fwd_bwd_long():
        h, ys = torchscan.scan(elman, h0, xs_long)
        (h.sum() + ys.sum()).backward()

    def no_grad_short():
        with torch.no_grad():
            torchscan.scan(elman, h0, xs_short)

    def lstm_fwd_bwd():
        (h, c), ys = torchscan.scan(lstm_step, lstm_init, lstm_xs)
        (h.sum() + c.sum() + ys.sum()).backward()

    class Elman(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.W = torch.nn.Parameter(W.detach().clone())
            self.U = torch.nn.Parameter(U.detach().clone())

        def forward(self, xs, h):
            def step(h, x):
                h = torch.tanh(x @ self.W + h @ self.U)
                return h, h

            return torchscan.scan(step, h, xs)

    class LSTM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cell = torch.nn.LSTMCell(32, 32)

        def forward(self, xs, h, c):
            def step(state, x):
                h, c = self.cell(x, state)
                return (h, c), h

            return torchscan.scan(step, (h, c), xs)

    elman_module = Elman()
    xs_compile = torch.randn(200, B, H)

    def compile_first():
        torch._dynamo.reset()
        compiled = torch.compile(elman_module)
        with torch.no_grad():
            compiled(xs_compile, h0.detach())
        return compiled

    compiled = compile_first()

    def compile_steady():
        with torch.no_grad():
            compiled(xs_compile, h0.detach())

    lstm_module = LSTM()
    lstm_args = (torch.randn(10, 4, 32), torch.zeros(4, 32), torch.zeros(4, 32))
    dims = ({0: torch.export.Dim("T")}, None, None)

    def export(opset: int) -> Callable[[], object]:
        def run():
            with tempfile.TemporaryDirectory() as folder:
                torch.onnx.export(
                    lstm_module,
                    lstm_args,
                    os.path.join(folder, "m.onnx"),
                    dynamic_shapes=dims,
                    opset_version=opset,
                )

        return run

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "elman.onnx")
        torch.onnx.export(
            elman_module,
            (xs_short, h0.detach()),
            path,
            dynamic_shapes=({0: torch.export.Dim("T")}, None),
        )
        imported = torchscan.onnx.to_torch(path)

    def imported_forward():
        with torch.no_grad():
            imported(xs_short, h0.detach())

    runs: dict[str, tuple[Callable[[], object], int]] = {
        "elman T=1000 no_grad": (no_grad_long, repeats),
        "elman T=1000 fwd+bwd": (fwd_bwd_long, repeats),
        "elman T=20 no_grad": (no_grad_short, 10 * repeats),
        "lstm T=500 fwd+bwd": (lstm_fwd_bwd, repeats),
        "compile elman: first call": (compile_first, 1),
        "compile elman T=200: steady": (compile_steady, repeats),
        "export lstm opset 18": (export(18), max(1, repeats // 3)),
        "export lstm opset 11": (export(11), max(1, repeats // 3)),
        "imported elman T=20": (imported_forward, 10 * repeats),
    }
    for run, _ in runs.values():  # warm-up
        run()
    compiled = compile_first()
    return {name: _median_seconds(run, count) for name, (run, count) in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", help="the src folder of the old tree")
    parser.add_argument("new", help="the src folder of the new tree")
    parser.add_argument("--rounds", type=int, default=5, help="processes per tree")
    parser.add_argument("--repeats", type=int, default=9, help="repetitions in each process")
    parser.add_argument("--quick", action="store_true", help="one round, one repetition")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.repeats = 1, 1
    if args.child:
        print(json.dumps(child(args.repeats)))
        return
    trees = {"old": os.path.abspath(args.old), "new": os.path.abspath(args.new)}
    medians: dict[str, dict[str, list[float]]] = {tree: {} for tree in trees}
    for round_ in range(args.rounds):
        order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
        for tree in order:
            env = dict(os.environ, PYTHONPATH=trees[tree], **NO_COMPILE_CACHES)
            command = [sys.executable, __file__, "x", "x", "--child", "--repeats"]
            done = subprocess.run(
                [*command, str(args.repeats)], env=env, capture_output=True, text=True
            )
            if done.returncode != 0:
                sys.exit(f"the {tree} tree's process failed:\n{done.stderr}")
            for name, seconds in json.loads(done.stdout.splitlines()[-1]).items():
                medians[tree].setdefault(name, []).append(seconds)
        print(f"round {round_ + 1} of {args.rounds} done", file=sys.stderr)
    print(
        f"{args.rounds} rounds of one process per tree, {args.repeats} repetitions per process, "
        f"1 thread\nold: {trees['old']}\nnew: {trees['new']}\n"
    )
    print("| workload | old (ms) | new (ms) | new / old |")
    print("| --- | ---: | ---: | ---: |")
    for name in WORKLOADS:
        old = statistics.median(medians["old"][name]) * 1e3
        new = statistics.median(medians["new"][name]) * 1e3
        print(f"| {name} | {old:.2f} | {new:.2f} | {new / old:.3f} |")


if __name__ == "__main__":
    main()
