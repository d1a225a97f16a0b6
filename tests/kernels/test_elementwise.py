"""Elementwise kernels compared against onnxruntime on single-node models."""
from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import helper

from minirt.kernels import lookup
from tests.kernels import reference as ref_mod

RNG = np.random.default_rng(0)


# --------------------------------------------------------------------------- shared helpers (used by the other kernel test modules too)


def reference(op_type, inputs, attrs=None, n_outputs=1, opset=17, constant_inputs=(), engine="onnxruntime"):
    """onnxruntime's (or the onnx reference evaluator's) result for one node.

    Falls back to the onnx reference evaluator when onnxruntime has no kernel
    for the op/dtype/opset combination.

    Builds the model with :func:`reference.single_node_model` but declares
    the graph outputs without a type: onnxruntime rejects outputs typed as
    UNDEFINED, while an untyped output is inferred.
    """
    model = ref_mod.single_node_model(op_type, inputs, attrs, n_outputs, opset, constant_inputs=constant_inputs)
    del model.graph.output[:]
    model.graph.output.extend(helper.make_empty_tensor_value_info(f"out{i}") for i in range(n_outputs))
    feeds = {f"in{i}": np.asarray(x) for i, x in enumerate(inputs) if x is not None and i not in constant_inputs}
    if engine == "onnx-reference":
        from onnx.reference import ReferenceEvaluator

        return list(ReferenceEvaluator(model).run(None, feeds))
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime lacks a kernel for this op/dtype/opset
        if "NOT_IMPLEMENTED" not in str(exc) and "Could not find an implementation" not in str(exc):
            raise
        return reference(op_type, inputs, attrs, n_outputs, opset, constant_inputs, "onnx-reference")
    return sess.run(None, feeds)


def run_kernel(op_type, inputs, attrs=None, opset=17, n_outputs=1, output_dtypes=None):
    """Call the registered minirt kernel the way the session does."""
    from minirt.kernels import NodeContext

    entry = lookup("", op_type, opset)
    assert entry is not None, f"no kernel for {op_type} at opset {opset}"
    attrs = dict(attrs or {})
    if entry.attributes is not None:
        unknown = set(attrs) - entry.attributes
        assert not unknown, f"{op_type}-{entry.since} does not accept {unknown}"
    if entry.context:
        attrs["ctx"] = NodeContext("n", op_type, n_outputs, tuple(output_dtypes or (None,) * n_outputs), opset)
    out = entry.fn(*inputs, **attrs)
    return list(out) if isinstance(out, tuple) else [out]


def assert_same(actual, expected, rtol=None, atol=None):
    """Exact dtype and shape, values close (floats) or equal (everything else)."""
    expected = np.asarray(expected)
    assert isinstance(actual, np.ndarray), f"kernel returned {type(actual).__name__}, not ndarray"
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"shape {actual.shape} != {expected.shape}"
    if expected.dtype.kind == "f":
        default = {2: 2e-3, 4: 1e-5, 8: 1e-7}[expected.dtype.itemsize]
        np.testing.assert_allclose(actual, expected, rtol=rtol or default, atol=atol or default, equal_nan=True)
    else:
        np.testing.assert_array_equal(actual, expected)


def check(op_type, inputs, attrs=None, opset=17, n_outputs=1, constant_inputs=(), engine="onnxruntime",
          rtol=None, atol=None):
    """Run the kernel and the reference on the same node and compare every output."""
    expected = reference(op_type, inputs, attrs, n_outputs, opset, constant_inputs, engine)
    dtypes = [np.asarray(e).dtype for e in expected]
    actual = run_kernel(op_type, inputs, attrs, opset, n_outputs, dtypes)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert_same(a, e, rtol, atol)
    return actual


def rand(shape, dtype=np.float32, low=-3.0, high=3.0):
    dtype = np.dtype(dtype)
    if dtype == bool:
        return RNG.random(shape) > 0.5
    if dtype.kind in "iu":
        lo = max(int(low), np.iinfo(dtype).min)
        return RNG.integers(lo, int(high) + 1, size=shape).astype(dtype)
    return RNG.uniform(low, high, size=shape).astype(dtype)


