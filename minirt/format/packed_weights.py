"""Weights pre-packed by the builder for the native kernels (the optional ``packed_weights`` section).

The native float kernels read some constant weights in a packed layout (minirt/native/gemm_impl.h):

* ``conv_f32``: the weights of a convolution that takes the channel-vector kernel
  (``FN(conv_cv_pack_w)``): per group, panels of ``nr`` output channels, each K = C/group*KH*KW rows
  of ``nr`` contiguous floats (channels past the group's count zero);
* ``conv_winograd_f32``: the weights of a 3x3 convolution that takes the Winograd F(2x2, 3x3) path
  (``mrt_conv2d_winograd_pack_w``): U = G g G^T of each (output, input) channel pair, stored
  [16][M][C] (position xi = 4 i + j of the 4 x 4 transform, then output channel, then input channel);
  the same on every ISA, entered with the panel width of the ISA whose rule takes it (16: AVX2);
* ``sgemm_b``: the constant right operand B (K x N) of a MatMul / Gemm, or the input weights W
  (D, G*H, I) of an LSTM / GRU as B = its D*G*H rows transposed (``FN(sgemm_pack_b_all)``):
  for each block of K of depth :func:`sgemm_kc` (block p0 at p0 * ld floats, ld = N rounded up to
  ``nr``), the panels of ``nr`` columns (panel j at + j * nr * kb), each kb rows of ``nr`` floats
  (the last panel zero-padded).

``nr`` (the panel width) is the kernels' G_NR = 2 x the vector width: 32 on AVX-512, 16 on AVX2, 8 on
SSE2 (baseline) and NEON.  The runtime packs lazily on a layer's first run (``minirt/native``'s
``_cached_pack``); a builder that knows the target's panel width can store the packed forms instead
(``--weight-pack N``), and a runtime whose kernels use that width seeds its cache with views of them.

This module is numpy only, so the builder packs without the native library and for a width other
than its own CPU's: tests/native/test_packed_weights.py checks it byte for byte against the native
packers at every ISA level of the test machine.  It also defines the section's encoding
(docs/format.md, "Packed weights (kind 9)") and decodes it for the reader.
"""
from __future__ import annotations

import collections
import struct

import numpy as np

from minirt.errors import FormatError
from minirt.format import schema as S

# Entry kinds (the packed form's meaning).
PACK_CONV_F32 = 1
PACK_SGEMM_B = 2
PACK_CONV_WINOGRAD = 3
PACK_KIND_NAMES = {PACK_CONV_F32: "conv_f32", PACK_SGEMM_B: "sgemm_b",
                   PACK_CONV_WINOGRAD: "conv_winograd_f32"}

# Panel widths a kernel build uses (G_NR = 2 x the vector width of 4, 8 or 16 floats).
PANEL_WIDTHS = (8, 16, 32)

# Section payload: u32 entry count, u32 reserved (0), then count entries of ENTRY (64 bytes each),
# then the packed data, each entry's at ``offset`` bytes from the start of the payload (a multiple of
# 64: the section itself starts on a 64-byte boundary, so every packed array is 64-byte aligned).
HEADER = struct.Struct("<II")
#   kind u32, tensor u32 (index in the tensor table: the weight it packs), nr u32 (panel width),
#   kc u32 (K-block depth for sgemm_b, 0 for conv_f32), tag i32[8], offset u64, nbytes u64
#   tag, conv_f32: C (input channels), group, KH, KW, SH, SW, OH, OW (OH / OW 0: dynamic in the file)
#   tag, sgemm_b:  transb (the tensor is stored N x K), K, N, 0, 0, 0, 0, 0
#   tag, conv_winograd_f32: as conv_f32 (C, group 1, KH 3, KW 3, SH 1, SW 1, OH, OW)
ENTRY = struct.Struct("<IIII8iQQ")
assert HEADER.size == 8 and ENTRY.size == 64

# The K-block depth rule of FN(sgemm_kc) (G_KC = 256; up to 5/4 of it stays one block).
_G_KC = 256

