"""Every error ``torchscan.scan`` raises for a user mistake, pinned as the full message."""

from __future__ import annotations

import pytest
import torch

import torchscan


def identity(carry, x):
    return carry, None


def errors(error: type[Exception], *lines: str):
    """Expect ``error`` whose message is exactly ``lines`` joined by newlines."""

    class Matcher:
        def __enter__(self):
            self.context = pytest.raises(error)
            self.info = self.context.__enter__()
            return self.info

        def __exit__(self, *exc):
            suppressed = self.context.__exit__(*exc)
            assert str(self.info.value) == "\n".join(lines)
            return suppressed

    return Matcher()


def test_fn_not_callable() -> None:
    with errors(TypeError, "torchscan.scan: fn must be callable, but got an int."):
        torchscan.scan(3, None, torch.ones(3))


def test_xs_lengths_differ() -> None:
    with errors(
        ValueError,
        "torchscan.scan: every leaf of xs must have the same length along the scanned axis, "
        "and length must agree with it, but:",
        "  * xs['a'] has length 3 along axis 0",
        "  * xs['b'][0] has length 4 along axis 0",
    ):
        torchscan.scan(identity, None, {"a": torch.ones(3, 2), "b": [torch.ones(4)]})


def test_xs_lengths_differ_along_negative_axis() -> None:
    with errors(
        ValueError,
        "torchscan.scan: every leaf of xs must have the same length along the scanned axis, "
        "and length must agree with it, but:",
        "  * xs[0] has length 2 along axis 1",
        "  * xs[1] has length 5 along axis 0",
    ):
        torchscan.scan(identity, None, (torch.ones(3, 2), torch.ones(5)), axis=-1)


def test_length_disagrees_with_xs() -> None:
    with errors(
        ValueError,
        "torchscan.scan: every leaf of xs must have the same length along the scanned axis, "
        "and length must agree with it, but:",
        "  * xs has length 3 along axis 0",
        "  * length=4 was given",
    ):
        torchscan.scan(identity, None, torch.ones(3), length=4)


def test_no_xs_and_no_length() -> None:
    with errors(
        ValueError,
        "torchscan.scan: length is needed when xs has no tensors (xs is None); "
        "pass length=<number of steps>.",
    ):
        torchscan.scan(identity, torch.ones(2))


@pytest.mark.parametrize(
    ("xs", "shown"), [([], "list []"), ({}, "dict {}"), ((None, []), "tuple (None, [])")]
)
def test_empty_xs_need_a_length_as_in_jax(xs, shown: str) -> None:
    """As ``jax.lax.scan``: a pytree of sequences with no tensor says nothing of the number of
    steps, which ``length`` gives."""
    with errors(
        ValueError,
        f"torchscan.scan: length is needed when xs has no tensors (xs is {shown}); "
        "pass length=<number of steps>.",
    ):
        torchscan.scan(identity, torch.ones(2), xs)
    carry, ys = torchscan.scan(lambda c, x: (c + 1, x), torch.zeros(2), xs, length=3)
    assert carry.tolist() == [3.0, 3.0]
    assert ys == xs


def test_a_python_number_as_init_is_refused_with_its_conversion() -> None:
    with errors(
        TypeError,
        "torchscan.scan: every leaf of init must be a tensor or None, but:",
        "  * init is a float",
        "Convert numbers and arrays with torch.as_tensor(...).",
    ):
        torchscan.scan(lambda c, x: (c + x, c), 0.0, torch.ones(3))


def test_negative_length() -> None:
    with errors(ValueError, "torchscan.scan: length must be non-negative, but got -1."):
        torchscan.scan(identity, None, length=-1)


def test_length_not_an_int() -> None:
    with errors(TypeError, "torchscan.scan: length must be an int, but got a float."):
        torchscan.scan(identity, None, length=2.0)


