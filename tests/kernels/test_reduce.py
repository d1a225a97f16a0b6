"""Reduction kernels compared against onnxruntime on single-node models."""
from __future__ import annotations

import numpy as np
import pytest

from tests.kernels.test_elementwise import assert_same, check, rand, run_kernel

REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]
INPUT_SINCE = {op: 13 if op == "ReduceSum" else 18 for op in REDUCE_OPS}
AXES = [None, (0,), (1,), (-1,), (0, 2), (2, 0, 1)]


def _data(op, dtype, shape=(3, 4, 5)):
    # LogSum needs a positive sum; Prod is kept near 1 so float32 does not overflow.
    if op == "ReduceLogSum":
        return rand(shape, dtype, 0.1, 2.0)
    if op == "ReduceProd":
        return rand(shape, dtype, 0.5, 1.5) if np.dtype(dtype).kind == "f" else rand(shape, dtype, -2, 2)
    return rand(shape, dtype, -3, 3)


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("axes", AXES)
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("opset", [11, 13, 18])
def test_reduce_float32(op, axes, keepdims, opset):
    x = _data(op, np.float32)
    if opset >= INPUT_SINCE[op]:
        inputs = [x] if axes is None else [x, np.array(axes, np.int64)]
        attrs = {"keepdims": keepdims}
    else:
        inputs = [x]
        attrs = {"keepdims": keepdims} if axes is None else {"keepdims": keepdims, "axes": axes}
    check(op, inputs, attrs, opset=opset, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float16, np.float64])
@pytest.mark.parametrize("axes", [None, (1,), (0, 2)])
def test_reduce_dtypes(op, dtype, axes):
    if np.dtype(dtype).kind in "iu" and op in ("ReduceLogSum", "ReduceLogSumExp", "ReduceL2"):
        pytest.skip("integer results of log/sqrt reductions are rounding-defined")
    x = _data(op, dtype)
    inputs = [x] if axes is None else [x, np.array(axes, np.int64)]
    check(op, inputs, {"keepdims": 1}, opset=18)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_noop_with_empty_axes(op):
    x = _data(op, np.float32)
    check(op, [x, np.zeros(0, np.int64)], {"noop_with_empty_axes": 1}, opset=INPUT_SINCE[op])
    check(op, [x], {"noop_with_empty_axes": 1}, opset=INPUT_SINCE[op])
    check(op, [x, np.zeros(0, np.int64)], {"noop_with_empty_axes": 0, "keepdims": 0}, opset=INPUT_SINCE[op])


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_max_min_bool_and_uint8(op):
    check(op, [rand((3, 4), np.uint8, 0, 200), np.array([1], np.int64)], {"keepdims": 0}, opset=18)
    check(op, [rand((3, 4), np.bool_), np.array([1], np.int64)], {"keepdims": 0}, opset=20,
          engine="onnx-reference")


def test_reduce_empty_input():
    x = np.zeros((0, 3), np.float32)
    for op, ident in (("ReduceSum", 0.0), ("ReduceProd", 1.0), ("ReduceMax", -np.inf), ("ReduceMin", np.inf)):
        out = run_kernel(op, [x, np.array([0], np.int64)], {"keepdims": 0}, opset=18)[0]
        assert_same(out, np.full((3,), ident, np.float32))


def test_reduce_log_sum_exp_stability():
    x = np.array([[1000.0, 1000.0], [-np.inf, -np.inf], [-1000.0, 5.0]], np.float32)
    out = run_kernel("ReduceLogSumExp", [x, np.array([1], np.int64)], {"keepdims": 0}, opset=18)[0]
    np.testing.assert_allclose(out, [1000.0 + np.log(2.0), -np.inf, 5.0], rtol=1e-6)


def test_reduce_bad_axis():
    with pytest.raises(ValueError):
        run_kernel("ReduceSum", [rand((2, 3)), np.array([2], np.int64)], opset=13)
    with pytest.raises(ValueError):
        run_kernel("ReduceMean", [rand((2, 3))], {"axes": (0, -2)}, opset=13)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("select_last_index", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64])
def test_arg(op, axis, keepdims, select_last_index, dtype):
    x = rand((3, 4, 5), dtype, -2, 2)  # ties are common, so select_last_index matters
    if dtype == np.float32:
        x = np.round(x)
    attrs = {"axis": axis, "keepdims": keepdims, "select_last_index": select_last_index}
    check(op, [x], attrs, opset=13)
    if not select_last_index:
        check(op, [x], {"axis": axis, "keepdims": keepdims}, opset=11)
