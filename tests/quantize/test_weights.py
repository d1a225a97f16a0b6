"""Per-channel weight quantization, activation parameters and fp16 storage."""
import numpy as np

from builder.quantize import _run
from builder.quantize.weights import activation_params, convert_to_fp16, quantize_per_channel


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
    from builder.quantize.weights import _fp16_exponent

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


def test_fp16_artifact_converts_weights_once(digits):
    convert_to_fp16(digits)
    assert any(n.op_type == "DequantizeWeights" for n in digits.graph)
    sess = _run.session(digits)
    x = np.random.default_rng(0).random((2, 1, 8, 8), dtype=np.float32)
    _, prof = sess.run_profiled({"image": x})
    assert np.array_equal(sess.run(None, {"image": x})[0], _run.session(digits).run(None, {"image": x})[0])