# Geometry rule of mrt_conv2d_uses_packed_w (minirt/native/kernels.c), constants of the same names.
_CONV_CV_DEEP_K = 192
_CONV_CV_SMALL_PLANE = 1024
_CONV_CV_STRIDED_K = 144
_CONV_CV_SHALLOW_K = 32
_CONV_CV_TINY_PLANE = 256
_CONV_CV_MAX_ROW = 256
_CONV_CV_NARROW_1X1_M = 64  # (MRT_CONV_CV_NARROW_1X1_M / _K: AVX2's 1x1 projections)
_CONV_CV_NARROW_1X1_K = 128
_CONV_CV_WIDE_1X1_M = 256  # (MRT_CONV_CV_WIDE_1X1_M: AVX-512's wide 1x1 layers, D138)
_CONV_CV_SMALL_1X1_M = 128  # (MRT_CONV_CV_SMALL_1X1_M / _PLANE: AVX-512's 1x1 expansions on small planes, D157)
_CONV_CV_SMALL_1X1_PLANE = 256
# Geometry rule of mrt_conv2d_uses_winograd (kernels.c), constants of the same names.
_WINO_MIN_PAIRS = 1024
_WINO_MIN_CHANNELS = 16
_WINO_MAX_CHANNELS = 256
_WINO_MIN_PLANE = 49
_WINO_PANEL = 16


PackedWeight = collections.namedtuple("PackedWeight", "kind tensor nr kc tag data")
PackedWeight.__doc__ = """One decoded entry: the weight tensor ``tensor`` packed as ``kind`` with panel width ``nr`` and
K blocks of ``kc``; ``tag`` as the runtime's cache key spells it (see :func:`cache_tag`);
``data`` a read-only float32 view of the packed floats in the file."""


def sgemm_kc(k: int) -> int:
    """Depth of the K blocks of a packed B (FN(sgemm_kc) in minirt/native/gemm_impl.h)."""
    kblocks = (k + _G_KC - 1) // _G_KC if k > _G_KC * 5 // 4 else 1
    kc = (k + kblocks - 1) // kblocks
    return kc if kc > 0 else 1


def runs_down_a_column(in_w: int, kw: int, ow: int, pad_w_begin: int) -> bool:
    """Whether a 2-D conv is a k x 1 kernel down a width-1 image (magika's 5 x 1 over 512 x 1): the
    runtime then runs it as the 1-D conv along H of the same memory, seen as (N, C, 1, H)
    (minirt/kernels/nn.py, D83), and the builder packs its weights for that geometry."""
    return in_w == 1 and kw == 1 and ow == 1 and pad_w_begin == 0


