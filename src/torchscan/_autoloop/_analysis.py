"""What a Python ``for`` loop does with names: which it carries from step to step, which lists
it appends a value to at every step, and what in it keeps it a Python loop.

A loop's *carries* are the names its body assigns that are read before the body assigns them
(upward-exposed: the value comes from the step before) or read anywhere in the function outside
the loop (live after it); names the body assigns and reads only after assigning them are the
step's own. This over-approximates liveness (a name read before the loop, but not after it, is
carried too), which costs nothing where the name is bound before the loop and is refused at run
time where it is not; it never under-approximates, which would drop a value.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterable, Sequence

from torchscan._autoloop._lists import (
    _last_binding_before,
    _names_only,
    appended_lists,
    fresh_lists,
)
from torchscan._autoloop._names import (
    _COMPREHENSIONS,
    _call,
    _is_call,
    _stored,
    exposed_reads,
    names_assigned,
    names_loaded,
)

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)

SIZE_FUNCTIONS = frozenset({"len", "numel", "size", "dim"})


@dataclasses.dataclass(frozen=True)
class LoopForm:
    """What a ``for`` statement iterates over.

    ``kind`` is ``"range"`` (``range(...)`` or ``reversed(range(...))``, ``reverse`` set for the
    latter), ``"iterable"`` (anything else: a tensor's rows, ``x.unbind(d)``, ``zip`` and
    ``enumerate`` of those, decided at run time). ``sized`` says whether a range's bounds are
    taken from a tensor's size (a time loop) rather than from Python numbers (layers, heads).
    """

    kind: str  # "range", "iterable" or "while"
    reverse: bool = False
    sized: bool = False
    lengths: tuple[ast.expr, ...] = ()  # of len(...) in a range's bounds: sized where tensors
    bound: ast.Assign | None = None  # `name = range(...)` before `for t in name:`


@dataclasses.dataclass(frozen=True)
class BufferWrite:
    """A statement of a loop's body that writes into a tensor made before the loop at the step
    number (``out[:, t] = v``, ``out[t] += v``): ``carried`` where the body also reads the
    tensor (the whole tensor is then a carry), else its values are the scan's outputs, written
    into it after the loop."""

    name: str
    axis: int
    stmt: ast.stmt = dataclasses.field(compare=False, repr=False)
    carried: bool = False
    rest: tuple[ast.expr, ...] = dataclasses.field(default=(), compare=False, repr=False)
    """The indices after the step number (``out[t, :, k]``: ``:, k``)."""


@dataclasses.dataclass(frozen=True)
class StepTest:
    """A test of the step number against a value the loop does not change (``if t == 0:``,
    ``h = a if t < n - 1 else b``): ``op`` as the comparison reads with the step number on the
    left (``"lt"``), ``other`` the value compared with, ``node`` the test itself."""

    op: str
    other: ast.expr = dataclasses.field(compare=False, repr=False)
    node: ast.expr = dataclasses.field(compare=False, repr=False)


_COMPARISONS = {
    ast.Eq: ("eq", "eq"), ast.NotEq: ("ne", "ne"), ast.Lt: ("lt", "gt"), ast.LtE: ("le", "ge"),
    ast.Gt: ("gt", "lt"), ast.GtE: ("ge", "le"),
}  # fmt: skip
"""Each comparison operator's name, and its name with its sides swapped."""


def step_tests(body: Sequence[ast.stmt], index: str, assigned: set[str]) -> list[StepTest]:
    """The tests of ``if`` statements and conditional expressions of ``body`` that compare the
    step number ``index`` with a value the body does not assign."""
    found = []
    for stmt in body:
        for node in _walk_own_scope(stmt):
            if not isinstance(node, (ast.If, ast.IfExp)):
                continue
            test = node.test
            if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
                continue
            left, right = test.left, test.comparators[0]
            names = _COMPARISONS.get(type(test.ops[0]))
            if names is None:
                continue
            if isinstance(left, ast.Name) and left.id == index:
                op, other = names[0], right
            elif isinstance(right, ast.Name) and right.id == index:
                op, other = names[1], left
            else:
                continue
            if names_loaded([other]) & (assigned | {index}):
                continue
            found.append(StepTest(op, other, test))
    return found


