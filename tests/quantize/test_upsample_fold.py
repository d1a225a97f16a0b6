"""fold_upsample_add: an Add of a nearest integer-factor Resize that only a QConv reads becomes the
QConv's X_up input (a feature pyramid's top-down path), and a channel Concat of such Resizes in front
of a QConv a QuantizeUpsampleConcat feeding it uint8; identical results either way."""
import numpy as np
import pytest
import onnx
from onnx import helper as h
import onnx_ir as ir

from minirt.builder.passes import optimize
from minirt.builder.passes import testing as T
from minirt.builder.quantize import QuantizeOptions, _run, quantize

R = np.random.default_rng(7)


def _model(mode="nearest", ctm="asymmetric", rounding="floor", extra_use=False, se=False) -> onnx.ModelProto:
    """a (1, 8, 16, 16) + Resize(b (1, 8, 8, 8)) -> 3x3 conv 8 -> 4; extra_use: the Add's output is also an output.
    The same weights on every call."""
    rng = np.random.default_rng(3)
    nodes = [
        h.make_node("Resize", ["b", "", "scales"], ["b_up"], name="up", mode=mode, coordinate_transformation_mode=ctm,
                    nearest_mode=rounding),
        *([h.make_node("Mul", ["a_in", "m"], ["a"], name="se_scale")] if se else []),
        h.make_node("Add", ["a", "b_up"], ["s"], name="add"),
        h.make_node("Conv", ["s", "w", "bias"], ["y"], name="conv", pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["y"], ["y_r"]),
        h.make_node("Conv", ["y_r", "w2", "bias2"], ["out"], name="conv_out"),
    ]
    inits = [T.tensor("scales", np.array([1.0, 1.0, 2.0, 2.0], np.float32)),
             T.tensor("w", rng.standard_normal((4, 8, 3, 3)).astype(np.float32) * 0.3),
             T.tensor("bias", rng.standard_normal(4).astype(np.float32) * 0.1),
             T.tensor("w2", rng.standard_normal((4, 4, 1, 1)).astype(np.float32) * 0.3),
             T.tensor("bias2", rng.standard_normal(4).astype(np.float32) * 0.1)]
    outputs = [T.vinfo("out", [1, 4, 16, 16])] + ([T.vinfo("s", [1, 8, 16, 16])] if extra_use else [])
    inputs = [T.vinfo("a_in", [1, 8, 16, 16]), T.vinfo("m", [1, 8, 1, 1])] if se else [T.vinfo("a", [1, 8, 16, 16])]
    return T.make_model(nodes, inputs + [T.vinfo("b", [1, 8, 8, 8])], outputs, inits)


def _feeds(n=2):
    return [{"a": R.standard_normal((1, 8, 16, 16)).astype(np.float32),
             "b": R.standard_normal((1, 8, 8, 8)).astype(np.float32)} for _ in range(n)]


CALIBRATION = _feeds()


def _quantized(proto, **options):
    model = T.load(proto)
    optimize(model, 2)
    quantize(model, "int8", CALIBRATION, QuantizeOptions(measure_latency=False, **options))
    return model


def test_resize_and_add_fold_into_the_qconv_exactly():
    folded = _quantized(_model())
    ops = [n.op_type for n in folded.graph]
    assert "Resize" not in ops and "Add" not in ops
    qconv = next(n for n in folded.graph if n.name == "conv")
    assert qconv.attributes["x_up_factor"].value == 2 and len(qconv.inputs) == 8
    plain = _quantized(_model(), fold_upsample_add=False)
    assert {"Resize", "Add"} <= {n.op_type for n in plain.graph}
    for feed in _feeds(3):
        np.testing.assert_array_equal(_run.session(folded).run(None, feed)[0], _run.session(plain).run(None, feed)[0])


def test_other_resizes_and_shared_sums_stay():
    for proto in (_model(mode="linear"), _model(ctm="half_pixel"), _model(rounding="round_prefer_floor"),
                  _model(extra_use=True)):
        assert {"Resize", "Add"} <= {n.op_type for n in _quantized(proto).graph}


