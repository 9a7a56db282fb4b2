"""The benchmark suite: eager speed and memory, export time and size, and onnxruntime inference.

One command measures, for an Elman RNN, an LSTM and a GRU cell (one layer, the parameters of a
``torch.nn.RNN`` / ``LSTM`` / ``GRU`` module shared with the cell):

* eager forward (``no_grad``) and forward + backward, 1 thread and torch's default: the
  hand-written Python loop, ``torchscan.scan``, ``torch._higher_order_ops.scan`` and the
  ``torch.nn`` module; ratios to the Python loop;
* eager memory of forward + backward (1 thread): the peak of the bytes allocated on the CPU,
  from the profiler's allocation events, and the bytes autograd saves for the backward pass, from
  ``saved_tensors_hooks``; ratios to the Python loop;
* the time of ``torch.onnx.export`` and the size of the model against the sequence length:
  ``torchscan.scan`` and the higher-order ``scan`` (one ``Scan`` node, dynamic time and batch)
  and the Python loop unrolled at a fixed length; ratios to ``torchscan.scan``;
* onnxruntime inference of those graphs and of ONNX's own ``RNN`` / ``LSTM`` / ``GRU`` operators
  (the ``torch.nn`` module exported by the TorchScript exporter), 1 thread and onnxruntime's
  default, graph optimisations at their default level (``ORT_ENABLE_ALL``), as deployed; ratios
  to the ONNX operator. The ``torch.nn`` module exported by ``torch.onnx.export(...,
  dynamo=True)`` with a dynamic length is measured too where the installed torch exports it
  right (torch 2.15 on; torch 2.13 and 2.14 fix a Reshape to the example's length, which the
  suite detects and reports).

Every configuration runs its implementations interleaved in one process (each repetition runs
all of them, in rotating order) and reports medians. The number of repetitions of a
configuration is what fits its time budget, between a floor and a ceiling, so slow
configurations (the higher-order ``scan`` with gradients at T=1000) get fewer; each table says
how many. Every implementation is checked against the Python loop before it is timed, and every
exported graph against the eager model in onnxruntime.

``python benchmarks/suite.py`` writes ``results.md`` (also printed), ``results.json`` (the raw
medians) and the plots ``eager.png``, ``memory.png``, ``export.png`` and ``onnxruntime.png`` to
``docs/benchmarks/``; ``--quick`` runs tiny sizes once, to check that everything works. The plots
need matplotlib (``pip install "torchscan-onnx[bench]"``); without it they are left out. Run
``python benchmarks/suite.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import io
import json
import logging
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
from torch._higher_order_ops.scan import scan as hop_scan

import torchscan
import torchscan.onnx

ROOT = Path(__file__).resolve().parents[1]
CELLS = ("RNN", "LSTM", "GRU")
CELL_NAMES = {"RNN": "Elman RNN", "LSTM": "LSTM", "GRU": "GRU"}

LOOP = "python loop"
NATIVE = "torch.nn module"
SCAN = "torchscan.scan"
HOP = "torch._higher_order_ops.scan"
UNROLLED = "unrolled loop"
NATIVE_DYNAMO = "torch.nn module, dynamo export"
ONNX_OP = "ONNX RNN/LSTM/GRU operator"

DYNAMO_OPSET = 18
# The TorchScript exporter maps torch.nn.RNN/LSTM/GRU onto ONNX's RNN/LSTM/GRU operators.
TORCHSCRIPT_OPSET = 17
# float32 over 1000 steps: bounded activations keep the differences to rounding.
ATOL, RTOL = 1e-4, 1e-4


@dataclasses.dataclass(frozen=True)
class Settings:
    """Sizes and repetitions of one run of the suite."""

    lengths: tuple[int, ...]
    hiddens: tuple[int, ...]
    batch: int
    unroll_max: int  # longest sequence the unrolled loop is exported at
    budget_s: float  # time for the repetitions of one configuration
    min_repeats: int
    max_repeats: int
    export_repeats: int
    export_hidden: int  # the hidden size whose export is timed (it barely depends on it)


FULL = Settings(
    lengths=(10, 100, 1000),
    hiddens=(64, 256),
    batch=8,
    unroll_max=100,
    budget_s=3.0,
    min_repeats=3,
    max_repeats=21,
    export_repeats=3,
    export_hidden=64,
)
QUICK = Settings(
    lengths=(2, 3),
    hiddens=(4,),
    batch=2,
    unroll_max=2,
    budget_s=0.0,
    min_repeats=1,
    max_repeats=1,
    export_repeats=1,
    export_hidden=4,
)


def progress(message: str) -> None:
    """Progress goes to stderr: stdout is the markdown of the results."""
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Timing


def interleaved_medians(
    runs: dict[str, Callable[[], object]], repeats: int, collect_garbage: bool = False
) -> dict[str, float]:
    """Median seconds of every run, each repetition running all of them in rotating order, so
    that drifts of the machine (frequency, caches, other processes) hit them all alike.

    ``collect_garbage`` collects before each run what the previous one left, so that it is not
    collected inside another's timing: for exports, which leave much. Short runs are better
    without it, as a collection also empties the caches they would find warm."""
    names = list(runs)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(repeats):
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            if collect_garbage:
                gc.collect()
            start = time.perf_counter()
            runs[name]()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in samples.items()}


def warm_up(runs: dict[str, Callable[[], object]], settings: Settings) -> int:
    """Run everything twice (the higher-order scan compiles on its first call) and return the
    number of repetitions that fits the time budget, judged from the second round."""
    for run in runs.values():
        run()
    start = time.perf_counter()
    for run in runs.values():
        run()
    round_s = time.perf_counter() - start
    fitting = int(settings.budget_s / max(round_s, 1e-9))
    return max(settings.min_repeats, min(settings.max_repeats, fitting))


def set_threads(threads: int | None, default: int) -> None:
    torch.set_num_threads(threads or default)


# ---------------------------------------------------------------------------------------------
# Models: one step and four ways to loop it


CELL_TYPES: dict[str, tuple[type[torch.nn.RNNBase], type[torch.nn.Module]]] = {
    "RNN": (torch.nn.RNN, torch.nn.RNNCell),
    "LSTM": (torch.nn.LSTM, torch.nn.LSTMCell),
    "GRU": (torch.nn.GRU, torch.nn.GRUCell),
}

Carry = Any  # a tensor, or (h, c) for the LSTM


class Step(torch.nn.Module):
    """One step of a one-layer ``torch.nn`` recurrent module, with that module's parameters
    (shared, not copied), so that every implementation computes the same function."""

    def __init__(self, net: torch.nn.RNNBase, cell_type: type[torch.nn.Module]) -> None:
        super().__init__()
        self.lstm = isinstance(net, torch.nn.LSTM)
        self.cell = cell_type(net.input_size, net.hidden_size)
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            setattr(self.cell, name, getattr(net, f"{name}_l0"))

    def forward(self, carry: Carry, x: torch.Tensor) -> tuple[Carry, torch.Tensor]:
        if self.lstm:
            h, c = self.cell(x, carry)
            return (h, c), h
        h = self.cell(x, carry)
        return h, h


class PythonLoop(torch.nn.Module):
    """The hand-written loop; exported, it is unrolled at the length of the example."""

    def __init__(self, step: Step) -> None:
        super().__init__()
        self.step = step

    def forward(self, xs: torch.Tensor, carry: Carry) -> tuple[Carry, torch.Tensor]:
        ys = []
        for x in xs:
            carry, y = self.step(carry, x)
            ys.append(y)
        return carry, torch.stack(ys)


class TorchscanScan(PythonLoop):
    def forward(self, xs: torch.Tensor, carry: Carry) -> tuple[Carry, torch.Tensor]:
        return torchscan.scan(self.step, carry, xs)


class HopScan(PythonLoop):
    def forward(self, xs: torch.Tensor, carry: Carry) -> tuple[Carry, torch.Tensor]:
        def step(carry: Carry, x: torch.Tensor) -> tuple[Carry, torch.Tensor]:
            carry, y = self.step(carry, x)
            return carry, y.clone()  # torch's scan refuses an output that aliases the carry

        return hop_scan(step, carry, xs)


class Native(torch.nn.Module):
    """The ``torch.nn`` module with the carry conventions of the others: no layer axis."""

    def __init__(self, net: torch.nn.RNNBase) -> None:
        super().__init__()
        self.net = net

    def forward(self, xs: torch.Tensor, carry: Carry) -> tuple[Carry, torch.Tensor]:
        if isinstance(carry, tuple):
            ys, (h, c) = self.net(xs, (carry[0].unsqueeze(0), carry[1].unsqueeze(0)))
            return (h.squeeze(0), c.squeeze(0)), ys
        ys, h = self.net(xs, carry.unsqueeze(0))
        return h.squeeze(0), ys


@dataclasses.dataclass
class Recurrence:
    """A cell of one kind and size, and the modules that loop it."""

    kind: str
    hidden: int
    models: dict[str, torch.nn.Module]

    @classmethod
    def make(cls, kind: str, hidden: int) -> Recurrence:
        torch.manual_seed(0)
        net_type, cell_type = CELL_TYPES[kind]
        net = net_type(hidden, hidden)
        step = Step(net, cell_type)
        models = {
            LOOP: PythonLoop(step),
            NATIVE: Native(net),
            SCAN: TorchscanScan(step),
            HOP: HopScan(step),
        }
        return cls(kind, hidden, models)

    def inputs(
        self, length: int, batch: int, grad: bool = False, device: str = "cpu"
    ) -> tuple[torch.Tensor, Carry]:
        generator = torch.Generator().manual_seed(length)
        xs = torch.randn(length, batch, self.hidden, generator=generator).to(device)
        xs.requires_grad_(grad)
        leaves = [
            (0.5 * torch.randn(batch, self.hidden, generator=generator))
            .to(device)
            .requires_grad_(grad)
            for _ in range(2 if self.kind == "LSTM" else 1)
        ]
        return xs, tuple(leaves) if self.kind == "LSTM" else leaves[0]

    def parameters(self) -> list[torch.nn.Parameter]:
        return list(self.models[NATIVE].parameters())


def flat(outputs: Any) -> list[torch.Tensor]:
    """The tensors of ``(carry, ys)`` in the order of the exported graphs' outputs."""
    return list(torch.utils._pytree.tree_leaves(outputs))


