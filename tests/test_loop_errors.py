"""Every error ``torchscan.loop`` raises for a user mistake, pinned as the full message."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torchscan

from .test_scan_errors import errors


def count(i, c):
    return c + 1, None


def test_body_not_callable() -> None:
    with errors(TypeError, "torchscan.loop: body must be callable, but got a str."):
        torchscan.loop("body", torch.zeros(()), trip_count=2)


@pytest.mark.parametrize(
    ("trip_count", "description"),
    [
        (2.0, "a float"),
        (True, "a bool"),
        (torch.tensor([2]), "int64[1] on cpu"),
        (torch.tensor(2.0), "float32[] on cpu"),
        (torch.tensor(True), "bool[] on cpu"),
    ],
    ids=["float", "bool", "1-d tensor", "float tensor", "bool tensor"],
)
def test_trip_count_of_the_wrong_type(trip_count, description: str) -> None:
    with errors(
        TypeError,
        "torchscan.loop: trip_count must be an int, a 0-d integer tensor or None, but got "
        f"{description}.",
    ):
        torchscan.loop(count, torch.zeros(()), trip_count=trip_count)


@pytest.mark.parametrize("trip_count", [-1, np.int64(-3), torch.tensor(-2)], ids=repr)
def test_a_negative_trip_count_runs_no_iteration(trip_count) -> None:
    """As in ONNX, and as ``range`` does: not an error."""
    carry, ys = torchscan.loop(lambda i, c: (c + 1, i), torch.zeros(()), trip_count=trip_count)
    assert carry.item() == 0
    assert ys.shape == (0,)


@pytest.mark.parametrize(
    ("cond", "description"),
    [(1, "an int"), (torch.tensor([True]), "bool[1] on cpu"), (torch.tensor(1), "int64[] on cpu")],
    ids=["int", "1-d tensor", "int tensor"],
)
def test_cond_of_the_wrong_type(cond, description: str) -> None:
    with errors(
        TypeError,
        f"torchscan.loop: cond must be a bool, a 0-d bool tensor or None, but got {description}.",
    ):
        torchscan.loop(count, torch.zeros(()), trip_count=2, cond=cond)


NEVER_ENDS = (
    "torchscan.loop: trip_count is None and body does not return torchscan.until(stop), so the "
    "loop could never end. Pass trip_count=<the most iterations>, or return "
    "(carry, y, torchscan.until(stop)) from body."
)


@pytest.mark.parametrize("cond", [None, True, torch.tensor(False)], ids=["none", "true", "false"])
def test_a_loop_that_could_never_end(cond) -> None:
    with errors(ValueError, NEVER_ENDS):
        torchscan.loop(count, torch.zeros(()), cond=cond)


@pytest.mark.parametrize(
    ("result", "description"),
    [
        (lambda c: c, "float32[] on cpu"),
        (lambda c: (c, c, c, c), "a tuple of length 4"),
        (lambda c: (c, c, c > 0), "a tuple whose last item is bool[] on cpu"),
        (lambda c: [c, c], "a list"),
    ],
    ids=["tensor", "four", "bare stop", "list"],
)
def test_body_returns_something_else(result, description: str) -> None:
    with errors(
        TypeError,
        "torchscan.loop: body must return (carry, y) or (carry, y, torchscan.until(stop)), but "
        f"it returned {description}.",
    ):
        torchscan.loop(lambda i, c: result(c), torch.zeros(()), trip_count=2)


@pytest.mark.parametrize(
    ("stop", "description"),
    [
        (lambda c: c > 0, "bool[2] on cpu"),
        (lambda c: c.sum(), "float32[] on cpu"),
        (lambda c: False, "a bool"),
    ],
    ids=["vector", "float", "python bool"],
)
def test_until_needs_a_0d_bool_tensor(stop, description: str) -> None:
    with errors(
        TypeError,
        "torchscan.loop: until(stop) needs stop to be a 0-d bool tensor, but body returned "
        f"{description} in iteration 0.",
    ):
        torchscan.loop(
            lambda i, c: (c, None, torchscan.until(stop(c))), torch.zeros(2), trip_count=3
        )


def test_until_checked_in_later_iterations() -> None:
    def body(i, c):
        return c, None, torchscan.until(i > 5 if i < 2 else (i > 5).long())

    with errors(
        TypeError,
        "torchscan.loop: until(stop) needs stop to be a 0-d bool tensor, but body returned "
        "int64[] on cpu in iteration 2.",
    ):
        torchscan.loop(body, torch.zeros(2), trip_count=5)


def test_until_replaced_by_a_bare_flag_in_a_later_iteration() -> None:
    def body(i, c):
        return (c, c, torchscan.until(i > 5)) if i < 1 else (c, c, i > 5)

    with errors(
        TypeError,
        "torchscan.loop: body must return (carry, y) or (carry, y, torchscan.until(stop)), but "
        "it returned a tuple whose last item is bool[] on cpu.",
    ):
        torchscan.loop(body, torch.zeros(2), trip_count=3)


@pytest.mark.parametrize(
    ("first", "words"),
    [(True, "no until in a later"), (False, "it only in a later")],
    ids=["until dropped", "until added"],
)
def test_until_at_every_iteration_or_none(first: bool, words: str) -> None:
    def body(i, c):
        if (i == 0) == first:
            return c, None, torchscan.until(i > 5)
        return c, None

    with errors(
        TypeError,
        "torchscan.loop: body must return torchscan.until(stop) at every iteration or at none, "
        f"but it returned {words} iteration.",
    ):
        torchscan.loop(body, torch.zeros(2), trip_count=3)


def test_carry_changes_shape() -> None:
    with errors(
        TypeError,
        "torchscan.loop: the carry must keep its type, but body changed it in its first iteration:",
        "  * carry['h'] has shape (2,) but body returned shape (1, 2)",
        "Return a carry with the shape, dtype and device of init (cast or reshape it, or change "
        "init).",
    ):
        torchscan.loop(
            lambda i, c: ({"h": c["h"][None]}, None), {"h": torch.zeros(2)}, trip_count=2
        )


def test_init_leaf_not_a_tensor() -> None:
    with errors(
        TypeError,
        "torchscan.loop: every leaf of init must be a tensor or None, but:",
        "  * init[1] is an int",
        "Convert numbers and arrays with torch.as_tensor(...).",
    ):
        torchscan.loop(count, (torch.zeros(2), 0), trip_count=2)


def test_init_on_several_devices() -> None:
    with errors(
        ValueError,
        "torchscan.loop: all tensors of init must be on one device, but:",
        "  * init['a'] is on cpu",
        "  * init['b'] is on meta",
        "Move them with .to(device) first.",
    ):
        torchscan.loop(
            count, {"a": torch.zeros(2), "b": torch.zeros(2, device="meta")}, trip_count=2
        )


def test_y_changes_between_iterations() -> None:
    with errors(
        TypeError,
        "torchscan.loop: body must return y of the same type at every step, but y is "
        "int64[] on cpu for iteration 0 and int64[2] on cpu for iteration 2.",
    ):
        torchscan.loop(lambda i, c: (c, i if i < 2 else i.repeat(2)), torch.zeros(()), trip_count=3)


def test_no_iteration_and_a_body_that_needs_data() -> None:
    """A body that reads a tensor's value runs on zeros for the shapes of ys, which fake tensors
    cannot give it; where it fails on zeros too, the refusal names the line that reads."""

    def body(i, c):
        return c * int(i.item()), c.unsqueeze(0)

    carry, ys = torchscan.loop(body, torch.zeros(()), trip_count=0)
    assert (carry.item(), ys.shape) == (0.0, (0, 1))

    def needs_a_positive_count(i, c):
        n = int(c.item())
        return c + 1, torch.ones(n).reshape(n, 1).inverse()

    with pytest.raises(
        ValueError, match="no iteration runs, so the shapes of ys are found"
    ) as info:
        torchscan.loop(needs_a_positive_count, torch.zeros(()), trip_count=0)
    line = needs_a_positive_count.__code__.co_firstlineno + 1
    assert str(info.value).startswith(
        "torchscan.loop: no iteration runs, so the shapes of ys are found by calling body once: "
        f"it reads the value of a tensor at {__file__}:{line}, which fake tensors (no data) do "
        "not have, and called on zeros it failed with "
    )


def test_a_carry_grown_by_concatenation_is_shown_both_idioms() -> None:
    from .test_scan_errors import grown

    def body(i, out):
        return torch.cat((out, out[-1:] + 1), 0), None

    with errors(
        TypeError,
        "torchscan.loop: the carry must keep its type, but body changed it in its first iteration:",
        "  * carry has shape (1,) but body returned shape (2,)",
        *grown("carry", 0, "body", "def body(i, carry):", "i"),
    ):
        torchscan.loop(body, torch.zeros(1), trip_count=4)


def test_a_body_that_does_not_take_two_arguments_is_named() -> None:
    def body(carry):
        return carry, None

    code = body.__code__
    with errors(
        TypeError,
        f"torchscan.loop: body ({body.__qualname__}), defined at {code.co_filename}:"
        f"{code.co_firstlineno}, must take two arguments, as torchscan.loop calls it "
        "body(i, carry) at every iteration, i being the iteration number (a 0-d int64 tensor), "
        "but its parameters are (carry). Give it the parameters (i, carry); a body that reads no "
        "i still takes it: def body(_, carry).",
    ):
        torchscan.loop(body, torch.zeros(3), trip_count=2)
