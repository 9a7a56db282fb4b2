"""The one place torchscan reaches into torch's private API.

torchscan's eager loops need none of it. Its traced operators, its fake-tensor probing of output
shapes and its plugging into ``torch.onnx.export`` do: they are modelled on torch's own
higher-order operators and on torch.onnx's exporter, whose building blocks are private. Every
such symbol is imported here, and nowhere else, and listed in :data:`PRIVATE_API` with the
parameters torchscan passes to it. ``tests/test_compat.py`` checks every entry against the
installed torch, so that a torch release that moves or changes one fails that test, naming the
symbol, instead of failing somewhere deep inside an export.

Modules that torch itself imports at ``import torch`` are imported here at once; the others
(TorchDynamo, symbolic shapes and sympy, torch.onnx's exporter, which imports onnxscript, and
torch.export's non-strict utilities) only when a function below is first called, so that
``import torchscan`` costs little more than ``import torch`` (``tests/test_imports.py``).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from types import CodeType, ModuleType, SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.utils._cxx_pytree as cxx_pytree
import torch.utils._pytree as pytree
from torch._C import DispatchKey
from torch._guards import TracingContext, detect_fake_mode
from torch._higher_order_ops.utils import (
    _maybe_run_with_interpreter,
    autograd_not_implemented,
    reenter_make_fx,
    register_fake,
    unique_graph_id,
)
from torch._ops import HigherOrderOperator, OpOverload
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.proxy_tensor import (
    ProxyTorchDispatchMode,
    disable_proxy_modes_tracing,
    track_tensor_tree,
)
from torch.fx.proxy import _register_stack_trace_anchor
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from torchscan import _context

if TYPE_CHECKING:  # imported where first needed, as the modules below say
    from torch._export.non_strict_utils import (
        _NonStrictTorchFunctionHandler as NonStrictTorchFunctionHandler,
    )
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

__all__ = [
    "DISTRIBUTION_CHECK_OPERATOR",
    "DYNAMO_CONSTANT_MARK",
    "ONNX_EXPORTER_MODULE",
    "ONNX_SIGNATURE_WARNING",
    "PRIVATE_API",
    "TREE_SPEC_TYPES",
    "UNFOUND_USER_CODE_WARNING",
    "VMAP_CONTROL_FLOW_ERROR",
    "DispatchKey",
    "FakeTensor",
    "FakeTensorMode",
    "HigherOrderOperator",
    "OpOverload",
    "PrivateSymbol",
    "ProxyTorchDispatchMode",
    "TorchDispatchMode",
    "autograd_not_implemented",
    "cxx_pytree",
    "detect_fake_mode",
    "disable_proxy_modes_tracing",
    "dynamo_graph_break",
    "dynamo_graph_nodes",
    "functorch_transforms_active",
    "guard_on_data_dependent_error",
    "is_recomputation_stop",
    "map_over",
    "maybe_run_with_interpreter",
    "non_strict_torch_function_handler",
    "onnx_core",
    "onnx_dispatching",
    "onnx_program",
    "onnx_registration",
    "pytree",
    "reenter_make_fx",
    "register_fake",
    "register_stack_trace_anchor",
    "run_untraced_by_dynamo",
    "runs_eagerly",
    "saved_tensors_hooks_active",
    "shape_env",
    "symbolic_symbols",
    "torch_function_of",
    "trace_on_fake",
    "track_tensor_tree",
    "unbacked_symbols",
    "uncaptured_operator_error",
    "unique_graph_id",
    "untraced",
    "written_arguments",
]

maybe_run_with_interpreter = _maybe_run_with_interpreter

ONNX_EXPORTER_MODULE = "torch.onnx._internal.exporter._core"
"""torch.onnx's exporter: importing it is when torchscan's translations are installed."""

UNFOUND_USER_CODE_WARNING = (
    "torch.fx.experimental.symbolic_shapes",
    "Unable to find user code corresponding to",
)
"""The logger and the start of torch's warning that a size read from data has no user code to
blame: what a step that reads tensor values says when it is called on fake tensors to learn its
output shapes, which torchscan then learns another way."""

VMAP_CONTROL_FLOW_ERROR = (
    "vmap: It looks like you're attempting to use a Tensor in some data-dependent control flow"
)
"""The start of the error torch.func.vmap raises for ``bool()`` of a batched tensor (C++ text,
checked by tests/test_compat.py): what a loop that stops with ``until`` meets under vmap."""

DISTRIBUTION_CHECK_OPERATOR = "aten._is_all_true.default"
"""The operator a ``torch.distributions`` object checks its arguments with (validate_args):
from torch 2.15, while torch exports, it asserts its result at run time rather than reading it,
and torch.onnx has no translation of it."""

ONNX_CONVERTER_ASSERTION = "failed: "
"""What onnx's version converter writes before the reason, in the first line of the error an
adapter's failed assertion raises (``...: Assertion `...` failed: <reason>``)."""

ONNX_SIGNATURE_WARNING = (
    "torch.onnx._internal.exporter._registration",
    "Failed to infer the signature for function",
)
"""The logger and the start of torch.onnx's warning, for a translation in
``custom_translation_table``, that it takes no ONNX signature and gets every node of its operator:
what a translation of a higher-order operator is meant to do."""


def non_strict_torch_function_handler() -> type[NonStrictTorchFunctionHandler]:
    """The torch function mode with which torch.export's non-strict mode turns ``x[i]`` with a
    0-d integer tensor ``i`` into ``select(x, 0, i.item())``."""
    from torch._export.non_strict_utils import _NonStrictTorchFunctionHandler

    return _NonStrictTorchFunctionHandler


