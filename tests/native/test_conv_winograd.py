"""Winograd F(2x2, 3x3) convolutions (winograd_impl.h, mrt_conv2d_f32 on the geometries of
mrt_conv2d_uses_winograd) against a float64 numpy convolution, on every ISA (the test hook
mrt_conv2d_winograd_mode(1) runs the kernel where the rule would not: every copy of it is checked)."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

from minirt import native

from .conftest import requires_native, run_under_scratch_limit

pytestmark = requires_native


@contextlib.contextmanager
def winograd_mode(mode: int):
    before = native._lib.mrt_conv2d_winograd_mode(mode)
    try:
        yield
    finally:
        native._lib.mrt_conv2d_winograd_mode(before)


def _reference(x, w, bias, residual, pads, act):
    """float64 direct convolution, 3x3, stride 1; pads (top, left, bottom, right)."""
    pt, pl, pb, pr = pads
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    oh, ow = xp.shape[2] - 2, xp.shape[3] - 2
    y = np.zeros((x.shape[0], w.shape[0], oh, ow))
    for ky in range(3):
        for kx in range(3):
            y += np.einsum("nchw,mc->nmhw", xp[:, :, ky:ky + oh, kx:kx + ow], w[:, :, ky, kx].astype(np.float64))
    if bias is not None:
        y += bias[None, :, None, None]
    if residual is not None:
        y += residual
    if act == native._lib.MRT_ACT_RELU:
        y = np.maximum(y, 0.0)
    elif act == native._lib.MRT_ACT_CLIP:
        y = np.clip(y, 0.0, 6.0)
    return y


def _conv(x, w, bias, residual, pads, act, threads=1):
    n, c, h, wd = x.shape
    oh, ow = h + pads[0] + pads[2] - 2, wd + pads[1] + pads[3] - 2
    y = np.full((n, w.shape[0], oh, ow), np.nan, np.float32)
    a0, a1 = (0.0, 6.0) if act == native._lib.MRT_ACT_CLIP else (0.0, 0.0)
    before = native.threads()
    native.set_threads(threads)
    try:
        native.conv2d(x, w, 1, (3, 3), (1, 1), (1, 1), (pads[0], pads[1]), (oh, ow), y, bias=bias, residual=residual,
                      act=act, a0=a0, a1=a1)
    finally:
        native.set_threads(before)
    return y


# (n, c, m, h, w, pads): tile rows and columns odd and even, an output row shorter than a vector of tiles,
# pads 0, 1, 2 and asymmetric, a panel of tiles split between tile rows, more than 256 channels (the sum in blocks)
SHAPES = [(1, 16, 64, 16, 16, (1, 1, 1, 1)), (2, 24, 40, 15, 17, (1, 1, 1, 1)), (1, 32, 48, 9, 30, (0, 0, 0, 0)),
          (3, 16, 32, 13, 7, (1, 0, 0, 1)), (1, 20, 36, 8, 8, (2, 2, 2, 2)), (1, 64, 64, 28, 28, (1, 1, 1, 1)),
          (1, 40, 16, 11, 40, (0, 1, 1, 0)), (1, 300, 20, 10, 10, (1, 1, 1, 1))]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("epilogue", ["none", "bias+relu", "bias+residual+clip"])
def test_winograd_matches_float64(shape, epilogue, every_isa):
    n, c, m, h, wd, pads = shape
    rng = np.random.default_rng(c * 1000 + m + h)
    x = rng.standard_normal((n, c, h, wd)).astype(np.float32)
    w = (rng.standard_normal((m, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    oh, ow = h + pads[0] + pads[2] - 2, wd + pads[1] + pads[3] - 2
    bias = rng.standard_normal(m).astype(np.float32) if epilogue != "none" else None
    residual = rng.standard_normal((n, m, oh, ow)).astype(np.float32) if "residual" in epilogue else None
    act = {"none": 0, "bias+relu": native._lib.MRT_ACT_RELU, "bias+residual+clip": native._lib.MRT_ACT_CLIP}[epilogue]
    with winograd_mode(1):
        y = _conv(x, w, bias, residual, pads, act)
    ref = _reference(x, w, bias, residual, pads, act)
    assert not np.isnan(y).any()
    np.testing.assert_allclose(y, ref, rtol=0, atol=2e-5 * max(1.0, float(np.abs(ref).max())))


def _layer(seed: int, n: int, h: int, w: int):
    """(x, w, bias, pads) of a 32 -> 48 3x3 conv with 'same' padding over n images of h x w."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 32, h, w)).astype(np.float32)
    weight = (rng.standard_normal((48, 32, 3, 3)) * 0.1).astype(np.float32)
    return x, weight, rng.standard_normal(48).astype(np.float32), (1, 1, 1, 1)


