"""The native elementwise family (mrt_activation_f32, mrt_binary_rows_f32 / mrt_binary_f32, ReduceMean on
mrt_plane_means_f32) against onnxruntime: every op and broadcast form, sizes from one value to past the
threads' split (> 64K values), with the native kernels at their best ISA, at AVX2, at the baseline
one, and switched off (the numpy path: the same tests pass under MINIRT_DISABLE_NATIVE=1 too).  On the native
settings each test also checks that the kernel took its one native call (which a program can replay)."""
from __future__ import annotations

import numpy as np
import pytest

from minirt import native
from minirt.kernels import lookup
from tests.kernels.test_elementwise import assert_same, reference

RNG = np.random.default_rng(7)
SIZES = [(1,), (7,), (3, 5, 7), (1, 3, 181, 181)]  # one value, odd, small, ~98K values (threads)


@pytest.fixture(params=["best", "avx2", "baseline", "numpy"])
def mode(request, monkeypatch):
    """The kernels' path: native at the best ISA, at AVX2 (an AVX-512 machine's best is AVX-512: the
    AVX2 copies run only on the machines without it), at the baseline ISA, or numpy alone."""
    if request.param != "numpy" and not native.available:
        pytest.skip(f"native kernels not available: {native.reason}")
    calls = []
    if request.param == "numpy":
        monkeypatch.setattr(native, "available", False)
    else:
        before = native.isa
        if native.select_isa(request.param) != request.param and request.param != "best":
            native.select_isa(before)
            pytest.skip(f"{request.param} is not available on this CPU")
        real = native._call

        def spy(entry, args, *data):
            calls.append(entry.__name__)
            return real(entry, args, *data)

        monkeypatch.setattr(native, "_call", spy)
        request.addfinalizer(lambda: native.select_isa(before))
    return request.param, calls


def _kernel(op, opset, domain=""):
    entry = lookup(domain, op, opset)
    assert entry is not None
    return entry.fn


def _expect_native(mode, entry):
    name, calls = mode
    if name != "numpy":
        assert calls == [entry], f"expected one call of {entry}, got {calls}"


ACTIVATIONS = [
    ("Relu", {}, 14, (-5, 5)),
    ("LeakyRelu", {"alpha": 0.1}, 16, (-5, 5)),
    ("Sigmoid", {}, 13, (-30, 30)),
    ("Tanh", {}, 13, (-12, 12)),
    ("Tanh", {}, 13, (-0.5, 0.5)),
    ("HardSigmoid", {}, 6, (-5, 5)),
    ("HardSigmoid", {"alpha": 1 / 6, "beta": 0.5}, 6, (-5, 5)),
    ("HardSwish", {}, 14, (-5, 5)),
    ("Gelu", {}, 20, (-6, 6)),
    ("Gelu", {"approximate": "tanh"}, 20, (-6, 6)),
    ("Clip", {"min": -1.0, "max": 0.5}, 6, (-3, 3)),
]


@pytest.mark.parametrize("op,attrs,opset,bounds", ACTIVATIONS, ids=lambda v: str(v))
@pytest.mark.parametrize("shape", SIZES, ids=str)
@pytest.mark.parametrize("with_out", [False, True])
def test_activation(mode, op, attrs, opset, bounds, shape, with_out):
    x = RNG.uniform(*bounds, size=shape).astype(np.float32)
    (want,) = reference(op, [x], attrs, opset=opset)
    fn = _kernel(op, opset)
    out = np.full(shape, np.nan, np.float32) if with_out else None
    got = fn(x, **attrs, **({"out": out} if with_out else {}))
    assert_same(got, want, rtol=2e-6, atol=2e-7 if op != "Gelu" else 1e-6)
    if with_out and mode[0] != "numpy":
        assert got is out
    _expect_native(mode, "mrt_activation_f32")


def test_clip_11_bounds_as_inputs(mode):
    x = RNG.uniform(-3, 3, size=(2, 8, 9, 9)).astype(np.float32)
    for lo, hi in ((np.float32(-1), np.float32(2)), (None, np.float32(0.5)), (np.float32(0), None),
                   (np.float32(1), np.float32(-1))):  # (lo > hi: hi everywhere, as ONNX says)
        want = reference("Clip", [x, lo, hi], opset=13)[0]
        assert_same(_kernel("Clip", 13)(x, lo, hi), want)


