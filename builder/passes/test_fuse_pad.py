"""Tests for fuse_pad: zero Pad folds into Conv/AveragePool padding; MaxPool, reflect and non-zero pads do not."""
import numpy as np
import onnx
from onnx import helper as h

from minirt.builder.passes import testing as T
from minirt.builder.passes.fuse_pad import FusePad

R = np.random.default_rng(7)
X = {"x": R.standard_normal((1, 2, 6, 6)).astype(np.float32)}


def _m(reader, pads=(0, 0, 1, 2, 0, 0, 2, 1), mode="constant", value=None):
    inits = [T.tensor("p", np.array(pads, np.int64)), T.tensor("w", R.standard_normal((3, 2, 3, 3)).astype(np.float32))]
    pad_inputs = ["x", "p"]
    if value is not None:
        inits.append(T.tensor("v", np.float32(value)))
        pad_inputs.append("v")
    nodes = [h.make_node("Pad", pad_inputs, ["xp"], mode=mode), reader]
    model = T.make_model(nodes, [T.vinfo("x", [1, 2, 6, 6])], [T.vinfo("y", ["n", "c", "h", "w"])], inits)
    return model


def _reader(op):
    if op == "Conv":
        return h.make_node("Conv", ["xp", "w"], ["y"], pads=[1, 1, 1, 1])
    if op == "AveragePool":
        return h.make_node("AveragePool", ["xp"], ["y"], kernel_shape=[3, 3])
    return h.make_node("MaxPool", ["xp"], ["y"], kernel_shape=[3, 3])


def _vinfo_fix(model):
    model.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    return model


def test_conv_and_avgpool():
    for op in ("Conv", "AveragePool"):
        model = _m(_reader(op))
        m, _, _ = T.run_both(model, X, disabled=["fuse_activation"])
        assert T.ops(m) == {op: 1}


def test_near_misses():
    for model, why in [(_m(_reader("MaxPool")), "-inf"), (_m(_reader("Conv"), mode="reflect"), "reflect"),
                       (_m(_reader("Conv"), value=1.0), "not 0"), (_m(_reader("AveragePool"), pads=(0, 1, 0, 0, 0, 0, 0, 0)), "channel")]:
        m = T.load(model)
        p = FusePad()
        assert not p(m).modified
        assert why in p.refusals[0].reason
        T.run_both(model, X)
