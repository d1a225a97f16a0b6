"""int8 3x3 convolutions as Winograd F(2x2, 3x3) in exact integers (qwinograd_avx2.h, mrt_qconv2d with the
weights of mrt_qconv_winograd_pack_w, on AVX2 without VNNI): the exact integer sums of numpy, and the direct
kernels' results bit for bit, on every int8 level (the route is taken on the AVX2 one, which a VNNI machine
also runs; elsewhere the same calls take the direct kernels)."""
from __future__ import annotations

import numpy as np
import pytest

from minirt import native

from .conftest import requires_native
from .test_int8 import _qconv_int_ref, every_isa  # noqa: F401 (a fixture)

pytestmark = requires_native

G2 = np.array([[2, 0, 0], [1, 1, 1], [1, -1, 1], [0, 0, 2]], np.int64)  # 2G of F(2, 3)


def _geometry(c, m, pads, group=1, k=(3, 3), s=(1, 1), d=(1, 1), hw=(8, 8)):
    return native._geometry(1, c, hw[0], hw[1], k, s, d, pads, (1, 1), m, group)


def _winograd_here() -> bool:
    """Whether the level running now takes the Winograd route (AVX2 without VNNI)."""
    return bool(native._lib.mrt_qconv_uses_winograd(_geometry(64, 64, (1, 1))))


def test_packed_weights_are_4_G_g_G_transposed():
    rng = np.random.default_rng(3)
    m, c = 5, 7  # (an odd channel count: its pair partner is 0)
    w = rng.integers(-127, 128, (m, c, 3, 3), dtype=np.int8)
    u = native.qpack_winograd(w).reshape(16, m, c + 1)
    ref = np.einsum("ia,mcab,jb->ijmc", G2, w.astype(np.int64), G2).reshape(16, m, c)
    np.testing.assert_array_equal(u[:, :, :c], ref)
    assert not u[:, :, c].any()
    assert np.abs(ref).max() <= 9 * 127  # (int16, and the bound the exactness argument uses)


def test_the_route_rule():
    """3x3, stride and dilation 1, one group, pads <= 2, at most 1024 input channels, 20 c + 8 m <= c m; on a
    level with a dot product (VNNI) or without AVX2, never."""
    if not _winograd_here():
        assert not native._lib.mrt_qconv_uses_winograd(_geometry(128, 128, (1, 1)))
        return
    uses = lambda *a, **k: bool(native._lib.mrt_qconv_uses_winograd(_geometry(*a, **k)))  # noqa: E731
    assert uses(32, 32, (1, 1)) and uses(16, 64, (1, 1)) and uses(1024, 32, (0, 0)) and uses(64, 64, (2, 2))
    assert not uses(16, 16, (1, 1)) and not uses(64, 16, (1, 1))  # too few channels for the transforms to pay
    assert not uses(1025, 64, (1, 1))  # (|4 S| < 2^31 needs c <= 1024)
    assert not uses(64, 64, (3, 3)) and not uses(64, 64, (1, 1), group=2)
    assert not uses(64, 64, (1, 1), s=(2, 2)) and not uses(64, 64, (1, 1), d=(2, 2))
    assert not uses(64, 64, (2, 2), k=(5, 5))


def test_the_builders_copy_of_the_rule(every_isa):  # noqa: F811
    """packed_weights.qconv_uses_winograd (the int8 cost model's copy of the geometry rule) agrees with the
    kernel's on the level that has the route."""
    from minirt.format.packed_weights import qconv_uses_winograd

    if not _winograd_here():
        pytest.skip("no int8 Winograd route on this level")
    for c in (8, 16, 24, 32, 33, 64, 512, 1024, 1025):
        for m in (8, 16, 20, 32, 64, 200):
            for group, k, s, d, pads in ((1, (3, 3), (1, 1), (1, 1), (1, 1)), (2, (3, 3), (1, 1), (1, 1), (1, 1)),
                                         (1, (3, 3), (2, 2), (1, 1), (1, 1)), (1, (3, 3), (1, 1), (2, 2), (0, 0)),
                                         (1, (5, 5), (1, 1), (1, 1), (2, 2)), (1, (3, 3), (1, 1), (1, 1), (3, 0))):
                want = bool(native._lib.mrt_qconv_uses_winograd(_geometry(c, m, pads, group, k, s, d)))
                assert qconv_uses_winograd(c, m, group, *k, *s, *d, *pads) == want, (c, m, group, k, s, d, pads)


