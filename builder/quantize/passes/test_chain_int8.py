"""quant_chain_int8: a QConv read only by QConvs with one static uint8 quantization writes uint8 in it
(by default only into / out of depthwise QConvs); readers that disagree are refused."""
import numpy as np
import onnx_ir as ir
from onnx import helper as h

from minirt.builder.quantize.passes import testing as Q
from minirt.builder.quantize.passes.chain_int8 import ChainInt8
from minirt.builder.quantize.qir import QuantContext

X = {"x": Q.R.standard_normal((1, 4, 8, 8)).astype(np.float32)}


def _model(group=4, readers=1):
    nodes = [h.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1], name="pw")]
    inits = [Q.tensor("w1", Q.weight(4, 4, 1, 1)), Q.tensor("w2", Q.weight(4, 4 // group, 3, 3))]
    outputs = []
    for i in range(readers):
        nodes.append(h.make_node("Conv", ["c", "w2"], [f"y{i}"], group=group, name=f"dw{i}"))
        outputs.append(Q.vinfo(f"y{i}", [1, 4, 8, 8]))
    return Q.make_model(nodes, [Q.vinfo("x", [1, 4, 8, 8])], outputs, inits)


def _chained(m):
    return {n.name for n in m.graph if "output_scale" in n.attributes}


def test_chains_into_a_depthwise_qconv():
    m, context = Q.quantized(_model())
    before = m.clone()
    assert ChainInt8(context)(m).modified
    assert _chained(m) == {"pw"} and next(iter(m.graph)).outputs[0].dtype == ir.DataType.UINT8
    Q.parity(before, m, X, atol=1e-4)
    assert not ChainInt8(context)(m).modified


def test_gemm_convs_chain_only_when_asked():
    m, context = Q.quantized(_model(group=1))
    assert not ChainInt8(context)(m).modified  # "depthwise": between GEMM convs chaining is slower
    assert not ChainInt8(QuantContext(chain=False))(m).modified
    assert ChainInt8(QuantContext(chain=True))(m).modified and _chained(m) == {"pw"}


def test_readers_with_different_scales_are_refused():
    m, context = Q.quantized(_model(readers=2))
    reader = [n for n in m.graph if n.name == "dw1"][0]
    other = ir.Value(name="other_scale", shape=ir.Shape([]), type=ir.TensorType(ir.DataType.FLOAT),
                     const_value=ir.tensor(np.array(0.5, np.float32), name="other_scale"))
    m.graph.register_initializer(other)
    reader.replace_input_with(1, other)
    p = ChainInt8(context)
    assert not p(m).modified
    assert "different scales" in p.refusals[0].reason


def test_dynamic_and_empty_graph():
    m, context = Q.quantized(_model(), static=False)
    assert not ChainInt8(context)(m).modified
    assert not ChainInt8()(Q.empty_model()).modified