def test_winograd_results_do_not_depend_on_threads_or_batch(every_isa):
    x, w, bias, pads = _layer(5, 3, 30, 26)
    with winograd_mode(1):
        one = _conv(x, w, bias, None, pads, native._lib.MRT_ACT_RELU, threads=1)
        two = _conv(x, w, bias, None, pads, native._lib.MRT_ACT_RELU, threads=2)
        alone = np.concatenate([_conv(x[i:i + 1], w, bias, None, pads, native._lib.MRT_ACT_RELU) for i in range(3)])
    assert one.tobytes() == two.tobytes()
    assert one.tobytes() == alone.tobytes()


def test_winograd_pack_is_g_g_gt():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
    u = native.winograd_pack_w(w).reshape(4, 4, 5, 3)  # [xi // 4][xi % 4][m][c]
    g = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])
    expected = np.einsum("ia,mcab,jb->ijmc", g, w.astype(np.float64), g)
    np.testing.assert_allclose(u, expected, rtol=1e-6, atol=1e-6)


def _uses(c, m, k=(3, 3), s=(1, 1), d=(1, 1), out=(14, 14), group=1) -> bool:
    return bool(native._lib.mrt_conv2d_uses_winograd(native._geometry(1, c, 0, 0, k, s, d, out=out, m=m, group=group)))


def test_the_rule_takes_mid_size_3x3_layers_on_avx2():
    if native.select_isa("avx2") != "avx2":
        native.select_isa("best")
        pytest.skip("the rule takes Winograd on AVX2 only")
    try:
        assert _uses(64, 64, out=(56, 56)) and _uses(256, 256) and _uses(16, 64, out=(55, 55)) and _uses(256, 256, out=(7, 7))
        assert not _uses(16, 16, out=(56, 56))  # (too few channel pairs)
        assert not _uses(384, 384) and not _uses(64, 512)  # (the transformed weights read from memory per band)
        assert not _uses(64, 64, out=(6, 8))  # (under 49 pixels)
        assert not _uses(64, 64, s=(2, 2)) and not _uses(64, 64, d=(2, 2)) and not _uses(64, 64, group=2)
        assert not _uses(64, 64, k=(5, 5)) and not _uses(64, 64, k=(3, 1))
    finally:
        native.select_isa("best")


def test_the_rule_is_off_on_the_other_isas(every_isa):
    if every_isa != "avx2":
        assert not _uses(64, 64, out=(56, 56))
    with winograd_mode(0):
        assert not _uses(64, 64, out=(56, 56))
    with winograd_mode(1):
        assert _uses(2, 3, out=(2, 2)) and not _uses(64, 64, s=(2, 2))


def test_a_session_runs_a_resnet_block_through_winograd_as_onnxruntime(tmp_path):
    """A 3x3 conv + Relu, a 3x3 conv + the block's input + Relu (ResNet's basic block) built and run by a
    session on this host (Winograd where the rule takes it) against onnxruntime."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import helper as h, numpy_helper as nh

    from minirt import Session
    from minirt.builder.build import build

    rng = np.random.default_rng(9)
    w1 = (rng.standard_normal((64, 64, 3, 3)) * 0.05).astype(np.float32)
    w2 = (rng.standard_normal((64, 64, 3, 3)) * 0.05).astype(np.float32)
    b1, b2 = (rng.standard_normal(64).astype(np.float32) for _ in range(2))
    nodes = [h.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("Conv", ["r1", "w2", "b2"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             h.make_node("Add", ["c2", "x"], ["s"]), h.make_node("Relu", ["s"], ["y"])]
    graph = h.make_graph(nodes, "block", [h.make_tensor_value_info("x", 1, [1, 64, 28, 28])],
                         [h.make_tensor_value_info("y", 1, [1, 64, 28, 28])],
                         [nh.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))])
    path = tmp_path / "block.onnx"
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), path)
    build(str(path), str(tmp_path / "block.mrt"), target="host")
    x = rng.standard_normal((1, 64, 28, 28)).astype(np.float32)
    ours = Session(str(tmp_path / "block.mrt")).run(None, {"x": x})[0]
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)


def test_without_scratch_for_its_bands_the_layer_takes_the_direct_path():
    """A thread that cannot get the scratch of a band (the bound of set_scratch_limit; a very wide image)
    computes the layer on the direct paths: the direct path's bits, not an error."""
    x, w, bias, pads = _layer(11, 1, 12, 40)
    with winograd_mode(0):
        direct = _conv(x, w, bias, None, pads, native._lib.MRT_ACT_RELU)

    def winograd():
        with winograd_mode(1):
            return _conv(x, w, bias, None, pads, native._lib.MRT_ACT_RELU)

    # (the direct path here needs ~76 KB of scratch, a band of Winograd ~430 KB)
    assert run_under_scratch_limit(winograd, 128 << 10).tobytes() == direct.tobytes()