# (c, (h, w), m, pads (top, left, bottom, right)): tile rows in one band and in several (large planes),
# odd widths and heights (a last tile half outside), odd c (a pair with a zero partner), m not a multiple of
# the 5-row tiles, sums over several blocks of 128 channel pairs, every padding up to 2; all inside the rule.
CASES = [
    (32, (8, 8), 32, (1, 1, 1, 1)),
    (33, (9, 7), 40, (1, 1, 1, 1)),
    (64, (56, 56), 64, (1, 1, 1, 1)),   # ResNet-18's first stage: 3 bands of tile rows
    (48, (13, 13), 192, (1, 1, 1, 1)),  # SqueezeNet's fire 6 expand
    (20, (21, 30), 80, (0, 0, 0, 0)),   # no padding
    (16, (23, 18), 64, (1, 1, 1, 1)),   # SqueezeNet's fire 2 expand (shape), 16 channels
    (40, (11, 17), 42, (2, 2, 2, 2)),
    (24, (10, 12), 48, (2, 0, 1, 2)),   # uneven pads
    (600, (7, 7), 33, (1, 1, 1, 1)),    # three blocks of 100 channel pairs
    (37, (3, 4), 30, (1, 1, 1, 1)),     # one panel partly filled
]


@pytest.mark.parametrize("c,hw,m,pads", CASES)
@pytest.mark.parametrize("n", [1, 2])
def test_winograd_is_exact_and_the_direct_kernels_bit_for_bit(c, hw, m, pads, n, every_isa, threads):  # noqa: F811
    rng = np.random.default_rng(c * 1000 + m + n)
    h, wd = hw
    oh, ow = h + pads[0] + pads[2] - 2, wd + pads[1] + pads[3] - 2
    w = rng.integers(-127, 128, (m, c, 3, 3), dtype=np.int8)
    packed = native.qpack(w.reshape(m, -1), owner=w, tag="conv")
    x_scale, x_zero = 0.03, 119
    x = rng.standard_normal((n, c, h, wd), dtype=np.float32)
    xq = np.empty(x.shape, np.uint8)
    native.quantize_u8(x, xq, x_scale, x_zero)
    scale = (rng.random(m, dtype=np.float32) * 0.01 + 0.001) * np.float32(x_scale)
    bias = rng.standard_normal(m, dtype=np.float32)
    res = rng.standard_normal((n, m, oh, ow), dtype=np.float32)
    acc = _qconv_int_ref(xq, x_zero, w, (3, 3), (1, 1), pads, 1, (oh, ow)).reshape(n, m, oh, ow)
    clip = (-0.5, 1.5)
    for act in (0, 1, 2, 7):  # none, Relu, Clip (both in the store), HardSwish (a pass over the rows)
        a = clip if act == 2 else (0.0, 0.0)
        args = (x.shape, packed, m, 1, (3, 3), (1, 1), (1, 1), pads[:2], (oh, ow), scale, bias, act, *a)
        wino, direct = native.qconv2d_prepare(*args, w=w), native.qconv2d_prepare(*args)
        # (every case is a conv the route takes, on the level that has it)
        assert (wino.wino is not None) == _winograd_here() and direct.wino is None
        for residual in (None, res):
            for src in (x, xq):
                for y_q in (None, (0.02, 40)):
                    got, want = (np.empty((n, m, oh, ow), np.uint8 if y_q else np.float32) for _ in range(2))
                    native.qconv2d_call(wino, src, x_scale, x_zero, got, residual=residual, y_q=y_q)
                    native.qconv2d_call(direct, src, x_scale, x_zero, want, residual=residual, y_q=y_q)
                    np.testing.assert_array_equal(got, want)
                    if act in (0, 1) and y_q is None:  # (and against numpy's exact integer sums)
                        ref = scale[:, None, None] * acc.astype(np.float32) + bias[:, None, None]
                        if residual is not None:
                            ref = ref + residual
                        if act == 1:
                            ref = np.where(ref < 0, np.float32(0), ref)
                        np.testing.assert_array_equal(got, ref)


def test_the_largest_sums_stay_exact(every_isa):  # noqa: F811
    """1024 channels (the most the route takes) of inputs 255 with zero point 0 times weights +-127: the
    largest sums the route can meet, |4 S| = 4 x 9 x 1024 x 255 x 127 < 2^31; they come out exact."""
    c, m, h = 1024, 32, 4
    w = np.full((m, c, 3, 3), 127, np.int8)
    w[1::2] = -127
    x = np.full((1, c, h, h), 255, np.uint8)
    packed = native.qpack(w.reshape(m, -1), owner=w, tag="conv")
    scale, bias = np.ones(m, np.float32), np.zeros(m, np.float32)
    prep = native.qconv2d_prepare(x.shape, packed, m, 1, (3, 3), (1, 1), (1, 1), (0, 0), (h - 2, h - 2), scale, bias,
                                  w=w)
    assert (prep.wino is not None) == _winograd_here()
    y = np.empty((1, m, h - 2, h - 2), np.float32)
    native.qconv2d_call(prep, x, 1.0, 0, y)
    full = 9 * c * 255 * 127
    np.testing.assert_array_equal(y[0, 0::2], np.float32(full))
    np.testing.assert_array_equal(y[0, 1::2], np.float32(-full))
