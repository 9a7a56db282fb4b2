"""Generate ONNX control-flow fixtures with jax2onnx (an exporter other than ours).

What it makes (in the folder of this script):

* ``<name>.onnx``          -- the program exported by ``jax2onnx.to_onnx`` at
                              jax2onnx's default opset (23 for jax2onnx 0.17.1);
* ``<name>_opset18.onnx``  -- the same program exported with ``opset=18``;
* ``<name>.npz``           -- inputs ``input_0``, ``input_1``, ... (in the ONNX
                              graph's input order) and outputs ``output_0``, ...
                              (in the ONNX graph's output order) computed by
                              running the JAX function itself (not the ONNX
                              model), so they are an independent reference.
                              Both opset variants share it.
* extra data sets for some models (``<name>_<suffix>.npz``), e.g. a second
  sequence length for the symbolic-length model or the other branch of a cond;
* ``manifest.json``        -- for every .onnx file: program, opset, data sets;
* ``failures.json``        -- programs jax2onnx could not export, with the error;
* ``versions.json``        -- versions of jax, jaxlib, jax2onnx, onnx, numpy.

The programs (float32, small shapes, inputs from
``numpy.random.default_rng([SEED, crc32(name), data-set index])``):

1. ``scan_cumsum``        lax.scan cumulative sum: carry + stacked outputs
2. ``scan_rnn``           lax.scan Elman RNN h = tanh(x @ W + h @ U + b),
                          W/U/b closed-over constants; returns final h and all hs
3. ``scan_reverse``       lax.scan(reverse=True) with a tuple of two carries
                          (jax2onnx refuses reverse=True: only in failures.json)
   ``scan_reverse_flip``  the same as a forward scan over flip(xs), outputs flipped
4. ``fori_power``         lax.fori_loop with a static trip count (5 power-iteration
                          steps; A carried in the state)
   ``fori_power_closure`` the same with A closed over (fails: failures.json)
5. ``fori_dynamic``       lax.fori_loop with an upper bound taken from an input
                          (fails in jax2onnx: failures.json)
   ``while_counted``      the same loop written as lax.while_loop on a counter
                          (what JAX itself turns a dynamic fori_loop into)
6. ``while_newton``       lax.while_loop: Newton iteration for sqrt(a) until
                          max|x^2 - a| < tol; returns x and the iteration count
7. ``cond_branch``        lax.cond with a predicate computed from the input
8. ``scan_nested``        lax.scan whose body holds a lax.fori_loop and a lax.cond
   ``scan_nested_closure`` the same with the fori body closing over x (fails)
   ``scan_cumsum_dyn``    scan_cumsum exported with a symbolic length "T"
                          (data sets at T=5 and T=9)

jax2onnx 0.17.1 lowers lax.scan / fori_loop / while_loop to ONNX ``Loop`` (it
never emits ``Scan``) and lax.cond to ``If``.

Rerun (from the repository root; needs a separate environment, NOT the
project's .venv):

    python3 -m venv /tmp/jaxvenv && /tmp/jaxvenv/bin/pip install jax2onnx==0.17.1 \
        jax==0.10.2 jaxlib==0.10.2 onnx==1.23.2 onnxruntime
    /tmp/jaxvenv/bin/python tests/onnx/data/jax2onnx/generate.py
    /tmp/jaxvenv/bin/python tests/onnx/data/jax2onnx/verify.py   # onnxruntime check

Versions used for the committed files: jax 0.10.2, jaxlib 0.10.2,
jax2onnx 0.17.1, onnx 1.23.2, numpy 2.4.6 (see versions.json).
"""

from __future__ import annotations

import os

