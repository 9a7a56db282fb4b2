"""What torchscan does to a model that torch.onnx built, as named passes over ``onnx_ir`` models.

torch.onnx builds the model at opset 18 or newer, then calls its ``convert_version`` with the
opset asked for, then its optimizer. torchscan's hooks (:mod:`torchscan.onnx._export._hooks`)
replace both calls by :func:`convert_version` and :func:`optimize` here, which run the passes
below on a model that holds a ``Scan`` or ``Loop`` at any depth, in this order, and pass every other
model to torch.onnx's own functions untouched (its export is then byte for byte what it is
without torchscan):

1. :class:`CheckLoopTypes`: refuse a Scan or Loop of an element type the target's version does
   not allow;
2. ``onnx_ir.passes.common.InlinePass``: model-local functions inlined, so that the passes after
   it see every loop; then ``NameFixPass``: every value named once in the model (a parameter
   may have the name of a value of a loop's body, which the optimizer would fold into an
   initializer of that name);
3. :class:`ShapeEmptyLoops`: the stacked outputs of a Loop that may run no iteration shaped as
   the specification wants them (:mod:`torchscan.onnx._export._empty_loops`);
4. :class:`HoistLoopInvariants`: work that does not depend on the carried state moved out of
   Scan and Loop bodies (:mod:`torchscan.onnx._export._hoist_bodies`), unless
   ``torchscan.onnx.export_options(hoist_loop_invariants=False)``;
5. at opset 18 and newer, :class:`ConvertVersion` (torch.onnx's own conversion); below,
   :class:`ConvertDown`: the model optimized at the opset torch.onnx built it at
   (:class:`Optimize`), then converted by torchscan, loop bodies included;
6. :class:`WarnOnnxruntimeGaps`: a warning where the model holds an operator version that
   onnxruntime has no kernel for.

torch.onnx then runs its optimizer: :func:`optimize` runs :class:`Optimize` on a model with
loops, except one that :class:`ConvertDown` optimized already (onnxscript's optimizer, run on a
model below opset 18, would write opset-18 nodes into it); ``ConvertDown`` marks such a model in
its ``meta``.

Each pass can be run alone on a model (``CheckLoopTypes(13)(model)``), as the tests do.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from collections.abc import Callable, Iterator

import onnx_ir as ir
from onnx_ir.passes.common import InlinePass, NameFixPass

from torchscan.onnx import _ir, _opsets
from torchscan.onnx._export import _element_types, _empty_loops, _hoist_bodies, _options

VersionConverter = Callable[[ir.Model, int], ir.Model]
"""torch.onnx's ``convert_version(model, target_version)``, which converts in place."""

Optimizer = Callable[[ir.Model], ir.Model]
"""torch.onnx's ``optimize(model)``, which optimizes in place."""

OPTIMIZED = "torchscan.optimized"
"""The key of ``ir.Model.meta`` that :class:`ConvertDown` sets on the model it optimized and
converted: torch.onnx's optimizer, run after it, leaves that model as it is."""


class CheckLoopTypes(ir.passes.InPlacePass):
    """Refuse a Scan or Loop, at any depth, whose tensors have an element type that its version
    at ``target_opset`` does not allow
    (:func:`torchscan.onnx._export._element_types.check_loop_types`). Changes nothing."""

    def __init__(self, target_opset: int) -> None:
        super().__init__()
        self.target_opset = target_opset

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        _element_types.check_loop_types(model.graph, self.target_opset)
        return ir.passes.PassResult(model, modified=False)