# --------------------------------------------------------------------------- arithmetic

NUMERIC = [np.float32, np.float16, np.float64, np.int32, np.int64]
SHAPE_PAIRS = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((2, 1, 4), (3, 1)), ((), (2, 2)), ((3, 4), ())]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("dtype", NUMERIC)
@pytest.mark.parametrize("shapes", SHAPE_PAIRS)
@pytest.mark.parametrize("opset", [7, 13, 14])
def test_binary_arithmetic(op, dtype, shapes, opset):
    a = rand(shapes[0], dtype, -9, 9)
    b = rand(shapes[1], dtype, -9, 9)
    if op == "Div":
        b = np.where(b == 0, dtype(3), b).astype(dtype)
    check(op, [a, b], opset=opset)


def test_integer_div_truncates_toward_zero():
    a = np.array([-7, 7, -7, 7, 6, -6], np.int32)
    b = np.array([2, 2, -2, -2, 4, 4], np.int32)
    out = check("Div", [a, b], opset=14)[0]
    np.testing.assert_array_equal(out, [-3, 3, 3, -3, 1, -1])
    with pytest.raises(ValueError):
        run_kernel("Div", [a, np.zeros_like(a)], opset=14)


@pytest.mark.parametrize("op,expected", [("Add", [[11, 22], [13, 24]]), ("Sub", [[-9, -18], [-7, -16]])])
def test_legacy_broadcast_axis(op, expected):
    a = np.array([[1, 2], [3, 4]], np.float32)
    b = np.array([10, 20], np.float32)
    out = run_kernel(op, [a, b], {"broadcast": 1, "axis": 1}, opset=6)[0]
    np.testing.assert_array_equal(out, np.array(expected, np.float32))
    col = run_kernel("Add", [a, b], {"broadcast": 1, "axis": 0}, opset=6)[0]
    np.testing.assert_array_equal(col, [[11, 12], [23, 24]])
    with pytest.raises(ValueError):
        run_kernel("Add", [a, b], {}, opset=6)


@pytest.mark.parametrize("base_dtype,exp_dtype", [
    (np.float32, np.float32), (np.float32, np.int64), (np.float32, np.int32), (np.float16, np.float16),
    (np.int32, np.int32), (np.int64, np.int64), (np.int32, np.float32), (np.float64, np.float64),
])
@pytest.mark.parametrize("opset", [13, 15])
def test_pow(base_dtype, exp_dtype, opset):
    base = rand((3, 4), base_dtype, 1, 4)
    exp = rand((4,), exp_dtype, 0, 3)
    check("Pow", [base, exp], opset=opset)


def test_pow_negative_integer_exponent():
    check("Pow", [np.array([2, 3, 1, -1], np.int32), np.array([-1, 2, -3, -3], np.int32)], opset=15)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int8])
@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_int(dtype, fmod):
    a = rand((4, 5), dtype, -20, 20)
    b = rand((5,), dtype, 1, 6) * np.array([1, -1, 1, -1, 1], dtype)
    check("Mod", [a, b], {"fmod": fmod}, opset=13)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mod_float(dtype):
    a = rand((4, 5), dtype, -20, 20)
    b = rand((5,), dtype, 1, 6) * np.array([1, -1, 1, -1, 1], dtype)
    check("Mod", [a, b], {"fmod": 1}, opset=13)
    with pytest.raises(ValueError):
        run_kernel("Mod", [a, b], {"fmod": 0}, opset=13)


# --------------------------------------------------------------------------- unary math