def check_close(name: str, got: Iterable[Any], want: Iterable[torch.Tensor]) -> None:
    for index, (g, w) in enumerate(zip(got, want, strict=True)):
        g = g.detach().cpu() if isinstance(g, torch.Tensor) else g
        np.testing.assert_allclose(
            np.asarray(g),
            w.detach().cpu().numpy(),
            rtol=RTOL,
            atol=ATOL,
            err_msg=f"{name}, #{index}",
        )


# ---------------------------------------------------------------------------------------------
# Eager speed and memory


EAGER_IMPLEMENTATIONS = (LOOP, NATIVE, SCAN, HOP)
MODES = ("forward", "forward + backward")


def runs_of(
    models: dict[str, torch.nn.Module], xs: torch.Tensor, carry: Carry, mode: str
) -> dict[str, Callable[[], object]]:
    """One run of every model on ``(xs, carry)``: forward under ``no_grad``, or forward and
    backward of the sum of the outputs."""

    def forward(model: torch.nn.Module) -> Callable[[], object]:
        def run() -> object:
            with torch.no_grad():
                return model(xs, carry)

        return run

    def forward_backward(model: torch.nn.Module) -> Callable[[], object]:
        def run() -> object:
            outputs = model(xs, carry)
            sum(t.sum() for t in flat(outputs)).backward()
            return outputs

        return run

    make = forward if mode == "forward" else forward_backward
    return {name: make(model) for name, model in models.items()}


