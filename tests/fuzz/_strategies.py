"""Hypothesis strategies for random :class:`~._program.Program` s.

A program's ``forward`` calls ``scan`` or ``loop`` once; its step reads carries, slices of
sequences, the loop counter and captured model inputs, makes a few values with the operators
of ``_ops.py`` (one of which may be a nested ``scan`` or ``loop``, to depth 2), and returns a
new carry of the type of the old one, a pytree of outputs (``None`` leaves and the carry itself
among them), and possibly ``until(stop)``.
"""

from __future__ import annotations

import re

import hypothesis.strategies as st

from . import _ops
from ._ops import Scope, broadcast
from ._program import FLOATS, Call, Input, Nested, Program, Stmt, Val

STEP_SHAPES = [(), (3,), (2, 3)]
CAPTURED_SHAPES = [(3,), (2, 3), (3, 3)]


def _dtype(draw) -> str:
    # Mostly float32, the type models use; the others often enough to matter.
    return draw(st.sampled_from(["float32", "float32", "float64", "int64", "bool"]))


def _tree(draw, names: list[str]) -> tuple[str, str]:
    """A pytree of ``names``: (the expression that builds it, the pattern that unpacks it)."""
    kind = (
        draw(st.sampled_from(["leaf", "tuple", "dict"]))
        if len(names) == 1
        else draw(st.sampled_from(["tuple", "dict"]))
    )
    if kind == "leaf":
        return names[0], names[0]
    if kind == "tuple":
        text = ", ".join(names) + ("," if len(names) == 1 else "")
        return f"({text})", text
    keys = [f"k{n}" for n in range(len(names))]
    build = "{" + ", ".join(f'"{k}": {n}' for k, n in zip(keys, names, strict=True)) + "}"
    return build, "dict"


def _unpack(pattern: str, arg: str, names: list[str]) -> list[str]:
    if pattern == "dict":
        return [f'{n} = {arg}["k{k}"]' for k, n in enumerate(names)]
    return [] if pattern == arg else [f"{pattern} = {arg}"]


def _fit(draw, scope: Scope, old: Val) -> str:
    """A new value of ``old``'s dtype and shape, made from values of the scope."""
    choice = draw(st.sampled_from(["combine", "combine", "same"]))
    if choice == "same":
        return old.name  # the carry returned unchanged
    fits = [v for v in scope.pool if broadcast(v.shape, old.shape) == old.shape]
    v = draw(st.sampled_from(fits))
    value = v.name
    if v.dtype != old.dtype:
        if old.dtype == "bool":
            value = f"({value} > {'0' if v.dtype == 'int64' else '0.3'})"
        elif old.dtype == "int64" and v.dtype in FLOATS:
            value = f"torch.floor({value} * 2 + 0.3).to(torch.int64)"
        else:
            value = f"{value}.to(torch.{old.dtype})"
    if old.dtype in FLOATS:
        return f"torch.tanh(0.5 * {old.name} + {value})"
    if old.dtype == "int64":
        return f"({old.name} + {value}).clamp(-20, 20)"
    return f"{old.name} ^ {value}"


def _stop(draw, scope: Scope) -> str:
    """A 0-d bool: a data-dependent stop, or'd with a cap on the counter in a loop."""
    v = draw(st.sampled_from(scope.pool))
    if v.dtype == "bool":
        data = f"{v.name}.all()" if v.shape else v.name
    else:
        threshold = draw(st.sampled_from(["0.3", "1.3", "-0.7"]))
        data = f"({v.name}.sum() > {threshold})" if v.shape else f"({v.name} > {threshold})"
    if scope.index is not None and draw(st.booleans()):
        return f"{data} | ({scope.index} >= {draw(st.integers(0, 3))})"
    return data


def _body(draw, scope: Scope, carries: list[Val], y_rank: int) -> tuple[list, str, str | None]:
    """Statements, the new carry's leaves (joined) and the outputs' pytree."""
    stmts: list[Stmt | Nested] = []
    for _ in range(draw(st.integers(1, 5))):
        if scope.depth < 2 and draw(st.integers(0, 7)) == 0:
            stmts.append(_nested(draw, scope))
            continue
        expr, dtype, shape = _ops.statement(draw, scope)
        name = scope.fresh("v")
        stmts.append(Stmt(name, expr))
        scope.pool.append(Val(name, dtype, shape))
    new = []
    for c in carries:
        expr = _fit(draw, scope, c)
        if expr == c.name:
            new.append(expr)
            continue
        # Named, so that the outputs may return the new carry too (``return h, h``).
        name = scope.fresh("n")
        stmts.append(Stmt(name, expr))
        scope.pool.append(Val(name, c.dtype, c.shape))
        new.append(name)
    outputs = [v for v in scope.pool if len(v.shape) >= y_rank]
    ys = (
        draw(st.lists(st.sampled_from([None, *outputs]), min_size=0, max_size=3)) if outputs else []
    )
    if not carries and scope.depth == 1 and all(v is None for v in ys) and outputs:
        ys = [*ys, outputs[-1]]  # a model with no output is no model: return something
    if not ys:
        y = "None"
    else:
        names = ["None" if v is None else v.name for v in ys]
        y = _tree(draw, names)[0] if draw(st.booleans()) or len(names) > 1 else names[0]
    return stmts, new, y