def _concat_model(shared=False) -> onnx.ModelProto:
    """Concat(Resize(a * ma, 4x), Resize(b, 2x), c) over channels -> 3x3 conv; shared: b's Resize also an output."""
    rng = np.random.default_rng(4)
    nodes = [
        h.make_node("Mul", ["a", "ma"], ["a_s"]),
        h.make_node("Resize", ["a_s", "", "s4"], ["a_up"], mode="nearest", coordinate_transformation_mode="asymmetric",
                    nearest_mode="floor"),
        h.make_node("Resize", ["b", "", "s2"], ["b_up"], mode="nearest", coordinate_transformation_mode="asymmetric",
                    nearest_mode="floor"),
        h.make_node("Concat", ["a_up", "b_up", "c"], ["cat"], axis=1),
        h.make_node("Conv", ["cat", "w", "bias"], ["y"], name="conv", pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["y"], ["y_r"]),
        h.make_node("Conv", ["y_r", "w2", "bias2"], ["out"], name="conv_out"),
    ]
    inits = [T.tensor("s4", np.array([1, 1, 4, 4], np.float32)), T.tensor("s2", np.array([1, 1, 2, 2], np.float32)),
             T.tensor("w", rng.standard_normal((4, 9, 3, 3)).astype(np.float32) * 0.3),
             T.tensor("bias", rng.standard_normal(4).astype(np.float32) * 0.1),
             T.tensor("w2", rng.standard_normal((4, 4, 1, 1)).astype(np.float32) * 0.3),
             T.tensor("bias2", rng.standard_normal(4).astype(np.float32) * 0.1)]
    outputs = [T.vinfo("out", [1, 4, 16, 16])] + ([T.vinfo("b_up", [1, 3, 16, 16])] if shared else [])
    return T.make_model(nodes, [T.vinfo("a", [1, 2, 4, 4]), T.vinfo("ma", [1, 2, 1, 1]), T.vinfo("b", [1, 3, 8, 8]),
                                T.vinfo("c", [1, 4, 16, 16])], outputs, inits)


CONCAT_FEEDS = [{"a": R.standard_normal((1, 2, 4, 4)).astype(np.float32),
                 "ma": R.random((1, 2, 1, 1)).astype(np.float32) + 0.5,
                 "b": R.standard_normal((1, 3, 8, 8)).astype(np.float32),
                 "c": R.standard_normal((1, 4, 16, 16)).astype(np.float32)} for _ in range(3)]


def _quantized_concat(proto, **options):
    model = T.load(proto)
    optimize(model, 2)
    quantize(model, "int8", CONCAT_FEEDS[:2], QuantizeOptions(measure_latency=False, **options))
    return model


def test_resizes_and_concat_become_one_quantizing_node():
    folded = _quantized_concat(_concat_model())
    ops = [n.op_type for n in folded.graph]
    assert not {"Resize", "Concat", "Mul"} & set(ops) and "QuantizeUpsampleConcat" in ops
    q = next(n for n in folded.graph if n.op_type == "QuantizeUpsampleConcat")
    assert list(q.attributes["factors"].value) == [4, 2, 1]
    assert [v.name if v is not None else None for v in q.inputs] == ["a", "ma", "b", None, "c", None]
    # its uint8 output is the Concat's value: its shape (9 channels of 16 x 16), not its last input's
    assert list(q.outputs[0].shape) == [1, 9, 16, 16] and q.outputs[0].dtype == ir.DataType.UINT8
    plain = _quantized_concat(_concat_model(), fold_upsample_add=False)
    assert {"Resize", "Concat"} <= {n.op_type for n in plain.graph}
    for feed in CONCAT_FEEDS:
        np.testing.assert_array_equal(_run.session(folded).run(None, feed)[0], _run.session(plain).run(None, feed)[0])
    # a Resize whose output is read elsewhere too stays, the others fold
    shared = _quantized_concat(_concat_model(shared=True))
    q = next(n for n in shared.graph if n.op_type == "QuantizeUpsampleConcat")
    assert list(q.attributes["factors"].value) == [4, 1, 1] and "Resize" in {n.op_type for n in shared.graph}


