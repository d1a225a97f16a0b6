"""The channel-vector convolution reading its input in place (kernels.c, conv_in_place;
docs/decisions.md, D58).

With packed weights and a kernel that needs padding, strides or dilations, the output pixels whose
taps all fall inside the image read it where it is (row stride sh * width, column stride sw), and the
border pixels (output rows above and below, then columns left and right of that rectangle) read
small zero-padded copies of the input they cover.  ``mrt_conv2d_in_place_mode(1)`` forces this path
for every such layer (by default only strided layers with few border pixels take it), so each
geometry below runs it: borders on every side or none, odd sizes, asymmetric and large pads (output
rows made of padding only), strides 1, 2 and (2, 1), dilation, groups, 1x1 strided, 5x5 and 1x3
kernels, no inside pixel at all, batch 1 and 2, threads 1 and 2, every ISA.  Checked against the
float64 reference of test_conv_implicit (numpy, one tap at a time), and bit for bit against the
planes path (``mrt_conv2d_in_place_mode(0)``): the same sums in the same order.
"""
from __future__ import annotations

import numpy as np
import pytest

from minirt import native
from tests.native.test_conv_channel_vector import _conv, _inputs
from tests.native.test_conv_implicit import _reference_conv
from tests.native.test_native_kernels import _np_act

pytestmark = pytest.mark.skipif(not native.available,
                                reason="native in-place channel-vector conv not available")

# name: (C, M, H, W, (kh, kw), (sh, sw), (top, left, bottom, right), (dh, dw), group)
GEOMETRIES = {
    "s2_even_yolo_like": (16, 32, 32, 32, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),
    "s2_odd_sizes": (12, 64, 23, 17, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),
    "s1_all_borders": (20, 32, 14, 15, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "s1_deep_two_k_blocks": (40, 32, 11, 9, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "s2_asym_pads": (8, 32, 19, 22, (3, 3), (2, 2), (0, 2, 1, 0), (1, 1), 1),
    "large_pads_rows_of_padding": (6, 32, 9, 10, (3, 3), (2, 2), (4, 3, 5, 4), (1, 1), 1),
    "s21_rect_stride": (10, 32, 21, 13, (3, 3), (2, 1), (1, 1, 1, 1), (1, 1), 1),
    "dilated": (8, 32, 16, 18, (3, 3), (1, 1), (2, 0, 1, 3), (2, 2), 1),
    "dilated_s2": (8, 32, 21, 20, (3, 3), (2, 2), (2, 2, 2, 2), (2, 2), 1),
    "groups2_s2": (16, 64, 18, 18, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 2),
    "groups3_s1": (6, 96, 9, 11, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 3),
    "1x1_stride2_no_borders": (260, 32, 10, 14, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1),
    "3x3_no_pads": (24, 32, 12, 13, (3, 3), (2, 2), (0, 0, 0, 0), (1, 1), 1),
    "5x5_s2": (12, 32, 21, 19, (5, 5), (2, 2), (2, 2, 2, 2), (1, 1), 1),
    "1x3_rows": (40, 64, 6, 30, (1, 3), (1, 1), (0, 1, 0, 1), (1, 1), 1),
    "no_inside_pixel": (5, 32, 2, 3, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "one_column": (9, 32, 12, 1, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "partial_panel_m40": (14, 40, 15, 15, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),
    "one_vector_m16": (30, 16, 35, 16, (3, 3), (2, 1), (0, 1, 2, 1), (1, 1), 1),
}
ACTS = [("", ()), ("Relu", ()), ("SiLU", ()), ("HardSwish", ()), ("Clip", (-0.5, 0.5))]


@pytest.fixture
def force_packing(monkeypatch):
    """Pack the weights of every GEMM conv (the channel-vector kernel then runs them all)."""
    monkeypatch.setattr(native, "_conv_pack_w", lambda owner, w, c, group, k, s, out: native.conv_pack_w(w, group))


def _in_place_mode(mode):
    return native._lib.mrt_conv2d_in_place_mode(mode)


@pytest.fixture
def nthreads(request):
    before = native.threads()
    native.set_threads(request.param)
    yield request.param
    native.set_threads(before)


def _run(geom, batch, act, params, residual, seed, mode):
    x, w, b, z = _inputs(geom, batch, residual, seed)
    before = _in_place_mode(mode)
    try:
        got = _conv(geom, x, w, b, z, act, params)
    finally:
        _in_place_mode(before)
    return x, w, b, z, got


@pytest.mark.parametrize("name", list(GEOMETRIES))
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("nthreads", [1, 2], indirect=True)
def test_in_place_conv_matches_reference_and_planes(name, batch, nthreads, every_isa, force_packing):
    geom = GEOMETRIES[name]
    c, m, h, wd, k, s, pads, d, group = geom
    i = list(GEOMETRIES).index(name)
    act, params = ACTS[(i + batch) % len(ACTS)]
    residual = (i + nthreads) % 2 == 0
    x, w, b, z, got = _run(geom, batch, act, params, residual, i, mode=1)
    expected = _np_act(_reference_conv(x, w, b, s, pads, d, group) + (0 if z is None else z), act, params)
    assert got is not None and got.dtype == np.float32 and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=5e-5)
    planes = _run(geom, batch, act, params, residual, i, mode=0)[-1]
    np.testing.assert_array_equal(got, planes)


def test_in_place_mode_hook_returns_the_previous_mode():
    before = _in_place_mode(1)
    try:
        assert _in_place_mode(0) == 1
        assert _in_place_mode(-5) == 0
        assert _in_place_mode(-1) == -1
    finally:
        _in_place_mode(before)
    assert before == -1


@pytest.mark.parametrize("geom", [(16, 32, 160, 160, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),
                                  (64, 128, 40, 40, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1)],
                         ids=["yolo_16to32_s2_160", "yolo_64to128_s2_40"])
@pytest.mark.parametrize("nthreads", [1, 2], indirect=True)
def test_default_rule_yolo_stride2_layers(geom, nthreads, every_isa):
    """YOLO's stride-2 layers, as the default rule runs them (in place), against the reference."""
    x, w, b, z = _inputs(geom, 1, False, seed=11)
    c, m, h, wd, k, s, pads, d, group = geom
    expected = _np_act(_reference_conv(x, w, b, s, pads, d, group), "SiLU", ())
    got = _conv(geom, x, w, b, z, "SiLU", ())
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=5e-5)