# Keep CPU use modest (single-threaded XLA on CPU).
os.environ.setdefault(
    "XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import importlib.metadata as md
import json
import platform
import traceback
import zlib
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import onnx
from jax import lax
from jax2onnx import to_onnx

HERE = Path(__file__).resolve().parent
SEED = 20240601
DEFAULT_OPSET = 23  # jax2onnx 0.17.1's default for to_onnx(opset=...)
OTHER_OPSET = 18
F32 = jnp.float32


def rng(*key: int) -> np.random.Generator:
    return np.random.default_rng([SEED, *key])


def data_rng(name: str, j: int) -> np.random.Generator:
    # One generator per (program, data set): adding a program changes no other.
    return rng(zlib.crc32(name.encode()), j)


# ---------------------------------------------------------------- programs


def scan_cumsum(xs):
    def body(c, x):
        c = c + x
        return c, c

    return lax.scan(body, jnp.zeros(xs.shape[1:], xs.dtype), xs)


_r = rng(2)
RNN_W = _r.standard_normal((4, 3)).astype(np.float32) * 0.5
RNN_U = _r.standard_normal((3, 3)).astype(np.float32) * 0.5
RNN_B = _r.standard_normal((3,)).astype(np.float32) * 0.1


def scan_rnn(xs, h0):
    W, U, b = jnp.asarray(RNN_W), jnp.asarray(RNN_U), jnp.asarray(RNN_B)

    def cell(h, x):
        h = jnp.tanh(x @ W + h @ U + b)
        return h, h

    return lax.scan(cell, h0, xs)


def scan_reverse(xs, a0, b0):
    def body(carry, x):
        a, b = carry
        a = 0.9 * a + x
        b = b + a * x
        return (a, b), a - b

    return lax.scan(body, (a0, b0), xs, reverse=True)


def scan_reverse_flip(xs, a0, b0):
    # Same result as scan_reverse, written as a forward scan over flipped xs
    # (jax2onnx 0.17.1 refuses reverse=True).
    carry, ys = scan_reverse_body_forward(jnp.flip(xs, 0), a0, b0)
    return carry, jnp.flip(ys, 0)


def scan_reverse_body_forward(xs, a0, b0):
    def body(carry, x):
        a, b = carry
        a = 0.9 * a + x
        b = b + a * x
        return (a, b), a - b

    return lax.scan(body, (a0, b0), xs)


def fori_power(A, v0):
    # A rides in the loop state: jax2onnx 0.17.1 cannot export a fori_loop body
    # that closes over a traced value (see fori_power_closure / failures.json).
    def body(i, s):
        A_, v = s
        w = A_ @ v
        return A_, w / jnp.linalg.norm(w)

    _, v = lax.fori_loop(0, 5, body, (A, v0))
    return v, v @ (A @ v)


def fori_power_closure(A, v0):
    def body(i, v):
        w = A @ v
        return w / jnp.linalg.norm(w)

    v = lax.fori_loop(0, 5, body, v0)
    return v, v @ (A @ v)


def _halve_plus_one(i, v):
    return 0.5 * v + jnp.asarray(i, v.dtype)


def fori_dynamic(x, n):
    return lax.fori_loop(0, n, _halve_plus_one, x)


def while_counted(x, n):
    def cond(s):
        i, _ = s
        return i < n

    def body(s):
        i, v = s
        return i + 1, _halve_plus_one(i, v)

    return lax.while_loop(cond, body, (jnp.int32(0), x))[1]


NEWTON_TOL = 1e-3


def while_newton(a):
    def cond(s):
        x, _ = s
        return jnp.max(jnp.abs(x * x - a)) >= NEWTON_TOL

    def body(s):
        x, k = s
        return 0.5 * (x + a / x), k + 1

    return lax.while_loop(cond, body, (a, jnp.int32(0)))


def cond_branch(x):
    pred = jnp.sum(x) > 0.0
    return lax.cond(
        pred,
        lambda v: jnp.sin(v) * 2.0,
        lambda v: jnp.cos(v) - 1.0,
        x,
    )


def scan_nested(xs, c0):
    # x rides in the fori_loop state (jax2onnx cannot close over it, see
    # scan_nested_closure).
    def body(c, x):
        _, y = lax.fori_loop(0, 3, lambda i, s: (s[0], 0.5 * s[1] + s[0]), (x, c))
        y = lax.cond(jnp.sum(y) > 0.0, jnp.tanh, lambda v: -0.5 * v, y)
        return y, jnp.sum(y * x)

    return lax.scan(body, c0, xs)


def scan_nested_closure(xs, c0):
    def body(c, x):
        y = lax.fori_loop(0, 3, lambda i, v: 0.5 * v + x, c)
        y = lax.cond(jnp.sum(y) > 0.0, jnp.tanh, lambda v: -0.5 * v, y)
        return y, jnp.sum(y * x)

    return lax.scan(body, c0, xs)


# ---------------------------------------------------------------- specs


def f32(r, *shape, scale=1.0, offset=0.0):
    return (r.standard_normal(shape) * scale + offset).astype(np.float32)


def _newton_inputs(r):
    return [r.uniform(0.5, 9.0, size=(4,)).astype(np.float32)]


def _cond_pos(r):
    x = f32(r, 4)
    return [np.abs(x)]  # sum > 0 -> true branch


def _cond_neg(r):
    x = f32(r, 4)
    return [-np.abs(x)]  # sum < 0 -> false branch


# name -> (fn, abstract input specs for to_onnx, {data-set suffix: input maker})
SPECS = {
    "scan_cumsum": (
        scan_cumsum,
        [jax.ShapeDtypeStruct((5, 3), F32)],
        {"": lambda r: [f32(r, 5, 3)]},
    ),
    "scan_rnn": (
        scan_rnn,
        [jax.ShapeDtypeStruct((6, 4), F32), jax.ShapeDtypeStruct((3,), F32)],
        {"": lambda r: [f32(r, 6, 4), f32(r, 3, scale=0.1)]},
    ),
    "scan_reverse": (
        scan_reverse,
        [jax.ShapeDtypeStruct((5, 3), F32)] + [jax.ShapeDtypeStruct((3,), F32)] * 2,
        {"": lambda r: [f32(r, 5, 3), f32(r, 3), f32(r, 3)]},
    ),
    "scan_reverse_flip": (
        scan_reverse_flip,
        [jax.ShapeDtypeStruct((5, 3), F32)] + [jax.ShapeDtypeStruct((3,), F32)] * 2,
        {"": lambda r: [f32(r, 5, 3), f32(r, 3), f32(r, 3)]},
    ),
    "fori_power": (
        fori_power,
        [jax.ShapeDtypeStruct((4, 4), F32), jax.ShapeDtypeStruct((4,), F32)],
        {"": lambda r: [f32(r, 4, 4), f32(r, 4, offset=1.0)]},
    ),
    "fori_power_closure": (
        fori_power_closure,
        [jax.ShapeDtypeStruct((4, 4), F32), jax.ShapeDtypeStruct((4,), F32)],
        {"": lambda r: [f32(r, 4, 4), f32(r, 4, offset=1.0)]},
    ),
    "fori_dynamic": (
        fori_dynamic,
        [jax.ShapeDtypeStruct((3,), F32), jax.ShapeDtypeStruct((), jnp.int32)],
        {"": lambda r: [f32(r, 3), np.int32(4)], "n0": lambda r: [f32(r, 3), np.int32(0)]},
    ),
    "while_counted": (
        while_counted,
        [jax.ShapeDtypeStruct((3,), F32), jax.ShapeDtypeStruct((), jnp.int32)],
        {"": lambda r: [f32(r, 3), np.int32(4)], "n0": lambda r: [f32(r, 3), np.int32(0)]},
    ),
    "while_newton": (
        while_newton,
        [jax.ShapeDtypeStruct((4,), F32)],
        {"": _newton_inputs},
    ),
    "cond_branch": (
        cond_branch,
        [jax.ShapeDtypeStruct((4,), F32)],
        {"": _cond_pos, "false": _cond_neg},
    ),
    "scan_nested": (
        scan_nested,
        [jax.ShapeDtypeStruct((5, 3), F32), jax.ShapeDtypeStruct((3,), F32)],
        {"": lambda r: [f32(r, 5, 3), f32(r, 3)]},
    ),
    "scan_nested_closure": (
        scan_nested_closure,
        [jax.ShapeDtypeStruct((5, 3), F32), jax.ShapeDtypeStruct((3,), F32)],
        {"": lambda r: [f32(r, 5, 3), f32(r, 3)]},
    ),
    "scan_cumsum_dyn": (
        scan_cumsum,
        [("T", 3)],  # symbolic length
        {"": lambda r: [f32(r, 5, 3)], "len9": lambda r: [f32(r, 9, 3)]},
    ),
}


# ---------------------------------------------------------------- driver


def _maybe_version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def versions() -> dict:
    return {
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "jax2onnx": md.version("jax2onnx"),
        "onnx": onnx.__version__,
        "onnx_ir": md.version("onnx_ir"),
        "numpy": np.__version__,
        "python": platform.python_version(),
        "onnxruntime_used_by_verify_py": _maybe_version("onnxruntime"),
        "default_opset": DEFAULT_OPSET,
        "other_opset": OTHER_OPSET,
        "seed": SEED,
    }


def main() -> None:
    manifest: dict = {}
    failures: dict = {}
    for old in [*HERE.glob("*.onnx"), *HERE.glob("*.npz")]:
        old.unlink()
    for name, (fn, specs, datasets) in SPECS.items():
        models = {}
        for opset, fname in (
            (DEFAULT_OPSET, f"{name}.onnx"),
            (OTHER_OPSET, f"{name}_opset{OTHER_OPSET}.onnx"),
        ):
            try:
                model = to_onnx(fn, specs, model_name=name, opset=opset)
                onnx.checker.check_model(model, full_check=True)
            except Exception as e:
                msg = "".join(traceback.format_exception_only(type(e), e)).strip()
                # first line of the message, and the innermost frame (path relative
                # to site-packages or to this folder) that raised it
                tb = traceback.extract_tb(e.__traceback__)[-1]
                where = tb.filename.split("site-packages/")[-1].replace(str(HERE) + "/", "")
                failures[fname] = f"{msg.splitlines()[0]}  [raised at {where}:{tb.lineno}]"
                print(f"FAILED {fname}: {failures[fname]}")
                continue
            onnx.save(model, HERE / fname)
            models[fname] = model
        if not models:
            continue
        data = []
        for j, (suffix, make) in enumerate(datasets.items()):
            inputs = make(data_rng(name, j))
            outs = jax.tree_util.tree_leaves(jax.jit(fn)(*[jnp.asarray(a) for a in inputs]))
            n_out = len(next(iter(models.values())).graph.output)
            assert len(outs) == n_out, (name, len(outs), n_out)
            arrays = {f"input_{i}": np.asarray(a) for i, a in enumerate(inputs)}
            arrays.update({f"output_{i}": np.asarray(o) for i, o in enumerate(outs)})
            dname = f"{name}_{suffix}.npz" if suffix else f"{name}.npz"
            np.savez(HERE / dname, **arrays)
            data.append(dname)
        for fname, model in models.items():
            manifest[fname] = {
                "program": name,
                "opset": next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                "data": data,
            }
        print(f"ok {name}: {sorted(models)} {data}")
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    (HERE / "failures.json").write_text(json.dumps(failures, indent=1, sort_keys=True) + "\n")
    (HERE / "versions.json").write_text(json.dumps(versions(), indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