@dataclasses.dataclass(frozen=True)
class LoopInfo:
    """The analysis of one ``for`` statement."""

    node: ast.For | ast.While
    form: LoopForm
    targets: tuple[str, ...]
    carries: tuple[str, ...]
    lists: tuple[str, ...]
    reason: str  # why the loop stays Python ("" where it converts)
    stop: int | None = None  # the index in the body of its `if ...: break`, where it has one
    skip: int | None = None  # the index of its `if ...: continue` (where it has no break)
    buffers: tuple[BufferWrite, ...] = ()  # tensors written at the step number
    augmented: tuple[str, ...] = ()  # carries the body changes only with `name += ...`
    tests: tuple[StepTest, ...] = ()  # tests of the step number (`if t == 0:`)
    dead: tuple[ast.stmt, ...] = ()  # updates of counters nothing reads (`n_iter += 1`)


def loop_form(node: ast.For, sized_names: set[str], shadowed: set[str]) -> LoopForm:
    """How ``node`` iterates: a range (and whether from a tensor's size) or an iterable (also
    a range where ``range``, ``reversed`` or ``len`` is not the builtin, in ``shadowed``)."""
    if shadowed & {"range", "reversed", "len"}:
        return LoopForm("iterable")
    it = _call(node.iter, "reversed")
    reverse = it is not None and len(it.args) == 1 and _call(it.args[0], "range") is not None
    it = _call(it.args[0] if reverse and it is not None else node.iter, "range")
    if it is not None and 1 <= len(it.args) <= 3 and not it.keywords:
        return LoopForm("range", reverse, is_sized_range(it, sized_names), range_lengths(it))
    return LoopForm("iterable")


def range_lengths(call: ast.Call) -> tuple[ast.expr, ...]:
    """The arguments of the ``len(...)`` calls in the bounds of ``range(...)``."""
    bounds = call.args[:2] if len(call.args) > 1 else call.args
    return tuple(
        found.args[0]
        for a in bounds
        for sub in ast.walk(a)
        if (found := _call(sub, "len")) is not None and len(found.args) == 1
    )


def is_sized_range(call: ast.Call, sized_names: set[str]) -> bool:
    bounds = call.args[:2] if len(call.args) > 1 else call.args
    return any(is_sized(a, sized_names) for a in bounds)


def bound_range(
    function: ast.FunctionDef, loop: ast.For, sized_names: set[str], shadowed: set[str]
) -> LoopForm | None:
    """The form of ``for t in name:`` where ``name`` is bound once, before the loop, to a
    range (``name = range(n)``, or ``range(n) if forward else range(n - 1, -1, -1)``) and read
    nowhere else: a range loop, whose ``range`` calls the conversion makes the runtime's."""
    if not isinstance(loop.iter, ast.Name) or "range" in shadowed:
        return None
    name = loop.iter.id
    uses = [n for n in ast.walk(function) if isinstance(n, ast.Name) and n.id == name]
    if len(uses) != 2 or any(isinstance(n.ctx, ast.Del) for n in uses):
        return None  # bound once and read by the loop's header only
    bindings = [
        s
        for s in ast.walk(function)
        if isinstance(s, ast.Assign)
        and len(s.targets) == 1
        and isinstance(s.targets[0], ast.Name)
        and s.targets[0].id == name
    ]
    if len(bindings) != 1:
        return None
    binding = bindings[0]
    if _last_binding_before(function.body, loop, name) is not binding.value:
        return None
    calls = range_calls(binding.value)
    if not calls:
        return None
    sized = any(is_sized_range(c, sized_names) for c in calls)
    lengths = tuple(a for c in calls for a in range_lengths(c))
    return LoopForm("range", False, sized, lengths, binding)


def range_calls(value: ast.expr) -> list[ast.Call]:
    """The ``range(...)`` calls ``value`` is made of (``range(...)``, or a conditional
    expression of those), else none."""
    if isinstance(value, ast.IfExp):
        body, orelse = range_calls(value.body), range_calls(value.orelse)
        return [*body, *orelse] if body and orelse else []
    call = _call(value, "range")
    if call is not None and 1 <= len(call.args) <= 3 and not call.keywords:
        return [call]
    return []


