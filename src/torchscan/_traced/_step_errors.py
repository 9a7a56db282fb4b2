"""Refusals that name the user's step function and the line in it that cannot be exported.

Some things a step does fail deep inside torch, with errors about torch's own machinery: a Python
``if`` on a tensor (a guard on a data-dependent value), an operator with a side effect (a constant
that the decomposition lifts and does not register), an operator torch.onnx cannot translate.
torchscan knows which function the step is where the loop is traced (:class:`StepSource`); it
keeps that with the traced body, on the callable that is traced again when the program is
decomposed and in ``GraphModule.meta`` for torch.onnx's translation, and finds the line from a
traceback or from the ``stack_trace`` torch records on every node (the step function is
registered with torch as a frame to keep in it).
"""

from __future__ import annotations

import re
import sys
import traceback
from collections.abc import Callable, Iterable
from typing import Any

import torch

from torchscan import _compat, _context
from torchscan._errors import ExportError
from torchscan._source import (
    DISTRIBUTIONS_FIX,
    DISTRIBUTIONS_REMEDY,
    TORCHSCAN_FILES,
    StepSource,
    in_torch_distributions,
    is_users,
)
from torchscan._source import TORCH_FILES as _TORCH

STEP_KEY = "torchscan_step"
"""The key of a traced body's :class:`StepSource` in its ``GraphModule.meta``."""

_ATTRIBUTE = "__torchscan_step__"


# -- carrying the step with the body -----------------------------------------------------------


def refuse_without_onnx_hooks(body: Any) -> None:
    """Refuse a loop traced while torch.onnx exports (a model, or an ``ExportedProgram`` it
    decomposes) where torch.onnx cannot translate it: the export does not go through torchscan's
    wrapper or ``torchscan.onnx.export``, and torchscan's hooks are not in torch.onnx's exporter
    (``TORCHSCAN_PATCH_TORCH_ONNX=0`` or ``uninstall_export_hooks()``)."""
    torch_onnx = sys.modules.get("torch.onnx")  # not imported: no ONNX export runs
    if torch_onnx is None or not torch_onnx.is_in_onnx_export() or _context.onnx_export():
        return
    if _context.onnx_hooks_active():
        return
    step = step_of(body)
    api = step.api if step is not None else "torchscan"
    raise ExportError(
        f"{api}: torch.onnx.export is exporting a torchscan loop, but torchscan's hooks are not "
        "installed in torch.onnx (TORCHSCAN_PATCH_TORCH_ONNX=0 was set when torchscan was "
        "imported, or torchscan.onnx.uninstall_export_hooks() was called), and torch.onnx "
        "cannot translate the loop without them. Export with torchscan.onnx.export(model, "
        "args, ...), which takes the arguments of torch.onnx.export and installs the hooks for "
        "that export only, or call torchscan.onnx.install_export_hooks() first."
    )


def attach(body: Callable, step: StepSource | None) -> Callable:
    """``body``, a function, marked as the traced form of ``step``."""
    if step is not None:
        setattr(body, _ATTRIBUTE, step)
    return body


def step_of(body: Any) -> StepSource | None:
    """The step a body (a function or a traced graph module) stands for, if known."""
    if isinstance(body, torch.fx.GraphModule):
        return body.meta.get(STEP_KEY)
    return getattr(body, _ATTRIBUTE, None)


def keep_with_graph(gm: torch.fx.GraphModule, step: StepSource | None) -> None:
    """Record ``step`` in ``gm`` and in the subgraphs it holds (``torch.cond``'s branches) that
    belong to no loop of their own."""
    if step is None:
        return
    for module in gm.modules():
        if isinstance(module, torch.fx.GraphModule):
            module.meta.setdefault(STEP_KEY, step)


# -- where in the step -------------------------------------------------------------------------

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>\S+)')


def _where(step: StepSource, frames: Iterable[tuple[str, int, str]]) -> str:
    """`` at file:line``: the innermost of ``frames`` (outermost first) in the step function
    itself, or nothing where none is."""
    found = [f"{file}:{line}" for file, line, name in frames if step.owns(file, name, line)]
    return f" at {found[-1]}" if found else ""


def where(step: StepSource, node: torch.fx.Node) -> str:
    """`` at file:line``: the line of ``step`` that made ``node`` of its traced body, or
    nothing where torch recorded none."""
    return _where(step, _node_frames(node))


