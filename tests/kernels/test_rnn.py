"""RNN / GRU / LSTM through builder -> Session, compared with onnxruntime."""
from __future__ import annotations

import numpy as np
import pytest

from onnx import TensorProto, helper

from tests.kernels.model_run import compare_node, minirt_run, reference_run, single_node

RNG = np.random.default_rng(7)


def _f(*shape, scale=0.5):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _inputs(gates, direction, seq=4, batch=3, inp=5, hidden=4, lens=True, init=True, layout=0):
    dirs = 2 if direction == "bidirectional" else 1
    X = _f(batch, seq, inp) if layout else _f(seq, batch, inp)
    W, R, B = _f(dirs, gates * hidden, inp), _f(dirs, gates * hidden, hidden), _f(dirs, 2 * gates * hidden)
    seq_lens = np.array([seq, 2, 1][:batch], np.int32) if lens else None
    h0 = (_f(batch, dirs, hidden) if layout else _f(dirs, batch, hidden)) if init else None
    return [X, W, R, B, seq_lens, h0], hidden


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("lens", [False, True])
def test_rnn(direction, lens):
    ins, hidden = _inputs(1, direction, lens=lens)
    compare_node("RNN", ins, {"hidden_size": hidden, "direction": direction}, n_outputs=2, opset=14)


def test_rnn_activation_with_alpha_and_clip():
    ins, hidden = _inputs(1, "bidirectional")
    attrs = {"hidden_size": hidden, "direction": "bidirectional", "activations": ["LeakyRelu", "LeakyRelu"],
             "activation_alpha": [0.2, 0.05], "clip": 0.8}
    compare_node("RNN", ins, attrs, n_outputs=2, opset=14)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("linear_before_reset", [0, 1])
def test_gru(direction, linear_before_reset):
    ins, hidden = _inputs(3, direction)
    compare_node("GRU", ins, {"hidden_size": hidden, "direction": direction,
                              "linear_before_reset": linear_before_reset}, n_outputs=2, opset=14, rtol=1e-5)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_lstm_peepholes_initial_state_sequence_lens(direction):
    ins, hidden = _inputs(4, direction)
    dirs = 2 if direction == "bidirectional" else 1
    c0 = _f(dirs, 3, hidden)
    P = _f(dirs, 3 * hidden)
    compare_node("LSTM", ins + [c0, P], {"hidden_size": hidden, "direction": direction}, n_outputs=3, opset=14,
                 rtol=1e-5)


@pytest.mark.parametrize("op, gates, n_out", [("GRU", 3, 2), ("LSTM", 4, 3)])
def test_layout_1_matches_layout_0(op, gates, n_out):
    """onnxruntime has no batch-first (layout=1) recurrences: compare minirt's layout=1 with
    onnxruntime's layout=0 on the same data transposed."""
    ins, hidden = _inputs(gates, "bidirectional", lens=False, layout=1)
    if op == "LSTM":
        ins.append(_f(3, 2, hidden))  # initial_c, batch-first
    attrs = {"hidden_size": hidden, "direction": "bidirectional", "clip": 0.5}
    check_layout_1(op, ins, attrs, n_out)


def check_layout_1(op, ins, attrs, n_out):
    """minirt's ``op`` with layout=1 on batch-first ``ins`` against onnxruntime's layout=0 (it has no
    batch-first recurrences) on the same data transposed: X and the initial states (inputs 5, 6)."""
    model, feeds = single_node(op, ins, dict(attrs, layout=1), n_outputs=n_out, opset=14)
    ins0 = list(ins)
    ins0[0] = np.ascontiguousarray(ins[0].transpose(1, 0, 2))
    for k in (5, 6):
        if k < len(ins) and ins[k] is not None:
            ins0[k] = np.ascontiguousarray(ins[k].transpose(1, 0, 2))
    model0, feeds0 = single_node(op, ins0, attrs, n_outputs=n_out, opset=14)
    expected = reference_run(model0, feeds0)
    del model.graph.output[:]
    model.graph.output.extend(
        helper.make_tensor_value_info(f"out{i}", TensorProto.FLOAT, [None] * (4 if i == 0 else 3)) for i in range(n_out)
    )
    actual = minirt_run(model, feeds)
    np.testing.assert_allclose(actual[0], expected[0].transpose(2, 0, 1, 3), rtol=1e-5, atol=1e-6)
    for a, e in zip(actual[1:], expected[1:]):
        np.testing.assert_allclose(a, e.transpose(1, 0, 2), rtol=1e-5, atol=1e-6)
