"""The rewrite of a function's ``for`` statements into calls of :func:`._runtime.for_`.

Each ``for`` statement the analysis accepts becomes, in place::

    def __autoloop_body_N(__autoloop_item, __autoloop_carry):
        <target> = __autoloop_item
        (<carries>,) = __autoloop_carry
        <the body, each appended value assigned to __autoloop_y_K instead>
        return (<carries>,), (__autoloop_y_0, ...)
    (<carries>,), (<lists>,) = __autoloop__.for_(loop, <iterable>, __autoloop_body_N,
                                                 (<carries or UNDEFINED>,), (<lists>,))
    <the else clause>

with the statements keeping the user's line numbers (tracebacks show the user's lines). A loop
the analysis refuses stays as written, its iterable passed through :func:`._runtime.kept`, which
records each run. ``torch.stack``, ``torch.cat``, ``reversed`` and ``list`` calls of the function
take the lists of a scan as the stacked outputs they are.

The new function is compiled with the original's file name, in a factory whose parameters are
the original's free variables (so that it reads the same closure cells), nested in a class of
the same name where the original is a method (so that private names are mangled alike); it gets
the original's globals, defaults, keyword defaults and attributes.
"""

from __future__ import annotations

import ast
import copy
from typing import Any, ClassVar

from torchscan._autoloop import _analysis, _lists, _names, _runtime

RUNTIME = "__autoloop__"
LOOPS = "__autoloop_loops__"
_ITEM = "__autoloop_item"
_CARRY = "__autoloop_carry"
_SCANNING = "__autoloop_scanning"
_STOP = "__autoloop_stop"
_KEEP = "__autoloop_keep"
_TESTS = "__autoloop_tests"


class NotConvertible(Exception):
    """A function whose source cannot be converted (no source, a lambda, a generator)."""


def _name(id: str, ctx: ast.expr_context | None = None) -> ast.Name:
    return ast.Name(id=id, ctx=ctx or ast.Load())


def _runtime_attr(attr: str) -> ast.Attribute:
    return ast.Attribute(value=_name(RUNTIME), attr=attr, ctx=ast.Load())


def _tuple(names: list[str] | tuple[str, ...], ctx: ast.expr_context) -> ast.Tuple:
    return ast.Tuple(elts=[_name(n, ctx) for n in names], ctx=ctx)


class _Calls(ast.NodeTransformer):
    """``torch.stack``/``torch.cat``/``reversed``/``list`` calls through the runtime's, which
    take a scan's lists as stacked outputs; ``len`` through the runtime's, which keeps a
    tensor's length symbolic while torch traces the model."""

    _TORCH: ClassVar[dict[str, str]] = {
        "stack": "stack", "cat": "cat", "concat": "cat", "concatenate": "cat"
    }  # fmt: skip
    _BUILTINS: ClassVar[dict[str, str]] = {
        "reversed": "reversed_", "list": "list_", "len": "len_"
    }  # fmt: skip

    def __init__(self, shadowed: set[str]) -> None:
        self.shadowed = shadowed  # names that are not the builtins (or torch) here

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "torch"
            and "torch" not in self.shadowed
            and func.attr in self._TORCH
        ):
            node.func = ast.copy_location(_runtime_attr(self._TORCH[func.attr]), func)
        elif (
            isinstance(func, ast.Name)
            and func.id in self._BUILTINS
            and func.id not in self.shadowed
        ):
            node.func = ast.copy_location(_runtime_attr(self._BUILTINS[func.id]), func)
        elif (
            isinstance(func, ast.Attribute)
            and func.attr == "unbind"
            and not (isinstance(func.value, ast.Name) and func.value.id == RUNTIME)
            and not any(isinstance(a, ast.Starred) for a in node.args)
        ):  # the rows of a tensor, which a loop may index at its step number
            if isinstance(func.value, ast.Name) and func.value.id == "torch":
                if "torch" not in self.shadowed:
                    node.func = ast.copy_location(_runtime_attr("rows"), func)
            else:
                node.args = [func.value, *node.args]
                node.func = ast.copy_location(_runtime_attr("rows"), func)
        elif (
            isinstance(func, ast.Attribute)
            and func.attr == "split"
            and not (isinstance(func.value, ast.Name) and func.value.id in (RUNTIME, "torch"))
            and not any(isinstance(a, ast.Starred) for a in node.args)
            and not any(k.arg is None for k in node.keywords)
        ):  # pieces of 1, which a loop may index at its step number (or a string's split)
            node.args = [func.value, *node.args]
            node.func = ast.copy_location(_runtime_attr("split_rows"), func)
        return node


