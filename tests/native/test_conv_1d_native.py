"""1-D convolutions on the native 2-D path: Conv / FusedConv of (N, C, W) run as the conv of (N, C, 1, W)
by a 1 x K kernel (minirt/kernels/nn.py), against onnxruntime, and replay as one native program."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import minirt
from minirt import native
from minirt.builder import build_bytes

pytestmark = pytest.mark.skipif(not native.available, reason="native kernels not built")

# (C, W, M, K, group, stride, dilation, pads (begin, end))
CASES = [
    (1, 400, 32, 10, 1, 5, 1, (0, 0)),        # wav2vec2's first layer: one input channel, stride 5
    (16, 101, 32, 3, 1, 2, 1, (0, 0)),         # stride 2, odd width
    (24, 77, 40, 3, 1, 1, 1, (1, 1)),          # "same", M not a multiple of the panel
    (12, 50, 12, 5, 12, 1, 1, (2, 2)),         # depthwise
    (16, 63, 32, 7, 4, 1, 2, (3, 5)),          # groups, dilation, asymmetric pads
    (64, 33, 64, 2, 1, 2, 1, (0, 0)),          # kernel 2 stride 2 (wav2vec2's last layers)
    (80, 120, 96, 3, 1, 2, 1, (1, 1)),         # whisper's second conv, shrunk
    (32, 200, 64, 1, 1, 1, 1, (0, 0)),         # 1 x 1
    (32, 40, 32, 16, 8, 1, 1, (8, 8)),         # grouped long kernel (wav2vec2's positional conv, shrunk)
]


def _model(c, w, m, k, group, stride, dil, pads, act=None, residual=False, bias=True, n=1):
    rng = np.random.default_rng(c * 1000 + w + m + k)
    W = (rng.standard_normal((m, c // group, k)) * 0.2).astype(np.float32)
    inits = [numpy_helper.from_array(W, "W")]
    ins = ["x", "W"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(m).astype(np.float32), "B"))
        ins.append("B")
    ow = (w + pads[0] + pads[1] - dil * (k - 1) - 1) // stride + 1
    nodes = [helper.make_node("Conv", ins, ["c"], group=group, strides=[stride], dilations=[dil], pads=list(pads))]
    last = "c"
    graph_in = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, w])]
    if residual:
        nodes.append(helper.make_node("Add", ["c", "z"], ["s"]))
        graph_in.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [n, m, ow]))
        last = "s"
    if act:
        nodes.append(helper.make_node(act, [last], ["y"]))
        last = "y"
    # a second (1 x 1) conv reads the first one's result: an arena buffer, so the run can replay as a program
    inits.append(numpy_helper.from_array((rng.standard_normal((8, m, 1)) * 0.2).astype(np.float32), "W2"))
    nodes.append(helper.make_node("Conv", [last, "W2"], ["out"]))
    g = helper.make_graph(nodes, "g", graph_in, [helper.make_tensor_value_info("out", TensorProto.FLOAT, [n, 8, ow])],
                          inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    feed = {"x": rng.standard_normal((n, c, w)).astype(np.float32)}
    if residual:
        feed["z"] = rng.standard_normal((n, m, ow)).astype(np.float32)
    return model, feed


def _ort(model, feed):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]


@pytest.mark.parametrize("case", CASES, ids=[f"c{c[0]}w{c[1]}m{c[2]}k{c[3]}g{c[4]}s{c[5]}d{c[6]}" for c in CASES])
@pytest.mark.parametrize("fused", [None, "relu_res", "gelu"])
def test_conv_1d_native_matches_onnxruntime(case, fused):
    act = {"relu_res": "Relu", "gelu": "Gelu"}.get(fused)
    model, feed = _model(*case, act=act, residual=fused == "relu_res")
    want = _ort(model, feed)
    sess = minirt.Session(build_bytes(model))
    for _ in range(3):  # plain run, planned run (recorded), replayed program
        got = sess.run(None, feed)[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    status = [p["native_program"] for p in sess.memory_plans()]
    assert any(s and s.endswith("native calls") for s in status), status


def test_conv_1d_batch_and_threads_agree():
    model, feed = _model(16, 90, 48, 3, 1, 2, 1, (1, 1), act="Relu", n=3)
    want = _ort(model, feed)
    results = [minirt.Session(build_bytes(model), threads=t).run(None, feed)[0] for t in (1, 2)]
    np.testing.assert_allclose(results[0], want, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(results[0], results[1])


def test_conv_1d_kernel_uses_the_native_call(monkeypatch):
    """The standard Conv kernel on rank-3 float32 input goes through the native conv (not numpy)."""
    from minirt.kernels import nn

    calls = []
    real = native.conv2d_call
    monkeypatch.setattr(native, "conv2d_call", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 8, 31)).astype(np.float32)
    w = rng.standard_normal((16, 8, 3)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    y = nn.conv(x, w, b, pads=(1, 2), strides=(2,))
    assert calls
    ref = nn.conv(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), pads=(1, 2), strides=(2,))
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def _column_model(c, h, m, k, group, stride, dil, pads, act=None):
    """A k x 1 conv down a (N, C, H, 1) image (magika's 5 x 1 over 512 x 1), then a 1 x 1 conv."""
    rng = np.random.default_rng(c * 100 + h + m + k)
    W = (rng.standard_normal((m, c // group, k, 1)) * 0.2).astype(np.float32)
    inits = [numpy_helper.from_array(W, "W"), numpy_helper.from_array(rng.standard_normal(m).astype(np.float32), "B"),
             numpy_helper.from_array((rng.standard_normal((8, m, 1, 1)) * 0.2).astype(np.float32), "W2")]
    oh = (h + pads[0] + pads[1] - dil * (k - 1) - 1) // stride + 1
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], group=group, strides=[stride, 1], dilations=[dil, 1],
                              pads=[pads[0], 0, pads[1], 0])]
    last = "c"
    if act:
        nodes.append(helper.make_node(act, ["c"], ["a"]))
        last = "a"
    nodes.append(helper.make_node("Conv", [last, "W2"], ["out"]))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, 1])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 8, oh, 1])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    return model, {"x": rng.standard_normal((1, c, h, 1)).astype(np.float32)}