def eager_runs(rec: Recurrence, xs: torch.Tensor, carry: Carry, mode: str) -> dict[str, Callable]:
    return runs_of({name: rec.models[name] for name in EAGER_IMPLEMENTATIONS}, xs, carry, mode)


def check_eager(rec: Recurrence, xs: torch.Tensor, carry: Carry) -> None:
    with torch.no_grad():
        want = flat(rec.models[LOOP](xs, carry))
        for name in EAGER_IMPLEMENTATIONS:
            check_close(f"eager {name}", flat(rec.models[name](xs, carry)), want)


def eager_speed(settings: Settings, thread_settings: tuple[int | None, ...]) -> list[dict]:
    default_threads = torch.get_num_threads()
    records = []
    for kind in CELLS:
        for hidden in settings.hiddens:
            rec = Recurrence.make(kind, hidden)
            for length in settings.lengths:
                xs, carry = rec.inputs(length, settings.batch, grad=True)
                check_eager(rec, xs, carry)
                for threads in thread_settings:
                    set_threads(threads, default_threads)
                    for mode in MODES:
                        runs = eager_runs(rec, xs, carry, mode)
                        repeats = warm_up(runs, settings)
                        medians = interleaved_medians(runs, repeats)
                        records.append(
                            {
                                "cell": kind,
                                "H": hidden,
                                "T": length,
                                "threads": threads or default_threads,
                                "mode": mode,
                                "repeats": repeats,
                                "median_s": medians,
                            }
                        )
                        progress(f"eager {kind} H={hidden} T={length} threads={threads} {mode}")
    set_threads(None, default_threads)
    return records


def peak_allocated_bytes(run: Callable[[], object]) -> int:
    """The largest number of bytes allocated on the CPU and not yet freed while ``run`` runs,
    above the level it started from: the running sum of the allocation and free events that
    the profiler records from torch's CPU allocator (tracemalloc does not see them)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True) as profiler:
        run()
    cpu = torch._C._autograd.DeviceType.CPU
    events = [
        event
        for event in profiler.profiler.kineto_results.events()
        if event.name() == "[memory]" and event.device_type() == cpu
    ]
    events.sort(key=lambda event: event.start_ns())
    level = peak = 0
    for event in events:
        level += event.nbytes()
        peak = max(peak, level)
    return peak


def saved_for_backward_bytes(run: Callable[[], object], existing: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages autograd keeps for the backward pass, leaving out those of
    tensors that exist anyway (parameters, inputs)."""
    skip = {t.untyped_storage().data_ptr() for t in existing}
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        try:
            storage = tensor.untyped_storage()
            address = storage.data_ptr()
        except RuntimeError:  # a fake tensor of the higher-order scan's tracing: no memory
            return tensor
        if address not in skip:
            storages[address] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        outputs = run()
    del outputs  # the graph, and what it saved, goes with the outputs
    return sum(storages.values())


def eager_memory(settings: Settings) -> list[dict]:
    default_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    records = []
    for kind in CELLS:
        for hidden in settings.hiddens:
            rec = Recurrence.make(kind, hidden)
            for length in settings.lengths:
                xs, carry = rec.inputs(length, settings.batch, grad=True)
                existing = [xs, *flat(carry), *rec.parameters()]
                record: dict[str, Any] = {"cell": kind, "H": hidden, "T": length}
                record["peak_bytes"], record["saved_bytes"] = {}, {}
                for name, run in eager_runs(rec, xs, carry, "forward + backward").items():
                    run()  # compiles the higher-order scan outside the measurement
                    for tensor in existing:
                        tensor.grad = None  # every run allocates its gradients afresh
                    record["peak_bytes"][name] = peak_allocated_bytes(run)
                    forward = functools.partial(rec.models[name], xs, carry)
                    record["saved_bytes"][name] = saved_for_backward_bytes(forward, existing)
                records.append(record)
                progress(f"memory {kind} H={hidden} T={length}")
    torch.set_num_threads(default_threads)
    return records


# ---------------------------------------------------------------------------------------------
# Export


EXPORTED = (SCAN, HOP, UNROLLED)


def dynamic_shapes(rec: Recurrence) -> tuple:
    time_dim, batch = torch.export.Dim("T", min=1), torch.export.Dim("B", min=1)
    carry = ({0: batch}, {0: batch}) if rec.kind == "LSTM" else {0: batch}
    return ({0: time_dim, 1: batch}, carry)


