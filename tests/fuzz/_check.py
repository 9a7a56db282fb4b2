"""Run a fuzzed program four ways and compare: torchscan eagerly, the oracle, and the exported
model in onnxruntime and in onnx's reference evaluator.

A refusal by torchscan (a :class:`torchscan.TorchscanError`) ends the check and is counted by
kind in :data:`REFUSALS`; any other exception from torchscan or torch.onnx, and every mismatch,
fails the test.
"""

from __future__ import annotations

import collections
import functools
import re
import warnings
from typing import Any

import numpy as np
import onnx
import torch
import torch.utils._pytree as pytree

import torchscan
from torchscan.onnx._lint._driver import lint

from .._export import onnx_export
from ..onnx._runtimes import run_onnxruntime, run_reference
from . import _oracle
from ._program import Program

REFUSALS: collections.Counter[str] = collections.Counter()
"""Refusals seen in this session, by stage, class and the start of the message."""
SKIPS: collections.Counter[str] = collections.Counter()
"""Runs of onnx's reference evaluator left out, by reason."""
RUNS: collections.Counter[str] = collections.Counter()
"""Programs checked, by how far they went."""

TORCHSCAN = {"scan": torchscan.scan, "loop": torchscan.loop, "until": torchscan.until}


def kind_of(error: BaseException) -> str:
    """``Class: first words of the message``, with names and numbers taken out."""
    text = str(error).split("\n")[0]
    text = re.sub(r"torchscan\.(scan|loop): ", "", text)
    text = re.sub(r"'[^']*'|\"[^\"]*\"|\([^)]*\)|\b\d+\b", "_", text)
    return f"{type(error).__name__}: {' '.join(text.split()[:9])}"


def leaves(tree: Any) -> list[torch.Tensor]:
    return [leaf for leaf in pytree.tree_leaves(tree) if leaf is not None]


def assert_same(actual: Any, expected: Any, what: str, exact: bool = True) -> None:
    """The same pytree, dtypes and shapes, and the same values: bit for bit, or (not ``exact``)
    floating values within rounding (``torch.testing.assert_close``'s defaults for the dtype),
    the others bit for bit."""
    a_flat, a_spec = pytree.tree_flatten(actual)
    e_flat, e_spec = pytree.tree_flatten(expected)
    assert a_spec == e_spec, f"{what}: structure {a_spec} != {e_spec}"
    for k, (a, e) in enumerate(zip(a_flat, e_flat, strict=True)):
        if a is None or e is None:
            assert a is e, f"{what}: leaf {k}: {a} vs {e}"
            continue
        assert a.dtype == e.dtype, f"{what}: leaf {k}: dtype {a.dtype} != {e.dtype}"
        assert a.shape == e.shape, f"{what}: leaf {k}: shape {tuple(a.shape)} != {tuple(e.shape)}"
        if not exact and (a.is_floating_point() or a.is_complex()):
            torch.testing.assert_close(a, e, msg=lambda m, k=k: f"{what}: leaf {k}: {m}")
            continue
        assert torch.equal(a, e), f"{what}: leaf {k}: values differ\n{a}\n{e}"


def tolerance(dtype: np.dtype, float32_inside: bool) -> dict[str, float]:
    """float32 to 1e-4 relative and 1e-5 absolute, float64 to 1e-9 and 1e-10 (as float32 where
    the program computes in float32 too: a float64 value may come from a float32 one); others
    exactly."""
    if dtype == np.float32 or (dtype == np.float64 and float32_inside):
        return {"rtol": 1e-4, "atol": 1e-5}
    if dtype == np.float64:
        return {"rtol": 1e-9, "atol": 1e-10}
    return {"rtol": 0, "atol": 0}


