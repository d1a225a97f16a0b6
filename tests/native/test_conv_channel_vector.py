"""The channel-vector float convolution (gemm_impl.h, FN(conv_cv); docs/decisions.md, D50).

Images with a GEMM of their own run the implicit-GEMM convolution with the output channels as
vector lanes when the layer's weights come pre-packed (``native.conv_pack_w``): the Python wrapper
packs them, once per weight array, for the layers ``mrt_conv2d_uses_packed_w`` picks (output
channels a multiple of 32, and a sum of depth >= 192, or a kernel larger than 1x1 with a small
output or a stride; other channel counts with a kernel larger than 1x1 on at most 256 pixels, and, with
panels of 32, 1x1 layers of at least 256 output channels from a depth of 192).
Checked here against a float64 numpy convolution written independently of minirt: the geometries
it picks (padding, strides, dilation, groups, 1x1 direct and strided, rectangular and 5x5 kernels,
several K blocks, partial pixel tiles, bands of output rows), and, with packing forced, channel
counts it does not pick (partial and one-vector channel panels).  The packed and the GEMM paths
compute the same sums: their results must be bit-identical, whatever the threads.
"""
from __future__ import annotations

import numpy as np
import pytest

from minirt import native
from minirt.kernels import nn
from tests.native.conftest import run_under_scratch_limit
from tests.native.test_conv_implicit import _reference_conv
from tests.native.test_native_kernels import _np_act

pytestmark = pytest.mark.skipif(not native.available,
                                reason="native channel-vector conv not available")

