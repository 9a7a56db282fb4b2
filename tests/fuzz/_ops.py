"""The vocabulary of step bodies: operators that read values of a scope and make a new one.

Each operator is a function ``op(draw, scope) -> (expr, dtype, shape) | None``; ``None`` when no
value of the scope fits it. Generator hygiene, so that eager torch, onnxruntime and onnx's
reference evaluator may only differ by a torchscan bug:

- floats stay bounded (``tanh``, ``clamp`` after products, ``exp`` of a clamped value), so that
  rounding stays within float32 tolerances and nothing overflows;
- integers are clamped after products and sums, divided only by positive constants;
- indices are constants in range, or the step number taken modulo the size of the axis;
- no argmax (ties), no in-place writes on step inputs (shape-only changes of views, which change
  no input, are drawn), and every value keeps its dtype and shape from step to step.
"""

from __future__ import annotations

from collections.abc import Callable

import hypothesis.strategies as st

from ._program import FLOATS, Val

Result = tuple[str, str, tuple[int, ...]]


class Scope:
    """The values a step body can read, and the names it has made (shared by nested bodies)."""

    def __init__(self, pool: list[Val], names: list[int], index: str | None, depth: int):
        self.pool, self.names, self.index, self.depth = pool, names, index, depth

    def fresh(self, prefix: str) -> str:
        self.names[0] += 1
        return f"{prefix}{self.names[0]}"

    def child(self, extra: list[Val], index: str | None) -> Scope:
        return Scope([*self.pool, *extra], self.names, index or self.index, self.depth + 1)


def broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    out = []
    for x, y in zip(
        reversed((1,) * (len(b) - len(a)) + a), reversed((1,) * (len(a) - len(b)) + b), strict=True
    ):
        if x != y and 1 not in (x, y):
            return None
        out.append(max(x, y))
    return tuple(reversed(out))


def _pick(draw, values: list[Val]) -> Val | None:
    return draw(st.sampled_from(values)) if values else None


def _of(scope: Scope, pred: Callable[[Val], bool]) -> list[Val]:
    return [v for v in scope.pool if pred(v)]


def _unary(template: str, kinds: tuple[str, ...], min_rank: int = 0, out: str | None = None):
    def op(draw, scope: Scope) -> Result | None:
        a = _pick(draw, _of(scope, lambda v: v.dtype in kinds and len(v.shape) >= min_rank))
        return None if a is None else (template.format(a=a.name), out or a.dtype, a.shape)

    op.__name__ = template
    return op


def _binary(
    template: str, kinds: tuple[str, ...], int_template: str | None = None, out: str | None = None
):
    def op(draw, scope: Scope) -> Result | None:
        a = _pick(draw, _of(scope, lambda v: v.dtype in kinds))
        if a is None:
            return None
        others = _of(
            scope, lambda v: v.dtype == a.dtype and broadcast(a.shape, v.shape) is not None
        )
        b = _pick(draw, others)
        shape = broadcast(a.shape, b.shape)
        text = int_template if a.dtype == "int64" and int_template else template
        return text.format(a=a.name, b=b.name), out or a.dtype, shape

    op.__name__ = template
    return op


NUMBERS = (*FLOATS, "int64")
add = _binary("{a} + {b}", NUMBERS, "({a} + {b}).clamp(-99, 99)")
sub = _binary("{a} - {b}", NUMBERS, "({a} - {b}).clamp(-99, 99)")
mul = _binary("({a} * {b}).clamp(-4, 4)", NUMBERS, "({a} * {b}).clamp(-99, 99)")
div = _binary("{a} / (1 + {b}.abs())", FLOATS)
maximum = _binary("torch.maximum({a}, {b})", NUMBERS)
minimum = _binary("torch.minimum({a}, {b})", NUMBERS)
greater = _binary("{a} > {b}", NUMBERS, out="bool")
equal = _binary("{a} == {b}", ("int64", "bool"), out="bool")
logical_and = _binary("{a} & {b}", ("bool",))
logical_or = _binary("{a} | {b}", ("bool",))
logical_xor = _binary("{a} ^ {b}", ("bool",))
tanh = _unary("torch.tanh({a})", FLOATS)
sigmoid = _unary("torch.sigmoid({a})", FLOATS)
exp = _unary("torch.exp({a}.clamp(-3, 1))", FLOATS)
absolute = _unary("{a}.abs()", NUMBERS)
relu = _unary("torch.relu({a})", FLOATS)
neg = _unary("-{a}", NUMBERS)
sqrt = _unary("torch.sqrt({a}.abs())", FLOATS)
sin = _unary("torch.sin({a})", FLOATS)
log1p = _unary("torch.log1p({a}.abs())", FLOATS)
clamp = _unary("{a}.clamp(-1, 1)", NUMBERS)
scale = _unary("{a} * 0.5 - 0.25", FLOATS)
logical_not = _unary("~{a}", ("bool",))
remainder = _unary("{a} % 3", ("int64",))
floor_div = _unary("{a} // 2", ("int64",))
softmax = _unary("torch.softmax({a}, -1)", FLOATS, 1)
cumsum = _unary("{a}.cumsum(-1).clamp(-99, 99)", NUMBERS, 1)
flip = _unary("{a}.flip(-1)", (*NUMBERS, "bool"), 1)
threshold = _unary("{a} > 0.3", FLOATS, out="bool")
is_positive = _unary("{a} > 0", ("int64",), out="bool")