def is_sized(node: ast.AST, sized_names: set[str]) -> bool:
    """Whether an expression takes a value from a tensor's size: ``x.shape[0]``, ``x.size(1)``,
    or a name assigned from one of those or from ``len`` (``T = x.size(0)``, ``T, B, _ =
    x.shape``, ``T = len(x)``); ``len`` in a range's own bounds is judged when the loop runs."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr in ("shape", "size"):
            return True
        if isinstance(sub, ast.Name) and sub.id in sized_names:
            return True
    return False


def sized_names(function: ast.FunctionDef) -> set[str]:
    """The names the function assigns from a tensor's size (to a fixed point: ``n = T - 1``
    after ``T = x.size(0)``)."""
    found: set[str] = set()
    assignments = [n for n in ast.walk(function) if isinstance(n, ast.Assign)]
    changed = True
    while changed:
        changed = False
        for node in assignments:
            if is_sized(node.value, found) or any(
                _is_call(sub, "len") for sub in ast.walk(node.value)
            ):
                for target in node.targets:
                    new = _stored(target) - found
                    if new:
                        found |= new
                        changed = True
    return found


@dataclasses.dataclass
class _Refusal:
    line: int
    what: str


def _refusal(
    body: Sequence[ast.stmt],
    carries: set[str],
    free: set[str],
    stop: ast.stmt | None = None,
    buffers: Sequence[BufferWrite] = (),
    augmented: frozenset[str] = frozenset(),
) -> _Refusal | None:
    """The first construct of the loop's body that keeps it a Python loop (``stop``: the
    ``if ...: break`` that ends it, ``buffers``: the writes at the step number, which
    convert)."""
    for stmt in body:
        if any(stmt is b.stmt for b in buffers):
            continue
        for node in _walk_own_scope(stmt):
            line = getattr(node, "lineno", stmt.lineno)
            allowed = isinstance(stop, ast.If) and node is stop.body[0]
            if isinstance(node, ast.Break) and not allowed:
                return _Refusal(
                    line,
                    "`break` leaves the loop early, other than as a statement `if condition: "
                    "break` of the loop's own body with nothing else in the `if`",
                )
            if isinstance(node, ast.Continue) and not allowed:
                return _Refusal(
                    line,
                    "`continue` skips the rest of a step, other than as a statement `if "
                    "condition: continue` of the loop's own body with nothing else in the `if`",
                )
            if isinstance(node, ast.Return):
                return _Refusal(line, "`return` inside the loop")
            if isinstance(node, (ast.Yield, ast.YieldFrom, ast.Await)):
                return _Refusal(line, "a `yield` or `await` inside the loop")
            if isinstance(node, (ast.Global, ast.Nonlocal)):
                return _Refusal(line, f"`{type(node).__name__.lower()}` inside the loop")
            if isinstance(node, ast.Delete):
                return _Refusal(line, "`del` inside the loop")
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for sub in ast.walk(target):
                        if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store):
                            return _Refusal(
                                line,
                                f"it sets the attribute `{ast.unparse(sub)}` (state kept "
                                "outside the loop's variables)",
                            )
                        if isinstance(sub, ast.Subscript) and isinstance(sub.ctx, ast.Store):
                            return _Refusal(
                                line,
                                f"it writes into `{ast.unparse(sub.value)}` at an index "
                                f"(`{ast.unparse(sub)} = ...`)",
                            )
                if isinstance(node, ast.AugAssign):
                    name = ast.unparse(node.target)
                    if name in carries and name not in augmented:
                        return _Refusal(
                            line,
                            f"`{ast.unparse(node)}` changes the carried `{name}` in place "
                            f"(where it is a tensor, the one the loop started from too), and the "
                            f"step also binds `{name}` to another value: write "
                            f"`{name} = {name} {_OPERATORS.get(type(node.op), '+')} ...`",
                        )
            if isinstance(node, ast.Call):
                for keyword in node.keywords:
                    if keyword.arg == "out":
                        return _Refusal(line, "an `out=` argument writes into a tensor")
                drawn = _python_random(node.func)
                if drawn:
                    return _Refusal(
                        line,
                        f"`{ast.unparse(node)}` draws a number with Python's {drawn}, once when "
                        "torch traces the step for all steps: draw it with torch "
                        "(torch.rand(()) < p)",
                    )
                func = node.func
                if (
                    isinstance(func, ast.Attribute)
                    and func.attr in _CONTAINER_CHANGES
                    and isinstance(func.value, ast.Name)
                    and func.value.id in free
                ):
                    return _Refusal(
                        line,
                        f"`{ast.unparse(node)}` changes `{func.value.id}`, made outside the "
                        "loop (a list becomes the scan's outputs where it is made just before "
                        "the loop, `[]` or `[y0]`, and the step appends to it once and reads it "
                        "nowhere else)",
                    )
                if (
                    isinstance(func, ast.Attribute)
                    and func.attr.endswith("_")
                    and not func.attr.endswith("__")
                ):
                    receiver = func.value
                    if not isinstance(receiver, ast.Name) or receiver.id in carries | free:
                        return _Refusal(
                            line,
                            f"`{ast.unparse(node)}` changes `{ast.unparse(receiver)}` in place",
                        )
    return None


def _python_random(func: ast.expr) -> str:
    """``random`` or ``numpy.random`` where ``func`` is one of their functions
    (``random.random``, ``np.random.rand``), else empty."""
    if not isinstance(func, ast.Attribute):
        return ""
    base = func.value
    if isinstance(base, ast.Name) and base.id == "random":
        return "random"
    if (
        isinstance(base, ast.Attribute)
        and base.attr == "random"
        and isinstance(base.value, ast.Name)
        and base.value.id in ("np", "numpy")
    ):
        return "numpy.random"
    return ""


_CONTAINER_CHANGES = frozenset(
    {"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "add",
     "discard", "popitem", "sort", "reverse"}
)  # fmt: skip

_OPERATORS = {
    ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
    ast.Pow: "**", ast.MatMult: "@", ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^",
    ast.LShift: "<<", ast.RShift: ">>",
}  # fmt: skip


def _walk_own_scope(node: ast.AST, nested_loop: bool = False) -> Iterable[ast.AST]:
    """The nodes of ``node`` that run in its scope: not those of nested functions, classes or
    lambdas; and not the ``break`` and ``continue`` of nested loops, which are theirs."""
    if nested_loop and isinstance(node, (ast.Break, ast.Continue)):
        return
    yield node
    for child in ast.iter_child_nodes(node):
        if isinstance(child, _SCOPES):
            continue
        inner = nested_loop or (
            isinstance(node, (ast.For, ast.While, ast.AsyncFor)) and isinstance(child, ast.stmt)
        )
        yield from _walk_own_scope(child, inner)


_CONSTRUCTORS = frozenset(
    {"zeros", "ones", "empty", "full", "zeros_like", "ones_like", "empty_like", "full_like",
     "new_zeros", "new_ones", "new_empty", "new_full", "clone", "randn", "rand", "tensor"}
)  # fmt: skip
"""The calls that make a new tensor, which nothing else holds: a buffer the loop writes into."""


def _fresh_tensor(value: ast.expr | None) -> bool:
    if value is None or not isinstance(value, ast.Call):
        return False
    func = value.func
    if isinstance(func, ast.Attribute) and func.attr in _CONSTRUCTORS:
        return True
    return isinstance(func, ast.Name) and func.id in _CONSTRUCTORS


def _store_key(
    target: ast.expr, index: str, assigned: set[str]
) -> tuple[str, int, tuple[ast.expr, ...]] | None:
    """``(name, axis, rest)`` where ``target`` is ``name[:, ..., t, *rest]`` (``t`` the step
    number, ``rest`` of names the body does not assign)."""
    if not isinstance(target, ast.Subscript) or not isinstance(target.value, ast.Name):
        return None
    load = ast.Subscript(target.value, target.slice, ast.Load())
    return sliced(load, index, assigned)


def buffer_writes(
    function: ast.FunctionDef, loop: ast.For, body: Sequence[ast.stmt], index: str
) -> list[BufferWrite]:
    """The statements of ``body`` (its own, not in an ``if``) that write into a tensor at the
    step number ``index``, once per step, where the tensor is made just before the loop by a
    constructor (``torch.zeros``, ``x.new_empty``, ``clone``...: nothing else holds it) and the
    body binds its name to nothing else."""
    keys: dict[str, list[tuple[ast.stmt, int, tuple[ast.expr, ...]]]] = {}
    assigned = names_assigned(body)
    for stmt in body:
        target = None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target = stmt.targets[0]
        elif isinstance(stmt, ast.AugAssign):
            target = stmt.target
        elif out_call(stmt) is not None:
            target = out_call(stmt)[1]  # type: ignore[index]
        key = _store_key(target, index, assigned) if target is not None else None
        if key is not None:
            keys.setdefault(key[0], []).append((stmt, key[1], key[2]))
    found = []
    for name, writes in keys.items():
        if len(writes) != 1 or name in assigned or name == index:
            continue
        if not _fresh_tensor(_last_binding_before(function.body, loop, name, writes=True)):
            continue
        stmt, axis, rest = writes[0]
        others = [s for s in body if s is not stmt]
        called = out_call(stmt)
        if called is not None:  # torch.f(..., out=name[t]): what the call reads besides
            call = called[0]
            value: list[ast.AST] = [*call.args, *(k.value for k in call.keywords if k.arg != "out")]
        else:
            assert isinstance(stmt, (ast.Assign, ast.AugAssign))
            value = [stmt.value]
        reads = name in names_loaded(others) or name in names_loaded(value)
        carried = reads or isinstance(stmt, ast.AugAssign)
        if called is not None and carried:
            continue  # (into a tensor the step reads: as written)
        found.append(BufferWrite(name, axis, stmt, carried, rest))
    return found


def out_call(stmt: ast.stmt) -> tuple[ast.Call, ast.Subscript] | None:
    """``(call, target)`` where ``stmt`` is ``torch.f(..., out=name[...])`` as a statement, its
    arguments written out (no ``*args`` or ``**kwargs``)."""
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return None
    call = stmt.value
    func = call.func
    while isinstance(func, ast.Attribute):
        func = func.value
    if not (isinstance(func, ast.Name) and func.id == "torch" and call.func is not func):
        return None
    if any(isinstance(a, ast.Starred) for a in call.args) or any(
        k.arg is None for k in call.keywords
    ):
        return None
    outs = [k.value for k in call.keywords if k.arg == "out"]
    if len(outs) != 1 or not isinstance(outs[0], ast.Subscript):
        return None
    return call, outs[0]


def augmented_only(body: Sequence[ast.stmt], names: Iterable[str]) -> set[str]:
    """Those of ``names`` that ``body`` binds only with augmented assignments (``name +=
    ...``): a value changed in place at every step (where it is a tensor), never replaced."""
    augmented: set[str] = set()
    plain: set[str] = set()
    for stmt in body:
        plain |= {
            n.name
            for n in ast.walk(stmt)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        }
        for node in _walk_own_scope(stmt):
            if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
                augmented.add(node.target.id)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    plain |= _stored(target)
            elif isinstance(node, (ast.AnnAssign, ast.For, ast.AsyncFor, ast.NamedExpr)):
                plain |= _stored(node.target)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    if item.optional_vars is not None:
                        plain |= _stored(item.optional_vars)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                plain.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                plain |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return (augmented & set(names)) - plain


def stop_index(body: Sequence[ast.stmt], kind: type[ast.stmt] = ast.Break) -> int | None:
    """The index in ``body`` of a statement ``if condition: break`` (``kind``
    :class:`ast.Continue`: ``if condition: continue``; nothing else in the ``if``, no ``else``),
    the only one of its kind in the loop; None where there is none."""
    found = [node for stmt in body for node in _walk_own_scope(stmt) if isinstance(node, kind)]
    for k, stmt in enumerate(body):
        if (
            isinstance(stmt, ast.If)
            and len(stmt.body) == 1
            and isinstance(stmt.body[0], kind)
            and not stmt.orelse
            and len(found) == 1
        ):
            return k
    return None


def analyse(
    function: ast.FunctionDef, loop: ast.For | ast.While, sized: set[str], shadowed: set[str]
) -> LoopInfo:
    """The carries, lists and refusal of ``loop``, a ``for`` or ``while`` statement of
    ``function`` (``shadowed``: the builtins the function binds to something else)."""
    stop = stop_index(loop.body)
    skip = stop_index(loop.body, ast.Continue) if stop is None else None
    leave = stop if stop is not None else skip  # the test that ends a step early
    word = "break" if stop is not None else "continue"
    if isinstance(loop, ast.While):
        form = LoopForm("while")
        targets: tuple[str, ...] = ()
    else:
        form = bound_range(function, loop, sized, shadowed) or loop_form(loop, sized, shadowed)
        targets = tuple(sorted(_stored(loop.target)))
    inside = {id(n) for s in loop.body for n in ast.walk(s)}
    if isinstance(loop, ast.While):  # the test runs before each step: read at every step
        inside |= {id(n) for n in ast.walk(loop.test)}
    live_after = {
        n.id
        for n in ast.walk(function)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and id(n) not in inside
    }
    appended = appended_lists(loop.body)
    lists = []
    for name, stmt in appended.items():
        others = [s for s in loop.body if s is not stmt]
        if name not in names_assigned(others) | names_loaded(others):
            lists.append(name)
    lists = sorted(set(lists) & fresh_lists(function, loop, lists))
    body = [s for s in loop.body if not any(s is appended[n] for n in lists)]
    buffers: list[BufferWrite] = []
    if isinstance(loop, ast.For) and form.kind == "range" and isinstance(loop.target, ast.Name):
        buffers = buffer_writes(function, loop, body, loop.target.id)
    assigned = names_assigned(body)
    body_reads = names_loaded(loop.body)
    exposed = exposed_reads(body)
    if isinstance(loop, ast.While):
        exposed |= names_loaded([loop.test])
        body_reads |= names_loaded([loop.test])
    carried_buffers = {b.name for b in buffers if b.carried}
    carries = sorted(((assigned & (exposed | live_after)) | carried_buffers) - set(targets))
    dead = dead_updates(loop, carries, live_after)
    dead_names = names_assigned(dead)
    carries = [c for c in carries if c not in dead_names]
    body = [s for s in body if not any(s is d for d in dead)]
    augmented = augmented_only(body, carries)
    free = body_reads - assigned
    reason = ""
    after_stop = loop.body[leave + 1 :] if leave is not None else []
    appended_after_stop = [n for n in lists if any(appended[n] is s for s in after_stop)]
    if isinstance(loop, ast.For) and not _names_only(loop.target):
        reason = (
            f"its target `{ast.unparse(loop.target)}` is not a name or a tuple of names (a "
            "starred name, an attribute or a subscript)"
        )
    elif set(targets) & _read_unbound_by_others(function, loop, set(targets)):
        name = sorted(set(targets) & _read_unbound_by_others(function, loop, set(targets)))[0]
        reason = f"the loop variable `{name}` is read outside the loop"
    elif (
        isinstance(loop, ast.For)
        and form.kind == "range"
        and not form.sized
        and not form.lengths
        and stop is None
    ):
        reason = (
            f"it counts to a Python number (`{ast.unparse(loop.iter)}`), not to a tensor's "
            "size, and has no `if condition: break`: layers, heads or a fixed number of steps "
            "stay Python"
        )
    elif isinstance(loop, ast.AsyncFor):
        reason = "an `async for`"
    elif stop is not None and loop.orelse:
        reason = (
            f"its `else` clause (line {loop.orelse[0].lineno}) runs only where the loop does not "
            "`break`"
        )
    elif any(b.stmt in after_stop for b in buffers):
        write = next(b for b in buffers if b.stmt in after_stop)
        reason = (
            f"it writes into `{write.name}` after its `if condition: {word}` (line "
            f"{write.stmt.lineno}): write before the test"
        )
    elif appended_after_stop:
        line = appended[appended_after_stop[0]].lineno
        reason = (
            f"it appends to `{appended_after_stop[0]}` after its `if condition: {word}` (line "
            f"{line}): append before the test"
        )
    else:
        stop_stmt = loop.body[leave] if leave is not None else None
        refusal = _refusal(
            body, set(carries), free - carried_buffers, stop_stmt, buffers, frozenset(augmented)
        )
        if refusal is None and loop.orelse:
            refusal = _refusal(loop.orelse, set(), set())
        if refusal is not None:
            reason = f"{refusal.what} (line {refusal.line})"
    tests: list[StepTest] = []
    if isinstance(loop, ast.For) and form.kind == "range" and isinstance(loop.target, ast.Name):
        tests = step_tests(loop.body, loop.target.id, names_assigned(loop.body))
    if tests and stop is not None and not reason:
        reason = (
            f"it tests the step number (line {tests[0].node.lineno}) and may `break`: one or "
            "the other converts"
        )
    return LoopInfo(
        loop,
        form,
        targets,
        tuple(carries),
        tuple(lists),
        reason,
        stop=stop,
        skip=skip,
        buffers=tuple(buffers),
        augmented=tuple(sorted(augmented)),
        tests=tuple(tests),
        dead=tuple(dead),
    )


def dead_updates(
    loop: ast.For | ast.While, carries: Iterable[str], live_after: set[str]
) -> list[ast.stmt]:
    """The statements of ``loop``'s own body that update a name nothing else reads: ``name =
    value`` or ``name += value`` with ``value`` made of names, constants and arithmetic, where
    ``name`` is read after the loop nowhere and in the loop only by those statements (a count of
    steps kept and never used, ``actual_nits += 1``). They change nothing the function computes
    and are left out of the step."""
    found: list[ast.stmt] = []
    scope = [n for s in loop.body for n in ast.walk(s)]  # nested functions' reads too
    if isinstance(loop, ast.While):
        scope += list(ast.walk(loop.test))
    for name in carries:
        if name in live_after:
            continue
        updates = [s for s in loop.body if _pure_update(s, name)]
        inside = {id(n) for s in updates for n in ast.walk(s)}
        touched = [
            n for n in scope if id(n) not in inside and isinstance(n, ast.Name) and n.id == name
        ]
        if updates and not touched:
            found.extend(updates)
    return found


def _pure_update(stmt: ast.stmt, name: str) -> bool:
    """Whether ``stmt`` is ``name = value`` or ``name op= value`` with ``value`` made of
    names, constants and arithmetic only (nothing it runs has an effect)."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        target, value = stmt.targets[0], stmt.value
    elif isinstance(stmt, ast.AugAssign):
        target, value = stmt.target, stmt.value
    else:
        return False
    return (
        isinstance(target, ast.Name)
        and target.id == name
        and all(isinstance(n, _PURE) for n in ast.walk(value))
    )


