"""Core ML lowering of the recurrences MIL's lstm / gru cannot express, unrolled over the sequence into
matmuls and gates (targets/coreml/rules.py, _emit_unrolled): torch's GRU (linear_before_reset=1), GRU at
batch > 1, and LSTM / GRU with sequence_lens shorter than the sequence or given at run time.  Each
program is built and converted, read back, run on the MIL evaluator (minirt/tools/mil_eval.py) and
compared with onnxruntime at 1e-5 (tests/coreml/test_rules.py's check)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("coremltools")
pytest.importorskip("onnxruntime")

from tests.coreml.test_rules import check  # noqa: E402
from tests.coreml.test_rules_data_rnn import _refusal  # noqa: E402

RNG = np.random.default_rng(2771)
SEQ, IN, HID = 6, 5, 4
TOL = 1e-5


def _rnn_model(op, direction="forward", batch=1, lbr=1, bias=True, init_h="input", init_c=None, lens=None,
               outputs=("y", "yh"), seq=SEQ, **attrs):
    """An LSTM / GRU model; ``lens``: None, "input" (a run-time int32 [batch] input) or a constant list."""
    nd = 2 if direction == "bidirectional" else 1
    gates = 4 if op == "LSTM" else 3
    inits = [numpy_helper.from_array((RNG.standard_normal((nd, gates * HID, IN)) * 0.6).astype(np.float32), "W"),
             numpy_helper.from_array((RNG.standard_normal((nd, gates * HID, HID)) * 0.6).astype(np.float32), "R")]
    ins = ["x", "W", "R", "", "", "", ""]
    graph_in = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, batch, IN])]
    if bias:
        b = (RNG.standard_normal((nd, 2 * gates * HID)) * 0.5).astype(np.float32)
        inits.append(numpy_helper.from_array(b, "B"))
        ins[3] = "B"
    if lens == "input":
        graph_in.append(helper.make_tensor_value_info("lens", TensorProto.INT32, [batch]))
        ins[4] = "lens"
    elif lens is not None:
        inits.append(numpy_helper.from_array(np.array(lens, np.int32), "lens"))
        ins[4] = "lens"
    for i, how, name in ((5, init_h, "h0"), (6, init_c, "c0")):
        if how == "input":
            graph_in.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [nd, batch, HID]))
            ins[i] = name
        elif how == "const":
            inits.append(numpy_helper.from_array(RNG.standard_normal((nd, batch, HID)).astype(np.float32), name))
            ins[i] = name
    if op == "GRU":
        ins = ins[:6]
        attrs["linear_before_reset"] = lbr
    while ins[-1] == "":
        ins.pop()
    node = helper.make_node(op, ins, list(outputs), hidden_size=HID, direction=direction, **attrs)
    graph = helper.make_graph([node], "g", graph_in,
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs if o],
                              initializer=inits)
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _feeds(model, lens=None):
    feeds = {}
    for vi in model.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        if vi.name == "lens":
            feeds["lens"] = np.asarray(lens, np.int32)
        else:
            feeds[vi.name] = RNG.standard_normal(shape).astype(np.float32)
    return feeds


def _ops(prog) -> set:
    return {op.op_type for op in prog.functions["main"].operations}


# --- GRU: torch's form and batch > 1 -------------------------------------------------------------------


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("batch, bias, init_h", [(1, True, "input"), (3, True, None), (2, False, "const")])
def test_gru_linear_before_reset_1(direction, batch, bias, init_h):
    m = _rnn_model("GRU", direction, batch=batch, bias=bias, init_h=init_h)
    prog = check(m, _feeds(m), tol=TOL)
    assert "gru" not in _ops(prog) and "linear" in _ops(prog)


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_gru_linear_before_reset_0_batch_2(direction):
    m = _rnn_model("GRU", direction, batch=2, lbr=0)
    prog = check(m, _feeds(m), tol=TOL)
    assert "gru" not in _ops(prog)


@pytest.mark.parametrize("outputs", [("", "yh"), ("y",)])
def test_gru_some_outputs(outputs):
    m = _rnn_model("GRU", "bidirectional", batch=2, outputs=outputs)
    check(m, _feeds(m), tol=TOL)


def test_gru_single_step():
    m = _rnn_model("GRU", "bidirectional", batch=2, seq=1, lens="input")
    check(m, _feeds(m, [1, 0]), tol=TOL)


def test_gru_fp16_program_is_close():
    m = _rnn_model("GRU", "bidirectional", batch=2)
    check(m, _feeds(m), precision="fp16", tol=3e-2)


# --- sequence_lens: constant and short, or at run time ------------------------------------------------


@pytest.mark.parametrize("op", ["GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_run_time_sequence_lens(op, direction):
    m = _rnn_model(op, direction, batch=4, lens="input", init_c="const" if op == "LSTM" else None,
                   outputs=("y", "yh", "yc") if op == "LSTM" else ("y", "yh"))
    prog = check(m, _feeds(m, [SEQ, 2, 0, 5]), tol=TOL)  # (0: an empty sequence keeps its initial state)
    assert "lstm" not in _ops(prog) and "gru" not in _ops(prog)


@pytest.mark.parametrize("op", ["GRU", "LSTM"])
def test_constant_short_sequence_lens(op):
    m = _rnn_model(op, "bidirectional", batch=3, lens=[SEQ - 2, SEQ, 1], lbr=0,
                   outputs=("y", "yh", "yc") if op == "LSTM" else ("y", "yh"))
    check(m, _feeds(m), tol=TOL)


def test_lstm_run_time_lens_fp16_program_is_close():
    m = _rnn_model("LSTM", "bidirectional", batch=2, lens="input", init_h=None)
    check(m, _feeds(m, [SEQ, 3]), precision="fp16", tol=3e-2)


def test_unrolled_refusals():
    assert "would unroll" in _refusal(_rnn_model("GRU", "bidirectional", seq=300))
    assert "sequence_lens outside" in _refusal(_rnn_model("LSTM", lens=[SEQ + 1]))