UNARY_DOMAINS = {
    "Neg": (-5, 5), "Abs": (-5, 5), "Reciprocal": (0.5, 5), "Sqrt": (0, 9), "Exp": (-5, 5),
    "Log": (0.1, 9), "Floor": (-5, 5), "Ceil": (-5, 5), "Round": (-5, 5), "Sign": (-5, 5),
    "Sin": (-5, 5), "Cos": (-5, 5), "Tan": (-1.4, 1.4), "Asin": (-1, 1), "Acos": (-1, 1),
    "Atan": (-5, 5), "Sinh": (-3, 3), "Cosh": (-3, 3), "Asinh": (-5, 5), "Acosh": (1, 9),
    "Atanh": (-0.99, 0.99), "Erf": (-4, 4), "Tanh": (-5, 5), "Sigmoid": (-20, 20), "Softplus": (-20, 20),
    "Softsign": (-5, 5), "Relu": (-5, 5), "HardSwish": (-5, 5), "Mish": (-10, 10), "IsNaN": (-1, 1),
}


@pytest.mark.parametrize("op", sorted(UNARY_DOMAINS))
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_unary_float(op, dtype):
    opset = 18 if op == "Mish" else 17
    lo, hi = UNARY_DOMAINS[op]
    x = rand((3, 4, 5), dtype, lo, hi)
    if op == "Round":
        x = np.concatenate([x.reshape(-1), np.array([0.5, 1.5, 2.5, -0.5, -2.5], dtype)])
    check(op, [x], opset=opset)


@pytest.mark.parametrize("op", ["Neg", "Abs", "Sign", "Relu"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int8])
def test_unary_int(op, dtype):
    check(op, [rand((4, 5), dtype, -9, 9)], opset=14)


def test_sigmoid_extremes():
    x = np.array([-1000, -100, -20, 0, 20, 100, 1000], np.float32)
    check("Sigmoid", [x])
    check("Softplus", [x])


def test_erf_precision():
    x = np.linspace(-6, 6, 200001)
    approx = run_kernel("Erf", [x.astype(np.float64)])[0]
    exact = np.array([math.erf(v) for v in x])
    assert np.max(np.abs(approx - exact)) < 1e-6
    tiny = np.array([1e-30, -1e-12, 1e-6], np.float32)
    out = run_kernel("Erf", [tiny])[0]
    np.testing.assert_allclose(out, [math.erf(v) for v in tiny.astype(np.float64)], rtol=1e-6)


# --------------------------------------------------------------------------- activations with attributes


@pytest.mark.parametrize("op,attrs,opset", [
    ("LeakyRelu", {}, 6), ("LeakyRelu", {"alpha": 0.3}, 16),
    ("Elu", {}, 6), ("Elu", {"alpha": 0.5}, 6),
    ("Selu", {}, 6), ("Selu", {"alpha": 2.0, "gamma": 3.0}, 6),
    ("Celu", {}, 12), ("Celu", {"alpha": 2.0}, 12),
    ("HardSigmoid", {}, 6), ("HardSigmoid", {"alpha": 1 / 6, "beta": 0.5}, 6),
    ("ThresholdedRelu", {}, 10), ("ThresholdedRelu", {"alpha": 0.5}, 10),
    ("Shrink", {}, 9), ("Shrink", {"bias": 1.5, "lambd": 1.0}, 9),
    ("Gelu", {}, 20), ("Gelu", {"approximate": "tanh"}, 20), ("Gelu", {"approximate": "none"}, 20),
    ("Clip", {}, 6), ("Clip", {"min": -1.0}, 6), ("Clip", {"min": -1.0, "max": 0.5}, 6),
])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_activation_attrs(op, attrs, opset, dtype):
    if dtype == np.float16 and op == "Celu":
        pytest.skip("Celu is float32 only in the ONNX schema")
    x = rand((2, 3, 8), dtype, -4, 4)
    check(op, [x], attrs, opset=opset)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_shrink_int(dtype):
    check("Shrink", [rand((20,), dtype, -5, 5)], {"lambd": 1.5, "bias": 1.0}, opset=9)


@pytest.mark.parametrize("slope_shape", [(1,), (3, 1, 1), (5,), (2, 3, 4, 5)])
def test_prelu(slope_shape):
    x = rand((2, 3, 4, 5))
    check("PRelu", [x, rand(slope_shape, np.float32, 0, 1)], opset=16)