class _Slices(ast.NodeTransformer):
    """The subscripts ``x[:, t]`` of a loop's body as the names of the slices the runtime gives
    the step (``__autoloop_x_K``)."""

    def __init__(self, index: str, assigned: set[str], slices: list[tuple[str, int]]) -> None:
        self.index, self.assigned, self.slices = index, assigned, slices

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        found = _analysis.sliced(node, self.index, self.assigned)
        if found is None:
            return self.generic_visit(node)
        name, axis, rest = found
        item = ast.copy_location(_name(f"__autoloop_x_{self.slices.index((name, axis))}"), node)
        if not rest:
            return item
        # the axes before the step number's stay in the item: the rest indexes those after
        parts = [*[ast.Slice() for _ in range(axis)], *rest]
        index = parts[0] if len(parts) == 1 else ast.Tuple(parts, ast.Load())
        return ast.copy_location(ast.Subscript(item, index, ast.Load()), node)


def _iterable(node: ast.expr, form: _analysis.LoopForm, shadowed: set[str]) -> ast.expr:
    """The loop's iterable through the runtime's ``range_``, ``unbind``, ``enumerate_`` and
    ``zip_``."""
    if form.kind == "range" and form.bound is not None:  # `name = range(...)` before the loop
        for made in _analysis.range_calls(form.bound.value):
            keywords = []
            if not form.sized:
                lengths = _analysis.range_lengths(made)
                keywords.append(
                    ast.keyword("sized", ast.Call(_runtime_attr("any_tensor"), list(lengths), []))
                )
            made.func = ast.copy_location(_runtime_attr("range_"), made.func)
            made.keywords = keywords
        return node
    if form.kind == "range":
        call = node
        if form.reverse:
            assert isinstance(node, ast.Call)
            call = node.args[0]
        assert isinstance(call, ast.Call)
        keywords = [ast.keyword("reverse", ast.Constant(True))] if form.reverse else []
        if not form.sized:  # a time axis where a len(...) of its bounds is of a tensor
            lengths = ast.Call(_runtime_attr("any_tensor"), list(form.lengths), [])
            keywords.append(ast.keyword("sized", lengths))
        return ast.Call(_runtime_attr("range_"), list(call.args), keywords)
    return _headers(node, shadowed)


def _headers(node: ast.expr, shadowed: set[str]) -> ast.expr:
    if isinstance(node, ast.Call) and not any(isinstance(a, ast.Starred) for a in node.args):
        func = node.func
        args = [_headers(a, shadowed) for a in node.args]
        if (
            isinstance(func, ast.Name)
            and func.id in ("enumerate", "zip")
            and func.id not in shadowed
        ):
            return ast.Call(_runtime_attr(f"{func.id}_"), args, node.keywords)
        if isinstance(func, ast.Attribute) and func.attr in ("unbind", "split", "chunk"):
            runtime = {"unbind": "unbind", "split": "split_", "chunk": "chunk_"}[func.attr]
            if isinstance(func.value, ast.Name) and func.value.id == "torch":
                if "torch" in shadowed:
                    return node
                return ast.Call(_runtime_attr(runtime), args, node.keywords)
            return ast.Call(_runtime_attr(runtime), [func.value, *args], node.keywords)
    return node


