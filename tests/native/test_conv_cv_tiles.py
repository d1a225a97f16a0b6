"""Pixel tiles of the channel-vector convolution (gemm_impl.h, FN(conv_cv); docs/decisions.md, D62).

A tile of G_CV_NP output pixels (12 on AVX-512, 6 elsewhere) takes one of three routes in and out:

- in: its pixels' inputs from an offset each (any tile), or, when the tile is whole (12, 8 or 4
  pixels on AVX-512) and its pixels lie in one input row at column step 1 or 2 (or the region's
  rows follow each other, as in a direct 1x1 conv), at fixed displacements from one pointer; a
  run of tiles that would end with a single pixel ends with a tile of 13 instead (AVX-512: 49
  pixels are 12 + 12 + 12 + 13);
- out (AVX-512): a whole tile whose pixels are consecutive in the output is transposed in
  registers and stored 12 floats per channel row, the residual added on those rows (read 16 floats
  at a time where that stays inside the residual, else 12); the other tiles take the 4 x 4 path;
- the exp-based epilogues (SiLU, Sigmoid) run on groups of vectors (FN(vexp_group)).

The geometries below put tiles on every route: output widths that are and are not multiples of the
tile sizes (rows of 4, 5, 7, 8, 12, 20 and 24 pixels; 7 x 7 and 14 x 14 direct 1x1 convs; runs ending
with 13 pixels), stride 1 (planes) and stride 2 (read in place), channel panels of 32, 16 and 8 channels, a
residual whose last channel row ends within 16 floats of a tile, every epilogue, batch 1 and 2,
1 and 2 threads, every ISA; against the float64 numpy reference of test_conv_implicit, and bit for bit
against the GEMM path (the same sums in the same order, whatever the threads).

The phase planes write each row's zero margins without library calls when they are at most 4 floats
(kernels.c, plane_row_margins; stride 1 copies the row in vectors too, copy_row_padded), wider
margins and rows of fewer than 4 floats as before; stride 1, 2 (both column phases split together,
or one alone) and 3, also on the GEMM path (weights not packed).
"""
from __future__ import annotations

import numpy as np
import pytest

from minirt import native
from tests.native.test_conv_channel_vector import _check, _conv, _inputs, assert_same_sums_as_gemm
from tests.native.test_conv_implicit import _reference_conv
from tests.native.test_native_kernels import _np_act

pytestmark = pytest.mark.skipif(not native.available,
                                reason="native channel-vector conv not available")