def test_axis_out_of_range() -> None:
    with errors(
        ValueError,
        "torchscan.scan: axis=2 does not fit every leaf of xs:",
        "  * xs[0] has shape (3, 4), so axis must be in [-2, 1]",
        "  * xs[2] is a 0-d tensor and has no axis to scan over",
    ):
        torchscan.scan(
            identity, None, [torch.ones(3, 4), torch.ones(3, 4, 5), torch.tensor(1.0)], axis=2
        )


def test_axis_not_an_int() -> None:
    with errors(TypeError, "torchscan.scan: axis must be an int, but got a bool."):
        torchscan.scan(identity, None, torch.ones(3), axis=True)


def test_axis_does_not_fit_y() -> None:
    with errors(
        ValueError,
        "torchscan.scan: axis=2 is also the axis that ys are stacked on, and it does not fit "
        "every leaf of y:",
        "  * y['sum'] has shape (), so ys gets rank 1 and axis must be in [-1, 0]",
    ):
        torchscan.scan(
            lambda c, x: (c, {"sum": x.sum(), "x": x}), None, torch.ones(2, 2, 3), axis=2
        )


def test_carry_changes_shape() -> None:
    with errors(
        TypeError,
        "torchscan.scan: the carry must keep its type, but fn changed it in its first step:",
        "  * carry['h'] has shape (4,) but fn returned shape (1, 4)",
        "Return a carry with the shape, dtype and device of init (cast or reshape it, or change "
        "init).",
    ):
        torchscan.scan(
            lambda c, x: ({"h": c["h"] + x[:, None]}, None), {"h": torch.ones(4)}, torch.ones(3, 1)
        )


def test_carry_changes_dtype() -> None:
    with errors(
        TypeError,
        "torchscan.scan: the carry must keep its type, but fn changed it in its first step:",
        "  * carry[0] has dtype torch.float32 but fn returned dtype torch.float64",
        "  * carry[1] has dtype torch.int64 but fn returned dtype torch.float32",
        "Return a carry with the shape, dtype and device of init (cast or reshape it, or change "
        "init).",
    ):
        torchscan.scan(
            lambda c, x: ((c[0] + x.double(), c[1] + x), None),
            (torch.ones(2), torch.ones(2, dtype=torch.int64)),
            torch.ones(3, 2),
        )


def test_carry_changes_device() -> None:
    with errors(
        TypeError,
        "torchscan.scan: the carry must keep its type, but fn changed it in its first step:",
        "  * carry has device cpu but fn returned device meta",
        "Return a carry with the shape, dtype and device of init (cast or reshape it, or change "
        "init).",
    ):
        torchscan.scan(lambda c, x: (c.to("meta"), None), torch.ones(2), torch.ones(3, 2))


def test_carry_changes_structure() -> None:
    with errors(
        TypeError,
        "torchscan.scan: the carry must keep its structure, but fn changed it in its first step:",
        "  * init has structure {'h': *, 'c': *}",
        "  * fn returned structure ({'h': *, 'c': *}, *)",
        "Return a carry built like init.",
    ):
        torchscan.scan(
            lambda c, x: ((c, x), None), {"h": torch.ones(2), "c": torch.ones(2)}, torch.ones(3)
        )


def test_carry_becomes_none() -> None:
    with errors(
        TypeError,
        "torchscan.scan: the carry must keep its type, but fn changed it in its first step:",
        "  * carry['c'] is float32[2] on cpu in init but fn returned None",
        "Return a carry with the shape, dtype and device of init (cast or reshape it, or change "
        "init).",
    ):
        torchscan.scan(lambda c, x: ({"c": None}, None), {"c": torch.ones(2)}, torch.ones(3))


def test_carry_changes_in_a_later_step() -> None:
    def grows_late(carry, x):
        return (carry if x.item() < 2 else carry.repeat(2)), None

    with errors(
        TypeError,
        "torchscan.scan: the carry must keep its type, but fn changed it in step 2:",
        "  * carry has shape (2,) but fn returned shape (4,)",
        *grown("carry", 0, "fn", "def step(carry, x):", "i"),
    ):
        torchscan.scan(grows_late, torch.ones(2), torch.arange(3.0))