class _Augmented(ast.NodeTransformer):
    """``name += value`` for the carries changed only so, as ``name = augmented(name, value,
    "add", scanning)``: in place as Python runs it, a new tensor in a scan (the one the loop
    started from gets the last value after it)."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def _visit_scope(self, node: ast.AST) -> ast.AST:
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = _visit_scope

    def visit_AugAssign(self, node: ast.AugAssign) -> ast.AST:
        if not (isinstance(node.target, ast.Name) and node.target.id in self.names):
            return node
        name = node.target.id
        call = ast.Call(
            _runtime_attr("augmented"),
            [_name(name), node.value, ast.Constant(_AUGMENTED[type(node.op)]), _name(_SCANNING)],
            [],
        )
        return ast.copy_location(ast.Assign([_name(name, ast.Store())], call), node)


class _StepTests(ast.NodeTransformer):
    """The tests of the step number, as ``(__autoloop_tests[k] if __autoloop_tests is not None
    else test)``: in the middle steps of a scan, the value the test has at all of them."""

    def __init__(self, tests: tuple[_analysis.StepTest, ...]) -> None:
        self.tests = tests

    def _visit_scope(self, node: ast.AST) -> ast.AST:
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = _visit_scope

    def _test(self, node: ast.If | ast.IfExp) -> ast.AST:
        self.generic_visit(node)
        k = next((k for k, t in enumerate(self.tests) if t.node is node.test), None)
        if k is not None:
            known = ast.Subscript(_name(_TESTS), ast.Constant(k), ast.Load())
            given = ast.Compare(_name(_TESTS), [ast.IsNot()], [ast.Constant(None)])
            node.test = ast.copy_location(ast.IfExp(given, known, node.test), node.test)
        return node

    visit_If = visit_IfExp = _test


class _Loops(ast.NodeTransformer):
    """Every ``for`` statement of one function, innermost first."""

    def __init__(
        self,
        infos: dict[int, _analysis.LoopInfo],
        loops: list[_runtime.Loop],
        function: str,
        filename: str,
        strict: bool,
        shadowed: set[str],
    ) -> None:
        self.infos, self.loops, self.shadowed = infos, loops, shadowed
        self.function, self.filename, self.strict = function, filename, strict
        self.converted = 0

    def _visit_scope(self, node: ast.AST) -> ast.AST:
        return node  # nested functions and classes are left as they are

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = _visit_scope

    def visit_For(self, node: ast.For) -> Any:
        return self._loop(node)

    def visit_While(self, node: ast.While) -> Any:
        return self._loop(node)

    def _loop(self, node: ast.For | ast.While) -> Any:
        info = self.infos[id(node)]
        self.generic_visit(node)
        index = len(self.loops)
        held = _held(node, info, index)
        loop = _runtime.Loop(
            self.function,
            self.filename,
            node.lineno,
            (*info.carries, *held),
            info.lists,
            strict=self.strict,
            reason=info.reason,
            stops=info.stop is not None,
            skips=info.skip is not None,
        )
        self.loops.append(loop)
        record = ast.Subscript(_name(LOOPS), ast.Constant(index), ast.Load())
        if info.reason:
            if isinstance(node, ast.For):
                header = _iterable(node.iter, info.form, self.shadowed)
                node.iter = ast.Call(_runtime_attr("kept"), [record, header], [])
                ast.fix_missing_locations(ast.copy_location(node.iter, node))
                return node
            kept = ast.Expr(ast.Call(_runtime_attr("kept"), [record, ast.Constant(None)], []))
            return [ast.fix_missing_locations(ast.copy_location(kept, node)), node]
        self.converted += 1
        written = copy.deepcopy(node)
        iterable = None
        if isinstance(node, ast.For):  # the iterable read once, by either form of the loop
            iterable = _name(f"__autoloop_iterable_{index}")
            made = _iterable(node.iter, info.form, self.shadowed)
            read = ast.Assign([_name(iterable.id, ast.Store())], made)
        converted = self._converted(node, info, record, index, held, iterable)
        if isinstance(written, ast.For):
            # nothing traces it and it runs fewer steps than a scan batches its work over: as
            # written, where its carries are tensors (what runs_as_written records); else a scan
            assert iterable is not None
            written.iter = _name(iterable.id)
            carries = []
            before = [ast.copy_location(read, node)]
            for k, name in enumerate(info.carries):
                temp = f"__autoloop_init_{index}_{k}"
                carries.append(temp)
                before.append(ast.copy_location(_read_or_undefined(temp, name), node))
            test = ast.Call(
                _runtime_attr("runs_as_written"),
                [record, iterable, _tuple(carries, ast.Load())],
                [],
            )
            converted = [*before, ast.copy_location(ast.If(test, [written], converted), node)]
        else:
            # nothing traces it: as written (a while has no work to hoist, and torchscan.loop's
            # checks at every step cost it time); else the loop operator
            assert isinstance(written, ast.While)
            assert isinstance(node, ast.While)
            # the condition's first value through `going` where as_written says so (to record
            # the outcome), the others as written
            first = f"__autoloop_first_{index}"
            going = ast.Call(_runtime_attr("going"), [record, written.test], [])
            written.test = ast.IfExp(_name(first), going, copy.deepcopy(written.test))
            unset = ast.Assign([_name(first, ast.Store())], ast.Constant(False))
            written.body.insert(0, ast.copy_location(unset, node))
            carries = []
            before: list[ast.stmt] = []
            for k, name in enumerate(info.carries):
                temp = f"__autoloop_init_{index}_{k}"
                carries.append(temp)
                before.append(ast.copy_location(_read_or_undefined(temp, name), node))
            test = ast.Call(_runtime_attr("as_written"), [record, _tuple(carries, ast.Load())], [])
            choose = ast.Assign([_name(first, ast.Store())], test)
            runs = ast.Compare(_name(first), [ast.IsNot()], [ast.Constant(None)])
            converted = [
                *before,
                ast.copy_location(choose, node),
                ast.copy_location(ast.If(runs, [written], converted), node),
            ]
        return [ast.fix_missing_locations(s) for s in converted]

    def _converted(
        self,
        node: ast.For | ast.While,
        info: _analysis.LoopInfo,
        record: ast.expr,
        index: int,
        held: tuple[str, ...],
        iterable: ast.expr | None,
    ) -> list[ast.stmt]:
        """The loop as a call of the runtime's ``for_`` (``iterable``: the name of what it
        iterates over) or ``while_``."""
        carries = (*info.carries, *held)
        body_name = f"__autoloop_body_{index}"
        appended = _lists.appended_lists(node.body)
        ys = {name: f"__autoloop_y_{k}" for k, name in enumerate(info.lists)}
        slices: list[tuple[str, int]] = []
        body: list[ast.stmt] = []
        if isinstance(node, ast.For):
            target: ast.expr = _store(node.target)
            if info.form.kind == "range" and isinstance(node.target, ast.Name):
                assigned = _names.names_assigned(node.body) | {node.target.id}
                assigned |= {b.name for b in info.buffers}  # read as they are when written
                slices = _analysis.step_slices(node.body, node.target.id, assigned)
                if slices:
                    _Slices(node.target.id, assigned, slices).visit(node)
                    names = [_name(f"__autoloop_x_{k}", ast.Store()) for k in range(len(slices))]
                    target = ast.Tuple([target, *names], ast.Store())
            elif (count := _enumerate_count(node, self.shadowed)) is not None:
                assigned = _names.names_assigned(node.body) | _names.names_assigned([node])
                slices = _analysis.step_slices(node.body, count, assigned)
                if slices:
                    _Slices(count, assigned, slices).visit(node)
                    names = [_name(f"__autoloop_x_{k}", ast.Store()) for k in range(len(slices))]
                    target = ast.Tuple([target, *names], ast.Store())
            body.append(ast.copy_location(ast.Assign([target], _name(_ITEM)), node))
        body.extend(_unpack_carry(carries, node))
        outputs = [b for b in info.buffers if not b.carried]
        written = {b.name: f"__autoloop_b_{k}" for k, b in enumerate(outputs)}
        ys_tuple = _tuple([*[ys[n] for n in info.lists], *written.values()], ast.Load())
        kept: list[str] = []
        if info.augmented:
            node.body = [_Augmented(info.augmented).visit(stmt) for stmt in node.body]
        if info.tests:
            node.body = [_StepTests(info.tests).visit(stmt) for stmt in node.body]
        for k, stmt in enumerate(node.body):
            if any(stmt is d for d in info.dead):
                continue
            if k in (info.stop, info.skip):
                assert isinstance(stmt, ast.If)
                after = node.body[k + 1 :]
                kept = [c for c in info.carries if c in _names.names_assigned(after)]
                flag = _Items().visit(stmt.test)
                if isinstance(flag, ast.UnaryOp) and isinstance(flag.op, ast.Not):
                    # in a scan, `not x` of a tensor as a tensor (Python's `not` reads its value)
                    flag = ast.Call(_runtime_attr("not_"), [flag.operand, _name(_SCANNING)], [])
                body.append(ast.copy_location(ast.Assign([_name(_STOP, ast.Store())], flag), stmt))
                surely = _names.surely_assigned(node.body[:k])
                stopped = _runtime_attr("STOP") if k == info.stop else None  # else the next step
                early = _returned(carries, ys_tuple, stopped, stmt, surely)
                test = ast.Call(_runtime_attr("stops"), [_name(_STOP), _name(_SCANNING)], [])
                body.append(ast.copy_location(ast.If(test, early, []), stmt))
                if held and k == info.stop:
                    # in a scan, the values at the test and the flag carried to the loop's end,
                    # where the step that stops gives them (no select at every step)
                    hold: list[ast.stmt] = [
                        ast.Assign([_tuple(held[:-1], ast.Store())], _tuple(kept, ast.Load())),
                        ast.Assign(
                            [_name(held[-1], ast.Store())],
                            ast.Call(_runtime_attr("flag_"), [_name(_STOP)], []),
                        ),
                    ]
                    body.append(ast.copy_location(ast.If(_name(_SCANNING), hold, []), stmt))
                    kept = []
                elif kept:  # in a scan (as Python runs it, the step has not stopped here)
                    keep = ast.Assign([_name(_KEEP, ast.Store())], _tuple(kept, ast.Load()))
                    body.append(ast.copy_location(ast.If(_name(_SCANNING), [keep], []), stmt))
                continue
            write = next((b for b in info.buffers if b.stmt is stmt), None)
            if write is not None:
                assert isinstance(node, ast.For)
                assert isinstance(node.target, ast.Name)
                body.append(
                    _buffer_write(write, node.target.id, written, f"__autoloop_bufs_{index}")
                )
                continue
            name = next((n for n in info.lists if appended[n] is stmt), None)
            if name is None:
                body.append(stmt)
            else:
                value = _lists.appended_value(stmt)
                body.append(
                    ast.copy_location(ast.Assign([_name(ys[name], ast.Store())], value), stmt)
                )
        until: ast.expr | None = None
        if kept:  # the values before the statements after the test, where the step ends there
            select = ast.Call(
                _runtime_attr("select"),
                [_name(_STOP), _name(_KEEP), _tuple(kept, ast.Load())],
                [],
            )
            chosen = ast.Assign([_tuple(kept, ast.Store())], select)
            body.append(ast.copy_location(ast.If(_name(_SCANNING), [chosen], []), node))
        if info.stop is not None:
            stop_line = ast.Constant(node.body[info.stop].lineno)
            until = ast.Call(
                _runtime_attr("until_"), [_name(_STOP), _name(_SCANNING), record, stop_line], []
            )
        surely = _names.surely_assigned(node.body)
        body.extend(_returned(carries, ys_tuple, until, node, surely))
        out: list[ast.stmt] = []
        if isinstance(node, ast.While):
            test_name = f"__autoloop_test_{index}"
            test_body = [*_unpack_carry(carries, node), ast.Return(node.test)]
            out.append(ast.copy_location(_function(test_name, [_CARRY], test_body), node))
        params = [_ITEM, _CARRY, _SCANNING]
        if info.tests:
            params.append(_TESTS)
            values = ast.Tuple([t.other for t in info.tests], ast.Load())
            others = _function(f"__autoloop_tests_{index}", [], [ast.Return(values)])
            out.append(ast.copy_location(others, node))
        function = _function(body_name, params, body)
        if info.tests:
            function.args.defaults = [ast.Constant(None)]
        if outputs:  # the buffers written as outputs, which the step reads through a list
            holder = ast.List([_name(b.name) for b in outputs], ast.Load())
            made = ast.Assign([_name(f"__autoloop_bufs_{index}", ast.Store())], holder)
            out.append(ast.copy_location(made, node))
        out.append(ast.copy_location(function, node))
        initial = []
        for k, name in enumerate(info.carries):
            temp = f"__autoloop_init_{index}_{k}"
            initial.append(temp)
            out.append(ast.copy_location(_read_or_undefined(temp, name), node))
        unstopped = f"__autoloop_unstopped_{index}"
        kept_names = _kept_at_stop(node, info) if held else []
        if held:  # from the values the kept carries start from; not stopped
            kept_initial = [initial[info.carries.index(n)] for n in kept_names]
            initial += [*kept_initial, unstopped]
            unstop = ast.Call(_runtime_attr("unstopped"), [_name(n) for n in kept_initial], [])
            out.append(ast.copy_location(ast.Assign([_name(unstopped, ast.Store())], unstop), node))
        if isinstance(node, ast.While):
            call = ast.Call(
                _runtime_attr("while_"),
                [
                    record,
                    _name(f"__autoloop_test_{index}"),
                    _name(body_name),
                    _tuple(initial, ast.Load()),
                    _tuple(info.lists, ast.Load()),
                ],
                [],
            )
        else:
            assert iterable is not None
            call = ast.Call(
                _runtime_attr("for_"),
                [
                    record,
                    iterable,
                    _name(body_name),
                    _tuple(initial, ast.Load()),
                    _tuple(info.lists, ast.Load()),
                ],
                [],
            )
        if slices:
            pairs: list[ast.expr] = [
                ast.Tuple([_name(n), ast.Constant(a)], ast.Load()) for n, a in slices
            ]
            call.keywords.append(ast.keyword("slices", ast.Tuple(pairs, ast.Load())))
        if info.buffers:
            described: list[ast.expr] = [
                ast.Tuple(
                    [
                        ast.Constant(b.name),
                        _name(b.name),
                        ast.Constant(b.axis),
                        ast.Constant(info.carries.index(b.name) if b.carried else -1),
                        _index_value(b.rest),
                    ],
                    ast.Load(),
                )
                for b in info.buffers
            ]
            call.keywords.append(ast.keyword("buffers", ast.Tuple(described, ast.Load())))
            if outputs:
                call.keywords.append(ast.keyword("holder", _name(f"__autoloop_bufs_{index}")))
        if info.tests:
            ops = ast.Tuple([ast.Constant(t.op) for t in info.tests], ast.Load())
            tested = ast.Tuple([ops, _name(f"__autoloop_tests_{index}")], ast.Load())
            call.keywords.append(ast.keyword("tests", tested))
        fronts = [k for k, n in enumerate(info.lists) if _lists.prepends(appended[n])]
        if fronts:
            at_front: list[ast.expr] = [ast.Constant(k) for k in fronts]
            call.keywords.append(ast.keyword("front", ast.Tuple(at_front, ast.Load())))
        if info.augmented:
            positions: list[ast.expr] = [
                ast.Constant(info.carries.index(n)) for n in info.augmented
            ]
            call.keywords.append(ast.keyword("inplace", ast.Tuple(positions, ast.Load())))
        out.append(
            ast.copy_location(
                ast.Assign(
                    [
                        ast.Tuple(
                            [_tuple(carries, ast.Store()), _tuple(info.lists, ast.Store())],
                            ast.Store(),
                        )
                    ],
                    call,
                ),
                node,
            )
        )
        if held:  # a scan that stopped at a `break`: the kept carries as they were at its test
            select = ast.Call(
                _runtime_attr("chosen"),
                [_name(held[-1]), _tuple(held[:-1], ast.Load()), _tuple(kept_names, ast.Load())],
                [],
            )
            stopped = ast.Compare(_name(held[-1]), [ast.IsNot()], [_name(unstopped)])
            chosen = ast.Assign([_tuple(kept_names, ast.Store())], select)
            out.append(ast.copy_location(ast.If(stopped, [chosen], []), node))
        # unbound after the loop where it was before and no step ran
        out.extend(_unbind_undefined(carries, node))
        out.extend(node.orelse)
        return out


def _buffer_write(
    write: _analysis.BufferWrite, index: str, written: dict[str, str], holder: str
) -> ast.stmt:
    """A write into a buffer at the step number, in the step: where the buffer is carried,
    ``name = put(name, axis, t, value, scanning[, op])`` (in place as Python runs it, a new
    tensor in a scan); else ``y = write(name, axis, t, value, scanning)``: in a scan, the value
    for the slot as the step's output; as Python runs it, the write as written."""
    stmt = write.stmt
    rest = [ast.keyword("rest", _index_value(write.rest))] if write.rest else []
    called = _analysis.out_call(stmt)
    if called is not None:  # torch.f(..., out=buffer[t]): as written, or the result in a scan
        call = called[0]
        others = [k for k in call.keywords if k.arg != "out"]
        position = ast.Constant(list(written).index(write.name))
        args = [
            ast.Subscript(_name(holder), position, ast.Load()),
            ast.Constant(write.axis),
            _name(index),
            call.func,
            ast.Tuple(call.args, ast.Load()),
            ast.Dict([ast.Constant(k.arg) for k in others], [k.value for k in others]),
            _name(_SCANNING),
        ]
        made = ast.Call(_runtime_attr("write_out"), args, rest)
        target = _name(written[write.name], ast.Store())
        return ast.copy_location(ast.Assign([target], made), stmt)
    assert isinstance(stmt, (ast.Assign, ast.AugAssign))
    value = stmt.value
    if write.carried:
        args = [_name(write.name), ast.Constant(write.axis), _name(index), value, _name(_SCANNING)]
        if isinstance(stmt, ast.AugAssign):
            args.append(ast.Constant(_AUGMENTED[type(stmt.op)]))
        put = ast.Call(_runtime_attr("put"), args, rest)
        return ast.copy_location(ast.Assign([_name(write.name, ast.Store())], put), stmt)
    y = written[write.name]
    held = ast.Subscript(_name(holder), ast.Constant(list(written).index(write.name)), ast.Load())
    args = [held, ast.Constant(write.axis), _name(index), value, _name(_SCANNING)]
    call = ast.Call(_runtime_attr("write"), args, rest)
    return ast.copy_location(ast.Assign([_name(y, ast.Store())], call), stmt)


