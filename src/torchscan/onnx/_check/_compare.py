"""``torchscan.onnx.check``: lint a model's Scan, Loop and If nodes, and compare its runtimes.
The model is read (from a path, bytes or a ``ModelProto``) with errors that say what is wrong with
the file, and into onnx_ir once, which every analysis reads (:mod:`torchscan.onnx._lint._load`);
its ``Scan``, ``Loop`` and ``If`` nodes are linted (:mod:`torchscan.onnx._lint._driver`); then it
is run in onnxruntime, in onnx's reference evaluator and as the module ``to_torch`` makes of it
(:mod:`torchscan.onnx._check._runtimes`), and optionally eager PyTorch, on the same inputs
(:mod:`torchscan.onnx._check._inputs`, :mod:`torchscan.onnx._check._random`), and every output is
held against a baseline (:mod:`torchscan.onnx._check._diff`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from torchscan import _errors
from torchscan._errors import TorchscanValueError
from torchscan.onnx._check._diff import _diff_all, _named_outputs, _shape_text
from torchscan.onnx._check._inputs import (
    _by_position,
    _describe,
    _feeds,
    _feeds_from_args,
    _Source,
    _torch_args,
    model_name,
    output_names,
    read_inputs,
)
from torchscan.onnx._check._limit import TimedOut, within
from torchscan.onnx._check._random import SEED, random_inputs
from torchscan.onnx._check._random_ops import random_outputs
from torchscan.onnx._check._runtimes import (
    _RUNNERS,
    RUNTIMES,
    SOURCES,
    _pytorch_outputs,
    _Unsupported,
)
from torchscan.onnx._lint import _driver as _lint
from torchscan.onnx._lint._load import LoadedModel, load
from torchscan.onnx._lint._report import (
    BASELINE,
    COULD_NOT_RUN,
    ERROR,
    MISMATCH,
    NO_BASELINE,
    OK,
    RANDOM,
    TIMEOUT,
    UNSUPPORTED,
    CheckReport,
    Comparison,
    OutputDiff,
    _family,
)

DEFAULT_ATOL = 1e-5
DEFAULT_RTOL = 1e-5


def check(
    model: str | os.PathLike[str] | bytes | onnx.ModelProto,
    *,
    inputs: str | os.PathLike[str] | Mapping[str, Any] | Sequence[Any] | None = None,
    expected: Mapping[str, Any] | Sequence[Any] | None = None,
    module: Callable[..., Any] | None = None,
    args: Sequence[Any] | None = None,
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
    dims: Mapping[str, int] | None = None,
    runtimes: Sequence[str] = RUNTIMES,
    timeout: float | None = None,
    strict: bool = True,
) -> CheckReport:
    """Lint the ``Scan``, ``Loop`` and ``If`` nodes of an ONNX model and compare runtimes on it.

    Lint: each ``Scan`` and ``Loop`` node, bodies and local functions included, is checked
    against the rules of the version in force in the model (body arity, ``num_scan_inputs``,
    axes and directions, element types, ``M`` and ``cond``, carried types and shapes, Scan-8's
    batch axis and ``sequence_lens``), and each ``If`` node against the shapes its branches
    give its outputs; each finding names the node, the rule and quotes the specification.
    ``docs/check.md`` lists the rules. ``RNN``, ``GRU`` and ``LSTM`` nodes are listed in the
    report (``other_nodes``), with no rule to apply. Any model is compared, one without any of
    these nodes too.

    Compare: the model runs in each of ``runtimes`` on the same inputs (onnxruntime twice: at
    its default graph optimization level, as users run it, as ``"onnxruntime"``, and with the
    optimizations off, as ``"onnxruntime-unoptimized"``; ``"reference"``, onnx's reference
    evaluator; ``"imported"``, the module :func:`torchscan.onnx.to_torch` makes of the model,
    run eagerly on the CPU), and ``module(*args)`` runs eagerly when a module is given. Every
    output is held against a baseline: ``expected`` (or the ``output_*.pb`` files next to the
    inputs) where given, else PyTorch's outputs, else the reference evaluator's, else the
    imported module's, else onnxruntime's without and then with its optimizations (the first
    of these that ran). An output agrees when every element ``a`` is within
    ``atol + rtol * |b|`` of the baseline's ``b`` (NaNs where the baseline has NaNs), with the
    same shape and element type. An output that depends on a random operator (``RandomNormal``,
    ``RandomNormalLike``, ``RandomUniform``, ``RandomUniformLike``, ``Bernoulli``,
    ``Multinomial``, at any depth) agrees when its shape and element type do: its values are not
    compared (``not_compared="random"``), as no two sources draw the same numbers. A runtime that
    does not run a model (onnx's reference evaluator on an operator it does not implement, or
    on a loop that runs no step whose body does not declare the shapes of its scan outputs;
    onnxruntime where it has no kernel, its status NOT_IMPLEMENTED, and on 4-bit and 2-bit
    types; either on a zero-length scan; ``"imported"`` where ``to_torch`` or torch does not
    implement an operator, a version or an element type, ``OnnxImportError.not_implemented``)
    is reported as not supported, which is not a failure. Any other error of a runtime is an
    error, which fails the check, except where the model passes ``onnx.checker`` (its full
    check, shape inference included) and at least two independent sources still gave outputs:
    then the runtime is reported as ``"could not run"``, with its error, and the verdict is
    judged on the sources that ran. An error of ``module`` is always an error.
    So is a source that does not end within ``timeout`` seconds: it is stopped, and reported as
    ``"timeout"``. Where fewer than two independent sources gave outputs (onnxruntime's two
    levels are one runtime), nothing was held against anything: the verdict is
    ``"not compared"``, which fails the check unless ``strict=False``. Without ``module`` and
    without expected outputs, the runtimes are held against each other only, which a model
    that computes the wrong thing the same way in all of them passes: the report says so.

    The inputs are, in this order of preference: ``inputs``; the tensors among ``args`` (as
    ``torch.onnx.export`` flattens them) where given; random values built from the
    model's input types. Given inputs must be of the element types, ranks and static sizes of
    the model's inputs. Random inputs have dynamic dimensions of the sizes in ``dims``; one left
    unset gets a size of its own (3, 4, 5, ... in the order they appear, skipping the sizes of
    static dimensions), except that dimensions the specification makes equal (the lengths of
    one Scan's scan inputs along their scan axes) get one size. Random floats are standard
    normal, integers lie in [1, 3], a bool scalar is True (so that a Loop's ``cond`` lets it
    run), and the draw is the same on every call. A model with a Loop that can never end (a
    ``loop-never-ends`` finding) is not run.

    Args:
      model: a path to an ``.onnx`` file, its bytes, or an ``onnx.ModelProto``.
      inputs: a path to an ``.npz`` file (arrays named after the model's inputs, or saved
        positionally), a folder of ``input_*.pb`` files (an ONNX test case's
        ``test_data_set_*``, or the test case folder itself, whose first data set is used), a
        mapping from input name to value, or a sequence of values in the model's input order.
        Values are numpy arrays or scalars, torch tensors, lists for sequence inputs, and None
        for empty optional inputs.
      expected: the model's outputs that the runtimes must give, as a mapping by output name or
        a sequence in output order.
      module: a callable, typically the ``torch.nn.Module`` that was exported, run as is (put it
        in eval mode first) under ``torch.no_grad()``.
      args: the positional arguments of ``module``; without them, ``module`` is run on the
        model's inputs, as torch tensors in the model's input order.
      atol: the absolute tolerance, at least 0.
      rtol: the relative tolerance, at least 0.
      dims: sizes of named dynamic dimensions (``dim_param``) for random inputs.
      runtimes: which of ``"onnxruntime"``, ``"reference"`` and ``"imported"`` to run; empty
        to lint only.
      timeout: the seconds each source (each runtime, and PyTorch) may run the model before it
        is stopped and reported as timed out; None for no limit. The limit is on the model's
        run: the start-up of a child process that onnxruntime runs in does not count. Under a
        limit, each source runs in a thread of its own, and Ctrl-C (``KeyboardInterrupt``)
        stops it at once.
      strict: whether a check that fewer than two independent sources ran fails (its verdict is
        ``"not compared"``, and ``report.ok`` False); ``strict=False`` accepts a single source.

    Returns:
      A :class:`CheckReport`. ``report.verdict`` is ``"ok"``, ``"failed"`` (a finding, an
      output that disagrees, a source that failed or timed out) or ``"not compared"``;
      ``report.ok`` is True for ``"ok"`` (and for ``"not compared"`` with ``strict=False``).
      ``print(report)`` shows it as tables.

    Raises:
      FileNotFoundError: ``model`` or ``inputs`` names no file.
      ValueError: the model cannot be read (not ONNX, truncated, empty, corrupt, without the
        opset imports that give its Scan and Loop nodes a version), has no Scan, Loop or If
        node to lint while no runtime is to run it, or the inputs or options do not fit it
        (inputs of another element type, rank or size; random inputs too large); the message
        says which and why.
      TypeError: ``model`` is of none of the accepted types.
    """
    with _errors.from_api(API):
        return _check(
            model, inputs, expected, module, args, atol, rtol, dims, runtimes, timeout, strict
        )


API = "torchscan.onnx.check"
"""The API that starts the messages of the check's errors."""


def _check(
    model: str | os.PathLike[str] | bytes | onnx.ModelProto,
    inputs: str | os.PathLike[str] | Mapping[str, Any] | Sequence[Any] | None,
    expected: Mapping[str, Any] | Sequence[Any] | None,
    module: Callable[..., Any] | None,
    args: Sequence[Any] | None,
    atol: float,
    rtol: float,
    dims: Mapping[str, int] | None,
    runtimes: Sequence[str],
    timeout: float | None,
    strict: bool,
) -> CheckReport:
    _check_options(atol, rtol, runtimes, module, args, timeout)
    loaded = load(model)
    label = loaded.label
    try:
        linted = _lint.lint(loaded.typed)
    except ValueError as error:
        raise TorchscanValueError(f"{label}: {error}") from None
    if not (runtimes or module is not None) and not _linted_any(linted):
        raise TorchscanValueError(
            f"{label}: has no Scan, Loop or If node to lint, and no runtime is to run it "
            f"(--lint-only, runtimes=()); there is nothing to check"
        )
    comparisons: tuple[Comparison, ...] = ()
    described: tuple[str, ...] = ()
    notes = linted.notes
    endless = [f.node for f in linted.findings if f.rule == "loop-never-ends"]
    if runtimes or module is not None:
        feeds, expected_values, described = _inputs(loaded, inputs, expected, module, args, dims)
        if module is not None and args is None:
            args = _torch_args(feeds)
    if endless and (runtimes or module is not None):
        notes += (
            f"the model was not run: {endless[0]} never ends (see its loop-never-ends finding), "
            f"so no runtime could finish it",
        )
    elif runtimes or module is not None:
        # The runs read the model as given: the copy that shape inference made for the lint and
        # the random inputs is let go before the runtimes make copies of their own.
        loaded = dataclasses.replace(loaded, typed=loaded.model)
        random = random_outputs(loaded.model)
        comparisons = compare(
            loaded,
            feeds,
            expected=expected_values,
            module=module,
            args=args,
            atol=atol,
            rtol=rtol,
            runtimes=runtimes,
            isolate=bool(linted.findings),
            random=random,
            timeout=timeout,
        )
        notes += _levels_differ(comparisons, names=output_names(loaded.model))
        if any(c.status in (OK, MISMATCH) for c in comparisons):
            notes += tuple(
                f"{name}: not compared: {RANDOM}: its values depend on {op}, which no two "
                f"sources draw alike; its shape and element type are compared"
                for name, op in random.items()
            )
            if expected_values is None and module is None:
                notes += (NO_BASELINE,)
    return CheckReport(
        model=label,
        opset=linted.opset,
        nodes=linted.nodes,
        findings=linted.findings,
        comparisons=comparisons,
        inputs=described,
        atol=atol,
        rtol=rtol,
        notes=notes,
        timeout=timeout,
        strict=strict,
        other_nodes=linted.others,
    )


def _linted_any(linted: _lint.LintResult) -> bool:
    """Whether the lint had a node to check: a Scan, a Loop or an If."""
    return bool(linted.nodes) or any(n.op.startswith("If-") for n in linted.others)


def _check_options(
    atol: float, rtol: float, runtimes: Sequence[str], module: Any, args: Any, timeout: Any
) -> None:
    for name, value in (("atol", atol), ("rtol", rtol)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise TorchscanValueError(f"{name} must be a finite number at least 0, not {value!r}")
    if timeout is not None and not (
        isinstance(timeout, (int, float))
        and not isinstance(timeout, bool)
        and math.isfinite(timeout)
        and timeout > 0
    ):
        raise TorchscanValueError(
            f"timeout must be a finite number of seconds greater than 0, or None, not {timeout!r}"
        )
    if isinstance(runtimes, str):
        raise TorchscanValueError(f"runtimes is a sequence of names, not the string {runtimes!r}")
    for runtime in runtimes:
        if runtime not in RUNTIMES:
            raise TorchscanValueError(unknown_runtime(runtime))
    if module is None and args is not None:
        raise TorchscanValueError("args was given without module: PyTorch runs module(*args)")


def unknown_runtime(name: str, where: str = "", module: str = "module=") -> str:
    """The message for a runtime name that is not one of :data:`RUNTIMES`: ``where`` says
    where it was given (``" in 'onnxruntime,tvm'"``), ``module`` how a module is given."""
    runtimes = ", ".join(RUNTIMES)
    if name == "torch":
        return (
            f"unknown runtime 'torch'{where}: the module torchscan.onnx.to_torch makes of the "
            f"model is the runtime 'imported', and eager PyTorch is the module given to compare "
            f"with ({module}); the runtimes are {runtimes}"
        )
    return f"unknown runtime {name!r}{where}; the runtimes are {runtimes}"


def _inputs(
    loaded: LoadedModel,
    inputs: Any,
    expected: Any,
    module: Any,
    args: Any,
    dims: Mapping[str, int] | None,
) -> tuple[dict[str, Any], list[Any] | None, tuple[str, ...]]:
    """The feeds, the expected outputs (or None) and a description of the feeds."""
    model, label = loaded.model, loaded.label
    expected_values = None if expected is None else _by_position(model, expected)
    if inputs is None and args is None:
        feeds = random_inputs(model, dims or {}, loaded.typed)
        source = f"random (seed {SEED})"
    elif dims:
        raise TorchscanValueError("dims sets the sizes of random inputs, but the inputs were given")
    elif inputs is None:
        feeds = _feeds_from_args(model, args, label)
        source = "the tensors of args"
    elif isinstance(inputs, (str, os.PathLike)):
        feeds, from_files = read_inputs(inputs, model, label)
        expected_values = expected_values if expected_values is not None else from_files
        source = f"{inputs}"
    else:
        feeds = _feeds(model, inputs, _Source("the inputs", model_name(label), plural=True))
        source = "given"
    described = (
        f"source: {source}",
        *(f"{name}: {_describe(value)}" for name, value in feeds.items()),
    )
    return feeds, expected_values, described


# --- running ----------------------------------------------------------------------------------


def compare(
    model: LoadedModel,
    feeds: dict[str, Any],
    *,
    expected: list[Any] | None = None,
    module: Callable[..., Any] | None = None,
    args: Sequence[Any] | None = None,
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
    runtimes: Sequence[str] = RUNTIMES,
    isolate: bool = False,
    random: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> tuple[Comparison, ...]:
    """Run ``model`` in ``runtimes`` (and ``module(*args)``) and hold each against a baseline.

    Args:
      model: the model, as :func:`~torchscan.onnx._lint._load.load` reads it.
      feeds: its inputs by name.
      expected: the outputs it must give, in output order; the baseline where given.
      module: eager PyTorch to compare with; its outputs are the baseline unless ``expected``.
      args: the positional arguments of ``module``.
      atol: the absolute tolerance.
      rtol: the relative tolerance.
      runtimes: the runtimes to run, among :data:`RUNTIMES`.
      isolate: run onnxruntime in a child process even where the inputs seem safe.
      random: the outputs that depend on a random operator, whose values are not compared (their
        shapes and element types are); by default, as :func:`random_outputs` finds them.
      timeout: the seconds each source may run (:func:`within`); None for no limit.

    Returns:
      One :class:`Comparison` per source, the baseline first.
    """
    names = output_names(model.model)
    random = random_outputs(model.model) if random is None else random
    results: dict[str, list[Any] | BaseException] = {}
    if expected is not None:
        results["expected"] = expected
    if module is not None:
        results["pytorch"] = _attempt(
            lambda: within(timeout, lambda _: _pytorch_outputs(module, args or ()))
        )
    empty = _has_empty_dimension(feeds)
    for source in (source for runtime in runtimes for source in SOURCES[runtime]):
        run = _RUNNERS[source]
        results[source] = _attempt(
            lambda run=run: within(
                timeout, lambda limit: run(model, feeds, isolate or empty, limit)
            )
        )
    ran = [s for s, r in results.items() if not isinstance(r, BaseException)]
    baseline = min(ran, key=_BASELINE_ORDER.index, default=None)
    # A runtime's error on a valid model that at least two independent sources ran is the
    # runtime's: it could not run the model.
    failed_runtimes = [s for s, r in results.items() if isinstance(r, BaseException)]
    overruled = (
        any(s in _RUNNERS for s in failed_runtimes)
        and len({_family(s) for s in ran}) >= 2
        and _valid(model)
    )
    comparisons = []
    for source, result in results.items():
        if isinstance(result, BaseException):
            failed = _failed(source, baseline or "", result, empty)
            if failed.status == ERROR and source in _RUNNERS and overruled:
                failed = dataclasses.replace(failed, status=COULD_NOT_RUN)
            comparisons.append(failed)
        elif source == baseline:
            diffs = tuple(
                OutputDiff(n, _shape_text(v), None, None, True, "", RANDOM if n in random else "")
                for n, v in _named_outputs(names, result)
            )
            comparisons.append(Comparison(source, source, BASELINE, "", diffs))
        else:
            assert baseline is not None  # this source ran, so a baseline was chosen
            reference = results[baseline]
            assert not isinstance(reference, BaseException)  # the baseline is a source that ran
            diffs = _diff_all(names, result, reference, atol, rtol, random)
            status = OK if all(d.ok for d in diffs) else MISMATCH
            comparisons.append(Comparison(source, baseline, status, "", diffs))
    comparisons.sort(key=lambda c: c.status != BASELINE)
    return tuple(comparisons)


_BASELINE_ORDER = (
    "expected",
    "pytorch",
    "reference",
    "imported",
    "onnxruntime-unoptimized",
    "onnxruntime",
)
"""Which source that ran is the baseline: the outputs the user gave, PyTorch's, the reference
evaluator's (the specification's semantics), the model imported into PyTorch, then onnxruntime's
with its graph optimizations off (the model as it is), and last onnxruntime's at its default
level."""


def _levels_differ(comparisons: Sequence[Comparison], names: Sequence[str]) -> tuple[str, ...]:
    """A note where onnxruntime's two optimization levels disagree with the baseline in
    different ways: its graph optimizations change the outputs, which they do where the model
    states a shape or a value that does not hold for every run."""
    by_source = {c.source: c for c in comparisons}
    default, unoptimized = by_source.get("onnxruntime"), by_source.get("onnxruntime-unoptimized")
    if (
        default is None
        or unoptimized is None
        or MISMATCH not in (default.status, unoptimized.status)
    ):
        return ()
    if {default.status, unoptimized.status} - {OK, MISMATCH, BASELINE}:
        return ()
    changed = [
        name
        for name, a, b in zip(names, default.outputs, unoptimized.outputs, strict=False)
        if (a.ok, a.shape) != (b.ok, b.shape)
    ]
    if not changed:
        return ()
    return (
        f"onnxruntime's graph optimizations change {', '.join(changed)}: onnxruntime gives "
        "other outputs at its default level than with the optimizations off. The model states "
        "a shape or a value that does not hold for every run (an If whose branches give an "
        "output different static shapes, for one), and onnxruntime's constant folding trusts "
        "it.",
    )


def _valid(model: LoadedModel) -> bool:
    """Whether the model passes ``onnx.checker``'s full check (shape inference included): a
    runtime's error on it is not the model's where other runtimes run it."""
    import onnx.checker

    try:
        onnx.checker.check_model(model.proto, full_check=True)
    except Exception:  # ValidationError, InferenceError, a model too large to check, ...
        return False
    return True


def _attempt(run: Callable[[], list[Any]]) -> list[Any] | BaseException:
    try:
        return run()
    except Exception as error:  # a runtime's failure is a result to report, not to raise
        return error


def _failed(source: str, against: str, error: BaseException, empty: bool) -> Comparison:
    reason = _one_line(error)
    if isinstance(error, TimedOut):
        return Comparison(source, against, TIMEOUT, reason)
    if isinstance(error, _Unsupported) or _runtime_lacks(source, error):
        return Comparison(source, against, UNSUPPORTED, reason)
    if empty and source in _RUNNERS:
        # Both runtimes fail on zero-length scans, which the specification allows.
        return Comparison(
            source, against, UNSUPPORTED, f"an input has an empty dimension: {reason}"
        )
    return Comparison(source, against, ERROR, reason)


_REFERENCE_LACKS = re.compile(r"\b(not implemented|not supported|unsupported)\b", re.IGNORECASE)


def _runtime_lacks(source: str, error: BaseException) -> bool:
    """Whether a runtime's error says that the runtime lacks something the model needs (not
    supported, no failure), rather than that the model or its inputs are wrong (an error, which
    fails the check).

    onnxruntime: its status NOT_IMPLEMENTED (the exception ``NotImplemented``), which it gives
    where it has no kernel for an operator's version or element type ("Could not find an
    implementation for RandomNormalLike(22) node"); every other status (INVALID_GRAPH,
    INVALID_ARGUMENT, FAIL, ...: an invalid model, shapes that do not fit) is the model's.
    onnx.reference: ``NotImplementedError``, which it raises for an operator or a node of another
    domain it has no implementation of, and for attribute values it does not implement (but not
    for an operator that ONNX does not have: "No registered schema for operator"), and a plain
    ``RuntimeError`` that says "not implemented" or "not supported" (as its Scan does for axes
    other than 0); a ``ValueError``, ``TypeError`` or ``IndexError`` is the model's. An error of
    eager PyTorch is never the runtime's: the module is the user's.
    """
    if source.startswith("onnxruntime"):
        return getattr(error, "child_type", type(error).__name__) == "NotImplemented"
    if source == "reference":
        if isinstance(error, NotImplementedError):
            return not str(error).startswith("No registered schema for operator")
        return type(error) is RuntimeError and bool(_REFERENCE_LACKS.search(str(error)))
    return False


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _has_empty_dimension(feeds: Mapping[str, Any]) -> bool:
    def empty(value: Any) -> bool:
        if value is None:
            return False
        if isinstance(value, list):
            return any(map(empty, value))
        return 0 in np.shape(value)

    return any(empty(v) for v in feeds.values())