# name: (C, M, H, W, (kh, kw), (sh, sw), (top, left, bottom, right), (dh, dw), group)
TILES = {
    "rows_of_20": (64, 64, 20, 20, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "rows_of_24": (16, 32, 24, 24, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "rows_of_12": (24, 32, 5, 12, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "rows_of_8": (24, 32, 9, 8, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "rows_of_4": (24, 32, 7, 4, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "rows_of_5": (40, 32, 11, 5, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "direct_1x1_14x14": (256, 64, 14, 14, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    "direct_1x1_7x7_tail_tile_13": (300, 64, 7, 7, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    "rows_of_7_tail_tile_13": (64, 32, 7, 7, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "s2_inside_5x5_tail_tile_13": (16, 32, 11, 11, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),
    "direct_1x1_m48_panel_16": (200, 48, 6, 10, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    "direct_1x1_m40_panel_8": (200, 40, 6, 10, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    "s2_in_place_rows_of_24": (16, 32, 48, 48, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),
    "s2_in_place_no_pads": (16, 32, 25, 49, (3, 3), (2, 2), (0, 0, 0, 0), (1, 1), 1),
    "s2_1x1": (200, 32, 14, 26, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1),
}
ACTS = [("", ()), ("Relu", ()), ("SiLU", ()), ("Clip", (0.0, 6.0)), ("Sigmoid", ()), ("HardSwish", ())]


@pytest.fixture
def nthreads(request):
    before = native.threads()
    native.set_threads(request.param)
    yield request.param
    native.set_threads(before)


@pytest.mark.parametrize("name", list(TILES))
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("nthreads", [1, 2], indirect=True)
def test_tile_routes_match_reference(name, residual, nthreads, every_isa, monkeypatch):
    """Every geometry with packing forced (the channel-vector kernel runs it whatever the layer rule)."""
    monkeypatch.setattr(native, "_conv_pack_w", lambda owner, w, c, group, k, s, out: native.conv_pack_w(w, group))
    i = list(TILES).index(name)
    for j, (act, params) in enumerate(ACTS):
        _check(TILES[name], 1 + (i + j) % 2, act, params, residual=residual, seed=100 + 7 * i + j)


@pytest.mark.parametrize("name", ["rows_of_20", "direct_1x1_7x7_tail_tile_13", "direct_1x1_m40_panel_8",
                                  "s2_in_place_rows_of_24"])
@pytest.mark.parametrize("act", ["SiLU", "Clip"])
def test_tile_routes_equal_gemm_path(name, act, every_isa, monkeypatch):
    """Bit for bit the GEMM path's sums (with a residual), at 1 and 2 threads (but for the GEMM's
    dot-product tail: assert_same_sums_as_gemm)."""
    geom = TILES[name]
    x, w, b, z = _inputs(geom, 1, True, seed=11)
    params = (0.0, 6.0) if act == "Clip" else ()
    before = native.threads()
    try:
        results = []
        for pack in (native.conv_pack_w, lambda w, group: None):
            monkeypatch.setattr(native, "_conv_pack_w", lambda owner, w, c, group, k, s, out, pack=pack: pack(w, group))
            for threads in (1, 2):
                native.set_threads(threads)
                native._qpacked.clear()
                results.append(_conv(geom, x, w, b, z, act, params))
    finally:
        native.set_threads(before)
    assert_same_sums_as_gemm(geom, results)


# phase planes: margins of 1-4 floats (vector stores), wider margins and narrow rows
PLANES = {
    "margins_1": (8, 32, 9, 13, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "margins_4_and_2": (8, 32, 9, 13, (5, 5), (1, 1), (2, 4, 2, 2), (1, 1), 1),
    "margin_5_left": (8, 32, 9, 13, (3, 3), (1, 1), (1, 5, 1, 0), (1, 1), 1),
    "margin_6_right": (8, 32, 9, 13, (3, 3), (1, 1), (0, 0, 1, 6), (1, 1), 1),
    "row_of_3": (8, 32, 9, 3, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "row_of_4": (8, 32, 9, 4, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "dilated_wide_pads": (8, 32, 12, 17, (3, 3), (1, 1), (2, 3, 2, 3), (2, 3), 1),
    # stride-2 phase planes: both column phases split together, one phase alone, stride 3
    "s2_pair_margins_1": (8, 32, 20, 20, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),
    "s2_pair_margin_5": (8, 32, 20, 21, (3, 3), (2, 2), (1, 9, 1, 0), (1, 1), 1),
    "s2_one_phase_1x1_padded": (8, 32, 15, 22, (1, 1), (2, 2), (1, 1, 1, 1), (1, 1), 1),
    "s3_columns": (8, 32, 12, 31, (3, 3), (1, 3), (1, 1, 1, 1), (1, 1), 1),
}


@pytest.mark.parametrize("name", list(PLANES))
@pytest.mark.parametrize("packed", [True, False], ids=["channel_vector", "gemm"])
@pytest.mark.parametrize("nthreads", [1, 2], indirect=True)
def test_phase_planes_match_reference(name, packed, nthreads, every_isa, monkeypatch):
    monkeypatch.setattr(native, "_conv_pack_w",
                        lambda owner, w, c, group, k, s, out: native.conv_pack_w(w, group) if packed else None)
    before = native._lib.mrt_conv2d_in_place_mode(0)  # the planes, not the in-place windows
    try:
        _check(PLANES[name], 1, "SiLU", (), residual=list(PLANES).index(name) % 2 == 0, seed=200)
    finally:
        native._lib.mrt_conv2d_in_place_mode(before)


@pytest.mark.parametrize("act", ["SiLU", "Sigmoid"])
def test_exp_epilogue_clamps_and_nan(act, every_isa, monkeypatch):
    """Sums far past exp's clamps (|x| > 88) and a NaN input: FN(vexp_group)'s clamps (one max / min
    each on x86) keep a NaN a NaN and give the reference's limits; the GEMM path gives the same bits."""
    geom = TILES["rows_of_20"]
    x, w, b, _ = _inputs(geom, 1, False, seed=5)
    x *= 60.0  # sums of several hundred either way
    x[0, 3, 7, 11] = np.nan  # the 3x3 window around it: NaN in every output channel
    conv = _reference_conv(x.astype(np.float64), w, b, geom[5], geom[6], geom[7], geom[8])
    expected = _np_act(conv, act, ())
    results = []
    for pack in (native.conv_pack_w, lambda w, group: None):
        monkeypatch.setattr(native, "_conv_pack_w", lambda owner, w, c, group, k, s, out, pack=pack: pack(w, group))
        native._qpacked.clear()
        results.append(_conv(geom, x, w, b, None, act, ()))
    assert np.isnan(results[0]).sum() == np.isnan(expected).sum() == 64 * 9
    np.testing.assert_allclose(results[0], expected, rtol=1e-5, atol=5e-5)
    np.testing.assert_array_equal(results[1], results[0])