def test_activations_keep_nan_and_saturate(mode):
    x = np.array([np.nan, -np.inf, np.inf, -1000, -88, -20, -0.0, 0.0, 20, 88, 1000], np.float32)
    for op, attrs, opset in (("Relu", {}, 14), ("Sigmoid", {}, 13), ("Tanh", {}, 13), ("LeakyRelu", {"alpha": 0.5}, 16),
                             ("Clip", {"min": -1.0, "max": 1.0}, 6)):
        (want,) = reference(op, [x], attrs, opset=opset)
        got = _kernel(op, opset)(x, **attrs)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=op)
        assert_same(got, want)


def test_activation_in_place(mode):
    x = RNG.uniform(-5, 5, size=(4, 9000)).astype(np.float32)
    (want,) = reference("Sigmoid", [x], opset=13)
    got = _kernel("Sigmoid", 13)(x, out=x)
    assert_same(got, want, rtol=2e-6, atol=2e-7)


@pytest.mark.parametrize("name,params", [("Relu", ()), ("Sigmoid", ()), ("Tanh", ()), ("SiLU", ()), ("HardSwish", ()),
                                         ("HardSigmoid", (0.2, 0.5)), ("Clip", (0.0, 6.0)),
                                         ("LeakyRelu", (0.01,)), ("Gelu", ())])
@pytest.mark.parametrize("shape", [(7,), (1, 3, 181, 181)], ids=str)
def test_fused_activation_op(mode, name, params, shape):
    """com.minirt::Activation: the same function as the standard kernels compose (SiLU = x * sigmoid(x))."""
    from minirt.kernels import fused

    x = RNG.uniform(-6, 6, size=shape).astype(np.float32)
    got = _kernel("Activation", 1, fused.DOMAIN)(x, activation=name, activation_params=params)
    if name == "SiLU":
        want = x * reference("Sigmoid", [x], opset=13)[0]
    else:
        std = {"Relu": ("Relu", {}), "Sigmoid": ("Sigmoid", {}), "Tanh": ("Tanh", {}), "HardSwish": ("HardSwish", {}),
               "HardSigmoid": ("HardSigmoid", {"alpha": 0.2, "beta": 0.5}), "Clip": ("Clip", {"min": 0.0, "max": 6.0}),
               "LeakyRelu": ("LeakyRelu", {"alpha": 0.01}), "Gelu": ("Gelu", {})}[name]
        want = reference(std[0], [x], std[1], opset=20 if name == "Gelu" else 14 if name == "HardSwish" else 13
                         if name in ("Sigmoid", "Tanh") else 6 if name in ("HardSigmoid", "Clip") else 16)[0]
    assert_same(got, want, rtol=2e-6, atol=1e-6)
    _expect_native(mode, "mrt_activation_f32")


# (full shape, broadcast operand's shape, the native entry point taking it)
BROADCASTS = [
    ((3, 5, 7), (3, 5, 7), "mrt_binary_f32"),  # same shape
    ((1, 96, 17, 19), (), "mrt_binary_rows_f32"),  # scalar
    ((1, 96, 17, 19), (1,), "mrt_binary_rows_f32"),
    ((1, 96, 17, 19), (1, 96, 1, 1), "mrt_binary_rows_f32"),  # per channel (the squeeze-excite gate)
    ((2, 96, 17, 19), (1, 96, 1, 1), "mrt_binary_rows_f32"),
    ((2, 96, 17, 19), (96, 1, 1), "mrt_binary_rows_f32"),
    ((2, 96, 17, 19), (2, 96, 1, 1), "mrt_binary_rows_f32"),  # per image and channel
    ((2, 5, 7, 3), (2, 5, 1, 1), "mrt_binary_rows_f32"),
    ((2, 5, 7, 3), (5, 7, 1), "mrt_binary_rows_f32"),
    ((2, 5, 7, 3), (3,), "mrt_binary_rows_f32"),  # trailing axis (a bias)
    ((2, 5, 7, 3), (7, 3), "mrt_binary_rows_f32"),
    ((1, 3, 181, 181), (1, 3, 1, 1), "mrt_binary_rows_f32"),  # > 64K values: threads
    ((1, 3, 181, 181), (), "mrt_binary_rows_f32"),
    ((1, 3, 181, 181), (181,), "mrt_binary_rows_f32"),
]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("full,small,entry", BROADCASTS, ids=lambda v: str(v))
@pytest.mark.parametrize("mirror", [False, True], ids=["full_left", "full_right"])
@pytest.mark.parametrize("with_out", [False, True])
def test_binary_broadcast(mode, op, full, small, entry, mirror, with_out):
    a = RNG.uniform(-3, 3, size=full).astype(np.float32)
    b = np.asarray(RNG.uniform(0.5, 3, size=small) * RNG.choice([-1, 1]), np.float32)  # (0-d stays an array)
    if op == "Div" and not mirror:
        b = np.where(np.abs(b) < 0.25, np.float32(1), b).astype(np.float32)
    if op == "Div" and mirror:
        a = np.where(np.abs(a) < 0.25, np.float32(1), a).astype(np.float32)
    lhs, rhs = (b, a) if mirror else (a, b)
    (want,) = reference(op, [lhs, rhs], opset=14)
    out = np.full(full, np.nan, np.float32) if with_out else None
    got = _kernel(op, 14)(lhs, rhs, **({"out": out} if with_out else {}))
    np.testing.assert_array_equal(got, want)  # the same IEEE operation per value: identical
    assert got.dtype == np.float32 and got.shape == want.shape
    _expect_native(mode, entry)


