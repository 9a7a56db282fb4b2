# pyright: strict, reportUnnecessaryTypeIgnoreComment=true
# torch's own stubs leave some types unknown (Tensor.tolist, torch.onnx.export), and so do the
# untyped lambdas Theano's style of code passes: those are not torchscan's to fix.
# pyright: reportUnknownMemberType=false, reportUnknownLambdaType=false
# pyright: reportUnknownArgumentType=false
"""Code as a user writes it: every public function in every documented form, with the types a
type checker must give the results.

The type check runs pyright in strict mode on this directory (``tox -e typecheck``, ``.ci/run``):
a form the annotations reject is an error there, and each ``assert_type`` fails where a result's
type is less precise than it should be. The lines marked ``# pyright: ignore[...]`` are calls the
annotations must refuse; with ``reportUnnecessaryTypeIgnoreComment`` on, a refusal that goes away
is an error too. pytest runs the same code, so that what is checked is what runs.
"""

from __future__ import annotations

import collections.abc
from typing import Any, Literal, NamedTuple

import numpy as np
import pytest
import torch
from typing_extensions import assert_type

import torchscan
import torchscan.onnx
from torchscan import theano

# scan


def test_scan_with_a_pair() -> None:
    def add(total: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return total + x, total + x

    total, running = torchscan.scan(add, torch.tensor(0.0), torch.arange(4.0))
    assert_type(total, torch.Tensor)
    assert_type(running, torch.Tensor)
    assert running.tolist() == [0.0, 1.0, 3.0, 6.0]


def test_scan_with_until() -> None:
    def add_until(
        total: torch.Tensor, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torchscan.Until]:
        return total + x, total + x, torchscan.until(total + x > 2)

    total, running = torchscan.scan(add_until, torch.tensor(0.0), torch.arange(4.0))
    assert_type(total, torch.Tensor)
    assert_type(running, torch.Tensor)
    assert running.tolist() == [0.0, 1.0, 3.0]


def test_scan_with_checkpoint() -> None:
    w = torch.randn(3, 3, requires_grad=True)

    def step(h: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(x + h @ w)
        return h, h

    xs, h0 = torch.randn(12, 3), torch.zeros(3)
    policies: list[int | Literal["sqrt"] | torchscan.Checkpoint] = [
        4,
        "sqrt",
        torchscan.Checkpoint(every=3),
        torchscan.Checkpoint(snapshots=2),
        torchscan.Checkpoint(every="sqrt", save=[torch.ops.aten.addmm.default]),
        torchscan.Checkpoint(every=2, save=lambda op: op == torch.ops.aten.tanh.default),
    ]
    for policy in policies:
        h, ys = torchscan.scan(step, h0, xs, checkpoint=policy)
        assert_type(h, torch.Tensor)
        (h.sum() + ys.sum()).backward()
    h, _ = torchscan.scan(step, h0, xs, checkpoint="sqrt")
    h, _ = torchscan.scan(step, h0, xs, checkpoint=torchscan.Checkpoint(snapshots=1))
    assert torchscan.Checkpoint(every="sqrt").segment(12) == 4


def test_scan_with_lambdas() -> None:
    xs = torch.tensor([[1.0, 2.0, 3.0]])
    carry, sums = torchscan.scan(
        lambda c, x: (c + x, c + x), torch.zeros(1), xs, axis=-1, reverse=True
    )
    assert_type(carry, torch.Tensor)
    assert_type(sums, torch.Tensor)
    assert sums.tolist() == [[6.0, 5.0, 3.0]]
    carry, sums = torchscan.scan(
        lambda c, x: (c + x, c, torchscan.until(c.sum() > 0)), torch.zeros(1), xs, axis=1
    )
    assert_type(sums, torch.Tensor)
    assert sums.tolist() == [[0.0, 1.0]]


def test_scan_without_xs() -> None:
    last, powers = torchscan.scan(lambda p, _: (p * 2, p), torch.tensor(1), length=5)
    assert_type(last, torch.Tensor)
    assert_type(powers, torch.Tensor)
    assert powers.tolist() == [1, 2, 4, 8, 16]

    def double(p: torch.Tensor, x: None) -> tuple[torch.Tensor, torch.Tensor, torchscan.Until]:
        return p * 2, p, torchscan.until(p >= 4)

    _, powers = torchscan.scan(double, torch.tensor(1), length=np.int64(5))
    assert powers.tolist() == [1, 2, 4]


class State(NamedTuple):
    h: torch.Tensor
    steps: torch.Tensor


def test_scan_with_pytrees() -> None:
    def step(
        state: State, x: dict[str, torch.Tensor]
    ) -> tuple[State, dict[str, torch.Tensor | None]]:
        h = torch.tanh(state.h + x["signal"] * x["gain"])
        return State(h, state.steps + 1), {"h": h, "unused": None}

    xs = {"signal": torch.randn(6, 2), "gain": torch.rand(6, 2)}
    state, ys = torchscan.scan(step, State(torch.zeros(2), torch.tensor(0)), xs)
    assert_type(state, State)
    assert_type(ys, dict[str, torch.Tensor | None])
    assert state.steps.item() == 6
    h = ys["h"]
    assert h is not None
    assert h.shape == (6, 2)


def test_scan_with_a_tuple_of_sequences_and_no_carry() -> None:
    def product(
        carry: None, x: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[None, tuple[torch.Tensor, torch.Tensor]]:
        a, b = x
        return None, (a * b, a + b)

    carry, (products, sums) = torchscan.scan(product, None, (torch.ones(3), torch.arange(3.0)))
    assert_type(carry, None)
    assert_type(products, torch.Tensor)
    assert_type(sums, torch.Tensor)
    assert products.tolist() == [0.0, 1.0, 2.0]


def test_scan_refuses_other_returns() -> None:
    def triple(c: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return c, x, x

    def until_first(
        c: torch.Tensor, x: torch.Tensor
    ) -> tuple[torchscan.Until, torch.Tensor, torch.Tensor]:
        return torchscan.until(x > 0), c, x

    with pytest.raises(TypeError, match="must return"):
        torchscan.scan(triple, torch.zeros(()), torch.ones(2))  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match="must be the last item"):
        torchscan.scan(until_first, torch.zeros(()), torch.ones(2))  # pyright: ignore[reportArgumentType]


# loop


def halve(i: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torchscan.Until]:
    x = x / 2
    return x, x, torchscan.until(x < 1)


def test_loop_in_its_five_modes() -> None:
    last, values = torchscan.loop(halve, torch.tensor(20.0), cond=torch.tensor(True))
    assert_type(last, torch.Tensor)
    assert_type(values, torch.Tensor)
    assert values.tolist() == [10.0, 5.0, 2.5, 1.25, 0.625]
    last, values = torchscan.loop(halve, torch.tensor(0.5))
    assert values.tolist() == [0.25]
    total, partial = torchscan.loop(lambda i, t: (t + i, t + i), torch.tensor(0), trip_count=5)
    assert_type(total, torch.Tensor)
    assert_type(partial, torch.Tensor)
    assert partial.tolist() == [0, 1, 3, 6, 10]
    last, values = torchscan.loop(halve, torch.tensor(1e6), trip_count=torch.tensor(3), cond=True)
    assert values.tolist() == [500000.0, 250000.0, 125000.0]
    _, values = torchscan.loop(halve, torch.tensor(8.0), trip_count=np.int64(2), cond=False)
    assert values.shape == (0,)


def test_loop_with_lambdas_and_pytrees() -> None:
    xs = torch.rand(8, 2)
    total, totals = torchscan.loop(
        lambda i, c: (c + xs[i], c, torchscan.until(c.sum() > 3)),
        torch.zeros(2),
        trip_count=xs.shape[0],
    )
    assert_type(total, torch.Tensor)
    assert_type(totals, torch.Tensor)

    def body(
        i: torch.Tensor, carry: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], dict[str, torch.Tensor]]:
        a, b = carry
        return (b, a + b), {"i": i, "fib": a}

    (a, b), ys = torchscan.loop(body, (torch.tensor(0), torch.tensor(1)), trip_count=6)
    assert_type(a, torch.Tensor)
    assert_type(ys, dict[str, torch.Tensor])
    assert ys["fib"].tolist() == [0, 1, 1, 2, 3, 5]
    assert b.item() == 13


def test_loop_refuses_other_returns() -> None:
    def carry_only(i: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return c + i

    with pytest.raises(TypeError, match="must return"):
        torchscan.loop(carry_only, torch.tensor(0), trip_count=2)  # pyright: ignore[reportArgumentType]


def test_until() -> None:
    flag = torchscan.until(torch.tensor(True))
    assert_type(flag, torchscan.Until)
    assert_type(flag.stop, torch.Tensor | bool)
    assert torchscan.Until(True) == torchscan.until(True)


# torchscan.theano


def test_theano_scan_with_one_output() -> None:
    a = torch.arange(10.0)
    result, updates = theano.scan(
        fn=lambda prior_result, a: prior_result * a,
        outputs_info=torch.ones_like(a),
        non_sequences=a,
        n_steps=4,
    )
    assert_type(result, torch.Tensor)
    assert_type(updates, dict[Any, Any])
    assert result[-1].tolist() == (a**4).tolist()
    assert updates == {}

    def step(u_tm4: torch.Tensor, u_t: torch.Tensor, x_tm3: torch.Tensor, x_tm1: torch.Tensor):
        return x_tm3 + x_tm1 + u_t - u_tm4

    x, _ = theano.scan(
        step,
        sequences={"input": torch.arange(9.0), "taps": [-4, 0]},
        outputs_info={"initial": torch.tensor([0.0, 0.0, 1.0]), "taps": [-3, -1]},
        truncate_gradient=2,
        go_backwards=False,
        mode=None,
        name="taps",
        profile=False,
        allow_gc=None,
        strict=False,
    )
    assert_type(x, torch.Tensor)
    assert len(x) == 5


def test_theano_scan_with_until() -> None:
    def step(total: torch.Tensor) -> tuple[torch.Tensor, torchscan.Until]:
        return total * 2, theano.until(total * 2 > 10)

    powers, _ = theano.scan(step, outputs_info=torch.tensor(1), n_steps=torch.tensor(10))
    assert_type(powers, torch.Tensor)
    assert powers.tolist() == [2, 4, 8, 16]

    def count(x: torch.Tensor) -> tuple[torch.Tensor, torchscan.Until]:
        return x + 1, theano.until(False)

    counted, _ = theano.scan(count, sequences=torch.arange(3))
    assert counted.tolist() == [1, 2, 3]


def test_theano_scan_with_several_outputs() -> None:
    def fib(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return b, a + b

    outputs, _ = theano.scan(fib, outputs_info=[torch.tensor(0), torch.tensor(1)], n_steps=5)
    assert_type(outputs, list[torch.Tensor])
    assert outputs[1].tolist() == [1, 2, 3, 5, 8]

    def fib_until(
        a: torch.Tensor, b: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torchscan.Until]:
        return b, a + b, theano.until(a + b > 4)

    outputs, _ = theano.scan(fib_until, outputs_info=[torch.tensor(0), torch.tensor(1)], n_steps=9)
    assert_type(outputs, list[torch.Tensor])
    assert outputs[1].tolist() == [1, 2, 3, 5]

    outputs_as_a_list, _ = theano.scan(lambda x: [x, -x], sequences=torch.arange(3))
    assert_type(outputs_as_a_list, torch.Tensor | list[torch.Tensor])
    assert isinstance(outputs_as_a_list, list)
    both, _ = theano.scan(lambda x: (x, -x), sequences=torch.arange(3))
    assert_type(both, list[torch.Tensor])


def test_theano_reductions() -> None:
    xs = torch.arange(1.0, 5.0)

    def add(x: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
        return total + x

    squares, _ = theano.map(lambda x: x * x, xs)
    assert_type(squares, torch.Tensor)
    assert squares.tolist() == [1.0, 4.0, 9.0, 16.0]
    total, _ = theano.reduce(add, xs, torch.tensor(0.0))
    assert_type(total, torch.Tensor)
    left, _ = theano.foldl(add, xs, torch.tensor(0.0))
    assert_type(left, torch.Tensor)
    right, updates = theano.foldr(add, xs, torch.tensor(0.0))
    assert_type(right, torch.Tensor)
    assert total.item() == left.item() == right.item() == 10.0
    assert updates == {}

    def min_max(
        x: torch.Tensor, low: torch.Tensor, high: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.minimum(low, x), torch.maximum(high, x)

    extremes, _ = theano.reduce(min_max, xs, [xs[0], xs[0]])
    assert_type(extremes, list[torch.Tensor])
    assert [e.item() for e in extremes] == [1.0, 4.0]


# errors


def test_error_classes() -> None:
    with pytest.raises(torchscan.TorchscanError, match="length is needed") as caught:
        torchscan.scan(lambda c, x: (c, x), torch.zeros(()), None)
    assert_type(caught.value, torchscan.TorchscanError)
    assert isinstance(caught.value, torchscan.TorchscanValueError)
    assert isinstance(caught.value, ValueError)
    assert issubclass(torchscan.TorchscanTypeError, TypeError)
    assert issubclass(torchscan.ExportError, NotImplementedError)
    assert issubclass(torchscan.TorchscanWarning, Warning)


# torchscan.onnx


def test_opset_tables() -> None:
    scan_18 = torchscan.onnx.scan_version(18)
    assert_type(scan_18, torchscan.onnx.OpVersion)
    assert_type(torchscan.onnx.loop_version(11), torchscan.onnx.OpVersion)
    assert scan_18 in torchscan.onnx.SCAN_VERSIONS
    assert torchscan.onnx.loop_version(11) in torchscan.onnx.LOOP_VERSIONS
    versions: collections.abc.Sequence[torchscan.onnx.OpVersion] = torchscan.onnx.LOOP_VERSIONS
    assert [v.since for v in versions][:2] == [1, 11]


class Running(torch.nn.Module):
    def forward(self, xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torchscan.scan(lambda h, x: (h + x, h * 2), torch.zeros(3), xs)


def test_export_options_check_and_hoisting() -> None:
    model, xs = Running().eval(), torch.ones(4, 3)
    with torchscan.onnx.export_options(hoist_loop_invariants=False) as options:
        assert_type(options, torchscan.onnx.ExportOptions)
        assert not options.hoist_loop_invariants
        program = torch.onnx.export(model, (xs,), dynamo=True, opset_version=18)
    assert program is not None
    moved = torchscan.onnx.hoist_loop_invariants(program.model, target_opset=18)
    assert_type(moved, int)
    report = torchscan.onnx.check(
        program.model_proto, module=model, args=(xs,), runtimes=("onnxruntime",)
    )
    assert_type(report, torchscan.onnx.CheckReport)
    assert report.ok, report
    for node in report.nodes:
        assert_type(node, torchscan.onnx.CheckedNode)
    for comparison in report.comparisons:
        assert_type(comparison, torchscan.onnx.Comparison)
        for diff in comparison.outputs:
            assert_type(diff, torchscan.onnx.OutputDiff)
    for finding in report.findings:
        assert_type(finding, torchscan.onnx.Finding)
    assert issubclass(torchscan.onnx.OpsetConversionError, Exception)