def _index_value(parts: tuple[ast.expr, ...]) -> ast.expr:
    """The indices of a subscript as a value: a tuple, its slices made by ``slice``."""

    def value(part: ast.expr) -> ast.expr:
        if isinstance(part, ast.Slice):
            bounds = [
                b if b is not None else ast.Constant(None)
                for b in (part.lower, part.upper, part.step)
            ]
            return ast.Call(_runtime_attr("slice_"), bounds, [])
        return part

    return ast.Tuple([value(p) for p in parts], ast.Load())


_AUGMENTED = {
    ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "truediv", ast.FloorDiv: "floordiv",
    ast.Mod: "mod", ast.Pow: "pow", ast.MatMult: "matmul", ast.BitAnd: "and_", ast.BitOr: "or_",
    ast.BitXor: "xor", ast.LShift: "lshift", ast.RShift: "rshift",
}  # fmt: skip


def _function(name: str, params: list[str], body: list[ast.stmt]) -> ast.FunctionDef:
    function = ast.FunctionDef(
        name=name,
        args=ast.arguments(
            posonlyargs=[],
            args=[ast.arg(p) for p in params],
            kwonlyargs=[],
            kw_defaults=[],
            defaults=[],
        ),
        body=body,
        decorator_list=[],
        returns=None,
    )
    _no_type_params(function)
    return function


