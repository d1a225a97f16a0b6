"""Tree ensembles against onnxruntime (issue 25): latency ratios and file sizes.

Two models, trained here on synthetic data (20 features, no downloads):

* a gradient-boosted regressor: LightGBM, 500 trees of depth <= 6 (63 leaves), converted with
  onnxmltools (TreeEnsembleRegressor);
* a RandomForestClassifier of 100 deep trees (no depth limit, 3 classes), converted with skl2onnx
  (TreeEnsembleClassifier, no ZipMap).

Each is built with minirt and run by both runtimes at 1 thread, interleaved in one process, at batch
1 and batch 1000; a figure is the median of the calling thread's CPU time (``time.thread_time``: the
host is shared) over blocks of runs.  Prints a table of minirt / onnxruntime ratios (goal <= 1.0)
and the .mrt size against the .onnx size.

    python benchmarks/trees.py [--blocks 31] [--native 0|1]

A benchmark, not a test: the numbers depend on the machine and its load.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

N_FEATURES = 20


def _data(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, N_FEATURES)).astype(np.float32)
    w = rng.normal(size=N_FEATURES)
    score = x @ w + 0.5 * np.sin(3 * x[:, 0]) * x[:, 1] + 0.3 * x[:, 2] ** 2
    y_reg = (score + 0.1 * rng.normal(size=n)).astype(np.float32)
    y_cls = np.digitize(score, np.quantile(score, [1 / 3, 2 / 3]))
    return x, y_reg, y_cls


def gbm_model() -> bytes:
    import lightgbm as lgb
    from onnxmltools import convert_lightgbm
    from onnxmltools.convert.common.data_types import FloatTensorType

    x, y, _ = _data(5000)
    model = lgb.LGBMRegressor(n_estimators=500, max_depth=6, num_leaves=63, min_child_samples=5,
                              learning_rate=0.05, verbose=-1, random_state=0)
    model.fit(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onx = convert_lightgbm(model, initial_types=[("X", FloatTensorType([None, N_FEATURES]))], target_opset=15)
    return onx.SerializeToString()


def forest_model() -> bytes:
    import skl2onnx
    from sklearn.ensemble import RandomForestClassifier

    x, _, y = _data(5000, seed=1)
    model = RandomForestClassifier(n_estimators=100, random_state=0, n_jobs=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(x, y)
        onx = skl2onnx.to_onnx(model, x[:1], target_opset={"": 17, "ai.onnx.ml": 3},
                               options={"zipmap": False})
    depth = max(e.get_depth() for e in model.estimators_)
    print(f"  random forest: 100 trees, max depth {depth}, "
          f"{sum(e.tree_.node_count for e in model.estimators_)} nodes")
    return onx.SerializeToString()


def interleaved(runs: dict, blocks: int, per_block: int) -> dict:
    """Median seconds per call of each function, timed in alternating blocks of ``per_block`` calls."""
    for fn in runs.values():
        for _ in range(3):
            fn()
    times: dict = {k: [] for k in runs}
    keys = list(runs)
    for b in range(blocks):
        for k in (keys if b % 2 == 0 else keys[::-1]):
            fn = runs[k]
            t0 = time.thread_time()
            for _ in range(per_block):
                fn()
            times[k].append((time.thread_time() - t0) / per_block)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=31)
    ap.add_argument("--native", type=int, default=None, help="0: force minirt's numpy tree path")
    args = ap.parse_args()

    import onnxruntime as ort

    import minirt
    from minirt.builder import build_bytes

    if args.native is not None and not args.native:
        from minirt.kernels import trees

        trees.NATIVE = False
    print("training and converting...")
    models = {"LightGBM 500 trees depth 6": gbm_model(), "RandomForest 100 deep trees": forest_model()}
    x_all = _data(1000, seed=7)[0]
    rows = []
    for name, onnx_bytes in models.items():
        mrt = build_bytes(onnx_bytes)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        o = ort.InferenceSession(onnx_bytes, opts, providers=["CPUExecutionProvider"])
        m = minirt.InferenceSession(mrt, threads=1)
        in_name = o.get_inputs()[0].name
        for batch in (1, 1000):
            feed = {in_name: x_all[:batch]}
            ref, got = o.run(None, feed), m.run(None, feed)
            for r, g in zip(ref, got):
                r, g = np.asarray(r), np.asarray(g)
                if r.dtype.kind == "f":
                    scale = max(float(np.abs(r).max()), 1e-30)
                    assert np.allclose(g, r, rtol=1e-5, atol=1e-5 * scale), f"{name}: outputs differ"
                else:
                    assert (r == g).all(), f"{name}: labels differ"
            per_block = 200 if batch == 1 else 2
            t = interleaved({"minirt": lambda: m.run(None, feed), "onnxruntime": lambda: o.run(None, feed)},
                            args.blocks, per_block)
            rows.append((name, batch, t["minirt"], t["onnxruntime"]))
        rows.append((name, "size", len(mrt), len(onnx_bytes)))

    print()
    print(f"| model | batch | minirt | onnxruntime | ratio |")
    print(f"|---|---|---|---|---|")
    for name, batch, a, b in rows:
        if batch == "size":
            print(f"| {name} | .mrt / .onnx bytes | {a:,} | {b:,} | {a / b:.3f} |")
        else:
            print(f"| {name} | {batch} | {a * 1e6:.1f} us | {b * 1e6:.1f} us | {a / b:.2f} |")


if __name__ == "__main__":
    main()
