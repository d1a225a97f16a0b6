"""The native attention over a KV cache (attention_impl.h, mrt_gqa_attention_f32) against the numpy
version in minirt/kernels/decoder.py (_attention_numpy, checked against onnxruntime's GroupQueryAttention
in tests/kernels/test_decoder_ops.py), on every ISA the CPU has and with threads."""
from __future__ import annotations

import numpy as np
import pytest

from minirt import native
from minirt.kernels import decoder

pytestmark = pytest.mark.skipif(not native.available, reason="native kernels not built")


def _case(rng, B, S, H, KVH, D, T, pasts, totals):
    q = rng.standard_normal((B, S, H, D)).astype(np.float32)
    k = np.full((B, KVH, T, D), np.nan, np.float32)  # positions past each total must never be read
    v = np.full((B, KVH, T, D), np.nan, np.float32)
    for b in range(B):
        k[b, :, : totals[b]] = rng.standard_normal((KVH, totals[b], D))
        v[b, :, : totals[b]] = rng.standard_normal((KVH, totals[b], D))
    return q, k, v, np.array(pasts, np.int64), np.array(totals, np.int64)


@pytest.mark.parametrize("B,S,H,KVH,D,T,pasts,totals", [
    (1, 1, 8, 2, 64, 40, [12], [13]),               # decode, GQA
    (1, 1, 4, 4, 32, 16, [15], [16]),               # decode at the end of the cache, MHA
    (2, 1, 6, 3, 16, 20, [9, 3], [10, 4]),          # ragged batched decode
    (1, 7, 4, 2, 16, 7, [0], [7]),                  # prefill
    (2, 5, 4, 1, 32, 12, [0, 0], [5, 3]),           # right-padded prompts, MQA
    (1, 3, 4, 2, 16, 10, [4], [7]),                 # several new tokens after a past
])
@pytest.mark.parametrize("softcap,window", [(0.0, 0), (2.0, 0), (0.0, 3)])
def test_attention_matches_numpy(B, S, H, KVH, D, T, pasts, totals, softcap, window, every_isa, threads):
    rng = np.random.default_rng(B * 100 + S * 10 + H)
    q, k, v, p, t = _case(rng, B, S, H, KVH, D, T, pasts, totals)
    scale = np.float32(1 / np.sqrt(D))
    expected = decoder._attention_numpy(q, np.nan_to_num(k), np.nan_to_num(v), p, t, scale, softcap, window)
    y = np.full((B, S, H, D), np.nan, np.float32)
    native.gqa_attention(q, k, v, p, t, y, KVH, float(scale), softcap, window)
    np.testing.assert_allclose(y.reshape(B, S, H * D), expected, rtol=1e-5, atol=1e-5)


def test_attention_rejects_positions_outside_the_cache():
    rng = np.random.default_rng(0)
    q, k, v, p, t = _case(rng, 1, 2, 2, 1, 8, 4, [0], [4])
    y = np.empty_like(q)
    with pytest.raises(ValueError, match="do not fit"):
        native.gqa_attention(q, k, v, p, t, y[:, :1], 1, 1.0, 0.0, 0)
    with pytest.raises(ValueError, match="bad parameters"):
        native.gqa_attention(q, k, v, np.array([3], np.int64), t, y, 1, 1.0, 0.0, 0)  # 3 + 2 new > 4
    with pytest.raises(ValueError, match="bad parameters"):
        native.gqa_attention(q, k, v, p, np.array([5], np.int64), y, 1, 1.0, 0.0, 0)