@pytest.mark.parametrize("a_shape,b_shape", [((2, 5, 7), (5, 1)), ((2, 1, 7), (3, 1)), ((4, 1), (1, 6))])
def test_binary_other_broadcasts_stay_with_numpy(mode, a_shape, b_shape):
    """Shapes that are not one of the row forms (both operands broadcast, or a middle run not ending at
    the last axis nor followed by 1s alone): the general broadcast kernel (mrt_broadcast) or numpy,
    with the same result as onnxruntime."""
    a = RNG.uniform(-3, 3, size=a_shape).astype(np.float32)
    b = RNG.uniform(-3, 3, size=b_shape).astype(np.float32)
    for op in ("Add", "Sub", "Mul", "Div"):
        np.testing.assert_array_equal(_kernel(op, 14)(a, b), reference(op, [a, b], opset=14)[0])


def test_binary_in_place_on_the_full_operand(mode):
    a = RNG.uniform(-3, 3, size=(1, 16, 20, 20)).astype(np.float32)
    g = RNG.uniform(0, 1, size=(1, 16, 1, 1)).astype(np.float32)
    (want,) = reference("Mul", [a, g], opset=14)
    got = _kernel("Mul", 14)(a, g, out=a)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape,axes", [((2, 96, 17, 19), (2, 3)), ((1, 3, 181, 181), (2, 3)),
                                        ((2, 5, 7, 3), (-1,)), ((2, 5, 7, 3), (1, 2, 3)),
                                        ((1, 1, 1, 1), (2, 3)), ((3, 4), None), ((2, 5, 7), (2, 1))])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("opset", [13, 18])
def test_reduce_mean_trailing_axes(mode, shape, axes, keepdims, opset):
    x = RNG.uniform(-3, 3, size=shape).astype(np.float32)
    fn = _kernel("ReduceMean", opset)
    if opset >= 18:
        ax = None if axes is None else np.array(axes, np.int64)
        want = reference("ReduceMean", [x, ax], {"keepdims": keepdims}, opset=opset, constant_inputs=(1,))[0] \
            if ax is not None else reference("ReduceMean", [x], {"keepdims": keepdims}, opset=opset)[0]
        got = fn(x, ax, keepdims=keepdims)
    else:
        attrs = {"keepdims": keepdims, **({} if axes is None else {"axes": list(axes)})}
        want = reference("ReduceMean", [x], attrs, opset=opset)[0]
        got = fn(x, axes=axes, keepdims=keepdims)
    assert_same(got, want, rtol=1e-5, atol=1e-6)
    _expect_native(mode, "mrt_plane_means_f32")


def test_reduce_mean_other_axes(mode):
    """A middle block of axes is one mrt_reduce_f32; axes that are not one block stay with numpy."""
    x = RNG.uniform(-3, 3, size=(2, 5, 7, 3)).astype(np.float32)
    fn = _kernel("ReduceMean", 13)
    for axes in ((1,), (1, 2), (0, 2), (1, 3)):
        want = reference("ReduceMean", [x], {"axes": list(axes)}, opset=13)[0]
        assert_same(fn(x, axes=axes), want, rtol=1e-5, atol=1e-6)
    if mode[0] != "numpy":
        assert mode[1] == ["mrt_reduce_f32", "mrt_reduce_f32"]


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceSumSquare"])
@pytest.mark.parametrize("outer,n,inner", [(512, 508, 1), (3, 15, 1), (2, 16, 1), (4, 37, 1), (1, 1, 1),
                                           (3, 7, 5), (2, 40, 17), (2, 9, 70)])
