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
