"""Shared helpers of tests/ml: run an ONNX model with onnxruntime and with minirt (built by minirt's
builder) and compare the results the way the issue asks: labels identical, numbers within 1e-5
relative.  onnxruntime runs single-threaded: with more threads it adds a batch-1 tree ensemble's
trees in per-thread partial sums, whose float32 rounding differs from the tree-order sum that both
runtimes make on one thread."""
from __future__ import annotations

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime", reason="the reference runtime (pip install minirt[dev])")

RTOL = 1e-5
# Relative to the output's own scale, for values near 0: an SVM's or a booster's output is a float32 sum
# of many terms ~|y|, and a value that nearly cancels carries the rounding of those terms (~1e-7 |y|
# each), which no other summation order reproduces exactly; 1e-5 of the largest |value| of the output
# bounds that, and is the same "1e-5 relative" taken on the output's scale.
SCALE_RTOL = 1e-5


def run_onnxruntime(model_bytes: bytes, feeds: dict) -> list:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(model_bytes, opts, providers=["CPUExecutionProvider"]).run(None, feeds)


def run_minirt(model_bytes: bytes, feeds: dict, **build_options) -> tuple[list, int]:
    import minirt
    from minirt.builder import build_bytes

    data = build_bytes(model_bytes, **build_options)
    return minirt.InferenceSession(data).run(None, feeds), len(data)


def _numbers(value) -> tuple[np.ndarray, list | None]:
    """An output as (array of numbers, keys) — a list of dicts becomes its values, keys kept apart."""
    if isinstance(value, list) and value and isinstance(value[0], dict):
        keys = [list(d.keys()) for d in value]
        return np.array([list(d.values()) for d in value], dtype=np.float64), keys
    return np.asarray(value), None


def compare_outputs(expected: list, actual: list, scale_of: list | None = None) -> dict:
    """Assert minirt's outputs match onnxruntime's; returns {"max_abs": ..., "max_rel": ...} over the numbers.
    ``scale_of``: the outputs whose scale bounds values near 0 (default ``expected``; a run on a few
    samples takes its full batch's)."""
    assert len(expected) == len(actual)
    worst_abs = worst_rel = 0.0
    scales = []
    for e in scale_of or expected:
        v = _numbers(e)[0]
        scales.append(float(np.nanmax(np.abs(v.astype(np.float64)))) if v.size and v.dtype.kind in "fiu" else 0.0)
    for i, (e, a) in enumerate(zip(expected, actual)):
        assert type(e) is type(a) or (isinstance(e, np.ndarray) and isinstance(a, np.ndarray)), \
            f"output {i}: onnxruntime returns {type(e).__name__}, minirt {type(a).__name__}"
        ev, ekeys = _numbers(e)
        av, akeys = _numbers(a)
        assert ekeys == akeys, f"output {i}: the dict keys differ"
        if isinstance(e, list):
            assert all(type(k1) is type(k2) for r1, r2 in zip(ekeys, akeys) for k1, k2 in zip(r1, r2))
            assert all(type(v) is float for d in a for v in d.values())
        assert ev.shape == av.shape, f"output {i}: shape {av.shape} != onnxruntime's {ev.shape}"
        if ev.dtype.kind in "OUSib" and not isinstance(e, list):
            assert av.dtype == ev.dtype or (ev.dtype.kind in "OU" and av.dtype == object), \
                f"output {i}: dtype {av.dtype} != {ev.dtype}"
            mismatch = np.flatnonzero(ev.reshape(-1) != av.reshape(-1))
            assert mismatch.size == 0, (f"output {i}: {mismatch.size} labels differ, first at {mismatch[0]}: "
                                        f"{ev.reshape(-1)[mismatch[0]]!r} vs {av.reshape(-1)[mismatch[0]]!r}")
            continue
        if not isinstance(e, list):
            assert av.dtype == ev.dtype, f"output {i}: dtype {av.dtype} != {ev.dtype}"
        ev64, av64 = ev.astype(np.float64), av.astype(np.float64)
        diff = np.abs(ev64 - av64)
        if diff.size:
            worst_abs = max(worst_abs, float(np.nanmax(diff)))
            big = np.abs(ev64) >= 1e-3  # (relative differences of values near 0 say nothing)
            if big.any():
                worst_rel = max(worst_rel, float(np.nanmax(diff[big] / np.abs(ev64[big]))))
        np.testing.assert_allclose(av64, ev64, rtol=RTOL, atol=max(SCALE_RTOL * scales[i], 1e-7), err_msg=f"output {i}")
    return {"max_abs": worst_abs, "max_rel": worst_rel}
