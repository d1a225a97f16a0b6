"""int8 ConvTranspose (D55): a ConvTranspose with stride == kernel becomes a QConvTranspose
(uint8 between two of them), computed with exact integer sums; against onnxruntime's float model."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper as h

import minirt
from minirt.builder.lower import artifact_bytes
from minirt.builder.passes import optimize
from minirt.builder.passes import testing as T
from minirt.builder.quantize import QuantizeOptions, quantize
from minirt import native


def _head(k2=(2, 2), s2=(2, 2), pads2=(0, 0, 0, 0)):
    """A detection head: 3x3 conv 4 -> 6, Relu, ConvTranspose 6 -> 5 (2x2 / stride 2, bias), Relu,
    ConvTranspose 5 -> 2 (kernel k2, strides s2), Sigmoid; batch and plane symbolic."""
    rng = np.random.default_rng(11)
    nodes = [
        h.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c"], ["c_r"]),
        h.make_node("ConvTranspose", ["c_r", "wt1", "bt1"], ["u1"], name="up1", kernel_shape=[2, 2], strides=[2, 2]),
        h.make_node("Relu", ["u1"], ["u1_r"]),
        h.make_node("ConvTranspose", ["u1_r", "wt2"], ["u2"], name="up2", kernel_shape=list(k2), strides=list(s2),
                    pads=list(pads2)),
        h.make_node("Sigmoid", ["u2"], ["y"]),
    ]
    inits = [T.tensor("w", rng.standard_normal((6, 4, 3, 3)).astype(np.float32) * 0.3),
             T.tensor("b", rng.standard_normal(6).astype(np.float32) * 0.1),
             T.tensor("wt1", rng.standard_normal((6, 5, 2, 2)).astype(np.float32) * 0.4),
             T.tensor("bt1", rng.standard_normal(5).astype(np.float32) * 0.1),
             T.tensor("wt2", rng.standard_normal((5, 2) + tuple(k2)).astype(np.float32) * 0.4)]
    return T.make_model(nodes, [T.vinfo("x", ["N", 4, "H", "W"])], [T.vinfo("y", ["N", 2, None, None])], inits)


def _feed(n, hh=7, ww=9, seed=0):
    return {"x": np.random.default_rng(seed).standard_normal((n, 4, hh, ww)).astype(np.float32)}


CALIBRATION = [_feed(1, seed=s) for s in range(4)]


def _quantized(proto, mode="int8", **options):
    model = T.load(proto)
    optimize(model, 2)
    report = quantize(model, mode, CALIBRATION if mode == "int8" else None,
                      QuantizeOptions(measure_latency=False, **options))
    return model, report


@pytest.mark.parametrize("isa", ["avx512", "avx2", "baseline"])
@pytest.mark.parametrize("threads", [1, 2])
def test_int8_conv_transposes_match_onnxruntime(isa, threads):
    proto = _head()
    model, report = _quantized(proto, quantize_final_conv_transpose=True)  # (the final one too: asked)
    convt = [n for n in model.graph if n.op_type == "QConvTranspose"]
    assert [n.name for n in convt] == ["up1", "up2"] and {"up1", "up2"} <= set(report.quantized)
    # up1 writes uint8 in up2's input quantization; up2 (the final layer) writes the float output
    assert "output_scale" in convt[0].attributes and convt[1].inputs[0] is convt[0].outputs[0]
    assert "output_scale" not in convt[1].attributes
    ref = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    if native.available:
        before = native.isa
        if native.select_isa(isa) != isa:
            native.select_isa(before)
            pytest.skip(f"{isa} is not available on this CPU")
    try:
        sess = minirt.Session(artifact_bytes(model), threads=threads)
        for n, hh, ww, seed in ((1, 7, 9, 10), (2, 7, 9, 11), (2, 13, 5, 12)):  # batch 2, odd planes
            feed = _feed(n, hh, ww, seed)
            got, want = sess.run(None, feed)[0], ref.run(None, feed)[0]
            assert got.shape == want.shape == (n, 2, 4 * hh, 4 * ww)
            np.testing.assert_allclose(got, want, atol=0.05)
    finally:
        if native.available:
            native.select_isa(before)


def test_conv_transposes_kept_float_when_not_int8():
    # off, int8-dynamic, the final one by default (as quantize_final): weights stored int8, computed float
    # (FusedConvTranspose)
    for options, mode, float_ones in (({"int8_conv_transpose": False}, "int8", 2), ({}, "int8-dynamic", 2),
                                      ({}, "int8", 1)):
        model, report = _quantized(_head(), mode, **options)
        ops = T.ops(model)
        assert ops["com.minirt::FusedConvTranspose"] == float_ones and ops["com.minirt::QConvTranspose"] == 2 - float_ones
        assert "up2" in report.weight_only
        assert not any("output_scale" in n.attributes for n in model.graph if n.op_type == "QConvTranspose")
    # overlapping taps (kernel 3, stride 2, padding): not the tile form (and final: computed in float, from
    # int8 weights unless quantize_final is off)
    model, report = _quantized(_head(k2=(3, 3), s2=(2, 2), pads2=(1, 1, 0, 0)))
    assert T.ops(model)["com.minirt::QConvTranspose"] == 1 and "up2" in report.weight_only
    model, report = _quantized(_head(k2=(3, 3), s2=(2, 2), pads2=(1, 1, 0, 0)), quantize_final=False)
    assert T.ops(model)["com.minirt::QConvTranspose"] == 1 and "up2" in {k["node"] for k in report.kept_float}


@pytest.mark.parametrize("chain", [True, False])
def test_an_int8_conv_transpose_replays_in_a_native_program(chain):
    """QConvTranspose natively is the input's quantization (when it is float: mrt_quantize_u8_f32) and the
    tiles (mrt_qconvtranspose_tiles), both recordable (D150): the head replays as one program (PP-OCR det's
    int8 build stopped at its ConvTranspose), equal to the node-by-node run."""
    if not native.available:
        pytest.skip("native kernels not built")
    model, report = _quantized(_head(), quantize_final_conv_transpose=True, chain_int8=chain)
    assert {"up1", "up2"} <= set(report.quantized)
    data = artifact_bytes(model)
    sess = minirt.Session(data, threads=1)
    nodes = minirt.Session(data, threads=1, native_program=False)
    for feed in CALIBRATION:
        np.testing.assert_array_equal(sess.run(None, feed)[0], nodes.run(None, feed)[0])
    assert sess.native_program_status().startswith("yes"), sess.native_program_status()