def test_prelu_legacy_channel_slope():
    x = rand((2, 3, 4, 5))
    slope = np.array([0.1, 0.2, 0.3], np.float32)
    out = run_kernel("PRelu", [x, slope], opset=6)[0]
    np.testing.assert_allclose(out, np.where(x < 0, x * slope[:, None, None], x))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int64, np.uint8])
@pytest.mark.parametrize("bounds", ["both", "min", "max", "none", "inverted"])
@pytest.mark.parametrize("opset", [11, 13])
def test_clip_inputs(dtype, bounds, opset):
    if opset == 11 and dtype != np.float32:
        pytest.skip("Clip-11 is float only")
    x = rand((3, 7), dtype, 0 if dtype == np.uint8 else -10, 10)
    lo, hi = np.array(2, dtype), np.array(6, dtype)
    inputs = {"both": [x, lo, hi], "min": [x, lo], "max": [x, None, hi], "none": [x],
              "inverted": [x, hi, lo]}[bounds]
    check("Clip", inputs, opset=opset)


# --------------------------------------------------------------------------- variadic


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int64])
def test_variadic(op, n, dtype):
    if op in ("Sum", "Mean") and dtype in (np.int32, np.int64):
        pytest.skip("Sum/Mean are float only in the ONNX schema")
    shapes = [(2, 3, 4), (3, 1), (4,)][:n]
    check(op, [rand(s, dtype, -9, 9) for s in shapes], opset=13)


def test_max_propagates_nan():
    a = np.array([np.nan, 1, 2], np.float32)
    b = np.array([1, np.nan, 1], np.float32)
    check("Max", [a, b], opset=13)
    check("Min", [a, b], opset=13)


# --------------------------------------------------------------------------- comparison / logic


@pytest.mark.parametrize("op", ["Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.float64])
def test_compare(op, dtype):
    a = rand((3, 4), dtype, -3, 3)
    b = rand((4,), dtype, -3, 3)
    check(op, [a, b], opset=16 if op.endswith("Equal") and op != "Equal" else 13)


def test_equal_bool_and_string():
    check("Equal", [rand((5,), bool), rand((5,), bool)], opset=13)
    a = np.array(["a", "b", "c"], dtype=object)
    b = np.array(["a", "x", "c"], dtype=object)
    check("Equal", [a, b], opset=19)


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic(op):
    check(op, [rand((3, 4), bool), rand((1, 4), bool)], opset=7)


def test_not_where():
    check("Not", [rand((3, 4), bool)])
    for dtype in (np.float32, np.int64, np.int32, np.uint8):
        check("Where", [rand((3, 1), bool), rand((3, 4), dtype), rand((4,), dtype)], opset=16)


def test_isinf():
    x = np.array([np.inf, -np.inf, 0.0, np.nan, 1.0], np.float32)
    for neg in (0, 1):
        for pos in (0, 1):
            check("IsInf", [x], {"detect_negative": neg, "detect_positive": pos}, opset=10)
    check("IsNaN", [x], opset=13)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bitshift(dtype, direction):
    x = rand((10,), dtype, 0, 200)
    s = rand((10,), dtype, 0, 3)
    check("BitShift", [x, s], {"direction": direction}, opset=11)


@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.int8])
def test_bitwise(op, dtype):
    check(op, [rand((3, 4), dtype, 0, 100), rand((4,), dtype, 0, 100)], opset=18)


@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.int64])
def test_bitwise_not(dtype):
    check("BitwiseNot", [rand((3, 4), dtype, 0, 100)], opset=18)


def test_outputs_are_arrays_not_scalars():
    for op in ("Relu", "Sigmoid", "Exp", "Erf", "Neg", "Round"):
        out = run_kernel(op, [np.array(0.5, np.float32)])[0]
        assert isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == ()
    out = run_kernel("Add", [np.array(1, np.int64), np.array(2, np.int64)], opset=14)[0]
    assert isinstance(out, np.ndarray) and out.shape == ()