@pytest.mark.parametrize("case", [(256, 96, 64, 5, 1, 1, 1, (0, 0)), (16, 101, 32, 3, 1, 2, 1, (1, 1)),
                                  (12, 50, 12, 5, 12, 1, 1, (2, 2)), (16, 63, 32, 7, 4, 1, 2, (3, 5))],
                         ids=["magika", "stride2", "depthwise", "groups_dilation"])
@pytest.mark.parametrize("weight_pack", [0, 8, 16, 32])
def test_a_k_by_1_conv_down_a_column_runs_as_a_1d_conv(case, weight_pack, monkeypatch):
    """A k x 1 kernel over a width-1 image takes the 1-D conv along H (the same memory as (N, C, 1, H)):
    the results are onnxruntime's, with the builder's weights packed for every panel width (their tag
    has that 1-D geometry, and the reader accepts it), and the run replays as a native program."""
    from minirt.builder import build

    model, feed = _column_model(*case, act="Relu")
    want = _ort(model, feed)
    geometries = []
    real = native.conv2d_prepare
    monkeypatch.setattr(native, "conv2d_prepare", lambda x_shape, *a, **k: (geometries.append(x_shape),
                                                                            real(x_shape, *a, **k))[1])
    sess = minirt.Session(build(model, None, weight_pack=weight_pack).data, threads=1)
    for _ in range(3):
        np.testing.assert_allclose(sess.run(None, feed)[0], want, rtol=1e-4, atol=1e-4)
    c, h = case[0], case[1]
    if case[4] != c:  # (the depthwise one takes the depthwise kernel, also as a 1-D conv)
        assert (1, c, 1, h) in geometries, geometries
    assert sess.memory_plans()[0]["native_program"].endswith("native calls")
