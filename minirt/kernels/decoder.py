"""Decoder-only LLM ops as onnxruntime-genai's model builder writes them (issue 24, first slice).

numpy versions of onnxruntime's CPU contrib kernels, float32 (float16 / bfloat16 inputs are computed
in float32 and cast back):

* ``com.microsoft::MatMulNBits``            block-quantized (2/4/8-bit) weights times float activations
* ``com.microsoft::GroupQueryAttention``    causal attention over a past/present KV cache, grouped heads,
                                            optional rotary embedding of q and k
* ``com.microsoft::RotaryEmbedding``        RoPE with (position_ids, cos_cache, sin_cache)
* ``ai.onnx::SimplifiedLayerNormalization`` RMS norm (onnxruntime registers it in the default domain at
                                            opset 1; onnx itself has none: the builder registers its schema,
                                            builder/contrib_schemas.py)
* ``com.microsoft::SkipSimplifiedLayerNormalization``  RMS norm of input + skip (+ bias)

Native kernels (fused 4-bit GEMV/GEMM, KV-cache attention) are later slices of issue 24.
"""
from __future__ import annotations

import math

import numpy as np

from minirt import native as _native
from minirt.kernels.registry import is_constant, kernel, remember
from minirt.kernels.transformer import rotate_pairs

MS = "com.microsoft"


def _f32(x):
    """(x as float32, its original dtype): reduced-precision floats are computed in float32."""
    x = np.asarray(x)
    return (x if x.dtype == np.float32 else x.astype(np.float32)), x.dtype


# --------------------------------------------------------------------------- MatMulNBits

def _unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    """uint8 bytes [..., n] -> their ``bits``-wide fields [..., n * 8 // bits], lowest bits first
    (the first value of a byte is in its low nibble for 4 bits)."""
    if bits == 8:
        return packed
    per = 8 // bits
    shifts = np.arange(0, 8, bits, dtype=np.uint8)
    fields = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return fields.reshape(*packed.shape[:-1], packed.shape[-1] * per)


def dequantize_nbits(B, scales, zero_points, K: int, N: int, bits: int, block_size: int) -> np.ndarray:
    """The float32 weight W [N, K] of MatMulNBits:

        W[n, k] = (q[n, k] - zp[n, k // block_size]) * scales[n, k // block_size]

    ``B`` uint8 [N, k_blocks, blob_size] with k_blocks = ceil(K / block_size), blob_size =
    block_size * bits / 8: each block's values packed along K, low bits first.  ``scales``
    [N, k_blocks] (or flat N * k_blocks).  ``zero_points``: None (2^(bits-1)), uint8 packed like B
    [N, ceil(k_blocks * bits / 8)] (or flat), or float [N, k_blocks] (the type of A; subtracted as is).
    A K that is not a multiple of block_size pads the last block; the padding is dropped."""
    if bits not in (2, 4, 8):
        raise ValueError(f"MatMulNBits: bits={bits} is not supported (2, 4 or 8)")
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"MatMulNBits: block_size={block_size} must be a power of two and at least 16")
    if K <= 0 or N <= 0:
        raise ValueError(f"MatMulNBits: K={K} and N={N} must be positive")
    B, s = _checked_weights(B, scales, K, N, bits, block_size)
    n_blocks, blob = s.shape[1], B.shape[1] // s.shape[1]
    s = s.reshape(N, n_blocks, 1)
    q = _unpack(B.reshape(N, n_blocks, blob), bits)  # [N, k_blocks, block_size] uint8
    zp = _zero_points(zero_points, N, n_blocks, bits)
    zp = zp.reshape(N, n_blocks, 1) if zp.ndim else zp
    w = (q.astype(np.float32) - zp) * s  # float32 [N, k_blocks, block_size]
    return np.ascontiguousarray(w.reshape(N, n_blocks * block_size)[:, :K])