@pytest.mark.parametrize(
    ("result", "description"),
    [
        (lambda c: c, "float32[2] on cpu"),
        (lambda c: (c, c, c), "a tuple whose last item is float32[2] on cpu"),
        (lambda c: (c,), "a tuple of length 1"),
        (lambda c: [c, c], "a list"),
    ],
    ids=["tensor", "triple", "single", "list"],
)
def test_fn_does_not_return_a_pair(result, description: str) -> None:
    with errors(
        TypeError,
        "torchscan.scan: fn must return (carry, y) or (carry, y, torchscan.until(stop)), but it "
        f"returned {description}.",
    ):
        torchscan.scan(lambda c, x: result(c), torch.ones(2), torch.ones(3))


def test_fn_stops_returning_a_pair_in_a_later_step() -> None:
    with errors(
        TypeError,
        "torchscan.scan: fn must return (carry, y) or (carry, y, torchscan.until(stop)), but it "
        "returned a tuple whose last item is float32[] on cpu.",
    ):
        torchscan.scan(
            lambda c, x: (c, x) if x.item() < 1 else (c, x, x), torch.ones(2), torch.arange(3.0)
        )


def test_init_leaf_not_a_tensor() -> None:
    with errors(
        TypeError,
        "torchscan.scan: every leaf of init must be a tensor or None, but:",
        "  * init['h'] is a float",
        "Convert numbers and arrays with torch.as_tensor(...).",
    ):
        torchscan.scan(identity, {"h": 0.0, "c": torch.ones(1)}, torch.ones(3))


def test_xs_leaf_not_a_tensor() -> None:
    import numpy as np

    with errors(
        TypeError,
        "torchscan.scan: every leaf of xs must be a tensor or None, but:",
        "  * xs[1] is a numpy.ndarray",
        "Convert numbers and arrays with torch.as_tensor(...).",
    ):
        torchscan.scan(identity, None, (torch.ones(3), np.ones(3)))


def test_y_leaf_not_a_tensor() -> None:
    with errors(
        TypeError,
        "torchscan.scan: every leaf of y must be a tensor or None, but:",
        "  * y['loss'] is a float",
        "Convert numbers and arrays with torch.as_tensor(...).",
    ):
        torchscan.scan(lambda c, x: (c, {"loss": 1.0, "x": x}), None, torch.ones(3))


def test_y_changes_shape() -> None:
    with errors(
        TypeError,
        "torchscan.scan: fn must return y of the same type at every step, but y[1] is "
        "float32[1] on cpu for xs index 0 and float32[2] on cpu for xs index 2.",
    ):
        torchscan.scan(
            lambda c, x: (c, (x, torch.ones(1 + int(x.item() > 1)))), None, torch.arange(3.0)
        )


def test_y_changes_dtype() -> None:
    with errors(
        TypeError,
        "torchscan.scan: fn must return y of the same type at every step, but y is "
        "float32[] on cpu for xs index 0 and float64[] on cpu for xs index 1.",
    ):
        torchscan.scan(lambda c, x: (c, x if x.item() < 1 else x.double()), None, torch.arange(3.0))


def test_y_changes_to_none() -> None:
    with errors(
        TypeError,
        "torchscan.scan: fn must return y of the same type at every step, but y['a'] is "
        "None for xs index 0 and float32[] on cpu for xs index 1.",
    ):
        torchscan.scan(
            lambda c, x: (c, {"a": None if x.item() < 1 else x}), None, torch.arange(3.0)
        )


def test_y_changes_structure() -> None:
    with errors(
        TypeError,
        "torchscan.scan: fn must return y of the same structure at every step, but:",
        "  * the first step returned (*, *)",
        "  * a later step returned (*,)",
    ):
        torchscan.scan(lambda c, x: (c, (x, x) if x.item() < 1 else (x,)), None, torch.arange(3.0))


