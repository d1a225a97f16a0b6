"""Per-channel weight quantization, activation parameters and fp16 storage."""
import numpy as np
import pytest

from minirt.builder.quantize import _run
from minirt.builder.quantize.weights import activation_params, convert_to_fp16, quantize_per_channel


def test_per_channel_scales_match_an_independent_numpy_computation():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    w[3] *= 10
    w[5] = 0
    q, s = quantize_per_channel(w, 0)
    for c in range(8):
        amax = np.abs(w[c]).max()
        expected = amax / 127 if amax > 0 else 1.0
        assert np.isclose(s[c], expected, rtol=1e-6)
        assert np.array_equal(q[c], np.clip(np.round(w[c] / np.float32(expected)), -127, 127).astype(np.int8))
    assert q.dtype == np.int8 and q.min() >= -127
    assert np.abs(q.astype(np.float32) * s[:, None, None, None] - w).max() <= s.max() / 2 + 1e-6


def test_per_channel_along_axis_1_and_reduce_range():
    w = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
    q, s = quantize_per_channel(w, 1, reduce_range=True)
    assert s.shape == (4,) and np.allclose(s, np.abs(w).max(axis=0) / 63)
    assert np.abs(q).max() <= 63


def test_activation_params_include_zero():
    scale, zp = activation_params(0.5, 2.0)
    assert zp.dtype == np.uint8 and zp == 0 and np.isclose(scale, 2.0 / 255)
    scale, zp = activation_params(-1.0, 3.0)
    assert np.isclose(scale, 4.0 / 255) and zp == round(1.0 / (4.0 / 255))
    scale, zp = activation_params(-1.0, 3.0, symmetric=True)
    assert zp.dtype == np.int8 and zp == 0 and np.isclose(scale, 3.0 / 127)


def test_fp16_halves_the_weights_and_casts_back(digits):
    before = len(_run.artifact_bytes(digits))
    ref = digits.clone()
    stats = convert_to_fp16(digits)
    assert stats["initializers"] >= 1
    after = len(_run.artifact_bytes(digits))
    assert after <= 0.55 * before
    x = np.random.default_rng(0).random((4, 1, 8, 8), dtype=np.float32)
    y0 = _run.session(ref).run(None, {"image": x})[0]
    y1 = _run.session(digits).run(None, {"image": x})[0]
    assert y1.dtype == np.float32 and np.abs(y0 - y1).max() < 1e-2


def test_small_weights_are_stored_scaled_by_a_power_of_two():
    from minirt.builder.quantize.weights import _fp16_exponent

    w = np.random.default_rng(1).uniform(-5e-5, 5e-5, 2048).astype(np.float32)  # float16 subnormals
    k = _fp16_exponent(w)
    assert k > 0 and 1.0 <= np.abs(w).max() * 2.0 ** k < 2.0
    plain = np.mean(np.abs(w.astype(np.float16).astype(np.float32) - w) / np.abs(w))
    back = (w * np.float32(2.0 ** k)).astype(np.float16).astype(np.float32) * np.float32(2.0 ** -k)
    assert np.mean(np.abs(back - w) / np.abs(w)) < plain / 10
    assert _fp16_exponent(np.ones(4, np.float32)) == 0 and _fp16_exponent(np.zeros(4, np.float32)) == 0


def test_dequantize_weights_materializes_once_per_loaded_weight():
    from minirt.kernels.qlinear import dequantize_weights

    w = np.array([[1, -2], [127, 0]], dtype=np.int8)
    scale = np.array([0.5, 0.25], dtype=np.float32)
    w.flags.writeable = False  # as a memory-mapped initializer
    y1 = dequantize_weights(w, scale, axis=0)
    assert np.array_equal(y1, [[0.5, -1.0], [31.75, 0.0]]) and y1.dtype == np.float32
    assert dequantize_weights(w, scale, axis=0) is y1 and not y1.flags.writeable
    assert np.array_equal(dequantize_weights(w, scale, axis=1), [[0.5, -0.5], [63.5, 0.0]])
    h = np.array([1.5, -2.0], dtype=np.float16)
    assert np.array_equal(dequantize_weights(h, np.array(0.5, np.float32)), [0.75, -1.0])
    live = np.array([1, 2], dtype=np.int8)  # a writeable (non-constant) input is never cached
    a = dequantize_weights(live, np.array(1.0, np.float32))
    assert dequantize_weights(live, np.array(1.0, np.float32)) is not a