def _call(
    draw,
    scope: Scope,
    kind: str,
    inits: list[str],
    carries: list[Val],
    xs: list[tuple[str, Val]],
    call_args: str,
    counter: str | None,
    until: bool,
    y_rank: int,
    prologue: tuple[list[str], list[Val]] = ([], []),
) -> tuple[Call, str]:
    """A step function and the call that runs it; also the carry's pattern (``dict``, a tuple's
    names, a leaf's name, or ``none``)."""
    fn = scope.fresh("step")
    steps = [Val(scope.fresh("x"), v.dtype, v.shape) for _, v in xs]
    inner = scope.child([*carries, *steps, *prologue[1]], counter)
    if counter is not None:
        inner.pool.append(Val(counter, "int64", ()))
    c_names = [c.name for c in carries]
    if carries:
        build, pattern = _tree(draw, c_names)
        carry_arg = c_names[0] if pattern == c_names[0] else "carry"
        unpack = _unpack(pattern, carry_arg, c_names)
    else:
        build, pattern, carry_arg, unpack = "None", "none", "carry", []
    unpack = [*unpack, *prologue[0]]
    if xs:
        s_names = [s.name for s in steps]
        xs_build, xs_pattern = _tree(draw, s_names)
        x_arg = s_names[0] if xs_pattern == s_names[0] else "x"
        unpack += _unpack(xs_pattern, x_arg, s_names)
        seq = _rebuild(xs_build, s_names, [e for e, _ in xs])
    else:
        x_arg, seq = "x", None
    stmts, new, y = _body(draw, inner, carries, y_rank)
    new_carry = _rebuild(build, c_names, new) if carries else "None"
    init = _rebuild(build, c_names, inits) if carries else "None"
    returns = f"{new_carry}, {y}"
    if until:
        returns += f", until({_stop(draw, inner)})"
    if kind == "scan":
        params = f"{carry_arg}, {x_arg}"
        args = f"{init}, {seq}" if seq else init
        expr = f"scan({fn}, {args}{call_args})"
    else:
        params = f"{counter}, {carry_arg}"
        expr = f"loop({fn}, {init}{call_args})"
    return Call(kind, fn, params, unpack, stmts, returns, expr), pattern


def _rebuild(build: str, names: list[str], exprs: list[str]) -> str:
    """``build`` with each of ``names`` (whole words) replaced by the matching expression."""
    table = dict(zip(names, exprs, strict=True))
    return re.sub(r"\b[a-z]+\d+\b", lambda m: table.get(m.group(0), m.group(0)), build)


def _results(pattern: str, carries: list[Val], name: str) -> list[Val]:
    """The leaves of a nested call's carry, which the statements after it may read."""
    if pattern == "none":
        return []
    if pattern == "dict":
        return [Val(f'{name}["k{k}"]', c.dtype, c.shape) for k, c in enumerate(carries)]
    if pattern == carries[0].name:
        return [Val(name, carries[0].dtype, carries[0].shape)]
    return [Val(f"{name}[{k}]", c.dtype, c.shape) for k, c in enumerate(carries)]


def _nested(draw, scope: Scope) -> Nested:
    """A scan or loop inside a step, over values of the step; its carry joins the scope, and
    its outputs too where their length is fixed."""
    kind = draw(st.sampled_from(["scan", "loop"]))
    init_vals = draw(st.lists(st.sampled_from(scope.pool), min_size=0, max_size=2))
    carries = [Val(scope.fresh("c"), v.dtype, v.shape) for v in init_vals]
    inits = [v.name for v in init_vals]
    until = draw(st.integers(0, 3)) == 0
    if kind == "scan":
        seqs = [v for v in scope.pool if v.shape]
        xs: list[tuple[str, Val]] = []
        if seqs and draw(st.booleans()):
            first = draw(st.sampled_from(seqs))
            axis = draw(st.sampled_from([0, -1]))
            n = first.shape[axis]
            same = [v for v in seqs if v.shape[axis] == n]
            chosen = draw(st.lists(st.sampled_from(same), min_size=1, max_size=2))
            for v in chosen:
                rest = v.shape[1:] if axis == 0 else v.shape[:-1]
                xs.append((v.name, Val("", v.dtype, rest)))
            call_args = ", axis=-1" if axis else ""
        else:
            call_args = f", length={draw(st.integers(1, 3))}"
        if draw(st.booleans()):
            call_args += ", reverse=True"
        call, pattern = _call(draw, scope, "scan", inits, carries, xs, call_args, None, until, 0)
    else:
        trips = ["2", "3"] + ([f"{scope.index} + 1"] if scope.index else [])
        trip = draw(st.sampled_from(trips))
        counter = scope.fresh("j")
        args = f", trip_count={trip}"
        call, pattern = _call(draw, scope, "loop", inits, carries, [], args, counter, until, 0)
    carry_name, ys_name = scope.fresh("r"), scope.fresh("ys")
    scope.pool.extend(_results(pattern, carries, carry_name))
    return Nested(f"{carry_name}, {ys_name}", call)


