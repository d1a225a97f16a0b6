"""onnxruntime-genai's decoder ops (minirt/kernels/decoder.py) against onnxruntime's CPU contrib kernels:
MatMulNBits, GroupQueryAttention, RotaryEmbedding (com.microsoft), SimplifiedLayerNormalization and
SkipSimplifiedLayerNormalization; then a one-layer decoder block built and run end to end."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

import minirt
from minirt.builder import build

ort = pytest.importorskip("onnxruntime")

MS = "com.microsoft"
RTOL, ATOL = 1e-5, 1e-5
# MatMulNBits sums K products of O(1) terms (outputs up to |y| ~ 30): onnxruntime's blocked summation
# order differs from BLAS's by a few float32 ulps of the partial sums, so near-zero outputs need an
# absolute tolerance of that size (1e-4 is ~3e-6 of the output range).
MATMUL_ATOL = 1e-4
RNG = np.random.default_rng(24)


def _f(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _model(nodes, inputs, outputs, inits=()):
    """A model of ``nodes``; ``inputs`` / ``outputs`` are (name, array-or-elem-type, shape) triples."""
    def vi(name, dtype, shape):
        return h.make_tensor_value_info(name, dtype, shape)

    graph = h.make_graph(nodes, "g", [vi(*i) for i in inputs], [vi(*o) for o in outputs],
                         [nh.from_array(a, n) for n, a in inits])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(MS, 1)], ir_version=9)


def _ort(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _minirt(model, feeds):
    return minirt.Session(build(model.SerializeToString(), None).data).run(None, feeds)


def _close(actual, expected, rtol=RTOL, atol=ATOL):
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert a.shape == e.shape, f"output {i}: shape {a.shape} != {e.shape}"
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=f"output {i}")


def _compare_raw(model, feeds):
    """(onnxruntime's outputs, minirt's outputs) of ``model``."""
    expected = _ort(model, feeds)
    outs = [o.name for o in model.graph.output]
    del model.graph.output[:]
    model.graph.output.extend(h.make_tensor_value_info(n, h.np_dtype_to_tensor_dtype(e.dtype), e.shape)
                              for n, e in zip(outs, expected))
    return expected, _minirt(model, feeds)


def _compare(model, feeds, rtol=RTOL, atol=ATOL):
    expected = _ort(model, feeds)
    # the ONNX checker (builder) wants typed graph outputs: type them from onnxruntime's results
    outs = [o.name for o in model.graph.output]
    del model.graph.output[:]
    model.graph.output.extend(h.make_tensor_value_info(n, h.np_dtype_to_tensor_dtype(e.dtype), e.shape)
                              for n, e in zip(outs, expected))
    actual = _minirt(model, feeds)
    _close(actual, expected, rtol, atol)
    return actual, expected


# --------------------------------------------------------------------------- MatMulNBits

def quantize_4bit(w: np.ndarray, block_size: int, zero_point: str):
    """Block-quantize w [K, N] as MatMulNBits stores it: B uint8 [N, k_blocks, block_size / 2],
    scales [N, k_blocks], zero points none / packed uint8 / float."""
    K, N = w.shape
    nb = -(-K // block_size)
    wt = np.zeros((N, nb * block_size), np.float32)
    wt[:, :K] = w.T
    blocks = wt.reshape(N, nb, block_size)
    lo, hi = blocks.min(-1), blocks.max(-1)
    if zero_point == "none":
        scales = (np.maximum(np.abs(lo), np.abs(hi)) / 7.0).astype(np.float32) + np.float32(1e-3)
        zp = np.full((N, nb), 8.0, np.float32)
    else:
        scales = ((hi - lo) / 15.0).astype(np.float32) + np.float32(1e-3)
        zp = np.clip(np.rint(-lo / scales), 0, 15).astype(np.float32)
    q = np.clip(np.rint(blocks / scales[..., None]) + zp[..., None], 0, 15).astype(np.uint8)
    B = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)
    if zero_point == "none":
        return B, scales, None
    if zero_point == "float":
        return B, scales, (zp + RNG.uniform(-0.3, 0.3, zp.shape)).astype(np.float32)  # non-integer: exercised as is
    zq = zp.astype(np.uint8)
    if nb % 2:
        zq = np.concatenate([zq, np.zeros((N, 1), np.uint8)], axis=1)
    return B, scales, (zq[:, 0::2] | (zq[:, 1::2] << 4)).astype(np.uint8)


def _matmul_nbits_model(K, N, block_size, B, scales, zp, bias, a_shape, accuracy_level=0):
    names = ["A", "B", "scales", "zp" if zp is not None else "", "", "bias" if bias is not None else ""]
    while names[-1] == "":
        names.pop()
    inits = [("B", B), ("scales", scales)] + ([("zp", zp)] if zp is not None else []) + \
        ([("bias", bias)] if bias is not None else [])
    node = h.make_node("MatMulNBits", names, ["Y"], domain=MS, K=K, N=N, bits=4, block_size=block_size,
                       accuracy_level=accuracy_level)
    return _model([node], [("A", TP.FLOAT, a_shape)], [("Y", TP.FLOAT, None)], inits)


@pytest.mark.parametrize("block_size", [16, 32, 64, 128])
@pytest.mark.parametrize("zero_point", ["none", "packed", "float"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matmul_nbits(block_size, zero_point, with_bias):
    K, N = 256, 48
    B, scales, zp = quantize_4bit(_f(K, N), block_size, zero_point)
    bias = _f(N) if with_bias else None
    for a_shape in ([1, 1, K], [2, 5, K], [3, K]):  # decode, prefill, 2-D
        model = _matmul_nbits_model(K, N, block_size, B, scales, zp, bias, a_shape)
        _compare(model, {"A": _f(*a_shape)}, atol=MATMUL_ATOL)


@pytest.mark.parametrize("K,block_size", [(40, 16), (100, 32), (72, 64), (200, 128), (48, 32)])
@pytest.mark.parametrize("zero_point", ["none", "packed"])
def test_matmul_nbits_k_not_a_multiple_of_the_block(K, block_size, zero_point):
    N = 24
    B, scales, zp = quantize_4bit(_f(K, N), block_size, zero_point)  # 48/32: an odd k_blocks for packed zp
    model = _matmul_nbits_model(K, N, block_size, B, scales, zp, _f(N), [2, 3, K])
    _compare(model, {"A": _f(2, 3, K)}, atol=MATMUL_ATOL)


def _pack(q: np.ndarray, bits: int) -> np.ndarray:
    """Values [..., n] (< 2^bits) packed ``8 // bits`` to a byte, lowest bits first; n padded up."""
    per = 8 // bits
    n = -(-q.shape[-1] // per) * per
    qp = np.zeros((*q.shape[:-1], n), np.uint8)
    qp[..., : q.shape[-1]] = q
    qp = qp.reshape(*q.shape[:-1], n // per, per)
    out = np.zeros(qp.shape[:-1], np.uint8)
    for i in range(per):
        out |= (qp[..., i] << (i * bits)).astype(np.uint8)
    return out


@pytest.mark.parametrize("bits", [2, 8])
@pytest.mark.parametrize("with_zp", [False, True])
def test_matmul_nbits_other_bit_widths(bits, with_zp):
    K, N, bs = 96, 16, 32  # 3 blocks: packed 2-bit zero points fill one byte partly
    nb = K // bs
    B = _pack(RNG.integers(0, 1 << bits, (N, nb, bs)).astype(np.uint8), bits)
    scales = (RNG.random((N, nb)) * 0.1).astype(np.float32)
    zp = _pack(RNG.integers(0, 1 << bits, (N, nb)).astype(np.uint8), bits) if with_zp else None
    names = ["A", "B", "s"] + (["z"] if with_zp else [])
    inits = [("B", B), ("s", scales)] + ([("z", zp)] if with_zp else [])
    node = h.make_node("MatMulNBits", names, ["Y"], domain=MS, K=K, N=N, bits=bits, block_size=bs)
    model = _model([node], [("A", TP.FLOAT, [2, K])], [("Y", TP.FLOAT, None)], inits)
    _compare(model, {"A": _f(2, K)}, atol=MATMUL_ATOL)


def test_matmul_nbits_matches_the_dequantized_float_matmul():
    from minirt.kernels.decoder import dequantize_nbits

    K, N, bs = 64, 16, 32
    w = _f(K, N)
    B, scales, zp = quantize_4bit(w, bs, "packed")
    wq = dequantize_nbits(B, scales, zp, K, N, 4, bs)
    assert np.abs(wq.T - w).max() <= scales.max() / 2 + 1e-6  # quantization error at most half a step


@pytest.mark.parametrize("block_size", [16, 32, 128])
@pytest.mark.parametrize("zero_point", ["none", "packed", "float"])
@pytest.mark.parametrize("K,rows", [(256, [1, 1]), (256, [2, 4]), (100, [3])])
def test_matmul_nbits_accuracy_level_4(block_size, zero_point, K, rows):
    # onnxruntime quantizes A to int8 per block at accuracy_level 4 (float zero points: fp32); minirt
    # does the same, so the results agree to float rounding, not to int8 rounding (~5e-3)
    N = 40
    B, scales, zp = quantize_4bit(_f(K, N), block_size, zero_point)
    model = _matmul_nbits_model(K, N, block_size, B, scales, zp, _f(N), [*rows, K], accuracy_level=4)
    _compare(model, {"A": _f(*rows, K)}, atol=MATMUL_ATOL)


@pytest.mark.parametrize("bits", [2, 8])
def test_matmul_nbits_accuracy_level_4_other_bit_widths(bits):
    K, N, bs = 128, 16, 32
    nb = K // bs
    B = _pack(RNG.integers(0, 1 << bits, (N, nb, bs)).astype(np.uint8), bits)
    scales = (RNG.random((N, nb)) * 0.1).astype(np.float32)
    node = h.make_node("MatMulNBits", ["A", "B", "s"], ["Y"], domain=MS, K=K, N=N, bits=bits, block_size=bs,
                       accuracy_level=4)
    model = _model([node], [("A", TP.FLOAT, [3, K])], [("Y", TP.FLOAT, None)], [("B", B), ("s", scales)])
    _compare(model, {"A": _f(3, K)}, atol=MATMUL_ATOL)


@pytest.mark.parametrize("bad,match", [
    ({"block_size": 24}, "power of two"),
    ({"block_size": 8}, "at least 16"),
    ({"B_shape": (16, 2, 8)}, "B has shape"),
    ({"scales_shape": (16, 3)}, "scales has shape"),
    ({"zp_shape": (16, 2)}, "zero_points has shape"),
    ({"bits": 3}, "bits=3"),
])
def test_matmul_nbits_errors(bad, match):
    from minirt.kernels.decoder import matmul_nbits

    K, N, bs = 64, 16, bad.get("block_size", 32)
    B = np.zeros(bad.get("B_shape", (N, max(1, K // max(bs, 1)), max(1, bs // 2))), np.uint8)
    scales = np.ones(bad.get("scales_shape", (N, max(1, K // max(bs, 1)))), np.float32)
    zp = np.zeros(bad["zp_shape"], np.uint8) if "zp_shape" in bad else None
    with pytest.raises(ValueError, match=match):
        matmul_nbits(_f(2, K), B, scales, zp, K=K, N=N, bits=bad.get("bits", 4), block_size=bs)
    with pytest.raises(ValueError, match="last dimension must be K"):
        matmul_nbits(_f(2, K + 1), np.zeros((N, 2, 16), np.uint8), np.ones((N, 2), np.float32), K=K, N=N,
                     block_size=32)


# --------------------------------------------------------------------------- RMS norms

@pytest.mark.parametrize("shape", [(2, 5, 32), (7, 64), (1, 1, 48)])
def test_simplified_layer_normalization(shape):
    node = h.make_node("SimplifiedLayerNormalization", ["x", "g"], ["y"], epsilon=1e-6, axis=-1, stash_type=1)
    model = _model([node], [("x", TP.FLOAT, shape)], [("y", TP.FLOAT, None)], [("g", _f(shape[-1]))])
    _compare(model, {"x": _f(*shape, scale=3.0)})


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("shape", [(2, 5, 32), (6, 64)])
def test_skip_simplified_layer_normalization(shape, with_bias):
    ins = ["x", "skip", "g"] + (["b"] if with_bias else [])
    node = h.make_node("SkipSimplifiedLayerNormalization", ins, ["y", "", "", "sum"], domain=MS, epsilon=1e-5)
    inits = [("g", _f(shape[-1]))] + ([("b", _f(shape[-1]))] if with_bias else [])
    model = _model([node], [("x", TP.FLOAT, shape), ("skip", TP.FLOAT, shape)],
                   [("y", TP.FLOAT, None), ("sum", TP.FLOAT, None)], inits)
    _compare(model, {"x": _f(*shape), "skip": _f(*shape)})
    node1 = h.make_node("SkipSimplifiedLayerNormalization", ins, ["y"], domain=MS, epsilon=1e-5)
    model1 = _model([node1], [("x", TP.FLOAT, shape), ("skip", TP.FLOAT, shape)], [("y", TP.FLOAT, None)], inits)
    _compare(model1, {"x": _f(*shape), "skip": _f(*shape)})


# --------------------------------------------------------------------------- rotary

def _caches(max_pos, half):
    inv = 1.0 / (10000 ** (np.arange(half, dtype=np.float64) / half))
    ang = np.arange(max_pos)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("layout", ["3d", "4d", "3d-start"])
def test_rotary_embedding(interleaved, layout):
    B, S, Hn, D = 2, 5, 3, 16
    cos, sin = _caches(32, D // 2)
    shape = [B, S, Hn * D] if layout != "4d" else [B, Hn, S, D]
    pos = RNG.integers(0, 32, (B, S)).astype(np.int64) if layout != "3d-start" else np.array([7], np.int64)
    node = h.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain=MS, interleaved=interleaved)
    model = _model([node], [("x", TP.FLOAT, shape), ("pos", TP.INT64, list(pos.shape))], [("y", TP.FLOAT, None)],
                   [("cos", cos), ("sin", sin)])
    _compare(model, {"x": _f(*shape), "pos": pos})


def test_rotary_embedding_partial_dim():
    B, S, Hn, D, R = 1, 4, 2, 32, 16
    cos, sin = _caches(16, R // 2)
    node = h.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain=MS, num_heads=Hn,
                       rotary_embedding_dim=R)
    model = _model([node], [("x", TP.FLOAT, [B, S, Hn * D]), ("pos", TP.INT64, [B, S])], [("y", TP.FLOAT, None)],
                   [("cos", cos), ("sin", sin)])
    _compare(model, {"x": _f(B, S, Hn * D), "pos": np.arange(S, dtype=np.int64)[None]})


# --------------------------------------------------------------------------- GroupQueryAttention

def _gqa_model(B, S, H, KVH, D, P, rotary=None, interleaved=0, packed=False, **attrs):
    ins = ["q", "" if packed else "k", "" if packed else "v", "past_k", "past_v", "seqlens_k", "total"]
    inputs = [("q", TP.FLOAT, [B, S, (H + 2 * KVH) * D if packed else H * D])]
    if not packed:
        inputs += [("k", TP.FLOAT, [B, S, KVH * D]), ("v", TP.FLOAT, [B, S, KVH * D])]
    inputs += [("past_k", TP.FLOAT, [B, KVH, P, D]), ("past_v", TP.FLOAT, [B, KVH, P, D]),
               ("seqlens_k", TP.INT32, [B]), ("total", TP.INT32, [])]
    inits = []
    if rotary is not None:
        ins += ["cos", "sin"]
        inits = [("cos", rotary[0]), ("sin", rotary[1])]
        attrs.update(do_rotary=1, rotary_interleaved=interleaved)
    node = h.make_node("GroupQueryAttention", ins, ["out", "present_k", "present_v"], domain=MS, num_heads=H,
                       kv_num_heads=KVH, **attrs)
    return _model([node], inputs, [("out", TP.FLOAT, None), ("present_k", TP.FLOAT, None),
                                   ("present_v", TP.FLOAT, None)], inits)


def _gqa_feeds(B, S, H, KVH, D, P, packed=False):
    feeds = {"past_k": _f(B, KVH, P, D), "past_v": _f(B, KVH, P, D),
             "seqlens_k": np.full(B, P + S - 1, np.int32), "total": np.array(P + S, np.int32)}
    if packed:
        feeds["q"] = _f(B, S, (H + 2 * KVH) * D)
    else:
        feeds.update(q=_f(B, S, H * D), k=_f(B, S, KVH * D), v=_f(B, S, KVH * D))
    return feeds


@pytest.mark.parametrize("B,S,H,KVH,D,P", [
    (1, 5, 4, 2, 16, 0),    # prefill, GQA
    (2, 7, 4, 4, 16, 0),    # prefill, MHA
    (1, 1, 8, 2, 16, 6),    # decode after a past of 6
    (2, 1, 6, 3, 32, 9),    # batched decode
    (1, 3, 4, 1, 16, 4),    # several new tokens after a past (MQA)
])
@pytest.mark.parametrize("rotary", [False, True])
def test_group_query_attention(B, S, H, KVH, D, P, rotary):
    caches = _caches(64, D // 2) if rotary else None
    _compare(_gqa_model(B, S, H, KVH, D, P, caches), _gqa_feeds(B, S, H, KVH, D, P))


@pytest.mark.parametrize("S,P", [(5, 0), (1, 7)])
def test_group_query_attention_interleaved_rotary_packed_qkv_and_options(S, P):
    B, H, KVH, D = 1, 4, 2, 32
    caches = _caches(32, D // 2)
    _compare(_gqa_model(B, S, H, KVH, D, P, caches, interleaved=1, packed=True), _gqa_feeds(B, S, H, KVH, D, P, True))
    partial = _caches(32, D // 4)  # rotary over the first half of each head
    _compare(_gqa_model(B, S, H, KVH, D, P, partial), _gqa_feeds(B, S, H, KVH, D, P))
    _compare(_gqa_model(B, S, H, KVH, D, P, softcap=1.5, scale=0.2), _gqa_feeds(B, S, H, KVH, D, P))
    _compare(_gqa_model(B, S, H, KVH, D, P, local_window_size=2), _gqa_feeds(B, S, H, KVH, D, P))


def test_group_query_attention_ragged_decode():
    # two sequences sharing a past buffer of 6 positions: one holds 6, the other 3 (rows past it unused)
    B, S, H, KVH, D, P = 2, 1, 4, 2, 16, 6
    caches = _caches(16, D // 2)
    feeds = _gqa_feeds(B, S, H, KVH, D, P)
    feeds["seqlens_k"] = np.array([6, 3], np.int32)
    feeds["total"] = np.array(7, np.int32)
    model = _gqa_model(B, S, H, KVH, D, P, caches)
    expected, actual = _compare_raw(model, feeds)
    _close(actual[:1], expected[:1])
    # the present rows each sequence owns agree; onnxruntime leaves the rest unspecified
    _close([actual[1][0], actual[2][0], actual[1][1, :, :4], actual[2][1, :, :4]],
           [expected[1][0], expected[2][0], expected[1][1, :, :4], expected[2][1, :, :4]])


def test_group_query_attention_right_padded_prompt():
    # a batch of prompts of 5 and 3 tokens, the second padded to 5: seqlens_k = [4, 2]
    B, S, H, KVH, D, P = 2, 5, 4, 2, 16, 0
    feeds = _gqa_feeds(B, S, H, KVH, D, P)
    feeds["seqlens_k"] = np.array([4, 2], np.int32)
    _compare(_gqa_model(B, S, H, KVH, D, P, _caches(16, D // 2)), feeds)


def test_group_query_attention_preallocated_past_buffer():
    # past buffers of 10 positions of which 4 hold tokens: present keeps the buffer's length
    B, S, H, KVH, D, P = 1, 1, 4, 2, 16, 10
    feeds = _gqa_feeds(B, S, H, KVH, D, P)
    feeds["seqlens_k"] = np.array([4], np.int32)
    feeds["total"] = np.array(5, np.int32)
    actual, _ = _compare(_gqa_model(B, S, H, KVH, D, P, _caches(16, D // 2)), feeds)
    assert actual[1].shape == (B, KVH, P, D)


@pytest.mark.parametrize("packed", [False, True])  # packed QKV: the decode fast path (decoder._gqa_decode)
def test_group_query_attention_appends_in_place_to_a_shared_kv_buffer(packed):
    # minirt.genai's decode loop: past and present bound to the same preallocated buffers (onnxruntime's
    # past_present_share_buffer).  Each step writes only its new positions into those buffers (rows past
    # the total keep their NaN sentinel: nothing copied or cleared), and every output equals
    # onnxruntime's, which is fed a snapshot of the buffers and returns its own present.
    from minirt.ort_compat import OrtValue

    B, H, KVH, D, M = 1, 4, 2, 16, 12
    caches = _caches(32, D // 2)
    prompt = 5
    kbuf = np.full((B, KVH, M, D), np.nan, np.float32)
    vbuf = np.full((B, KVH, M, D), np.nan, np.float32)
    total = 0
    for S in (prompt, 1, 1, 1):
        model = _gqa_model(B, S, H, KVH, D, M, caches, packed=packed)
        feeds = _gqa_feeds(B, S, H, KVH, D, M, packed)
        total += S
        feeds.update(past_k=kbuf, past_v=vbuf, seqlens_k=np.array([total - 1], np.int32),
                     total=np.array(total, np.int32))
        ref_feeds = {k: (np.nan_to_num(v) if k.startswith("past") else v) for k, v in feeds.items()}
        expected, _ = _compare_raw(model, ref_feeds)
        sess = minirt.Session(build(model.SerializeToString(), None).data)
        binding = sess.io_binding()
        for k, v in feeds.items():
            binding.bind_cpu_input(k, v)
        binding.bind_output("out")
        binding.bind_ortvalue_output("present_k", OrtValue.ortvalue_from_numpy(kbuf))
        binding.bind_ortvalue_output("present_v", OrtValue.ortvalue_from_numpy(vbuf))
        sess.run_with_iobinding(binding)
        out, pk, pv = (v.numpy() for v in binding.get_outputs())
        assert np.shares_memory(pk, kbuf) and np.shares_memory(pv, vbuf)
        np.testing.assert_allclose(out, expected[0], rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(kbuf[:, :, :total], expected[1][:, :, :total], rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(vbuf[:, :, :total], expected[2][:, :, :total], rtol=RTOL, atol=ATOL)
        assert np.isnan(kbuf[:, :, total:]).all() and np.isnan(vbuf[:, :, total:]).all()


@pytest.mark.parametrize("B,S,P,pos", [
    (1, 1, 6, [[9]]), (2, 1, 6, [[3], [11]]),      # decode: each sequence at its own position
    (1, 3, 4, [[4, 9, 6]]),                         # new tokens after a past: as given
    (2, 4, 0, [[3, 5, 1, 7], [1, 2, 3, 4]]),        # first prompt: onnxruntime reads position_ids[0, 0] only
])
def test_group_query_attention_position_ids(B, S, P, pos):
    H, KVH, D = 4, 2, 16
    model = _gqa_model(B, S, H, KVH, D, P, _caches(32, D // 2))
    model.graph.node[0].input.append("pos")
    model.graph.input.append(h.make_tensor_value_info("pos", TP.INT64, [B, S]))
    feeds = _gqa_feeds(B, S, H, KVH, D, P)
    feeds["pos"] = np.array(pos, np.int64)
    _compare(model, feeds)


def test_group_query_attention_errors():
    from minirt.kernels.decoder import group_query_attention

    with pytest.raises(ValueError, match="multiple of kv_num_heads"):
        group_query_attention(_f(1, 2, 48), _f(1, 2, 32), _f(1, 2, 32), None, None, np.array([1], np.int32),
                              np.array(2, np.int32), num_heads=3, kv_num_heads=2)
    with pytest.raises(ValueError, match="key has shape"):
        group_query_attention(_f(1, 2, 64), _f(1, 2, 24), _f(1, 2, 32), None, None, np.array([1], np.int32),
                              np.array(2, np.int32), num_heads=4, kv_num_heads=2)
    with pytest.raises(ValueError, match="past_key"):
        group_query_attention(_f(1, 1, 64), _f(1, 1, 32), _f(1, 1, 32), _f(1, 3, 4, 16), _f(1, 3, 4, 16),
                              np.array([4], np.int32), np.array(5, np.int32), num_heads=4, kv_num_heads=2)


# --------------------------------------------------------------------------- a decoder block end to end

def _decoder_block(hidden=64, H=4, KVH=2, block_size=32, max_pos=64, accuracy_level=0):
    D = hidden // H
    inits = [("ln1", _f(hidden) * 0.1 + 1), ("ln2", _f(hidden) * 0.1 + 1)]
    cos, sin = _caches(max_pos, D // 2)
    inits += [("cos", cos), ("sin", sin)]
    nodes = [h.make_node("SimplifiedLayerNormalization", ["x", "ln1"], ["xn"], epsilon=1e-6, axis=-1, stash_type=1)]
    for name, n_out in (("q", H * D), ("k", KVH * D), ("v", KVH * D), ("o", hidden)):
        B, scales, zp = quantize_4bit(_f(hidden, n_out, scale=0.2), block_size, "packed")
        inits += [(f"{name}_B", B), (f"{name}_s", scales), (f"{name}_zp", zp)]
        src = "attn" if name == "o" else "xn"
        nodes.append(h.make_node("MatMulNBits", [src, f"{name}_B", f"{name}_s", f"{name}_zp"], [f"{name}_out"],
                                 domain=MS, K=hidden, N=n_out, bits=4, block_size=block_size,
                                 accuracy_level=accuracy_level))
        if name == "v":
            nodes.append(h.make_node("GroupQueryAttention", ["q_out", "k_out", "v_out", "past_k", "past_v",
                                                             "seqlens_k", "total", "cos", "sin"],
                                     ["attn", "present_k", "present_v"], domain=MS, num_heads=H, kv_num_heads=KVH,
                                     do_rotary=1, rotary_interleaved=0, local_window_size=-1, softcap=0.0))
    nodes.append(h.make_node("SkipSimplifiedLayerNormalization", ["o_out", "x", "ln2"], ["y", "", "", "residual"],
                             domain=MS, epsilon=1e-6))
    inputs = [("x", TP.FLOAT, ["batch", "seq", hidden]), ("past_k", TP.FLOAT, ["batch", KVH, "past", D]),
              ("past_v", TP.FLOAT, ["batch", KVH, "past", D]), ("seqlens_k", TP.INT32, ["batch"]),
              ("total", TP.INT32, [])]
    outputs = [("y", TP.FLOAT, ["batch", "seq", hidden]), ("residual", TP.FLOAT, ["batch", "seq", hidden]),
               ("present_k", TP.FLOAT, ["batch", KVH, "total_len", D]),
               ("present_v", TP.FLOAT, ["batch", KVH, "total_len", D])]
    return _model(nodes, inputs, outputs, inits), D


@pytest.mark.parametrize("accuracy_level", [0, 4])  # 4: what genai's builder writes for CPU int4
def test_decoder_block_prefill_then_decode(accuracy_level):
    hidden, H, KVH = 64, 4, 2
    model, D = _decoder_block(hidden, H, KVH, accuracy_level=accuracy_level)
    from minirt.builder.contrib_schemas import ensure_registered

    ensure_registered()  # onnx knows SimplifiedLayerNormalization once the builder has registered it
    onnx.checker.check_model(model)
    sess_ort = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    sess = minirt.Session(build(model.SerializeToString(), None).data)
    B = 1
    past = {"ort": [np.zeros((B, KVH, 0, D), np.float32)] * 2, "mrt": [np.zeros((B, KVH, 0, D), np.float32)] * 2}
    length = 0
    for step, n in enumerate([5, 1, 1, 1]):  # a prefill of 5 tokens, then 3 decode steps
        x = _f(B, n, hidden)
        length += n
        common = {"x": x, "seqlens_k": np.full(B, length - 1, np.int32), "total": np.array(length, np.int32)}
        expected = sess_ort.run(None, {**common, "past_k": past["ort"][0], "past_v": past["ort"][1]})
        actual = sess.run(None, {**common, "past_k": past["mrt"][0], "past_v": past["mrt"][1]})
        assert actual[2].shape == (B, KVH, length, D)
        _close(actual, expected)
        past["ort"], past["mrt"] = expected[2:], actual[2:]


def test_rotary_and_norm_errors():
    from minirt.kernels.decoder import ms_rotary_embedding, skip_simplified_layer_normalization

    cos, sin = _caches(8, 8)
    with pytest.raises(ValueError, match="does not divide into num_heads=3"):
        ms_rotary_embedding(_f(1, 2, 32), np.array([0], np.int64), cos, sin, num_heads=3)
    with pytest.raises(ValueError, match="outside the cos/sin caches of 8"):
        ms_rotary_embedding(_f(1, 2, 32), np.array([7], np.int64), cos, sin)
    with pytest.raises(ValueError, match="position_ids has shape"):
        ms_rotary_embedding(_f(1, 2, 32), np.zeros((2, 2), np.int64), cos, sin)
    with pytest.raises(ValueError, match="skip .* does not match input"):
        skip_simplified_layer_normalization(_f(2, 3, 8), _f(2, 3, 4), _f(8))
    with pytest.raises(ValueError, match="gamma has shape"):
        skip_simplified_layer_normalization(_f(2, 3, 8), _f(2, 3, 8), _f(4))
