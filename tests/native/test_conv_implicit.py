"""The implicit-GEMM float convolution (mrt_conv2d_f32 on images with a GEMM of their own).

Such images skip im2col: the input is copied once into zero-padded, stride-phase-split
planes and the GEMM reads its B rows straight from them (3x3 taps are shifted views of
the same rows), computing wq - ow dropped columns per output row (kernels.c,
gemm_impl.h).  A 1x1 / stride 1 / unpadded kernel reads the image itself.  The
geometries below all take that path (at most a quarter of the columns dropped, or 1x1):
odd channel counts, K past one packed block (balanced K blocks), rectangular kernels,
padding on every side, strides and dilations (stride phases no tap reads), images split
into bands of output rows, small planes, groups, batches, the fused residual and
activations, threads 1 and 2, every ISA.  The reference is a float64 numpy convolution
written tap by tap, independent of minirt.
"""
from __future__ import annotations

import numpy as np
import pytest

from minirt import native
from minirt.kernels import nn
from tests.native.test_native_kernels import _np_act

pytestmark = pytest.mark.skipif(not native.available,
                                reason="native whole-batch conv not available")

GEOMETRIES = {
    # name: (C, M, H, W, (kh, kw), (sh, sw), (top, left, bottom, right), (dh, dw), group)
    "odd_channels": (5, 7, 23, 37, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "deep_k864": (96, 24, 20, 30, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "k_not_block_multiple": (29, 13, 17, 40, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "stem_stride2": (3, 16, 41, 64, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),
    "dilated_asym_pads": (6, 10, 30, 40, (3, 3), (1, 1), (2, 0, 1, 3), (2, 2), 1),
    "groups_stride2": (8, 12, 24, 65, (3, 3), (2, 2), (0, 1, 2, 0), (1, 1), 2),
    "groups4_odd": (12, 20, 19, 33, (3, 3), (1, 1), (1, 2, 0, 1), (1, 1), 4),
    "5x5_s2_d2": (4, 6, 25, 70, (5, 5), (2, 2), (2, 2, 2, 2), (2, 2), 1),
    "rect_1x3_s12": (6, 9, 15, 80, (1, 3), (1, 2), (0, 1, 0, 1), (1, 1), 1),
    "rect_3x1": (7, 8, 21, 26, (3, 1), (1, 1), (1, 0, 1, 0), (1, 1), 1),
    # large enough for several bands of output rows (planes built band by band, threads over bands)
    "bands_s1": (64, 5, 80, 80, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "bands_s2_pads": (16, 6, 161, 158, (3, 3), (2, 2), (1, 0, 2, 1), (1, 1), 1),
    "bands_dilated": (40, 3, 70, 90, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 1),
    # small planes (dropped columns up to a quarter of the grid)
    "small_7x7": (20, 11, 7, 7, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "small_10x10_s2": (9, 13, 20, 20, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),
    "1x1": (32, 40, 17, 17, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    "1x1_odd_groups": (15, 21, 13, 29, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 3),
    "1x1_stride2": (12, 20, 18, 52, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1),
    # direct 1x1: B (the image) read in place up to K = 128 unless its rows are 2 KB multiples apart
    "1x1_k128_in_place": (128, 10, 9, 23, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    "1x1_k160_packed": (160, 12, 11, 30, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    "1x1_rows_2kb_apart_packed": (20, 9, 16, 32, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    # stride 2 across with both column phases read: one pass splits each row into both phase planes
    # (even and odd input columns with their own shifts; left pads 0-3, odd and even widths)
    "s2_pair_left_pad2_odd_w": (5, 7, 19, 61, (3, 3), (2, 2), (1, 2, 0, 1), (1, 1), 1),
    "s2_pair_kernel2_no_pad": (4, 6, 16, 67, (2, 2), (2, 2), (0, 0, 1, 1), (1, 1), 1),
    "s2_pair_kernel4_pad3": (3, 5, 22, 73, (4, 4), (2, 2), (1, 3, 2, 0), (1, 1), 1),
    "s2_pair_bands_wide": (8, 16, 150, 203, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),
}
ACTS = [("", ()), ("Relu", ()), ("SiLU", ()), ("HardSwish", ()), ("Clip", (-0.5, 0.5)), ("Sigmoid", ())]


def _reference_conv(x, w, b, strides, pads, dilations, group):
    """float64 convolution, one kernel tap at a time."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    (sh, sw), (dh, dw) = strides, dilations
    pt, pl, pb, pr = pads
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    mg = m // group
    y = np.zeros((n, m, oh, ow))
    for g in range(group):
        wg = w[g * mg:(g + 1) * mg].astype(np.float64)
        for ky in range(kh):
            for kx in range(kw):
                patch = xp[:, g * cg:(g + 1) * cg,
                           ky * dh:ky * dh + sh * (oh - 1) + 1:sh,
                           kx * dw:kx * dw + sw * (ow - 1) + 1:sw]
                y[:, g * mg:(g + 1) * mg] += np.einsum("mc,nchw->nmhw", wg[:, :, ky, kx], patch)
    return y + b.astype(np.float64).reshape(1, m, 1, 1)


def _run(name, batch, act, params, residual, seed):
    c, m, h, wd, k, s, pads, d, group = GEOMETRIES[name]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, c, h, wd), dtype=np.float32)
    fan_in = c // group * k[0] * k[1]
    w = (rng.standard_normal((m, c // group) + k) / np.sqrt(fan_in)).astype(np.float32)
    b = rng.standard_normal(m, dtype=np.float32)
    conv = _reference_conv(x, w, b, s, pads, d, group)
    z = rng.standard_normal(conv.shape, dtype=np.float32) if residual else None
    expected = _np_act(conv + (0 if z is None else z), act, params)
    got = nn.conv_fused_native(x, w, b, z, activation=act, activation_params=params, group=group, pads=pads,
                               strides=s, dilations=d)
    assert got is not None and got.dtype == np.float32 and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=5e-5)


@pytest.mark.parametrize("name", list(GEOMETRIES))
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("nthreads", [1, 2])
def test_implicit_conv_matches_reference(name, batch, nthreads, every_isa):
    i = list(GEOMETRIES).index(name)
    act, params = ACTS[(i + batch) % len(ACTS)]
    before = native.threads()
    native.set_threads(nthreads)
    try:
        _run(name, batch, act, params, residual=(i + nthreads) % 2 == 0, seed=i)
    finally:
        native.set_threads(before)


@pytest.mark.parametrize("act,params", ACTS, ids=[a or "none" for a, _ in ACTS])
@pytest.mark.parametrize("name", ["odd_channels", "stem_stride2", "1x1_odd_groups"])
def test_implicit_conv_residual_and_activation(name, act, params, every_isa):
    _run(name, 1, act, params, residual=True, seed=42)


# The ways FN(sgemm_conv) stores (gemm_impl.h): one GEMM per output row (stored straight into the
# output) when the row's columns, rounded up to whole vectors, are no more than the extended grid's
# and its panels are whole or the sum is shallow; the exp-based activations of a large output (over
# 512 KB) through the scratch block.  Geometries per ISA level: ow = 112 (AVX-512: three panels and
# one of a single vector, read in place), 47 (a part-filled last panel, packed), 64 at K = 144 (whole
# panels, deep), a 1x1 and a stem row-GEMM conv with outputs of 655 KB and 532 KB.
STORE_PATHS = {
    "row_gemms_stem_one_vector_panel": (3, 16, 30, 224, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),
    "row_gemms_partial_panel": (5, 9, 12, 47, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "row_gemms_whole_panels_deep": (16, 8, 20, 64, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "exp_act_scratch_1x1_large": (8, 40, 64, 64, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    "exp_act_scratch_row_gemms": (3, 16, 130, 256, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),
}
GEOMETRIES.update(STORE_PATHS)  # (after the parametrizations above: for _run only)


@pytest.mark.parametrize("act,params", ACTS, ids=[a or "none" for a, _ in ACTS])
@pytest.mark.parametrize("name", list(STORE_PATHS))
@pytest.mark.parametrize("nthreads", [1, 2])
def test_store_paths_match_reference(name, act, params, nthreads, every_isa):
    before = native.threads()
    native.set_threads(nthreads)
    try:
        _run(name, 1, act, params, residual=nthreads == 2, seed=60)
    finally:
        native.set_threads(before)


@pytest.mark.parametrize("name", list(STORE_PATHS))
def test_store_paths_equal_channel_vector_sums(name, every_isa, monkeypatch):
    """Every store path sums as the other paths do (K blocks, k order): bit-identical to the
    channel-vector kernel (weights packed for it) and to itself at 1 and 2 threads."""
    c, m, h, wd, k, s, pads, d, group = GEOMETRIES[name]
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, c, h, wd), dtype=np.float32)
    w = (rng.standard_normal((m, c // group) + k) / np.sqrt(c // group * k[0] * k[1])).astype(np.float32)
    b = rng.standard_normal(m, dtype=np.float32)
    attrs = dict(group=group, pads=pads, strides=s, dilations=d)
    z = nn.conv_fused_native(x, w, b, None, **attrs)  # a residual of the output's shape
    before = native.threads()
    results = []
    try:
        for pack in (lambda w, group: None, native.conv_pack_w):
            monkeypatch.setattr(native, "_conv_pack_w", lambda owner, w, c, group, k, s, out, pack=pack: pack(w, group))
            for threads in (1, 2):
                native.set_threads(threads)
                native._qpacked.clear()
                results.append(nn.conv_fused_native(x, w, b, z, activation="SiLU", **attrs))
    finally:
        native.set_threads(before)
    for got in results[1:]:
        np.testing.assert_array_equal(got, results[0])
