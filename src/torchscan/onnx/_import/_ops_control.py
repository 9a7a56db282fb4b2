"""``Scan``, ``Loop`` and ``If`` as ``torchscan.scan``, ``torchscan.loop`` and a branch.

The body of a ``Scan`` or ``Loop`` runs as the step of torchscan's loop, reading the values of
the graphs around it by name; exported again, the module gives one ``Scan`` or ``Loop`` node per
imported one. What torchscan refuses in a body (a carried value that changes its shape, type or
rank) is refused in the words of the node.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from torchscan import _compat, _context
from torchscan._errors import OnnxImportError, TorchscanError
from torchscan._loop import loop as torchscan_loop
from torchscan._scan import scan as torchscan_scan
from torchscan._until import until
from torchscan.onnx import _opsets
from torchscan.onnx._import._graph import Call, Graph, decided, probing
from torchscan.onnx._import._registry import implements


def _per_item(values: Sequence[int] | None, count: int) -> list[int]:
    """An optional list attribute with one entry per input or output, 0 filled in."""
    given = [int(v) for v in (values or [])][:count]
    return given + [0] * (count - len(given))


def _in_node_words(call: Call, run: Callable[[], Any]) -> Any:
    try:
        return run()
    except OnnxImportError:
        raise  # a node of the body, which it names
    except TorchscanError as error:
        raise call.refuse(
            str(error), not_implemented=isinstance(error, NotImplementedError)
        ) from error


@implements("Scan", *(v.since for v in _opsets.SCAN_VERSIONS if not v.batch_axis))
def scan(call: Call, *inputs: torch.Tensor) -> list[torch.Tensor]:
    m = call.attribute("num_scan_inputs")
    n = len(inputs) - m
    body: Graph = call.node.attributes["body"]
    k = len(body.outputs) - n
    states, sequences = tuple(inputs[:n]), list(inputs[n:])

    def step(carry: tuple[torch.Tensor, ...], x: list[torch.Tensor]) -> Any:
        outputs = call.run_graph("body", [*carry, *x])
        return tuple(outputs[:n]), list(outputs[n:])

    carry, ys = _in_node_words(
        call,
        lambda: torchscan_scan(
            step,
            states,
            sequences,
            in_axes=_per_item(call.attribute("scan_input_axes"), m),
            in_reverse=[bool(d) for d in _per_item(call.attribute("scan_input_directions"), m)],
            out_axes=_per_item(call.attribute("scan_output_axes"), k),
            out_reverse=[bool(d) for d in _per_item(call.attribute("scan_output_directions"), k)],
        ),
    )
    return [*carry, *ys]


@implements("Scan", *(v.since for v in _opsets.SCAN_VERSIONS if v.batch_axis))
def scan_8(call: Call, lengths: torch.Tensor | None, *inputs: torch.Tensor) -> list[torch.Tensor]:
    """Scan-8: every state and sequence batched on axis 0, the sequences' time on axis 1; each
    example runs ``sequence_lens[b]`` steps (every step where it is omitted), reading a sequence
    backwards within its length where ``directions`` says so; each example's scan outputs are in
    the order its steps ran, padded with zeros to the longest length."""
    m = call.attribute("num_scan_inputs")
    n = len(inputs) - m
    body: Graph = call.node.attributes["body"]
    k = len(body.outputs) - n
    states, sequences = inputs[:n], inputs[n:]
    backwards = [bool(d) for d in _per_item(call.attribute("directions"), m)]
    batch, longest = sequences[0].shape[0], sequences[0].shape[1]

    def step(carry: tuple[torch.Tensor, ...], x: list[torch.Tensor]) -> Any:
        outputs = call.run_graph("body", [*carry, *x])
        return tuple(outputs[:n]), list(outputs[n:])

    def one(example_states: Sequence[torch.Tensor], example_sequences: list[torch.Tensor]) -> Any:
        carry, ys = torchscan_scan(
            step, tuple(example_states), example_sequences, in_reverse=backwards
        )
        return [*carry, *ys]

    steps = [longest] * batch if lengths is None else [int(s) for s in lengths.reshape(-1).tolist()]
    if any(not 0 <= s <= longest for s in steps):
        raise call.refuse(f"sequence_lens {steps} holds a length outside [0, {longest}]")
    examples = [
        _in_node_words(
            call,
            lambda b=b: one([s[b] for s in states], [s[b, : steps[b]] for s in sequences]),
        )
        for b in range(batch)
    ]
    finals = [torch.stack([e[i] for e in examples]) for i in range(n)]
    outputs = []
    for j in range(k):
        parts = [e[n + j] for e in examples]
        padded = torch.zeros(batch, longest, *parts[0].shape[1:], dtype=parts[0].dtype)
        for b, part in enumerate(parts):
            padded[b, : part.shape[0]] = part
        outputs.append(padded)
    return [*finals, *outputs]


@implements("Loop", *(v.since for v in _opsets.LOOP_VERSIONS))
def loop(
    call: Call, trip_count: torch.Tensor | None, cond: torch.Tensor | None, *initial: torch.Tensor
) -> list[torch.Tensor]:
    """``Loop``: ``torchscan.loop`` with the loop's condition carried with its values (the body
    reads it), ended by ``until`` where the node has a ``cond`` input."""
    n = len(initial)
    if trip_count is None and cond is None:
        raise call.refuse(
            "a Loop with neither a trip count nor a condition never ends (give it M or cond)"
        )
    keep_going = torch.tensor(True) if cond is None else cond.reshape(()).to(torch.bool)
    if not _context.compiling() and (
        (trip_count is not None and int(trip_count) <= 0) or not bool(keep_going)
    ):
        return _no_iteration(call, keep_going, initial)
    if any(not isinstance(value, torch.Tensor) for value in initial):
        return _python_loop(call, trip_count, cond is not None, keep_going, initial)

    def body(i: torch.Tensor, carry: tuple[torch.Tensor, ...]) -> Any:
        cond_in, *values = carry
        outputs = call.run_graph("body", [i, cond_in, *values])
        cond_out = outputs[0].reshape(()).to(torch.bool) if cond is not None else cond_in
        new = (cond_out, *outputs[1 : 1 + n])
        scans = list(outputs[1 + n :])
        if cond is None:
            return new, scans
        return new, scans, until(torch.logical_not(cond_out))

    carry, ys = _in_node_words(
        call,
        lambda: torchscan_loop(
            body,
            (keep_going, *initial),
            trip_count=None if trip_count is None else trip_count.reshape(()),
            cond=None if cond is None else keep_going,
        ),
    )
    return [*carry[1:], *ys]


def _python_loop(
    call: Call,
    trip_count: torch.Tensor | None,
    has_cond: bool,
    keep_going: torch.Tensor,
    initial: Sequence[Any],
) -> list[Any]:
    """A Loop that carries a sequence or an optional (whose length and element shapes may
    change from one iteration to the next) as a Python loop, as the specification writes it."""
    n = len(initial)
    values, scans = list(initial), []
    limit = None if trip_count is None else int(trip_count)
    i = 0
    while (limit is None or i < limit) and bool(keep_going):
        outputs = call.run_graph("body", [torch.tensor(i), keep_going, *values])
        if has_cond:
            keep_going = outputs[0].reshape(()).to(torch.bool)
        values = list(outputs[1 : 1 + n])
        scans.append(outputs[1 + n :])
        i += 1
    stacked = [torch.stack([step[j] for step in scans]) for j in range(len(scans[0]))]
    return [*values, *stacked]


def _no_iteration(call: Call, cond: torch.Tensor, initial: Sequence[torch.Tensor]) -> list[Any]:
    """A Loop that runs no iteration: its initial values, and scan outputs of length 0 whose
    element shapes are those the body declares for them, where it declares static ones; else
    those the body gives at the first iteration, where it runs on the initial values; else (its
    first iteration would fail) those torchscan finds on fake tensors."""
    n = len(initial)
    body: Graph = call.node.attributes["body"]
    declared = body.output_types[1 + n :]
    if all(d is not None for d in declared):
        device = initial[0].device if initial else None
        return [
            *initial,
            *(torch.empty((0, *d[1]), dtype=d[0], device=device) for d in declared if d),
        ]
    try:
        outputs = call.run_graph("body", [torch.tensor(0), cond, *initial])
    except Exception:  # the first iteration reads what is not there: shapes from fake tensors
        with probing(call.env):
            return _in_node_words(
                call,
                lambda: [
                    *initial,
                    *torchscan_loop(
                        lambda i, carry: (
                            carry,
                            list(call.run_graph("body", [i, cond, *carry])[1 + n :]),
                        ),
                        tuple(initial),
                        trip_count=0,
                    )[1],
                ],
            )
    return [*initial, *(y.new_empty((0, *y.shape)) for y in outputs[1 + n :])]


@implements("If", 1, 11, 13, 16, 19, 21, 23, 24, 25)
def if_(call: Call, cond: torch.Tensor) -> list[torch.Tensor]:
    """``If``: the branch the condition picks; traced (by ``torch.export``), the branch a
    condition on sizes picks for every size the trace allows (the guard of an empty sequence),
    else ``torch.cond``, which exports as an ``If``."""
    if _context.compiling() and not _context.dynamo_tracing():
        branch = {True: "then_branch", False: "else_branch", None: None}[decided(cond)]
        if branch is not None:
            return call.run_graph(branch, [])
    if _context.compiling():
        # torch.cond's branches may not return their inputs or views of them: copies
        then_out = lambda: tuple(v.clone() for v in call.run_graph("then_branch", []))  # noqa: E731
        else_out = lambda: tuple(v.clone() for v in call.run_graph("else_branch", []))  # noqa: E731
        try:
            return list(torch.cond(cond.reshape(()), then_out, else_out, ()))
        except (_compat.uncaptured_operator_error(), _compat.dynamo_user_error()) as error:
            first = str(error).strip().splitlines()[0]
            raise call.refuse(
                "torch.export cannot trace it: its condition depends on the data, so its "
                "branches are traced by TorchDynamo as torch.cond's, where sizes computed in "
                f"a branch are not known in Python ({first}). The module runs it eagerly.",
                not_implemented=True,
            ) from None
    branch = "then_branch" if bool(cond) else "else_branch"
    return call.run_graph(branch, [])
