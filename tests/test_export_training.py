"""Training an exported program: ``torch.export.export(model, args).module()`` runs torchscan's
operators as Python loops with autograd, so gradients reach the parameters and inputs as they do
eagerly, after ``torch.export.save``/``load`` and ``run_decompositions`` too, while the program
itself keeps one loop operator (never an unrolled graph).

Every model computes the same thing with ``torchscan`` and, with ``python=True``, with a plain
Python loop: the oracle the gradients of the exported program are compared to."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import torchscan

F, H, B, T = 3, 4, 2, 5


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64)


class Model(torch.nn.Module):
    def __init__(self, python: bool = False) -> None:
        super().__init__()
        self.python = python


class Rnn(Model):
    """An RNNCell over axis 0: the cell's parameters are captured by the step."""

    def __init__(self, python: bool = False) -> None:
        super().__init__(python)
        self.cell = torch.nn.RNNCell(F, H, dtype=torch.float64)

    def forward(self, xs, h):
        def step(h, x):
            h = self.cell(x, h)
            return h, h * 2

        if self.python:
            ys = []
            for x in xs:
                h, y = step(h, x)
                ys.append(y)
            return h, torch.stack(ys)
        return torchscan.scan(step, h, xs)


class LstmBackward(Model):
    """An LSTMCell over axis 1, in reverse, with a dict as the carry and a tuple of outputs."""

    def __init__(self, python: bool = False) -> None:
        super().__init__(python)
        self.cell = torch.nn.LSTMCell(F, H, dtype=torch.float64)
        self.scale = torch.nn.Parameter(torch.ones(H, dtype=torch.float64))

    def forward(self, xs, h):
        def step(state, x):
            h, c = self.cell(x, (state["h"], state["c"]))
            return {"h": h, "c": c}, (h * self.scale, c.sum(-1))

        init = {"h": h, "c": torch.zeros_like(h)}
        if self.python:
            carry, ys = init, []
            for t in reversed(range(xs.shape[1])):
                carry, y = step(carry, xs[:, t])
                ys.append(y)
            ys.reverse()
            return carry, (torch.stack([y[0] for y in ys], 1), torch.stack([y[1] for y in ys], 1))
        return torchscan.scan(step, init, xs, axis=1, reverse=True)


class ForSequence(Model):
    """A loop with a trip count, reading the sequence with the iteration number."""

    def __init__(self, python: bool = False) -> None:
        super().__init__(python)
        self.linear = torch.nn.Linear(F + H, H, dtype=torch.float64)

    def forward(self, xs, h):
        def body(i, h):
            h = torch.tanh(self.linear(torch.cat([xs[i], h], -1)) + i * 0.1)
            return h, h.sum(-1)

        if self.python:
            ys = []
            for i in range(xs.shape[0]):
                h, y = body(torch.tensor(i), h)
                ys.append(y)
            return h, torch.stack(ys)
        return torchscan.loop(body, h, trip_count=xs.shape[0])


class LoopUntil(Model):
    """A loop that stops once a running total passes a threshold (after iteration 2 here)."""

    def __init__(self, python: bool = False) -> None:
        super().__init__(python)
        self.weight = torch.nn.Parameter(torch.full((F,), 0.5, dtype=torch.float64))

    def forward(self, xs, h):
        def body(i, total):
            total = total + torch.tanh(xs[i] * self.weight).sum(0)
            return total, total * 2, torchscan.until(i >= 2)

        init = h[0, :F].clone()
        if self.python:
            total, ys = init, []
            for i in range(xs.shape[0]):
                total, y, stop = body(torch.tensor(i), total)
                ys.append(y)
                if stop.stop:
                    break
            return total, torch.stack(ys)
        return torchscan.loop(body, init, trip_count=xs.shape[0])


class ScanUntil(Model):
    """A scan that stops early: exported as a loop."""

    def __init__(self, python: bool = False) -> None:
        super().__init__(python)
        self.cell = torch.nn.RNNCell(F, H, dtype=torch.float64)

    def forward(self, xs, h):
        def step(h, x):
            h = self.cell(x, h)
            return h, h, torchscan.until(h.sum() > 1e9)

        if self.python:
            ys = []
            for x in xs:
                h, y, stop = step(h, x)
                ys.append(y)
                if stop.stop:
                    break
            return h, torch.stack(ys)
        return torchscan.scan(step, h, xs)