def assert_close(
    actual: list[np.ndarray], expected: list[torch.Tensor], what: str, float32_inside: bool
) -> None:
    assert len(actual) == len(expected), f"{what}: {len(actual)} outputs, expected {len(expected)}"
    for k, (a, e) in enumerate(zip(actual, expected, strict=True)):
        e = e.detach().numpy()
        assert a.dtype == e.dtype, f"{what}: output {k}: dtype {a.dtype}, expected {e.dtype}"
        assert a.shape == e.shape, f"{what}: output {k}: shape {a.shape}, expected {e.shape}"
        np.testing.assert_allclose(
            a, e, err_msg=f"{what}: output {k}", **tolerance(e.dtype, float32_inside)
        )


def check_eager(program: Program, exact: bool = True, calls: int = 1) -> bool:
    """torchscan against the oracle at every length, ``calls`` times over on one module (as a
    process calls its model again and again); False when torchscan refuses. Bit for bit, or (not
    ``exact``: a hoisted step batched over the steps, whose vectorized kernels may round
    otherwise than on one step) floating values within rounding."""
    eager, oracle = program.module(TORCHSCAN), program.module(_oracle.NAMESPACE)
    lengths = program.lengths if program.dynamic else program.lengths[:1]
    for length in [n for _ in range(calls) for n in lengths]:
        inputs = program.inputs_at(length)
        try:
            with torch.no_grad():
                actual = eager(*inputs)
        except torchscan.TorchscanError as error:
            REFUSALS[f"eager: {kind_of(error)}"] += 1
            return False
        with torch.no_grad():
            expected = oracle(*inputs)
        if program.sizes:  # (the loop's result, tensors made with the sizes of its outputs)
            (actual, actual_sizes), (expected, _) = actual, expected
        if isinstance(expected[1], _oracle.EmptyYs):
            axis = expected[1].axis
            ys = _empty_like(program, oracle, axis)
            if isinstance(ys, _oracle.EmptyYs):  # no length runs a step: only the lengths
                for k, y in enumerate(leaves(actual[1])):
                    assert y.shape[axis] == 0, f"eager at length {length}: ys leaf {k} {y.shape}"
                ys = actual[1]
            expected = (expected[0], ys)
        assert_same(actual, expected, f"eager vs oracle at length {length}", exact)
        if program.sizes:
            sizes = [
                torch.ones(t.shape[0], 2) * t.shape[0] + t.numel() for t in leaves(expected[1])
            ]
            assert_same(actual_sizes, sizes, f"sizes of eager's outputs at length {length}")
    return True


def _empty_like(program: Program, oracle: torch.nn.Module, axis: int) -> Any:
    """The oracle's outputs at a length where steps run, with length 0 on ``axis``."""
    for length in (1, 3, 5):
        with torch.no_grad():
            out = oracle(*program.inputs_at(length))
        _, ys = out[0] if program.sizes else out
        if not isinstance(ys, _oracle.EmptyYs):
            return pytree.tree_map(lambda y: None if y is None else y.narrow(axis, 0, 0), ys)
    return ys


def export(program: Program, opset: int) -> onnx.ModelProto | None:
    """The program exported at ``opset`` with a dynamic length, or None when torchscan refuses."""
    module = program.module(TORCHSCAN)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", torchscan.TorchscanWarning)
            exported = onnx_export(
                module,
                program.inputs_at(program.lengths[0]),
                dynamo=True,
                opset_version=opset,
                dynamic_shapes=program.dynamic_shapes(),
            )
    except (torchscan.TorchscanError, torchscan.TorchscanWarning) as error:
        REFUSALS[f"export: {kind_of(error)}"] += 1
        return None
    return exported.model_proto


def assert_declared_shapes(model: onnx.ModelProto, actual: list[np.ndarray], what: str) -> None:
    """Every fixed size the model declares for an output is the size it gives."""
    for output, value in zip(model.graph.output, actual, strict=True):
        if not output.type.tensor_type.HasField("shape"):
            continue
        dims = output.type.tensor_type.shape.dim
        declared = [d.dim_value if d.HasField("dim_value") else None for d in dims]
        message = f"{what}: output {output.name} declared {declared}, has shape {value.shape}"
        assert len(declared) == value.ndim, message
        assert all(d is None or d == n for d, n in zip(declared, value.shape, strict=True)), message