def test_inputs_on_different_devices() -> None:
    with errors(
        ValueError,
        "torchscan.scan: all tensors of init and xs must be on one device, but:",
        "  * init['h'] is on cpu",
        "  * xs[0] is on meta",
        "  * xs[1] is on cpu",
        "Move them with .to(device) first.",
    ):
        torchscan.scan(
            identity, {"h": torch.ones(2)}, [torch.ones(3, device="meta"), torch.ones(3)]
        )


def test_zero_length_fn_that_fails_on_zeros_names_the_line() -> None:
    """A step that reads tensor values is called on zeros for its output shapes (fake tensors
    have no values); where that call fails too, the refusal names the line that reads values."""

    def data_dependent(carry, x):
        if bool(x.abs().sum() > 0):
            return carry + x, x
        return carry + torch.linalg.cholesky(torch.diag(x)).sum(0), x

    with pytest.raises(ValueError, match="xs has length 0, so the shapes of ys") as info:
        torchscan.scan(data_dependent, torch.ones(2), torch.ones(0, 2))
    line = data_dependent.__code__.co_firstlineno + 1
    assert str(info.value).startswith(
        "torchscan.scan: xs has length 0, so the shapes of ys are found by calling fn once: it "
        f"reads the value of a tensor at {__file__}:{line}, which fake tensors (no data) do not "
        "have, and called on zeros it failed with "
    )
    assert str(info.value).endswith(
        "Choose between values with torch.where(condition, a, b) instead of Python control flow "
        "on a tensor."
    )


def test_zero_length_checks_the_carry_too() -> None:
    with errors(
        TypeError,
        "torchscan.scan: the carry must keep its type, but fn changed it:",
        "  * carry has dtype torch.float32 but fn returned dtype torch.float64",
        "Return a carry with the shape, dtype and device of init (cast or reshape it, or change "
        "init).",
    ):
        torchscan.scan(lambda c, x: (c.double(), x), torch.ones(2), torch.ones(0, 2))


def test_user_errors_inside_fn_propagate_unchanged() -> None:
    def broken(carry, x):
        raise KeyError("from fn")

    with pytest.raises(KeyError, match="from fn"):
        torchscan.scan(broken, None, torch.ones(3))


def test_until_needs_a_0d_bool_tensor() -> None:
    with errors(
        TypeError,
        "torchscan.scan: until(stop) needs stop to be a 0-d bool tensor, but fn returned "
        "float32[] on cpu in step 0.",
    ):
        torchscan.scan(lambda c, x: (c, x, torchscan.until(x)), None, torch.arange(3.0))


def test_until_at_every_step_or_none() -> None:
    def fn(c, x):
        if x.item() < 1:
            return c, x, torchscan.until(x > 5)
        return c, x

    with errors(
        TypeError,
        "torchscan.scan: fn must return torchscan.until(stop) at every step or at none, but it "
        "returned no until in a later step.",
    ):
        torchscan.scan(fn, None, torch.arange(3.0))


def test_a_failure_to_make_fake_tensors_leaves_no_probe_behind(monkeypatch) -> None:
    """The probe of a zero-length scan's output shapes ends where making its fake tensors fails:
    later scans run as eagerly (a probe left on would, among others, let padding reach the
    step of a scan with lengths)."""
    from torchscan import _compat, _context

    def refuse(self, tensor, *args, **kwargs):
        raise RuntimeError("no fake tensor of that")

    monkeypatch.setattr(_compat.FakeTensorMode, "from_tensor", refuse)
    # The step runs on zeros instead, for the shapes of ys.
    carry, ys = torchscan.scan(lambda c, x: (c + 1, c > x), torch.ones(2), torch.ones(0, 2))
    assert torch.equal(carry, torch.ones(2))
    assert (ys.shape, ys.dtype) == ((0, 2), torch.bool)
    assert _context.probe(_context.Probe.SHAPES) is None  # the probe is over


