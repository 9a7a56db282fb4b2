"""``torch.compile`` of ``torchscan.scan`` against the compiled Python loop: compile time and speed.

Under ``torch.compile`` a ``torchscan.scan`` becomes one loop operator (torch's ``scan``), while
TorchDynamo unrolls a Python ``for`` loop into a graph of every step, fixed to one length. For the
Elman RNN step ``h = tanh(x @ W + h @ U)`` at several lengths this script measures

* the compile time: ``torch._dynamo.reset()`` and an empty Inductor cache
  (``torch._inductor.utils.fresh_cache``), then the first call of ``torch.compile(f)``; the
  compilations of the two implementations interleaved, medians of ``--compile-repeats`` (a
  compilation longer than ``--once-above-s`` is measured once);
* the steady-state time of a call after warm-up, interleaved with the eager ``torchscan.scan``
  and the eager Python loop, medians; ratios to the compiled Python loop;
* how many graphs are compiled when one compiled function is called at every length, with
  TorchDynamo's automatic dynamic shapes (the default) and with ``dynamic=True``.

Modes: ``forward`` (under ``no_grad``) and ``backward`` (forward + backward), with torch's
settings as they are. Every compiled result is checked against the eager Python loop, and every
compiled graph is inspected for the loop operator.

``python benchmarks/compile_scan.py --modes forward backward`` writes ``compile.md`` (also
printed), ``compile.json`` and, with matplotlib (``pip install "torchscan-onnx[bench]"``), the
plot ``compile.png`` to ``docs/benchmarks/``. Run ``python benchmarks/compile_scan.py --help`` for
the options.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch._dynamo
from torch._inductor.utils import fresh_cache

sys.path.insert(0, str(Path(__file__).resolve().parent))

import suite

import torchscan

ROOT = Path(__file__).resolve().parents[1]
SCAN = "torchscan.scan"
LOOP = "python loop"
COMPILED_SCAN = f"compiled {SCAN}"
COMPILED_LOOP = f"compiled {LOOP}"
EAGER_SCAN = f"eager {SCAN}"
EAGER_LOOP = f"eager {LOOP}"
MODES = {"forward": "forward, no_grad", "backward": "forward + backward"}
LOOP_OPERATORS = ("scan", "while_loop")
ATOL = RTOL = 1e-4


def progress(message: str) -> None:
    """Progress goes to stderr: stdout is the markdown of the results."""
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# The model


class Elman:
    """The Elman RNN step and the two ways to loop it; ``backward`` records gradients."""

    def __init__(self, batch: int, hidden: int, backward: bool) -> None:
        torch.manual_seed(0)
        self.W = (torch.randn(hidden, hidden) / hidden**0.5).requires_grad_(backward)
        self.U = (torch.randn(hidden, hidden) / hidden**0.5).requires_grad_(backward)
        self.batch, self.hidden, self.backward = batch, hidden, backward

    def step(self, h: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(x @ self.W + h @ self.U)
        return h, h

    def scan(self, h: torch.Tensor, xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torchscan.scan(self.step, h, xs)

    def loop(self, h: torch.Tensor, xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ys = []
        for x in xs:
            h, y = self.step(h, x)
            ys.append(y)
        return h, torch.stack(ys)

    def inputs(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(length)
        xs = torch.randn(length, self.batch, self.hidden, generator=generator)
        h0 = 0.5 * torch.randn(self.batch, self.hidden, generator=generator)
        return h0, xs

    def runner(self, fn: Callable, length: int) -> Callable[[], Any]:
        """One call of ``fn`` in this mode: under ``no_grad``, or with its backward pass."""
        h0, xs = self.inputs(length)

        def run() -> Any:
            if not self.backward:
                with torch.no_grad():
                    return fn(h0, xs)
            h, ys = fn(h0, xs)
            (h.sum() + ys.sum()).backward()
            return h.detach(), ys.detach(), self.W.grad.clone(), self.U.grad.clone()

        def checked_run() -> Any:
            self.W.grad = self.U.grad = None
            return run()

        return checked_run if self.backward else run

    def runner_of(self, length: int) -> Callable[[Callable], Any]:
        """``fn`` -> the result of one call of ``fn`` in this mode at ``length``."""
        return lambda fn: self.runner(fn, length)()


# ---------------------------------------------------------------------------------------------
# Compiling


class Backend:
    """A ``torch.compile`` backend that counts the graphs it is given and whether they hold a loop
    operator, then hands them to the named backend (Inductor by default)."""

    def __init__(self, name: str) -> None:
        self.inner = torch._dynamo.lookup_backend(name)
        self.graphs = 0
        self.loop_operator = False

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        self.graphs += 1
        targets = [str(node.target) for node in gm.graph.nodes if node.op == "call_function"]
        if any(op in target for target in targets for op in LOOP_OPERATORS):
            self.loop_operator = True
        return self.inner(gm, example_inputs)


def compile_once(
    fn: Callable, backend: str, run: Callable[[Callable], Any]
) -> tuple[float, Any, Callable]:
    """Seconds of the first call of ``torch.compile(fn)`` with an empty Inductor cache, its result
    and whether its graph holds a loop operator, and the compiled function. ``fn``'s code must not
    have been compiled since ``torch._dynamo.reset()``."""
    with fresh_cache():
        counting = Backend(backend)
        compiled = torch.compile(fn, backend=counting)
        start = time.perf_counter()
        result = run(compiled)
        seconds = time.perf_counter() - start
    if fn.__name__ == "scan" and not counting.loop_operator:
        progress(f"  note: {SCAN} was unrolled (no loop operator in the compiled graph)")
    return seconds, (result, counting.loop_operator), compiled


def check_close(name: str, got: Any, want: Any) -> None:
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=ATOL, rtol=RTOL, msg=lambda m: f"{name}: {m}")


def scan_needs_scalar_capture(backend: str) -> bool:
    """Whether Inductor fails on torch's ``scan`` unless TorchDynamo captures scalar outputs.

    Inductor lowers ``scan`` to a ``while_loop`` whose body reads its counter with ``.item()``;
    on the CPU builds of torch 2.13 to 2.15 this fails (``DataDependentOutputException``)
    unless ``torch._dynamo.config.capture_scalar_outputs`` is on."""
    model = Elman(2, 4, backward=False)
    torch._dynamo.reset()
    try:
        compile_once(model.scan, backend, model.runner_of(3))
    except Exception as error:  # torch's InductorError
        progress(f"{SCAN} under torch.compile fails by default: {str(error).splitlines()[0]}")
        return True
    return False


# ---------------------------------------------------------------------------------------------
# Measuring


def interleaved(runs: dict[str, Callable[[], Any]], repeats: int) -> dict[str, list[float]]:
    """Seconds of every run, each repetition running all of them in rotating order."""
    names = list(runs)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(repeats):
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            runs[name]()
            samples[name].append(time.perf_counter() - start)
    return samples


def measure_length(model: Elman, length: int, args: argparse.Namespace) -> dict[str, Any]:
    """Compile seconds, loop operator, and steady-state seconds of every implementation."""
    impls = {COMPILED_SCAN: model.scan}
    if length <= args.max_unrolled_T:
        impls[COMPILED_LOOP] = model.loop
    want = model.runner(model.loop, length)()

    compile_samples: dict[str, list[float]] = {name: [] for name in impls}
    loop_operator: dict[str, bool] = {}
    compiled: dict[str, Callable] = {}
    for repeat in range(args.compile_repeats):
        torch._dynamo.reset()
        names = list(impls)
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            if repeat and max(compile_samples[name]) > args.once_above_s:
                continue  # a slow compilation is measured once, and its function kept
            seconds, (got, has_loop), compiled[name] = compile_once(
                impls[name], args.backend, model.runner_of(length)
            )
            check_close(name, got, want)
            compile_samples[name].append(seconds)
            loop_operator[name] = has_loop
            progress(f"  T={length} compile {name}: {seconds:.2f} s")

    # Steady state: the functions of the last compilations, warmed up.
    runs = {name: model.runner(fn, length) for name, fn in compiled.items()}
    runs[EAGER_SCAN] = model.runner(model.scan, length)
    runs[EAGER_LOOP] = model.runner(model.loop, length)
    for _ in range(3):
        for run in runs.values():
            run()
    samples = interleaved(runs, args.repeats)
    return {
        "T": length,
        "compile_s": {name: statistics.median(v) for name, v in compile_samples.items()},
        "compile_repeats": {name: len(v) for name, v in compile_samples.items()},
        "loop_operator": loop_operator,
        "run_s": {name: statistics.median(v) for name, v in samples.items()},
        "repeats": args.repeats,
    }


def count_compilations(model: Elman, lengths: list[int], args: argparse.Namespace) -> list[dict]:
    """Graphs compiled, and seconds spent, when one compiled function is called at every length."""
    records = []
    for dynamic in (None, True):
        for name, fn in ((SCAN, model.scan), (LOOP, model.loop)):
            usable = [t for t in lengths if name == SCAN or t <= args.max_unrolled_T]
            torch._dynamo.reset()
            with fresh_cache():
                counting = Backend(args.backend)
                compiled = torch.compile(fn, backend=counting, dynamic=dynamic)
                start = time.perf_counter()
                for length in usable:
                    model.runner(compiled, length)()
                seconds = time.perf_counter() - start
            records.append(
                {
                    "implementation": name,
                    "dynamic": dynamic,
                    "lengths": usable,
                    "graphs": counting.graphs,
                    "seconds": seconds,
                }
            )
            progress(f"  compilations {name} dynamic={dynamic}: {counting.graphs}")
    return records


# ---------------------------------------------------------------------------------------------
# Reporting


def fmt(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def ratio(values: dict[str, float], name: str, baseline: str) -> str:
    if name not in values or baseline not in values:
        return "—"
    return f"{values[name] / values[baseline]:.2f}"


def render(results: dict[str, Any], args: argparse.Namespace) -> str:
    env = results["environment"]
    command = "python benchmarks/compile_scan.py " + " ".join(results["argv"])
    lines = [
        "# torch.compile: torchscan.scan against the compiled Python loop",
        "",
        env.get("measured", ""),
        "",
        f"Elman RNN `h = tanh(x @ W + h @ U)`, B={args.B}, H={args.H}, backend `{args.backend}`, "
        f"{args.threads} thread(s); torch {env['torch']}, Python {env['python']}, "
        f"{env['machine']}. Produced by `{command.strip()}` "
        f"({env['minutes']:.0f} minutes).",
        "",
        "Compile time: `torch._dynamo.reset()` and an empty Inductor cache, then the first call "
        "of `torch.compile(f)` (median of the repetitions shown). Run time: the median of "
        f"{args.repeats} interleaved calls after warm-up. Ratios are to the compiled Python loop, "
        f"which TorchDynamo unrolls; it is compiled only up to T={args.max_unrolled_T}. "
        '"loop operator" says whether the compiled graph holds torch\'s `scan` or `while_loop` '
        "rather than every step.",
        "",
    ]
    for note in results["notes"]:
        lines += [f"- {note}"]
    if results["notes"]:
        lines.append("")
    for mode in results["modes"]:
        lines += [
            f"## {MODES[mode]}",
            "",
            "| T | implementation | compile (s) | compile runs | loop operator "
            "| run (ms) | run ratio to compiled loop |",
            "| ---: | --- | ---: | ---: | --- | ---: | ---: |",
        ]
        for record in results["lengths"][mode]:
            for name in (COMPILED_SCAN, COMPILED_LOOP, EAGER_SCAN, EAGER_LOOP):
                if name not in record["run_s"]:
                    lines.append(f"| {record['T']} | {name} | — | — | — | not compiled | — |")
                    continue
                compiled = name in record["compile_s"]
                lines.append(
                    f"| {record['T']} | {name} "
                    f"| {fmt(record['compile_s'].get(name))} "
                    f"| {record['compile_repeats'][name] if compiled else '—'} "
                    f"| {('yes' if record['loop_operator'][name] else 'no') if compiled else '—'} "
                    f"| {record['run_s'][name] * 1e3:.3f} "
                    f"| {ratio(record['run_s'], name, COMPILED_LOOP)} |"
                )
        lines += [
            "",
            "| T | compile (s), torchscan.scan | compile (s), python loop | compile ratio |",
            "| ---: | ---: | ---: | ---: |",
        ]
        for record in results["lengths"][mode]:
            lines.append(
                f"| {record['T']} | {fmt(record['compile_s'].get(COMPILED_SCAN))} "
                f"| {fmt(record['compile_s'].get(COMPILED_LOOP))} "
                f"| {ratio(record['compile_s'], COMPILED_SCAN, COMPILED_LOOP)} |"
            )
        lines.append("")
    lines += [
        "## One compiled function called at every length",
        "",
        "Graphs compiled when one `torch.compile`d function (forward, `no_grad`) is called at "
        "each length in turn, and the seconds of those calls. `dynamic` is `torch.compile`'s "
        "argument: by default TorchDynamo compiles the first length static and recompiles with "
        "dynamic shapes when a size changes (automatic dynamic).",
        "",
        "| implementation | dynamic | lengths | graphs compiled | seconds |",
        "| --- | --- | --- | ---: | ---: |",
    ]
    for record in results["compilations"]:
        dynamic = "default" if record["dynamic"] is None else str(record["dynamic"])
        lengths = ", ".join(str(t) for t in record["lengths"])
        lines.append(
            f"| {record['implementation']} | {dynamic} | {lengths} | {record['graphs']} "
            f"| {record['seconds']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = {COMPILED_SCAN: "C0", COMPILED_LOOP: "C3", EAGER_SCAN: "C2", EAGER_LOOP: "black"}
    styles = dict(zip(results["modes"], ["-", "--"], strict=False))
    for mode in results["modes"]:
        records = results["lengths"][mode]
        for key, ax, names in (
            ("compile_s", axes[0], (COMPILED_SCAN, COMPILED_LOOP)),
            ("run_s", axes[1], tuple(colors)),
        ):
            for name in names:
                points = [(r["T"], r[key][name]) for r in records if name in r[key]]
                if not points:
                    continue
                scale = 1e3 if key == "run_s" else 1.0
                ax.plot(
                    [t for t, _ in points],
                    [v * scale for _, v in points],
                    marker="o",
                    linestyle=styles[mode],
                    color=colors[name],
                    label=f"{name}, {MODES[mode]}",
                )
    axes[0].set(title="compile time (first call)", ylabel="seconds")
    axes[1].set(title="steady-state time of a call", ylabel="milliseconds")
    for ax in axes:
        ax.set(xscale="log", yscale="log", xlabel="sequence length T")
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.suptitle(f"torch.compile of an Elman RNN, torch {results['environment']['torch']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def environment() -> dict[str, Any]:
    machine = platform.machine()
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        machine = next(
            line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if "model name" in line
        )
    except (OSError, StopIteration):
        pass
    return {
        "machine": f"{machine}, {os.cpu_count()} cores",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "measured": suite.measured_on(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, nargs="+", default=[10, 100, 1000], help="lengths")
    parser.add_argument("--B", type=int, default=8, help="batch size")
    parser.add_argument("--H", type=int, default=64, help="hidden size")
    parser.add_argument(
        "--modes", nargs="+", choices=list(MODES), default=["forward"], help="default: forward"
    )
    parser.add_argument("--backend", default="inductor", help="torch.compile backend")
    parser.add_argument("--repeats", type=int, default=21, help="steady-state repetitions")
    parser.add_argument("--compile-repeats", type=int, default=3)
    parser.add_argument(
        "--once-above-s",
        type=float,
        default=60.0,
        help="a compilation that takes longer is not repeated (default 60)",
    )
    parser.add_argument(
        "--max-unrolled-T",
        type=int,
        default=1000,
        help="longest length the Python loop is compiled (unrolled) at (default 1000)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "docs" / "benchmarks", help="folder for compile.md"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 16)
    start = time.perf_counter()

    notes = []
    if scan_needs_scalar_capture(args.backend):
        torch._dynamo.config.capture_scalar_outputs = True
        notes.append(
            "`torch._dynamo.config.capture_scalar_outputs = True`: without it this torch's "
            "Inductor fails to compile torch's `scan` on the CPU (`DataDependentOutputException:"
            " aten._local_scalar_dense`, from the `.item()` of the `while_loop` it lowers "
            "`scan` to). It is set for every compiled implementation."
        )
    results: dict[str, Any] = {"modes": args.modes, "lengths": {}, "notes": notes}
    for mode in args.modes:
        backward = mode == "backward"
        model = Elman(args.B, args.H, backward)
        results["lengths"][mode] = []
        for length in args.T:
            progress(f"{MODES[mode]}, T={length}")
            results["lengths"][mode].append(measure_length(model, length, args))
    progress("compilations across lengths")
    results["compilations"] = count_compilations(Elman(args.B, args.H, False), args.T, args)
    results["environment"] = environment() | {"minutes": (time.perf_counter() - start) / 60}
    results["argv"] = sys.argv[1:]

    markdown = render(results, args)
    print(markdown)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compile.md").write_text(markdown)
    (args.out / "compile.json").write_text(json.dumps(results, indent=1) + "\n")
    plotted = plot(results, args.out / "compile.png")
    progress(f"wrote compile.md, compile.json{' and compile.png' if plotted else ''} to {args.out}")


if __name__ == "__main__":
    main()