class ShapeEmptyLoops(ir.passes.InPlacePass):
    """Reshape the stacked outputs of every Loop that may run no iteration to
    ``(len(y), *step_shape)`` (:mod:`torchscan.onnx._export._empty_loops`)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        reshaped = _empty_loops.shape_empty_loop_outputs(model)
        return ir.passes.PassResult(model, modified=reshaped > 0)


class HoistLoopInvariants(ir.passes.InPlacePass):
    """Move loop-invariant and per-step work out of every Scan and Loop body
    (:func:`torchscan.onnx.hoist_loop_invariants`), giving no loop an element type that its
    version at ``target_opset`` does not allow."""

    def __init__(self, target_opset: int) -> None:
        super().__init__()
        self.target_opset = target_opset

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        moved = _hoist_bodies.hoist_loop_invariants(model, target_opset=self.target_opset)
        return ir.passes.PassResult(model, modified=moved > 0)


class Optimize(ir.passes.InPlacePass):
    """torch.onnx's optimizer (onnxscript's: constant folding, dead code, fusions), then the
    scanned inputs of a Scan that its body no longer reads dropped
    (:func:`torchscan.onnx._export._hoist_bodies.drop_unread_sequences`), which onnxscript does
    not do.

    The module's parameters and persistent buffers are kept as they are (:func:`state_kept`):
    the optimizer would store ``Transpose(weight)`` as a new initializer under a new name, and a
    weight fine-tuned elsewhere (``torchscan.onnx.to_torch``) would then have no name to be
    loaded back by. They are kept under their ``state_dict`` names, and what is computed of
    them stays a node, which onnxruntime folds when it loads the model."""

    def __init__(self, optimize: Optimizer) -> None:
        super().__init__()
        self.optimize = optimize

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        with state_kept(model):
            self.optimize(model)
        _hoist_bodies.drop_unread_sequences(model.graph)
        return ir.passes.PassResult(model, modified=True)


@contextlib.contextmanager
def state_kept(model: ir.Model) -> Iterator[None]:
    """Have the module's parameters and persistent buffers (:func:`state_initializers`) kept
    as they are, under their names, by torch.onnx's passes run in the block: neither folded
    (onnxscript folds no node that reads a graph input), merged with an equal one, nor dropped
    where unread (``num_batches_tracked``); and mark them so in the file (torch.onnx's
    ``metadata_props`` of each, written into the initializer, where
    ``torchscan.onnx.to_torch`` reads them)."""
    kept = [v for v in state_initializers(model.graph) if not v.is_graph_input()]
    for value in kept:
        if value.const_value is not None:
            for key in (_ir.STATE_KIND, _ir.PERSISTENT):
                value.const_value.metadata_props[key] = value.metadata_props[key]
    model.graph.inputs.extend(kept)
    deduplication = logging.getLogger("onnx_ir.passes.common.initializer_deduplication")
    level = deduplication.level  # (which warns of every graph input it leaves alone)
    deduplication.setLevel(logging.ERROR)
    try:
        yield
    finally:
        deduplication.setLevel(level)
        for value in kept:
            model.graph.inputs.remove(value)


def state_initializers(graph: ir.Graph) -> list[ir.Value]:
    """The initializers of ``graph`` that torch.onnx made of the module's ``state_dict``: its
    parameters and persistent buffers, named as the ``state_dict`` names them (torch.onnx
    writes the kind of each in the initializer's metadata)."""
    return [
        value
        for value in graph.initializers.values()
        if value.metadata_props.get(_ir.STATE_KIND) == "PARAMETER"
        or (
            value.metadata_props.get(_ir.STATE_KIND) == "BUFFER"
            and value.metadata_props.get(_ir.PERSISTENT) == "True"
        )
    ]


class ConvertVersion(ir.passes.InPlacePass):
    """torch.onnx's own conversion to ``target_opset`` (18 and newer, where it converts every
    operator torchscan emits), the module's state kept (:func:`state_kept`)."""

    def __init__(self, target_opset: int, convert: VersionConverter) -> None:
        super().__init__()
        self.target_opset = target_opset
        self.convert = convert

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        with state_kept(model):
            self.convert(model, self.target_opset)
        return ir.passes.PassResult(model, modified=True)


class ConvertDown(ir.passes.InPlacePass):
    """The model optimized at the opset torch.onnx built it at, then converted by torchscan to
    ``target_opset`` (below 18), Scan, Loop and If bodies included
    (:func:`torchscan.onnx._export._convert.convert_model`); marked :data:`OPTIMIZED`.

    Below opset 18 torch.onnx's order, convert then optimize, fails twice: torch's translations
    use operators that old opsets lack (``chunk`` is a ``SplitToSequence`` until the optimizer
    folds it into a ``Split``), and the optimizer, run on an old-opset model, writes opset-18
    nodes into it. Optimizing first may instead choose an operator the target lacks where the
    model as built has none (a fusion into ``Gelu``): the model as built, kept before
    optimizing, is then converted instead. Where both fail, the optimized model's refusal names
    the real blocker (the model as built still holds what the optimizer folds away)."""

    def __init__(self, target_opset: int, optimize: Optimizer) -> None:
        super().__init__()
        self.target_opset = target_opset
        self.optimize = optimize

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        from torchscan.onnx._export import _convert

        built = model.clone()
        try:
            Optimize(self.optimize)(model)
            _convert.convert_model(model, self.target_opset, in_place=True)
        except _convert.OpsetConversionError as refused:
            try:
                _convert.convert_model(built, self.target_opset, in_place=True)
            except _convert.OpsetConversionError:
                raise refused from None
            model.graph = built.graph
            model.functions.clear()
            model.functions.update(built.functions)
            model.ir_version = built.ir_version
        model.meta[OPTIMIZED] = True
        return ir.passes.PassResult(model, modified=True)


class WarnOnnxruntimeGaps(ir.passes.InPlacePass):
    """Warn where the model holds an operator version that onnxruntime has no kernel for
    (:func:`warn_onnxruntime_gaps`). Changes nothing."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        warn_onnxruntime_gaps(model)
        return ir.passes.PassResult(model, modified=False)


def has_loops(model: ir.Model) -> bool:
    """Whether ``model`` holds a default-domain ``Scan`` or ``Loop`` node at any depth, in its
    graph or its functions."""
    return any(
        node.op_type in ("Scan", "Loop") and _ir.is_default_domain(node.domain)
        for graph in (model.graph, *model.functions.values())
        for node in ir.traversal.RecursiveGraphIterator(graph)
    )


def pipeline(
    target_opset: int, *, convert: VersionConverter, optimize: Optimizer, hoist: bool = True
) -> ir.passes.Sequential:
    """The passes :func:`convert_version` runs, in order, for ``target_opset``, with
    torch.onnx's ``convert`` and ``optimize``."""
    passes: list[ir.passes.PassBase] = [
        CheckLoopTypes(target_opset),
        InlinePass(),
        NameFixPass(),
        ShapeEmptyLoops(),
    ]
    if hoist:
        passes.append(HoistLoopInvariants(target_opset))
    if target_opset >= _opsets.TORCH_BUILD_OPSET:
        passes.append(ConvertVersion(target_opset, convert))
    else:
        passes.append(ConvertDown(target_opset, optimize))
    passes.append(WarnOnnxruntimeGaps())
    return ir.passes.Sequential(*passes)


def convert_version(
    model: ir.Model, target_opset: int, *, convert: VersionConverter, optimize: Optimizer
) -> ir.Model:
    """What torch.onnx's ``convert_version`` becomes: :func:`pipeline` on a model with loops,
    ``convert(model, target_opset)`` on any other."""
    if not has_loops(model):
        return convert(model, target_opset)
    hoist = _options.current().hoist_loop_invariants
    return pipeline(target_opset, convert=convert, optimize=optimize, hoist=hoist)(model).model


def optimize(model: ir.Model, *, optimize: Optimizer) -> ir.Model:
    """What torch.onnx's ``optimize`` becomes: nothing on a model :class:`ConvertDown`
    optimized, :class:`Optimize` on a model with loops, ``optimize(model)`` on any other."""
    if model.meta.get(OPTIMIZED):
        return model
    if not has_loops(model):
        return optimize(model)
    return Optimize(optimize)(model).model


ONNXRUNTIME_MISSING_KERNELS = {
    "RandomNormal": 22,
    "RandomNormalLike": 22,
    "RandomUniform": 22,
    "RandomUniformLike": 22,
    "Bernoulli": 22,
    "Multinomial": 22,
}
"""Operators of the default domain that onnxruntime 1.32's CPU provider has no kernel for from
the version given on (its status NOT_IMPLEMENTED, "Could not find an implementation for
RandomNormalLike(22) node"), though it runs the versions before (Bernoulli-22 through its
function, a RandomUniformLike-22)."""
ONNXRUNTIME_CHECKED = "1.32"


def warn_onnxruntime_gaps(model: ir.Model) -> None:
    """Warn (:class:`~torchscan.TorchscanWarning`) where ``model`` holds, at any depth, a node
    of an operator version that onnxruntime has no kernel for
    (:data:`ONNXRUNTIME_MISSING_KERNELS`), naming the versions, the nodes and the opset to
    export at instead."""
    opset = _ir.default_opset(model.opset_imports)
    if opset is None:
        return
    found: dict[str, list[str]] = {}
    for graph in [model.graph, *model.functions.values()]:
        for node in ir.traversal.RecursiveGraphIterator(graph):
            since = ONNXRUNTIME_MISSING_KERNELS.get(node.op_type)
            if since is not None and _ir.is_default_domain(node.domain) and opset >= since:
                name = repr(node.name) if node.name else "without a name"
                found.setdefault(node.op_type, []).append(name)
    if not found:
        return
    import onnx.defs

    from torchscan._errors import TorchscanWarning

    held = [
        f"{op}-{onnx.defs.get_schema(op, opset, '').since_version} "
        f"(node{'s' if len(names) > 1 else ''} {', '.join(names)})"
        for op, names in found.items()
    ]
    below = min(ONNXRUNTIME_MISSING_KERNELS[op] for op in found) - 1
    warnings.warn(
        f"torch.onnx.export: the model holds {_listing(held)} at opset {opset}, and onnxruntime "
        f"{ONNXRUNTIME_CHECKED} has no kernel for {'them' if len(held) > 1 else 'it'}: it "
        f"refuses to run the model (NOT_IMPLEMENTED). To run it in onnxruntime "
        f"{ONNXRUNTIME_CHECKED}, export with opset_version={below} or lower.",
        TorchscanWarning,
        stacklevel=_stacklevel_outside_the_export(),
    )


def _listing(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _stacklevel_outside_the_export() -> int:
    """The ``stacklevel`` of the first frame of the caller's that is not torch's, onnxscript's,
    onnx_ir's or torchscan's: where the user called the export, for the warning to name."""
    level, frame = 2, sys._getframe(2)  # the caller of this function's caller
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.partition(".")[0] not in ("torch", "torchscan", "onnxscript", "onnx_ir"):
            return level
        level, frame = level + 1, frame.f_back
    return 2