def test_native_reduce_matches_numpy(op, outer, n, inner):
    """mrt_reduce_f32 over the middle axis, the contiguous one (inner 1: interleaved lanes + a tail) and
    strided ones (vectors of 4 + single lanes), against numpy in double; Max/Min exact, NaN propagating."""
    if not native.available:
        pytest.skip(native.reason)
    x = RNG.standard_normal((outer, n, inner)).astype(np.float32)
    if op in ("ReduceMax", "ReduceMin") and x.size > 3:
        x.ravel()[x.size // 3] = np.nan  # one run (outer, inner position) holds a NaN
    y = np.empty(outer * inner, np.float32)
    native.reduce(op, x, y, outer, n, inner)
    x64 = x.astype(np.float64)
    want = {"ReduceSum": x64.sum(1), "ReduceMean": x64.mean(1), "ReduceMax": x.max(1), "ReduceMin": x.min(1),
            "ReduceSumSquare": (x64 * x64).sum(1)}[op].ravel()
    if op in ("ReduceMax", "ReduceMin"):
        np.testing.assert_array_equal(y, want)  # (NaN where numpy has NaN)
    else:
        np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("outer,n,inner", [(1, 1, 1), (1, 512, 1), (3, 7, 5), (2, 9, 70)])
def test_native_integer_reduce_matches_numpy(dtype, op, outer, n, inner):
    """mrt_reduce_int against numpy in the same dtype: exact, and sums wrap around as numpy's do (a decoder's
    attention mask summed into its sequence length is the case that needs it natively, D123)."""
    if not native.available:
        pytest.skip(native.reason)
    info = np.iinfo(dtype)
    x = RNG.integers(-1000, 1000, size=(outer, n, inner)).astype(dtype)
    x.ravel()[0] = info.max  # (a sum past the type's range wraps; max / min see the extreme)
    x.ravel()[-1] = info.min + 1
    y = np.empty(outer * inner, dtype)
    native.reduce_int(op, x, y, outer, n, inner)
    want = x.sum(axis=1, dtype=dtype) if op == "ReduceSum" else x.max(axis=1) if op == "ReduceMax" else x.min(axis=1)
    np.testing.assert_array_equal(y, want.ravel())


def test_integer_reduce_sum_kernel_is_one_native_call(mode):
    """ReduceSum of an int64 mask over its last axis (genai's seqlens_k) is one mrt_reduce_int call."""
    mask = np.zeros((1, 64), np.int64)
    mask[0, :23] = 1
    fn = _kernel("ReduceSum", 13)
    got = fn(mask, np.array([1], np.int64), keepdims=1)
    assert_same(got, reference("ReduceSum", [mask, np.array([1], np.int64)], {"keepdims": 1}, opset=13)[0])
    if mode[0] != "numpy":
        assert mode[1] == ["mrt_reduce_int"]


def test_native_binary_refuses_sizes_that_do_not_match():
    if not native.available:
        pytest.skip(native.reason)
    a = np.zeros((4, 6), np.float32)
    with pytest.raises(ValueError, match="rows"):
        native.binary_rows(native.BINARY_OPS["Mul"], a, np.ones(4, np.float32), a, 4, 5, 4)
    with pytest.raises(ValueError, match="does not broadcast"):
        native.binary_rows(native.BINARY_OPS["Mul"], a, np.ones(3, np.float32), a, 4, 6, 3)
    with pytest.raises(ValueError, match="values"):
        native.activation(native.ACTIVATION_CODES["Relu"], 0.0, 0.0, a, np.zeros(5, np.float32))


def test_binary_out_overlapping_an_input_at_an_offset(mode):
    """An ``out`` that overlaps an input without being it (numpy buffers such an overlap): still
    numpy's result (the native loops take only an exact in-place buffer)."""
    base = RNG.uniform(-3, 3, size=2 * 4096 + 8).astype(np.float32)
    a = base[:8192].reshape(2, 4096)
    b = RNG.uniform(-3, 3, size=(2, 4096)).astype(np.float32)
    want = a * b
    out = base[8:].reshape(2, 4096)
    got = _kernel("Mul", 14)(a, b, out=out)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("a_shape,b_shape", [((1, 1, 1), (8,)), ((8,), (1, 1, 1)), ((1,), (2, 1, 3)),
                                             ((1, 1), (5,)), ((2, 1, 4), (4,))])
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_binary_result_has_the_broadcast_shape(op, a_shape, b_shape):
    # a one-element operand of higher rank than the other adds leading dimensions: (1, 1, 1) * (8,) is
    # (1, 1, 8), not (8,) (it broke the rotary embedding of torch-exported decoders on decode steps)
    from minirt.kernels.registry import lookup

    rng = np.random.default_rng(len(a_shape) * 10 + len(b_shape))
    a = rng.standard_normal(a_shape).astype(np.float32) + 3
    b = rng.standard_normal(b_shape).astype(np.float32) + 3
    y = lookup("", op, 17).fn(a, b)
    expected = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}[op](a, b)
    assert y.shape == expected.shape
    np.testing.assert_allclose(y, expected, rtol=1e-6)
