"""Data movement through the native index copy, gather and cast (minirt/kernels/_native_copies.py,
minirt/native/index_copy.h), against numpy written independently; and the ops built on them replayed
in native programs, against onnxruntime."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

import minirt
from minirt import native
from minirt.builder.build import build
from minirt.kernels import _native_copies as C

from tests.native.conftest import requires_native

pytestmark = requires_native

DTYPES = [np.float32, np.int64, np.uint8, np.float16, np.bool_, np.int32]


def _array(rng, shape, dtype):
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(0, 100, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


@pytest.fixture(autouse=True)
def every_size_native(monkeypatch):
    """The copies and broadcasts themselves are under test: every size takes the native path (outside a
    recording, results below _NATIVE_MIN_BYTES would take numpy; test_small_copies_take_numpy_outside_a_
    recording)."""
    from minirt.kernels import _native_broadcast

    monkeypatch.setattr(C, "_NATIVE_MIN_BYTES", 0)
    monkeypatch.setattr(_native_broadcast, "_NATIVE_MIN_BYTES", 0)


def test_small_copies_take_numpy_outside_a_recording(monkeypatch):
    from minirt.kernels._native_broadcast import broadcast_op

    monkeypatch.undo()  # (the real thresholds)
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    idx = np.array([3, 1], np.int64)
    assert C.copy_of_view(x.T, x) is None and C.gather_copy(x, idx, 0) is None
    assert C.tile_copy(x, (2, 1)) is None and C.pad_copy(x, [(1, 1), (0, 0)], "constant", 0.0) is None
    assert broadcast_op("Greater", x, x[:1]) is None
    monkeypatch.setattr(native, "recording", lambda: True)  # (what a session's recording run sees)
    np.testing.assert_array_equal(C.copy_of_view(x.T, x), x.T)
    np.testing.assert_array_equal(C.gather_copy(x, idx, 0), x[idx])
    np.testing.assert_array_equal(broadcast_op("Greater", x, x[:1]), x > x[:1])
    monkeypatch.setattr(native, "recording", lambda: False)
    big = np.zeros((C._NATIVE_MIN_BYTES // 4 // 64, 64), np.float32)
    assert C.copy_of_view(big.T, big) is not None  # (large copies: the native one, threaded)


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    old = native.threads()
    native.set_threads(request.param)
    yield request.param
    native.set_threads(old)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(12))
def test_copies_of_random_views_are_the_views(dtype, seed, threads):
    rng = np.random.default_rng(seed)
    rank = rng.integers(1, 7)
    # big enough, now and then, that two threads split the rows
    shape = tuple(int(v) for v in rng.integers(1, 7 if seed % 3 else 40, rank))
    x = _array(rng, shape, dtype)
    views = [x.transpose(rng.permutation(rank))]
    index = tuple(slice(int(rng.integers(0, n)), None, int(rng.choice([1, 2, 3]))) if rng.random() < 0.7
                  else slice(None, None, -int(rng.choice([1, 2]))) for n in shape)
    views.append(x[index])
    views.append(np.broadcast_to(x[..., :1], shape[:-1] + (5,)))
    views.append(np.broadcast_to(x, (3,) + shape))
    for v in views:
        y = C.copy_of_view(v, x)
        assert y is not None and y.flags.c_contiguous and y.dtype == x.dtype
        np.testing.assert_array_equal(y, v)


TRANSPOSES = [  # (shape, perm): the last output axis strides through x, the one before steps by one element
    ((512, 256), (1, 0)),                   # magika's (its 4-D perm merges to this)
    ((1, 2048, 256), (0, 2, 1)),            # a power-of-two stride of 1 KB
    ((3, 37, 53), (0, 2, 1)),               # partial tiles, several matrices
    ((1, 20, 19, 24), (0, 3, 1, 2)),        # NHWC -> NCHW (H, W merged into one axis)
    ((2, 24, 17, 18), (0, 2, 3, 1)),        # NCHW -> NHWC
    ((5, 16, 16), (0, 2, 1)),               # exactly one tile per matrix
    ((4, 3, 40, 33), (1, 0, 3, 2)),         # outer axes permuted too
]


@pytest.mark.parametrize("shape,perm", TRANSPOSES, ids=[f"{s}{p}" for s, p in TRANSPOSES])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16, np.uint8])
@pytest.mark.parametrize("nthreads", [1, 2, 3])
def test_transposing_copies_in_tiles_are_the_views(shape, perm, dtype, nthreads):
    """The tiled path of mrt_index_copy (a last axis striding through x, the one before it stepping by one
    element; index_copy_impl.h, index_transpose_task): every element size, bands of rows split between 1-3
    threads at any row (17, 19, 37, 40 rows: partial bands and tiles)."""
    rng = np.random.default_rng(sum(shape))
    x = _array(rng, shape, dtype)
    old = native.threads()
    native.set_threads(nthreads)
    try:
        y = C.copy_of_view(x.transpose(perm), x)
    finally:
        native.set_threads(old)
    assert y is not None and y.flags.c_contiguous
    np.testing.assert_array_equal(y, x.transpose(perm))


def test_more_axes_than_the_kernel_takes_are_refused_not_wrong():
    x = np.arange(2 ** 10, dtype=np.float32).reshape((2,) * 10)
    v = x.transpose(9, 0, 8, 1, 7, 2, 6, 3, 5, 4)  # (no two neighbours merge: 10 axes)
    assert C.copy_of_view(v, x) is None
    assert C.copy_of_view(x.transpose(1, 0, 2, 3, 4, 5, 6, 7, 8, 9), x) is not None  # (merged to 3 axes)


def _numpy_pad(x, width, mode, value):
    """np.pad after cropping the negative pads: the ONNX semantics, written independently."""
    crop = tuple(slice(max(-b, 0), n - max(-e, 0)) for n, (b, e) in zip(x.shape, width))
    grow = [(max(b, 0), max(e, 0)) for b, e in width]
    if mode == "constant":
        return np.pad(x[crop], grow, mode="constant", constant_values=value)
    return np.pad(x[crop], grow, mode=mode)


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "wrap"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8])
@pytest.mark.parametrize("seed", range(8))
def test_pads_are_numpys(mode, dtype, seed, threads):
    rng = np.random.default_rng(100 + seed)
    rank = int(rng.integers(1, 5))
    shape = tuple(int(v) for v in rng.integers(3, 9, rank))
    x = _array(rng, shape, dtype)
    width = [(int(rng.integers(-1, 3)), int(rng.integers(-1, 3))) for _ in shape]
    value = 7 if dtype != np.float32 else -1.5
    y = C.pad_copy(x, width, mode, value)
    np.testing.assert_array_equal(y, _numpy_pad(x, width, mode, np.asarray(value, dtype)))


@pytest.mark.parametrize("seed", range(6))
def test_tiles_are_numpys(seed, threads):
    rng = np.random.default_rng(200 + seed)
    x = _array(rng, tuple(int(v) for v in rng.integers(1, 5, int(rng.integers(1, 5)))), np.float32)
    reps = [int(v) for v in rng.integers(1, 4, x.ndim)]
    np.testing.assert_array_equal(C.tile_copy(x, reps), np.tile(x, reps))


@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16])
def test_gathers_are_numpys_take(axis, dtype, threads):
    rng = np.random.default_rng(axis)
    x = _array(rng, (7, 6, 5), dtype)
    idx = rng.integers(-x.shape[axis], x.shape[axis], (3, 4)).astype(np.int64)
    np.testing.assert_array_equal(C.gather_copy(x, idx, axis), np.take(x, idx, axis=axis))
    # a scalar index drops the axis
    np.testing.assert_array_equal(C.gather_copy(x, np.array(-1, np.int64), axis), np.take(x, -1, axis=axis))
    # out of range: nothing written, the caller's numpy path reports it
    assert C.gather_copy(x, np.array([0, x.shape[axis]], np.int64), axis) is None


CAST_TYPES = ["float32", "float64", "int32", "int64", "uint8", "int8", "bool"]


@pytest.mark.parametrize("to", CAST_TYPES)
@pytest.mark.parametrize("src", CAST_TYPES)
def test_casts_are_numpys_astype(src, to, threads):
    rng = np.random.default_rng(5)
    if src.startswith("float"):
        x = (rng.standard_normal(20000) * 1000).astype(src)
        if to in ("uint8", "int8"):  # (past the target's range numpy's result is the platform's)
            x = np.clip(x, 0 if to == "uint8" else -100, 100).astype(src)
        x[:4] = [0.0, -0.0, 2.5, -2.5]
    elif src == "bool":
        x = rng.integers(0, 2, 20000).astype(bool)
    else:
        info = np.iinfo(src)
        x = rng.integers(info.min, info.max, 20000, endpoint=True).astype(src)
        if src == "int64":
            x[:3] = [2 ** 60 + 2 ** 36 + 1, -(2 ** 62) - 12345, 2 ** 53 + 1]  # (rounded once to float32)
    y = np.empty(x.shape, dtype=to)
    native.cast(x, y)
    np.testing.assert_array_equal(y, x.astype(to))


# --------------------------------------------------------------------------- in native programs


def _model():
    """Transpose, reflect Pad, strided Slice, Split across rows, Gather of input indices, Cast,
    Softmax, LayerNormalization, AveragePool, Expand, Tile, a batched MatMul of two computed operands:
    each one native call."""
    rng = np.random.default_rng(0)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    inits = [numpy_helper.from_array(f(50, 8), "emb"), numpy_helper.from_array(f(8), "ln_s"),
             numpy_helper.from_array(f(8), "ln_b"),
             numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"),
             numpy_helper.from_array(np.array([0, 1], np.int64), "st"),
             numpy_helper.from_array(np.array([100, 100], np.int64), "en"),
             numpy_helper.from_array(np.array([2, 3], np.int64), "ax"),
             numpy_helper.from_array(np.array([2, 2], np.int64), "sp"),
             numpy_helper.from_array(np.array([2, 3, 6, 8], np.int64), "shape"),
             numpy_helper.from_array(np.array([1, 1, 1, 2], np.int64), "reps")]
    nodes = [
        h.make_node("Transpose", ["x"], ["t"], perm=[0, 1, 3, 2]),                 # (2, 3, 8, 6)
        h.make_node("Pad", ["t", "pads"], ["p"], mode="reflect"),                  # (2, 3, 10, 8)
        h.make_node("Slice", ["p", "st", "en", "ax", "sp"], ["s"]),                # (2, 3, 5, 4)
        h.make_node("Split", ["s"], ["s0", "s1"], axis=3, num_outputs=2),          # (2, 3, 5, 2) twice
        h.make_node("Concat", ["s1", "s0"], ["c"], axis=3),                        # (2, 3, 5, 4)
        h.make_node("AveragePool", ["c"], ["a"], kernel_shape=[2, 2]),             # (2, 3, 4, 3)
        h.make_node("Softmax", ["a"], ["sm"], axis=-1),
        h.make_node("Gather", ["emb", "ids"], ["g"], axis=0),                      # (2, 6, 8)
        h.make_node("LayerNormalization", ["g", "ln_s", "ln_b"], ["ln"], axis=-1),
        h.make_node("Unsqueeze", ["ln", "one"], ["lu"]),                           # (2, 1, 6, 8)
        h.make_node("Expand", ["lu", "shape"], ["e"]),                             # (2, 3, 6, 8)
        h.make_node("Tile", ["sm", "reps"], ["ti"]),                               # (2, 3, 4, 6)
        h.make_node("MatMul", ["ti", "e"], ["mm"]),                                # (2, 3, 4, 8)
        h.make_node("Cast", ["ids"], ["ids32"], to=TP.INT32),
        h.make_node("Cast", ["ids32"], ["idsf"], to=TP.FLOAT),
    ]
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "one"))
    graph = h.make_graph(nodes, "copies", [h.make_tensor_value_info("x", TP.FLOAT, [2, 3, 6, 8]),
                                           h.make_tensor_value_info("ids", TP.INT64, [2, 6])],
                         [h.make_tensor_value_info("mm", TP.FLOAT, [2, 3, 4, 8]),
                          h.make_tensor_value_info("idsf", TP.FLOAT, [2, 6])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("threads", [1, 2])
def test_data_movement_ops_replay_as_one_program(threads):
    ort = pytest.importorskip("onnxruntime")
    model = _model()
    sess = minirt.Session(build(model, None).data, threads=threads)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for _ in range(4):
        feed = {"x": rng.standard_normal((2, 3, 6, 8)).astype(np.float32),
                "ids": rng.integers(-50, 50, (2, 6)).astype(np.int64)}
        for got, want in zip(sess.run(None, feed), ref.run(None, feed)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    (plan,) = sess.memory_plans()
    assert plan["native_program"].endswith("native calls"), plan["native_program"]


def test_a_replayed_gather_with_a_bad_index_names_the_node():
    model = _model()
    sess = minirt.Session(build(model, None).data, threads=1)
    feed = {"x": np.zeros((2, 3, 6, 8), np.float32), "ids": np.zeros((2, 6), np.int64)}
    for _ in range(3):
        sess.run(None, feed)
    assert sess.memory_plans()[0]["native_program"].endswith("native calls")
    bad = dict(feed, ids=np.full((2, 6), 50, np.int64))
    with pytest.raises(minirt.KernelError if hasattr(minirt, "KernelError") else Exception, match="Gather"):
        sess.run(None, bad)
    np.testing.assert_array_equal(sess.run(None, feed)[1], np.zeros((2, 6), np.float32))  # (and runs on)


# --------------------------------------------------------------------------- broadcast elementwise

from minirt.kernels._native_broadcast import broadcast_op  # noqa: E402

_NUMPY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide, "Equal": np.equal,
          "Less": np.less, "LessOrEqual": np.less_equal, "Greater": np.greater,
          "GreaterOrEqual": np.greater_equal, "And": np.logical_and, "Or": np.logical_or,
          "Xor": np.logical_xor, "Max": np.maximum, "Min": np.minimum}


def _broadcast_shapes(rng):
    out = tuple(int(v) for v in rng.integers(1, 6, int(rng.integers(1, 6))))
    a = tuple(n if rng.random() < 0.6 else 1 for n in out)[int(rng.integers(0, len(out))):]
    b = tuple(n if rng.random() < 0.6 else 1 for n in out)
    return a, b


@pytest.mark.parametrize("op", list(_NUMPY))
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.uint8, np.bool_])
@pytest.mark.parametrize("seed", range(5))
def test_broadcast_ops_are_numpys(op, dtype, seed, threads):
    rng = np.random.default_rng(300 + seed)
    sa, sb = _broadcast_shapes(rng)
    a, b = _array(rng, sa, dtype), _array(rng, sb, dtype)
    if np.dtype(dtype).kind in "iu" and op in ("Add", "Sub", "Mul") and seed == 0:
        a = np.full(sa, np.iinfo(dtype).max, dtype)  # (wrap-around, as numpy)
    if np.dtype(dtype).kind == "f" and seed == 1:
        a = a.copy()
        a.reshape(-1)[0] = np.nan  # (NaN compares unequal, as numpy)
    got = broadcast_op(op, a, b)
    logical, arithmetic = op in ("And", "Or", "Xor"), op in ("Add", "Sub", "Mul", "Div", "Max", "Min")
    if (logical and dtype != np.bool_) or (op == "Div" and np.dtype(dtype).kind != "f") or (
            arithmetic and dtype == np.bool_):
        assert got is None  # (numpy's path: its own rules or errors)
        return
    with np.errstate(all="ignore"):
        want = _NUMPY[op](a, b)
    np.testing.assert_array_equal(got, want)
    assert got.dtype == want.dtype


@pytest.mark.parametrize("seed", range(6))
def test_broadcast_where_and_not_are_numpys(seed, threads):
    rng = np.random.default_rng(400 + seed)
    sc, sx = _broadcast_shapes(rng)
    cond = rng.integers(0, 2, sc).astype(bool)
    x, y = _array(rng, sx, np.float32), _array(rng, (1,) * len(sx), np.float32)
    np.testing.assert_array_equal(broadcast_op("Where", cond, x, y), np.where(cond, x, y))
    np.testing.assert_array_equal(broadcast_op("Not", cond), np.logical_not(cond))


@pytest.mark.parametrize("op, fn, exact", [("Sqrt", np.sqrt, True), ("Reciprocal", np.reciprocal, True),
                                           ("Neg", np.negative, True), ("Abs", np.abs, True),
                                           ("Floor", np.floor, True), ("Ceil", np.ceil, True),
                                           ("Exp", np.exp, False), ("Log", np.log, False)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_broadcast_unary_functions_are_numpys(op, fn, exact, dtype, threads):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((3, 700)) * 4).astype(dtype)
    x[0, :4] = [0.0, -0.0, np.inf, np.nan]
    if op in ("Sqrt", "Log"):
        x[1, :3] = [-1.0, 1e-30, 0.5]  # (NaN for negatives, -inf at 0, as numpy)
    with np.errstate(all="ignore"):
        want = fn(x)
    got = broadcast_op(op, x)
    if exact:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=4 * np.finfo(dtype).eps, atol=0)
    assert broadcast_op(op, np.arange(6, dtype=np.int64)) is None  # (float types only)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("seed", range(4))
def test_broadcast_pow_is_numpys(dtype, seed, threads):
    """Pow (float types, any broadcast) is the C library's pow, numpy's float power: squares exact,
    other exponents within an ulp or two; NaN / inf / 0 ** negative as numpy; ints refused."""
    rng = np.random.default_rng(500 + seed)
    sa, sb = _broadcast_shapes(rng)
    a = (rng.standard_normal(sa) * 3).astype(dtype)
    b = np.full(sb, 2.0, dtype) if seed == 0 else rng.uniform(-3, 3, sb).astype(dtype)
    if seed == 2:
        a = np.abs(a)  # (positive bases: real powers)
    if seed == 3 and a.size >= 4:
        a.reshape(-1)[:4] = [0.0, np.nan, np.inf, -np.inf]
    with np.errstate(all="ignore"):
        want = np.power(a, b)
    got = broadcast_op("Pow", a, b)
    if seed == 0:
        # x ** 2 is the correctly rounded x * x, as the C library gives it; numpy's own array power is
        # not always (with AVX-512 it takes a vector pow of up to an ulp or so off: 1 ulp seen on Zen 5)
        np.testing.assert_array_equal(got, np.broadcast_to(a * a, want.shape))
    else:
        np.testing.assert_allclose(got, want, rtol=4 * np.finfo(dtype).eps, atol=0)
    assert got.dtype == want.dtype
    assert broadcast_op("Pow", np.arange(6, dtype=np.int64), np.int64(2) + np.zeros(6, np.int64)) is None


def test_pow_and_a_branch_concat_replay_as_one_program():
    """Pow and a Concat whose result is an If branch's output (no planned buffer) are native calls:
    each branch replays as a native program (Silero VAD's pattern: an STFT power in a body whose last
    node concatenates the state)."""
    ort = pytest.importorskip("onnxruntime")
    branch_out = h.make_tensor_value_info("cat", TP.FLOAT, [2, 1, 4])

    def body(name, order):
        return h.make_graph([h.make_node("Pow", ["x", "two"], ["p_" + name]),
                             h.make_node("Neg", ["x"], ["q_" + name]),
                             h.make_node("Concat", [o + "_" + name for o in order], ["cat"], axis=0)],
                            name, [], [branch_out])

    nodes = [h.make_node("If", ["flag"], ["y"], then_branch=body("then", "pq"), else_branch=body("else", "qp"))]
    graph = h.make_graph(nodes, "powcat", [h.make_tensor_value_info("x", TP.FLOAT, [1, 1, 4]),
                                           h.make_tensor_value_info("flag", TP.BOOL, [])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [2, 1, 4])],
                         [numpy_helper.from_array(np.array(2.0, np.float32), "two")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    sess = minirt.Session(build(model, None).data, threads=1)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    for flag in (True, True, False, False, True, False):  # (each body records on its second run, then replays)
        feed = {"x": rng.standard_normal((1, 1, 4)).astype(np.float32), "flag": np.array(flag)}
        np.testing.assert_array_equal(sess.run(None, feed)[0], ref.run(None, feed)[0])
    assert sess.subgraph_programs() == {"then": ["4 native calls"], "else": ["4 native calls"]}  # (Concat: a copy per input)


def test_a_slice_by_computed_starts_is_never_replayed_with_stale_starts():
    """Starts given at run time: the copy's map holds this run's starts, so the node must not be
    replayed; each run slices where its own starts say (against numpy)."""
    nodes = [h.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["s"]), h.make_node("Relu", ["s"], ["y"])]
    inits = [numpy_helper.from_array(np.array([100], np.int64), "en"),
             numpy_helper.from_array(np.array([1], np.int64), "ax"),
             numpy_helper.from_array(np.array([2], np.int64), "sp")]
    graph = h.make_graph(nodes, "s", [h.make_tensor_value_info("x", TP.FLOAT, [3, 8]),
                                      h.make_tensor_value_info("st", TP.INT64, [1])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [3, None])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    sess = minirt.Session(build(model, None).data, threads=1)
    x = np.arange(24, dtype=np.float32).reshape(3, 8) - 5
    for start in (0, 0, 0, 1, 1, 0, 1):
        (y,) = sess.run(None, {"x": x, "st": np.array([start], np.int64)})
        np.testing.assert_array_equal(y, np.maximum(x[:, start::2], 0))