def written_arguments(node: torch.fx.Node) -> tuple[str, list[Any]]:
    """The name of the operator a node of a traced graph calls (``"add_"``), and the arguments
    it writes into: those its schema marks as written (``Tensor(a!)``); ``("", [])`` for a node
    that calls no operator."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, OpOverload):
        return "", []
    arguments = target._schema.arguments
    written = [
        arg for arg, argument in zip(node.args, arguments, strict=False) if argument.is_write
    ]
    by_name = {argument.name: argument for argument in arguments}
    written += [
        arg
        for name, arg in node.kwargs.items()
        if name in by_name and by_name[name].is_write  # out=
    ]
    return target.overloadpacket.__name__, written


def register_stack_trace_anchor(code: CodeType) -> None:
    """Have torch keep the frames of ``code`` in the stack traces it records on the nodes of an
    exported graph, where it keeps only ``forward`` methods and the frames registered."""
    # torch reads only the ``__code__`` of the function it is given
    _register_stack_trace_anchor(cast("Callable[..., Any]", SimpleNamespace(__code__=code)))


def uncaptured_operator_error() -> type[Exception]:
    """The error of a higher-order operator (``torch.cond``) whose functions TorchDynamo could
    not trace."""
    from torch._dynamo.exc import UncapturedHigherOrderOpError

    return UncapturedHigherOrderOpError


def dynamo_user_error() -> type[Exception]:
    """The error TorchDynamo raises for what the user's code asks that it cannot trace (a guard
    on a value computed from the data, inside the branches of ``torch.cond``)."""
    from torch._dynamo.exc import UserError

    return UserError


def scan_operator() -> Any:
    """torch's own ``scan`` operator, which TorchDynamo captures as one loop and Inductor
    compiles as a loop (torch has no public ``scan``)."""
    from torch._higher_order_ops.scan import scan

    return scan


class _DenseGradient(torch.autograd.Function):
    """The identity, whose backward pass makes the gradient it passes on a dense tensor."""

    @staticmethod
    def forward(tensor: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return tensor.view_as(tensor)

    @staticmethod
    def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, gradient: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return gradient.clone(memory_format=torch.contiguous_format)


def dense_gradient(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, whose gradient reaches the loop operator that made it as a dense tensor.

    Inductor's backward pass of torch's ``scan`` computes wrong gradients for everything before
    the loop when the final carry's gradient is a broadcast tensor (of stride 0): what
    ``h.sum()`` passes back, where the loss is computed in the compiled function (torch 2.13 to
    2.15; ``tests/test_compat.py`` shows it on torch's own operator). Applied to the final carry
    of a loop operator that records gradients, under ``torch.compile``."""
    if not (tensor.requires_grad and (tensor.is_floating_point() or tensor.is_complex())):
        return tensor
    return _DenseGradient.apply(tensor)


_DONATED_BUFFERS_BREAK_LOOPS = torch.__version__ < "2.15"


def train_loops_correctly_in_this_compile() -> bool:
    """Have this compilation compute the gradients of loop operators right; whether it does.

    Before torch 2.15, Inductor could let a backward graph reuse ("donate") the memory of a saved
    tensor that a loop operator's body overwrites, and gradients came out wrong
    (https://github.com/pytorch/pytorch/issues/153679). Called while TorchDynamo traces a scan
    that records gradients, this turns donated buffers off (``torch._functorch.config
    .donated_buffer``) for the compilation under way (:func:`set_for_this_compile`), which is
    where AOTAutograd decides which buffers the backward may reuse. Where no TorchDynamo
    compilation is under way, nothing is changed and the answer is whether the release and the
    setting give right gradients.
    """
    from torch._functorch import config as functorch_config

    if not (_DONATED_BUFFERS_BREAK_LOOPS and functorch_config.donated_buffer):
        return True
    return set_for_this_compile(functorch_config, "donated_buffer", False)


def inductor_graph_passes() -> tuple[Any, Any, Any]:
    """Inductor's interface of custom graph passes: ``CustomGraphPass``, ``get_hash_for_files``
    (a pass's identity for Inductor's cache) and ``get_custom_graph_passes`` (the passes a
    setting holds)."""
    from torch._inductor.custom_graph_pass import (
        CustomGraphPass,
        get_custom_graph_passes,
        get_hash_for_files,
    )

    return CustomGraphPass, get_hash_for_files, get_custom_graph_passes


def run_pre_grad_pass_in_this_compile(graph_pass: Any) -> bool:
    """Have the Inductor compilation under way run ``graph_pass`` on the graph TorchDynamo
    captured, before it is differentiated (``pre_grad_custom_pass``), ahead of the user's own
    passes; whether it will. Called while TorchDynamo traces a scan that becomes a loop
    operator."""
    from torch._inductor import config as inductor_config

    current = inductor_graph_passes()[2](inductor_config.pre_grad_custom_pass)
    if graph_pass in current:
        return True
    value = [graph_pass, *current] if current else graph_pass
    return set_for_this_compile(inductor_config, "pre_grad_custom_pass", value)


def run_loops_without_size_asserts_in_this_compile() -> bool:
    """Have Inductor's code of this compilation leave out its size assertions.

    Inductor's Python wrapper runs a loop operator's steps from Python and asserts the size and
    strides of every input of the body at every step (``assert_size_stride``), which makes a
    compiled loop of small steps slower than the eager loop (``benchmarks/compiled_loop.py``).
    The body's inputs are made by the loop's own compiled code, and the graph's inputs are held to
    their sizes by TorchDynamo's guards. Called while TorchDynamo traces a loop that becomes a
    loop operator; a user's own ``options={"size_asserts": ...}`` is applied by Inductor after
    this and wins.
    """
    from torch._inductor import config as inductor_config

    return set_for_this_compile(inductor_config, "size_asserts", False)