@st.composite
def programs(draw) -> Program:
    """A model whose ``forward`` runs one scan or loop (possibly with another inside)."""
    names = [0]
    scope = Scope([], names, None, 0)
    inputs: list[Input] = []
    for _ in range(draw(st.integers(0, 2))):
        w = Val(scope.fresh("w"), _dtype(draw), draw(st.sampled_from(CAPTURED_SHAPES)))
        inputs.append(Input(w.name, w.dtype, w.shape))
        scope.pool.append(w)
    carries, inits = [], []
    for _ in range(draw(st.integers(0, 3))):
        h = Input(scope.fresh("h"), _dtype(draw), draw(st.sampled_from(STEP_SHAPES)))
        inputs.append(h)
        inits.append(h.name)
        carries.append(Val(scope.fresh("c"), h.dtype, h.shape))
    until = draw(st.integers(0, 3)) == 0
    kind = draw(st.sampled_from(["scan", "loop"]))
    if kind == "scan":
        axis = draw(st.sampled_from([0, 1, -1]))
        xs = []
        for _ in range(draw(st.integers(0, 3))):
            shape = draw(st.sampled_from([s for s in STEP_SHAPES if len(s) >= (axis == 1)]))
            s = Input(scope.fresh("s"), _dtype(draw), shape, time_axis=axis)
            inputs.append(s)
            xs.append((s.name, Val("", s.dtype, s.shape)))
        args = f", axis={axis}" if axis else ""
        if not xs:
            if draw(st.booleans()):
                t = Input(scope.fresh("t"), "float32", (), time_axis=0)
                inputs.append(t)
                args += f", length={t.name}.shape[0]"
            else:
                args += f", length={draw(st.integers(0, 3))}"
        if draw(st.booleans()):
            args += ", reverse=True"
        y_rank = 1 if axis == 1 else 0
        if not (scope.pool or carries or xs):
            w = Val(scope.fresh("w"), "float32", (3,))
            inputs.append(Input(w.name, w.dtype, w.shape))
            scope.pool.append(w)
        call, _ = _call(draw, scope, "scan", inits, carries, xs, args, None, until, y_rank)
    else:
        counter = scope.fresh("i")
        mode = draw(st.sampled_from(["sequence", "count", "constant", "none"]))
        prologue: tuple[list[str], list[Val]] = ([], [])
        if mode == "sequence":
            axis = draw(st.sampled_from([0, 1]))
            for k in range(draw(st.integers(1, 2))):
                shape = draw(st.sampled_from([s for s in STEP_SHAPES if len(s) >= axis]))
                s = Input(scope.fresh("s"), _dtype(draw), shape, time_axis=axis)
                inputs.append(s)
                x = Val(scope.fresh("x"), s.dtype, s.shape)
                prologue[0].append(f"{x.name} = {s.name}[{':, ' * axis}{counter}]")
                prologue[1].append(x)
                if k == 0:
                    args = f", trip_count={s.name}.shape[{axis}]"
        elif mode == "count":
            n = Input(scope.fresh("n"), "int64", (), role="count")
            inputs.append(n)
            args = f", trip_count={n.name}"
        elif mode == "constant":
            args = f", trip_count={draw(st.integers(0, 3))}"
        else:
            args, until = "", True
        if draw(st.integers(0, 3)) == 0:
            go = Input(scope.fresh("go"), "bool", (), role="flag")
            inputs.append(go)
            args += f", cond={go.name}"
        call, _ = _call(draw, scope, "loop", inits, carries, [], args, counter, until, 0, prologue)
        if mode == "none":
            # Without a trip count the stop must come: cap the counter.
            stop = call.returns.rsplit(", until(", 1)[1][:-1]
            call.returns = (
                call.returns.rsplit(", until(", 1)[0] + f", until({stop} | ({counter} >= 3))"
            )
    seed = draw(st.integers(0, 2**16))
    lengths = (3, *draw(st.permutations([0, 1, 5])))
    sizes = draw(st.integers(0, 3)) == 0
    return Program(inputs, call, seed, lengths, sizes)
