"""``scan(..., checkpoint=...)``: the same values and gradients as without it, for every schedule
and every feature of ``scan``; the steps run again as often as the schedule says (revolve's
optimum for the binomial one, from Griewank's closed form); what the forward pass keeps; the
export unchanged; and every refusal's message."""

from __future__ import annotations

import gc
import math
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torchscan
from tests._oracles import equinox_online
from torchscan import Checkpoint

T, B, H = 20, 3, 4

POLICIES: dict[str, Any] = {
    "every 1": 1,
    "every 4": 4,
    "every 7": 7,
    "sqrt": "sqrt",
    "one segment": T,
    "longer than the scan": T + 5,
    "binomial 1": Checkpoint(snapshots=1),
    "binomial 2": Checkpoint(snapshots=2),
    "binomial 5": Checkpoint(snapshots=5),
    "save mm": Checkpoint(every=5, save=[torch.ops.aten.mm]),
    "save by predicate": Checkpoint(every=3, save=lambda op: op == torch.ops.aten.tanh.default),
}


def _weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        name: (torch.randn(H, H, generator=g, dtype=torch.float64) / 2).requires_grad_()
        for name in ("W", "U", "V")
    }


def _inputs(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    xs = torch.randn(T, B, H, generator=g, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(B, H, generator=g, dtype=torch.float64, requires_grad=True)
    return xs, h0


def _elman(w: dict[str, torch.Tensor]) -> Callable[..., Any]:
    def step(h, x):
        h = torch.tanh(x @ w["W"] + h @ w["U"])
        return h, h @ w["V"]

    return step


def _case_elman(w, xs, h0, **kw):
    return torchscan.scan(_elman(w), h0, xs, **kw)


def _case_pytrees(w, xs, h0, **kw):
    def step(carry, x):
        a, _, b = x
        h = torch.tanh(a @ w["W"] + carry["h"] @ w["U"])
        c = carry["c"] * torch.sigmoid(b @ w["V"])
        return {"h": h, "c": c, "none": None}, (h, None, {"c": c})

    init = {"h": h0, "c": h0 * 2, "none": None}
    return torchscan.scan(step, init, (xs, None, xs.flip(0)), **kw)


def _case_reverse(w, xs, h0, **kw):
    return torchscan.scan(_elman(w), h0, xs, reverse=True, **kw)


def _case_bidirectional(w, xs, h0, **kw):
    def step(carry, x):
        forward, backward = carry
        forward = torch.tanh(x[0] @ w["W"] + forward @ w["U"])
        backward = torch.tanh(x[1] @ w["V"] + backward @ w["U"])
        return (forward, backward), (forward, backward)

    directions = {"in_reverse": (False, True), "out_reverse": (False, True)}
    return torchscan.scan(step, (h0, -h0), (xs, xs), **directions, **kw)


def _case_axes(w, xs, h0, **kw):
    return torchscan.scan(_elman(w), h0, xs.transpose(0, 1).contiguous(), axis=1, **kw)


def _case_lengths(w, xs, h0, **kw):
    lengths = torch.tensor([T, 11, 3])
    return torchscan.scan(_elman(w), h0, xs, lengths=lengths, **kw)


def _case_no_xs(w, xs, h0, **kw):
    def step(h, _):
        return torch.tanh(h @ w["U"] + 0.5), h.sum(-1)

    return torchscan.scan(step, h0, None, length=T, **kw)


def _case_until(w, xs, h0, **kw):
    def step(carry, x):
        h, t = carry
        h = torch.tanh(x @ w["W"] + h @ w["U"])
        return (h, t + 1), h, torchscan.until(t >= 12)  # stops after the 13th step

    return torchscan.scan(step, (h0, torch.tensor(0)), xs, **kw)


def _case_dropout(w, xs, h0, **kw):
    def step(h, x):
        h = torch.tanh(torch.nn.functional.dropout(x @ w["W"], 0.3) + h @ w["U"])
        return h, h

    torch.manual_seed(123)
    return torchscan.scan(step, h0, xs, **kw)


def _case_counter_and_view(w, xs, h0, **kw):
    def step(carry, x):
        h, previous, t = carry  # an integer carry; a carry that is the last step of xs
        h = torch.tanh(x @ w["W"] + previous @ w["U"] + h @ w["V"])
        return (h, x, t + 1), h * t

    return torchscan.scan(step, (h0, torch.zeros_like(h0), torch.tensor(0)), xs, **kw)


def _case_unchanged_leaf(w, xs, h0, **kw):
    def step(carry, x):
        h, k = carry  # k: returned as it came, at every step
        h = torch.tanh(x @ w["W"] + k @ w["U"] + h @ w["V"])
        return (h, k), h

    return torchscan.scan(step, (h0, h0 * 3), xs, **kw)


def _case_weight_and_its_double(w, xs, h0, **kw):
    W2 = w["W"] * 2  # read with W itself: W's gradient is not W2's twice over

    def step(h, x):
        h = torch.tanh(x @ W2 + x @ w["W"] + h @ w["U"])
        return h, h @ w["V"]

    return torchscan.scan(step, h0, xs, **kw)


def _case_nested(w, xs, h0, **kw):
    def step(h, x):
        def inner(c, _):
            return torch.tanh(c @ w["U"] + x @ w["W"]), None

        c, _ = torchscan.scan(inner, h, None, length=3, **kw)  # (checkpointed as the outer)
        return c, c @ w["V"]

    return torchscan.scan(step, h0, xs, **kw)


def _nested_over_captured(w, xs, h0, inner_kw, **kw):
    W2 = w["W"] * 2  # the inner scan's init and xs: a tensor the step captures

    def step(h, x):
        def inner(c, row):
            return torch.tanh(c * row + h.sum(0) + w["V"][0]), None

        c, _ = torchscan.scan(inner, W2[0], W2, **inner_kw)
        return torch.tanh(x @ w["W"] + h @ w["U"] + c), h

    return torchscan.scan(step, h0, xs, **kw)


def _case_nested_over_captured(w, xs, h0, **kw):
    return _nested_over_captured(w, xs, h0, kw, **kw)


def _case_plain_scan_over_captured(w, xs, h0, **kw):
    return _nested_over_captured(w, xs, h0, {}, **kw)


def _case_view_of_a_captured_tensor_reshaped(w, xs, h0, **kw):
    W2 = w["W"] * 2  # a tensor with a history

    def step(h, x):
        q = W2.unsqueeze(0)
        q.squeeze_(0)  # allowed on a view of a tensor with a history, not of a leaf
        return torch.tanh(x @ w["W"] + h @ w["U"] + q.sum(0)), h

    return torchscan.scan(step, h0, xs, **kw)


def _case_view_reshaped_in_place(w, xs, h0, **kw):
    def step(h, x):
        q = x.unsqueeze(0)
        q.squeeze_(0)  # a shape-only change of a view of x, which x's version counter sees
        # (read where autograd saves no view of x: the next change would be seen in backward,
        # as in the Python loop)
        return torch.tanh(q * 0.5 + h @ w["U"]), h

    # (of a leaf, torch refuses the change, as it does in the Python loop)
    return torchscan.scan(step, h0, xs * 1, **kw)


CASES: dict[str, Callable[..., Any]] = {
    "elman": _case_elman,
    "pytrees": _case_pytrees,
    "reverse": _case_reverse,
    "bidirectional": _case_bidirectional,
    "axes": _case_axes,
    "lengths": _case_lengths,
    "no xs": _case_no_xs,
    "until": _case_until,
    "dropout": _case_dropout,
    "counter and view": _case_counter_and_view,
    "unchanged leaf": _case_unchanged_leaf,
    "view reshaped in place": _case_view_reshaped_in_place,
    "a weight and its double": _case_weight_and_its_double,
    "nested": _case_nested,
    "nested over captured": _case_nested_over_captured,
    "plain scan over captured": _case_plain_scan_over_captured,
    "view of a captured tensor reshaped": _case_view_of_a_captured_tensor_reshaped,
}


def _values_and_gradients(case: Callable[..., Any], **kw: Any) -> list[torch.Tensor]:
    w = _weights()
    xs, h0 = _inputs()
    out = case(w, xs, h0, **kw)
    leaves = [leaf for leaf in torch.utils._pytree.tree_leaves(out) if leaf is not None]
    floats = [leaf for leaf in leaves if leaf.is_floating_point()]
    loss = sum(
        (leaf * torch.linspace(0.5, 1.5, leaf.numel()).view_as(leaf)).sum() for leaf in floats
    )
    inputs = [xs, h0, *w.values()]
    grads = torch.autograd.grad(loss, inputs, allow_unused=True)
    return [leaf.detach() for leaf in leaves] + [
        torch.zeros_like(i) if g is None else g for i, g in zip(inputs, grads, strict=True)
    ]


@pytest.mark.parametrize("hoist", [False, None], ids=["python loop", "hoisted"])
@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("case", list(CASES))
def test_values_and_gradients_are_the_unchecked_scan_s(case: str, policy: str, hoist) -> None:
    expected = _values_and_gradients(CASES[case], hoist=hoist)
    for _ in range(3):  # hoisted from the third call of a signature, or from the first
        got = _values_and_gradients(CASES[case], hoist=hoist, checkpoint=POLICIES[policy])
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            assert g.shape == e.shape
            torch.testing.assert_close(g, e, rtol=0, atol=1e-12)


def test_the_gradients_are_the_python_loop_s() -> None:
    """The oracle of the test above is itself the Python loop here, for every schedule."""
    w = _weights()
    xs, h0 = _inputs()
    step = _elman(w)
    h, ys = h0, []
    for x in xs:
        h, y = step(h, x)
        ys.append(y)
    loss = h.sum() + torch.stack(ys).pow(2).sum()
    expected = torch.autograd.grad(loss, [xs, h0, *w.values()])
    for policy in POLICIES.values():
        h, ys = torchscan.scan(step, h0, xs, checkpoint=policy)
        got = torch.autograd.grad(h.sum() + ys.pow(2).sum(), [xs, h0, *w.values()])
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(g, e, rtol=0, atol=1e-12)


@pytest.mark.parametrize("policy", ["every 4", "sqrt", "binomial 2"])
def test_second_derivatives_are_the_unchecked_scan_s(policy: str) -> None:
    """``create_graph=True`` through the segments: the gradient of a gradient."""

    def second(**kw: Any) -> list[torch.Tensor]:
        w = _weights()
        xs, h0 = _inputs()
        h, ys = torchscan.scan(_elman(w), h0, xs, **kw)
        (gw,) = torch.autograd.grad(h.sum() + ys.pow(2).sum(), [w["W"]], create_graph=True)
        return list(torch.autograd.grad(gw.pow(2).sum(), [xs, h0, w["U"], w["V"]]))

    expected = second()
    for _ in range(3):  # the segments hoisted from the third call
        for g, e in zip(second(checkpoint=POLICIES[policy]), expected, strict=True):
            # (second derivatives here reach thousands: 1e-12 relative too)
            torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("policy", ["every 4", "sqrt", "binomial 2"])
def test_within_torch_utils_checkpoint_the_gradients_are_the_same(policy: str) -> None:
    """A checkpointed scan in a function that ``torch.utils.checkpoint`` runs again: the
    recomputation takes the forward's path, segment by segment."""
    from torch.utils.checkpoint import checkpoint

    def gradients(outer: bool, **kw: Any) -> tuple[torch.Tensor, ...]:
        w = _weights()
        xs, h0 = _inputs()

        def run(xs: torch.Tensor, h0: torch.Tensor) -> Any:
            return torchscan.scan(_elman(w), h0, xs, **kw)

        h, ys = checkpoint(run, xs, h0, use_reentrant=False) if outer else run(xs, h0)
        return torch.autograd.grad(h.sum() + ys.pow(2).sum(), [xs, h0, *w.values()])

    expected = gradients(False, hoist=False)
    for _ in range(3):  # the segments hoisted from the third call
        got = gradients(True, checkpoint=POLICIES[policy])
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(g, e, rtol=0, atol=1e-12)


def _beta(s: int, r: int) -> int:
    return math.comb(s + r, s)


def _revolve_evaluations(n: int, snapshots: int) -> int:
    """Griewank's optimum for reversing ``n`` steps with ``snapshots + 1`` carries (the first
    included): ``r * n - beta(s + 1, r - 1)`` steps run again, ``r`` the least with
    ``n <= beta(s, r)``, plus the ``n`` steps run once with autograd."""
    if n == 1:
        return 1
    s, r = snapshots + 1, 0
    while _beta(s, r) < n:
        r += 1
    return r * n - _beta(s + 1, r - 1) + n


def _count_steps(n: int, policy: Any) -> tuple[int, int]:
    """Steps run by the forward pass, and in all once the backward pass is done."""
    calls = [0]
    U = torch.randn(H, H, dtype=torch.float64, requires_grad=True)

    def step(h, x):
        calls[0] += 1
        return torch.tanh(x + h @ U), h

    xs = torch.randn(n, B, H, dtype=torch.float64)
    h, ys = torchscan.scan(step, torch.zeros(B, H, dtype=torch.float64), xs, checkpoint=policy)
    forward = calls[0]
    (h.sum() + ys.sum()).backward()
    return forward, calls[0]


@pytest.mark.parametrize(
    ("n", "snapshots"), [(1, 2), (2, 1), (7, 1), (10, 2), (35, 3), (50, 3), (64, 4), (200, 6)]
)
def test_the_binomial_schedule_runs_revolve_s_optimum_of_steps(n: int, snapshots: int) -> None:
    forward, total = _count_steps(n, Checkpoint(snapshots=snapshots))
    assert forward == n
    assert total == _revolve_evaluations(n, snapshots)


def test_revolve_s_closed_form_is_the_optimum_of_its_recurrence() -> None:
    """The oracle above, against the recurrence it solves: a run of ``n`` steps keeps a carry
    after ``m`` of them, reverses the rest with one carry fewer, then the first ``m`` again."""
    best: dict[tuple[int, int], int] = {}
    for c in range(4):
        for n in range(1, 40):
            if n == 1:
                best[n, c] = 1
                continue
            best[n, c] = min(
                m + best[n - m, c - 1 if n - m > 1 else 0] + best[m, c]
                for m in range(1, n)
                if c > 0 or n - m == 1
            )
            assert best[n, c] == _revolve_evaluations(n, c), (n, c)


@pytest.mark.parametrize(("n", "every"), [(20, 1), (20, 6), (20, "sqrt"), (7, 20)])
def test_segments_run_every_step_once_more(n: int, every: Any) -> None:
    assert _count_steps(n, every) == (n, 2 * n)


def test_without_autograd_every_step_runs_once() -> None:
    calls = [0]

    def step(h, x):
        calls[0] += 1
        return h + x, h

    xs = torch.randn(10, 2, requires_grad=True)
    with torch.no_grad():
        torchscan.scan(step, torch.zeros(2), xs, checkpoint=3)
    assert calls[0] == 10


@pytest.mark.parametrize(
    ("policy", "alive"),
    # the binomial schedule runs its last step with autograd at once, as revolve does
    [(None, T), (1, 0), (4, 0), ("sqrt", 0), (Checkpoint(snapshots=2), 1)],
)
def test_the_forward_pass_keeps_no_step_s_activations(policy: Any, alive: int) -> None:
    """What a step saves for backward (``gate`` here, which the product saves) stays alive after
    the forward pass only without checkpointing."""
    w = _weights()
    xs, h0 = _inputs()
    gates: list[weakref.ref] = []

    def step(h, x):
        gate = torch.sigmoid(x @ w["W"])
        gates.append(weakref.ref(gate))
        return torch.tanh(gate * (h @ w["U"])), h

    h, ys = torchscan.scan(step, h0, xs, checkpoint=policy, hoist=False)
    assert sum(ref() is not None for ref in gates) == alive
    (h.sum() + ys.sum()).backward()
    assert xs.grad is not None


def _kept_after_forward(n: int, policy: Any, carry: str = "tensor") -> int:
    """The bytes of the storages that the forward pass of an LSTM-like step over ``n`` steps
    leaves alive, besides its outputs; its carry a tensor, or an LSTM's pair ``(h, c)``."""
    w = _weights()
    xs = torch.randn(n, B, H, dtype=torch.float64)
    h0 = torch.zeros(B, H, dtype=torch.float64, requires_grad=True)

    def step(h, x):
        gate = torch.sigmoid(x @ w["W"] + h @ w["U"])
        return gate * torch.tanh(h @ w["V"]), h

    def pair_step(carry, x):
        h, c = carry
        c = c * torch.sigmoid(x @ w["W"] + h @ w["U"]) + torch.tanh(h @ w["V"])
        return (torch.tanh(c), c), h

    c0 = torch.full((B, H), 0.5, dtype=torch.float64, requires_grad=True)
    step, init = (step, h0) if carry == "tensor" else (pair_step, (h0, c0))

    for _ in range(3):  # the hoisting caches filled
        last, ys = torchscan.scan(step, init, xs, checkpoint=policy)
        (sum(leaf.sum() for leaf in _leaves(last)) + ys.sum()).backward()
    gc.collect()
    before = [t for t in gc.get_objects() if type(t) in _TENSORS]
    old = {id(t) for t in before}
    # (a new view of an old storage, such as a step of xs, keeps no new memory)
    old_storages = {t.untyped_storage().data_ptr() for t in before}
    del before
    last, ys = torchscan.scan(step, init, xs, checkpoint=policy)
    gc.collect()
    outputs = {t.untyped_storage().data_ptr() for t in [*_leaves(last), ys]}
    storages = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
        for t in gc.get_objects()
        if type(t) in _TENSORS and id(t) not in old
    }
    return sum(
        size
        for address, size in storages.items()
        if address not in outputs and address not in old_storages
    )


CARRY = B * H * 8  # float64
_TENSORS = (torch.Tensor, torch.nn.Parameter)  # (isinstance would ask deprecated objects)


def _leaves(tree: Any) -> list[torch.Tensor]:
    return torch.utils._pytree.tree_leaves(tree)


@pytest.mark.parametrize("carry", ["tensor", "pair"])
@pytest.mark.parametrize("snapshots", [1, 3, 6])
def test_the_binomial_schedule_keeps_c_carries_and_one_step_whatever_the_length(
    snapshots: int, carry: str
) -> None:
    size = CARRY * (1 if carry == "tensor" else 2)
    one_step = _kept_after_forward(1, None, carry)  # (its input, the caller's, not counted)
    assert one_step > 0  # what a step saves: its gate, its products' operands...
    for n in (40, 160):
        kept = _kept_after_forward(n, Checkpoint(snapshots=snapshots), carry)
        # c carries besides init, and the last step, which runs with autograd at once, with its
        # input carry
        assert kept <= snapshots * size + size + one_step, (n, kept)


@pytest.mark.parametrize("carry", ["tensor", "pair"])
@pytest.mark.parametrize("n", [40, 160])
def test_segments_keep_a_carry_each(n: int, carry: str) -> None:
    size = CARRY * (1 if carry == "tensor" else 2)
    k = math.isqrt(n - 1) + 1
    segments = -(-n // k)
    # the first segment starts from init, which the caller holds
    assert _kept_after_forward(n, "sqrt", carry) == (segments - 1) * size
    assert _kept_after_forward(n, None, carry) > n * 2 * CARRY


class _Counting(TorchDispatchMode):
    """Counts the operators that reach the kernels below it."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[Any, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func] = self.counts.get(func, 0) + 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    ("save", "recomputed"),
    [
        (None, T),
        ([torch.ops.aten.sigmoid.default], 0),
        ([torch.ops.aten.sigmoid], 0),
        (lambda op: op.overloadpacket == torch.ops.aten.sigmoid, 0),
        ([torch.ops.aten.tanh], T),
    ],
)
def test_the_backward_pass_takes_what_save_names_from_the_forward_pass(
    save: Any, recomputed: int
) -> None:
    w = _weights()
    xs, h0 = _inputs()

    def step(h, x):
        gate = torch.sigmoid(x @ w["W"])
        return torch.tanh(gate * (h @ w["U"])), h

    policy = Checkpoint(every=5, save=save)
    h, _ = torchscan.scan(step, h0, xs, checkpoint=policy, hoist=False)
    with _Counting() as counting:
        h.sum().backward()
    assert counting.counts.get(torch.ops.aten.sigmoid.default, 0) == recomputed


def test_the_user_s_tensors_are_not_changed() -> None:
    w = _weights()
    xs, h0 = _inputs()
    before = (xs.detach().clone(), h0.detach().clone())
    h, ys = torchscan.scan(_elman(w), h0, xs, checkpoint=Checkpoint(snapshots=2))
    (h.sum() + ys.sum()).backward()
    assert torch.equal(xs.detach(), before[0])
    assert torch.equal(h0.detach(), before[1])
    assert xs._version == 0
    assert h0._version == 0


def test_modules_parameters_get_their_gradients() -> None:
    torch.manual_seed(0)
    cell = torch.nn.GRUCell(H, H)
    xs = torch.randn(T, B, H)

    def step(h, x):
        h = cell(x, h)
        return h, h

    def grads(**kw: Any) -> list[torch.Tensor]:
        cell.zero_grad()
        h, ys = torchscan.scan(step, torch.zeros(B, H), xs, **kw)
        (h.sum() + ys.square().sum()).backward()
        return [p.grad.clone() for p in cell.parameters()]

    expected = grads()
    for policy in POLICIES.values():
        for g, e in zip(grads(checkpoint=policy), expected, strict=True):
            torch.testing.assert_close(g, e)


def test_under_torch_func_every_step_runs_once_with_the_same_gradients() -> None:
    w = _weights()
    xs, h0 = _inputs()

    def loss(U: torch.Tensor, **kw: Any) -> torch.Tensor:
        def step(h, x):
            return torch.tanh(x @ w["W"] + h @ U), h

        h, ys = torchscan.scan(step, h0.detach(), xs.detach(), **kw)
        return h.sum() + ys.sum()

    expected = torch.func.grad(loss)(w["U"].detach())
    got = torch.func.grad(lambda U: loss(U, checkpoint=4))(w["U"].detach())
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_an_export_is_the_same_with_and_without_checkpoint(tmp_path) -> None:
    pytest.importorskip("onnx")
    import onnx

    class Model(torch.nn.Module):
        def __init__(self, checkpoint: Any) -> None:
            super().__init__()
            self.cell = torch.nn.RNNCell(H, H)
            self.checkpoint = checkpoint

        def forward(self, xs, h):
            def step(h, x):
                h = self.cell(x, h)
                return h, h

            return torchscan.scan(step, h, xs, checkpoint=self.checkpoint)

    torch.manual_seed(0)
    plain = Model(None)
    kept = Model(Checkpoint(snapshots=2))
    kept.load_state_dict(plain.state_dict())
    plain.eval(), kept.eval()
    args = (torch.randn(T, B, H), torch.zeros(B, H))
    graphs = []
    for name, model in (("plain", plain), ("kept", kept)):
        path = tmp_path / f"{name}.onnx"
        torch.onnx.export(model, args, path, dynamic_shapes=({0: torch.export.Dim("T")}, None))
        graphs.append(onnx.load(path).graph)
    assert [n.op_type for n in graphs[0].node] == [n.op_type for n in graphs[1].node]
    assert "Scan" in [n.op_type for n in graphs[0].node]
    assert graphs[0].SerializeToString() == graphs[1].SerializeToString()


# ---------------------------------------------------------------------------------------------
# Refusals


@pytest.mark.parametrize(
    ("checkpoint", "error", "message"),
    [
        (0, ValueError, "torchscan.scan: checkpoint must be at least 1, but it is 0."),
        (True, TypeError, "torchscan.scan: checkpoint must be None, an int (a carry kept"),
        ("root", TypeError, "but it is a str."),
        (2.5, TypeError, "torchscan.scan: checkpoint must be None, an int"),
    ],
)
def test_a_wrong_checkpoint_is_refused(checkpoint: Any, error: type, message: str) -> None:
    with pytest.raises(error) as info:
        torchscan.scan(
            lambda h, x: (h + x, h), torch.zeros(2), torch.ones(3, 2), checkpoint=checkpoint
        )
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        (
            {},
            ValueError,
            "torchscan.Checkpoint: give one of every= (a carry kept every k steps) "
            "and snapshots= (the most carries kept, placed by the binomial schedule), but neither "
            "is given.",
        ),
        ({"every": 2, "snapshots": 2}, ValueError, "but both are given."),
        ({"every": 0}, ValueError, "torchscan.Checkpoint: every must be at least 1, but it is 0."),
        (
            {"every": "cbrt"},
            TypeError,
            'torchscan.Checkpoint: every must be an int or "sqrt", but it is a str.',
        ),
        (
            {"snapshots": -1},
            ValueError,
            "torchscan.Checkpoint: snapshots must be at least 0, but it is -1.",
        ),
        (
            {"snapshots": 2.0},
            TypeError,
            "torchscan.Checkpoint: snapshots must be an int, but it is a float.",
        ),
        (
            {"snapshots": 2, "save": [torch.ops.aten.mm]},
            ValueError,
            "torchscan.Checkpoint: "
            "save= applies to the segments of every=, but snapshots= is given: the binomial "
            "schedule keeps carries alone.",
        ),
        (
            {"every": 2, "save": "mm"},
            TypeError,
            "torchscan.Checkpoint: save must be None, a "
            "collection of torch operators or a function of an operator, but it is a str.",
        ),
    ],
)
def test_a_wrong_checkpoint_policy_is_refused(arguments: dict, error: type, message: str) -> None:
    with pytest.raises(error) as info:
        Checkpoint(**arguments)
    assert message in str(info.value)


@pytest.mark.parametrize(("n", "snapshots"), [(60, 0), (1500, 1500), (1500, 3000)])
def test_the_binomial_schedule_reverses_any_length_with_any_number_of_snapshots(
    n: int, snapshots: int
) -> None:
    """No schedule is too deep: with no carry kept, every step runs again from ``init``; with a
    place for every carry (more than Python's frames allow to nest), every step runs twice."""
    forward, total = _count_steps(n, Checkpoint(snapshots=snapshots))
    assert forward == n
    assert total == _revolve_evaluations(n, snapshots)
    assert total == (n * (n + 1) // 2 if snapshots == 0 else 2 * n - 1)


def _line(marker: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.endswith(marker))


def test_a_step_that_changes_a_result_save_keeps_is_refused_naming_its_line() -> None:
    """torch.matmul of a 1-D tensor squeezes the product it takes in place."""
    w = torch.randn(3, 3, requires_grad=True)

    def squeezing(h, x):
        h = torch.tanh(x + h @ w)  # <squeezes>
        return h, h

    policy = Checkpoint(every=2, save=[torch.ops.aten.mm.default])
    with pytest.raises(torchscan.TorchscanValueError) as info:
        torchscan.scan(squeezing, torch.zeros(3), torch.randn(6, 3), checkpoint=policy)
    assert str(info.value) == (
        "torchscan.scan: fn (test_a_step_that_changes_a_result_save_keeps_is_refused_naming_its_"
        f"line.<locals>.squeezing), {__file__}:{_line('# <squeezes>')}: checkpoint keeps the "
        "result of aten.mm.default (save= names it), and aten.squeeze_.dim then changes that "
        "result in place, so the backward pass would read the changed values. Leave "
        "aten.mm.default out of save= (torch.nn.GRUCell and LSTMCell change the products they "
        "take in place)."
    )


@pytest.mark.parametrize("cell", [torch.nn.GRUCell(H, H), torch.nn.LSTMCell(H, H)])
def test_a_write_that_selective_checkpointing_misses_is_refused(cell: torch.nn.Module) -> None:
    """The cells add into chunks of their products (unsafe_chunk), which leaves the version
    counter that torch.utils.checkpoint checks as it was: its gradients would be wrong."""

    def step(carry, x):
        out = cell(x, carry)  # <cell>
        return out, out[0] if isinstance(out, tuple) else out

    init = torch.zeros(B, H) if isinstance(cell, torch.nn.GRUCell) else (torch.zeros(B, H),) * 2
    policy = Checkpoint(every=4, save=[torch.ops.aten.addmm])
    with pytest.raises(torchscan.TorchscanValueError) as info:
        torchscan.scan(step, init, torch.randn(T, B, H), checkpoint=policy)
    assert f"test_checkpoint.py:{_line('# <cell>')}: checkpoint keeps the result of " in str(
        info.value
    )
    assert "aten.addmm.default (save= names it), and aten.add_.Tensor then" in str(info.value)


# ---------------------------------------------------------------------------------------------
# loop


def _loop_case(kind: str, **kw: Any) -> list[torch.Tensor]:
    w = _weights()
    xs, h0 = _inputs()
    calls = [0]

    def body(i, carry):
        calls[0] += 1
        h, total = carry
        h = torch.tanh(xs[i] @ w["W"] + h @ w["U"])
        total = total + h.sum() * (i + 1)
        if kind == "until":
            return (h, total), h @ w["V"], torchscan.until(total > 40.0)
        return (h, total), h @ w["V"]

    trip_count = {"int": T, "tensor": torch.tensor(T), "until": T, "until only": None}[kind]
    if kind == "until only":

        def stopping(i, carry):
            out = body(i, carry)
            return out[0], out[1], torchscan.until(i >= 13)

        loop_body = stopping
    else:
        loop_body = body
    (h, total), ys = torchscan.loop(
        loop_body, (h0, torch.zeros((), dtype=torch.float64)), trip_count=trip_count, **kw
    )
    loss = h.sum() + total + (ys * torch.linspace(0.5, 1.5, ys.numel()).view_as(ys)).sum()
    inputs = [xs, h0, *w.values()]
    grads = torch.autograd.grad(loss, inputs)
    return [h.detach(), total.detach(), ys.detach(), *grads]


LOOP_POLICIES = {
    name: POLICIES[name]
    for name in ("every 1", "every 4", "sqrt", "longer than the scan", "binomial 2", "save mm")
}


def _needs_trip_count(policy: Any) -> bool:
    return policy == "sqrt" or (isinstance(policy, Checkpoint) and policy.every == "sqrt")


@pytest.mark.parametrize(
    ("kind", "policy"),
    [
        (kind, policy)
        for kind in ("int", "tensor", "until", "until only")
        for policy in LOOP_POLICIES
        # without trip_count, these are refused (the test below)
        if not (kind == "until only" and _needs_trip_count(LOOP_POLICIES[policy]))
    ],
)
def test_a_loop_s_values_and_gradients_are_the_unchecked_loop_s(kind: str, policy: str) -> None:
    checkpoint = LOOP_POLICIES[policy]
    expected = _loop_case(kind)
    got = _loop_case(kind, checkpoint=checkpoint)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.shape == e.shape
        torch.testing.assert_close(g, e, rtol=0, atol=1e-12)


def test_a_loop_s_gradients_are_the_python_loop_s() -> None:
    w = _weights()
    xs, h0 = _inputs()
    h = h0
    for i in range(T):
        h = torch.tanh(xs[i] @ w["W"] + h @ w["U"])
    inputs = [xs, h0, w["W"], w["U"]]
    expected = torch.autograd.grad(h.sum(), inputs)
    for policy in LOOP_POLICIES.values():
        (h, _), _ = torchscan.loop(
            lambda i, c: ((torch.tanh(xs[i] @ w["W"] + c[0] @ w["U"]), c[1]), None),
            (h0, torch.zeros(())),
            trip_count=T,
            checkpoint=policy,
        )
        got = torch.autograd.grad(h.sum(), inputs)
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(g, e, rtol=0, atol=1e-12)


def test_a_loop_runs_revolve_s_optimum_of_iterations() -> None:
    calls = [0]
    U = torch.randn(H, H, dtype=torch.float64, requires_grad=True)

    def body(i, h):
        calls[0] += 1
        return torch.tanh(h @ U + i), None

    h, _ = torchscan.loop(
        body,
        torch.ones(B, H, dtype=torch.float64),
        trip_count=50,
        checkpoint=Checkpoint(snapshots=3),
    )
    h.sum().backward()
    assert calls[0] == _revolve_evaluations(50, 3)


@pytest.mark.parametrize("checkpoint", ["sqrt", Checkpoint(every="sqrt")])
def test_a_loop_without_trip_count_refuses_a_schedule_that_needs_it(checkpoint: Any) -> None:
    with pytest.raises(torchscan.TorchscanValueError) as info:
        torchscan.loop(
            lambda i, h: (h + 1, h, torchscan.until(i >= 3)),
            torch.zeros(2, requires_grad=True),
            checkpoint=checkpoint,
        )
    assert str(info.value) == (
        'torchscan.loop: checkpoint="sqrt" needs the number of iterations, but trip_count is '
        "None (the loop ends at until). Give trip_count= (the most iterations), "
        "checkpoint=Checkpoint(snapshots=c) (c carries placed as the iterations run), or "
        "checkpoint=k, which keeps a carry every k iterations however many run."
    )


def test_a_loop_that_could_never_end_is_refused_as_without_checkpoint() -> None:
    def run(**kw: Any) -> str:
        with pytest.raises(torchscan.TorchscanValueError) as info:
            torchscan.loop(lambda i, h: (h + 1, h), torch.zeros(2, requires_grad=True), **kw)
        return str(info.value)

    assert run(checkpoint=3) == run()


# ---------------------------------------------------------------------------------------------
# the online schedule: a loop that ends at until, with Checkpoint(snapshots=c)


def _online_case(kind: str, stop_at: int, **kw: Any) -> list[torch.Tensor]:
    """Values and gradients of a loop that ends at until whose body is of ``kind``."""
    torch.manual_seed(0)
    w = _weights()
    xs, h0 = _inputs()
    W2 = w["W"] * 2  # a captured tensor with a history of its own
    cell = torch.nn.GRUCell(H, H).double()
    counter = torch.zeros((), dtype=torch.int64)

    def body(i, carry):
        h, n = carry
        x = xs[i % T]
        if kind == "elman":
            h = torch.tanh(x @ w["W"] + h @ w["U"])
        elif kind == "captured history":
            h = torch.tanh(x @ W2 + h @ w["U"])
        elif kind == "a weight and its double":  # (W's gradient is not W2's twice over)
            h = torch.tanh(x @ W2 + x @ w["W"] + h @ w["U"])
        elif kind == "reads init":
            h = torch.tanh(x @ w["W"] + h @ w["U"] + h0 * 0.1)
        elif kind == "module":
            h = cell(x, h)
        elif kind == "dropout":
            h = torch.nn.functional.dropout(torch.tanh(x @ w["W"] + h @ w["U"]), 0.3)
        y = None if kind == "no ys" else {"y": h @ w["V"], "i": i}
        if kind == "no ys":
            h = torch.tanh(x @ w["W"] + h @ w["U"])
        return (h, n + 1), y, torchscan.until(i >= stop_at)

    (h, n), ys = torchscan.loop(body, (h0, counter), **kw)
    loss = h.sum()
    outputs = [h.detach(), n]
    if ys is not None:
        loss = loss + (ys["y"] * torch.linspace(0.5, 1.5, ys["y"].numel()).view_as(ys["y"])).sum()
        outputs += [ys["y"].detach(), ys["i"]]
    inputs = [xs, h0, *w.values(), *cell.parameters()]
    grads = torch.autograd.grad(loss, inputs, allow_unused=True)
    return outputs + [torch.zeros(()) if g is None else g for g in grads]


@pytest.mark.parametrize("trip_count", [None, 30], ids=["online", "binomial"])
@pytest.mark.parametrize("snapshots", [0, 1, 2, 5])
@pytest.mark.parametrize(
    "kind",
    [
        "elman",
        "captured history",
        "a weight and its double",
        "reads init",
        "module",
        "dropout",
        "no ys",
    ],
)
@pytest.mark.parametrize("stop_at", [0, 1, 13, 50])
def test_a_loop_that_ends_at_until_takes_the_online_schedule_with_the_same_gradients(
    kind: str, snapshots: int, stop_at: int, trip_count: int | None
) -> None:
    """Without trip_count, the online schedule; with it (30, which stops the loop before 50),
    the binomial one, whose forward pass the loop may end early."""
    expected = _online_case(kind, stop_at, trip_count=trip_count)
    got = _online_case(
        kind, stop_at, trip_count=trip_count, checkpoint=Checkpoint(snapshots=snapshots)
    )
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=0, atol=1e-12)  # (shapes and dtypes too)


@pytest.mark.parametrize("snapshots", [0, 1, 2, 3, 5])
def test_the_online_schedule_runs_no_more_iterations_than_equinox_s(snapshots: int) -> None:
    U = torch.randn(H, H, dtype=torch.float64, requires_grad=True)
    slots = snapshots + 1
    optimal_up_to = (slots + 1) * (slots + 2) // 2 - 1  # Stumm and Walther's bound
    calls = [0]
    for n in [*range(1, 30), 60, 150]:
        calls[0] = 0

        def body(i, h, n=n):
            calls[0] += 1
            return torch.tanh(h @ U), None, torchscan.until(i >= n - 1)

        h, _ = torchscan.loop(
            body, torch.ones(B, H, dtype=torch.float64), checkpoint=Checkpoint(snapshots=snapshots)
        )
        forward = calls[0]
        h.sum().backward()
        equinox, most = equinox_online(slots, n)
        assert forward == n
        assert most <= slots
        assert calls[0] <= equinox, (n, calls[0], equinox)
        if n <= optimal_up_to:
            assert calls[0] == equinox, n
            # what it cannot know: the last iteration is the last (once or twice more than
            # the binomial schedule of a known length)
            assert calls[0] - _revolve_evaluations(n, snapshots) in (1, 2), n


def _kept_after_online_loop(n: int, snapshots: int | None) -> int:
    """The bytes that the forward pass of a loop ending at until after ``n`` iterations leaves
    alive, besides its outputs."""
    w = _weights()
    h0 = torch.zeros(B, H, dtype=torch.float64, requires_grad=True)

    def body(i, h):
        gate = torch.sigmoid(h @ w["W"] + 0.1)
        return gate * torch.tanh(h @ w["V"]), None, torchscan.until(i >= n - 1)

    checkpoint = None if snapshots is None else Checkpoint(snapshots=snapshots)
    torchscan.loop(body, h0, checkpoint=checkpoint)[0].sum().backward()
    gc.collect()
    old = {id(t) for t in gc.get_objects() if type(t) in _TENSORS}
    h, _ = torchscan.loop(body, h0, checkpoint=checkpoint)
    gc.collect()
    storages = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
        for t in gc.get_objects()
        if type(t) in _TENSORS and id(t) not in old
    }
    return sum(size for address, size in storages.items() if address != h.data_ptr())


@pytest.mark.parametrize("snapshots", [1, 3])
def test_the_online_schedule_keeps_c_carries_whatever_the_length(snapshots: int) -> None:
    for n in (30, 200):
        assert _kept_after_online_loop(n, snapshots) <= snapshots * CARRY, n
    assert _kept_after_online_loop(200, None) > 200 * CARRY


@pytest.mark.parametrize("trip_count", [None, 12], ids=["online", "binomial"])
def test_second_derivatives_of_a_loop_are_the_unchecked_loop_s(trip_count: int | None) -> None:
    """``create_graph=True``: the iterations run once more with autograd from ``init``."""
    U = torch.randn(H, H, dtype=torch.float64, requires_grad=True)
    h0 = torch.ones(B, H, dtype=torch.float64, requires_grad=True)

    def body(i, h):
        return torch.tanh(h @ U), h.sum(-1), torchscan.until(i >= 8)

    def second(**kw: Any) -> list[torch.Tensor]:
        h, ys = torchscan.loop(body, h0, trip_count=trip_count, **kw)
        (gu,) = torch.autograd.grad(h.pow(2).sum() + ys.pow(2).sum(), [U], create_graph=True)
        return [gu, *torch.autograd.grad(gu.pow(2).sum(), [U, h0])]

    expected = second()
    for g, e in zip(second(checkpoint=Checkpoint(snapshots=2)), expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("api", ["loop", "loop with trip_count", "scan"])
def test_snapshots_refuse_a_read_they_could_not_see(api: str) -> None:
    """A tensor read where no torch function mode sees it (here, with torch functions turned
    off) would get no gradient: the backward pass refuses it, naming the step's line."""
    U = torch.randn(H, H, dtype=torch.float64, requires_grad=True)
    h0 = torch.ones(B, H, dtype=torch.float64, requires_grad=True)

    def hidden(h):
        with torch._C.DisableTorchFunction():
            return h @ U

    def body(i, h):  # hidden
        return torch.tanh(hidden(h)), None, torchscan.until(i >= 4)

    def step(h, x):  # hidden step
        return torch.tanh(hidden(h) + x), None

    checkpoint = Checkpoint(snapshots=2)
    if api == "scan":
        # (hoisted, the step runs as a graph traced with torch functions on: U is seen)
        xs = torch.ones(6, B, H)
        h, _ = torchscan.scan(step, h0, xs, checkpoint=checkpoint, hoist=False)
        who, line, things = "scan: fn (test_snapshots", _line("# hidden step"), "steps"
    else:
        trip_count = 10 if api == "loop with trip_count" else None
        h, _ = torchscan.loop(body, h0, trip_count=trip_count, checkpoint=checkpoint)
        who, line, things = "loop: body (test_snapshots", _line("# hidden"), "iterations"
    fn, name = ("fn", "step") if api == "scan" else ("body", "body")
    with pytest.raises(torchscan.TorchscanValueError) as info:
        h.sum().backward()
    assert str(info.value) == (
        f"torchscan.{who}_refuse_a_read_they_could_not_see.<locals>.{name}), "
        f"{__file__}:{line}: checkpoint=Checkpoint(snapshots=...) ran the {things} without "
        f"autograd and did not see the {fn} read a tensor that requires gradients (of shape "
        f"({H}, {H})), so its gradient would be lost. Read it through torch functions in the "
        f"{fn} (not in a compiled function), or give checkpoint=k, whose segments run with "
        "autograd."
    )


# ---------------------------------------------------------------------------------------------
# torch.compile


def _saved_bytes(run: Callable[[], torch.Tensor]) -> int:
    """The bytes of the storages that autograd's saved-tensor hooks see the forward pass of
    ``run`` save."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = run()
    loss.backward()
    return sum(seen.values())


@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
@pytest.mark.parametrize("api", ["scan", "loop with until"])
@pytest.mark.parametrize("checkpoint", ["sqrt", Checkpoint(snapshots=2)], ids=["sqrt", "binomial"])
def test_under_torch_compile_it_runs_checkpointed_outside_the_graph(api: str, checkpoint) -> None:
    """torch's loop operator keeps every step's intermediate values: a checkpointed scan or loop
    runs outside the compiled graph, with the gradients and the memory of the eager run."""
    if api == "loop with until" and checkpoint == "sqrt":
        checkpoint = 3  # (sqrt needs trip_count)
    torch.manual_seed(0)
    n, batch, hidden = 100, 8, 32  # activations over the sequence larger than its inputs
    cell = torch.nn.GRUCell(hidden, hidden).double()
    xs = torch.randn(n, batch, hidden, dtype=torch.float64)
    h0 = torch.randn(batch, hidden, dtype=torch.float64, requires_grad=True)

    def run(h0: torch.Tensor, xs: torch.Tensor, **kw: Any) -> torch.Tensor:
        h0 = h0 * 2  # compiled work before and after
        if api == "scan":
            h, ys = torchscan.scan(lambda h, x: (cell(x, h),) * 2, h0, xs, **kw)
        else:

            def body(i, h):
                h = cell(xs[i], h)
                return h, h, torchscan.until(i >= n - 1)

            h, ys = torchscan.loop(body, h0, **kw)
        return (h.sum() + ys.pow(2).sum()) * 3

    inputs = [h0, *cell.parameters()]
    expected = torch.autograd.grad(run(h0, xs), inputs)
    compiled = torch.compile(run)
    got = torch.autograd.grad(compiled(h0, xs, checkpoint=checkpoint), inputs)
    torch.testing.assert_close(got, expected)
    kept = _saved_bytes(lambda: compiled(h0, xs, checkpoint=checkpoint))
    assert kept == _saved_bytes(lambda: run(h0, xs, checkpoint=checkpoint))
    # (what is saved includes xs and the storage of ys, which the run keeps anyway)
    assert kept < _saved_bytes(lambda: compiled(h0, xs)) / 3


@pytest.mark.parametrize("api", ["scan", "loop"])
def test_under_fullgraph_the_graph_break_says_why(api: str) -> None:
    W = torch.randn(H, H, requires_grad=True)

    def run(xs: torch.Tensor) -> torch.Tensor:
        if api == "scan":
            step = lambda h, x: (torch.tanh(h @ W + x),) * 2  # noqa: E731
            return torchscan.scan(step, torch.zeros(B, H), xs, checkpoint="sqrt")[0]
        body = lambda i, h: (torch.tanh(h @ W + xs[0] * i), None)  # noqa: E731
        return torchscan.loop(body, torch.zeros(B, H), trip_count=T, checkpoint=2)[0]

    with pytest.raises(Exception, match="Skip calling") as info:
        torch.compile(run, backend="eager", fullgraph=True)(torch.randn(T, B, H))
    name = "scan" if api == "scan" else "loop"
    assert (
        f"torchscan.{name} with checkpoint= runs outside the compiled graph where autograd records "
        "(torch's loop operator keeps every step's intermediate values); with fullgraph=True, "
        "leave checkpoint= out, or run the loop under torch.no_grad()"
    ) in str(info.value)
    with torch.no_grad():  # one graph
        torch.compile(run, backend="eager", fullgraph=True)(torch.randn(T, B, H))


def test_the_carries_segments_start_from_are_held_as_saved_tensors_alone() -> None:
    """Saved-tensor hooks that move what they pack elsewhere (offloading) free the carries the
    hoisted segments keep: nothing else holds them."""
    w = _weights()
    xs, h0 = _inputs()

    def step(h, x):
        return torch.tanh(x @ w["W"] + h @ w["U"]), h

    for _ in range(3):  # hoisted from the third call
        torchscan.scan(step, h0, xs, checkpoint=4)[0].sum().backward()
    packed: list[weakref.ref] = []
    store: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> int:
        if t.shape == h0.shape and t is not h0:
            packed.append(weakref.ref(t))
        store.append(t.detach().clone().requires_grad_(t.requires_grad))
        return len(store) - 1

    with torch.autograd.graph.saved_tensors_hooks(pack, store.__getitem__):
        h, ys = torchscan.scan(step, h0, xs, checkpoint=4)
    gc.collect()
    assert len(packed) >= T // 4 - 1  # the carries after the first segment
    assert [ref for ref in packed if ref() is not None and ref() is not h] == []
    expected = torch.autograd.grad(h.sum() + ys.sum(), [w["U"]])
    h, ys = torchscan.scan(step, h0, xs)
    torch.testing.assert_close(expected, torch.autograd.grad(h.sum() + ys.sum(), [w["U"]]))