_PURE = (ast.Constant, ast.Name, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop, ast.Load)


def _read_unbound_by_others(
    function: ast.FunctionDef, loop: ast.For | ast.While, names: set[str]
) -> set[str]:
    """Those of ``names`` read outside ``loop`` other than where another loop or a
    comprehension binds them first (``for t in ...`` again, ``[t for t in ...]``)."""
    found: set[str] = set()

    def visit(node: ast.AST, bound: frozenset[str]) -> None:
        if node is loop:
            return
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if node.id in names and node.id not in bound:
                found.add(node.id)
            return
        if isinstance(node, (ast.For, ast.AsyncFor)):
            visit(node.iter, bound)
            inner = bound | _stored(node.target)
            for stmt in node.body:
                visit(stmt, inner)
            for stmt in node.orelse:
                visit(stmt, bound)  # may run without a step: the name as before
            return
        if isinstance(node, _COMPREHENSIONS):
            inner = bound | {n for g in node.generators for n in _stored(g.target)}
            for child in ast.iter_child_nodes(node):
                visit(child, inner)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, bound)

    for stmt in function.body:
        visit(stmt, frozenset())
    return found


def step_slices(body: Sequence[ast.stmt], index: str, assigned: set[str]) -> list[tuple[str, int]]:
    """The ``(name, axis)`` of the subscripts ``name[t]``, ``name[:, t]``, ``name[:, :, t,
    :]``... of the body, where ``t`` is the step number and ``name`` a sequence the body does
    not assign: the slices a scan can give the step as its ``x``, in order of appearance."""
    found: list[tuple[str, int]] = []
    for stmt in body:
        for node in ast.walk(stmt):
            key = slice_key(node, index, assigned)
            if key is not None and key not in found:
                found.append(key)
    return found