def _unpack_carry(carries: tuple[str, ...], where: ast.AST) -> list[ast.stmt]:
    """The carries from the step's argument; those unbound before the loop unbound again, so
    that reading them raises what Python raises."""
    if not carries:
        return []
    unpack = ast.copy_location(ast.Assign([_tuple(carries, ast.Store())], _name(_CARRY)), where)
    return [unpack, *_unbind_undefined(carries, where)]


def _read_or_undefined(temp: str, name: str) -> ast.stmt:
    """``temp = name``, or the runtime's UNDEFINED where ``name`` is not bound."""
    return ast.Try(
        body=[ast.Assign([_name(temp, ast.Store())], _name(name))],
        handlers=[
            ast.ExceptHandler(
                type=_name("NameError"),
                name=None,
                body=[ast.Assign([_name(temp, ast.Store())], _runtime_attr("UNDEFINED"))],
            )
        ],
        orelse=[],
        finalbody=[],
    )


def _kept_at_stop(node: ast.For | ast.While, info: _analysis.LoopInfo) -> list[str]:
    """The carries the statements after the loop's ``if condition: break`` assign: as the loop
    leaves them where it breaks, those at the test."""
    if info.stop is None:
        return []
    after = _names.names_assigned(node.body[info.stop + 1 :])
    return [c for c in info.carries if c in after]