def _reduce(method: str, kinds: tuple[str, ...]):
    def op(draw, scope: Scope) -> Result | None:
        a = _pick(draw, _of(scope, lambda v: v.dtype in kinds and v.shape))
        if a is None:
            return None
        dtype = "int64" if a.dtype == "bool" and method == "sum" else a.dtype
        if draw(st.booleans()):
            return f"{a.name}.{method}(-1)", dtype, a.shape[:-1]
        if method == "amax":  # torch.onnx translates amax with its dims only, loop or not
            return f"{a.name}.amax({tuple(range(len(a.shape)))})", dtype, ()
        return f"{a.name}.{method}()", dtype, ()

    op.__name__ = method
    return op


total = _reduce("sum", (*NUMBERS, "bool"))
mean = _reduce("mean", FLOATS)
amax = _reduce("amax", NUMBERS)
anything = _reduce("any", ("bool",))


def where(draw, scope: Scope) -> Result | None:
    c = _pick(draw, _of(scope, lambda v: v.dtype == "bool"))
    if c is None:
        return None
    a = _pick(
        draw, _of(scope, lambda v: v.dtype != "bool" and broadcast(v.shape, c.shape) is not None)
    )
    if a is None:
        return None
    b = _pick(
        draw,
        _of(
            scope,
            lambda v: (
                v.dtype == a.dtype and broadcast(broadcast(a.shape, c.shape), v.shape) is not None
            ),
        ),
    )
    return (
        f"torch.where({c.name}, {a.name}, {b.name})",
        a.dtype,
        broadcast(broadcast(a.shape, c.shape), b.shape),
    )


def matmul(draw, scope: Scope) -> Result | None:
    a = _pick(draw, _of(scope, lambda v: v.dtype in FLOATS and 1 <= len(v.shape) <= 2))
    if a is None:
        return None
    k = a.shape[-1]
    b = _pick(
        draw,
        _of(scope, lambda v: v.dtype == a.dtype and 1 <= len(v.shape) <= 2 and v.shape[0] == k),
    )
    if b is None:
        return None
    shape = a.shape[:-1] + b.shape[1:]
    return f"({a.name} @ {b.name}).clamp(-4, 4)", a.dtype, shape


def layer_norm(draw, scope: Scope) -> Result | None:
    # float32 only: torch.onnx exports layer_norm with stash_type=1, which computes the mean and
    # variance of float64 input in float32 (with or without a loop around it).
    a = _pick(draw, _of(scope, lambda v: v.dtype == "float32" and v.shape))
    if a is None:
        return None
    # A large eps: a nearly constant row would otherwise turn rounding into O(1) differences.
    return f"F.layer_norm({a.name}, ({a.shape[-1]},), eps=0.1)", a.dtype, a.shape


def index_select(draw, scope: Scope) -> Result | None:
    a = _pick(draw, _of(scope, lambda v: v.shape and v.dtype != "bool"))
    if a is None:
        return None
    n = a.shape[-1]
    idx = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3))
    return f"{a.name}.index_select(-1, torch.tensor({idx}))", a.dtype, (*a.shape[:-1], len(idx))


def gather(draw, scope: Scope) -> Result | None:
    a = _pick(draw, _of(scope, lambda v: v.shape and v.dtype != "bool"))
    if a is None:
        return None
    n, k = a.shape[-1], draw(st.integers(1, 3))
    rows = 1
    for d in a.shape[:-1]:
        rows *= d
    flat = draw(st.lists(st.integers(0, n - 1), min_size=rows * k, max_size=rows * k))
    shape = (*a.shape[:-1], k)
    return f"torch.gather({a.name}, -1, torch.tensor({flat}).reshape{shape})", a.dtype, shape