def export_dynamo(rec: Recurrence, name: str, xs: torch.Tensor, carry: Carry) -> bytes:
    """The serialised ONNX model of one implementation. The scans have a dynamic time and
    batch; the unrolled loop is fixed to the length of ``xs``. torchscan's pass that moves work
    out of loop bodies also reaches the higher-order scan's ``Scan`` when torchscan is imported;
    it is turned off there so that this model is what torch.onnx makes of it on its own."""
    model = rec.models[LOOP if name == UNROLLED else name]
    shapes = None if name == UNROLLED else dynamic_shapes(rec)
    with torchscan.onnx.export_options(hoist_loop_invariants=name != HOP):
        program = torch.onnx.export(
            model,
            (xs, carry),
            dynamo=True,
            opset_version=DYNAMO_OPSET,
            dynamic_shapes=shapes,
            verbose=False,
        )
    return program.model_proto.SerializeToString()


def export_torchscript(rec: Recurrence, xs: torch.Tensor, carry: Carry) -> bytes:
    """The ``torch.nn`` module through the TorchScript exporter, which emits ONNX's own
    RNN/LSTM/GRU operator, with the inputs and outputs of the other graphs."""
    carries = ["h", "c"] if rec.kind == "LSTM" else ["h"]
    axes = {"xs": {0: "T", 1: "B"}, "ys": {0: "T", 1: "B"}}
    axes |= {name: {0: "B"} for name in carries}
    axes |= {f"{name}_out": {0: "B"} for name in carries}
    buffer = io.BytesIO()
    torch.onnx.export(
        rec.models[NATIVE],
        (xs, carry),
        buffer,
        dynamo=False,
        opset_version=TORCHSCRIPT_OPSET,
        input_names=["xs", *carries],
        output_names=[*(f"{name}_out" for name in carries), "ys"],
        dynamic_axes=axes,
    )
    return buffer.getvalue()


def export_native_dynamo(rec: Recurrence, settings: Settings) -> bytes | str:
    """The ``torch.nn`` module through ``torch.onnx.export(..., dynamo=True)`` with a dynamic
    time and batch, or why it is left out: torch 2.13 and 2.14 export ``nn.RNN``/``LSTM``/``GRU``
    with a Reshape fixed to the example's length, so the model fails at any other length."""
    xs, carry = rec.inputs(settings.lengths[0], settings.batch)
    program = torch.onnx.export(
        rec.models[NATIVE],
        (xs, carry),
        dynamo=True,
        opset_version=DYNAMO_OPSET,
        dynamic_shapes=dynamic_shapes(rec),
        verbose=False,
    )
    model = program.model_proto.SerializeToString()
    other_xs, other_carry = rec.inputs(settings.lengths[0] + 1, settings.batch)
    with torch.no_grad():
        want = flat(rec.models[LOOP](other_xs, other_carry))
    arrays = [t.numpy() for t in (other_xs, *flat(other_carry))]
    release = torch.__version__.split("+")[0]
    try:
        got = ort_runner(session(model, 1), arrays)()
    except Exception:  # onnxruntime's error on a shape fixed at export
        return f"fails at T other than the example's (torch {release})"
    try:
        check_close(NATIVE_DYNAMO, got, want)
    except AssertionError:
        return f"wrong values at T other than the example's (torch {release})"
    return model


def unrolled_skip_reason(settings: Settings, seconds: dict[int, float]) -> str:
    longest = max(seconds, default=None)
    measured = f", {seconds[longest]:.1f} s at T={longest}" if longest else ""
    return (
        f"skipped: T > {settings.unroll_max} (the graph and its export time grow with T{measured})"
    )


Graphs = dict[str, Any]  # implementation -> ONNX model; the unrolled loop's by length


def timed_exports(rec: Recurrence, settings: Settings) -> tuple[list[dict], Graphs]:
    """Export every implementation at every length, interleaved; records and the models."""
    records, graphs = [], {UNROLLED: {}}
    unrolled_seconds: dict[int, float] = {}
    for length in settings.lengths:
        xs, carry = rec.inputs(length, settings.batch)
        names = [n for n in EXPORTED if n != UNROLLED or length <= settings.unroll_max]
        latest: dict[str, bytes] = {}

        def export(name: str, xs=xs, carry=carry, latest=latest) -> None:
            latest[name] = export_dynamo(rec, name, xs, carry)

        runs = {name: lambda name=name: export(name) for name in names}
        medians = interleaved_medians(runs, settings.export_repeats, collect_garbage=True)
        skipped = {}
        if UNROLLED in latest:
            graphs[UNROLLED][length] = latest.pop(UNROLLED)
            unrolled_seconds[length] = medians[UNROLLED]
        else:
            skipped[UNROLLED] = unrolled_skip_reason(settings, unrolled_seconds)
        sizes = {name: len(graph) for name, graph in latest.items()}
        if length in graphs[UNROLLED]:
            sizes[UNROLLED] = len(graphs[UNROLLED][length])
        graphs |= latest  # the scans: the same graph whatever the length of the example
        records.append(
            {
                "cell": rec.kind,
                "H": rec.hidden,
                "T": length,
                "repeats": settings.export_repeats,
                "median_s": medians,
                "size_bytes": sizes,
                "skipped": skipped,
            }
        )
        progress(f"export {rec.kind} H={rec.hidden} T={length}")
    return records, graphs