@pytest.mark.parametrize("shape", [(3 * 64, 64), (1000, 128), (7, 5)])
def test_dequantized_weights_start_on_a_64_byte_boundary(shape):
    """Materialized weights are 64-byte aligned like the artifact's own (numpy's big arrays start 16 bytes
    past a page: kernels reading them in place, an RNN's recurrent product, were 1.4x slower), with the
    same values."""
    from minirt.kernels.qlinear import dequantize_weights

    rng = np.random.default_rng(3)
    w = rng.integers(-127, 128, shape, dtype=np.int8)
    scale = (rng.random(shape[0]) * 0.1).astype(np.float32)
    w.flags.writeable = False
    y = dequantize_weights(w, scale, axis=0)
    assert y.ctypes.data % 64 == 0 and y.shape == shape and not y.flags.writeable
    np.testing.assert_array_equal(y, w.astype(np.float32) * scale[:, None])


def test_fp16_artifact_converts_weights_once(digits):
    convert_to_fp16(digits)
    assert any(n.op_type == "DequantizeWeights" for n in digits.graph)
    sess = _run.session(digits)
    x = np.random.default_rng(0).random((2, 1, 8, 8), dtype=np.float32)
    _, prof = sess.run_profiled({"image": x})
    assert np.array_equal(sess.run(None, {"image": x})[0], _run.session(digits).run(None, {"image": x})[0])


def _conv_gemm_model(path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    w1 = (rng.standard_normal((8, 2, 3, 3)) * 3).astype(np.float32)  # grouped (2 groups), stride 2, padded
    w2 = (rng.standard_normal((16, 8, 1, 1)) * 3).astype(np.float32)  # 1x1, no bias
    wg = (rng.standard_normal((16 * 4 * 4, 10)) * 3).astype(np.float32)
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(np.zeros(8, np.float32) + 0.1, "b1"),
             numpy_helper.from_array(w2, "w2"), numpy_helper.from_array(wg, "wg"),
             numpy_helper.from_array(np.zeros(10, np.float32), "bg")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2], group=2),
             helper.make_node("Conv", ["c1", "w2"], ["c2"]),
             helper.make_node("Flatten", ["c2"], ["f"]),
             helper.make_node("Gemm", ["f", "wg", "bg"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 10])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_fp16_bias_correction_removes_the_mean_shift_of_rounding(tmp_path):
    import sys

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from conftest import optimized

    from minirt.builder.quantize import QuantizeOptions, quantize

    path = str(tmp_path / "m.onnx")
    _conv_gemm_model(path)
    rng = np.random.default_rng(0)
    calib = [{"x": (rng.random((4, 4, 8, 8)) + 1.0).astype(np.float32)} for _ in range(4)]  # mean far from 0
    fresh = [{"x": (rng.random((4, 4, 8, 8)) + 1.0).astype(np.float32)} for _ in range(16)]
    ref = optimized(path)
    fs = _run.session(ref)
    errs = {}
    for on in (False, True):
        m = optimized(path)
        r = quantize(m, "fp16", calib, QuantizeOptions(fp16_budget=None, fp16_min_elements=16,
                                                       fp16_bias_correction=on, measure_latency=False))
        assert r.fp16["initializers"] == 3 and r.fp16["bias_corrected"] == (3 if on else 0)
        qs = _run.session(m)
        d = np.concatenate([qs.run(None, f)[0] - fs.run(None, f)[0] for f in fresh])
        errs[on] = (np.abs(d.mean(axis=0)).max(), np.abs(d).max())
    assert errs[True][0] < errs[False][0] / 2  # the per-output mean error
    assert errs[True][1] < errs[False][1]


