"""``_dispatch.choose``, the one place that chooses how a loop runs: a table of the contexts a
scan is called in and the strategy each gets, checked against what ``choose`` answers there
(and, where it answers "hoisted", what the hoister then did)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import torchscan
from torchscan import _dispatch, _hoist

T, B, H = 6, 2, 3
W = torch.randn(H, H) * 0.3


def step(h: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    h = torch.tanh(x @ W + h)
    return h, h * 2


def _scan(xs: torch.Tensor, **options: Any) -> torch.Tensor:
    h, ys = torchscan.scan(step, torch.zeros(B, H), xs, **options)
    return h + ys.sum(0)


def _xs(n: int = T) -> torch.Tensor:
    return torch.randn(n, B, H)


def _calls(k: int, **options: Any) -> Callable[[], Any]:
    def run() -> None:
        for _ in range(k):
            _scan(_xs(), **options)

    return run


def _compiled() -> None:
    torch._dynamo.reset()
    torch.compile(_scan, backend="eager", fullgraph=True)(_xs())


def _compiled_leaf_by_leaf() -> None:
    torch._dynamo.reset()

    def both_ways(xs: torch.Tensor) -> Any:
        return torchscan.scan(
            lambda h, x: step(h, x[0] - x[1]),
            torch.zeros(B, H),
            (xs, xs),
            in_reverse=(False, True),
            out_reverse=True,
        )

    torch.compile(both_ways, backend="eager", fullgraph=True)(_xs())


def _exported() -> None:
    class M(torch.nn.Module):
        def forward(self, xs: torch.Tensor) -> torch.Tensor:
            return _scan(xs)

    torch.export.export(M(), (_xs(),))


def _probed() -> None:
    """A scan in the step of a scan that runs no step: called on fake tensors for its shapes."""

    def outer(c: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return c, _scan(x.unsqueeze(0).expand(T, B, H))

    torchscan.scan(outer, torch.zeros(B, H), torch.zeros(0, B, H), hoist=False)


def _vmapped() -> None:
    torch.func.vmap(lambda xs: _scan(xs))(torch.randn(2, T, B, H))


def _inference() -> None:
    with torch.inference_mode():
        _scan(_xs())


def _checkpointed() -> None:
    xs = _xs().requires_grad_()
    checkpoint(lambda xs: _scan(xs, hoist=False), xs, use_reentrant=False).sum().backward()


def _kept_by_segments() -> None:
    xs = _xs().requires_grad_()
    _scan(xs, hoist=False, checkpoint=2).sum().backward()


def _kept_hoisted() -> None:
    xs = _xs().requires_grad_()
    _scan(xs, checkpoint=2).sum().backward()


def _kept_without_autograd() -> None:
    with torch.no_grad():
        _scan(_xs().requires_grad_(), hoist=False, checkpoint=2)


def _kept_compiled() -> None:
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(lambda xs: _scan(xs, checkpoint=2), backend="eager", fullgraph=True)(_xs())


def _kept_compiled_training() -> None:
    torch._dynamo.reset()
    xs = _xs().requires_grad_()
    torch.compile(lambda xs: _scan(xs, checkpoint=2, hoist=False), backend="eager")(
        xs
    ).sum().backward()


def _kept_loop_compiled_training() -> None:
    torch._dynamo.reset()
    xs = _xs().requires_grad_()

    def run(xs: torch.Tensor) -> torch.Tensor:
        h, _ = torchscan.loop(
            lambda i, h: (torch.tanh(xs[i] @ W + h), None),
            torch.zeros(B, H),
            trip_count=T,
            checkpoint=4,
        )
        return h

    torch.compile(run, backend="eager")(xs).sum().backward()


def _kept_vmapped() -> None:
    torch.func.vmap(lambda xs: _scan(xs, hoist=False, checkpoint=2))(torch.randn(2, T, B, H))


def _kept_exported() -> None:
    class M(torch.nn.Module):
        def forward(self, xs: torch.Tensor) -> torch.Tensor:
            return _scan(xs, checkpoint=2)

    torch.export.export(M(), (_xs(),))


def _kept_loop() -> None:
    xs = _xs().requires_grad_()
    h, _ = torchscan.loop(
        lambda i, h: (torch.tanh(xs[i] @ W + h), None),
        torch.zeros(B, H),
        trip_count=T,
        checkpoint=4,
    )
    h.sum().backward()


ROUTES: dict[str, tuple[Callable[[], Any], list[str], str]] = {
    # context: (what runs, the strategies choose gives in order, what the hoister did last)
    "plain, first call": (_calls(1), ["hoisted"], "first call"),
    "plain, third call": (_calls(3), ["hoisted"] * 3, "hoisted"),
    "hoist=False": (_calls(1, hoist=False), ["eager"], ""),
    "hoist=True, first call": (_calls(1, hoist=True), ["hoisted"], "hoisted"),
    "length 0": (lambda: _scan(_xs(0)), ["empty"], ""),
    "torch.compile": (_compiled, ["compiled"], ""),
    "torch.compile, directions leaf by leaf": (_compiled_leaf_by_leaf, ["compiled"], ""),
    "torch.export": (_exported, ["traced"], ""),
    # the outer scan runs no step; its step, called on fake tensors, calls the inner scan
    "probing shapes": (_probed, ["empty", "traced"], ""),
    "vmap": (_vmapped, ["eager"], ""),
    "inference mode": (_inference, ["eager"], ""),
    # the forward, then its recomputation in backward
    "torch.utils.checkpoint": (_checkpointed, ["eager", "eager"], ""),
    # three segments of two steps each, each a scan (the second and the third asked first
    # whether they are hoisted); again in backward, from the last
    "checkpoint=2": (_kept_by_segments, ["checkpointed"] + ["eager"] * 8, ""),
    # the first segment runs as the Python loop (watched for until); the others hoisted, run
    # again in backward without being chosen again
    "checkpoint=2, hoisted": (_kept_hoisted, ["checkpointed"] + ["hoisted"] * 4, "loop"),
    "checkpoint=2, no_grad": (_kept_without_autograd, ["eager"], ""),
    "checkpoint=2, torch.compile, no_grad": (_kept_compiled, ["compiled"], ""),
    # outside the compiled graph: as "checkpoint=2"
    "checkpoint=2, torch.compile": (
        _kept_compiled_training,
        ["checkpointed"] + ["eager"] * 8,
        "",
    ),
    "loop, checkpoint=4, torch.compile": (
        _kept_loop_compiled_training,
        ["checkpointed"] + ["eager"] * 4,
        "",
    ),
    "checkpoint=2, vmap": (_kept_vmapped, ["eager"], ""),
    "checkpoint=2, torch.export": (_kept_exported, ["traced"], ""),
    # two segments of loops (4 and 2 iterations), then again in backward
    "loop, checkpoint=4": (_kept_loop, ["checkpointed"] + ["eager"] * 4, ""),
}


# (TorchDynamo reads .grad of the non-leaf tensors a graph resumes with, after a graph break)
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
@pytest.mark.parametrize("context", ROUTES, ids=list(ROUTES))
def test_each_context_gets_its_strategy(context: str, monkeypatch: pytest.MonkeyPatch) -> None:
    run, strategies, hoisted = ROUTES[context]
    chosen: list[str] = []
    choose = _dispatch.choose

    def spy(plan: Any) -> Any:
        strategy = choose(plan)
        chosen.append(strategy)
        return strategy

    monkeypatch.setattr(_dispatch, "choose", spy)
    _hoist.clear()
    run()
    assert chosen == strategies
    assert _hoist.last.what == hoisted


def test_a_checkpointed_scan_traces_its_step_at_once() -> None:
    """Under torch.utils.checkpoint, which holds saved tensors hooks, a hoistable step is traced
    at its first call (its recomputation must save what its forward saved)."""
    _hoist.clear()
    xs = _xs().requires_grad_()
    checkpoint(_scan, xs, use_reentrant=False).sum().backward()
    assert _hoist.last.what == "hoisted"