def untimed_exports(rec: Recurrence, settings: Settings) -> Graphs:
    graphs: Graphs = {UNROLLED: {}}
    for length in settings.lengths:
        xs, carry = rec.inputs(length, settings.batch)
        if length == settings.lengths[0]:
            graphs |= {name: export_dynamo(rec, name, xs, carry) for name in (SCAN, HOP)}
        if length <= settings.unroll_max:
            graphs[UNROLLED][length] = export_dynamo(rec, UNROLLED, xs, carry)
    progress(f"export {rec.kind} H={rec.hidden}")
    return graphs


def export_models(settings: Settings) -> tuple[list[dict], dict[tuple[str, int], Graphs]]:
    """Time the exports at ``settings.export_hidden`` (the time barely depends on the hidden
    size) and export once at the others; returns the records and the models by (cell, H)."""
    warm = Recurrence.make(CELLS[0], settings.export_hidden)
    xs, carry = warm.inputs(settings.lengths[0], settings.batch)
    for name in EXPORTED:  # the first export imports onnxscript and builds torch.onnx's registry
        export_dynamo(warm, name, xs, carry)
    records: list[dict] = []
    models: dict[tuple[str, int], Graphs] = {}
    for kind in CELLS:
        for hidden in settings.hiddens:
            rec = Recurrence.make(kind, hidden)
            if hidden == settings.export_hidden:
                new_records, graphs = timed_exports(rec, settings)
                records += new_records
            else:
                graphs = untimed_exports(rec, settings)
            xs, carry = rec.inputs(settings.lengths[0], settings.batch)
            graphs[ONNX_OP] = export_torchscript(rec, xs, carry)
            graphs[NATIVE_DYNAMO] = export_native_dynamo(rec, settings)
            models[kind, hidden] = graphs
    return records, models


# ---------------------------------------------------------------------------------------------
# onnxruntime


ORT_IMPLEMENTATIONS = (ONNX_OP, UNROLLED, SCAN, HOP, NATIVE_DYNAMO)


def session(model: bytes, threads: int | None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads or 0  # 0: onnxruntime's default
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def ort_runner(sess: ort.InferenceSession, arrays: list[np.ndarray]) -> Callable[[], list]:
    feeds = {node.name: array for node, array in zip(sess.get_inputs(), arrays, strict=True)}
    return lambda: sess.run(None, feeds)


def onnxruntime_speed(
    settings: Settings, models: dict[tuple[str, int], dict], thread_settings: tuple
) -> list[dict]:
    records = []
    for (kind, hidden), graphs in models.items():
        rec = Recurrence.make(kind, hidden)
        for threads in thread_settings:
            exported = [ONNX_OP, SCAN, HOP]
            if isinstance(graphs[NATIVE_DYNAMO], bytes):
                exported.append(NATIVE_DYNAMO)
            sessions = {name: session(graphs[name], threads) for name in exported}
            for length in settings.lengths:
                xs, carry = rec.inputs(length, settings.batch)
                with torch.no_grad():
                    want = flat(rec.models[LOOP](xs, carry))
                arrays = [t.numpy() for t in (xs, *flat(carry))]
                runs = {name: ort_runner(sessions[name], arrays) for name in sessions}
                if length in graphs[UNROLLED]:
                    unrolled = session(graphs[UNROLLED][length], threads)
                    runs[UNROLLED] = ort_runner(unrolled, arrays)
                for name, run in runs.items():
                    check_close(f"onnxruntime {name} {kind} T={length}", run(), want)
                runs = {name: runs[name] for name in ORT_IMPLEMENTATIONS if name in runs}
                repeats = warm_up(runs, settings)
                skipped = graphs[NATIVE_DYNAMO]
                records.append(
                    {
                        "cell": kind,
                        "H": hidden,
                        "T": length,
                        "threads": threads or "default",
                        "repeats": repeats,
                        "median_s": interleaved_medians(runs, repeats),
                        "skipped": {NATIVE_DYNAMO: skipped} if isinstance(skipped, str) else {},
                    }
                )
                progress(f"onnxruntime {kind} H={hidden} T={length} threads={threads}")
    return records


# ---------------------------------------------------------------------------------------------
# Tables


def fmt_ratio(ratio: float) -> str:
    if ratio >= 100:
        return f"{ratio:.0f}"
    return f"{ratio:.1f}" if ratio >= 10 else f"{ratio:.2f}"


def fmt_number(value: float) -> str:
    """Three significant digits, without exponents."""
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}" if value >= 1 else f"{value:.3g}"


