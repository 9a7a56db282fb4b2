"""Hoisting (``torchscan._hoist``): the work of a step that does not depend on the carry, done
once per call, against the hand-written Python loop; and the rules of what is never hoisted."""

from __future__ import annotations

import contextlib
import functools
import gc
import io
import random
import sys
import types
import warnings

import hypothesis
import hypothesis.strategies as st
import pytest
import torch
import torch.utils._pytree as pytree

import torchscan
from torchscan import _hoist

from ._oracles import scan_loop

T, B, H = 20, 3, 5


@pytest.fixture(autouse=True)
def _fresh_cache():
    _hoist.clear()
    yield
    _hoist.clear()


def run_until_traced(fn, init, xs, **kwargs):
    """``torchscan.scan`` called until a signature is traced (at its third call); the last
    call's results and what it did."""
    for _ in range(_hoist.TRACE_AT_CALL - 1):
        torchscan.scan(fn, init, xs, **kwargs)
    out = torchscan.scan(fn, init, xs, **kwargs)
    return out, _hoist.last.what, _hoist.last.reason


def close(got, want, **tol):
    for g, w in zip(pytree.tree_leaves(got), pytree.tree_leaves(want), strict=True):
        torch.testing.assert_close(g, w, **tol)


def grads(outputs, inputs):
    total = sum(leaf.sum() for leaf in pytree.tree_leaves(outputs) if leaf is not None)
    return torch.autograd.grad(total, inputs, allow_unused=True)


# ---------------------------------------------------------------------------------------------
# The same results and gradients as the Python loop