def _held(node: ast.For | ast.While, info: _analysis.LoopInfo, index: int) -> tuple[str, ...]:
    """The names of the carries a scan adds for a ``break`` with statements after its test:
    the kept carries' values at the test, then whether the step stopped."""
    kept = _kept_at_stop(node, info)
    written_back = {*info.augmented, *(b.name for b in info.buffers if b.carried)}
    if not kept or written_back & set(kept):
        return ()  # (the scan's last values go back into those tensors: selected at each step)
    return (
        *[f"__autoloop_held_{index}_{k}" for k in range(len(kept))],
        f"__autoloop_stopped_{index}",
    )


def _enumerate_count(node: ast.For, shadowed: set[str]) -> str | None:
    """The name of the count where ``node`` is ``for i, item in enumerate(sequence):`` (counting
    from 0): rows indexed at it (``forgets[i]``) are scanned with the sequence."""
    it, target = node.iter, node.target
    if (
        "enumerate" not in shadowed
        and isinstance(it, ast.Call)
        and isinstance(it.func, ast.Name)
        and it.func.id == "enumerate"
        and len(it.args) == 1
        and not it.keywords
        and not isinstance(it.args[0], ast.Starred)
        and isinstance(target, ast.Tuple)
        and len(target.elts) == 2
        and isinstance(target.elts[0], ast.Name)
    ):
        return target.elts[0].id
    return None