def table(header: list[str], rows: list[list[str]], text_columns: int) -> str:
    align = ["---"] * text_columns + ["---:"] * (len(header) - text_columns)
    lines = [header, align, *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def ratio_cells(values: dict[str, float], names: Iterable[str], baseline: str) -> list[str]:
    return [fmt_ratio(values[name] / values[baseline]) for name in names]


def eager_table(records: list[dict]) -> str:
    others = [NATIVE, SCAN, HOP]
    header = ["cell", "H", "T", "threads", "mode", "n", f"{LOOP} (ms)", *others]
    rows = [
        [
            CELL_NAMES[r["cell"]],
            str(r["H"]),
            str(r["T"]),
            str(r["threads"]),
            r["mode"],
            str(r["repeats"]),
            fmt_number(r["median_s"][LOOP] * 1e3),
            *ratio_cells(r["median_s"], others, LOOP),
        ]
        for r in records
    ]
    return table(header, rows, text_columns=5)


def memory_table(records: list[dict], key: str, others: list[str]) -> str:
    header = ["cell", "H", "T", f"{LOOP} (MiB)", *others]
    rows = [
        [
            CELL_NAMES[r["cell"]],
            str(r["H"]),
            str(r["T"]),
            fmt_number(r[key][LOOP] / 2**20),
            *ratio_cells(r[key], others, LOOP),
        ]
        for r in records
    ]
    return table(header, rows, text_columns=3)


def export_table(records: list[dict]) -> str:
    others = [UNROLLED, HOP]
    header = [
        "cell",
        "T",
        "n",
        f"export time, {SCAN} (s)",
        *others,
        f"model size, {SCAN} (KiB)",
        *others,
    ]
    rows = []
    for r in records:
        times = [
            r["skipped"].get(n) or fmt_ratio(r["median_s"][n] / r["median_s"][SCAN]) for n in others
        ]
        sizes = [
            "skipped"
            if n in r["skipped"]
            else fmt_ratio(r["size_bytes"][n] / r["size_bytes"][SCAN])
            for n in others
        ]
        rows.append(
            [
                CELL_NAMES[r["cell"]],
                str(r["T"]),
                str(r["repeats"]),
                fmt_number(r["median_s"][SCAN]),
                *times,
                fmt_number(r["size_bytes"][SCAN] / 2**10),
                *sizes,
            ]
        )
    return table(header, rows, text_columns=3)


def onnxruntime_table(records: list[dict]) -> str:
    others = [UNROLLED, NATIVE_DYNAMO, SCAN, HOP]
    header = ["cell", "H", "T", "threads", "n", f"{ONNX_OP} (ms)", *others]
    rows = []
    for r in records:
        medians, skipped = r["median_s"], r.get("skipped", {})
        ratios = [
            fmt_ratio(medians[n] / medians[ONNX_OP])
            if n in medians
            else skipped.get(n, "not exported")
            for n in others
        ]
        rows.append(
            [
                CELL_NAMES[r["cell"]],
                str(r["H"]),
                str(r["T"]),
                str(r["threads"]),
                str(r["repeats"]),
                fmt_number(medians[ONNX_OP] * 1e3),
                *ratios,
            ]
        )
    return table(header, rows, text_columns=4)


def headline(results: dict[str, list[dict]], settings: Settings) -> list[str]:
    """The figures the documentation quotes: the longest sequence, eager at the smallest hidden
    size and onnxruntime at the largest, one thread."""
    longest, small, large = max(settings.lengths), min(settings.hiddens), max(settings.hiddens)
    lines = []
    for r in results["eager"]:
        if (r["T"], r["H"], r["threads"], r["cell"]) == (longest, small, 1, "RNN"):
            ratios = ", ".join(
                f"{name} {fmt_ratio(r['median_s'][name] / r['median_s'][LOOP])}"
                for name in (SCAN, HOP, NATIVE)
            )
            lines.append(f"- eager Elman RNN, {r['mode']}, T={longest}, H={small}: {ratios}")
    for r in results["onnxruntime"]:
        if (r["T"], r["H"], r["threads"]) == (longest, large, 1):
            medians = r["median_s"]
            ratios = ", ".join(
                f"{name} {fmt_ratio(medians[name] / medians[ONNX_OP])}"
                for name in (SCAN, HOP, UNROLLED, NATIVE_DYNAMO)
                if name in medians
            )
            lines.append(
                f"- onnxruntime {CELL_NAMES[r['cell']]}, T={longest}, H={large}, 1 thread, "
                f"ratio to the ONNX operator: {ratios}"
            )
    return lines


def render(results: dict[str, list[dict]], settings: Settings, environment: dict) -> str:
    if settings.max_repeats == 1:
        repetitions = "one repetition of each implementation (`--quick`: tiny sizes, a check)"
    else:
        repetitions = (
            f"`n` is the number of repetitions of each implementation: as many as fit "
            f"{settings.budget_s:g} s per configuration, between {settings.min_repeats} and "
            f"{settings.max_repeats}"
        )
    command = "python benchmarks/suite.py" + (" --quick" if settings is QUICK else "")
    sections = [
        "# Benchmark suite results",
        environment["measured"],
        f"Generated by `{command}` in {environment['minutes']:.1f} min on "
        f"{environment['machine']}; torch {environment['torch']}, onnxruntime "
        f"{environment['onnxruntime']}, onnx {environment['onnx']}, Python "
        f"{environment['python']}; torch's default here is "
        f"{environment['torch_default_threads']} threads. B={settings.batch}. Medians of "
        f"interleaved runs; {repetitions}.",
        "## Headline\n\n" + "\n".join(headline(results, settings)),
        "## Eager speed\n\nMedian time of the Python loop, and the others' ratio to it. "
        "`forward` runs under `torch.no_grad()`; `forward + backward` takes the gradient of the "
        "sum of the outputs and the final carry with respect to the parameters, the sequence "
        "and the initial carry.\n\n" + eager_table(results["eager"]),
        "## Eager memory of forward + backward\n\nPeak of the bytes allocated on the CPU during "
        "forward + backward, above the level before it (the running sum of the allocation "
        "events `torch.profiler` records with `profile_memory=True`), one thread; ratios to "
        "the Python loop.\n\n"
        + memory_table(results["memory"], "peak_bytes", [NATIVE, SCAN, HOP])
        + "\n\nBytes autograd saves for the backward pass (distinct storages packed by "
        "`torch.autograd.graph.saved_tensors_hooks`, parameters and inputs left out); ratios "
        "to the Python loop. The higher-order scan is not in it: it keeps what it saves in an "
        "attribute of its `autograd.Function` context, out of the hooks' sight.\n\n"
        + memory_table(results["memory"], "saved_bytes", [NATIVE, SCAN]),
        f"## Export\n\n`torch.onnx.export(..., dynamo=True, opset_version={DYNAMO_OPSET})` at "
        f"H={settings.export_hidden}: median time and serialised size of `{SCAN}` and the "
        "higher-order scan (dynamic time and batch: one graph for every T) and the Python "
        "loop unrolled at the T of the example; ratios to `torchscan.scan`. The higher-order "
        "scan is exported without torchscan's pass that moves work out of loop bodies, "
        "as torch.onnx makes it on its own.\n\n" + export_table(results["export"]),
        "## onnxruntime\n\nMedian time of one inference of the ONNX `RNN`/`LSTM`/`GRU` "
        f"operator (the `torch.nn` module through the TorchScript exporter, opset "
        f"{TORCHSCRIPT_OPSET}) and the others' ratio to it, in onnxruntime's "
        "CPUExecutionProvider with graph optimisations at their default level "
        "(`ORT_ENABLE_ALL`); `threads` is `intra_op_num_threads`. "
        f"`{NATIVE_DYNAMO}` is the `torch.nn` module through `torch.onnx.export(..., "
        "dynamo=True)` with a dynamic time axis, where the installed torch exports it right at "
        "every length (torch 2.15 on). Every graph's outputs were checked against the eager "
        "model first.\n\n" + onnxruntime_table(results["onnxruntime"]),
    ]
    return "\n\n".join(sections) + "\n"


# ---------------------------------------------------------------------------------------------
# Plots

COLORS = {
    LOOP: "black",
    NATIVE: "tab:green",
    ONNX_OP: "tab:green",
    SCAN: "tab:blue",
    HOP: "tab:red",
    UNROLLED: "tab:orange",
    NATIVE_DYNAMO: "tab:purple",
}


def line_styles(hiddens: tuple[int, ...]) -> dict[int, str]:
    return dict(zip(hiddens, ["-", "--", ":", "-."], strict=False))


def plain_log_formatter() -> Any:
    from matplotlib import ticker

    class PlainLogFormatter(ticker.LogFormatter):
        """The ticks ``LogFormatter`` labels, as plain numbers (0.5, 2, 300)."""

        def __call__(self, value: float, pos: int | None = None) -> str:
            return f"{value:g}" if super().__call__(value, pos) else ""

    return PlainLogFormatter


def plot_lines(
    axes: Any,
    records: list[dict],
    names: Iterable[str],
    value: Callable[[dict, str], float | None],
    styles: dict[int, str],
) -> None:
    """One line per implementation and hidden size: ``value(record, name)`` against T."""
    for name in names:
        for hidden, style in styles.items():
            points = [
                (r["T"], value(r, name))
                for r in records
                if r["H"] == hidden and value(r, name) is not None
            ]
            if points:
                lengths, values = zip(*sorted(points), strict=True)
                axes.plot(
                    lengths,
                    values,
                    style,
                    marker="o",
                    color=COLORS[name],
                    label=f"{name}, H={hidden}" if len(styles) > 1 else name,
                )
    from matplotlib import ticker

    plain = plain_log_formatter()
    axes.set_xscale("log")
    axes.set_yscale("log")
    lengths = sorted({r["T"] for r in records})
    axes.set_xticks(lengths, [str(length) for length in lengths])
    axes.xaxis.set_minor_locator(ticker.NullLocator())
    axes.yaxis.set_major_formatter(plain())
    axes.yaxis.set_minor_formatter(plain(labelOnlyBase=False, minor_thresholds=(1, 0.5)))
    axes.set_xlabel("T")
    axes.grid(True, which="both", alpha=0.3)


def ratio_to(baseline: str, key: str = "median_s") -> Callable[[dict, str], float | None]:
    def value(record: dict, name: str) -> float | None:
        values = record[key]
        return values[name] / values[baseline] if name in values else None

    return value


def figure(rows: int, columns: int, title: str) -> tuple[Any, Any]:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        rows, columns, figsize=(5 * columns, 3.6 * rows + 0.8), squeeze=False, layout="constrained"
    )
    fig.suptitle(title)
    return fig, axes