def check_runtimes(program: Program, model: onnx.ModelProto, opset: int) -> None:
    """onnxruntime, and the reference evaluator where it can, against eager at every length."""
    eager = program.module(TORCHSCAN)
    findings = lint(model).findings
    assert not findings, "\n".join(map(str, findings))
    for length in program.lengths if program.dynamic else program.lengths[:1]:
        inputs = program.inputs_at(length)
        with torch.no_grad():
            expected = leaves(eager(*inputs))
        used = {i.name for i in model.graph.input}
        feeds = [t for i, t in zip(program.inputs, inputs, strict=True) if i.name in used]
        f32 = "float32" in program.source() or any(i.dtype == "float32" for i in program.inputs)
        for level, ort in run_onnxruntime(model, feeds).items():
            what = f"onnxruntime ({level}) at length {length}"
            assert_declared_shapes(model, ort, what)
            assert_close(ort, expected, what, f32)
        try:
            reference = run_reference(model, feeds)
        except NotImplementedError as error:  # a loop of no step whose body declares no shapes
            SKIPS[f"reference: {kind_of(error)}"] += 1
            continue
        assert_close(reference, expected, f"reference at length {length}", f32)


def check_compiled(program: Program) -> bool:
    """``torch.compile`` (Inductor, with its hoisting of the steps' work out of the loop) against
    torchscan eagerly, at the first length and without gradients; False where the compilation
    fails with hoisting turned off as well (torch's compiler, not hoisting, cannot compile it)."""
    from torchscan import _compiled

    eager = program.module(TORCHSCAN)
    inputs = program.inputs_at(program.lengths[0])
    with torch.no_grad():
        expected = leaves(eager(*inputs))
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            actual = leaves(torch.compile(eager)(*inputs))
    except Exception:
        torch._dynamo.reset()
        hoisting = _compiled._hoist_in_this_compile
        _compiled._hoist_in_this_compile = lambda: False
        try:
            with torch.no_grad():
                torch.compile(eager)(*inputs)
        except Exception as error:
            SKIPS[f"compiled: {kind_of(error)}"] += 1
            return False
        finally:
            _compiled._hoist_in_this_compile = hoisting
            torch._dynamo.reset()
        raise  # it compiles without hoisting: the hoisting broke it
    finally:
        torch._dynamo.reset()
    f32 = "float32" in program.source() or any(i.dtype == "float32" for i in program.inputs)
    assert_close([a.numpy() for a in actual], expected, "compiled", f32)
    check_compiled_gradients(program, eager, inputs, f32)
    if UNROLLED_LENGTH in program.lengths:
        check_unrolled(program, eager, f32)
    return True


UNROLLED_LENGTH = 5
"""The length at which :func:`check_unrolled` runs a program: by 2, a first step and then two
blocks, the fewest that run unrolled."""


def check_unrolled(program: Program, eager: torch.nn.Module, f32: bool) -> None:
    """The program compiled at :data:`UNROLLED_LENGTH`, a length the graph knows, with every scan
    and loop of it whose ``unroll`` it leaves to torchscan unrolled by 2: its values and the
    gradients of a loss computed in it, against eager."""
    from torchscan import _compiled

    inputs = program.inputs_at(UNROLLED_LENGTH)
    with torch.no_grad():
        expected = leaves(eager(*inputs))
    chosen = _compiled._chosen
    _compiled._chosen = lambda *cost: 2
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            actual = leaves(torch.compile(eager, dynamic=False)(*inputs))
        assert_close([a.numpy() for a in actual], expected, "compiled, unrolled by 2", f32)
        check_compiled_gradients(program, eager, inputs, f32)
    finally:
        _compiled._chosen = chosen
        torch._dynamo.reset()


