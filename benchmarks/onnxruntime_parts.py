"""Where the time of an exported recurrent model goes in onnxruntime, and how much moving work
out of the ``Scan`` body can save.

For an Elman RNN and an LSTM cell (B=8, one thread by default), this times, interleaved in one
process with medians:

* ``hop scan``: the model exported through ``torch._higher_order_ops.scan`` (the baseline);
* ``torchscan``: the model exported through ``torchscan.scan`` with the input projection moved
  out of the body (the default);
* ``torchscan, not hoisted``: the same with ``hoist_loop_invariants=False``;
* ``outside the Scan``: the part of the ``torchscan`` model before its ``Scan`` (the batched input
  projection ``xs @ W_ih.T + b`` over the whole sequence), alone;
* ``Scan alone``: the ``Scan`` node of the ``torchscan`` model alone, fed with the projected
  sequence computed beforehand (what is left in the loop: ``h @ W_hh.T`` and the activations).

It also reports the arithmetic rate of the two matrix products (GFLOP/s): the batched projection
outside the loop and the per-step recurrent product inside it. When both run near the same rate
as a large matrix product does on this machine, the remaining time is that of the arithmetic
itself, and no rewriting of the graph can take it lower. ``python benchmarks/onnxruntime_parts.py
--help`` lists the options.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import suite

import torchscan.onnx

HOP = "hop scan"
SCAN = "torchscan"
NOT_HOISTED = "torchscan, not hoisted"
OUTSIDE = "outside the Scan"
SCAN_ALONE = "Scan alone"
# Gate blocks of W_ih / W_hh: one for the Elman RNN, four for the LSTM.
GATES = {"RNN": 1, "LSTM": 4}


def export(rec: suite.Recurrence, name: str, hoist: bool) -> onnx.ModelProto:
    xs, carry = rec.inputs(10, 8)
    with torchscan.onnx.export_options(hoist_loop_invariants=hoist):
        program = torch.onnx.export(
            rec.models[name],
            (xs, carry),
            dynamo=True,
            opset_version=suite.DYNAMO_OPSET,
            dynamic_shapes=suite.dynamic_shapes(rec),
            verbose=False,
        )
    return program.model_proto


def the_scan(model: onnx.ModelProto) -> onnx.NodeProto:
    (scan,) = [node for node in model.graph.node if node.op_type == "Scan"]
    return scan


def outside_part(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model up to its Scan: its outputs are the Scan's inputs."""
    scan = the_scan(model)
    part = onnx.ModelProto()
    part.CopyFrom(model)
    del part.graph.output[:]
    part.graph.output.extend(onnx.helper.make_empty_tensor_value_info(name) for name in scan.input)
    keep = [node for node in model.graph.node if node is not scan]
    del part.graph.node[:]
    part.graph.node.extend(keep)
    return part


def scan_part(model: onnx.ModelProto) -> onnx.ModelProto:
    """The Scan node alone, with the outer initializers its body reads."""
    scan = the_scan(model)
    part = onnx.ModelProto()
    part.CopyFrom(model)
    del part.graph.node[:]
    part.graph.node.append(scan)
    del part.graph.input[:]
    part.graph.input.extend(float_value(name) for name in scan.input)
    del part.graph.output[:]
    part.graph.output.extend(onnx.helper.make_empty_tensor_value_info(name) for name in scan.output)
    return part


def float_value(name: str) -> onnx.ValueInfoProto:
    # Every input of these Scans is float32: the projected sequence and the carries.
    return onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)


def session(model: onnx.ModelProto, threads: int | None) -> ort.InferenceSession:
    return suite.session(model.SerializeToString(), threads)


def feeds(sess: ort.InferenceSession, arrays: list[np.ndarray]) -> dict[str, np.ndarray]:
    return {node.name: array for node, array in zip(sess.get_inputs(), arrays, strict=True)}


def measure(kind: str, hidden: int, length: int, threads: int | None, repeats: int) -> dict:
    rec = suite.Recurrence.make(kind, hidden)
    models = {
        HOP: export(rec, suite.HOP, hoist=False),
        SCAN: export(rec, suite.SCAN, hoist=True),
        NOT_HOISTED: export(rec, suite.SCAN, hoist=False),
    }
    sessions = {name: session(model, threads) for name, model in models.items()}
    xs, carry = rec.inputs(length, 8)
    with torch.no_grad():
        want = suite.flat(rec.models[suite.LOOP](xs, carry))
    arrays = [t.numpy() for t in (xs, *suite.flat(carry))]
    runs = {name: suite.ort_runner(sess, arrays) for name, sess in sessions.items()}
    for name, run in runs.items():
        suite.check_close(f"onnxruntime {name}", run(), want)

    outside = session(outside_part(models[SCAN]), threads)
    scan_inputs = outside.run(None, feeds(outside, arrays))
    alone = session(scan_part(models[SCAN]), threads)
    suite.check_close("the Scan alone", alone.run(None, feeds(alone, scan_inputs)), want)
    runs[OUTSIDE] = suite.ort_runner(outside, arrays)
    runs[SCAN_ALONE] = suite.ort_runner(alone, scan_inputs)

    for run in runs.values():
        run()
    medians = suite.interleaved_medians(runs, repeats)
    gate_rows = GATES[kind] * hidden
    product_flop = 2 * length * 8 * hidden * gate_rows  # one of the two matrix products
    return {"cell": kind, "H": hidden, "T": length, "median_s": medians, "flop": product_flop}


def report(record: dict) -> str:
    medians, flop = record["median_s"], record["flop"]
    base = medians[HOP]
    lines = [
        f"{suite.CELL_NAMES[record['cell']]}, H={record['H']}, T={record['T']}, B=8",
        "",
        "| graph | median (ms) | ratio to hop scan |",
        "| --- | ---: | ---: |",
    ]
    for name, seconds in medians.items():
        lines.append(f"| {name} | {seconds * 1e3:.2f} | {seconds / base:.2f} |")
    projection_rate = flop / medians[OUTSIDE] / 1e9
    recurrent_rate = flop / medians[SCAN_ALONE] / 1e9
    lines += [
        "",
        f"input projection outside the loop: {projection_rate:.0f} GFLOP/s (with its bias add); "
        f"the Scan alone, counting only its recurrent product: {recurrent_rate:.0f} GFLOP/s",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", nargs="+", default=["RNN", "LSTM"], choices=sorted(GATES))
    parser.add_argument("--H", type=int, default=256)
    parser.add_argument("--T", type=int, nargs="+", default=[10, 1000])
    parser.add_argument("--threads", type=int, default=1, help="0: onnxruntime's default")
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    suite.quiet()
    print(suite.measured_on() + "\n")
    print(f"onnxruntime {ort.__version__}, torch {torch.__version__}, {args.threads} thread(s)")
    print()
    for kind in args.cells:
        for length in args.T:
            record = measure(kind, args.H, length, args.threads or None, args.repeats)
            print(report(record), flush=True)


if __name__ == "__main__":
    main()