def save(fig: Any, axes: Any, path: Path) -> None:
    """One legend for the figure, below the plots."""
    import matplotlib.pyplot as plt

    legend: dict[str, Any] = {}
    for ax in axes.flat:
        handles, labels = ax.get_legend_handles_labels()
        for handle, label in zip(handles, labels, strict=True):
            legend.setdefault(label, handle)
    fig.legend(legend.values(), legend.keys(), loc="outside lower center", ncol=4)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_eager(records: list[dict], settings: Settings, path: Path) -> None:
    fig, axes = figure(len(MODES), len(CELLS), "Eager, 1 thread: time / Python loop")
    for row, mode in enumerate(MODES):
        for column, kind in enumerate(CELLS):
            ax = axes[row][column]
            chosen = [r for r in records if (r["cell"], r["mode"], r["threads"]) == (kind, mode, 1)]
            plot_lines(
                ax, chosen, (NATIVE, SCAN, HOP), ratio_to(LOOP), line_styles(settings.hiddens)
            )
            ax.axhline(1.0, color=COLORS[LOOP], linewidth=1, label=LOOP)
            ax.set_title(f"{CELL_NAMES[kind]}, {mode}")
    save(fig, axes, path)


def plot_memory(records: list[dict], settings: Settings, path: Path) -> None:
    fig, axes = figure(1, len(CELLS), "Eager forward + backward: peak CPU memory (MiB)")
    for column, kind in enumerate(CELLS):
        ax = axes[0][column]
        chosen = [r for r in records if r["cell"] == kind]
        plot_lines(
            ax,
            chosen,
            EAGER_IMPLEMENTATIONS,
            lambda r, name: r["peak_bytes"][name] / 2**20,
            line_styles(settings.hiddens),
        )
        ax.set_title(CELL_NAMES[kind])
    save(fig, axes, path)