def check_compiled_gradients(
    program: Program, eager: torch.nn.Module, inputs: list[torch.Tensor], f32: bool
) -> None:
    """The gradients of the float inputs of a loss computed in the compiled function (the sum
    of every float output, as a training step computes its loss), against eager: what passes
    a broadcast gradient back into the loop."""
    wanted = [k for k, t in enumerate(inputs) if t.is_floating_point()]
    if not wanted:
        return

    def loss(*tensors: torch.Tensor) -> torch.Tensor:
        outputs = [t for t in leaves(eager(*tensors)) if t.is_floating_point()]
        total = sum(t.double().sum() for t in outputs if t.requires_grad)
        return total if isinstance(total, torch.Tensor) else torch.zeros((), dtype=torch.float64)

    def gradients(run: Any) -> list[np.ndarray] | None:
        given = [t.detach().requires_grad_(k in wanted) for k, t in enumerate(inputs)]
        # (copies: a program may reshape a view of an input in place, which a leaf refuses)
        value = run(*[t.clone() if t.requires_grad else t for t in given])
        if not value.requires_grad:
            return None
        grads = torch.autograd.grad(value, [given[k] for k in wanted], allow_unused=True)
        return [
            np.zeros(tuple(inputs[k].shape), dtype=inputs[k].detach().numpy().dtype)
            if g is None
            else g.detach().numpy()
            for k, g in zip(wanted, grads, strict=True)
        ]

    expected = gradients(loss)
    if expected is None:
        return
    torch._dynamo.reset()
    try:
        with warnings.catch_warnings():
            # TorchDynamo reads .grad of the non-leaf tensors a graph resumes with
            warnings.filterwarnings("ignore", "The .grad attribute of a Tensor that is not a leaf")
            actual = gradients(torch.compile(loss))
    finally:
        torch._dynamo.reset()
    assert actual is not None, "compiled: the loss records no gradient, eagerly it does"
    assert_close(actual, [torch.from_numpy(e) for e in expected], "compiled gradients", f32)


CHECKPOINTS: dict[str, Any] = {
    "every 3": 3,
    "snapshots 0": torchscan.Checkpoint(snapshots=0),
    "snapshots 2": torchscan.Checkpoint(snapshots=2),
}
"""The schedules every program runs with: segments, and carries kept by a forward pass without
autograd (the binomial schedule; for a loop that only ``until`` ends, the online one)."""


def check_checkpointed(program: Program) -> bool:
    """The program with each of :data:`CHECKPOINTS` against it without ``checkpoint``, at every
    length: the values and the gradients of the float inputs of a loss (the sum of every float
    output). False where torchscan refuses the program without ``checkpoint``."""
    eager, oracle = program.module(TORCHSCAN), program.module(_oracle.NAMESPACE)
    f32 = "float32" in program.source() or any(i.dtype == "float32" for i in program.inputs)
    for length in program.lengths if program.dynamic else program.lengths[:1]:
        inputs = program.inputs_at(length)
        try:
            reference = _values_and_gradients(oracle, inputs)
        except RuntimeError as error:  # (a step that changes in place what autograd saved)
            SKIPS[f"checkpointed: the Python loop's backward fails: {kind_of(error)}"] += 1
            return False
        except _NoStep:
            reference = None
        try:
            expected = _values_and_gradients(eager, inputs)
        except torchscan.TorchscanError as error:
            REFUSALS[f"checkpointed: {kind_of(error)}"] += 1
            return False
        if reference is not None:
            what = f"gradients without checkpoint vs the Python loop's at length {length}"
            assert len(expected) == len(reference), what
            assert_close(expected, [torch.from_numpy(r) for r in reference], what, f32)
        for name, checkpoint in CHECKPOINTS.items():
            namespace = {
                **TORCHSCAN,
                "scan": functools.partial(torchscan.scan, checkpoint=checkpoint),
                "loop": functools.partial(torchscan.loop, checkpoint=checkpoint),
            }
            actual = _values_and_gradients(program.module(namespace), inputs)
            what = f"checkpoint={name} at length {length}"
            assert len(actual) == len(expected), what
            assert_close(actual, [torch.from_numpy(e) for e in expected], what, f32)
    return True


class _NoStep(Exception):
    pass