class Elman(torch.nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.W = torch.nn.Parameter(torch.randn(size, size) / size**0.5)
        self.U = torch.nn.Parameter(torch.randn(size, size) / size**0.5)
        self.b = torch.nn.Parameter(torch.randn(size))

    def forward(self, h, x):
        h = torch.tanh(x @ self.W + self.b + h @ self.U)
        return h, h


class LSTM(torch.nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.cell = torch.nn.LSTMCell(size, size)

    def forward(self, carry, x):
        h, c = self.cell(x, carry)
        return (h, c), h


class GRU(torch.nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.cell = torch.nn.GRUCell(size, size)
        self.out = torch.nn.Linear(size, 2)

    def forward(self, h, x):
        h = self.cell(x, h)
        return h, {"logits": self.out(h), "input": torch.relu(x) * 2, "none": None}


def init_of(model, batch):
    h = torch.randn(batch, H, requires_grad=True)
    if isinstance(model, LSTM):
        return (h, torch.randn(batch, H, requires_grad=True))
    return h


@pytest.mark.parametrize("kind", [Elman, LSTM, GRU])
@pytest.mark.parametrize("reverse", [False, True])
def test_results_and_gradients_are_the_python_loops(kind, reverse):
    torch.manual_seed(0)
    model = kind(H)
    xs = torch.randn(T, B, H, requires_grad=True)
    init = init_of(model, B)
    (carry, ys), what, reason = run_until_traced(model, init, xs, reverse=reverse)
    assert what == "hoisted", reason
    want = scan_loop(model, init, xs, reverse=reverse)
    close((carry, ys), want)
    inputs = [xs, *pytree.tree_leaves(init), *model.parameters()]
    for got, expected in zip(grads((carry, ys), inputs), grads(want, inputs), strict=True):
        torch.testing.assert_close(got, expected)


@hypothesis.given(
    kind=st.sampled_from([Elman, LSTM, GRU]),
    length=st.integers(1, 20),
    batch=st.integers(1, 4),
    axis=st.sampled_from([0, 1]),
    reverse=st.booleans(),
    grad=st.booleans(),
)
@hypothesis.settings(max_examples=25)
def test_any_length_batch_axis_and_direction(kind, length, batch, axis, reverse, grad):
    torch.manual_seed(1)
    model = kind(H)
    xs = torch.randn(length, batch, H).movedim(0, axis)
    init = init_of(model, batch)
    with torch.set_grad_enabled(grad):
        (carry, ys), what, reason = run_until_traced(
            model, init, xs, axis=axis, reverse=reverse, hoist=True
        )
        want = scan_loop(model, init, xs, axis=axis, reverse=reverse)
    assert what == "hoisted", reason
    close((carry, ys), want)


def test_the_loop_part_reads_the_current_values_of_parameters():
    model = Elman(H)
    xs, h = torch.randn(T, B, H), torch.randn(B, H)
    run_until_traced(model, h, xs)
    with torch.no_grad():
        model.W.mul_(2.0)  # an optimizer's step
    close(torchscan.scan(model, h, xs), scan_loop(model, h, xs))
    model.U = torch.nn.Parameter(torch.randn(H, H))  # a parameter replaced
    close(torchscan.scan(model, h, xs), scan_loop(model, h, xs))
    assert _hoist.last.what in ("hoisted", "first call")


def test_a_signature_is_traced_once():
    model = Elman(H)
    xs, h = torch.randn(T, B, H), torch.randn(B, H)
    before = _hoist._signature.traces
    for _ in range(5):
        torchscan.scan(model, h, xs)
    assert _hoist._signature.traces - before == 1
    torchscan.scan(model, h, torch.randn(2 * T, B, H))  # another length: the same signature
    assert _hoist._signature.traces - before == 1
    for _ in range(3):
        torchscan.scan(model, torch.randn(B + 1, H), torch.randn(T, B + 1, H))  # other shapes
    assert _hoist._signature.traces - before == 2


def test_a_step_defined_at_every_call_is_traced_once():
    model = Elman(H)
    xs, h = torch.randn(T, B, H), torch.randn(B, H)
    before = _hoist._signature.traces

    def forward(memory):
        def step(h, x):  # a new closure at every call, capturing a new tensor
            h = torch.tanh(model.W @ x.T).T + h @ model.U + memory
            return h, h

        return torchscan.scan(step, h, xs)

    for _ in range(4):
        memory = torch.randn(B, H)
        got = forward(memory)
        close(got, scan_loop(functools.partial(_elman_memory, model, memory=memory), h, xs))
    assert _hoist._signature.traces - before == 1
    assert _hoist.last.what == "hoisted"


def _elman_memory(model, h, x, *, memory):
    h = torch.tanh(model.W @ x.T).T + h @ model.U + memory
    return h, h


def test_python_values_a_step_reads_are_part_of_its_signature():
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(H, H)
            self.scale = 1.0

        def forward(self, h, x):
            return torch.tanh(self.lin(x) * self.scale + h), h

    model = Scaled()
    xs, h = torch.randn(T, B, H), torch.randn(B, H)
    run_until_traced(model, h, xs)
    for scale in (2.0, -1.0):
        model.scale = scale
        for _ in range(2):
            close(torchscan.scan(model, h, xs), scan_loop(model, h, xs))
    module = types.ModuleType("config")
    module.SHIFT = 0.0
    sys.modules["_hoist_test_config"] = module

    def step(h, x, config=module):
        return h + x + config.SHIFT, h

    run_until_traced(step, h, xs)
    module.SHIFT = 3.0
    close(torchscan.scan(step, h, xs), scan_loop(step, h, xs))


SHIFT = 0.0  # a global the step of the test below reads


class _Stateful(torch.nn.Module):
    """A step that reads state of every kind a step can read: its parameters, a submodule with
    hooks, a Python attribute, a captured list and dict, a closure's variable, a default
    argument and a global."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(H, H)
        self.scale = 1.0
        self.extra = [torch.zeros(H)]
        self.table = {"bias": torch.zeros(H)}
        offset = torch.zeros(H)

        def shifted(h, offset_scale=1.0):
            return h + offset * offset_scale + SHIFT

        self.shifted = shifted
        self.set_offset = lambda value: shifted.__closure__[0].__setattr__("cell_contents", value)

    def forward(self, h, x):
        h = torch.tanh(self.lin(x) * self.scale + h + self.extra[0] + self.table["bias"])
        return self.shifted(h), h


def _replace_weight(model):
    model.lin.weight = torch.nn.Parameter(torch.randn(H, H))


def _add_hook(model):
    model.lin.register_forward_hook(lambda module, args, out: out * 2)


def _set_global(model):
    global SHIFT
    SHIFT = 0.5


def _other_submodule(model):
    model.lin = torch.nn.Sequential(torch.nn.Linear(H, H), torch.nn.Tanh())


CHANGES = {
    "a parameter replaced": _replace_weight,
    "a parameter's values changed in place": lambda m: m.lin.bias.data.add_(1.0),
    "gradients turned off on a parameter": lambda m: m.lin.weight.requires_grad_(False),
    "a forward hook added": _add_hook,
    "a Python attribute set": lambda m: setattr(m, "scale", -2.0),
    "a list item replaced": lambda m: m.extra.__setitem__(0, torch.ones(H)),
    "a dict value replaced": lambda m: m.table.__setitem__("bias", torch.ones(1)),
    "a closure's variable set": lambda m: m.set_offset(torch.ones(H)),
    "a default argument replaced": lambda m: setattr(m.shifted, "__defaults__", (3.0,)),
    "a global set": _set_global,
    "a submodule replaced": _other_submodule,
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_every_change_of_what_a_step_reads_is_seen_at_the_next_call(change, monkeypatch):
    """The walk of a module a step reads (kept from call to call) is read again only where
    something it read changed: any change between two calls is seen at the next one."""
    monkeypatch.setattr(sys.modules[__name__], "SHIFT", 0.0)
    model = _Stateful()
    xs, h = torch.randn(T, B, H), torch.randn(B, H)
    (got, what, reason) = run_until_traced(model, h, xs)
    assert what == "hoisted", reason
    close(got, scan_loop(model, h, xs))

    def kept_walk() -> object:
        _hoist.signature(model, ())
        return _hoist._module_walks[id(model)][2]

    walk = kept_walk()
    assert kept_walk() is walk  # read once while nothing changes
    CHANGES[change](model)
    # values are read at every call, never part of a signature
    read_again = change != "a parameter's values changed in place"
    assert (kept_walk() is not walk) == read_again
    for _ in range(_hoist.TRACE_AT_CALL):
        close(torchscan.scan(model, h, xs), scan_loop(model, h, xs))


def test_a_step_made_at_every_call_is_not_kept_with_what_it_captures():
    """A closure made at every call (as a converted loop's step is) is read at every call,
    and nothing it captured outlives the call: not the tensors of the call before."""
    import gc
    import weakref

    lin = torch.nn.Linear(H, H)
    h = torch.randn(B, H)
    freed = []
    for _ in range(_hoist.TRACE_AT_CALL + 2):
        captured, xs = torch.randn(B, H), torch.randn(T, B, H)

        def step(h, x, captured=captured):
            return torch.tanh(lin(x) + h + captured), h

        close(torchscan.scan(step, h, xs), scan_loop(step, h, xs))
        freed.append(weakref.ref(captured))
        del captured, step
    assert _hoist.last.what == "hoisted", _hoist.last.reason
    gc.collect()
    assert [ref() for ref in freed] == [None] * len(freed)


def test_a_module_that_holds_its_owner_is_read_and_its_changes_seen():
    """A module reached from itself (a child that holds its parent) is walked once, and a
    change of the parent it holds is seen at the next call."""

    class Child(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(H, H)

        def forward(self, x):
            return self.lin(x) * self.owner[0].scale

    class Parent(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.child = Child()
            self.child.owner = [self]  # (a list: no submodule of its own)
            self.scale = 1.0

        def forward(self, h, x):
            return torch.tanh(self.child(x) + h), h

    model = Parent()
    xs, h = torch.randn(T, B, H), torch.randn(B, H)
    (got, what, reason) = run_until_traced(model, h, xs)
    assert what == "hoisted", reason
    close(got, scan_loop(model, h, xs))
    model.scale = 3.0
    close(torchscan.scan(model, h, xs), scan_loop(model, h, xs))


def test_a_modules_training_flag_is_part_of_its_signature():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(H, H), torch.nn.Dropout(0.5))

    def step(h, x):
        h = torch.tanh(model(x) + h)
        return h, h

    xs, h = torch.randn(T, B, H), torch.randn(B, H)
    model.eval()
    run_until_traced(step, h, xs)
    model.train()
    torch.manual_seed(3)
    got = torchscan.scan(step, h, xs)
    torch.manual_seed(3)
    close(got, scan_loop(step, h, xs))


# ---------------------------------------------------------------------------------------------
# What is hoisted


def test_the_input_projection_runs_once_over_the_sequence():
    model = Elman(H)
    xs, h = torch.randn(T, B, H), torch.randn(B, H)
    run_until_traced(model, h, xs)
    hoisted = next(v for v in _hoist._signature._cache.values() if isinstance(v, _hoist.Hoisted))
    assert hoisted.sequence_count == 1
    assert [op for op in hoisted.operations if "mm" in op] == ["mm.default"]  # h @ U only
    with CountProducts() as products:
        torchscan.scan(model, h, xs)
    assert products.count == T + 1  # one product per step, and one over all of them


def test_work_on_parameters_alone_runs_once():
    log_a = torch.nn.Parameter(torch.randn(H))

    def step(h, x):
        a = -torch.exp(log_a)  # as a state-space model discretizes
        h = h * torch.exp(a) + x
        return h, h

    xs, h = torch.randn(T, B, H), torch.randn(B, H)
    (carry, ys), what, reason = run_until_traced(step, h, xs)
    assert what == "hoisted", reason
    hoisted = next(v for v in _hoist._signature._cache.values() if isinstance(v, _hoist.Hoisted))
    assert not [op for op in hoisted.operations if "exp" in op]
    close((carry, ys), scan_loop(step, h, xs))
    got, want = grads((carry, ys), [log_a]), grads(scan_loop(step, h, xs), [log_a])
    torch.testing.assert_close(got[0], want[0])


class CountProducts(torch.overrides.TorchFunctionMode):
    """Counts the matrix products torch is asked for."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "").split(".")[0]  # aten.mm.default is "mm.default"
        self.count += name in ("mm", "addmm", "matmul", "__matmul__")
        return func(*args, **(kwargs or {}))


def test_a_short_scan_computes_the_sequence_part_in_the_loop():
    model = Elman(H)
    n = _hoist._policy.BATCH_FROM - 1
    xs, h = torch.randn(n, B, H), torch.randn(B, H)
    (got, what, reason) = run_until_traced(model, h, xs)
    assert what == "hoisted", reason
    close(got, scan_loop(model, h, xs))
    with CountProducts() as products:
        torchscan.scan(model, h, xs)
    assert products.count == 2 * n  # both products at every step: nothing batched
    xs = torch.randn(n + 1, B, H)
    with CountProducts() as products:
        got = torchscan.scan(model, h, xs)
    assert products.count == n + 1 + 1  # the input projection once, batched
    close(got, scan_loop(model, h, xs))


def test_hoist_false_never_traces():
    model = Elman(H)
    xs, h = torch.randn(T, B, H), torch.randn(B, H)
    before = _hoist._signature.traces
    for _ in range(3):
        torchscan.scan(model, h, xs, hoist=False)
    assert _hoist._signature.traces == before


def test_hoisting_that_would_take_too_much_memory_is_left_to_hoist_true(monkeypatch):
    model = Elman(H)
    xs, h = torch.randn(T, B, H), torch.randn(B, H)
    monkeypatch.setattr(_hoist._policy, "AUTO_MEMORY_LIMIT", T * B * H * 4 - 1)
    run_until_traced(model, h, xs)
    with CountProducts() as products:
        got = torchscan.scan(model, h, xs)
    assert products.count == 2 * T  # both products at every step, as the Python loop
    close(got, scan_loop(model, h, xs))
    with CountProducts() as products:
        torchscan.scan(model, h, xs, hoist=True)
    assert products.count == T + 1
    monkeypatch.setattr(_hoist._policy, "AUTO_MEMORY_LIMIT", T * B * H * 4)
    with CountProducts() as products:
        torchscan.scan(model, h, xs)
    assert products.count == T + 1


def test_hoist_must_be_a_bool_or_none():
    with pytest.raises(
        TypeError, match=r"torchscan.scan: hoist must be True, False or None, but it is a str"
    ):
        torchscan.scan(lambda c, x: (c, x), torch.zeros(()), torch.zeros(3), hoist="yes")


# ---------------------------------------------------------------------------------------------
# What is never hoisted: the step runs as the Python loop, with the Python loop's effects


def not_hoisted(fn, init, xs, reason):
    """The step runs as the loop (with ``hoist=True``: a warning says why), and gives the
    Python loop's results."""
    with pytest.warns(torchscan.HoistWarning, match=reason):
        return torchscan.scan(fn, init, xs, hoist=True)


def test_random_operations_keep_the_loops_random_stream():
    lin = torch.nn.Linear(H, H)

    def step(h, x):
        noise = torch.randn_like(h)
        h = torch.tanh(torch.nn.functional.dropout(lin(x), 0.3) + h) + 0.1 * noise
        return h, h

    xs, h = torch.randn(T, B, H), torch.randn(B, H)
    run_until_traced(step, h, xs)
    assert _hoist.last.what == "hoisted"
    torch.manual_seed(5)
    got = torchscan.scan(step, h, xs)
    torch.manual_seed(5)
    close(got, scan_loop(step, h, xs))


def test_a_step_that_reads_a_value_in_python():
    def step(h, x):
        if x.sum() > 0:
            return h + x, h
        return h - x, h

    xs, h = torch.randn(T, B, H), torch.randn(B, H)
    got = not_hoisted(
        step,
        h,
        xs,
        r"reads a tensor's value in Python .* at .*test_hoist.py:\d+ \(if x.sum\(\) > 0:\)",
    )
    close(got, scan_loop(step, h, xs))


def test_a_step_that_changes_a_captured_list():
    seen = []

    def step(h, x):
        seen.append(x)
        return h + x, h

    xs, h = torch.randn(T, B, H), torch.randn(B, H)
    not_hoisted(step, h, xs, r"changes a captured list \(append\)")
    assert len(seen) == T


def test_a_step_that_prints():
    def step(h, x):
        print("step")
        return h + x, h

    xs, h = torch.randn(T, B, H), torch.randn(B, H)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        not_hoisted(step, h, xs, r"calls print")
    assert out.getvalue().count("step") == T


def test_a_step_that_counts_its_calls():
    calls = 0

    def step(h, x):
        nonlocal calls
        calls += 1
        return h + x, h

    xs, h = torch.randn(T, B, H), torch.randn(B, H)
    not_hoisted(step, h, xs, r"changes state \(store_deref calls\)")
    assert calls == T


def test_a_module_that_keeps_its_last_state():
    class Remember(torch.nn.Module):
        def forward(self, h, x):
            self.last = h
            return h + x, h

    model = Remember()
    xs, h = torch.randn(T, B, H), torch.randn(B, H)
    carry, _ = not_hoisted(model, h, xs, r"changes state \(store_attr last\)")
    torch.testing.assert_close(model.last, carry - xs[-1])


def test_a_step_that_draws_python_random_numbers():
    def step(h, x):
        return h + x * random.random(), h

    xs, h = torch.randn(T, B, H), torch.randn(B, H)
    random.seed(0)
    got = not_hoisted(step, h, xs, r"random")
    random.seed(0)
    close(got, scan_loop(step, h, xs))


def test_a_step_that_writes_into_a_captured_buffer():
    count = torch.zeros(())

    def step(h, x):
        count.add_(1)
        return h + x, h

    xs, h = torch.randn(T, B, H), torch.randn(B, H)
    not_hoisted(step, h, xs, r"writes in place into a captured tensor \(add_\)")
    assert count.item() == T  # the trace stopped before the write


def test_a_batch_norm_that_updates_its_statistics():
    norm = torch.nn.BatchNorm1d(H)

    def step(h, x):
        return torch.tanh(norm(x) + h), h

    xs, h = torch.randn(T, B, H), torch.randn(B, H)
    not_hoisted(step, h, xs, r"writes in place")
    assert norm.num_batches_tracked.item() == T
    norm.eval()
    (got, _), what, reason = run_until_traced(step, h, xs)
    assert what == "hoisted", reason
    close(got, scan_loop(step, h, xs)[0])


def test_a_value_written_into_at_every_step_is_made_at_every_step():
    lin = torch.nn.Linear(H, H)

    def step(h, x):
        a = lin(x)  # from x alone, but written into with the carry
        a.add_(h)
        return torch.tanh(a), h

    xs, h = torch.randn(T, B, H), torch.randn(B, H)
    (got, ys), what, reason = run_until_traced(step, h, xs)
    assert what == "hoisted", reason
    hoisted = next(v for v in _hoist._signature._cache.values() if isinstance(v, _hoist.Hoisted))
    assert "addmm.default" in hoisted.operations
    assert hoisted.sequence_count == 0
    close((got, ys), scan_loop(step, h, xs))


def test_writes_into_values_made_at_every_step_are_hoisted():
    lin = torch.nn.Linear(H, H)

    def step(h, x):
        a = h @ lin.weight
        a.add_(lin(x))
        a.tanh_()
        return a, a

    xs, h = torch.randn(T, B, H), torch.randn(B, H)
    (got, ys), what, reason = run_until_traced(step, h, xs)
    assert what == "hoisted", reason
    close((got, ys), scan_loop(step, h, xs))


def test_a_nested_scan_is_not_hoisted():
    def inner(c, x):
        return c + x, c

    def step(h, x):
        c, _ = torchscan.scan(inner, h, x)
        return c, c

    xs, h = torch.randn(T, B, H), torch.randn(H)
    got = not_hoisted(step, h, xs, r"runs a scan or loop of its own")
    close(got, scan_loop(step, h, xs))


@pytest.mark.parametrize("reverse", [False, True])
def test_until_stops_the_hoisted_loop_where_the_python_loop_stops(reverse):
    lin = torch.nn.Linear(H, H)

    def step(h, x):
        h = h + torch.sigmoid(lin(x))
        return h, {"h": h, "none": None}, torchscan.until(h.sum() > 20)

    xs, h = torch.randn(T, B, H), torch.zeros(B, H)
    (carry, ys), what, reason = run_until_traced(step, h, xs, reverse=reverse)
    assert what == "hoisted", reason
    want = scan_loop(step, h, xs, reverse=reverse)
    assert 1 < ys["h"].shape[0] < T
    close((carry, ys), want)


def test_user_tensors_are_never_changed():
    model = Elman(H)
    xs, h = torch.randn(T, B, H), torch.randn(B, H)
    copies = [t.clone() for t in (xs, h, *model.parameters())]
    run_until_traced(model, h, xs)
    for t, copy in zip((xs, h, *model.parameters()), copies, strict=True):
        assert torch.equal(t, copy)


def test_under_a_cprofile_nothing_is_traced():
    import cProfile

    model = Elman(H)
    xs, h = torch.randn(T, B, H), torch.randn(B, H)
    profile = cProfile.Profile()
    before = _hoist._signature.traces
    profile.enable()
    try:
        for _ in range(2):
            got = torchscan.scan(model, h, xs)
    finally:
        profile.disable()
    assert _hoist._signature.traces == before
    close(got, scan_loop(model, h, xs))


def test_a_python_profile_function_keeps_running_while_a_step_is_traced():
    events = []
    model = Elman(H)
    xs, h = torch.randn(T, B, H), torch.randn(B, H)
    sys.setprofile(lambda frame, event, arg: events.append(event))
    try:
        run_until_traced(model, h, xs)
    finally:
        sys.setprofile(None)
    assert _hoist.last.what == "hoisted"
    assert events.count("call") > 10


def test_lengths_are_hoisted_like_any_scan():
    model = LSTM(H)
    xs = torch.randn(T, B, H)
    init = init_of(model, B)
    lengths = torch.tensor([T, 3, 0])
    (got, what, reason) = run_until_traced(model, init, xs, lengths=lengths)
    assert what == "hoisted", reason
    want = torchscan.scan(model, init, xs, lengths=lengths, hoist=False)
    close(got, want)


def test_under_vmap_nothing_is_traced():
    model = Elman(H)
    xs, h = torch.randn(4, T, B, H), torch.randn(4, B, H)
    before = _hoist._signature.traces
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            got = torch.func.vmap(lambda h, xs: torchscan.scan(model, h, xs))(h, xs)
    assert _hoist._signature.traces == before
    close(got[0], torch.stack([scan_loop(model, h[i], xs[i])[0] for i in range(4)]))


def test_the_structure_of_x_is_part_of_the_signature():
    def mix(carry, x):
        total = sum(leaf.sum() for leaf in pytree.tree_leaves(x))
        return carry * 0.5 + total, pytree.tree_map(lambda leaf: leaf * carry, x)

    xs, init = torch.randn(T, 2), torch.tensor(1.0)
    for tree in (xs, [xs], {"a": xs}, (xs,)):
        for _ in range(2):
            carry, ys = torchscan.scan(mix, init, tree)
            close((carry, ys), scan_loop(mix, init, tree))
            assert pytree.tree_structure(ys) == pytree.tree_structure(tree)


def test_the_values_of_captured_tensors_are_never_read_while_tracing():
    xs, h = torch.randn(T, B, H), torch.randn(B, H)
    for i in range(3):  # a loop's counter, captured: xs[i] would be traced as xs[0]
        index = torch.tensor(i)

        def step(c, x, index=index):
            return torch.tanh(c + x * xs[index]), c

        got = not_hoisted(step, h, xs, r"reads the value of a captured 0-d tensor")
        close(got, scan_loop(step, h, xs))
    threshold = torch.tensor(0.5)

    def gated(c, x):
        if threshold > 0:  # a captured tensor's value, read by Python
            return c + x, c
        return c - x, c

    got = not_hoisted(gated, h, xs, r"reads (the|a) tensor's value|reads the value")
    close(got, scan_loop(gated, h, xs))


def test_steps_of_programs_made_and_dropped_never_share_a_signature():
    """Code objects and classes of programs built and dropped one after another (as ``exec``
    makes them) may take one another's addresses; a signature holds what it names."""
    import gc

    xs, h = torch.randn(T, 2), torch.randn(2)
    for k in range(6):
        source = f"def step(c, x):\n    return c + x * {k}, x * {k + 1}\n"
        namespace: dict = {}
        exec(compile(source, f"<program {k}>", "exec"), namespace)
        step = namespace["step"]
        for _ in range(2):
            close(torchscan.scan(step, h, xs), scan_loop(step, h, xs))
        del namespace, step
        gc.collect()


def test_gradcheck_and_gradgradcheck_through_the_hoisted_loop():
    torch.manual_seed(0)
    cell = torch.nn.GRUCell(3, 2).double()

    def step(h, x):
        h = cell(x, h)
        return h, h

    xs = torch.randn(_hoist._policy.BATCH_FROM, 2, 3, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(2, 2, dtype=torch.float64, requires_grad=True)
    run_until_traced(step, h0, xs)
    assert _hoist.last.what == "hoisted"

    def loss(xs, h0):
        return torchscan.scan(step, h0, xs)[1].pow(2).sum()

    assert torch.autograd.gradcheck(loss, (xs, h0))
    assert torch.autograd.gradgradcheck(loss, (xs, h0))
    assert _hoist.last.what == "hoisted"


# ---------------------------------------------------------------------------------------------
# Copies that change nothing cost nothing


def delta_rule_with_copies(S, x):
    """The delta rule as reference implementations write it: copies before reads and updates."""
    q, k, v, beta = x
    v = v.clone()
    v = (v - (S.clone() * k[..., None]).sum(-2)) * beta[..., None]
    S = S.clone() + k.unsqueeze(-1) * v.unsqueeze(-2)
    return S, torch.einsum("bd,bdm->bm", q, S)


def delta_rule_updated_in_place(S, x):
    q, k, v, beta = x
    S = S.clone()
    v_old = (S * k[..., None]).sum(-2)
    S += k.unsqueeze(-1) * (beta[..., None] * (v - v_old)).unsqueeze(-2)
    return S, torch.einsum("bd,bdm->bm", q, S)


@pytest.mark.parametrize("step", [delta_rule_with_copies, delta_rule_updated_in_place])
def test_copies_before_reads_and_updates_are_left_out_of_the_loop(step):
    # The Python loop of the in-place update cannot be differentiated (S * k saves the copy
    # that += then changes): compared without gradients.
    grad = step is delta_rule_with_copies
    xs = tuple(torch.randn(T, B, H, requires_grad=grad) for _ in range(3))
    xs += (torch.rand(T, B, requires_grad=grad),)
    S = torch.randn(B, H, H, requires_grad=grad)
    (carry, ys), what, reason = run_until_traced(step, S, xs)
    assert what == "hoisted", reason
    hoisted = next(v for v in _hoist._signature._cache.values() if isinstance(v, _hoist.Hoisted))
    assert not [op for op in hoisted.operations if "clone" in op or "copy" in op]
    want = scan_loop(step, S, xs)
    close((carry, ys), want)
    if grad:
        got, expected = grads((carry, ys), [S, *xs]), grads(want, [S, *xs])
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(g, e)


def keeps_a_copy_of_a_value_it_then_changes(c, x):
    a = x * 2
    b = a.clone()
    a.add_(1)
    return c + a * b, b


def reads_a_view_of_the_copy_before_the_write(c, x):
    d = c.clone()
    first = d[0]
    d.mul_(3)
    return d + first, first * 1


def returns_the_copy(c, x):
    return c.clone(), x.clone()


@pytest.mark.parametrize(
    "step",
    [
        keeps_a_copy_of_a_value_it_then_changes,
        reads_a_view_of_the_copy_before_the_write,
        returns_the_copy,
    ],
)
def test_copies_that_matter_are_kept(step):
    xs, c = torch.randn(T, B, H), torch.randn(B, H)
    before = c.clone()
    (carry, ys), what, reason = run_until_traced(step, c, xs)
    assert what == "hoisted", reason
    close((carry, ys), scan_loop(step, c, xs))
    if step is returns_the_copy:  # the carry returned is never the caller's tensor
        assert carry.data_ptr() != c.data_ptr()
        carry.add_(1)
        assert torch.equal(c, before)


def test_a_distribution_that_checks_its_arguments_is_not_hoisted_naming_validate_args():
    def step(c, x):
        d = torch.distributions.Normal(x, torch.ones_like(x), validate_args=True)
        return c + d.log_prob(c), c

    xs, c = torch.randn(T, H), torch.zeros(H)
    with pytest.warns(torchscan.HoistWarning) as record:
        got = torchscan.scan(step, c, xs, hoist=True)
    (warning,) = record
    assert str(warning.message).endswith(
        "torch.distributions checks the values of a distribution's arguments when it is made "
        "(validate_args), which reads them: make it with validate_args=False "
        "(torch.distributions.Normal(loc, scale, validate_args=False)), or turn the checks off "
        "for every distribution with "
        "torch.distributions.Distribution.set_default_validate_args(False). It runs as the "
        "Python loop, every step as written."
    )
    close(got, scan_loop(step, c, xs))


def test_until_of_a_python_bool_is_refused_as_the_python_loop_refuses_it():
    def step(c, x):
        return c + x, None, torchscan.until(True)

    for hoist in (True, None, False):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # hoist=True does not warn: it is no hoisting matter
            with pytest.raises(torchscan.TorchscanTypeError) as info:
                torchscan.scan(step, torch.zeros(2), torch.ones(3, 2), hoist=hoist)
        assert str(info.value) == (
            "torchscan.scan: until(stop) needs stop to be a 0-d bool tensor, but fn returned a "
            "bool in step 0."
        )


def test_a_carry_of_integer_and_bool_scalars_is_hoisted():
    """A 0-d integer or bool carry (a counter, a done flag) is made a fake tensor to trace the
    step, whose metadata torch reads then (is_inference): no value of a captured tensor is
    read, and the step is hoisted, with the Python loop's results."""

    def step(carry, x):
        h, count, done = carry
        h = torch.tanh(h + x)
        done = done | (h.sum() > 1)
        return (h, count + 1, done), torch.where(done, h, -h)

    xs = torch.randn(T, B, H)
    init = (torch.zeros(B, H), torch.tensor(0), torch.tensor(False))
    (carry, ys), what, reason = run_until_traced(step, init, xs)
    assert what == "hoisted", reason
    close((carry, ys), scan_loop(step, init, xs))


_COLLECTIONS: list[str] = []


def _counts_collections(phase: str, info: dict) -> None:
    global _COLLECTIONS
    _COLLECTIONS = [*_COLLECTIONS, phase]  # (a callback that changes state, as TorchDynamo's)


def test_a_garbage_collection_while_a_step_is_traced_is_not_the_steps():
    """A collection may start on any allocation of the step: its callbacks run on the step's
    frame, change state of their own, and are neither the step's Python nor refused in it."""
    model = Elman(H)

    def step(h, x):
        _ = [[] for _ in range(100)]  # (allocations of the step's own frame)
        return model(h, x)

    xs, h = torch.randn(T, B, H), torch.randn(B, H)
    gc.callbacks.append(_counts_collections)
    threshold = gc.get_threshold()
    gc.set_threshold(20, 10**6, 10**6)  # a young collection every 20 allocations
    try:
        (got, what, reason) = run_until_traced(step, h, xs)
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(_counts_collections)
    assert what == "hoisted", reason
    assert _COLLECTIONS
    close(got, scan_loop(model, h, xs))


def test_a_tensor_subclass_among_the_arguments_runs_the_loop_without_a_warning() -> None:
    """No signature holds a tensor subclass: the scan runs as the Python loop, also with
    ``hoist=True``, and says nothing of an earlier scan."""

    class Tagged(torch.Tensor):
        pass

    _hoist.clear()
    xs = torch.randn(20, 2, 3)
    for _ in range(3):  # an earlier scan that is refused: the last outcome is a refusal
        torchscan.scan(
            lambda c, x: (c + x if bool(x.sum() > 0) else c - x, x), torch.zeros(2, 3), xs
        )
    assert _hoist.last.what == "loop"
    tagged = xs.as_subclass(Tagged)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        carry, ys = torchscan.scan(
            lambda c, x: (c + x, x * 2), torch.zeros(2, 3), tagged, hoist=True
        )
    torch.testing.assert_close(carry, xs.sum(0))
    torch.testing.assert_close(ys.as_subclass(torch.Tensor), xs * 2)
    assert _hoist.last.what == ""