def test_a_per_channel_mul_before_the_add_folds_too():
    """Add(Mul(x, s), Resize(b)) with s (N, C, 1, 1) (a squeeze-and-excitation scale): X = x, X_mul = s."""
    feeds = [{"a_in": R.standard_normal((1, 8, 16, 16)).astype(np.float32),
              "m": R.random((1, 8, 1, 1)).astype(np.float32) + 0.5,
              "b": R.standard_normal((1, 8, 8, 8)).astype(np.float32)} for _ in range(3)]
    models = []
    for fold in (True, False):
        model = T.load(_model(se=True))
        optimize(model, 2)
        quantize(model, "int8", feeds[:2], QuantizeOptions(measure_latency=False, fold_upsample_add=fold))
        models.append(model)
    folded, plain = models
    assert not {"Mul", "Add", "Resize"} & {n.op_type for n in folded.graph}
    qconv = next(n for n in folded.graph if n.name == "conv")
    assert [v.name for v in qconv.inputs[7:]] == ["b", "m"] and qconv.inputs[0].name == "a_in"
    for feed in feeds:
        np.testing.assert_array_equal(_run.session(folded).run(None, feed)[0], _run.session(plain).run(None, feed)[0])


@pytest.mark.parametrize("chain", ["depthwise", True])
def test_a_per_channel_mul_read_by_a_qconv_alone_folds(chain):
    """QConv(Mul(x, s)) with s (N, C, 1, 1) -> QConv(x, ..., X_mul=s), identical results; x is the
    output of an int8 conv, which is never chained into X (it is not the quantized input there)."""
    rng = np.random.default_rng(9)
    nodes = [h.make_node("Conv", ["x_in", "w0"], ["x"], name="conv_in", pads=[1, 1, 1, 1]),
             h.make_node("Mul", ["x", "s"], ["xs"]),
             h.make_node("Conv", ["xs", "w", "bias"], ["y"], name="conv", pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["y"], ["y_r"]),
             h.make_node("Conv", ["y_r", "w2"], ["out"], name="conv_out")]
    inits = [T.tensor("w0", rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.3),
             T.tensor("w", rng.standard_normal((4, 8, 3, 3)).astype(np.float32) * 0.3),
             T.tensor("bias", rng.standard_normal(4).astype(np.float32) * 0.1),
             T.tensor("w2", rng.standard_normal((4, 4, 1, 1)).astype(np.float32) * 0.3)]
    proto = T.make_model(nodes, [T.vinfo("x_in", [2, 8, 12, 12]), T.vinfo("s", [2, 8, 1, 1])],
                         [T.vinfo("out", [2, 4, 12, 12])], inits)
    feeds = [{"x_in": rng.standard_normal((2, 8, 12, 12)).astype(np.float32),
              "s": rng.random((2, 8, 1, 1)).astype(np.float32) + 0.5} for _ in range(3)]
    models = []
    for fold in (True, False):
        model = T.load(proto)
        optimize(model, 2)
        quantize(model, "int8", feeds[:2], QuantizeOptions(measure_latency=False, fold_upsample_add=fold,
                                                           chain_int8=chain))
        models.append(model)
    folded, plain = models
    assert "Mul" not in {n.op_type for n in folded.graph} and "Mul" in {n.op_type for n in plain.graph}
    assert "output_scale" not in next(n for n in folded.graph if n.name == "conv_in").attributes
    qconv = next(n for n in folded.graph if n.name == "conv")
    assert qconv.inputs[0].name == "x" and qconv.inputs[7] is None and qconv.inputs[8].name == "s"
    for feed in feeds:
        np.testing.assert_array_equal(_run.session(folded).run(None, feed)[0], _run.session(plain).run(None, feed)[0])


def test_the_quantizing_node_replays_in_a_native_program():
    """QuantizeUpsampleConcat natively is one recordable call per (part, image): its result is final, so
    a program replays it (PP-OCR det's int8 build ran node by node before); the replay equals the
    node-by-node run."""
    from minirt import native

    if not native.available:
        pytest.skip("native kernels not built")
    import minirt

    data = _run.artifact_bytes(_quantized_concat(_concat_model()))
    sess = minirt.Session(data, threads=1)
    nodes = minirt.Session(data, threads=1, native_program=False)
    for feed in CONCAT_FEEDS + CONCAT_FEEDS:
        np.testing.assert_array_equal(sess.run(None, feed)[0], nodes.run(None, feed)[0])
    assert sess.native_program_status().startswith("yes"), sess.native_program_status()