def _node_frames(node: torch.fx.Node) -> list[tuple[str, int, str]]:
    return [
        (m["file"], int(m["line"]), m["name"])
        for m in _FRAME.finditer(node.meta.get("stack_trace") or "")
    ]


# -- a value known only when the model runs ----------------------------------------------------


def data_dependent(step: StepSource, error: BaseException) -> ExportError | None:
    """The refusal of a step that reads a tensor's value in Python (``if x.sum() > 0:``), where
    the innermost frame outside torch is the user's own code, called from ``step``; None for a
    guard that torchscan or indexing raised."""
    frames = [
        (summary.filename, summary.lineno or 0, summary.name)
        for summary in traceback.extract_tb(error.__traceback__)
        # torchscan's torch function modes (indexing in bodies, the record of in-place
        # changes) pass every torch function through
        if not (
            summary.filename.startswith(TORCHSCAN_FILES) and summary.name == "__torch_function__"
        )
    ]
    outside_torch = [frame for frame in frames if not frame[0].startswith(_TORCH)]
    if not outside_torch or not is_users(outside_torch[-1][0]):
        return None
    where = _where(step, frames)
    if not where:
        return None
    file, line, name = outside_torch[-1]
    if not step.owns(file, name, line):
        where += f" (in {name}, {file}:{line})"
    remedy = (
        DISTRIBUTIONS_REMEDY
        if in_torch_distributions(frame[0] for frame in frames)
        else "Choose between values with torch.where(condition, a, b), or between two "
        "computations with torch.cond(condition, true_fn, false_fn, operands)."
    )
    return ExportError(
        f"{step.who} reads the value of a tensor{where}, which is known only when the exported "
        "model runs: the step is traced once for all steps, so Python control flow on a tensor "
        f"(if, while, bool(), int(), .item()) cannot be exported. {remedy}"
    )


# -- torch.cond, whose branches TorchDynamo traces --------------------------------------------

_OPERATOR = re.compile(r"Higher Order Operator: (?P<op>\S+)")


def uncaptured_cond(step: StepSource, error: BaseException) -> ExportError | None:
    """The refusal of a ``torch.cond`` in the step whose branches TorchDynamo could not trace
    (``UncapturedHigherOrderOpError``); None for any other operator."""
    text = str(error)
    op = _OPERATOR.search(text)
    if op is None or op["op"] != "torch.cond":
        return None
    frames = [
        (s.filename, s.lineno or 0, s.name) for s in traceback.extract_tb(error.__traceback__)
    ]
    where = _where(step, frames)
    if not where:
        return None
    return ExportError(
        f"{step.who} calls torch.cond{where}, whose branches torch could not trace inside the "
        "loop step: TorchDynamo, which traces them, fails on a branch that calls a "
        "submodule (self.linear(x)) there. Use the submodule's parameters in the branch "
        "(x @ self.linear.weight.T + self.linear.bias), call the submodule outside torch.cond, or "
        "choose between values with torch.where(condition, a, b)."
    )


# -- operators with side effects ---------------------------------------------------------------

# What makes torch raise, and a closed form that exports, for the functions whose checks it
# keeps as a side effect.
_LINALG = {
    "linalg.inv": (
        "a singular matrix",
        "for a 2x2 or 3x3 matrix, the adjugate divided by torch.linalg.det, which exports",
    ),
    "linalg.solve": (
        "a singular matrix",
        "for a small system A x = b, the adjugate of A times b divided by torch.linalg.det(A), "
        "which exports",
    ),
    "linalg.cholesky": (
        "a matrix that is not positive-definite",
        "for a 2x2 matrix [[a, b], [b, d]], [[sqrt(a), 0], [b / sqrt(a), sqrt(d - b * b / a)]]",
    ),
}