def cat(draw, scope: Scope) -> Result | None:
    a = _pick(draw, _of(scope, lambda v: v.shape))
    if a is None:
        return None
    b = _pick(
        draw,
        _of(
            scope,
            lambda v: (
                v.dtype == a.dtype and len(v.shape) == len(a.shape) and v.shape[:-1] == a.shape[:-1]
            ),
        ),
    )
    if a.shape[-1] + b.shape[-1] > 8:
        return None
    return (
        f"torch.cat([{a.name}, {b.name}], -1)",
        a.dtype,
        (*a.shape[:-1], a.shape[-1] + b.shape[-1]),
    )


def stack(draw, scope: Scope) -> Result | None:
    a = _pick(draw, _of(scope, lambda v: len(v.shape) <= 1))
    if a is None:
        return None
    b = _pick(draw, _of(scope, lambda v: v.dtype == a.dtype and v.shape == a.shape))
    return f"torch.stack([{a.name}, {b.name}])", a.dtype, (2, *a.shape)


def take_step(draw, scope: Scope) -> Result | None:
    """``x[i % n]`` or ``x[:, i % n]``: index by the loop's counter, or by an int64 0-d value."""
    counters = [scope.index] if scope.index else []
    counters += [
        v.name for v in scope.pool if v.dtype == "int64" and v.shape == () and v.name != scope.index
    ]
    a = _pick(draw, _of(scope, lambda v: v.shape))
    if a is None or not counters:
        return None
    i = draw(st.sampled_from(counters))
    if len(a.shape) >= 2 and draw(st.booleans()):
        return f"{a.name}[:, {i} % {a.shape[1]}]", a.dtype, (a.shape[0], *a.shape[2:])
    return f"{a.name}[{i} % {a.shape[0]}]", a.dtype, a.shape[1:]


def slice_last(draw, scope: Scope) -> Result | None:
    a = _pick(draw, _of(scope, lambda v: v.shape and v.shape[-1] >= 2))
    if a is None:
        return None
    return f"{a.name}[..., 1:]", a.dtype, (*a.shape[:-1], a.shape[-1] - 1)


def transpose(draw, scope: Scope) -> Result | None:
    a = _pick(draw, _of(scope, lambda v: len(v.shape) == 2))
    if a is None:
        return None
    return f"{a.name}.t()", a.dtype, a.shape[::-1]


def flatten(draw, scope: Scope) -> Result | None:
    a = _pick(draw, _of(scope, lambda v: len(v.shape) >= 2))
    if a is None:
        return None
    n = 1
    for d in a.shape:
        n *= d
    return f"{a.name}.reshape(-1)", a.dtype, (n,)


def cast(draw, scope: Scope) -> Result | None:
    """Casts between the four dtypes; float to int64 through ``floor`` of a scaled value."""
    a = _pick(draw, scope.pool)
    target = draw(
        st.sampled_from([d for d in ("float32", "float64", "int64", "bool") if d != a.dtype])
    )
    if a.dtype in FLOATS and target == "int64":
        return f"torch.floor({a.name} * 2 + 0.3).to(torch.int64)", target, a.shape
    if target == "bool":
        return f"{a.name} > {'0' if a.dtype == 'int64' else '0.3'}", target, a.shape
    return f"{a.name}.to(torch.{target})", target, a.shape


def reshaped_in_place(draw, scope: Scope) -> Result | None:
    """A view of a value with its shape changed in place and changed back (``q =
    a.unsqueeze(0); q.squeeze_(0)``, as xLSTM's step squeezes the heads of its projection):
    no argument of the step changes."""
    a = _pick(draw, scope.pool)
    return f"reshaped_in_place({a.name})", a.dtype, a.shape


OPS: list[Callable] = [
    add,
    sub,
    mul,
    tanh,
    sigmoid,
    exp,
    absolute,
    relu,
    neg,
    sqrt,
    div,
    maximum,
    minimum,
    sin,
    log1p,
    clamp,
    scale,
    where,
    matmul,
    layer_norm,
    softmax,
    cumsum,
    total,
    mean,
    amax,
    anything,
    index_select,
    gather,
    cat,
    stack,
    take_step,
    slice_last,
    transpose,
    flatten,
    flip,
    cast,
    greater,
    equal,
    threshold,
    is_positive,
    logical_and,
    logical_or,
    logical_xor,
    logical_not,
    remainder,
    floor_div,
    reshaped_in_place,
]
"""The vocabulary; the first operators are those a shrunk program falls back to."""


def statement(draw, scope: Scope) -> Result:
    """One new value: an operator drawn from :data:`OPS`, or the next one that fits."""
    start = draw(st.integers(0, len(OPS) - 1))
    for k in range(len(OPS)):
        out = OPS[(start + k) % len(OPS)](draw, scope)
        if out is not None:
            return out
    raise AssertionError("no operator fits")  # add always fits a non-empty scope
