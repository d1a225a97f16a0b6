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
    y = np.full((B, S, H * D), np.nan, np.float32)
    native.gqa_step(((q.reshape(B, S, H * D), 0), (None, 0), (None, 0)), H, KVH, D, None, None, None, False, k, v, p,
                    t, y, float(scale), softcap, window)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("half", [8, 4])  # rotary over the whole head, over half of it
def test_step_rotates_and_writes_the_new_keys(interleaved, half, every_isa):
    # packed QKV of 2 new tokens after a past of 3: the cache rows 3 and 4 get the rotated keys and the values,
    # the other rows keep what they held; the output is the numpy attention over the rotated queries
    from minirt.kernels.transformer import rotate_pairs

    rng = np.random.default_rng(half + interleaved)
    B, S, H, KVH, D, T, past = 1, 2, 4, 2, 16, 8, 3
    packed = rng.standard_normal((B, S, (H + 2 * KVH) * D)).astype(np.float32)
    cos = rng.standard_normal((32, half)).astype(np.float32)
    sin = rng.standard_normal((32, half)).astype(np.float32)
    pos = np.array([[7, 9]], np.int64)
    k = rng.standard_normal((B, KVH, T, D)).astype(np.float32)
    v = rng.standard_normal((B, KVH, T, D)).astype(np.float32)
    k0, v0 = k.copy(), v.copy()
    pasts, totals = np.array([past], np.int64), np.array([past + S], np.int64)
    y = np.empty((B, S, H * D), np.float32)
    native.gqa_step(((packed, 0), (packed, H * D), (packed, (H + KVH) * D)), H, KVH, D, pos, cos, sin, interleaved,
                    k, v, pasts, totals, y, 0.25, 0.0, 0)
    c, s_ = cos[pos][:, :, None, :], sin[pos][:, :, None, :]
    q_ref = rotate_pairs(packed[..., : H * D].reshape(B, S, H, D), c, s_, interleaved)
    k_new = rotate_pairs(packed[..., H * D:(H + KVH) * D].reshape(B, S, KVH, D), c, s_, interleaved)
    v_new = packed[..., (H + KVH) * D:].reshape(B, S, KVH, D)
    k_ref, v_ref = k0.copy(), v0.copy()
    k_ref[:, :, past:past + S] = k_new.transpose(0, 2, 1, 3)
    v_ref[:, :, past:past + S] = v_new.transpose(0, 2, 1, 3)
    np.testing.assert_allclose(k, k_ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(v, v_ref)
    expected = decoder._attention_numpy(q_ref, k_ref, v_ref, pasts, totals, np.float32(0.25), 0.0, 0)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def test_decode_reads_its_position_when_it_runs(every_isa, threads):
    # mrt_gqa_decode_f32 (what a replayed decode step calls): the same prepared call made twice with the
    # position changed in the seqlens_k array between the calls follows the array, and matches the general
    # step at that position (rotary included)
    rng = np.random.default_rng(3)
    H, KVH, D, T, half = 8, 2, 32, 24, 16
    cos = rng.standard_normal((64, half)).astype(np.float32)
    sin = rng.standard_normal((64, half)).astype(np.float32)
    prepared = native.gqa_decode_prepare(H, KVH, D, T, 0.125, 0.0, 0, False, cos, sin)
    k = rng.standard_normal((1, KVH, T, D)).astype(np.float32)
    v = rng.standard_normal((1, KVH, T, D)).astype(np.float32)
    k_ref, v_ref = k.copy(), v.copy()
    seqlens_k = np.zeros(1, np.int32)
    for position in (5, 11):
        seqlens_k[0] = position
        qkv = rng.standard_normal((1, 1, (H + 2 * KVH) * D)).astype(np.float32)
        y = np.full((1, 1, H * D), np.nan, np.float32)
        native.gqa_decode(prepared, qkv, seqlens_k, k, v, y)
        want = np.empty_like(y)
        native.gqa_step(((qkv, 0), (qkv, H * D), (qkv, (H + KVH) * D)), H, KVH, D, np.array([[position]], np.int64),
                        cos, sin, False, k_ref, v_ref, np.array([position], np.int64),
                        np.array([position + 1], np.int64), want, 0.125, 0.0, 0)
        np.testing.assert_array_equal(y, want)
        np.testing.assert_array_equal(k, k_ref)
        np.testing.assert_array_equal(v, v_ref)
    y = np.empty((1, 1, H * D), np.float32)
    for position in (T, -1):  # the new row must be inside the cache
        seqlens_k[0] = position
        with pytest.raises(ValueError, match="position"):
            native.gqa_decode(prepared, qkv, seqlens_k, k, v, y)


def test_attention_rejects_positions_outside_the_cache():
    rng = np.random.default_rng(0)
    q, k, v, p, t = _case(rng, 1, 2, 2, 1, 8, 4, [0], [4])
    q3 = q.reshape(1, 2, 16)
    y = np.empty((1, 2, 16), np.float32)

    def step(pasts=p, totals=t, out=y, positions=None, cos=None):
        native.gqa_step(((q3, 0), (None, 0), (None, 0)), 2, 1, 8, positions, cos, cos, False, k, v, pasts, totals,
                        out, 1.0, 0.0, 0)

    with pytest.raises(ValueError, match="do not fit"):
        step(out=y[:, :1])
    with pytest.raises(ValueError, match="bad parameters"):
        step(pasts=np.array([3], np.int64))  # 3 + 2 new > 4
    with pytest.raises(ValueError, match="bad parameters"):
        step(totals=np.array([5], np.int64))
    with pytest.raises(ValueError, match="code -3"):  # a position past the cos / sin caches
        step(positions=np.array([[0, 16]], np.int64), cos=np.ones((16, 4), np.float32))