_set_for_this_compile: dict[tuple[Any, str], Any] = {}
"""The settings :func:`set_for_this_compile` changed, with the values to put back."""


def set_for_this_compile(config: Any, name: str, value: Any) -> bool:
    """Set ``config.name`` to ``value`` until TorchDynamo's compilation of the frame under way
    ends (its end-of-compilation callback puts the user's value back); whether it was set:
    nothing is changed where no TorchDynamo compilation is under way."""
    if TracingContext.try_get() is None:  # not called from TorchDynamo's trace of a frame
        return False
    from torch._dynamo.callback import callback_handler

    # registered once, and again after torch._dynamo.reset(), which clears the callbacks
    if _put_back_settings not in callback_handler.end_callbacks:
        callback_handler.register_end_callback(_put_back_settings)
    _set_for_this_compile.setdefault((config, name), getattr(config, name))
    setattr(config, name, value)
    return True


def _put_back_settings(_: Any) -> None:
    for (config, name), value in _set_for_this_compile.items():
        setattr(config, name, value)
    _set_for_this_compile.clear()


def let_loop_operators_read_scalars() -> bool:
    """Let the program TorchDynamo is tracing hold values read from tensors (``.item()``).

    Inductor compiles torch's ``scan`` as a ``while_loop`` that reads its step counter with
    ``.item()``, which fails ("DataDependentOutputException") unless the shape environment of
    the traced program allows such values: TorchDynamo allows them under ``fullgraph=True`` or
    ``torch._dynamo.config.capture_scalar_outputs``, and not otherwise (torch 2.13 to 2.15).
    Called while TorchDynamo traces a scan that becomes a loop operator; it changes that one
    program's shape environment, not TorchDynamo's treatment of ``.item()`` in the user's code.
    """
    context = TracingContext.try_get()
    fake_mode = None if context is None else context.fake_mode
    shape_env = None if fake_mode is None else fake_mode.shape_env
    if shape_env is not None and not shape_env.settings.allow_scalar_outputs:
        shape_env.settings = dataclasses.replace(shape_env.settings, allow_scalar_outputs=True)
    return True


def skip_code_as_frame(code: CodeType) -> None:
    """Have TorchDynamo run the frames of ``code`` untraced when they are the root of a frame it
    would compile (after a graph break), while still inlining calls to them in frames it traces."""
    from torch._dynamo.eval_frame import skip_code

    skip_code(code)


DYNAMO_CONSTANT_MARK = "_dynamo_marked_constant"
"""The attribute ``torch._dynamo.assume_constant_result`` sets on a function (and all it does),
set here without importing TorchDynamo; held by tests/test_compat.py."""


def dynamo_graph_nodes() -> list[torch.fx.Node]:
    """The nodes of the graph TorchDynamo is building (placeholders first), read by a function
    it calls untraced (:func:`run_untraced_by_dynamo`) while it traces."""
    from torch._dynamo.symbolic_convert import InstructionTranslator

    return list(InstructionTranslator.current_tx().output.graph.nodes)


def dynamo_graph_break(reason: str) -> None:
    """Ask TorchDynamo, tracing the caller, to break the graph here (``reason`` is what its
    graph-break logs and errors say)."""
    from torch._dynamo import graph_break

    graph_break(reason)


def run_untraced_by_dynamo(fn: Any) -> Any:
    """``fn``, marked so that TorchDynamo calls it as it traces instead of tracing it: an error it
    raises reaches the caller of ``torch.export.export(..., strict=True)`` unchanged, where an
    error raised by traced code becomes Dynamo's "Observed exception". What
    ``torch._dynamo.assume_constant_result`` does, without importing TorchDynamo."""
    setattr(fn, DYNAMO_CONSTANT_MARK, True)
    return fn


def known_size(size: Any) -> bool:
    """Whether ``size`` is an int the traced program knows, not a symbolic size (TorchDynamo
    shows both as ints), without a guard that would fix it."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return statically_known_true(size < sys.maxsize)


def guard_on_data_dependent_error() -> type[GuardOnDataDependentSymNode]:
    """The error torch raises where a traced program reads a size that depends on data in
    Python (``GuardOnDataDependentSymNode``)."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    return GuardOnDataDependentSymNode


