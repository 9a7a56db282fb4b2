"""The one place that chooses how a loop runs.

``scan``, ``loop`` and ``theano.scan`` check their arguments once and describe the call in a
frozen plan (:mod:`torchscan._plan`). :func:`run` chooses a strategy from the plan and the
context of the call alone (:func:`choose`), and hands the plan to that strategy's runner:

==================  ============================================================================
``"traced"``        torch.export traces the model (``torch.onnx.export`` does), or a step runs on
                    fake tensors for its shapes: one traced operator, ``torchscan_scan`` or
                    ``torchscan_loop`` (:mod:`torchscan._traced`)
``"empty"``         no step runs: ``init``, and ``ys`` of length 0 with the shapes one call of the
                    step gives them (:mod:`torchscan._eager`)
``"compiled"``      TorchDynamo compiles the call: one loop operator in the compiled graph
                    (:mod:`torchscan._compiled`)
``"checkpointed"``  autograd records a scan or loop with ``checkpoint``: segments of steps kept
                    by their carries and run again in the backward pass, each a scan (a loop)
                    that runs as the strategies below choose (:mod:`torchscan._checkpointed`);
                    not where the backward pass of ``Checkpoint(snapshots=...)`` runs a step
                    again: a scan in that step runs neither checkpointed nor hoisted
``"hoisted"``       the Python loop of the step's carry-dependent part, the rest computed once over
                    the whole sequence (:mod:`torchscan._hoist`), where the step allows it
``"eager"``         the Python loop, every step checked (:mod:`torchscan._eager`)
==================  ============================================================================

Before any of this, a call with ``checkpoint`` that TorchDynamo traces while autograd records
runs outside the compiled graph (:func:`checkpoints_outside_compile`): torch's loop operator,
the one Inductor compiles, keeps every step's intermediate values for its backward pass
(470 MiB for a GRU cell of 128 units over 2,000 steps of 16, where the eager scan keeps 125 MiB
and ``checkpoint="sqrt"`` 16 MiB), and in torch 2.13 to 2.15 neither nests (a loop of segments)
nor checkpoints its body.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch

from torchscan import (
    _checkpointed,
    _compat,
    _compiled,
    _context,
    _eager,
    _hoist,
    _outputs,
    _reversal,
    _torch_onnx_hook,
    _traced,
)
from torchscan._plan import LoopPlan, ScanPlan

Strategy = Literal["traced", "empty", "compiled", "checkpointed", "hoisted", "eager"]
"""How a loop runs; :func:`choose` picks one for each call."""


def traced() -> bool:
    """Whether a loop called now is traced: torch.export traces the model (``torch.onnx.export``
    does), or a step runs on fake tensors for its shapes. Its tensors then have no values to
    read."""
    if _context.exporting():
        return True
    # TorchDynamo reads no context variable, and a probe never runs in a graph it compiles: it
    # makes fake tensors of its own, which TorchDynamo leaves to eager code
    return not _context.compiling() and _context.Probe.SHAPES in _context.probes()


def compiling() -> bool:
    """Whether ``torch.compile`` or ``torch.export`` traces the call now: its tensors have no
    values to read either."""
    return _context.compiling()


def checkpointing() -> bool:
    """Whether a scan with ``checkpoint`` runs checkpointed: where autograd records, eagerly
    (``torch.utils.checkpoint`` keeps what it needs in saved-tensor hooks, which the transforms
    of ``torch.func`` do not run: under them, and under ``torch.no_grad``, every step runs once,
    as without ``checkpoint``)."""
    return torch.is_grad_enabled() and not _compat.functorch_transforms_active()


def checkpoints_outside_compile(checkpoint: Any) -> bool:
    """Whether a call with ``checkpoint`` runs outside the graph TorchDynamo traces: where it
    traces one (not ``torch.export``'s) while autograd records."""
    return (
        checkpoint is not None
        and _context.dynamo_tracing()
        and not _context.exporting()
        and checkpointing()
    )


def run_outside_compile(api: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``api(*args, **kwargs)`` run as eagerly, TorchDynamo's graph broken around it (a
    ``torch.compile(fullgraph=True)`` refuses it, saying why)."""
    _make_outside(api.__name__)
    return _OUTSIDE[api.__name__](*args, **kwargs)


_APIS: dict[str, tuple[str, Callable[..., Any]]] = {}
"""The functions :func:`run_outside_compile` runs, by name: the public name of each, and it
(registered by their modules, which this one may not import)."""
_OUTSIDE: dict[str, Callable[..., Any]] = {}


def register_api(public_name: str, api: Callable[..., Any]) -> None:
    """Let :func:`run_outside_compile` run ``api``, whose refusals say ``public_name``."""
    _APIS[api.__name__] = (public_name, api)


def _make_outside_now(name: str) -> bool:
    """Make the function ``_OUTSIDE[name]``: the API ``name`` (of :data:`_APIS`) marked for
    TorchDynamo to run outside the graph it traces. Run untraced: TorchDynamo refuses to trace
    ``torch.compiler.disable`` itself."""
    if name not in _OUTSIDE:
        public_name, api = _APIS[name]
        _OUTSIDE[name] = torch.compiler.disable(
            api,
            recursive=True,
            reason=(
                f"{public_name} with checkpoint= runs outside the compiled graph where autograd "
                "records (torch's loop operator keeps every step's intermediate values); with "
                "fullgraph=True, leave checkpoint= out, or run the loop under torch.no_grad()"
            ),
        )
    return True


_make_outside = _compat.run_untraced_by_dynamo(_make_outside_now)


def choose(plan: ScanPlan | LoopPlan) -> Strategy:
    """How ``plan`` runs, from the context of the call: :func:`traced`, and whether TorchDynamo
    compiles it."""
    if traced():
        return "traced"
    compiling_now = _context.dynamo_tracing()
    if isinstance(plan, ScanPlan):
        if plan.length == 0:
            return "empty"
        if compiling_now and plan.loop_operator:
            return "compiled"
        if plan.checkpoint is not None and checkpointing() and not _reversal.standing_in():
            return "checkpointed"
        # (not while a checkpointed reversal runs a step again: a trace would capture the
        # stand-ins of that run, which the next run replaces)
        if not compiling_now and not _reversal.standing_in() and _hoist.eligible(plan):
            return "hoisted"
        return "eager"
    none = plan.runs_no_iteration()
    if none is None:  # a tensor decides, read as the Python loop reads it
        trips, cond = plan.trip_count, plan.cond
        none = (trips is not None and int(trips) <= 0) or (cond is not None and not bool(cond))
    if none:
        return "empty"
    tensors = isinstance(plan.trip_count, torch.Tensor) or isinstance(plan.cond, torch.Tensor)
    if compiling_now and not tensors:
        return "compiled"
    if (
        plan.checkpoint is not None
        and not compiling_now
        and checkpointing()
        and not _reversal.standing_in()
    ):
        return "checkpointed"
    return "eager"


def run(plan: ScanPlan | LoopPlan) -> tuple[Any, Any]:
    """``(carry, ys)`` of the loop ``plan`` describes, run as :func:`choose` says."""
    if _reversal.standing_in():  # (run by a step that a checkpointed reversal runs again)
        plan = _reversal.with_stand_ins(plan)
    strategy = choose(plan)
    if strategy == "traced":
        check_types = _torch_onnx_hook.install_if_exporting(plan.protocol.api)
        try:
            if isinstance(plan, ScanPlan):
                return _traced.traced_scan(plan, check_types)
            return _traced.traced_loop(plan, check_types)
        except _traced.DataDependentSlice as refusal:  # raised where the API is not known
            raise refusal.from_api(plan.protocol.api) from refusal.__cause__
    if isinstance(plan, ScanPlan):
        if strategy == "checkpointed":
            carry, ys = _checkpointed.scan(plan, _scan, _prepared)
        else:
            carry, ys = _scan(plan, strategy)
        if plan.padded_length is not None:
            ys = _outputs.extend(ys, plan.out, plan.padded_length - plan.length)
        return carry, ys
    if strategy == "checkpointed":
        return _checkpointed.loop(plan, _loop)
    return _LOOP_RUNNERS[strategy](plan)


def _loop(plan: LoopPlan) -> tuple[Any, Any]:
    """``(carry, ys)`` of the loop ``plan`` run as :func:`choose` says."""
    return _LOOP_RUNNERS[choose(plan)](plan)


def _scan(plan: ScanPlan, strategy: Strategy | None = None) -> tuple[Any, Any]:
    """``(carry, ys)`` of ``plan`` run as ``strategy`` (by default, as :func:`choose` says), not
    extended to a padded length."""
    strategy = choose(plan) if strategy is None else strategy
    result = _hoist.scan(plan) if strategy == "hoisted" else None
    # not hoisted after all (the step does not allow it, or not yet): the Python loop
    return _SCAN_RUNNERS[strategy](plan) if result is None else result


def _prepared(plan: ScanPlan) -> tuple[_hoist.Hoisted, list[torch.Tensor]] | None:
    """The hoisted step of a checkpointed segment's ``plan``, traced at its first call (its
    segments call it many times), and what it captures; None where it runs unhoisted."""
    return _hoist.prepare(plan, now=True) if choose(plan) == "hoisted" else None


_SCAN_RUNNERS = {
    "empty": _eager.scan_no_step,
    "compiled": _compiled.scan,
    "hoisted": _eager.scan,
    "eager": _eager.scan,
}
_LOOP_RUNNERS = {
    "empty": _eager.loop_no_iteration,
    "compiled": _compiled.loop,
    "eager": _eager.loop,
}