# name: (C, M, H, W, (kh, kw), (sh, sw), (top, left, bottom, right), (dh, dw), group)
PICKED = {
    "10x10_two_k_blocks": (40, 32, 10, 10, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "7x7_deep_partial_tile": (64, 64, 7, 7, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "stride2_to_10x10": (24, 64, 20, 20, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),
    "dilated_asym_pads": (8, 32, 16, 18, (3, 3), (1, 1), (2, 0, 1, 3), (2, 2), 1),
    "groups2": (16, 64, 12, 12, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 2),
    "1x1_deep_direct": (256, 32, 9, 11, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    "1x1_deep_stride2": (260, 32, 10, 14, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1),
    "5x5_s2": (12, 32, 21, 19, (5, 5), (2, 2), (2, 2, 2, 2), (1, 1), 1),
    "rect_1x3_deep": (100, 64, 6, 30, (1, 3), (1, 1), (0, 1, 0, 1), (1, 1), 1),
    "bands_deep": (32, 32, 72, 72, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "strided_k144_large": (16, 32, 70, 66, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),
    # part-filled channel panels on tiny outputs (at most 256 pixels): the demo model's first conv
    "m16_tiny_c1": (1, 16, 8, 8, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "m8_tiny_odd": (2, 8, 5, 7, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "m24_tiny_groups3": (6, 24, 9, 9, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 3),
    "m16_tiny_16x16": (4, 16, 16, 16, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
}
# packing forced: channel counts the wrapper would not pack for
FORCED = {
    "m24_partial_panel": (20, 24, 18, 18, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "m16_one_vector": (30, 16, 35, 16, (3, 3), (2, 1), (0, 1, 2, 1), (1, 1), 1),
    "m40_groups_odd": (15, 40, 20, 14, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 5),
    "m13_1x1_deep": (300, 13, 5, 7, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
}
# grouped convolutions of a few channels per group (RegNet, ResNeXt): the channel-vector kernel at any
# plane size when a group fills whole panels of 8 / 16 channels or half of one (kernels.c,
# conv_cv_grouped), stride-2 ones read in place; each thread takes whole groups (conv_for_groups)
GROUPED = {
    "regnet_s2_in_place": (104, 104, 30, 30, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 13),
    "regnet_s1_planes": (48, 48, 20, 22, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 6),
    "m16_groups_s2": (64, 64, 36, 36, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 4),
    # 4 channels per group: the GEMM per group, on bands of output rows over the threads (40 x 40)
    # or on one band with its groups over the threads (14 x 14)
    "m4_gemm_bands": (32, 32, 40, 40, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 8),
    "m4_gemm_groups": (256, 256, 14, 14, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 64),
    # one output row: im2col and a GEMM per group
    "m4_one_row_im2col": (128, 128, 1, 1000, (1, 3), (1, 1), (0, 1, 0, 1), (1, 1), 32),
    # 3 groups on 2 threads: each group keeps both threads
    "groups3_threads_inside": (24, 24, 30, 30, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 3),
}
# wide 1x1 layers of output channels not a multiple of 32, from 192 input channels: picked with panels of
# 32 only (AVX-512; kernels.c MRT_CONV_CV_WIDE_1X1_M, D138), the last panel part-filled (8 and 24 lanes)
WIDE = {
    "1x1_wide_m1000_classifier": (512, 1000, 13, 13, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    "1x1_wide_m440_regnet": (208, 440, 14, 14, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
}
# picked with panels of 32 only (AVX-512): 1x1 expansions of whole panels on planes of at most 256 pixels
# (MRT_CONV_CV_SMALL_1X1_*, D157) and stride-1 window convs at any depth and plane (D156); below 2048 pixels
# two threads take a range of panels each (G_CV_CHANNEL_SPLIT_PIXELS), whole or not (5 panels)
AVX512_ONLY = {
    "1x1_expand_m192_7x7": (64, 192, 7, 7, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    "1x1_expand_m160_14x14_odd_panels": (40, 160, 14, 14, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    "3x3_k144_plane_48x48": (16, 64, 48, 48, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "3x3_k72_plane_40x40_split": (8, 96, 40, 40, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
}
ACTS = [("", ()), ("Relu", ()), ("SiLU", ()), ("HardSwish", ()), ("Clip", (-0.5, 0.5)), ("Sigmoid", ())]


def _output_size(geom):
    c, m, h, wd, k, s, pads, d, group = geom
    oh = (h + pads[0] + pads[2] - d[0] * (k[0] - 1) - 1) // s[0] + 1
    ow = (wd + pads[1] + pads[3] - d[1] * (k[1] - 1) - 1) // s[1] + 1
    return oh, ow


def _inputs(geom, batch, residual, seed):
    c, m, h, wd, k, s, pads, d, group = geom
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, c, h, wd), dtype=np.float32)
    w = (rng.standard_normal((m, c // group) + k) / np.sqrt(c // group * k[0] * k[1])).astype(np.float32)
    b = rng.standard_normal(m, dtype=np.float32)
    z = rng.standard_normal((batch, m) + _output_size(geom), dtype=np.float32) if residual else None
    return x, w, b, z


def _conv(geom, x, w, b, z, act, params):
    c, m, h, wd, k, s, pads, d, group = geom
    return nn.conv_fused_native(x, w, b, z, activation=act, activation_params=params, group=group, pads=pads,
                                strides=s, dilations=d)


def _check(geom, batch, act, params, residual, seed):
    x, w, b, z = _inputs(geom, batch, residual, seed)
    c, m, h, wd, k, s, pads, d, group = geom
    conv = _reference_conv(x, w, b, s, pads, d, group)
    expected = _np_act(conv + (0 if z is None else z), act, params)
    got = _conv(geom, x, w, b, z, act, params)
    assert got is not None and got.dtype == np.float32 and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=5e-5)


@pytest.fixture
def nthreads(request):
    before = native.threads()
    native.set_threads(request.param)
    yield request.param
    native.set_threads(before)


@pytest.fixture
def force_packing(monkeypatch):
    """Pack the weights of every GEMM conv (the channel-vector kernel then runs them all)."""
    monkeypatch.setattr(native, "_conv_pack_w", lambda owner, w, c, group, k, s, out: native.conv_pack_w(w, group))


def _avx2_projection(c, m, group, k, s) -> bool:
    """With panels of 16 (AVX2), the 1x1 convs that take the channel-vector kernel: stride 1, whole
    panels of at most 64 output channels over at least 128 input channels (kernels.c,
    MRT_CONV_CV_NARROW_1X1_*)."""
    mg = m // group
    return (native.packed_panel_width() == 16 and k == (1, 1) and s == (1, 1) and mg % 16 == 0 and mg <= 64
            and c // group >= 128)


def _grouped_pick(m, group, k) -> bool:
    """conv_cv_grouped (kernels.c): a grouped kernel larger than 1x1 whose groups fill whole panels
    of at most 16 channels, or half of one."""
    mg, nr = m // group, native.packed_panel_width()
    return group > 1 and k != (1, 1) and nr <= 16 and (mg % nr == 0 or 2 * mg == nr)


def test_picked_geometries_take_the_channel_vector_kernel():
    for name, geom in GROUPED.items():
        c, m, h, wd, k, s, pads, d, group = geom
        out = _output_size(geom)
        want = _grouped_pick(m, group, k) or (k != (1, 1) and out[0] * out[1] <= 256 and (m // group) % 32 != 0)
        assert _uses_packed_w(c, m, group, k, s, out) == want, name
    for name, geom in PICKED.items():
        c, m, h, wd, k, s, pads, d, group = geom
        # (with panels of 16, AVX2, other 1x1 kernels stay on the GEMM: kernels.c, mrt_conv2d_uses_packed_w)
        want = k != (1, 1) or native.packed_panel_width() != 16 or _avx2_projection(c, m, group, k, s)
        assert _uses_packed_w(c, m, group, k, s, _output_size(geom)) == want, name
    for name, geom in FORCED.items():
        c, m, h, wd, k, s, pads, d, group = geom
        want = _avx2_projection(c, m, group, k, s) or _grouped_pick(m, group, k)
        assert _uses_packed_w(c, m, group, k, s, _output_size(geom)) == want, name
    for name, geom in WIDE.items():
        c, m, h, wd, k, s, pads, d, group = geom
        assert _uses_packed_w(c, m, group, k, s, _output_size(geom)) == (native.packed_panel_width() == 32), name
    for name, geom in AVX512_ONLY.items():
        c, m, h, wd, k, s, pads, d, group = geom
        want = native.packed_panel_width() == 32 or _avx2_projection(c, m, group, k, s)
        assert _uses_packed_w(c, m, group, k, s, _output_size(geom)) == want, name
    assert not _uses_packed_w(32, 192, 1, (1, 1), (1, 1), (28, 28))  # (a 1x1 expansion on a larger plane)
    assert not _uses_packed_w(24, 96, 1, (1, 1), (1, 1), (14, 14))  # (to fewer than 128 channels)
    assert not _uses_packed_w(3, 64, 1, (3, 3), (2, 2), (112, 112))  # (a stride-2 stem)
    assert not _uses_packed_w(191, 1000, 1, (1, 1), (1, 1), (13, 13))  # (too shallow)
    assert not _uses_packed_w(512, 248, 1, (1, 1), (1, 1), (13, 13))  # (too few channels)
    # one output row longer than MRT_CONV_CV_MAX_ROW (a 1-D conv): the GEMM, whatever the depth
    assert not _uses_packed_w(512, 512, 1, (1, 3), (1, 2), (1, 1599))
    assert _uses_packed_w(512, 512, 1, (1, 2), (1, 2), (1, 199))


def _uses_packed_w(c, m, group, k, s, out) -> bool:
    """mrt_conv2d_uses_packed_w for this geometry (it reads the channels, kernel, strides and output size)."""
    geometry = native._ffi.new("mrt_conv_geometry *", {"c": c, "m": m, "group": group, "kh": k[0], "kw": k[1],
                                                       "sh": s[0], "sw": s[1], "oh": out[0], "ow": out[1]})
    return bool(native._lib.mrt_conv2d_uses_packed_w(geometry))


@pytest.mark.parametrize("name", list(PICKED))
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("nthreads", [1, 2], indirect=True)
def test_channel_vector_conv_matches_reference(name, batch, nthreads, every_isa):
    i = list(PICKED).index(name)
    act, params = ACTS[(i + batch) % len(ACTS)]
    _check(PICKED[name], batch, act, params, residual=(i + nthreads) % 2 == 0, seed=i)


@pytest.mark.parametrize("name", list(GROUPED))
def test_grouped_conv_matches_reference_and_is_the_same_on_any_thread_count(name, every_isa):
    """Grouped layers on their path (channel-vector kernel in place or on planes, GEMM bands, im2col),
    whole groups per thread or the threads inside each group: the reference's values, and the same
    bits at 1 and 2 threads (every output is summed by one thread in the same order)."""
    i = list(GROUPED).index(name)
    _check_same_on_1_and_2_threads(GROUPED[name], ACTS[i % len(ACTS)], residual=i % 2 == 0, seed=80 + i)


def _check_same_on_1_and_2_threads(geom, act_params, residual, seed):
    """The conv of ``geom`` equals the reference, and gives the same bits at 1 and 2 threads."""
    act, params = act_params
    x, w, b, z = _inputs(geom, 1, residual, seed=seed)
    expected = _np_act(_reference_conv(x, w, b, geom[5], geom[6], geom[7], geom[8]) + (0 if z is None else z), act,
                       params)
    before = native.threads()
    try:
        results = []
        for threads in (1, 2):
            native.set_threads(threads)
            results.append(_conv(geom, x, w, b, z, act, params))
    finally:
        native.set_threads(before)
    np.testing.assert_allclose(results[0], expected, rtol=1e-5, atol=5e-5)
    np.testing.assert_array_equal(results[1], results[0])


@pytest.mark.parametrize("name", list(FORCED))
@pytest.mark.parametrize("nthreads", [1, 2], indirect=True)
def test_forced_channel_vector_conv_matches_reference(name, nthreads, every_isa, force_packing):
    i = list(FORCED).index(name)
    act, params = ACTS[(i + nthreads) % len(ACTS)]
    _check(FORCED[name], 1, act, params, residual=i % 2 == 0, seed=50 + i)


@pytest.mark.parametrize("act,params", ACTS, ids=[a or "none" for a, _ in ACTS])
def test_channel_vector_conv_epilogues(act, params, every_isa):
    _check(PICKED["10x10_two_k_blocks"], 1, act, params, residual=True, seed=7)


@pytest.mark.parametrize("name", ["10x10_two_k_blocks", "1x1_deep_direct", "bands_deep", "m24_partial_panel"])
def test_channel_vector_conv_equals_gemm_path(name, every_isa, monkeypatch):
    """The same sums in the same order as the GEMM path: bit-identical, with 1 or 2 threads; except
    a direct 1x1 GEMM's last 1-3 columns (N % panel width), which it sums as dot products
    (gemm_impl.h, FN(sgemm_dot_tail)): the same values to rounding there, and each path the same
    bits at any thread count."""
    geom = PICKED.get(name) or FORCED[name]
    x, w, b, z = _inputs(geom, 1, True, seed=3)
    before = native.threads()
    try:
        results = []
        for pack in (native.conv_pack_w, lambda w, group: None):
            monkeypatch.setattr(native, "_conv_pack_w", lambda owner, w, c, group, k, s, out, pack=pack: pack(w, group))
            for threads in (1, 2):
                native.set_threads(threads)
                native._qpacked.clear()
                results.append(_conv(geom, x, w, b, z, "SiLU", ()))
    finally:
        native.set_threads(before)
    assert_same_sums_as_gemm(geom, results)


def gemm_has_dot_tail(geom) -> bool:
    """Whether the GEMM path of a direct 1x1 conv sums its last columns as dot products: 1-3 columns
    past whole panels (gemm_impl.h, G_DOT_TAIL)."""
    c, m, h, wd, k, s, pads, d, group = geom
    oh, ow = _output_size(geom)
    return k == (1, 1) and s == (1, 1) and m // group > 1 and 1 <= (oh * ow) % native.packed_panel_width() <= 3


def assert_same_sums_as_gemm(geom, results):
    """results: packed at 1 and 2 threads, then the GEMM at 1 and 2 threads.  Each path gives the same
    bits at any thread count; the two paths the same bits, but for a GEMM's dot-product tail (the
    same values to rounding)."""
    np.testing.assert_array_equal(results[1], results[0])
    np.testing.assert_array_equal(results[3], results[2])
    if gemm_has_dot_tail(geom):
        np.testing.assert_allclose(results[2], results[0], rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_array_equal(results[2], results[0])


def test_prepared_call_after_an_isa_change_ignores_stale_packing():
    """A call prepared (and packed) under one ISA, run after ``select_isa`` changed it: the packed
    layout depends on the ISA, so the call must not hand the old packing to the new kernels."""
    geom = PICKED["10x10_two_k_blocks"]
    c, m, h, wd, k, s, pads, d, group = geom
    x, w, b, _ = _inputs(geom, 1, False, seed=9)
    expected = _reference_conv(x, w, b, s, pads, d, group)
    out = _output_size(geom)
    before = native.isa
    try:
        for first, then in (("best", "baseline"), ("baseline", "best")):
            native.select_isa(first)
            prep = native.conv2d_prepare(x.shape, w, group, k, s, d, pads[:2], out, b)
            assert prep[-1] == native.isa  # packed for `first` (the ISA its packing was made under)
            native.select_isa(then)
            y = np.empty((1, m) + out, dtype=np.float32)
            native.conv2d_call(prep, x, y)
            np.testing.assert_allclose(y, expected, rtol=1e-5, atol=5e-5)
    finally:
        native.select_isa(before)


@pytest.mark.parametrize("width", list(range(2, 21)))
def test_stride2_planes_of_every_width(width, every_isa):
    """Stride-2 phase planes (kernels.c, gather_stride2) of 1 to 10 columns, with and without a
    left pad: every remainder of the 8- and 4-column steps."""
    for pads in ((1, 1, 1, 1), (0, 0, 1, 1)):
        _check((6, 32, 5, width, (3, 3), (2, 2), pads, (1, 1), 1), 1, "", (), residual=False, seed=width)


@pytest.mark.parametrize("name", list(WIDE))
@pytest.mark.parametrize("nthreads", [1, 2], indirect=True)
def test_wide_1x1_conv_matches_reference(name, nthreads, every_isa):
    """The wide 1x1 layers (the channel-vector kernel at AVX-512, the GEMM elsewhere) against the reference."""
    i = list(WIDE).index(name)
    act, params = ACTS[(i + nthreads + 1) % len(ACTS)]
    _check(WIDE[name], 1, act, params, residual=(i + nthreads) % 2 == 1, seed=90 + i)


# 1x1 convs of a few channel panels over small planes whose K is two or three blocks of FN(sgemm_kc): with
# two threads each thread sums its blocks of K (the projection after a depthwise layer, whose channels the
# threads split), then the parts are added in block order (FN(conv_cv_split_k), D160)
K_SPLIT = {
    "k384_two_blocks": (384, 64, 14, 14, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    "k576_three_blocks": (576, 96, 14, 14, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    "k512_partial_panel": (512, 40, 9, 7, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    "k960_four_blocks": (960, 64, 7, 7, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    "k384_one_pixel_row": (384, 32, 1, 13, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
}


@pytest.mark.parametrize("name", list(K_SPLIT))
def test_small_1x1_convs_split_along_k_are_the_same_on_any_thread_count(name, every_isa, force_packing):
    """The K split of small 1x1 layers: the reference's values, and the bits of one thread (the parts'
    sums are added in the order one thread adds its K blocks)."""
    i = list(K_SPLIT).index(name)
    _check_same_on_1_and_2_threads(K_SPLIT[name], ACTS[i % len(ACTS)], residual=i % 2 == 0, seed=140 + i)


def test_a_k_split_without_scratch_splits_by_panels(force_packing):
    """When the partial sums' scratch is refused (the session's memory bound), the layer is split by
    channel panels as before: the same bits.  (On a new thread: the scratch is per thread, and kept.)"""
    run_under_scratch_limit(
        lambda: _check_same_on_1_and_2_threads(K_SPLIT["k384_two_blocks"], ACTS[1], residual=True, seed=150), 4096)


@pytest.mark.parametrize("name", list(AVX512_ONLY))
def test_avx512_picks_match_reference_and_are_the_same_on_any_thread_count(name, every_isa):
    """The AVX-512 picks (D156, D157) on every ISA (elsewhere the GEMM runs them): the reference's values,
    and the same bits at 1 and 2 threads (two threads split the small planes by channel panels)."""
    i = list(AVX512_ONLY).index(name)
    _check_same_on_1_and_2_threads(AVX512_ONLY[name], ACTS[i % len(ACTS)], residual=i % 2 == 0, seed=120 + i)


@pytest.mark.parametrize("out", [(7, 7), (5, 10), (3, 17)], ids=["tail1", "tail2", "tail3"])
def test_direct_1x1_gemm_dot_tail_whole_and_partial_row_tiles(out, every_isa):
    """A direct 1x1 conv whose last 1-3 output columns are dot products (FN(sgemm_dot_tail)) over 440
    output channels: whole row tiles (their row count a constant there) and the last partial one (the
    general loop), two K blocks (K = 440): the reference's values, the same bits at 1 and 2 threads."""
    geom = (440, 440) + out + ((1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1)
    if native.packed_panel_width() == 16:
        assert gemm_has_dot_tail(geom)
    _check_same_on_1_and_2_threads(geom, ACTS[1], residual=True, seed=21)
