"""Check the jax2onnx fixtures: onnx.checker, op types, onnxruntime vs JAX outputs.

For every model in manifest.json: run ``onnx.checker.check_model(full_check=True)``,
print the op types of the main graph and of every subgraph (Loop bodies, If
branches, recursively), run it with onnxruntime on each of its .npz data sets and
compare with the outputs JAX computed (rtol=1e-5, atol=1e-5), printing the max
absolute difference.  Exits non-zero if anything fails.

    /tmp/jaxvenv/bin/python tests/onnx/data/jax2onnx/verify.py

Needs onnx, onnxruntime and numpy only (not jax).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import onnxruntime as ort

HERE = Path(__file__).resolve().parent
RTOL = ATOL = 1e-5


def op_types(graph: onnx.GraphProto, path: str = "main", out: dict | None = None) -> dict:
    """{graph path: Counter of op types}, subgraphs named parent/Op#i.attr.

    A Loop is listed as e.g. ``Loop(M=const 5, cond=init)``: where its trip
    count M and initial condition come from (empty, initializer, or computed).
    """
    out = {} if out is None else out
    inits = {t.name: t for t in graph.initializer}

    def src(name: str) -> str:
        if not name:
            return "empty"
        if name in inits:
            v = onnx.numpy_helper.to_array(inits[name])
            return f"const {v.tolist()}" if v.size == 1 else "const"
        return "computed"

    ops = Counter()
    for n in graph.node:
        if n.op_type == "Loop":
            ops[
                f"Loop(M={src(n.input[0])}, cond={src(n.input[1] if len(n.input) > 1 else '')})"
            ] += 1
        else:
            ops[n.op_type] += 1
    if graph.initializer:
        ops["<initializers>"] = len(graph.initializer)
    out[path] = ops
    for i, node in enumerate(graph.node):
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                op_types(sub, f"{path}/{node.op_type}#{i}.{attr.name}", out)
    return out


def main() -> int:
    manifest = json.loads((HERE / "manifest.json").read_text())
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.log_severity_level = 3  # jax2onnx leaves unused initializers in subgraphs
    bad = 0
    for fname, entry in sorted(manifest.items()):
        model = onnx.load(HERE / fname)
        onnx.checker.check_model(model, full_check=True)
        print(f"== {fname}  opset {entry['opset']}  ({(HERE / fname).stat().st_size} B)")
        for path, ops in op_types(model.graph).items():
            print(f"   {path}: {dict(sorted(ops.items()))}")
        sess = ort.InferenceSession(str(HERE / fname), opts, providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        for dname in entry["data"]:
            data = np.load(HERE / dname)
            feeds = {n: data[f"input_{i}"] for i, n in enumerate(names)}
            got = sess.run(None, feeds)
            diffs = []
            ok = True
            for i, g in enumerate(got):
                want = data[f"output_{i}"]
                if g.shape != want.shape or g.dtype != want.dtype:
                    ok = False
                    diffs.append(f"out{i}: {g.dtype}{g.shape} != {want.dtype}{want.shape}")
                    continue
                d = float(np.max(np.abs(g.astype(np.float64) - want))) if g.size else 0.0
                ok &= bool(np.allclose(g, want, rtol=RTOL, atol=ATOL))
                diffs.append(f"out{i} {want.dtype}{list(want.shape)} maxabs={d:.3g}")
            bad += not ok
            print(f"   {dname}: {'OK' if ok else 'MISMATCH'}  " + "; ".join(diffs))
    print("all OK" if not bad else f"{bad} mismatching runs")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