def plot_export(records: list[dict], settings: Settings, path: Path) -> None:
    fig, axes = figure(2, len(CELLS), f"torch.onnx.export, H={settings.export_hidden}")
    styles = {settings.export_hidden: "-"}
    for column, kind in enumerate(CELLS):
        chosen = [r for r in records if r["cell"] == kind]
        for row, (key, unit, scale) in enumerate(
            [("median_s", "export time (s)", 1.0), ("size_bytes", "model size (KiB)", 2**-10)]
        ):
            ax = axes[row][column]
            plot_lines(
                ax,
                chosen,
                EXPORTED,
                lambda r, name, key=key, scale=scale: (
                    r[key][name] * scale if name in r[key] else None
                ),
                styles,
            )
            ax.set_title(f"{CELL_NAMES[kind]}: {unit}")
    save(fig, axes, path)


def plot_onnxruntime(records: list[dict], settings: Settings, path: Path) -> None:
    thread_settings = sorted({r["threads"] for r in records}, key=str)
    fig, axes = figure(len(thread_settings), len(CELLS), f"onnxruntime: time / {ONNX_OP}")
    for row, threads in enumerate(thread_settings):
        for column, kind in enumerate(CELLS):
            ax = axes[row][column]
            chosen = [r for r in records if (r["cell"], r["threads"]) == (kind, threads)]
            plot_lines(
                ax,
                chosen,
                (UNROLLED, SCAN, HOP, NATIVE_DYNAMO),
                ratio_to(ONNX_OP),
                line_styles(settings.hiddens),
            )
            ax.axhline(1.0, color=COLORS[ONNX_OP], linewidth=1, label=ONNX_OP)
            ax.set_title(f"{CELL_NAMES[kind]}, {threads} thread(s)")
    save(fig, axes, path)


def plot_all(results: dict[str, list[dict]], settings: Settings, out: Path) -> list[str]:
    """Write the plots; without matplotlib (an optional dependency) there are none."""
    try:
        import matplotlib
    except ImportError:
        progress(
            'plots left out: matplotlib is not installed (pip install "torchscan-onnx[bench]")'
        )
        return []
    matplotlib.use("Agg")  # no display needed
    plots = {
        "eager.png": (plot_eager, results["eager"]),
        "memory.png": (plot_memory, results["memory"]),
        "export.png": (plot_export, results["export"]),
        "onnxruntime.png": (plot_onnxruntime, results["onnxruntime"]),
    }
    for name, (plot, records) in plots.items():
        plot(records, settings, out / name)
    return list(plots)


# ---------------------------------------------------------------------------------------------
# The command


def measured_on() -> str:
    """``Measured on <date> (commit <hash>)``: what dates a page of figures (the commit where the
    repository is a git checkout; ``, with changes`` where its files differ from it)."""
    import datetime
    import subprocess

    date = datetime.date.today().isoformat()
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        commit = changed = ""
    if not commit:
        return f"Measured on {date}."
    return f"Measured on {date} (commit {commit}{', with changes' if changed else ''})."


def environment() -> dict[str, Any]:
    import onnx

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
        "onnxruntime": ort.__version__,
        "onnx": onnx.__version__,
        "python": platform.python_version(),
        "torch_default_threads": torch.get_num_threads(),
        "measured": measured_on(),
    }


@contextlib.contextmanager
def timed(part: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    progress(f"{part}: {time.perf_counter() - start:.0f} s")


def quiet() -> None:
    """torch.onnx logs every step, and the TorchScript exporter warns that it is deprecated."""
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes, one repetition: checks that all runs"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "docs" / "benchmarks",
        help="folder for results.md, results.json and the plots (default: docs/benchmarks)",
    )
    args = parser.parse_args()
    quiet()
    settings = QUICK if args.quick else FULL
    env = environment()
    threads = (1, None)  # None: the library's default
    start = time.perf_counter()
    results: dict[str, list[dict]] = {}
    with timed("eager speed"):
        results["eager"] = eager_speed(settings, threads)
    with timed("eager memory"):
        results["memory"] = eager_memory(settings)
    with timed("export"):
        results["export"], models = export_models(settings)
    with timed("onnxruntime"):
        results["onnxruntime"] = onnxruntime_speed(settings, models, threads)
    env["minutes"] = (time.perf_counter() - start) / 60
    markdown = render(results, settings, env)
    print(markdown)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text(markdown)
    payload = {"settings": dataclasses.asdict(settings), "environment": env, **results}
    (args.out / "results.json").write_text(json.dumps(payload, indent=1) + "\n")
    plots = plot_all(results, settings, args.out)
    progress(f"wrote results.md, results.json and {', '.join(plots) or 'no plots'} to {args.out}")


if __name__ == "__main__":
    main()
