"""Linear-algebra kernels (minirt/kernels/linalg.py) against onnxruntime.

Kernels are called through the registry so registration and the
since-version lookup are exercised too.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from minirt.kernels import NodeContext, lookup
from tests.kernels.reference import reference_outputs, single_node_model


def _reference(op, inputs, attrs, opset, engine="onnxruntime"):
    try:
        return reference_outputs(op, inputs, attrs, 1, opset, engine=engine)
    except Exception as exc:  # noqa: BLE001
        # reference.py declares outputs with an UNDEFINED element type, which
        # onnxruntime refuses to load; retry with the output types left out.
        if engine != "onnxruntime" or "Invalid tensor data type 0" not in str(exc):
            raise
    import onnxruntime as ort

    model = single_node_model(op, inputs, attrs, 1, opset)
    for out in model.graph.output:
        out.ClearField("type")
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {f"in{i}": np.asarray(x) for i, x in enumerate(inputs) if x is not None})


def run_kernel(op, inputs, attrs=None, opset=17):
    entry = lookup("", op, opset)
    assert entry is not None, f"no kernel for {op} at opset {opset}"
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in (attrs or {}).items()}
    if entry.context:
        kwargs["ctx"] = NodeContext(name="node", op_type=op, n_outputs=1, output_dtypes=(None,), opset=opset)
    return entry.fn(*inputs, **kwargs)


def check(op, inputs, attrs=None, *, opset=17, rtol=1e-5, atol=1e-5, engine="onnxruntime"):
    got = run_kernel(op, inputs, attrs, opset)
    (ref,) = _reference(op, inputs, attrs or {}, opset, engine)
    assert isinstance(got, np.ndarray), f"result is {type(got)}, not ndarray"
    assert got.dtype == ref.dtype, f"dtype {got.dtype}, expected {ref.dtype}"
    assert got.shape == ref.shape, f"shape {got.shape}, expected {ref.shape}"
    if ref.dtype == np.float16:
        np.testing.assert_allclose(got.astype(np.float32), ref.astype(np.float32), rtol=1e-2, atol=1e-2)
    elif ref.dtype.kind == "f":
        np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol)
    else:
        np.testing.assert_array_equal(got, ref)
    return got


def rand(rng, shape, dtype=np.float32):
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -50), min(info.max, 50), size=shape, endpoint=True).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


# --------------------------------------------------------------------------- registry / attributes

LINALG_OPS = {
    "Gemm": [1, 6, 7, 9, 11, 13],
    "MatMul": [1, 9, 13],
    "MatMulInteger": [10],
    "Einsum": [12],
}


@pytest.mark.parametrize("op,opset", [(op, v) for op, vs in LINALG_OPS.items() for v in vs])
def test_attributes_match_schema(op, opset):
    entry = lookup("", op, opset)
    assert entry is not None and entry.since <= opset
    expected = set(onnx.defs.get_schema(op, opset).attributes.keys())
    assert entry.attributes is not None
    assert expected <= entry.attributes, f"{op}@{opset}: not accepted: {expected - entry.attributes}"
    assert entry.attributes == expected


def test_first_opsets():
    assert lookup("", "MatMulInteger", 9) is None
    assert lookup("", "Einsum", 11) is None
    assert lookup("", "Gemm", 6).since == 1
    assert lookup("", "Gemm", 13).since == 7


# --------------------------------------------------------------------------- Gemm


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (), (1,), (5,), (1, 5), (4, 1), (4, 5)])
@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (0.5, 2.0), (-1.5, 0.0)])
def test_gemm(trans_a, trans_b, c_shape, alpha, beta):
    rng = np.random.default_rng(0)
    a = rand(rng, (3, 4) if trans_a else (4, 3))
    b = rand(rng, (5, 3) if trans_b else (3, 5))
    inputs = [a, b] if c_shape is None else [a, b, rand(rng, c_shape)]
    check("Gemm", inputs, {"alpha": alpha, "beta": beta, "transA": trans_a, "transB": trans_b}, opset=13)


@pytest.mark.parametrize("opset", [7, 9, 11, 13])
def test_gemm_opsets(opset):
    rng = np.random.default_rng(1)
    check("Gemm", [rand(rng, (6, 7)), rand(rng, (8, 7)), rand(rng, (8,))], {"transB": 1, "alpha": 0.25}, opset=opset)


def test_gemm_opset6_broadcast():
    rng = np.random.default_rng(2)
    a, b = rand(rng, (4, 3)), rand(rng, (3, 5))
    c_row = rand(rng, (5,))
    got = run_kernel("Gemm", [a, b, c_row], {"broadcast": 1, "beta": 2.0}, opset=6)
    np.testing.assert_allclose(got, a @ b + 2.0 * c_row, rtol=1e-5, atol=1e-5)
    assert got.dtype == np.float32
    c_full = rand(rng, (4, 5))
    np.testing.assert_allclose(run_kernel("Gemm", [a, b, c_full], {}, opset=1), a @ b + c_full, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="broadcast=0"):
        run_kernel("Gemm", [a, b, c_row], {"broadcast": 0}, opset=6)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_gemm_dtypes(dtype):
    rng = np.random.default_rng(3)
    check("Gemm", [rand(rng, (4, 6), dtype), rand(rng, (6, 3), dtype), rand(rng, (3,), dtype)], {"alpha": 0.5})


def test_gemm_large_float32():
    rng = np.random.default_rng(4)
    inputs = [rand(rng, (64, 256)), rand(rng, (128, 256)), rand(rng, (128,))]
    y = check("Gemm", inputs, {"transB": 1}, rtol=1e-4, atol=1e-4)
    assert y.dtype == np.float32


def test_gemm_integer_dtype():
    # onnxruntime has no integer Gemm kernel; ONNX allows int32/int64 from opset 9.
    rng = np.random.default_rng(5)
    a, b, c = rand(rng, (3, 4), np.int32), rand(rng, (4, 2), np.int32), rand(rng, (2,), np.int32)
    got = run_kernel("Gemm", [a, b, c], {}, opset=13)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, a @ b + c)
    got = run_kernel("Gemm", [a, b, c], {"alpha": 2.0, "beta": 3.0}, opset=13)
    np.testing.assert_array_equal(got, 2 * (a @ b) + 3 * c)


@pytest.mark.parametrize(
    "shapes,attrs,match",
    [
        (((3, 4), (5, 6)), {}, "inner dimensions"),
        (((3, 4), (3, 5)), {"transA": 0}, "inner dimensions"),
        (((2, 3, 4), (4, 5)), {}, "2-D"),
        (((4,), (4, 5)), {}, "2-D"),
        (((3, 4), (4, 5), (2, 5)), {}, "broadcast"),
        (((3, 4), (4, 5), (5, 1)), {}, "broadcast"),
        (((3, 4), (4, 5), (2, 3, 5)), {}, "rank"),
    ],
)
def test_gemm_rejects_bad_shapes(shapes, attrs, match):
    rng = np.random.default_rng(6)
    with pytest.raises(ValueError, match=match):
        run_kernel("Gemm", [rand(rng, s) for s in shapes], attrs, opset=13)


# --------------------------------------------------------------------------- MatMul

MATMUL_SHAPES = [
    ((3, 4), (4, 5)),
    ((4,), (4, 5)),
    ((3, 4), (4,)),
    ((4,), (4,)),
    ((2, 3, 4), (4, 5)),
    ((3, 4), (2, 4, 5)),
    ((2, 3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (1, 5, 4, 2)),
    ((2, 3, 4), (4,)),
    ((4,), (2, 4, 5)),
    ((1, 4), (4, 1)),
    ((0, 4), (4, 3)),
]


@pytest.mark.parametrize("a_shape,b_shape", MATMUL_SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_matmul(a_shape, b_shape, dtype):
    rng = np.random.default_rng(10)
    check("MatMul", [rand(rng, a_shape, dtype), rand(rng, b_shape, dtype)], opset=13)


@pytest.mark.parametrize("a_shape,b_shape", MATMUL_SHAPES[:8])
def test_matmul_float16(a_shape, b_shape):
    rng = np.random.default_rng(11)
    check("MatMul", [rand(rng, a_shape, np.float16), rand(rng, b_shape, np.float16)], opset=13)


@pytest.mark.parametrize("opset", [1, 9, 13])
def test_matmul_opsets(opset):
    rng = np.random.default_rng(12)
    check("MatMul", [rand(rng, (2, 3, 8)), rand(rng, (8, 16))], opset=opset)


def test_matmul_large_float32():
    rng = np.random.default_rng(13)
    y = check("MatMul", [rand(rng, (4, 64, 128)), rand(rng, (128, 96))], rtol=1e-4, atol=1e-4)
    assert y.dtype == np.float32


@pytest.mark.parametrize("a_shape,b_shape", [((3, 4), (5, 6)), ((2, 3, 4), (3, 4, 5)), ((), (3,)), ((3,), (4,))])
def test_matmul_rejects_incompatible(a_shape, b_shape):
    rng = np.random.default_rng(14)
    with pytest.raises(ValueError, match="MatMul"):
        run_kernel("MatMul", [rand(rng, a_shape), rand(rng, b_shape)])


# --------------------------------------------------------------------------- MatMulInteger


def _int_rand(rng, shape, dtype):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)


@pytest.mark.parametrize("a_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("b_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("zero_points", ["none", "scalar", "a_only", "b_only", "one_element", "b_per_column"])
def test_matmul_integer(a_dtype, b_dtype, zero_points):
    rng = np.random.default_rng(20)
    a, b = _int_rand(rng, (4, 7), a_dtype), _int_rand(rng, (7, 3), b_dtype)
    za = np.array(3 if a_dtype == np.uint8 else -2, dtype=a_dtype)
    zb = np.array(5 if b_dtype == np.uint8 else 1, dtype=b_dtype)
    inputs = {
        "none": [a, b],
        "scalar": [a, b, za, zb],
        "a_only": [a, b, za],
        "b_only": [a, b, None, zb],
        "one_element": [a, b, za.reshape(1), zb.reshape(1)],
        "b_per_column": [a, b, za, np.array([1, 2, 3], dtype=b_dtype)],
    }[zero_points]
    check("MatMulInteger", inputs, opset=10)


@pytest.mark.parametrize(
    "a_shape,b_shape,za_shape,zb_shape",
    [((4, 7), (7, 3), (4,), (3,)), ((2, 4, 7), (2, 7, 3), (2, 4, 1), (2, 1, 3)), ((2, 4, 7), (7, 3), (4,), (1, 3))],
)
def test_matmul_integer_per_row_zero_points(a_shape, b_shape, za_shape, zb_shape):
    # onnxruntime only accepts a per-tensor a_zero_point; ONNX also defines per-row.
    rng = np.random.default_rng(22)
    a, b = _int_rand(rng, a_shape, np.uint8), _int_rand(rng, b_shape, np.int8)
    za, zb = _int_rand(rng, za_shape, np.uint8), _int_rand(rng, zb_shape, np.int8)
    got = run_kernel("MatMulInteger", [a, b, za, zb], opset=10)
    za_b = za.astype(np.int64).reshape(-1, 1) if za.ndim == 1 else za.astype(np.int64)
    expected = (a.astype(np.int64) - za_b) @ (b.astype(np.int64) - zb.astype(np.int64))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(
    "a_shape,b_shape", [((2, 3, 5), (5, 4)), ((5,), (5, 4)), ((3, 5), (2, 5, 4)), ((2, 1, 3, 5), (3, 5, 2))]
)
def test_matmul_integer_batched(a_shape, b_shape):
    rng = np.random.default_rng(21)
    a = rng.integers(0, 255, a_shape).astype(np.uint8)
    b = rng.integers(-128, 127, b_shape).astype(np.int8)
    # the onnx reference evaluator: onnxruntime's u8 x s8 kernels without VNNI add pairs of products in
    # 16 bits that saturate (tests/kernels/reference.py), and these sums exceed them
    check("MatMulInteger", [a, b, np.array(128, np.uint8), np.array(-3, np.int8)], opset=10, engine="onnx-reference")


def test_matmul_integer_rejects_bad_inputs():
    a = np.zeros((2, 3), np.uint8)
    b = np.zeros((3, 4), np.uint8)
    with pytest.raises(ValueError, match="int8 or uint8"):
        run_kernel("MatMulInteger", [a.astype(np.int32), b], opset=10)
    with pytest.raises(ValueError, match="a_zero_point dtype"):
        run_kernel("MatMulInteger", [a, b, np.array(1, np.int8)], opset=10)
    with pytest.raises(ValueError, match="a_zero_point shape"):
        run_kernel("MatMulInteger", [a, b, np.zeros(3, np.uint8)], opset=10)
    with pytest.raises(ValueError, match="a_zero_point shape"):
        run_kernel("MatMulInteger", [a, b, np.zeros((1, 3), np.uint8)], opset=10)
    with pytest.raises(ValueError, match="b_zero_point shape"):
        run_kernel("MatMulInteger", [a, b, None, np.zeros(3, np.uint8)], opset=10)
    with pytest.raises(ValueError, match="not compatible"):
        run_kernel("MatMulInteger", [a, np.zeros((4, 4), np.uint8)], opset=10)


# --------------------------------------------------------------------------- Einsum

EINSUM_CASES = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,jk", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
    ("...ij,jk->...ik", [(2, 2, 3, 4), (4, 5)]),
    ("ij->ji", [(3, 4)]),
    ("ii->i", [(4, 4)]),
    ("ii", [(4, 4)]),
    ("ij->", [(3, 4)]),
    ("i,i->", [(5,), (5,)]),
    ("i,j->ij", [(3,), (4,)]),
    ("bhqd,bhkd->bhqk", [(1, 2, 5, 8), (1, 2, 6, 8)]),
    ("ij,jk,kl->il", [(3, 4), (4, 5), (5, 2)]),
    ("abc,cd,de->abe", [(2, 3, 4), (4, 5), (5, 6)]),
    ("i j , j k -> i k", [(3, 4), (4, 5)]),
    ("Ab,bC->AC", [(3, 4), (4, 5)]),
]


@pytest.mark.parametrize("equation,shapes", EINSUM_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_einsum(equation, shapes, dtype):
    rng = np.random.default_rng(30)
    check("Einsum", [rand(rng, s, dtype) for s in shapes], {"equation": equation}, opset=12)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_einsum_integers(dtype):
    rng = np.random.default_rng(31)
    check("Einsum", [rand(rng, (2, 3, 4), dtype), rand(rng, (2, 4, 5), dtype)], {"equation": "bij,bjk->bik"}, opset=12)


def test_einsum_reuses_cached_path():
    rng = np.random.default_rng(32)
    a, b, c = rand(rng, (3, 4)), rand(rng, (4, 5)), rand(rng, (5, 2))
    first = run_kernel("Einsum", [a, b, c], {"equation": "ij,jk,kl->il"}, opset=12)
    second = run_kernel("Einsum", [a * 2, b, c], {"equation": "ij,jk,kl->il"}, opset=12)
    np.testing.assert_allclose(second, first * 2, rtol=1e-5)
    assert first.dtype == np.float32


@pytest.mark.parametrize(
    "equation,shapes",
    [("ij,jk->ik", [(3, 4), (5, 6)]), ("ij,jk->ik", [(3, 4)]), ("", [(3, 4)]), ("ij->k", [(3, 4)])],
)
def test_einsum_rejects_bad_equations(equation, shapes):
    rng = np.random.default_rng(33)
    with pytest.raises(ValueError, match="Einsum"):
        run_kernel("Einsum", [rand(rng, s) for s in shapes], {"equation": equation}, opset=12)