def conv_uses_packed_w(c: int, m: int, group: int, kh: int, kw: int, sh: int, sw: int, oh: int, ow: int,
                       nr: int) -> bool:
    """Whether the native conv runs this geometry on packed weights of panel width ``nr``: a copy of
    ``mrt_conv2d_uses_packed_w`` (kernels.c), which the builder cannot call without the native
    library; tests/native/test_packed_weights.py checks the two agree over a grid of geometries."""
    if group < 1 or c % group or m % group:
        return False
    if oh == 1 and ow > _CONV_CV_MAX_ROW:
        return False
    if group == 1 and kh * kw == 1 and sh == 1 and sw == 1 and oh == 1 and ow == 1:
        return False  # (the dense path: conv_is_dense in kernels.c)
    if (kh * kw == 1 and sh == 1 and sw == 1 and nr == 16 and (m // group) % 16 == 0
            and m // group <= _CONV_CV_NARROW_1X1_M and c // group >= _CONV_CV_NARROW_1X1_K):
        return True
    if (group == 1 and kh * kw == 1 and sh == 1 and sw == 1 and nr == 32 and m >= _CONV_CV_WIDE_1X1_M
            and c >= _CONV_CV_DEEP_K):
        return True
    if (m // group) % 32 != 0:  # (the grouped rule: conv_cv_grouped in kernels.c)
        grouped = group > 1 and nr <= 16 and ((m // group) % nr == 0 or 2 * (m // group) == nr)
        return kh * kw > 1 and (oh * ow <= _CONV_CV_TINY_PLANE or grouped)
    if (group == 1 and kh * kw == 1 and sh == 1 and sw == 1 and nr == 32 and m >= _CONV_CV_SMALL_1X1_M
            and oh * ow <= _CONV_CV_SMALL_1X1_PLANE):
        return True
    k = c // group * kh * kw
    if kh * kw == 1 and nr == 16:  # (panels of 16: AVX2)
        return False
    if k >= _CONV_CV_DEEP_K:
        return True
    if kh * kw == 1:
        return False
    if sh == 1 and sw == 1 and nr == 32 and k >= _CONV_CV_SHALLOW_K:  # (AVX-512 panels: stride-1 window convs
        return True  # at any plane, from a depth of _CONV_CV_SHALLOW_K)
    return oh * ow <= _CONV_CV_SMALL_PLANE or ((sh > 1 or sw > 1) and k >= _CONV_CV_STRIDED_K)


def conv_uses_winograd(c: int, m: int, group: int, kh: int, kw: int, sh: int, sw: int, dh: int, dw: int, oh: int,
                       ow: int, nr: int) -> bool:
    """Whether the native conv runs this geometry as a Winograd F(2x2, 3x3) convolution on kernels of panel
    width ``nr``: a copy of ``mrt_conv2d_uses_winograd`` (kernels.c), checked against it by
    tests/native/test_packed_weights.py."""
    return (nr == _WINO_PANEL and group == 1 and (kh, kw, sh, sw, dh, dw) == (3, 3, 1, 1, 1, 1)
            and _WINO_MIN_CHANNELS <= c <= _WINO_MAX_CHANNELS and _WINO_MIN_CHANNELS <= m <= _WINO_MAX_CHANNELS
            and c * m >= _WINO_MIN_PAIRS and oh * ow >= _WINO_MIN_PLANE)


# The int8 Winograd route's rule (qwinograd_avx2.h, q_winograd_fits, on AVX2 without VNNI): at most this many
# input channels (its integer sums stay below 2^31), and 20 c + 8 m <= c m.
_QWINO_MAX_CHANNELS = 1024


def qconv_uses_winograd(c: int, m: int, group: int, kh: int, kw: int, sh: int, sw: int, dh: int, dw: int, pt: int,
                        pl: int) -> bool:
    """Whether the int8 conv runs this geometry as Winograd F(2x2, 3x3) on a CPU that has the route (AVX2
    without VNNI): a copy of ``q_winograd_fits``'s geometry rule (qwinograd_avx2.h), checked against
    ``mrt_qconv_uses_winograd`` by tests/native/test_qconv_winograd.py."""
    return (group == 1 and (kh, kw, sh, sw, dh, dw) == (3, 3, 1, 1, 1, 1) and 0 <= pt <= 2 and 0 <= pl <= 2
            and c <= _QWINO_MAX_CHANNELS and 20 * c + 8 * m <= c * m)


def pack_winograd_w(w: np.ndarray) -> np.ndarray:
    """The (M, C, 3, 3) float32 weights ``w`` transformed as mrt_conv2d_winograd_pack_w does, bit for bit (the
    same float32 operations in the same order): U = G g G^T, [16][M][C] flattened."""
    g = np.asarray(w, np.float32)
    half = np.float32(0.5)
    rows = [g[:, :, 0], half * (g[:, :, 0] + g[:, :, 1] + g[:, :, 2]), half * (g[:, :, 0] - g[:, :, 1] + g[:, :, 2]),
            g[:, :, 2]]  # G g: 4 rows of (M, C, 3)
    out = np.empty((4, 4) + g.shape[:2], np.float32)
    for i, t in enumerate(rows):
        out[i, 0] = t[..., 0]
        out[i, 1] = half * (t[..., 0] + t[..., 1] + t[..., 2])
        out[i, 2] = half * (t[..., 0] - t[..., 1] + t[..., 2])
        out[i, 3] = t[..., 2]
    return out.reshape(-1)


def conv_packed_floats(m: int, group: int, k: int, nr: int) -> int:
    """Floats of a packed conv weight (FN(conv_cv_packed_floats))."""
    mg = m // group
    return group * ((mg + nr - 1) // nr) * k * nr


def sgemm_packed_floats(k: int, n: int, nr: int) -> int:
    """Floats of a packed B (FN(sgemm_packed_b_floats))."""
    return k * ((n + nr - 1) // nr * nr)


def pack_conv_w(w: np.ndarray, group: int, nr: int) -> np.ndarray:
    """The (M, C/group, KH, KW) float32 weights ``w`` in the layout of FN(conv_cv_pack_w) for panel
    width ``nr``: a flat float32 array of :func:`conv_packed_floats` elements."""
    m = w.shape[0]
    mg, k = m // group, w[0].size
    panels = (mg + nr - 1) // nr
    padded = np.zeros((group, panels * nr, k), np.float32)
    padded[:, :mg] = np.asarray(w, np.float32).reshape(group, mg, k)
    # (group, panel, channel in panel, k) -> (group, panel, k, channel in panel)
    return np.ascontiguousarray(padded.reshape(group, panels, nr, k).transpose(0, 1, 3, 2)).reshape(-1)


def pack_sgemm_b(b: np.ndarray, transb: int, nr: int) -> np.ndarray:
    """The right operand of a product in the layout of FN(sgemm_pack_b_all) for panel width ``nr``:
    ``b`` float32 (K, N), or (N, K) with ``transb``; a flat float32 array of
    :func:`sgemm_packed_floats` elements."""
    bk = np.asarray(b, np.float32).T if transb else np.asarray(b, np.float32)
    k, n = bk.shape
    kc, ld = sgemm_kc(k), (n + nr - 1) // nr * nr
    panels = ld // nr
    out = np.empty(k * ld, np.float32)
    for p0 in range(0, k, kc):
        kb = min(kc, k - p0)
        block = np.zeros((kb, ld), np.float32)
        block[:, :n] = bk[p0:p0 + kb]
        # (row, panel, column in panel) -> (panel, row, column in panel)
        out[p0 * ld:(p0 + kb) * ld] = block.reshape(kb, panels, nr).transpose(1, 0, 2).reshape(-1)
    return out


def cache_tag(kind: int, tag: tuple) -> tuple:
    """The runtime's cache key for an entry (minirt/native: ``conv2d_prepare`` / ``sgemm_pack_b``)."""
    if kind == PACK_CONV_F32:  # (the panels depend on the weight and its group, not on the geometry)
        return ("conv_f32", int(tag[1]))
    if kind == PACK_CONV_WINOGRAD:  # (the transformed weights depend on the weight alone)
        return ("conv_winograd_f32",)
    transb, k, n = tag[:3]
    return ("sgemm_b", transb, k, n)


def encode(entries: list[tuple[int, int, int, tuple, np.ndarray]]) -> bytes:
    """The section payload for ``[(kind, tensor index, nr, tag, packed float32 array)]``."""
    table = [HEADER.pack(len(entries), 0)]
    data, offset = [], S.aligned_size(HEADER.size + ENTRY.size * len(entries))
    start = offset
    for kind, tensor, nr, tag, packed in entries:
        payload = np.ascontiguousarray(packed, dtype="<f4").tobytes()
        kc = sgemm_kc(tag[1]) if kind == PACK_SGEMM_B else 0
        table.append(ENTRY.pack(kind, tensor, nr, kc, *(tuple(tag) + (0,) * (8 - len(tag))), offset, len(payload)))
        pad = S.padding_required(len(payload))
        data.append(payload + b"\x00" * pad)
        offset += len(payload) + pad
    head = b"".join(table)
    return head + b"\x00" * (start - len(head)) + b"".join(data)


def decode(payload: memoryview, tensors: tuple) -> tuple:
    """The entries of a packed-weights section payload, checked against the tensor table ``tensors``
    (their records): every malformed entry raises FormatError naming it."""
    size = len(payload)
    if size < HEADER.size:
        raise FormatError(f"malformed packed_weights section: {size} bytes, too short for its header")
    count, _ = HEADER.unpack_from(payload, 0)
    if count > (size - HEADER.size) // ENTRY.size:
        raise FormatError(f"malformed packed_weights section: {count} entries cannot fit in {size} bytes")
    out = []
    for i in range(count):
        kind, tensor, nr, kc, *fields = ENTRY.unpack_from(payload, HEADER.size + i * ENTRY.size)
        tag, offset, nbytes = tuple(fields[:8]), fields[8], fields[9]
        where = f"packed_weights entry {i}"
        if kind not in PACK_KIND_NAMES:
            raise FormatError(f"{where}: unknown layout kind {kind}")
        if nr not in PANEL_WIDTHS:
            raise FormatError(f"{where}: unknown panel width {nr} (expected one of {PANEL_WIDTHS})")
        if tensor >= len(tensors):
            raise FormatError(f"{where}: tensor index {tensor} is out of range [0, {len(tensors)})")
        rec = tensors[tensor]
        if rec.dtype != 1:  # float32
            raise FormatError(f"{where}: tensor {tensor} is not float32 (dtype code {rec.dtype})")
        expected, tag = _check_tag(where, kind, kc, tag, rec.dims, nr)
        if nbytes != expected * 4:
            raise FormatError(f"{where}: {nbytes} bytes, but its tag needs {expected * 4}")
        if offset % S.ALIGNMENT or offset < HEADER.size + ENTRY.size * count or offset + nbytes > size:
            raise FormatError(f"{where}: data [{offset}, {offset + nbytes}) is misaligned or outside the "
                              f"section's data ({size} bytes)")
        data = np.frombuffer(payload, dtype="<f4", count=expected, offset=offset)
        out.append(PackedWeight(kind, tensor, nr, kc, cache_tag(kind, tag), data))
    return tuple(out)


def _check_tag(where: str, kind: int, kc: int, tag: tuple, dims: tuple, nr: int) -> tuple:
    """(packed floats, tag fields in use) of an entry whose tag agrees with its tensor's ``dims``."""
    if kind == PACK_CONV_WINOGRAD:
        c, group, kh, kw, sh, sw, oh, ow = tag
        if len(dims) != 4 or tuple(dims[2:]) != (3, 3) or (group, kh, kw, sh, sw) != (1, 3, 3, 1, 1) \
                or dims[1] != c or min(oh, ow) < 0 or kc != 0:
            raise FormatError(f"{where}: Winograd conv tag {list(tag)} (kc {kc}) does not fit a weight of shape "
                              f"{list(dims)}")
        return 16 * dims[0] * dims[1], tag
    if kind == PACK_CONV_F32:
        c, group, kh, kw, sh, sw, oh, ow = tag
        # (OH / OW 0: that output size is dynamic in the file; the pack is the same at every size)
        if len(dims) not in (3, 4) or min(tag[:6]) < 1 or min(oh, ow) < 0 or kc != 0:
            raise FormatError(f"{where}: conv tag {list(tag)} (kc {kc}) does not fit a weight of shape {list(dims)}")
        m, cg = dims[:2]
        kernel = tuple(dims[2:]) if len(dims) == 4 else (1, dims[2])  # (a 1-D conv: a 1 x K kernel, one row)
        # (a K x 1 kernel down a width-1 image runs as the 1-D conv along H: tag 1 x K, one output row)
        down_a_column = len(dims) == 4 and dims[3] == 1 and (kh, kw) == (1, dims[2]) and oh == 1
        if ((kh, kw) != kernel and not down_a_column) or (len(dims) == 3 and oh != 1) or m % group \
                or cg * group != c:
            raise FormatError(f"{where}: conv tag {list(tag)} does not match the weight's shape {list(dims)}")
        return conv_packed_floats(m, group, cg * kh * kw, nr), tag
    transb, k, n = tag[:3]
    # (rank 3 with transb: an LSTM / GRU's W (D, G*H, I), its D*G*H rows of K = I floats)
    if len(dims) not in (2, 3) or len(dims) == 3 and transb != 1 or transb not in (0, 1) or any(tag[3:]) \
            or k < 1 or n < 1:
        raise FormatError(f"{where}: product tag {list(tag)} does not fit a weight of shape {list(dims)}")
    rows_by_cols = (dims[0] * dims[1], dims[2]) if len(dims) == 3 else tuple(dims)
    if rows_by_cols != ((n, k) if transb else (k, n)):
        raise FormatError(f"{where}: product tag (transb {transb}, K {k}, N {n}) does not match the weight's "
                          f"shape {list(dims)}")
    if not 1 <= kc <= k:
        raise FormatError(f"{where}: K blocks of {kc} for K = {k}")
    return sgemm_packed_floats(k, n, nr), tag[:3]
