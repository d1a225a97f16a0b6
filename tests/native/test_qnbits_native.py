"""The native 4-bit MatMulNBits product (nbits_impl.h, mrt_qnbits_matmul) against the numpy
accuracy_level-4 reference of minirt/kernels/decoder.py (_matmul_int8, itself checked against
onnxruntime in tests/kernels/test_decoder_ops.py), on every ISA the CPU has and with threads."""
from __future__ import annotations

import numpy as np
import pytest

from minirt import native
from minirt.kernels import decoder

pytestmark = pytest.mark.skipif(not native.available, reason="native kernels not built")


def _weights(rng, N, K, block_size, zero_points):
    kb = -(-K // block_size)
    B = rng.integers(0, 256, size=(N, kb, block_size // 2), dtype=np.uint8)
    scales = (rng.random((N, kb)) * 0.1 + 0.01).astype(np.float32)
    zp = None
    if zero_points:
        zp = rng.integers(0, 256, size=(N, -(-kb // 2)), dtype=np.uint8)
    return B, scales, zp


def _reference(a, B, scales, zp, K, N, block_size):
    wq, s = decoder._int8_operands(B, scales, zp, K, N, 4, block_size)
    return decoder._matmul_int8(a, wq, s, K, block_size)


def _native(a, B, scales, zp, K, N, block_size, bias=None):
    w = decoder._fused_weights(B, scales, zp, K, N, block_size, bias)  # (the node's bias is added in numpy)
    y = np.full((a.shape[0], N), np.nan, np.float32)
    work = np.empty(native.qnbits_workspace_bytes(a.shape[0], K, block_size), np.uint8)
    native.qnbits_matmul(w, np.ascontiguousarray(a), y, work)
    return y


@pytest.mark.parametrize("M", [1, 3, 4, 5, 7, 8, 9, 10, 14, 23])  # (every tail after passes of 4 or of 8 rows)
@pytest.mark.parametrize("K,block_size", [(32, 32), (96, 32), (100, 32), (256, 64), (200, 64), (384, 128),
                                          (64, 64), (192, 64), (520, 256)])
@pytest.mark.parametrize("zero_points", [False, True])
def test_qnbits_matches_the_numpy_reference(M, K, block_size, zero_points, every_isa):
    rng = np.random.default_rng(M * 1000 + K + block_size)
    N = 39  # (not a multiple of the 16-column work items nor of 4 columns)
    B, scales, zp = _weights(rng, N, K, block_size, zero_points)
    a = (rng.standard_normal((M, K)) * 2).astype(np.float32)
    a[0, : min(K, block_size)] = 0  # an all-zero block (scale 0)
    expected = _reference(a, B, scales, zp, K, N, block_size)
    np.testing.assert_allclose(_native(a, B, scales, zp, K, N, block_size), expected, rtol=2e-5,
                               atol=2e-5 * np.abs(expected).max())


def test_qnbits_bias_and_threads(every_isa, threads):
    rng = np.random.default_rng(7)
    N, K, bs = 300, 512, 32
    B, scales, zp = _weights(rng, N, K, bs, True)
    a = rng.standard_normal((6, K)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    expected = _reference(a, B, scales, zp, K, N, bs) + bias
    np.testing.assert_allclose(_native(a, B, scales, zp, K, N, bs, bias), expected, rtol=2e-5,
                               atol=2e-5 * np.abs(expected).max())


def test_qnbits_activation_rounding_matches_half_to_even(every_isa):
    # values whose scaled form is exactly k + 0.5: numpy's rint and the C side must both round to even
    K = N = 32
    a = np.zeros((1, K), np.float32)
    a[0, 0] = 127.0  # max: inv = 1
    a[0, 1:9] = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 4.5]
    B = np.full((N, 1, 16), 0x11, np.uint8)  # every nibble 1
    scales = np.ones((N, 1), np.float32)
    zp = np.zeros((N, 1), np.uint8)  # zero point 0: y = sum(qa) * scale_a
    y = _native(a, B, scales, zp, K, N, 32)
    # rint: 0, 2, 2, -0, -2, -2, 4, 4 (+127) = 127 + 8
    np.testing.assert_allclose(y, np.full((1, N), 135.0, np.float32), rtol=1e-6)


def test_qnbits_rejects_mismatched_weights():
    packed = np.zeros((1, 1, 4, 16, 4), np.uint8)  # one group of 16 columns, one chunk
    scales = np.ones((1, 1, 16), np.float32)
    native.qnbits_weights(packed, scales, scales, None, 4, 32, 32)  # fits
    with pytest.raises(ValueError, match="do not fit"):
        native.qnbits_weights(packed, scales, scales, None, 4, 64, 32)
    with pytest.raises(ValueError, match="do not fit"):
        native.qnbits_weights(packed, scales, scales, None, 4, 16, 16)
    with pytest.raises(ValueError, match="do not fit"):
        native.qnbits_weights(packed, scales, scales, np.ones(3, np.float32), 4, 32, 32)


def test_qnbits_packing_places_each_nibble():
    # the packed layout of nbits_impl.h, checked value by value against its definition
    rng = np.random.default_rng(3)
    N, K, bs = 19, 64, 32
    B = rng.integers(0, 256, size=(N, K // bs, bs // 2), dtype=np.uint8)
    q = decoder._unpack(B.reshape(N, -1), 4)  # [N, K]: value k of column n
    packed = decoder._pack_nibbles(B.reshape(N, -1), N, bs)
    scales = decoder._pack_scales(np.arange(N * 2, dtype=np.float32).reshape(N, 2))
    for n in (0, 5, 15, 16, 18):
        g, l = divmod(n, 16)
        for k in (0, 3, 4, 15, 16, 17, 31, 32, 63):
            c, r = divmod(k, 32)
            half, kk = divmod(r, 16)
            byte = packed[g, c, kk // 4, l, kk % 4]
            assert (byte >> 4 if half else byte & 15) == q[n, k]
        assert scales[g, 1, l] == 2 * n + 1
    assert not packed[1, :, :, 3:].any() and not scales[1, :, 3:].any()  # columns 19..31: zeros