MODELS: dict[str, tuple[type[Model], Callable[[int], tuple[torch.Tensor, ...]], str]] = {
    "scan-rnn": (Rnn, lambda t: (randn(t, B, F), randn(B, H)), "torchscan_scan"),
    "scan-lstm-axis1-reverse-pytree": (
        LstmBackward,
        lambda t: (randn(B, t, F), randn(B, H)),
        "torchscan_scan",
    ),
    "loop-trip-count": (ForSequence, lambda t: (randn(t, B, F), randn(B, H)), "torchscan_loop"),
    "loop-until": (LoopUntil, lambda t: (randn(t, B, F), randn(B, H)), "torchscan_loop"),
    "scan-until": (ScanUntil, lambda t: (randn(t, B, F), randn(B, H)), "torchscan_loop"),
}


def gradients(model: Callable, module: torch.nn.Module, args: tuple) -> list[torch.Tensor]:
    """The outputs, and the gradients of a weighted sum of them, of the parameters and inputs."""
    args = tuple(a.detach().requires_grad_() for a in args)
    leaves = torch.utils._pytree.tree_leaves(model(*args))
    loss = sum((leaf * (k + 1)).sum() for k, leaf in enumerate(leaves))
    params = [p for _, p in sorted(module.named_parameters())]
    grads = torch.autograd.grad(loss, [*params, *args])
    return [*(leaf.detach() for leaf in leaves), *grads]


def twins(name: str) -> tuple[Model, Model, Any, str]:
    """The torchscan model, its Python-loop twin with the same parameters, the inputs maker and
    the operator its program holds."""
    kind, make_args, op = MODELS[name]
    torch.manual_seed(0)
    model = kind()
    oracle = kind(python=True)
    oracle.load_state_dict(model.state_dict())
    return model, oracle, make_args, op


def loop_operators(program: torch.export.ExportedProgram) -> list[str]:
    """The names of the higher-order operators called anywhere in the program, nested ones
    included."""
    return [
        node.target.name()
        for module in program.graph_module.modules()
        if isinstance(module, torch.fx.GraphModule)
        for node in module.graph.nodes
        if node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator)
    ]


def check_trains(program: torch.export.ExportedProgram, name: str, t: int = T) -> None:
    model, oracle, make_args, _ = twins(name)
    args = make_args(t)
    module = program.module()
    exported = gradients(module, module, args)
    torch.testing.assert_close(exported, gradients(model, model, args))
    torch.testing.assert_close(exported, gradients(oracle, oracle, args))


def export(name: str, dynamic: bool = False) -> torch.export.ExportedProgram:
    model, _, make_args, _ = twins(name)
    args = make_args(T)
    shapes = None
    if dynamic:
        axis = 1 if name.startswith("scan-lstm") else 0
        shapes = ({axis: torch.export.Dim("T", min=2, max=64)}, None)
    return torch.export.export(model, args, dynamic_shapes=shapes)


@pytest.mark.parametrize("name", list(MODELS))
def test_an_exported_program_trains_as_the_eager_model(name: str) -> None:
    program = export(name)
    assert loop_operators(program) == [MODELS[name][2]]
    check_trains(program, name)


@pytest.mark.parametrize("name", ["scan-rnn", "scan-lstm-axis1-reverse-pytree", "loop-until"])
def test_a_program_with_a_dynamic_length_trains_at_other_lengths(name: str) -> None:
    program = export(name, dynamic=True)
    for t in (3, 7):
        check_trains(program, name, t)


@pytest.mark.parametrize("name", list(MODELS))
def test_a_saved_and_loaded_program_trains(name: str, tmp_path: Path) -> None:
    path = tmp_path / "program.pt2"
    torch.export.save(export(name), path)
    loaded = torch.export.load(path)
    assert loop_operators(loaded) == [MODELS[name][2]]
    check_trains(loaded, name)


@pytest.mark.parametrize("name", list(MODELS))
def test_a_decomposed_program_keeps_one_loop_and_trains(name: str) -> None:
    decomposed = export(name).run_decompositions()
    assert loop_operators(decomposed) == [MODELS[name][2]]
    check_trains(decomposed, name)


def test_the_module_of_a_program_learns_as_the_eager_model() -> None:
    """Three steps of SGD on the program's module and on the eager model: the same losses and
    the same parameters after each."""
    model, _, make_args, _ = twins("scan-rnn")
    module = export("scan-rnn").module()
    xs, h = make_args(T)
    histories = []
    for trained in (module, model):
        optimizer = torch.optim.SGD(trained.parameters(), lr=0.01)
        losses = []
        for _ in range(3):
            optimizer.zero_grad()
            final, ys = trained(xs, h)
            loss = (final**2).sum() + (ys**2).sum()
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
        histories.append((losses, [p.detach() for _, p in sorted(trained.named_parameters())]))
    torch.testing.assert_close(histories[0], histories[1])
    assert histories[0][0][2] < histories[0][0][0]


