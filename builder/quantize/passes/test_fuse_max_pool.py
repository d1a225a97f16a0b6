"""quant_fuse_max_pool: QConv -> plain MaxPool folds into the QConv; padded pools are refused."""
import numpy as np
from onnx import helper as h

from minirt.builder.quantize.passes import testing as Q
from minirt.builder.quantize.passes.fuse_max_pool import FuseMaxPool

X = {"x": Q.R.standard_normal((1, 2, 8, 8)).astype(np.float32)}


def _model(**pool):
    nodes = [h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             h.make_node("MaxPool", ["c"], ["y"], **{"kernel_shape": [2, 2], "strides": [2, 2], **pool})]
    return Q.make_model(nodes, [Q.vinfo("x", [1, 2, 8, 8])], [Q.vinfo("y", ["n", "c", "h", "w"])], [Q.tensor("w", Q.weight(4, 2, 3, 3))])


def test_fuses_a_plain_max_pool():
    m, _ = Q.quantized(_model())
    before = m.clone()
    p = FuseMaxPool()
    assert p(m).modified and not p.refusals
    assert Q.ops(m) == {"com.minirt::QConv": 1}
    qconv = next(iter(m.graph))
    assert list(qconv.attributes["pool_kernel_shape"].value) == [2, 2] and qconv.outputs[0].name == "y"
    Q.parity(before, m, X)
    assert not FuseMaxPool()(m).modified  # already fused: nothing left to do


def test_padded_pool_is_refused():
    m, _ = Q.quantized(_model(pads=[1, 1, 1, 1]))
    p = FuseMaxPool()
    assert not p(m).modified
    assert Q.ops(m) == {"com.minirt::QConv": 1, "MaxPool": 1}
    assert "pads" in p.refusals[0].reason


def test_no_qconv_and_empty_graph():
    m = Q.T.load(_model())  # float graph: no QConv to fuse into
    assert not FuseMaxPool()(m).modified and Q.ops(m) == {"Conv": 1, "MaxPool": 1}
    assert not FuseMaxPool()(Q.empty_model()).modified