# -- a carry that grows, and the two idioms that replace it -----------------------------------


def grown(name: str, axis: int, fn_name: str, first: str, at: str) -> tuple[str, ...]:
    return (
        f"{name} grew along axis {axis}: a carry keeps its shape at every step, so a sequence "
        f"grown by concatenation (torch.cat((out, token), {axis})) cannot be carried. Return "
        f"each step's token as the output y of {fn_name} instead, which is stacked for you:",
        f"    {first}",
        "        token = ...  # this step's token",
        "        return carry, token  # ys[t] is the token of step t",
        "or write it into a buffer made before the loop, at the iteration number:",
        "    def body(i, buf):",
        f"        buf = buf.clone(); buf[{at}] = ...  # this iteration's token",
        "        return buf, None",
        "    buf, _ = torchscan.loop(body, buffer_of_every_token, trip_count=n)",
    )


LOGITS = torch.randn(5, 2, 7)  # (steps, batch, vocabulary)


def test_a_carry_grown_by_concatenation_is_shown_both_idioms() -> None:
    def decode(c, logits):
        tokens, h = c
        tokens = torch.cat((tokens, (logits + h).argmax(-1, keepdim=True)), 1)
        return (tokens, h), None

    with errors(
        TypeError,
        "torchscan.scan: the carry must keep its type, but fn changed it in its first step:",
        "  * carry[0] has shape (2, 1) but fn returned shape (2, 2)",
        *grown("carry[0]", 1, "fn", "def step(carry, x):", ":, i"),
    ):
        torchscan.scan(decode, (torch.zeros(2, 1, dtype=torch.long), torch.zeros(2, 7)), LOGITS)


def test_the_idioms_shown_for_a_grown_carry_work() -> None:
    # the Python loop they replace
    tokens = torch.zeros(2, 0, dtype=torch.long)
    for logits in LOGITS:
        tokens = torch.cat((tokens, logits.argmax(-1, keepdim=True)), 1)

    # the token as the step's output
    def step(carry, x):
        token = x.argmax(-1)
        return carry, token

    _, ys = torchscan.scan(step, None, LOGITS)
    assert torch.equal(ys.T, tokens)

    # a buffer written at the iteration number
    def body(i, buf):
        buf = buf.clone()
        buf[:, i] = LOGITS[i].argmax(-1)
        return buf, None

    buf, _ = torchscan.loop(body, torch.zeros(2, 5, dtype=torch.long), trip_count=5)
    assert torch.equal(buf, tokens)


# -- a step function that takes another number of arguments -----------------------------------


def takes_one(c):
    return c, c


def takes_three(c, x, extra):
    return c, c


@pytest.mark.parametrize("fn", [takes_one, takes_three], ids=lambda f: f.__name__)
@pytest.mark.parametrize("calls", [1, 2])  # the second call reuses the first one's checked plan
def test_a_step_function_that_does_not_take_two_arguments_is_named(fn, calls) -> None:
    signature = "(c)" if fn is takes_one else "(c, x, extra)"
    code = fn.__code__
    for _ in range(calls - 1):  # a call of the same kinds of arguments with a right step
        torchscan.scan(lambda c, x: (c, c), torch.zeros(3), torch.ones(4, 3))
    with errors(
        TypeError,
        f"torchscan.scan: fn ({fn.__qualname__}), defined at {code.co_filename}:"
        f"{code.co_firstlineno}, must take two arguments, as torchscan.scan calls it fn(carry, x) "
        "at every step, x being the step's slice of xs (None when xs is None), but its "
        f"parameters are {signature}. Give it the parameters (carry, x); a step that reads no x "
        "still takes it: def step(carry, _).",
    ):
        torchscan.scan(fn, torch.zeros(3), torch.ones(4, 3))