def _pair_sums(q: np.ndarray, axis: int) -> np.ndarray:
    """|q[2j]| + |q[2j + 1]| along ``axis`` (an odd last entry paired with 0), computed independently."""
    rows = np.moveaxis(q.astype(np.int64), axis, -1)
    rows = rows.reshape(-1, rows.shape[-1])
    if rows.shape[1] % 2:
        rows = np.pad(rows, ((0, 0), (0, 1)))
    return np.abs(rows[:, 0::2]) + np.abs(rows[:, 1::2])


@pytest.mark.parametrize("shape,axis", [((6, 9), 1), ((9, 6), 0), ((4, 3, 5), 2), ((3, 8), 1)])
def test_limit_pair_sums_bounds_every_pair_and_changes_only_those_over(shape, axis):
    from minirt.builder.quantize.weights import PAIR_LIMIT, limit_pair_sums

    rng = np.random.default_rng(sum(shape))
    q = rng.integers(-127, 128, shape).astype(np.int8)
    q.reshape(-1)[:2] = [-128, 127]
    out = limit_pair_sums(q, axis)
    assert out.dtype == np.int8 and out.shape == q.shape
    assert _pair_sums(out, axis).max() <= PAIR_LIMIT
    before, after = _pair_sums(q, axis), _pair_sums(out, axis)
    fine = before <= PAIR_LIMIT
    assert np.array_equal(after[fine], before[fine])  # pairs within the bound are untouched
    assert np.all(after[~fine] == PAIR_LIMIT)  # the others lose exactly their excess
    assert np.all(np.sign(out) * np.sign(q) >= 0) and np.all(np.abs(out.astype(int)) <= np.abs(q.astype(int)))


def test_limit_pair_sums_splits_the_excess_evenly():
    from minirt.builder.quantize.weights import limit_pair_sums

    out = limit_pair_sums(np.array([[127, 127, -128, 1, 100, -31, 5]], np.int8), 1)
    assert out.tolist() == [[64, 64, -127, 1, 98, -30, 5]]


def test_conv_pairs_are_limited_in_both_orders_the_kernels_read():
    from minirt.builder.quantize.weights import PAIR_LIMIT, limit_conv_pair_sums

    q = np.random.default_rng(0).integers(-127, 128, (6, 5, 3, 3)).astype(np.int8)
    out = limit_conv_pair_sums(q, group=1)
    assert _pair_sums(out.reshape(6, -1), 1).max() <= PAIR_LIMIT  # a packed row (im2col order)
    assert _pair_sums(out, 1).max() <= PAIR_LIMIT  # channels 2i, 2i + 1 of a tap (implicit conv order)
    grouped = limit_conv_pair_sums(q, group=2)  # (no implicit route: the packed rows only)
    assert _pair_sums(grouped.reshape(6, -1), 1).max() <= PAIR_LIMIT


def test_pair_limited_quantization_beats_seven_bits_and_keeps_the_bound():
    import functools

    from minirt.builder.quantize.weights import PAIR_LIMIT, limit_conv_pair_sums, quantize_pair_limited

    rng = np.random.default_rng(3)
    w = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
    w[4] = 0  # an all-zero channel
    w[7] *= 1e-3
    q, s = quantize_pair_limited(w, 0, functools.partial(limit_conv_pair_sums, group=1))
    assert q.dtype == np.int8 and s.dtype == np.float32 and s.shape == (32,) and np.all(s > 0)
    assert _pair_sums(q.reshape(32, -1), 1).max() <= PAIR_LIMIT and _pair_sums(q, 1).max() <= PAIR_LIMIT
    assert not q[4].any()
    err = lambda q, s: float(np.square(q * s[:, None, None, None] - w).sum())  # noqa: E731
    q7, s7 = quantize_per_channel(w, 0, reduce_range=True)
    q8, s8 = quantize_per_channel(w, 0)
    assert err(q, s) < 0.7 * err(q7, s7)  # (about half the squared error of 7-bit weights)
    assert err(q, s) > err(q8, s8)  # (and more than unconstrained 8 bits)
    assert np.abs(q).max() > 63  # 8-bit values where the pairs allow
