"""Core ML lowering of Gather (constant indices), Pad (constant / reflect / edge), LSTM and GRU on MIL's
recurrent ops: each
program is built and converted, read back, run on the MIL evaluator (minirt/tools/mil_eval.py) and
compared with onnxruntime (the helpers of tests/coreml/test_rules.py)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

pytest.importorskip("coremltools")
pytest.importorskip("onnxruntime")

from minirt.builder.build import _normalise  # noqa: E402
from minirt.builder.load import load_model  # noqa: E402
from minirt.targets.coreml import CoreMLSpec  # noqa: E402
from minirt.targets.profiles import get_target  # noqa: E402
from minirt.targets.providers import SupportContext  # noqa: E402
from tests.coreml.test_rules import _model, check  # noqa: E402

RNG = np.random.default_rng(27)


def _i64(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _f32(name, arr):
    return numpy_helper.from_array(np.asarray(arr, np.float32), name)


def _refusal(model):
    model_ir, _ = load_model(model)
    _normalise(model_ir)
    ctx = SupportContext(model_ir, get_target("macos"))
    ok, why = CoreMLSpec().supports(next(iter(model_ir.graph)), ctx)
    assert not ok
    return why


# --- Gather ---------------------------------------------------------------------------------

X3 = RNG.standard_normal((3, 5, 6)).astype(np.float32)


@pytest.mark.parametrize(
    "axis, indices",
    [
        (0, [2, 0, -1, 1]),               # 1-D, a negative index
        (1, 3),                           # scalar: drops the axis
        (1, -2),                          # negative scalar
        (-1, [[0, 5], [-6, 2], [1, 1]]),  # 2-D indices on the last axis
    ],
)
def test_gather_constant_indices(axis, indices):
    idx = _i64("idx", indices)
    m = _model([helper.make_node("Gather", ["x", "idx"], ["g"], axis=axis),
                helper.make_node("Relu", ["g"], ["y"])], [("x", X3.shape)], ["y"], [idx])
    prog = check(m, {"x": X3})
    assert "gather" in {op.op_type for op in prog.functions["main"].operations}


def test_gather_refusals():
    m = _model([helper.make_node("Gather", ["x", "idx"], ["y"], axis=1)], [("x", X3.shape)], ["y"], [_i64("idx", [0, 5])])
    assert "outside" in _refusal(m)


# --- Pad ------------------------------------------------------------------------------------

X4 = RNG.standard_normal((1, 3, 5, 6)).astype(np.float32)


@pytest.mark.parametrize(
    "mode, pads, axes",
    [
        ("constant", [0, 1, 2, 0, 0, 2, 1, 3], None),  # the channel axis too
        ("constant", [0, 0, 0, 0, 0, 0, 0, 2], None),  # the last axis only
        ("reflect", [0, 0, 2, 1, 0, 0, 1, 4], None),
        ("reflect", [0, 0, 0, 3, 0, 0, 0, 5], None),   # at the limit D-1 on the last axis
        ("edge", [0, 0, 3, 0, 0, 0, 1, 6], None),      # as wide as the axis: MIL replicate's limit
        ("reflect", [1, 2, 2, 1], [2, 3]),             # opset-18 axes input
        ("edge", [2, 1], [-1]),
    ],
)
def test_pad(mode, pads, axes):
    inits = [_i64("pads", pads), _f32("val", 1.5)]
    names = ["x", "pads", "val"]
    if axes is not None:
        inits.append(_i64("axes", axes))
        names.append("axes")
    m = _model([helper.make_node("Pad", names, ["y"], mode=mode)], [("x", X4.shape)], ["y"], inits, opset=18)
    prog = check(m, {"x": X4})
    assert "pad" in {op.op_type for op in prog.functions["main"].operations}


def test_pad_reflect_1d():
    x = RNG.standard_normal((2, 4, 9)).astype(np.float32)
    m = _model([helper.make_node("Pad", ["x", "pads"], ["y"], mode="reflect")], [("x", x.shape)], ["y"],
               [_i64("pads", [0, 0, 3, 0, 0, 2])])
    check(m, {"x": x})


def test_pad_attributes_before_opset_11():
    m = _model([helper.make_node("Pad", ["x"], ["y"], mode="constant", pads=[0, 0, 1, 2, 0, 0, 3, 0], value=-2.0)],
               [("x", X4.shape)], ["y"], opset=10)
    check(m, {"x": X4})


@pytest.mark.parametrize(
    "mode, pads, reason",
    [
        ("wrap", [0, 0, 1, 1, 0, 0, 1, 1], "no Core ML equivalent"),
        ("reflect", [0, 1, 0, 0, 0, 1, 0, 0], "other than the last two"),
        ("reflect", [0, 0, 5, 0, 0, 0, 0, 0], "wider than axis 2"),
        ("constant", [0, 0, -1, 0, 0, 0, 0, 0], "negative pads"),
    ],
)
def test_pad_refusals(mode, pads, reason):
    m = _model([helper.make_node("Pad", ["x", "pads"], ["y"], mode=mode)], [("x", X4.shape)], ["y"],
               [_i64("pads", pads)], opset=19)
    assert reason in _refusal(m)


# --- LSTM -----------------------------------------------------------------------------------

SEQ, BATCH, IN, HID = 5, 2, 4, 3


def _lstm_model(direction, outputs=("y", "yh", "yc"), bias=True, init_h="input", init_c="const",
                seq_lens=False, extra=None, **attrs):
    nd = 2 if direction == "bidirectional" else 1
    w = RNG.standard_normal((nd, 4 * HID, IN)).astype(np.float32) * 0.6
    r = RNG.standard_normal((nd, 4 * HID, HID)).astype(np.float32) * 0.6
    inits = [_f32("W", w), _f32("R", r)]
    ins = ["x", "W", "R", "", "", "", ""]
    graph_in = [("x", (SEQ, BATCH, IN))]
    if bias:
        inits.append(_f32("B", RNG.standard_normal((nd, 8 * HID)) * 0.5))
        ins[3] = "B"
    if seq_lens:
        inits.append(numpy_helper.from_array(np.full(BATCH, SEQ, np.int32), "lens"))
        ins[4] = "lens"
    for i, (how, name) in ((5, (init_h, "h0")), (6, (init_c, "c0"))):
        if how == "input":
            graph_in.append((name, (nd, BATCH, HID)))
            ins[i] = name
        elif how == "const":
            inits.append(_f32(name, RNG.standard_normal((nd, BATCH, HID))))
            ins[i] = name
    if extra:
        ins.append(extra[0])
        inits.append(extra[1])
    while ins and ins[-1] == "":
        ins.pop()
    node = helper.make_node("LSTM", ins, list(outputs), hidden_size=HID, direction=direction, **attrs)
    return _model([node], graph_in, [o for o in outputs if o], inits)


def _rnn_feeds(model):
    """Random values for every graph input (x and run-time initial states)."""
    feeds = {}
    for vi in model.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = RNG.standard_normal(shape).astype(np.float32)
    return feeds


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("bias, init_h, init_c, seq_lens", [(True, "input", "const", False), (False, None, None, True)])
def test_lstm(direction, bias, init_h, init_c, seq_lens):
    m = _lstm_model(direction, bias=bias, init_h=init_h, init_c=init_c, seq_lens=seq_lens)
    prog = check(m, _rnn_feeds(m))
    assert "lstm" in {op.op_type for op in prog.functions["main"].operations}


@pytest.mark.parametrize("outputs", [("", "yh"), ("y",), ("", "", "yc")])
def test_lstm_some_outputs(outputs):
    m = _lstm_model("bidirectional", outputs=outputs)
    check(m, _rnn_feeds(m))


def test_lstm_fp16_program_is_close():
    m = _lstm_model("bidirectional")
    check(m, _rnn_feeds(m), precision="fp16", tol=3e-2)


@pytest.mark.parametrize(
    "kwargs, reason",
    [
        (dict(extra=("P", _f32("P", np.ones((1, 3 * HID))))), "peepholes"),
        (dict(clip=2.0), "clip"),
        (dict(activations=["Sigmoid", "Relu", "Tanh"]), "activations"),
        (dict(layout=1), "layout=1"),
    ],
)
def test_lstm_refusals(kwargs, reason):
    assert reason in _refusal(_lstm_model("forward", **kwargs))


# --- GRU ------------------------------------------------------------------------------------


def _gru_model(direction, batch=1, lbr=0, bias=True, init_h="input", outputs=("y", "yh"), **attrs):
    nd = 2 if direction == "bidirectional" else 1
    inits = [_f32("W", RNG.standard_normal((nd, 3 * HID, IN)) * 0.6),
             _f32("R", RNG.standard_normal((nd, 3 * HID, HID)) * 0.6)]
    ins = ["x", "W", "R", "", "", ""]
    graph_in = [("x", (SEQ, batch, IN))]
    if bias:
        inits.append(_f32("B", RNG.standard_normal((nd, 6 * HID)) * 0.5))
        ins[3] = "B"
    if init_h == "input":
        graph_in.append(("h0", (nd, batch, HID)))
        ins[5] = "h0"
    elif init_h == "const":
        inits.append(_f32("h0", RNG.standard_normal((nd, batch, HID))))
        ins[5] = "h0"
    while ins[-1] == "":
        ins.pop()
    node = helper.make_node("GRU", ins, list(outputs), hidden_size=HID, direction=direction,
                            linear_before_reset=lbr, **attrs)
    return _model([node], graph_in, [o for o in outputs if o], inits)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("bias, init_h", [(True, "input"), (False, "const"), (True, None)])
def test_gru_linear_before_reset_0(direction, bias, init_h):
    m = _gru_model(direction, bias=bias, init_h=init_h)
    prog = check(m, _rnn_feeds(m))
    assert "gru" in {op.op_type for op in prog.functions["main"].operations}


def test_gru_fp16_program_is_close():
    m = _gru_model("bidirectional", outputs=("", "yh"))
    check(m, _rnn_feeds(m), precision="fp16", tol=3e-2)


# (torch's GRU, linear_before_reset=1, GRU at batch > 1 and short or run-time sequence_lens are lowered
# unrolled: tests/coreml/test_rules_unrolled_rnn.py.)
@pytest.mark.parametrize(
    "kwargs, reason",
    [
        (dict(activations=["Sigmoid", "Relu"]), "activations"),
        (dict(clip=1.5), "clip"),
    ],
)
def test_gru_refusals(kwargs, reason):
    assert reason in _refusal(_gru_model("forward", **kwargs))