def _values_and_gradients(module: torch.nn.Module, inputs: list[torch.Tensor]) -> list[np.ndarray]:
    """The outputs of ``module`` (tensors alone) and the gradients of the sum of its float
    outputs with respect to its float inputs (zeros where none reaches an input)."""
    given = [t.detach().requires_grad_(t.is_floating_point()) for t in inputs]
    # (copies: a program may reshape a view of an input in place, which a leaf refuses)
    outputs = leaves(module(*[t.clone() if t.requires_grad else t for t in given]))
    if any(isinstance(t, _oracle.EmptyYs) for t in outputs):
        raise _NoStep  # (the oracle's ys where no step ran: no shapes to compare)
    recorded = [t for t in outputs if t.is_floating_point() and t.requires_grad]
    wanted = [t for t in given if t.requires_grad]
    grads: tuple[torch.Tensor | None, ...] = (None,) * len(wanted)
    if recorded and wanted:
        total = sum(t.double().sum() for t in recorded)
        grads = torch.autograd.grad(total, wanted, allow_unused=True)
    return [t.detach().numpy() for t in outputs] + [
        np.zeros(tuple(w.shape), dtype=w.detach().numpy().dtype)
        if g is None
        else g.detach().numpy()
        for w, g in zip(wanted, grads, strict=True)
    ]


def check(program: Program, opset: int) -> None:
    """Every check of one program: eager against the oracle, then the exported model."""
    RUNS["generated"] += 1
    if not check_eager(program):
        return
    RUNS["eager"] += 1
    model = export(program, opset)
    if model is None:
        return
    RUNS["exported"] += 1
    check_runtimes(program, model, opset)


def check_vmap(program: Program) -> None:
    """``torch.func.vmap`` of the program run by torchscan against vmap of the oracle, over a
    batch of two draws of its data inputs (counts and flags shared), at every length where the
    oracle runs under vmap."""
    eager, oracle = program.module(TORCHSCAN), program.module(_oracle.NAMESPACE)
    in_dims = tuple(0 if i.role == "data" else None for i in program.inputs)
    if all(d is None for d in in_dims):
        SKIPS["vmap: no data input to batch"] += 1
        return
    for length in program.lengths if program.dynamic else program.lengths[:1]:
        first, second = program.inputs_at(length), _other_draw(program, length)
        batched = [
            torch.stack([a, b]) if d == 0 else a
            for a, b, d in zip(first, second, in_dims, strict=True)
        ]
        if any(  # the oracle's outputs of no step, whose shapes it cannot tell under vmap
            isinstance(leaf, _oracle.EmptyYs)
            for leaf in pytree.tree_leaves(_no_grad(oracle, first))
        ):
            SKIPS["vmap of the oracle: no step ran"] += 1
            continue
        try:
            with torch.no_grad():
                expected = torch.func.vmap(_tensors_of(oracle), in_dims=in_dims)(*batched)
        except Exception as error:  # the oracle's loop is no vmappable code everywhere
            SKIPS[f"vmap of the oracle: {kind_of(error)}"] += 1
            continue
        try:
            with torch.no_grad():
                actual = torch.func.vmap(_tensors_of(eager), in_dims=in_dims)(*batched)
        except torchscan.TorchscanError as error:
            REFUSALS[f"vmap: {kind_of(error)}"] += 1
            return
        assert_same(actual, expected, f"vmap of eager vs of the oracle at length {length}")
    RUNS["vmapped"] += 1


def _other_draw(program: Program, length: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(program.seed * 1000 + length + 7919)
    return tuple(i.make(length, gen) for i in program.inputs)


def _no_grad(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Any:
    with torch.no_grad():
        return module(*inputs)


def _tensors_of(module: torch.nn.Module):
    """``module`` returning the tensors of its outputs (vmap returns no ``None``)."""

    def run(*inputs: torch.Tensor) -> list[torch.Tensor]:
        return [t for t in pytree.tree_leaves(module(*inputs)) if isinstance(t, torch.Tensor)]

    return run