def _checked_weights(B, scales, K: int, N: int, bits: int, block_size: int) -> tuple:
    """MatMulNBits' B as uint8 [N, k_blocks * blob_size] and scales as float32 [N, k_blocks], their
    sizes checked against K, N, bits and block_size."""
    n_blocks = -(-K // block_size)
    blob = block_size * bits // 8
    B = np.asarray(B)
    if B.dtype != np.uint8:
        raise TypeError(f"MatMulNBits: B must be uint8 (packed {bits}-bit values), got {B.dtype}")
    if B.size != N * n_blocks * blob:
        raise ValueError(f"MatMulNBits: B has shape {B.shape}, expected [N={N}, k_blocks={n_blocks}, "
                         f"blob_size={blob}] for K={K}, block_size={block_size}, bits={bits}")
    s = np.asarray(scales)
    if s.size != N * n_blocks:
        raise ValueError(f"MatMulNBits: scales has shape {s.shape}, expected [N={N}, k_blocks={n_blocks}]")
    return B.reshape(N, n_blocks * blob), s.astype(np.float32).reshape(N, n_blocks)


def _zero_points(zero_points, N: int, n_blocks: int, bits: int) -> np.ndarray:
    """MatMulNBits' zero points as float32 [N, k_blocks] (a float32 scalar 2^(bits-1) when absent):
    uint8 ones packed like B (low bits first), float ones as they are."""
    if zero_points is None:
        return np.float32(1 << (bits - 1))
    z = np.asarray(zero_points)
    if z.dtype == np.uint8:
        zp_bytes = -(-n_blocks * bits // 8)
        if z.size != N * zp_bytes:
            raise ValueError(f"MatMulNBits: packed uint8 zero_points has shape {z.shape}, expected "
                             f"[N={N}, ceil(k_blocks * bits / 8)={zp_bytes}]")
        return _unpack(z.reshape(N, zp_bytes), bits)[:, :n_blocks].astype(np.float32)
    if z.size != N * n_blocks:
        raise ValueError(f"MatMulNBits: float zero_points has shape {z.shape}, expected [N={N}, k_blocks={n_blocks}]")
    return z.astype(np.float32).reshape(N, n_blocks)


def _int8_operands(B, scales, zero_points, K: int, N: int, bits: int, block_size: int):
    """For the accuracy_level 4 product: the integer weights q - zp as float32 [k_blocks, block_size, N]
    (K padded up to whole blocks with zeros) and the scales [k_blocks, N]."""
    n_blocks = -(-K // block_size)
    w = dequantize_nbits(B, np.ones((N, n_blocks), np.float32), zero_points, K, N, bits, block_size)
    wq = np.zeros((N, n_blocks * block_size), np.float32)
    wq[:, :K] = w
    wq = np.ascontiguousarray(wq.reshape(N, n_blocks, block_size).transpose(1, 2, 0))
    s = np.ascontiguousarray(np.asarray(scales, dtype=np.float32).reshape(N, n_blocks).T)
    return wq, s


def _matmul_int8(a: np.ndarray, wq: np.ndarray, s: np.ndarray, K: int, block_size: int) -> np.ndarray:
    """onnxruntime's accuracy_level 4 (MLAS CompInt8): each block of block_size values of a row of A is
    quantized to int8 symmetrically, scale_a = max|a| / 127, qa = round_half_even(a * 127 / max|a|)
    (0 for an all-zero block); Y[m, n] = sum over blocks of (scale_a * scale_b) * (qa . (q - zp)).
    The integer dot products are exact in float32 (|qa (q - zp)| sums stay below 2^24 for blocks up
    to 8192 values), so only the float sum over blocks can differ from MLAS (a few ulps)."""
    n_blocks = wq.shape[0]
    m = a.reshape(-1, K)
    ap = np.zeros((m.shape[0], n_blocks * block_size), np.float32)
    ap[:, :K] = m
    ab = ap.reshape(-1, n_blocks, block_size)
    amax = np.abs(ab).max(axis=-1)  # [M, k_blocks]
    scale_a = amax / np.float32(127)
    inv = np.float32(127) / np.where(amax != 0, amax, np.float32(1))
    qa = np.rint(ab * np.where(amax != 0, inv, np.float32(0))[..., None])  # float32, integer-valued
    idot = np.matmul(qa.transpose(1, 0, 2), wq)  # [k_blocks, M, N], exact integers
    y = (idot * (scale_a.T[:, :, None] * s[:, None, :])).sum(axis=0, dtype=np.float32)
    return y.reshape(*a.shape[:-1], -1)


def _pack_scales(s: np.ndarray) -> np.ndarray:
    """Per-column, per-block values s [N, k_blocks] in the native kernel's layout: [groups of 16 columns,
    k_blocks, 16] (zeros past N)."""
    N, n_blocks = s.shape
    groups = -(-N // 16)
    padded = np.zeros((groups * 16, n_blocks), np.float32)
    padded[:N] = s
    return np.ascontiguousarray(padded.reshape(groups, 16, n_blocks).transpose(0, 2, 1))


def _pack_nibbles(b: np.ndarray, N: int, block_size: int) -> np.ndarray:
    """4-bit weights b [N, k_blocks * block_size / 2] in the native kernel's layout (minirt/native/
    nbits_impl.h): by groups of 16 columns (zeros past N), per chunk of 32 K values four rows of 64 bytes,
    byte 4 l + t of row i holding q[l, 4 i + t] (low nibble) and q[l, 16 + 4 i + t] (high nibble)."""
    groups, kp = -(-N // 16), b.shape[1] * 2
    q = np.zeros((groups * 16, kp), np.uint8)
    q[:N] = _unpack(b, 4)
    q = q.reshape(groups, 16, kp // 32, 2, 4, 4)  # group, column, chunk, half, row i, t
    return np.ascontiguousarray((q[:, :, :, 0] | (q[:, :, :, 1] << 4)).transpose(0, 2, 3, 1, 4))


def _fused_weights(B, scales, zero_points, K: int, N: int, block_size: int, bias=None):
    """The native kernel's form of constant 4-bit weights (minirt/native/nbits_impl.h): the nibbles, the
    scales and scale * zero point (none for a model without zero points: 8) repacked by groups of 16 columns."""
    b, s = _checked_weights(B, scales, K, N, 4, block_size)
    zs = None if zero_points is None else _pack_scales(s * _zero_points(zero_points, N, s.shape[1], 4))
    return _native.qnbits_weights(_pack_nibbles(b, N, block_size), _pack_scales(s), zs, bias, N, K, block_size)


@kernel("MatMulNBits", since=1, domain=MS, context=True)
def matmul_nbits(A, B, scales, zero_points=None, g_idx=None, bias=None, *, K, N, bits=4, block_size,
                 accuracy_level=0, weight_prepacked=0, ctx=None):
    """Y[..., N] = A[..., K] @ W.T (+ bias[N]), W the dequantized weight (see dequantize_nbits).

    accuracy_level 4 with uint8 or absent zero points (what genai's builder writes for CPU int4):
    onnxruntime quantizes A to int8 per block (see _matmul_int8) and so does this kernel, so that
    results agree to float rounding rather than to int8 rounding (~0.5% of the output range).  Float
    zero points and the other levels: float32 product with the weight dequantized first (onnxruntime
    on x86-64 runs those in fp32; level 2 / 3 (fp16 / bf16 A) only change anything on ARM).  The
    dequantized weight of a constant B is kept per node (float32: 8x the int4 bytes; the native slice
    fuses dequantization into the product instead)."""
    fast = ctx.memo.get("fused") if ctx is not None else None
    if (fast is not None and fast[0] is B and fast[1] is scales and fast[2] is zero_points and bias is None
            and type(A) is np.ndarray and A.dtype == np.float32 and A.flags.c_contiguous and A.shape[-1] == K):
        # (the decode loop's path: the weights this node packed on its first run, nothing else to check)
        rows = A.reshape(-1, K)
        y = np.empty((rows.shape[0], N), np.float32)
        _native.qnbits_matmul(fast[3], rows, y)
        return _native.final(y.reshape(*A.shape[:-1], N))  # (one native call: a program replays it, D123)
    if g_idx is not None:
        raise NotImplementedError("MatMulNBits: the g_idx input (deprecated act-order grouping) is not supported")
    if weight_prepacked:
        raise NotImplementedError(f"MatMulNBits: weight_prepacked={weight_prepacked} (an EP-specific layout) "
                                  "is not supported")
    a, dt = _f32(A)
    if a.shape[-1] != K:
        raise ValueError(f"MatMulNBits: A has shape {a.shape}, its last dimension must be K={K}")
    int8 = int(accuracy_level) == 4 and (zero_points is None or np.asarray(zero_points).dtype == np.uint8)
    memo = ctx.memo if ctx is not None and is_constant(B, scales, zero_points) else None
    fused = int8 and memo is not None and int(bits) == 4 and int(block_size) >= 32 and _native.available
    if fused:  # (one memo entry, the one the fast path above reads: the weights by identity, their packed form)
        if fast is None or fast[0] is not B or fast[1] is not scales or fast[2] is not zero_points:
            fast = (B, scales, zero_points, _fused_weights(B, scales, zero_points, K, N, int(block_size)))
            remember(memo, "fused", fast)
        operands = fast[3]
    else:
        key = ("int8" if int8 else "w", id(B), id(scales), id(zero_points))
        operands = memo.get(key) if memo is not None else None
        if operands is None:
            if int8:
                operands = _int8_operands(B, scales, zero_points, K, N, int(bits), int(block_size))
            else:  # [K, N]
                operands = np.ascontiguousarray(dequantize_nbits(B, scales, zero_points, K, N, int(bits),
                                                                 int(block_size)).T)
            remember(memo, key, operands)
    if fused:
        rows = a.reshape(-1, K)
        rows = rows if rows.flags.c_contiguous else np.ascontiguousarray(rows)
        y = np.empty((rows.shape[0], N), np.float32)
        _native.qnbits_matmul(operands, rows, y)
        y = y.reshape(*a.shape[:-1], N)
    else:
        y = _matmul_int8(a, *operands, K, int(block_size)) if int8 else np.matmul(a, operands)
    if bias is not None:
        b = np.asarray(bias)
        if b.size != N:
            raise ValueError(f"MatMulNBits: bias has shape {b.shape}, expected [N={N}]")
        y += b.astype(np.float32).reshape(N)
    return y if y.dtype == dt else y.astype(dt)


# --------------------------------------------------------------------------- rotary embedding

def _gather_cache(cache: np.ndarray, pos: np.ndarray, what: str) -> np.ndarray:
    if pos.size and (pos.min() < 0 or pos.max() >= cache.shape[0]):
        raise ValueError(f"{what}: position {int(pos.max()) if pos.max() >= cache.shape[0] else int(pos.min())} "
                         f"is outside the cos/sin caches of {cache.shape[0]} positions")
    return cache[pos]


@kernel("RotaryEmbedding", since=1, domain=MS)
def ms_rotary_embedding(input, position_ids, cos_cache, sin_cache, *, interleaved=0, num_heads=0,
                        rotary_embedding_dim=0, is_packed_batching=0, scale=1.0):
    """com.microsoft RotaryEmbedding (note the input order: input, position_ids, cos, sin).

    input [B, S, hidden] (hidden = num_heads * head_size; head_size = 2 * cos width unless num_heads
    is given) or [B, num_heads, S, head_size].  position_ids [B, S] (absolute positions) or [1]
    (the first position: token s is at position_ids[0] + s).  cos_cache / sin_cache
    [max_positions, rotary_dim / 2]; the first rotary_dim features of each head rotate."""
    if is_packed_batching:
        raise NotImplementedError("RotaryEmbedding: is_packed_batching=1 is not supported")
    x, dt = _f32(input)
    cos_c, _ = _f32(cos_cache)
    sin_c, _ = _f32(sin_cache)
    if cos_c.ndim != 2 or cos_c.shape != sin_c.shape:
        raise ValueError(f"RotaryEmbedding: cos_cache {cos_c.shape} and sin_cache {sin_c.shape} must be the same "
                         "2-D shape [max_positions, rotary_dim / 2]")
    if rotary_embedding_dim and rotary_embedding_dim != 2 * cos_c.shape[1]:
        raise ValueError(f"RotaryEmbedding: rotary_embedding_dim={rotary_embedding_dim} but the caches are "
                         f"{cos_c.shape[1]} wide (rotary_dim / 2)")
    if x.ndim == 4:
        xs = x.transpose(0, 2, 1, 3)  # [B, S, H, D]
    elif x.ndim == 3:
        b, s, hidden = x.shape
        nh = int(num_heads) if num_heads else hidden // (2 * cos_c.shape[1])
        if nh <= 0 or hidden % nh:
            raise ValueError(f"RotaryEmbedding: hidden size {hidden} does not divide into num_heads={nh} heads")
        xs = x.reshape(b, s, nh, hidden // nh)
    else:
        raise ValueError(f"RotaryEmbedding: input must be 3-D [B, S, hidden] or 4-D [B, H, S, D], got {x.shape}")
    b, s = xs.shape[0], xs.shape[1]
    pid = np.asarray(position_ids).astype(np.int64)
    if pid.size == 1 and pid.ndim <= 1:
        pos = np.broadcast_to(pid.reshape(()) + np.arange(s), (b, s))
    elif pid.shape == (b, s):
        pos = pid
    else:
        raise ValueError(f"RotaryEmbedding: position_ids has shape {pid.shape}, expected [{b}, {s}] or [1]")
    cos = _gather_cache(cos_c, pos, "RotaryEmbedding")[:, :, None, :]
    sin = _gather_cache(sin_c, pos, "RotaryEmbedding")[:, :, None, :]
    y = rotate_pairs(xs, cos, sin, bool(interleaved))
    y = y.transpose(0, 2, 1, 3) if x.ndim == 4 else y.reshape(x.shape)
    return np.ascontiguousarray(y).astype(dt, copy=False)


# --------------------------------------------------------------------------- RMS norms

def _rms(x: np.ndarray, gamma, epsilon: float, axis: int, op: str, with_inv: bool = True):
    """(x / sqrt(mean(x^2 over axes [axis, rank)) + epsilon) * gamma, 1 / that sqrt), in float32.  Without
    ``with_inv`` the second is None, and the native rows (mrt_rmsnorm_f32) compute the first when built."""
    ax = axis + x.ndim if axis < 0 else axis
    if not 0 <= ax < x.ndim:
        raise ValueError(f"{op}: axis={axis} is out of range for an input of rank {x.ndim}")
    g, _ = _f32(gamma)
    norm_shape = x.shape[ax:]
    if g.shape != norm_shape and g.size != math.prod(norm_shape):
        raise ValueError(f"{op}: scale/gamma has shape {g.shape}, expected {tuple(norm_shape)}")
    if not with_inv and _native.available and x.size:
        y = np.empty(x.shape, np.float32)
        _native.rmsnorm_rows(np.ascontiguousarray(x), np.ascontiguousarray(g.reshape(-1)), y, float(epsilon))
        return _native.final(y), None  # (a copy made on the way is refused by a recording's buffer check)
    axes = tuple(range(ax, x.ndim))
    inv = 1.0 / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + np.float32(epsilon))
    return (x * inv) * g.reshape(norm_shape), inv.astype(np.float32)


def _wants(ctx, i: int) -> bool:
    """Whether the node has an output at position i that something reads (a named one)."""
    return ctx is not None and ctx.n_outputs > i and ctx.output_dtypes[i] is not None


@kernel("SimplifiedLayerNormalization", since=1, context=True)
def simplified_layer_normalization(X, scale, *, axis=-1, epsilon=1e-5, stash_type=1, ctx=None):
    """RMS norm over the axes [axis, rank): Y = X / sqrt(mean(X^2) + epsilon) * scale, computed in
    float32; the optional second output is 1 / sqrt(mean(X^2) + epsilon), keepdims shape."""
    x, dt = _f32(X)
    y, inv = _rms(x, scale, epsilon, int(axis), "SimplifiedLayerNormalization", _wants(ctx, 1))
    outs = (y.astype(dt, copy=False), inv)
    n = ctx.n_outputs if ctx is not None else 1
    return outs[0] if n == 1 else outs[:n]


@kernel("SkipSimplifiedLayerNormalization", since=1, domain=MS, context=True)
def skip_simplified_layer_normalization(input, skip, gamma, bias=None, *, epsilon=1e-5, ctx=None):
    """s = input + skip (+ bias[hidden]); output = RMS norm of s over the last axis times gamma.

    input [B, S, hidden] or [T, hidden]; skip the same shape (onnxruntime also takes a skip that
    broadcasts over the leading dimensions).  Outputs: output, mean (unused: RMS norm has none; an
    empty float32 tensor when asked for), inv_std_var ([..., 1]), input_skip_bias_sum (s)."""
    if (type(input) is np.ndarray and type(skip) is np.ndarray and input.dtype == np.float32
            and skip.dtype == np.float32 and input.shape == skip.shape and input.ndim in (2, 3) and bias is None
            and type(gamma) is np.ndarray and gamma.dtype == np.float32 and gamma.shape == input.shape[-1:]
            and _native.available and not _wants(ctx, 2) and input.size):
        # (a decoder layer's residual + RMS norm: one native add, one native row pass; a program replays
        # both, D123)
        s = np.empty(input.shape, np.float32)
        _native.binary(_native.BINARY_OPS["Add"], np.ascontiguousarray(input), np.ascontiguousarray(skip), s)
        y = np.empty_like(s)
        _native.rmsnorm_rows(s, np.ascontiguousarray(gamma), y, float(epsilon))
        n = ctx.n_outputs if ctx is not None else 1
        return _native.final(y if n == 1 else (y, np.zeros((0,), np.float32), None, s)[:n])
    x, dt = _f32(input)
    sk, _ = _f32(skip)
    if x.ndim not in (2, 3):
        raise ValueError(f"SkipSimplifiedLayerNormalization: input must be 2-D or 3-D, got {x.shape}")
    if sk.shape[-1] != x.shape[-1] or np.broadcast_shapes(sk.shape, x.shape) != x.shape:
        raise ValueError(f"SkipSimplifiedLayerNormalization: skip {sk.shape} does not match input {x.shape}")
    s = x + sk
    if bias is not None:
        bb, _ = _f32(bias)
        if bb.size != x.shape[-1]:
            raise ValueError(f"SkipSimplifiedLayerNormalization: bias has shape {bb.shape}, expected "
                             f"[{x.shape[-1]}]")
        s += bb.reshape(-1)
    y, inv = _rms(s, gamma, epsilon, -1, "SkipSimplifiedLayerNormalization", _wants(ctx, 2))
    n = ctx.n_outputs if ctx is not None else 1
    if n == 1:
        return y.astype(dt, copy=False)
    outs = (y.astype(dt, copy=False), np.zeros((0,), np.float32), inv, s.astype(dt, copy=False))
    return outs[:n]


# --------------------------------------------------------------------------- GroupQueryAttention

_GQA_UNSUPPORTED_INPUTS = {10: "attention_bias", 11: "head_sink", 12: "k_scale", 13: "v_scale",
                           14: "q_norm_weight", 15: "k_norm_weight", 16: "query_seqlens"}


def _attention_numpy(q, present_k, present_v, pasts, totals, scale, softcap, window: int) -> np.ndarray:
    """GroupQueryAttention's attention in numpy (the native one: minirt/native/attention_impl.h): q [B, S,
    H, D] rotated, the caches [B, KVH, T, D] with the new positions written; output [B, S, H * D]."""
    B, S, H, D = q.shape
    KVH = present_k.shape[1]
    group = H // KVH
    q = q.transpose(0, 2, 1, 3)  # [B, H, S, D]
    att = np.empty((B, H, S, D), np.float32)
    rows = np.arange(S)[:, None]
    for b in range(B):
        pb, tb = int(pasts[b]), int(pasts[b]) + S
        kk = present_k[b, :, :tb]  # [KVH, tb, D]
        vv = present_v[b, :, :tb]
        qb = q[b].reshape(KVH, group * S, D)  # q heads h = kvh * group + g share kv head kvh
        logits = np.matmul(qb, kk.transpose(0, 2, 1)) * scale  # [KVH, group * S, tb]
        logits = logits.reshape(KVH, group, S, tb)
        if softcap and softcap > 0:
            c = np.float32(softcap)
            logits = c * np.tanh(logits / c)
        cols = np.arange(tb)[None, :]
        allowed = (cols <= pb + rows) & (cols < int(totals[b]))  # [S, tb]; a padded prompt: keys < total_b
        if window:  # the last W keys, the query's own included
            allowed &= cols > pb + rows - window
        logits = np.where(allowed, logits, np.float32(-np.inf))
        m = logits.max(axis=-1, keepdims=True)
        e = np.exp(logits - m)
        probs = e / e.sum(axis=-1, keepdims=True)
        att[b] = np.matmul(probs.reshape(KVH, group * S, tb), vv).reshape(H, S, D)
    return att.transpose(0, 2, 1, 3).reshape(B, S, H * D)


def _present_buffer(out, j: int, shape: tuple, dt) -> np.ndarray | None:
    """The caller's buffer for output ``j`` when it fits exactly (float32 model, C-contiguous,
    writeable, the present's shape), else None."""
    b = out[j] if type(out) is tuple and j < len(out) else None
    if (type(b) is np.ndarray and dt == np.float32 and b.dtype == np.float32 and b.shape == shape
            and b.flags.c_contiguous and b.flags.writeable):
        return b
    return None


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` are the same bytes (same start, shape and strides)."""
    if a is b:  # (what minirt.genai binds: one array as past input and present output)
        return True
    return (a.shape == b.shape and a.strides == b.strides
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def _zeroed(b: np.ndarray) -> np.ndarray:
    b[...] = 0
    return b


def _gqa_decode(query, past_key, past_value, seqlens_k, total_sequence_length, cos_cache, sin_cache, H: int,
                KVH: int, scale, softcap, local_window_size, do_rotary, interleaved, ctx, ring: bool = False):
    """minirt.genai's decode step, with the general path's checks done cheaply: one sequence, one new
    token, packed QKV, the present buffers the past's own (shared), no position_ids; None when the
    inputs are anything else (the general path then runs and reports what is wrong).  ``ring``: the
    caches are a ring of the local window (sliding_window_cache, :func:`_ring_attention`)."""
    if not (type(query) is np.ndarray and query.dtype == np.float32 and query.flags.c_contiguous
            and query.ndim == 3 and query.shape[:2] == (1, 1) and type(past_key) is np.ndarray
            and past_key.dtype == np.float32 and past_key.flags.c_contiguous and past_key.ndim == 4
            and type(past_value) is np.ndarray and past_value.shape == past_key.shape
            and past_value.dtype == np.float32 and past_value.flags.c_contiguous):
        return None
    qw = query.shape[2]
    D = qw // (H + 2 * KVH)
    T = past_key.shape[2]
    if D * (H + 2 * KVH) != qw or past_key.shape != (1, KVH, T, D) or T == 0:
        return None
    if not (type(seqlens_k) is np.ndarray and seqlens_k.dtype == np.int32 and seqlens_k.size == 1
            and seqlens_k.flags.c_contiguous):
        return None
    try:
        past = int(seqlens_k.reshape(-1)[0])  # (total - 1: the new token's position)
        total_max = int(total_sequence_length.reshape(-1)[0])
    except (AttributeError, IndexError, TypeError, ValueError):
        return None
    # (a program replaying this call reads the position from seqlens_k itself: the C side checks it)
    window = int(local_window_size) if local_window_size is not None and local_window_size > 0 else 0
    if past < 0 or past + 1 > total_max or (past >= T if not ring else window != T):
        return None
    half = 0
    if do_rotary:
        if not (type(cos_cache) is np.ndarray and type(sin_cache) is np.ndarray and cos_cache.dtype == np.float32
                and sin_cache.dtype == np.float32 and cos_cache.flags.c_contiguous and sin_cache.flags.c_contiguous
                and cos_cache.ndim == 2 and sin_cache.shape == cos_cache.shape and 2 * cos_cache.shape[1] <= D
                and past < cos_cache.shape[0]):
            return None
        half = cos_cache.shape[1]
    key = ("decode", T, id(cos_cache) if half else None, ring)
    prepared = ctx.memo.get(key)
    if prepared is None or (half and prepared[1] is not cos_cache):
        prepared = (_native.gqa_decode_prepare(
            H, KVH, D, T, float(np.float32(scale) if scale else np.float32(1.0 / math.sqrt(D))),
            float(softcap) if softcap and softcap > 0 else 0.0, 0 if ring else window,  # (a ring is the window)
            bool(interleaved), cos_cache if half else None, sin_cache if half else None, ring), cos_cache)
        remember(ctx.memo, key, prepared)
    y = np.empty((1, 1, H * D), np.float32)
    _native.gqa_decode(prepared[0], query, seqlens_k, past_key, past_value, y)
    return y


def _ring_attention(query, key, value, past_key, past_value, seqlens_k, position_ids, cos_cache, sin_cache, *,
                    num_heads, kv_num_heads, scale, softcap, local_window_size, do_rotary, rotary_interleaved, ctx,
                    out):
    """GroupQueryAttention with ``sliding_window_cache=1`` (onnxruntime-genai's builder for the sliding-window
    layers of Gemma 2 and the like): past_key / past_value hold only the last W = local_window_size positions,
    as a ring (position p at row p % W; minirt.genai allocates them so, genai_config's sliding_window); the
    present is the same ring with the new positions.  The attention is the local-window one, so this runs
    the general path on a linear copy of the window's positions (rows [p - W + 1, p) of each sequence, the
    others zeros: no query of the window reads them) and writes the last W positions back into the ring.
    The decode step with a shared buffer runs natively on the ring instead (mrt_gqa_decode_f32, ring)."""
    if past_key is None or past_value is None:
        raise ValueError("GroupQueryAttention: sliding_window_cache=1 needs past_key / past_value (the window's ring)")
    pk, dt = _f32(past_key)
    pv, _ = _f32(past_value)
    W = int(local_window_size) if local_window_size is not None else 0
    if pk.ndim != 4 or pv.shape != pk.shape or pk.shape[2] != W or W <= 0:
        raise NotImplementedError(f"GroupQueryAttention: sliding_window_cache=1 with a past of {pk.shape} and "
                                  f"local_window_size={local_window_size}: minirt runs the windowed cache as a ring of "
                                  "exactly the window (genai_config sliding_window.window_size, cache_slack 0)")
    q = np.asarray(query)
    if q.ndim != 3:
        raise ValueError(f"GroupQueryAttention: query must be 3-D [B, S, hidden], got {q.shape}")
    B, S = q.shape[:2]
    seqlens = np.asarray(seqlens_k).astype(np.int64).reshape(-1)
    if seqlens.shape != (B,) or pk.shape[0] != B:
        raise ValueError(f"GroupQueryAttention: seqlens_k has shape {np.shape(seqlens_k)} for a batch of {B}")
    totals = seqlens + 1
    pasts = totals - S
    if (pasts < 0).any():
        raise ValueError(f"GroupQueryAttention: seqlens_k {seqlens.tolist()} does not fit {S} new tokens")
    L = int(totals.max())
    KVH, D = pk.shape[1], pk.shape[3]
    lin_k = np.zeros((B, KVH, L, D), np.float32)
    lin_v = np.zeros((B, KVH, L, D), np.float32)
    for b in range(B):  # the window's past positions, from their ring rows
        rows = np.arange(max(0, int(pasts[b]) - W + 1), int(pasts[b]))
        lin_k[b, :, rows] = pk[b, :, rows % W]
        lin_v[b, :, rows] = pv[b, :, rows % W]
    y, present_k, present_v = group_query_attention(
        query, key, value, lin_k, lin_v, seqlens_k, np.array(L, np.int32), cos_cache, sin_cache, position_ids,
        num_heads=num_heads, kv_num_heads=kv_num_heads, scale=scale, softcap=softcap, local_window_size=W,
        do_rotary=do_rotary, rotary_interleaved=rotary_interleaved, ctx=_THREE_OUTPUTS)
    ring_k = _present_buffer(out, 1, pk.shape, dt)
    ring_v = _present_buffer(out, 2, pk.shape, dt)
    if ring_k is None or not _same_memory(ring_k, pk):
        ring_k = pk.copy() if ring_k is None else _copied(ring_k, pk)
    if ring_v is None or not _same_memory(ring_v, pv):
        ring_v = pv.copy() if ring_v is None else _copied(ring_v, pv)
    for b in range(B):  # the last W positions back into the ring
        rows = np.arange(max(0, int(totals[b]) - W), int(totals[b]))
        ring_k[b, :, rows % W] = present_k[b, :, rows]
        ring_v[b, :, rows % W] = present_v[b, :, rows]
    outs = (y.astype(dt, copy=False), ring_k, ring_v)
    return outs[:ctx.n_outputs] if ctx is not None else outs


class _ThreeOutputs:
    """The context of the general GroupQueryAttention run inside :func:`_ring_attention`: all three outputs
    wanted, no memo (``ctx.n_outputs`` is all the general path reads; out=None keeps the fast path away)."""
    n_outputs = 3


_THREE_OUTPUTS = _ThreeOutputs()


def _copied(buffer: np.ndarray, src: np.ndarray) -> np.ndarray:
    buffer[...] = src
    return buffer


@kernel("GroupQueryAttention", since=1, domain=MS, context=True, outs=True)
def group_query_attention(query, key=None, value=None, past_key=None, past_value=None, seqlens_k=None,
                          total_sequence_length=None, cos_cache=None, sin_cache=None, position_ids=None,
                          *extra, num_heads, kv_num_heads, scale=0.0, softcap=0.0, local_window_size=-1,
                          do_rotary=0, rotary_interleaved=0, causal=1, smooth_softmax=0, qk_output=0,
                          sliding_window_cache=0, kv_cache_bit_width=0, k_quant_type="NONE",
                          v_quant_type="NONE", qk_norm_epsilon=1e-6, q_norm_epsilon=1e-6, k_norm_epsilon=1e-6,
                          ctx=None, out=None):
    """onnxruntime's GroupQueryAttention, CPU semantics, float32.

    query [B, S, num_heads * D] (or packed [B, S, (num_heads + 2 * kv_num_heads) * D] with key and
    value absent), key / value [B, S, kv_num_heads * D]; past_key / past_value [B, kv_num_heads, P, D]
    (BNSH; P may be 0 or a preallocated max length); seqlens_k int32 [B] = total length of each
    sequence - 1; total_sequence_length int32 scalar = the batch maximum of those totals.

    Per sequence b: total_b = seqlens_k[b] + 1.  First prompt (S == total_sequence_length and no
    past): past_b = 0; otherwise past_b = total_b - S (the new tokens follow the past ones).
    present[b, :, :past_b] = past[b, :, :past_b], present[b, :, past_b:past_b + S] = new k / v;
    present has max(P, total_sequence_length) positions, rows past each sequence's total are zeros.
    With do_rotary, q and the new k are rotated (cos_cache / sin_cache [max_pos, rotary_dim / 2];
    the first rotary_dim features of each head) at positions past_b + s, or position_ids [B, S]
    (of a first prompt onnxruntime reads only position_ids[0, 0]: every sequence at position_ids[0, 0] + s).
    Query row s of sequence b attends to keys j <= past_b + s (causal) and j < total_b (a right-padded
    first prompt: its padding rows see the real tokens only; their keys still go to present), and, with
    local_window_size = W > 0, only to the last W of them: j > past_b + s - W; q head h reads kv head h // (num_heads / kv_num_heads).
    logits = scale * q.k (scale 0: 1/sqrt(D)), softcap c > 0: c * tanh(logits / c); softmax; @ v.
    Outputs: output [B, S, num_heads * D], present_key, present_value.

    ``out`` (IOBinding runs, registry ``outs=True``): the caller's buffers for (output, present_key,
    present_value).  A present buffer that is the past input's own memory (onnxruntime's
    past_present_share_buffer; what minirt.genai binds) is appended to in place: only the S new
    positions are written, the past is not copied and positions past each sequence's total keep
    what they held.  Another exactly fitting present buffer is filled directly (zeros past the totals)."""
    for i, t in enumerate(extra, start=10):
        if t is not None:
            raise NotImplementedError(f"GroupQueryAttention: the {_GQA_UNSUPPORTED_INPUTS.get(i, f'#{i}')} input "
                                      "is not supported")
    if smooth_softmax or qk_output or not causal:
        raise NotImplementedError("GroupQueryAttention: smooth_softmax, qk_output and causal=0 are not supported (got "
                                  f"{smooth_softmax}, {qk_output}, {causal})")
    if kv_cache_bit_width or k_quant_type not in ("", "NONE") or v_quant_type not in ("", "NONE"):
        raise NotImplementedError("GroupQueryAttention: a quantized KV cache is not supported")
    if (type(out) is tuple and len(out) == 3 and key is None and past_key is not None and position_ids is None
            and out[1] is past_key and out[2] is past_value and _native.available and ctx is not None):
        y = _gqa_decode(query, past_key, past_value, seqlens_k, total_sequence_length, cos_cache, sin_cache,
                        int(num_heads), int(kv_num_heads), scale, softcap, local_window_size, do_rotary,
                        rotary_interleaved, ctx, ring=bool(sliding_window_cache))
        if y is not None:  # (one native call: the caches written in place, the output its own)
            return _native.final((y, past_key, past_value)[:ctx.n_outputs])
    if sliding_window_cache:
        return _ring_attention(query, key, value, past_key, past_value, seqlens_k, position_ids, cos_cache, sin_cache,
                               num_heads=num_heads, kv_num_heads=kv_num_heads, scale=scale, softcap=softcap,
                               local_window_size=local_window_size, do_rotary=do_rotary,
                               rotary_interleaved=rotary_interleaved, ctx=ctx, out=out)
    H, KVH = int(num_heads), int(kv_num_heads)
    if H <= 0 or KVH <= 0 or H % KVH:
        raise ValueError(f"GroupQueryAttention: num_heads={H} must be a positive multiple of kv_num_heads={KVH}")
    q, dt = _f32(query)
    if q.ndim != 3:
        raise ValueError(f"GroupQueryAttention: query must be 3-D [B, S, hidden], got {q.shape}")
    B, S, qw = q.shape
    if key is None:  # packed QKV
        if value is not None:
            raise ValueError("GroupQueryAttention: value given without key")
        if qw % (H + 2 * KVH):
            raise ValueError(f"GroupQueryAttention: packed QKV width {qw} is not (num_heads + 2 * kv_num_heads) = "
                             f"{H + 2 * KVH} heads of one size")
        D = qw // (H + 2 * KVH)
        raw = ((q, 0), (q, H * D), (q, (H + KVH) * D))  # (array, offset of the head values in a row)
        k = q[..., H * D:(H + KVH) * D]
        v = q[..., (H + KVH) * D:]
        q = q[..., : H * D]
    else:
        if value is None:
            raise ValueError("GroupQueryAttention: key given without value")
        if qw % H:
            raise ValueError(f"GroupQueryAttention: query hidden size {qw} does not divide into num_heads={H} heads")
        D = qw // H
        k, _ = _f32(key)
        v, _ = _f32(value)
        for name, t in (("key", k), ("value", v)):
            if t.shape != (B, S, KVH * D):
                raise ValueError(f"GroupQueryAttention: {name} has shape {t.shape}, expected [{B}, {S}, "
                                 f"kv_num_heads * head_size = {KVH * D}]")
        raw = ((q, 0), (k, 0), (v, 0))
    if seqlens_k is None or total_sequence_length is None:
        raise ValueError("GroupQueryAttention: seqlens_k and total_sequence_length are required")
    seqlens = np.asarray(seqlens_k).astype(np.int64).reshape(-1)
    if seqlens.shape != (B,):
        raise ValueError(f"GroupQueryAttention: seqlens_k has shape {np.shape(seqlens_k)}, expected [{B}]")
    total_max = int(np.asarray(total_sequence_length).reshape(-1)[0])
    if (past_key is None) != (past_value is None):
        raise ValueError("GroupQueryAttention: past_key and past_value go together")
    P = 0
    if past_key is not None:
        pk, _ = _f32(past_key)
        pv, _ = _f32(past_value)
        if pk.ndim != 4 or pk.shape[:2] != (B, KVH) or pk.shape[3] != D or pv.shape != pk.shape:
            raise ValueError(f"GroupQueryAttention: past_key {pk.shape} / past_value {pv.shape} must be "
                             f"[B={B}, kv_num_heads={KVH}, past_length, head_size={D}]")
        P = pk.shape[2]
    first_prompt = P == 0 or (S == total_max and S > 1)
    totals = seqlens + 1
    pasts = np.zeros(B, np.int64) if first_prompt else totals - S
    if (pasts < 0).any() or (not first_prompt and (pasts > P).any()):
        raise ValueError(f"GroupQueryAttention: seqlens_k {seqlens.tolist()} does not fit {S} new tokens after a "
                         f"past of {P} positions")
    if totals.max() > total_max:
        raise ValueError(f"GroupQueryAttention: seqlens_k {seqlens.tolist()} exceeds total_sequence_length={total_max}")
    T = max(P, total_max)
    if (pasts + S > T).any():
        b = int(np.argmax(pasts + S > T))
        raise ValueError(f"GroupQueryAttention: sequence {b} needs {int(pasts[b]) + S} positions, the present "
                         f"holds {T}")

    pos = cos_c = sin_c = None
    if do_rotary:
        if cos_cache is None or sin_cache is None:
            raise ValueError("GroupQueryAttention: do_rotary=1 needs cos_cache and sin_cache")
        cos_c, _ = _f32(cos_cache)
        sin_c, _ = _f32(sin_cache)
        if cos_c.ndim != 2 or sin_c.shape != cos_c.shape or 2 * cos_c.shape[1] > D:
            raise ValueError(f"GroupQueryAttention: cos_cache {cos_c.shape} / sin_cache {sin_c.shape} must be "
                             f"[max_position, rotary_dim / 2] with rotary_dim <= head_size={D}")
        if position_ids is not None:
            pos = np.asarray(position_ids).astype(np.int64)
            if pos.shape != (B, S):
                raise ValueError(f"GroupQueryAttention: position_ids has shape {pos.shape}, expected [{B}, {S}]")
            if first_prompt and S > 1:  # onnxruntime reads only position_ids[0, 0] of a first prompt
                pos = np.broadcast_to(pos[0, 0] + np.arange(S)[None, :], (B, S))
        else:
            pos = pasts[:, None] + np.arange(S)[None, :]
        if pos.size and (pos.min() < 0 or pos.max() >= cos_c.shape[0]):
            bad = int(pos.max()) if pos.max() >= cos_c.shape[0] else int(pos.min())
            raise ValueError(f"GroupQueryAttention: position {bad} is outside the cos/sin caches of "
                             f"{cos_c.shape[0]} positions")

    present_k = _present_buffer(out, 1, (B, KVH, T, D), dt)
    present_v = _present_buffer(out, 2, (B, KVH, T, D), dt)
    shared = (past_key is not None and present_k is not None and present_v is not None and P == T
              and _same_memory(present_k, pk) and _same_memory(present_v, pv))
    if not shared:  # (a present of its own: zeros past each sequence's total, as onnxruntime's)
        present_k = np.zeros((B, KVH, T, D), np.float32) if present_k is None else _zeroed(present_k)
        present_v = np.zeros((B, KVH, T, D), np.float32) if present_v is None else _zeroed(present_v)
        for b in range(B):  # the past, below the S new positions
            pb = int(pasts[b])
            if pb:
                present_k[b, :, :pb] = pk[b, :, :pb]
                present_v[b, :, :pb] = pv[b, :, :pb]
    s_ = np.float32(scale) if scale else np.float32(1.0 / math.sqrt(D))
    window = int(local_window_size) if local_window_size is not None and local_window_size > 0 else 0
    cap = float(softcap) if softcap and softcap > 0 else 0.0
    if _native.available:  # rotary, the cache writes and the attention in one call (attention_impl.h)
        y = np.empty((B, S, H * D), np.float32)
        raw = tuple((np.ascontiguousarray(a), off) for a, off in raw)
        _native.gqa_step(raw, H, KVH, D, None if pos is None else np.ascontiguousarray(pos, np.int64),
                         None if cos_c is None else np.ascontiguousarray(cos_c),
                         None if sin_c is None else np.ascontiguousarray(sin_c), bool(rotary_interleaved),
                         present_k, present_v, np.ascontiguousarray(pasts, np.int64),
                         np.ascontiguousarray(totals, np.int64), y, float(s_), cap, window)
    else:
        q = q.reshape(B, S, H, D)
        k = k.reshape(B, S, KVH, D)
        if do_rotary:
            cos = cos_c[pos][:, :, None, :]
            sin = sin_c[pos][:, :, None, :]
            q = rotate_pairs(q, cos, sin, bool(rotary_interleaved))
            k = rotate_pairs(k, cos, sin, bool(rotary_interleaved))
        k = k.transpose(0, 2, 1, 3)  # [B, KVH, S, D]
        v = v.reshape(B, S, KVH, D).transpose(0, 2, 1, 3)
        for b in range(B):  # the S new positions
            pb = int(pasts[b])
            present_k[b, :, pb:pb + S] = k[b]
            present_v[b, :, pb:pb + S] = v[b]
        y = _attention_numpy(q, present_k, present_v, pasts, totals, s_, cap, window)
    outs = (y.astype(dt, copy=False), present_k.astype(dt, copy=False), present_v.astype(dt, copy=False))
    n = ctx.n_outputs if ctx is not None else 1
    return outs[0] if n == 1 else outs[:n]
