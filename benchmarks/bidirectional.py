"""A bidirectional LSTM over a batch of padded sequences: ``torchscan.scan`` with ``lengths``
against ``torch.nn.LSTM`` on a ``PackedSequence`` and a hand-written masked loop, eagerly and in
onnxruntime.

One bidirectional LSTM layer (``torch.nn.LSTM(bidirectional=True)``, one layer) runs over a
(T, B, F) batch whose examples have random lengths between 1 and T, T among them. Eagerly, three
implementations compute the outputs (zeros at padded positions) and the final hidden state of
both directions, each direction of each example starting and ending at its own ends:

* ``python masked loop``: two ``LSTMCell`` looped by hand over the padded axis, forwards and
  backwards, keeping each example's state with ``torch.where`` where its sequence has ended
  (forwards) or not yet begun (backwards);
* ``nn.LSTM, packed``: ``pack_padded_sequence(..., enforce_sorted=False)``, the fused module and
  ``pad_packed_sequence``;
* ``torchscan.scan``: the same two cells (weights copied from the ``torch.nn.LSTM``) in two
  scans with ``lengths=``, one of them ``reverse=True``.

In onnxruntime, the ``torchscan`` model exported by ``torch.onnx.export(..., dynamo=True)``
(dynamic T and B, ``lengths`` an input: two ``Scan`` nodes) runs against ONNX's own ``LSTM``
operator (``direction="bidirectional"`` with ``sequence_lens``), built by hand from the weights
of the same ``torch.nn.LSTM``.

Eagerly, the forward pass is timed without gradients, and with the backward pass (the
gradients of the weights). Every implementation is checked against the others before it is
timed (outputs, padded positions included, and final h, within 1e-5); they are then timed
interleaved in one process (each repetition runs all of them, in rotating order) and the medians
are reported with their ratios. Run ``python benchmarks/bidirectional.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import TensorProto
from onnx import helper as oh
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

import suite

import torchscan

LOOP = "python masked loop"
PACKED = "nn.LSTM, packed"
SCAN = "torchscan.scan"
ONNX_OP = "ONNX LSTM operator"
EXPORTED = "torchscan, exported"
TOLERANCE = 1e-5

State = tuple[torch.Tensor, torch.Tensor]  # (h, c) of a batch
Output = tuple[torch.Tensor, torch.Tensor]  # outputs (T, B, 2H), final h of both directions


class Cells(torch.nn.Module):
    """The two directions of a bidirectional ``torch.nn.LSTM`` as ``LSTMCell``, with copies of
    its weights."""

    def __init__(self, lstm: torch.nn.LSTM) -> None:
        super().__init__()
        self.hidden_size = lstm.hidden_size
        self.cell_f = torch.nn.LSTMCell(lstm.input_size, lstm.hidden_size)
        self.cell_b = torch.nn.LSTMCell(lstm.input_size, lstm.hidden_size)
        with torch.no_grad():
            for cell, suffix in ((self.cell_f, "l0"), (self.cell_b, "l0_reverse")):
                for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                    getattr(cell, name).copy_(getattr(lstm, f"{name}_{suffix}"))

    def zeros(self, xs: torch.Tensor) -> State:
        h = xs.new_zeros(xs.shape[1], self.hidden_size)
        return h, h


class TorchscanLSTM(Cells):
    def forward(self, xs: torch.Tensor, lengths: torch.Tensor) -> Output:
        def step_f(state: State, x: torch.Tensor) -> tuple[State, torch.Tensor]:
            state = self.cell_f(x, state)
            return state, state[0]

        def step_b(state: State, x: torch.Tensor) -> tuple[State, torch.Tensor]:
            state = self.cell_b(x, state)
            return state, state[0]

        (h_f, _), ys_f = torchscan.scan(step_f, self.zeros(xs), xs, lengths=lengths)
        (h_b, _), ys_b = torchscan.scan(step_b, self.zeros(xs), xs, lengths=lengths, reverse=True)
        return torch.cat([ys_f, ys_b], -1), torch.stack([h_f, h_b])


class MaskedLoop(Cells):
    """Every step runs over the whole batch; where it is past the end of an example (forwards)
    or before that example's last position (backwards), the state is kept and the output is 0."""

    def direction(
        self, cell: torch.nn.LSTMCell, xs: torch.Tensor, valid: torch.Tensor, backward: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        steps = range(xs.shape[0] - 1, -1, -1) if backward else range(xs.shape[0])
        (h, c), ys = self.zeros(xs), []
        for t in steps:
            new_h, new_c = cell(xs[t], (h, c))
            h, c = torch.where(valid[t], new_h, h), torch.where(valid[t], new_c, c)
            ys.append(torch.where(valid[t], new_h, 0.0))
        if backward:
            ys.reverse()
        return h, torch.stack(ys)

    def forward(self, xs: torch.Tensor, lengths: torch.Tensor) -> Output:
        valid = (torch.arange(xs.shape[0])[:, None] < lengths)[..., None]  # (T, B, 1)
        h_f, ys_f = self.direction(self.cell_f, xs, valid, backward=False)
        h_b, ys_b = self.direction(self.cell_b, xs, valid, backward=True)
        return torch.cat([ys_f, ys_b], -1), torch.stack([h_f, h_b])


class Packed(torch.nn.Module):
    def __init__(self, lstm: torch.nn.LSTM) -> None:
        super().__init__()
        self.lstm = lstm

    def forward(self, xs: torch.Tensor, lengths: torch.Tensor) -> Output:
        packed = pack_padded_sequence(xs, lengths, enforce_sorted=False)
        ys, (h_n, _) = self.lstm(packed)
        ys, _ = pad_packed_sequence(ys, total_length=xs.shape[0])
        return ys, h_n


def check_agree(name: str, got: Output, want: Output) -> None:
    for what, g, w in zip(("outputs", "final h"), got, want, strict=True):
        difference = (torch.as_tensor(g) - w).abs().max().item()
        assert difference <= TOLERANCE, f"{name}: {what} differ by {difference:.2e}"


def onnx_lstm(lstm: torch.nn.LSTM, opset: int) -> onnx.ModelProto:
    """ONNX's ``LSTM`` operator with the weights of ``lstm``, and the inputs and outputs of the
    exported ``torchscan`` model: ``xs`` (T, B, F), ``lengths`` (B,) of int64; outputs (T, B, 2H)
    and the final h (2, B, H)."""
    hidden = lstm.hidden_size

    def onnx_gates(weight: torch.Tensor) -> torch.Tensor:
        # PyTorch stacks the gate blocks as i, f, g, o; ONNX as i, o, f, c (c is PyTorch's g)
        blocks = weight.detach().reshape(4, hidden, *weight.shape[1:])
        return blocks[[0, 3, 1, 2]].reshape(weight.shape)

    def both(make: Callable[[str], torch.Tensor]) -> np.ndarray:
        return torch.stack([make("l0"), make("l0_reverse")]).numpy()

    def param(name: str, suffix: str) -> torch.Tensor:
        return onnx_gates(getattr(lstm, f"{name}_{suffix}"))

    w = both(lambda s: param("weight_ih", s))  # [2, 4H, F]
    r = both(lambda s: param("weight_hh", s))  # [2, 4H, H]
    b = both(lambda s: torch.cat([param("bias_ih", s), param("bias_hh", s)]))  # [2, 8H]
    nodes = [
        oh.make_node("Cast", ["lengths"], ["sequence_lens"], to=TensorProto.INT32),
        oh.make_node(
            "LSTM",
            ["xs", "W", "R", "B", "sequence_lens"],
            ["Y", "h_n"],
            hidden_size=hidden,
            direction="bidirectional",
        ),
        # Y is [T, 2, B, H]: the directions side by side on the last axis, as torch.nn.LSTM
        oh.make_node("Transpose", ["Y"], ["Y_t"], perm=[0, 2, 1, 3]),
        oh.make_node("Reshape", ["Y_t", "shape"], ["ys"]),
    ]
    initializers = [
        onnx.numpy_helper.from_array(w, "W"),
        onnx.numpy_helper.from_array(r, "R"),
        onnx.numpy_helper.from_array(b, "B"),
        onnx.numpy_helper.from_array(np.array([0, 0, -1], dtype=np.int64), "shape"),
    ]
    graph = oh.make_graph(
        nodes,
        "bidirectional_lstm",
        [
            oh.make_tensor_value_info("xs", TensorProto.FLOAT, ["T", "B", lstm.input_size]),
            oh.make_tensor_value_info("lengths", TensorProto.INT64, ["B"]),
        ],
        [
            oh.make_tensor_value_info("ys", TensorProto.FLOAT, ["T", "B", 2 * hidden]),
            oh.make_tensor_value_info("h_n", TensorProto.FLOAT, [2, "B", hidden]),
        ],
        initializers,
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def export_torchscan(model: TorchscanLSTM, features: int) -> onnx.ModelProto:
    """The model with a dynamic length and batch, exported at a small example."""
    time, batch = torch.export.Dim("T", min=1), torch.export.Dim("B", min=1)
    program = torch.onnx.export(
        model.eval(),
        (torch.randn(4, 3, features), torch.tensor([4, 1, 2])),
        dynamo=True,
        opset_version=suite.DYNAMO_OPSET,
        dynamic_shapes=({0: time, 1: batch}, {0: batch}),
        verbose=False,
    )
    return program.model_proto


def fmt(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def eager(
    models: dict[str, torch.nn.Module], xs: torch.Tensor, lengths: torch.Tensor, repeats: int
) -> list[str]:
    with torch.no_grad():
        outputs = {name: model(xs, lengths) for name, model in models.items()}
    for name, output in outputs.items():
        check_agree(f"eager {name}", output, outputs[LOOP])
        check_agree(f"eager {name}", output, outputs[PACKED])

    def forward_no_grad(name: str) -> Callable[[], object]:
        def run() -> None:
            with torch.no_grad():
                models[name](xs, lengths)

        return run

    def forward_backward(name: str) -> Callable[[], object]:
        def run() -> None:
            ys, h_n = models[name](xs, lengths)
            (ys.sum() + h_n.sum()).backward()

        return run

    rows = [
        "| mode | implementation | median (ms) | ratio to python masked loop "
        "| ratio to nn.LSTM packed |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for mode, make in [
        ("forward, no_grad", forward_no_grad),
        ("forward + backward", forward_backward),
    ]:
        runs = {name: make(name) for name in models}
        for run in runs.values():  # warm-up
            run()
        medians = suite.interleaved_medians(runs, repeats)
        for name, seconds in medians.items():
            rows.append(
                f"| {mode} | {name} | {fmt(seconds)} | {seconds / medians[LOOP]:.3f} "
                f"| {seconds / medians[PACKED]:.3f} |"
            )
    return rows


def onnxruntime(
    lstm: torch.nn.LSTM,
    scan_model: TorchscanLSTM,
    xs: torch.Tensor,
    lengths: torch.Tensor,
    threads: int,
    repeats: int,
) -> list[str]:
    graphs = {
        ONNX_OP: onnx_lstm(lstm, suite.DYNAMO_OPSET),
        EXPORTED: export_torchscan(scan_model, xs.shape[2]),
    }
    scans = [node.op_type for node in graphs[EXPORTED].graph.node].count("Scan")
    assert scans == 2, f"the exported torchscan model has {scans} Scan nodes, not 2"
    with torch.no_grad():
        want = scan_model(xs, lengths)
    feeds = {"xs": xs.numpy(), "lengths": lengths.numpy()}
    runs: dict[str, Callable[[], object]] = {}
    for name, graph in graphs.items():
        session = suite.session(graph.SerializeToString(), threads)
        check_agree(f"onnxruntime {name}", session.run(None, feeds), want)
        runs[name] = lambda session=session: session.run(None, feeds)
    medians = suite.interleaved_medians(runs, repeats)
    rows = [
        f"| graph | median (ms) | ratio to {ONNX_OP} |",
        "| --- | ---: | ---: |",
    ]
    for name, seconds in medians.items():
        rows.append(f"| {name} | {fmt(seconds)} | {seconds / medians[ONNX_OP]:.3f} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=100, help="padded sequence length")
    parser.add_argument("--B", type=int, default=16, help="batch size")
    parser.add_argument("--F", type=int, default=32, help="input features")
    parser.add_argument("--H", type=int, default=64, help="hidden size of each direction")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch.set_num_threads and onnxruntime's threads"
    )
    args = parser.parse_args()
    suite.quiet()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    lstm = torch.nn.LSTM(args.F, args.H, bidirectional=True)
    cells = TorchscanLSTM(lstm)
    loop = MaskedLoop(lstm)
    models: dict[str, torch.nn.Module] = {LOOP: loop, PACKED: Packed(lstm), SCAN: cells}
    xs = torch.randn(args.T, args.B, args.F)
    lengths = torch.randint(1, args.T + 1, (args.B,))
    lengths[0] = args.T  # one full-length example

    print(
        f"Bidirectional LSTM, T={args.T}, B={args.B}, F={args.F}, H={args.H}, lengths "
        f"{lengths.min().item()}..{args.T} (mean {lengths.float().mean().item():.1f}), "
        f"{args.threads} thread(s), median of {args.repeats}, torch {torch.__version__}, "
        f"onnxruntime {ort.__version__}\n"
    )
    print("\n".join(eager(models, xs, lengths, args.repeats)))
    print()
    print("\n".join(onnxruntime(lstm, cells, xs, lengths, args.threads, args.repeats)))


if __name__ == "__main__":
    main()