class _Items(ast.NodeTransformer):
    """``x.item()`` in the test of a ``break`` or ``continue`` → ``item_(x, scanning)``: in a
    scan, the tensor compared, not its value read."""

    def visit_Call(self, node: ast.Call) -> ast.expr:
        self.generic_visit(node)
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "item"
            and not node.args
            and not node.keywords
        ):
            call = ast.Call(_runtime_attr("item_"), [func.value, _name(_SCANNING)], [])
            return ast.copy_location(call, node)
        return node

    def visit_Lambda(self, node: ast.Lambda) -> ast.Lambda:
        return node  # its own scope


def _returned(
    carries: tuple[str, ...],
    ys: ast.expr,
    stop: ast.expr | None,
    where: ast.AST,
    surely: set[str],
) -> list[ast.stmt]:
    """``return (carries), (ys)[, stop]``; a carry that is not ``surely`` bound by the step's
    statements and was not bound before the loop returned as the runtime's UNDEFINED."""
    out: list[ast.stmt] = []
    values: list[ast.expr] = []
    for k, name in enumerate(carries):
        if name in surely:
            values.append(_name(name))
            continue
        temp = f"__autoloop_c_{k}"
        values.append(_name(temp))
        out.append(ast.copy_location(_read_or_undefined(temp, name), where))
    returned = [ast.Tuple(values, ast.Load()), ys]
    if stop is not None:
        returned.append(stop)
    out.append(ast.copy_location(ast.Return(ast.Tuple(returned, ast.Load())), where))
    return out


def _unbind_undefined(names: tuple[str, ...], where: ast.AST) -> list[ast.stmt]:
    """``if name is UNDEFINED: del name`` for each of ``names``: a carry that was not bound is
    not bound, and reading it raises what Python raises."""
    return [
        ast.copy_location(
            ast.If(
                test=ast.Compare(_name(name), [ast.Is()], [_runtime_attr("UNDEFINED")]),
                body=[ast.Delete([_name(name, ast.Del())])],
                orelse=[],
            ),
            where,
        )
        for name in names
    ]


def _no_type_params(node: ast.stmt) -> None:
    """A generated ``def`` or ``class`` without type parameters (a field from Python 3.12)."""
    if "type_params" in node._fields:
        setattr(node, "type_params", [])  # noqa: B010


def _store(target: ast.expr) -> ast.expr:
    if isinstance(target, ast.Name):
        return _name(target.id, ast.Store())
    assert isinstance(target, ast.Tuple)
    return ast.Tuple([_store(e) for e in target.elts], ast.Store())