def test_tracing_a_program_records_no_backward() -> None:
    """Under a trace (fake tensors) the operator is not run as a Python loop: exporting the
    module of a program again gives one loop operator, not an unrolled graph."""
    program = export("scan-rnn", dynamic=True)
    again = torch.export.export(
        program.module(),
        MODELS["scan-rnn"][1](T),
        dynamic_shapes=({0: torch.export.Dim("T", min=2, max=64)}, None),
    )
    assert loop_operators(again) == ["torchscan_scan"]
    check_trains(again, "scan-rnn", 6)


# -- torchscan.lower_to_torch ------------------------------------------------------------------


def lowered(name: str) -> torch.export.ExportedProgram:
    program = torchscan.lower_to_torch(export(name, dynamic=True))
    operators = loop_operators(program)
    assert operators == ["scan"], operators
    return program


@pytest.mark.parametrize("name", ["scan-rnn", "scan-lstm-axis1-reverse-pytree", "loop-trip-count"])
def test_a_lowered_program_holds_torchs_scan_and_computes_and_trains_the_same(name: str) -> None:
    program = export(name, dynamic=True)
    lowered_program = lowered(name)
    for t in (3, 7):
        args = MODELS[name][1](t)
        torch.testing.assert_close(lowered_program.module()(*args), program.module()(*args))
        check_trains(lowered_program, name, t)


def test_a_loaded_and_decomposed_program_lowers(tmp_path: Path) -> None:
    path = tmp_path / "program.pt2"
    torch.export.save(export("scan-lstm-axis1-reverse-pytree", dynamic=True), path)
    program = torchscan.lower_to_torch(torch.export.load(path).run_decompositions())
    assert loop_operators(program) == ["scan"]
    check_trains(program, "scan-lstm-axis1-reverse-pytree", 6)


class Nested(torch.nn.Module):
    def forward(self, xs, h):
        def outer(c, x):
            c, ys = torchscan.scan(lambda a, b: (a + b, (a * b).clone()), c, x)
            return c, ys.sum(0)

        return torchscan.scan(outer, h, xs)


def test_nested_scans_and_unbounded_sizes_lower() -> None:
    shapes = ({0: torch.export.Dim("T"), 1: torch.export.Dim("U")}, None)
    args = (randn(5, 4, 3), randn(3))
    # torch's scan traces its step with TorchDynamo, whose state after the lowerings of other
    # programs adds a guard (size != 2) on the inner length: a limitation of torch 2.13 to 2.15.
    torch._dynamo.reset()
    program = torchscan.lower_to_torch(torch.export.export(Nested(), args, dynamic_shapes=shapes))
    assert loop_operators(program) == ["scan", "scan"]
    for other in (args, (randn(7, 3, 3), randn(3))):
        torch.testing.assert_close(program.module()(*other), Nested()(*other))


@pytest.mark.parametrize("name", ["loop-until", "scan-until"])
def test_a_loop_that_stops_early_does_not_lower(name: str) -> None:
    with pytest.raises(torchscan.TorchscanValueError) as info:
        torchscan.lower_to_torch(export(name))
    assert str(info.value).startswith(
        "torchscan.lower_to_torch: a torchscan_loop that may stop early (it has until) cannot "
        "become torch's scan"
    )


class CountInput(torch.nn.Module):
    def forward(self, n, h):
        return torchscan.loop(lambda i, h: (torch.tanh(h + i), h), h, trip_count=n)


def test_a_loop_counted_by_a_tensor_does_not_lower() -> None:
    program = torch.export.export(CountInput(), (torch.tensor(4), randn(3)))
    with pytest.raises(torchscan.TorchscanValueError, match="trip count is a tensor"):
        torchscan.lower_to_torch(program)


class _CountedUntil(torch.nn.Module):
    """A loop counted by a tensor that may also stop early, against its Python loop."""

    def __init__(self, python: bool = False) -> None:
        super().__init__()
        self.python = python

    def forward(self, x: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.python:
            c, ys = x * 0, []
            for _ in range(int(n)):
                ys.append(c)
                stop = bool(c.sum() > 7)
                c = c + x
                if stop:
                    break
            return c, torch.stack(ys) if ys else x.new_empty(0, *x.shape)

        def body(i, c):
            return c + x, c, torchscan.until(c.sum() > 7)

        return torchscan.loop(body, x * 0, trip_count=n)


@pytest.mark.parametrize("trips", [0, 1, 3, 9])
def test_a_program_runs_a_loop_counted_by_a_tensor_any_number_of_times(trips: int) -> None:
    """No iteration included: ys of length 0 shaped by the body, as eagerly."""
    x = randn(3)
    program = torch.export.export(_CountedUntil(), (x, torch.tensor(4)))
    got = program.module()(x, torch.tensor(trips))
    expected = _CountedUntil(python=True)(x, torch.tensor(trips))
    assert [t.shape for t in got] == [t.shape for t in expected]
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b)