def refuse_side_effects(gm: torch.fx.GraphModule, step: StepSource | None) -> None:
    """Refuse a body that calls an operator with a side effect. torch threads an effect token
    through such operators (``torch.linalg.inv``'s check for a singular matrix) when it
    decomposes a program; a token used inside a loop step escapes the step's trace, and the
    decomposed program fails torch's verifier."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.higher_order.with_effects:
            raise _side_effect(node, step)


def _side_effect(node: torch.fx.Node, step: StepSource | None) -> ExportError:
    op = node.args[1]
    who = step.who if step else "torch.onnx.export: a loop body"
    where = _where(step, _node_frames(node)) if step else ""
    if op is torch.ops.aten._linalg_check_errors.default:
        # torch.linalg.inv and its kin check the info their _ex form returns; the check names
        # the function the user called, with or without "torch.".
        api = str(node.args[3]).removeprefix("torch.")
        aten = api.replace(".", "_")
        packet = getattr(torch.ops.aten, aten, None)
        translation = (
            f"custom_translation_table={{torch.ops.aten.{aten}.default: <an ONNX Script function>}}"
            if packet is not None and "default" in packet.overloads()
            else "custom_translation_table"
        )
        invalid, closed_form = _LINALG.get(api, ("an invalid matrix", ""))
        return ExportError(
            f"{who} calls torch.{api}{where}, which cannot be exported in a loop step: torch "
            f"raises an error on {invalid}, a side effect that torch.export cannot keep inside a "
            f"loop, and torch.onnx has no translation of torch.{api}. "
            + (f"Write it out in closed form ({closed_form}), or give" if closed_form else "Give")
            + f" torch.onnx.export a translation: {translation}."
        )
    return ExportError(
        f"{who} calls {op}{where}, which has a side effect that torch.export cannot keep inside a "
        "loop step. Call it outside the loop."
    )


# -- operators torch.onnx cannot translate -----------------------------------------------------


def untranslatable(node: torch.fx.Node) -> ExportError | None:
    """The refusal of a node of a loop body that torch.onnx found no translation for, naming
    the operator the user called; None for a node of no loop body."""
    step = node.graph.owning_module.meta.get(STEP_KEY) if node.graph.owning_module else None
    if step is None:
        return None
    op = str(node.target)
    called = str(node.meta.get("original_aten") or op)
    where = _where(step, _node_frames(node))
    decomposed = f" (torch decomposes it into {op}, which has none)" if called != op else ""
    if called == _compat.DISTRIBUTION_CHECK_OPERATOR:
        return ExportError(
            f"{step.who} makes a torch.distributions object that checks its arguments (validate_"
            f"args){where}: torch exports the check as an assertion at run time ({called}), which "
            f"torch.onnx cannot translate to ONNX. To export it, {DISTRIBUTIONS_FIX}"
        )
    if any(_is_complex(arg) for arg in [*node.args, *node.kwargs.values()]):
        return ExportError(
            f"{step.who} calls {called} on a complex tensor{where}, which torch.onnx cannot "
            f"translate{decomposed}: it exports few operators of complex tensors. Carry the real "
            "and imaginary parts as two real tensors and write the complex arithmetic out with "
            "them: (a + ib)(c + id) = (ac - bd) + i(ad + bc), "
            "exp(a + ib) = exp(a)(cos b + i sin b)."
        )
    device = _device_kernel(node)
    on_device = (
        f" It is a kernel of the {device} device, which torch chose because the model's tensors "
        f"are on it: export a copy of the model on the CPU (copy.deepcopy(model).cpu() and CPU "
        "inputs), whose ONNX graph runs anywhere, or"
        if device
        else ""
    )
    remedy = " compute it" if device else " Compute it"
    return ExportError(
        f"{step.who} calls {called}{where}, which torch.onnx cannot translate to ONNX"
        f"{decomposed}.{on_device}{remedy} with operators that torch.onnx translates, or give "
        f"torch.onnx.export a translation: custom_translation_table={{torch.ops.{called}: <an "
        "ONNX Script function>}."
    )


def _device_kernel(node: torch.fx.Node) -> str | None:
    """The device of a node whose operator torch has only for the device its inputs are on
    (``_thnn_fused_lstm_cell``, ``_cudnn_rnn``: what ``torch.nn.LSTMCell`` becomes on a GPU),
    or None for an operator of every device."""
    if not str(node.target).startswith(("aten._thnn_", "aten._cudnn_", "aten._fused_")):
        return None
    values = [arg.meta.get("val") for arg in node.all_input_nodes]
    devices = {v.device.type for v in values if isinstance(v, torch.Tensor)}
    return next(iter(devices - {"cpu", "meta"}), None)


def _is_complex(arg: Any) -> bool:
    if isinstance(arg, torch.fx.Node):
        value = arg.meta.get("val")
        return isinstance(value, torch.Tensor) and value.is_complex()
    if isinstance(arg, (list, tuple)):
        return any(_is_complex(a) for a in arg)
    return False