def slice_key(node: ast.AST, index: str, assigned: set[str]) -> tuple[str, int] | None:
    """``(name, axis)`` where ``node`` is ``name[:, ..., t, rest...]`` (loads only)."""
    found = sliced(node, index, assigned)
    return None if found is None else found[:2]


def sliced(
    node: ast.AST, index: str, assigned: set[str]
) -> tuple[str, int, tuple[ast.expr, ...]] | None:
    """``(name, axis, rest)`` where ``node`` is ``name[:, ..., t, *rest]``: full slices before
    the step number ``t``, and after it indices the body does not change (``x[t, :, k, 1:]``;
    loads only)."""
    if not (
        isinstance(node, ast.Subscript)
        and isinstance(node.ctx, ast.Load)
        and isinstance(node.value, ast.Name)
        and node.value.id not in assigned
        and node.value.id != index
    ):
        return None
    parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    positions = [k for k, p in enumerate(parts) if isinstance(p, ast.Name) and p.id == index]
    if len(positions) != 1:
        return None
    axis = positions[0]
    for part in parts[:axis]:
        if not (
            isinstance(part, ast.Slice)
            and part.lower is None
            and part.upper is None
            and part.step is None
        ):
            return None
    rest = tuple(parts[axis + 1 :])
    if names_loaded(rest) & (assigned | {index}) or any(
        isinstance(sub, (ast.Starred, ast.NamedExpr, ast.Call)) for p in rest for sub in ast.walk(p)
    ):
        return None
    return node.value.id, axis, rest