def unbacked_symbols(size: torch.SymInt) -> AbstractSet[Any]:
    """The symbols of sizes read from data (unbacked) that a symbolic size depends on."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    return free_unbacked_symbols(size)


def runs_eagerly(tensors: Any) -> bool:
    """Whether an operator called with ``tensors`` runs eagerly: no torch.export, torch.onnx or
    torch.compile is tracing it, no dispatch mode (the tracer's proxies, fake tensors,
    functionalization) is active, and every tensor is a plain tensor or parameter, not a fake or
    functional one."""
    if _context.exporting() or _context.compiling():
        return False
    if _get_current_dispatch_mode() is not None:
        return False
    plain = (torch.Tensor, torch.nn.Parameter)
    if not all(type(t) in plain for t in tensors if isinstance(t, torch.Tensor)):
        return False  # (a fake or functional tensor among them)
    return detect_fake_mode(()) is None  # the fake mode of a tracing context


def is_recomputation_stop(error: BaseException) -> bool:
    """Whether ``error`` is how ``torch.utils.checkpoint`` (non-reentrant) ends a recomputation
    early, once it has what its backward needs: no failure of the code it stops in."""
    checkpoint = sys.modules.get("torch.utils.checkpoint")  # (not imported: not its error)
    stop = getattr(checkpoint, "_StopRecomputationError", None)
    return stop is not None and isinstance(error, stop)


def saved_tensors_hooks_active() -> bool:
    """Whether ``torch.autograd.graph.saved_tensors_hooks`` are in force: ``torch.utils.checkpoint``
    (which holds a recomputation to save what its forward saved), activation offloading."""
    hooks = torch._C._autograd._top_saved_tensors_default_hooks  # pyright: ignore[reportAttributeAccessIssue]
    return hooks(False) is not None


def untraced() -> bool:
    """Whether the caller runs as plain Python on tensors: no torch.compile, torch.export,
    torch.jit trace, dispatch mode (make_fx's proxies, fake tensors) or torch.func transform."""
    return not (
        _context.compiling()
        or _is_tracing()
        or _dispatch_stack_depth()
        or _functorch_transforms_active()
    )


# (the C functions that torch.jit.is_tracing, _get_current_dispatch_mode and torch.func's
# transforms read, called at once: untraced() runs before every converted `while`)
_is_tracing = torch._C._is_tracing  # pyright: ignore[reportAttributeAccessIssue]
_dispatch_stack_depth = torch._C._len_torch_dispatch_stack  # pyright: ignore[reportAttributeAccessIssue]
_functorch_transforms_active = torch._C._are_functorch_transforms_active  # pyright: ignore[reportAttributeAccessIssue]


def functorch_transforms_active() -> bool:
    """Whether a ``torch.func`` transform (``vmap``, ``grad``) runs the caller: its tensors are
    wrapped, and a step traced from them would trace the wrapping."""
    return bool(torch._C._are_functorch_transforms_active())


def trace_on_fake(fn: Any, inputs: list[torch.Tensor]) -> torch.fx.GraphModule:
    """``fn(*inputs)`` traced into a graph of ATen operations on fake tensors made from
    ``inputs``; the real tensors ``fn`` captures become ``get_attr`` nodes of the graph, whose
    attributes are those very tensors."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils._python_dispatch import _disable_current_modes

    # (the dispatch modes around the call, such as selective checkpointing's, which records the
    # operators it sees to replay them, do not see the trace's operators on fake tensors)
    with _disable_current_modes():
        return make_fx(fn, tracing_mode="fake", _allow_non_fake_inputs=True)(*inputs)


def map_over(
    fn: Any, batched: list[tuple[torch.Tensor, int]], others: list[Any]
) -> list[torch.Tensor]:
    """``torch.func.vmap(fn, in_dims=(*dims, *[None] * len(others)))(*tensors, *others)`` for
    ``batched = [(tensor, dim), ...]`` and a ``fn`` that returns a list of tensors, stacked on
    axis 0: what ``vmap`` does, without the bookkeeping of its pytrees (tens of microseconds a
    call)."""
    from torch._C._functorch import _add_batch_dim, _remove_batch_dim
    from torch._functorch.vmap import vmap_increment_nesting

    size = batched[0][0].shape[batched[0][1]]
    with vmap_increment_nesting(size, "error") as level:
        outputs = fn(*(_add_batch_dim(t, d, level) for t, d in batched), *others)
        return [_remove_batch_dim(out, level, size, 0) for out in outputs]


TREE_SPEC_TYPES: tuple[type, ...] = (pytree.TreeSpec, cxx_pytree.PyTreeSpec)
"""The structures of flattened pytrees, immutable and compared by value."""


def torch_function_of(op: OpOverload) -> Any:
    """The function of the ``torch`` namespace that the overload packet of ``op`` names
    (``torch.mm`` for ``aten.mm.default``), or ``None``: called at less cost than ``op``, and
    resolving the same overload from the same arguments. For an in-place operation
    (``aten.add_.Tensor``), the method of the tensor it changes (``Tensor.add_``)."""
    name = op.overloadpacket.__name__
    # torch._C's stub leaves out _VariableFunctions, the functions of the torch namespace
    function = getattr(torch._C._VariableFunctions, name, None)  # pyright: ignore[reportAttributeAccessIssue]
    if function is None and name.endswith("_"):
        function = getattr(torch._C.TensorBase, name, None)
    return function


def shape_env() -> Any:
    """A new ``ShapeEnv``: the symbolic sizes of a fake-tensor mode."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    return ShapeEnv()


def lower_bound(size: Any) -> Any:
    """The smallest value a size can take under the ranges its shape environment gives its
    symbols (an int for a plain int; ``-int_oo`` where nothing is known). Unlike
    ``statically_known_true``, this does not assume that sizes are at least 2."""
    if isinstance(size, int):
        return size
    from torch.utils._sympy.value_ranges import bound_sympy

    node = size.node
    return bound_sympy(node.expr, node.shape_env.var_to_range).lower


def symbolic_symbols(tracer: Any) -> dict[Any, Any]:
    """The symbolic sizes a proxy tracer has seen, by sympy expression (empty if none)."""
    return getattr(tracer, "sympy_expr_tracker", {})


def onnx_core() -> ModuleType:
    """torch.onnx's exporter core: ``current_tracer`` (the recorder of the graph being built)
    and ``onnxscript_apis`` (the version conversion and optimization it calls)."""
    return importlib.import_module(ONNX_EXPORTER_MODULE)


def onnx_program() -> ModuleType:
    """torch.onnx's ``ONNXProgram`` module, which reads ``onnxscript_apis`` too."""
    return importlib.import_module("torch.onnx._internal.exporter._onnx_program")


def onnx_dispatching() -> ModuleType:
    """torch.onnx's choice of a translation for a node: ``dispatch``, which the exporter core
    calls through the module."""
    return importlib.import_module("torch.onnx._internal.exporter._dispatching")


def onnx_default_opset() -> int:
    """The opset ``torch.onnx.export`` targets when the call names no ``opset_version``."""
    return importlib.import_module("torch.onnx._constants").ONNX_DEFAULT_OPSET


def onnx_registration() -> ModuleType:
    """torch.onnx's registry of translations: ``ONNXRegistry`` and ``OnnxDecompMeta``."""
    return importlib.import_module("torch.onnx._internal.exporter._registration")


@dataclasses.dataclass(frozen=True)
class PrivateSymbol:
    """One private symbol of torch that torchscan uses.

    ``name`` is a dotted path inside ``module`` (``ShapeEnv.create_unbacked_symint``);
    ``parameters`` are the parameters torchscan passes (by name, or by position in that order),
    ``fields`` the dataclass fields it sets, ``instance_attributes`` the attributes it reads from
    an instance made with no arguments, ``source_text`` text it expects in the module's source
    (a log message it filters); ``used_for`` says what torchscan needs it for.
    """

    module: str
    name: str
    used_for: str
    parameters: tuple[str, ...] = ()
    fields: tuple[str, ...] = ()
    instance_attributes: tuple[str, ...] = ()
    source_text: str = ""

    @property
    def qualified_name(self) -> str:
        return f"{self.module}.{self.name}"

    def resolve(self) -> Any:
        """The symbol itself; ``ImportError``/``AttributeError`` where torch no longer has it."""
        found: Any = importlib.import_module(self.module)
        for part in self.name.split("."):
            found = getattr(found, part)
        return found

    def problems(self) -> list[str]:
        """What the installed torch lacks of what torchscan expects of this symbol."""
        try:
            found = self.resolve()
        except (ImportError, AttributeError) as error:
            return [f"it cannot be found ({type(error).__name__}: {error})"]
        problems = []
        if self.parameters:
            try:
                names = list(inspect.signature(found).parameters)
            except (TypeError, ValueError):
                names = []
            missing = [p for p in self.parameters if p not in names]
            if missing:
                problems.append(f"it has no parameter {', '.join(missing)} (it takes {names})")
            elif [n for n in names if n in self.parameters] != list(self.parameters):
                problems.append(f"its parameters {list(self.parameters)} come in another order")
        if self.fields:
            names = [f.name for f in dataclasses.fields(found)]
            missing = [f for f in self.fields if f not in names]
            if missing:
                problems.append(f"it has no field {', '.join(missing)} (it has {names})")
        for attribute in self.instance_attributes:
            if not hasattr(found(), attribute):
                problems.append(f"its instances have no attribute {attribute!r}")
        if self.source_text and self.source_text not in inspect.getsource(
            importlib.import_module(self.module)
        ):
            problems.append(f"its module no longer says {self.source_text!r}")
        return problems


_HOP_UTILS = "torch._higher_order_ops.utils"
_PROXY = "torch.fx.experimental.proxy_tensor"
_ONNX = "torch.onnx._internal.exporter"

PRIVATE_API: tuple[PrivateSymbol, ...] = (
    PrivateSymbol(
        "torch.onnx._constants",
        "ONNX_DEFAULT_OPSET",
        "know the opset an export targets when the call names none",
    ),
    # sizes
    PrivateSymbol(
        "torch.utils._sympy.value_ranges",
        "bound_sympy",
        "the smallest length of a scan, from the ranges of the exported program's sizes",
        ("expr", "ranges"),
    ),
    # autograd
    PrivateSymbol(
        "torch._C._autograd",
        "_top_saved_tensors_default_hooks",
        "whether saved-tensor hooks are in force (torch.utils.checkpoint): a scan then takes the "
        "same path in a recomputation as in its forward",
    ),
    PrivateSymbol(
        "torch.utils.checkpoint",
        "_StopRecomputationError",
        "let torch.utils.checkpoint end a recomputation early through a converted loop (it is no "
        "failure of the step, after which the loop would run again as Python)",
    ),
    # torch.compile
    PrivateSymbol(
        "torch._higher_order_ops.scan",
        "scan",
        "a scan compiled by torch.compile as one loop",
        ("combine_fn", "init", "xs", "dim", "reverse"),
    ),
    PrivateSymbol(
        "torch._dynamo.decorators",
        "assume_constant_result",
        "refuse torch.export's strict mode with torchscan's own error (its mark, "
        "DYNAMO_CONSTANT_MARK, is set without importing TorchDynamo)",
        ("fn",),
        source_text="fn._dynamo_marked_constant = True",
    ),
    PrivateSymbol(
        "torch._guards",
        "TracingContext.try_get",
        "the shape environment of a program torch.compile traces, and whether it traces one",
    ),
    PrivateSymbol(
        "torch.fx.experimental.symbolic_shapes",
        "ShapeEnvSettings",
        "let a compiled loop operator read its step counter (allow_scalar_outputs)",
        fields=("allow_scalar_outputs",),
    ),
    PrivateSymbol(
        "torch.fx.experimental.symbolic_shapes",
        "ShapeEnv",
        "let a compiled loop operator read its step counter (allow_scalar_outputs)",
        instance_attributes=("settings",),
    ),
    PrivateSymbol(
        "torch._dynamo.eval_frame",
        "skip_code",
        "find a graph break in the first step of a compiled scan",
        ("code",),
    ),
    PrivateSymbol(
        "torch._dynamo.symbolic_convert",
        "InstructionTranslator.current_tx",
        "read the graph of a compiled scan's first step: the changes in place it makes",
    ),
    PrivateSymbol(
        "torch._dynamo.decorators",
        "graph_break",
        "run the first step of a compiled scan that changes an argument in place eagerly, where "
        "it is checked",
        ("msg",),
    ),
    PrivateSymbol(
        "torch._functorch.config",
        "donated_buffer",
        "turned off while torch.compile compiles a scan that records gradients (before 2.15)",
    ),
    PrivateSymbol(
        "torch._dynamo.callback",
        "callback_handler.register_end_callback",
        "put back the settings a compilation changed when it ends",
        ("callback",),
    ),
    PrivateSymbol(
        "torch._inductor.config",
        "size_asserts",
        "left out of the code of a compilation that makes a loop operator",
    ),
    PrivateSymbol(
        "torch._dynamo.callback",
        "CompilationCallbackHandler",
        "whether that callback is registered (torch._dynamo.reset() clears them)",
        fields=("end_callbacks",),
    ),
    PrivateSymbol(
        "torch._inductor.config",
        "pre_grad_custom_pass",
        "the pass that hoists the work of compiled scans out of their loop operators",
    ),
    PrivateSymbol(
        "torch._inductor.custom_graph_pass",
        "CustomGraphPass",
        "that pass, with the identity Inductor's cache of compiled graphs reads",
    ),
    PrivateSymbol(
        "torch._inductor.custom_graph_pass",
        "get_hash_for_files",
        "the identity of that pass: the hash of its source file",
        ("paths",),
    ),
    PrivateSymbol(
        "torch._inductor.custom_graph_pass",
        "get_custom_graph_passes",
        "run the user's own pre-grad passes after it",
        ("custom_pass",),
    ),
    # hoisting
    PrivateSymbol(
        "torch._C",
        "_are_functorch_transforms_active",
        "leave a step that a torch.func transform runs unhoisted",
    ),
    PrivateSymbol("torch._C", "_is_tracing", "run a converted `while` as written when untraced"),
    PrivateSymbol(
        "torch._C",
        "_len_torch_dispatch_stack",
        "run a converted `while` as written when no dispatch mode traces it",
    ),
    PrivateSymbol(
        _PROXY,
        "make_fx",
        "trace a step once to hoist what does not depend on its carry",
        ("f", "tracing_mode", "_allow_non_fake_inputs"),
    ),
    PrivateSymbol(
        "torch._C",
        "_VariableFunctions",
        "call a hoisted step's operations as the torch functions they are",
    ),
    PrivateSymbol(
        "torch._C",
        "TensorBase",
        "call a hoisted step's in-place operations as the tensor methods they are",
    ),
    PrivateSymbol("torch.utils._pytree", "TreeSpec", "compare captured pytree structures"),
    PrivateSymbol(
        "torch._functorch.vmap",
        "vmap_increment_nesting",
        "run a hoisted step's sequence part over every step at once",
        ("batch_size", "randomness"),
    ),
    PrivateSymbol(
        "torch._C._functorch",
        "_add_batch_dim",
        "run a hoisted step's sequence part over every step at once",
    ),
    PrivateSymbol(
        "torch._C._functorch",
        "_remove_batch_dim",
        "run a hoisted step's sequence part over every step at once",
    ),
    PrivateSymbol(
        "torch._ops",
        "OpOverload",
        "follow the views of a tensor a hoisted step writes into (OpOverload.is_view, an "
        "instance attribute)",
        source_text="self.is_view = ",
    ),
    # pytrees
    PrivateSymbol("torch.utils._cxx_pytree", "tree_flatten", "flatten pytrees fast", ("tree",)),
    PrivateSymbol(
        "torch.utils._cxx_pytree", "tree_unflatten", "rebuild pytrees", ("leaves", "treespec")
    ),
    PrivateSymbol("torch.utils._cxx_pytree", "tree_leaves", "leaves of pytrees", ("tree",)),
    PrivateSymbol("torch.utils._cxx_pytree", "tree_structure", "structure of ys", ("tree",)),
    PrivateSymbol(
        "torch.utils._cxx_pytree", "tree_map", "map over pytrees", ("func", "tree", "is_leaf")
    ),
    PrivateSymbol("torch.utils._pytree", "keystr", "name leaves in errors", ("kp",)),
    PrivateSymbol(
        "torch.utils._pytree", "tree_flatten_with_path", "name leaves in errors", ("tree",)
    ),
    PrivateSymbol("torch.utils._pytree", "tree_map", "unwrap proxies of an operator's arguments"),
    # higher-order operators
    PrivateSymbol("torch._ops", "HigherOrderOperator", "torchscan's operators", ("name",)),
    PrivateSymbol("torch._ops", "HigherOrderOperator.py_impl", "register implementations", ("k",)),
    PrivateSymbol(
        "torch._ops",
        "HigherOrderOperator.py_functionalize_impl",
        "register functionalization",
        ("fn",),
    ),
    PrivateSymbol("torch._C", "DispatchKey.CompositeExplicitAutograd", "the dense kernels"),
    PrivateSymbol("torch._C", "DispatchKey.Autograd", "the autograd kernels"),
    PrivateSymbol(
        _HOP_UTILS, "_maybe_run_with_interpreter", "functionalize a traced body", ("fn",)
    ),
    PrivateSymbol(
        _HOP_UTILS,
        "autograd_not_implemented",
        "the autograd kernel of the traced operators",
        ("op", "deferred_error"),
    ),
    PrivateSymbol(
        "torch._ops",
        "OpOverload",
        "refuse bodies that write into their inputs: the arguments an operator's schema "
        "(OpOverload._schema, an instance attribute) marks as written",
        source_text="self._schema = schema",
    ),
    PrivateSymbol(
        "torch._ops",
        "OpOverload.overloadpacket",
        "refuse bodies that write into their inputs, but for shape-only changes of views",
    ),
    PrivateSymbol(_HOP_UTILS, "reenter_make_fx", "trace a body into a subgraph", ("fn",)),
    PrivateSymbol(_HOP_UTILS, "register_fake", "the fake kernels", ("hop", "fn", "skip_cache")),
    PrivateSymbol(
        _HOP_UTILS, "unique_graph_id", "name a body's subgraph", ("proxy_mode", "prefix")
    ),
    # tracing
    PrivateSymbol(_PROXY, "ProxyTorchDispatchMode", "the tracing kernels", ("tracer",)),
    PrivateSymbol(_PROXY, "disable_proxy_modes_tracing", "run code outside the trace"),
    PrivateSymbol(
        _PROXY,
        "track_tensor_tree",
        "record an operator's outputs",
        ("inner_res", "proxy_res", "constant", "tracer"),
    ),
    PrivateSymbol(_PROXY, "PythonKeyTracer.unwrap_proxy", "record an operator's inputs", ("e",)),
    PrivateSymbol(
        _PROXY,
        "PythonKeyTracer",
        "offer a body the sizes of the outer graph",
        instance_attributes=("sympy_expr_tracker",),
    ),
    # fake tensors and symbolic sizes
    PrivateSymbol("torch._guards", "detect_fake_mode", "the fake mode of a trace", ("inputs",)),
    PrivateSymbol(
        "torch.utils._python_dispatch",
        "TorchDispatchMode",
        "watch, in the first run of a checkpointed segment, for a write into a result that "
        "checkpoint's save= keeps (selective checkpointing misses writes through unsafe_chunk)",
    ),
    PrivateSymbol(
        "torch.utils._python_dispatch",
        "_disable_current_modes",
        "trace a step on fake tensors unseen by the dispatch modes around it",
    ),
    PrivateSymbol(
        "torch.utils._python_dispatch",
        "_get_current_dispatch_mode",
        "train an exported program's loops eagerly, never while they are traced",
    ),
    PrivateSymbol(
        "torch._subclasses.fake_tensor",
        "FakeTensorMode",
        "learn the shapes of ys when no step runs",
        ("allow_non_fake_inputs", "shape_env", "static_shapes"),
    ),
    PrivateSymbol(
        "torch._subclasses.fake_tensor", "FakeTensorMode.from_tensor", "fake inputs", ("tensor",)
    ),
    PrivateSymbol(
        "torch._subclasses.fake_tensor", "FakeTensor", "leave the values of fake lengths unread"
    ),
    PrivateSymbol("torch.fx.experimental.symbolic_shapes", "ShapeEnv", "symbolic sizes"),
    PrivateSymbol(
        "torch.fx.experimental.symbolic_shapes",
        "statically_known_true",
        "unroll a compiled loop where its length is known",
    ),
    PrivateSymbol(
        "torch.fx.experimental.symbolic_shapes",
        "ShapeEnv.ignore_fresh_unbacked_symbols",
        "keep sizes read inside a body to the body",
    ),
    PrivateSymbol(
        "torch.fx.experimental.symbolic_shapes",
        "ShapeEnv.create_unbacked_symint",
        "the length of a loop that may stop early",
    ),
    PrivateSymbol(
        "torch.fx.experimental.symbolic_shapes",
        "GuardOnDataDependentSymNode",
        "name the line of a step that reads a tensor's value in Python",
    ),
    PrivateSymbol(
        "torch._dynamo.exc",
        "UncapturedHigherOrderOpError",
        "name the line of a torch.cond in a step whose branches TorchDynamo could not trace",
    ),
    PrivateSymbol(
        "torch._dynamo.exc",
        "UserError",
        "name the If of an imported model whose branches torch.cond cannot trace",
    ),
    PrivateSymbol(
        "torch.fx.proxy",
        "_register_stack_trace_anchor",
        "keep the lines of step functions in the stack traces of exported nodes",
        ("fn",),
    ),
    PrivateSymbol(
        "torch._export.non_strict_utils",
        "_NonStrictTorchFunctionHandler._override",
        "index with the step number inside a traced body",
        ("func", "args", "kwargs"),
    ),
    # torch.onnx
    PrivateSymbol(f"{_ONNX}._core", "current_tracer", "the recorder translations append to"),
    PrivateSymbol(
        f"{_ONNX}._core",
        "onnxscript_apis.convert_version",
        "convert below opset 18",
        ("model", "target_version"),
    ),
    PrivateSymbol(f"{_ONNX}._core", "onnxscript_apis.optimize", "optimize once", ("model",)),
    PrivateSymbol(f"{_ONNX}._onnx_program", "onnxscript_apis", "the same entry points"),
    PrivateSymbol(
        f"{_ONNX}._dispatching",
        "dispatch",
        "name the step function and line of an operator torch.onnx cannot translate",
        ("node", "registry"),
    ),
    PrivateSymbol(
        f"{_ONNX}._core",
        "_dispatching",
        "the module through which the exporter core calls dispatch",
    ),
    PrivateSymbol(
        f"{_ONNX}._registration",
        "ONNXRegistry.get_decomps",
        "answer the lookup of translations for torchscan's operators",
        ("self", "target"),
    ),
    PrivateSymbol(
        f"{_ONNX}._registration",
        "OnnxDecompMeta",
        "describe torchscan's translations",
        fields=("onnx_function", "fx_target", "signature", "is_custom", "skip_signature_inference"),
    ),
    PrivateSymbol(
        UNFOUND_USER_CODE_WARNING[0],
        "log",
        "silence the warning of a step that reads tensor values, called on fake tensors",
        source_text=UNFOUND_USER_CODE_WARNING[1],
    ),
    PrivateSymbol(
        ONNX_SIGNATURE_WARNING[0],
        "logger",
        "silence the warning that torchscan's translations take no ONNX signature",
        source_text=ONNX_SIGNATURE_WARNING[1],
    ),
)
"""Every private symbol of torch that torchscan uses, with what it relies on."""


@dataclasses.dataclass(frozen=True)
class TextDependency:
    """Text that torch writes and torchscan reads: a message, or the layout of the frames or
    stack traces it records. No signature check can see such a change, so each one is produced
    from the installed torch by a test of its own (``tests/test_compat.py``, keyed by ``key``),
    which fails naming this entry where torch words it otherwise.

    ``source`` is where torch writes it, ``text`` what torchscan relies on, ``reader`` the
    function of torchscan that reads it and ``used_for`` what for."""

    key: str
    source: str
    text: str
    reader: str
    used_for: str


TEXT_DEPENDENCIES: tuple[TextDependency, ...] = (
    TextDependency(
        "stack-trace-frames",
        "torch.fx.Node.meta['stack_trace'], recorded by torch.export",
        'one line per frame, File "<file>", line <line>, in <function>, innermost last',
        "torchscan._traced._step_errors.where",
        "name the line of the step function that made a node torch.onnx cannot translate",
    ),
    TextDependency(
        "data-dependent-frames",
        "torch.fx.experimental.symbolic_shapes.GuardOnDataDependentSymNode, raised by a guard",
        "its traceback holds the user's frame that read the value, torch's frames after it",
        "torchscan._traced._step_errors.data_dependent",
        "name the line of a step that reads a tensor's value in Python while exported",
    ),
    TextDependency(
        "uncaptured-hop-name",
        "torch._dynamo.exc.UncapturedHigherOrderOpError",
        "its message holds 'Higher Order Operator: torch.cond'",
        "torchscan._traced._step_errors.uncaptured_cond",
        "tell a torch.cond whose branches TorchDynamo could not trace from other operators",
    ),
    TextDependency(
        "linalg-check-api",
        "torch.ops.higher_order.with_effects(token, aten._linalg_check_errors, info, api, ...)",
        "the node's args[3] is the function the user called ('linalg.inv' or 'torch.linalg.inv')",
        "torchscan._traced._step_errors.refuse_side_effects",
        "name the linear-algebra function whose error check cannot be exported in a loop",
    ),
    TextDependency(
        "vmap-control-flow",
        "torch.func.vmap, bool() of a batched tensor (C++)",
        VMAP_CONTROL_FLOW_ERROR,
        "torchscan._steps",
        "refuse a loop that stops with until under vmap, with a remedy",
    ),
    TextDependency(
        "onnx-signature-warning",
        ONNX_SIGNATURE_WARNING[0],
        ONNX_SIGNATURE_WARNING[1],
        "torchscan.onnx._export._hooks._drop_signature_warning",
        "silence the warning that torchscan's translations take no ONNX signature",
    ),
    TextDependency(
        "onnx-converter-assertion",
        "onnx.version_converter.convert_version, an adapter's failed assertion (C++)",
        ONNX_CONVERTER_ASSERTION,
        "torchscan.onnx._export._convert._context.Context.run_onnx_adapter",
        "say why onnx's own adapter refuses a node, in the refusal that names the node",
    ),
    TextDependency(
        "unfound-user-code-warning",
        UNFOUND_USER_CODE_WARNING[0],
        UNFOUND_USER_CODE_WARNING[1],
        "torchscan._outputs",
        "silence the warning of a step that reads tensor values, called on fake tensors",
    ),
)
"""Every message and frame layout of torch that torchscan reads, with what it relies on."""

_REFERENCE = "onnx.reference"

ONNX_REFERENCE_API: tuple[PrivateSymbol, ...] = (
    PrivateSymbol(
        f"{_REFERENCE}.op_run",
        "OpRun",
        "write operators for the check's reference evaluator (new_ops=)",
        source_text="def need_context",
    ),
    PrivateSymbol(
        f"{_REFERENCE}.op_run",
        "OpRun._load_attributes",
        "run the body of a Scan or Loop (the method _run_body that it makes for a graph "
        "attribute) with the enclosing graph's values",
        source_text='f"_run_{att.name}"',
    ),
    PrivateSymbol(
        f"{_REFERENCE}.op_run",
        "OpRun",
        "read the evaluator's opsets (run_params['opsets']) to run Scan-8 as Scan-8",
        source_text="self.run_params",
    ),
    PrivateSymbol(
        f"{_REFERENCE}.ops.op_loop",
        "Loop._run",
        "run Loop as the specification does (a subclass replaces _run)",
        ("self", "M", "cond", "context", "attributes"),
    ),
    PrivateSymbol(
        f"{_REFERENCE}.ops.op_loop",
        "Loop",
        "read the numbers of carried values and scan outputs of a Loop (self.N, self.K)",
        source_text="self.K",
    ),
    PrivateSymbol(
        f"{_REFERENCE}.ops.op_reduce_log_sum_exp",
        "ReduceLogSumExp_18",
        "give a row of -inf the ReduceLogSumExp of -inf",
    ),
    PrivateSymbol(
        f"{_REFERENCE}.ops.op_gather_elements",
        "GatherElements._run",
        "run GatherElements along every axis",
        ("self", "data", "indices", "axis"),
    ),
    PrivateSymbol(
        f"{_REFERENCE}.ops.op_scatter_elements",
        "ScatterElements._run",
        "run Scatter (opsets 9 and 10) as ScatterElements",
        ("self", "data", "indices", "updates", "axis"),
    ),
)
"""The internals of onnx's reference evaluator that the check tool builds on (its operators are
subclasses of ``OpRun``), checked against the installed onnx like :data:`PRIVATE_API`."""
