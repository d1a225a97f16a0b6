"""LSTM / GRU on the native path (minirt.native.rnn_call) and on the numpy path, against onnxruntime.

The same tests run with the native kernels on, with ``MINIRT_DISABLE_NATIVE=1`` (numpy only: the
``native`` fixture then skips the native-only checks) and with ``MINIRT_NATIVE_ISA=baseline``.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import minirt
from minirt import native
from minirt.builder import build_bytes
from minirt.kernels import rnn as rnn_mod
from tests.kernels.model_run import compare_node, reference_run, single_node
from tests.kernels.test_rnn import check_layout_1

RNG = np.random.default_rng(11)


def _f(*shape, scale=0.5):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _layer(op, direction, batch, seq=6, inp=5, hidden=7, lens=False, init=False, peep=False, layout=0):
    """The inputs of one layer (layout 0 unless told): X, W, R, B, sequence_lens, initial_h[, initial_c, P]."""
    gates = 4 if op == "LSTM" else 3
    dirs = 2 if direction == "bidirectional" else 1
    X = _f(batch, seq, inp) if layout else _f(seq, batch, inp)
    W, R, B = _f(dirs, gates * hidden, inp), _f(dirs, gates * hidden, hidden), _f(dirs, 2 * gates * hidden)
    seq_lens = np.array([seq, 3, 1, seq - 1][:batch], np.int32) if lens else None
    state = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    ins = [X, W, R, B, seq_lens, _f(*state) if init else None]
    if op == "LSTM":
        ins += [_f(*state) if init else None, _f(dirs, 3 * hidden) if peep else None]
    while ins[-1] is None:
        ins.pop()
    return ins, hidden


@pytest.fixture
def count_native(monkeypatch):
    """The number of native LSTM / GRU calls made so far (a list of one int)."""
    calls = [0]
    if native.available:
        real = native.rnn_call

        def counting(*args):
            calls[0] += 1
            return real(*args)

        monkeypatch.setattr(native, "rnn_call", counting)
    return calls


def _expect_native(calls, n=1):
    assert calls[0] == (n if native.available else 0)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("lens", [False, True])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("variant", ["plain", "init_peepholes", "clip_input_forget"])
def test_lstm(variant, direction, lens, batch, count_native):
    init = variant != "plain"
    ins, hidden = _layer("LSTM", direction, batch, lens=lens, init=init, peep=variant == "init_peepholes")
    attrs = {"hidden_size": hidden, "direction": direction}
    if variant == "clip_input_forget":
        attrs.update(clip=0.7, input_forget=1)
    compare_node("LSTM", ins, attrs, n_outputs=3, opset=14, rtol=1e-5, atol=1e-6)
    _expect_native(count_native)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("lens", [False, True])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("linear_before_reset", [0, 1])
@pytest.mark.parametrize("variant", ["plain", "init_clip"])
def test_gru(variant, linear_before_reset, direction, lens, batch, count_native):
    ins, hidden = _layer("GRU", direction, batch, lens=lens, init=variant == "init_clip")
    attrs = {"hidden_size": hidden, "direction": direction, "linear_before_reset": linear_before_reset}
    if variant == "init_clip":
        attrs["clip"] = 0.6
    compare_node("GRU", ins, attrs, n_outputs=2, opset=14, rtol=1e-5, atol=1e-6)
    _expect_native(count_native)


@pytest.mark.parametrize("lens", [False, True])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_layout_1(op, direction, lens, count_native):
    """onnxruntime has no batch-first recurrences: minirt's layout 1 against onnxruntime's layout 0
    on the same data transposed."""
    ins, hidden = _layer(op, direction, 3, lens=lens, init=True, peep=True, layout=1)
    n_out = 3 if op == "LSTM" else 2
    attrs = {"hidden_size": hidden, "direction": direction, "clip": 0.9}
    check_layout_1(op, ins, attrs, n_out)
    _expect_native(count_native)


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_zero_length_sequence_against_the_numpy_path(op, direction, monkeypatch):
    """sequence_lens 0 (onnxruntime refuses it): the state stays the initial one, Y is zeros; the
    native path agrees with the numpy one."""
    ins, hidden = _layer(op, direction, 3, lens=True, init=True, peep=True)
    ins[4] = np.array([6, 0, 2], np.int32)
    fn = rnn_mod.lstm if op == "LSTM" else rnn_mod.gru
    got = fn(*ins, hidden_size=hidden, direction=direction)
    monkeypatch.setattr(native, "available", False)
    want = fn(*ins, hidden_size=hidden, direction=direction)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert not got[0][:, :, 1].any()
    np.testing.assert_array_equal(got[1][:, 1], ins[5][:, 1])


@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("op", ["LSTM", "GRU", "GRU-lbr"])
def test_uneven_lengths_of_a_wide_batch_against_onnxruntime(op, layout, count_native):
    """Sequences that end at different steps in a batch of 7 (more rows than the few-row product
    takes): the native kernel projects only the rows inside a sequence and runs each step's
    product over the rows still active (D86); onnxruntime (layout 0) or the transposed check
    (layout 1) is the reference."""
    kind = op.split("-")[0]
    ins, hidden = _layer(kind, "bidirectional", 7, seq=9, inp=6, hidden=9, init=True, peep=True, layout=layout)
    ins[4] = np.array([9, 3, 1, 8, 9, 5, 2], np.int32)
    attrs = {"hidden_size": hidden, "direction": "bidirectional"}
    if op == "GRU-lbr":
        attrs["linear_before_reset"] = 1
    n_out = 3 if kind == "LSTM" else 2
    if layout:
        check_layout_1(kind, ins, attrs, n_out)
    else:
        compare_node(kind, ins, attrs, n_outputs=n_out, opset=14, rtol=1e-5, atol=1e-6)
    _expect_native(count_native)


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_sequence_lens_out_of_range_names_the_op(op):
    ins, hidden = _layer(op, "forward", 3, lens=True)
    ins[4] = np.array([6, 7, 1], np.int32)
    fn = rnn_mod.lstm if op == "LSTM" else rnn_mod.gru
    with pytest.raises(ValueError, match=f"{op}: sequence_lens"):
        fn(*ins, hidden_size=hidden)


@pytest.mark.parametrize("native_on", [True, False])
@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_saturated_gates_no_overflow_warning(op, native_on, monkeypatch):
    """Pre-activations of +-1e4: sigmoid and tanh saturate without an overflow warning or NaN."""
    if not native_on:
        monkeypatch.setattr(native, "available", False)
    ins, hidden = _layer(op, "bidirectional", 2)
    ins[0] = ins[0] * 2e4
    fn = rnn_mod.lstm if op == "LSTM" else rnn_mod.gru
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        outs = fn(*ins, hidden_size=hidden, direction="bidirectional")
    assert all(np.isfinite(o).all() for o in outs)


@pytest.mark.parametrize("acts", [["HardSigmoid", "Tanh", "Tanh"], ["Sigmoid", "Softsign", "Elu"]])
def test_lstm_other_activations_take_the_numpy_path(acts, count_native):
    ins, hidden = _layer("LSTM", "forward", 3, lens=True, init=True)
    compare_node("LSTM", ins, {"hidden_size": hidden, "activations": acts, "activation_alpha": [0.3, 0.9],
                               "activation_beta": [0.4]}, n_outputs=3, opset=14, rtol=1e-5, atol=1e-6)
    assert count_native[0] == 0


def test_gru_softplus_large_inputs_numpy_path():
    ins, hidden = _layer("GRU", "forward", 2)
    ins[0] = ins[0] * 200
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        outs = rnn_mod.gru(*ins, hidden_size=hidden, activations=["Sigmoid", "Softplus"])
    assert all(np.isfinite(o).all() for o in outs)


@pytest.mark.skipif(not native.available, reason="native kernels off")
@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_single_output_layer_replays_in_a_native_program(op):
    """Add -> LSTM / GRU (only Y) -> MatMul, constant weights: the session records the run as one
    native program of 3 calls, and its replays give onnxruntime's values for new inputs."""
    gates, hidden, dirs = (4 if op == "LSTM" else 3), 32, 2
    consts = {"W": _f(dirs, gates * hidden, 5), "R": _f(dirs, gates * hidden, hidden, scale=0.2),
              "B": _f(dirs, 2 * gates * hidden), "M": _f(hidden, 8)}
    nodes = [helper.make_node("Add", ["x", "x"], ["x2"]),
             helper.make_node(op, ["x2", "W", "R", "B"], ["y"], hidden_size=hidden, direction="bidirectional"),
             helper.make_node("MatMul", ["y", "M"], ["out"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 1, 5])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [64, 2, 1, 8])],
                              [numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    sess = minirt.Session(build_bytes(model), threads=1)
    for _ in range(5):  # run 1 plans memory, run 2 records the program, the rest replay it
        x = _f(64, 1, 5)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], reference_run(model, {"x": x})[0],
                                   rtol=1e-5, atol=1e-5)
    assert [p["native_program"] for p in sess.memory_plans()] == ["3 native calls"]


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_input_projection_on_prepacked_weights_is_the_per_call_product(op, monkeypatch):
    """Constant weights are packed once for the input projection (mrt_rnn_shape.wpack); the results are
    exactly those of W packed per call (a writeable W: a computed weight), and under another ISA
    selected after preparing (whose layout the pack is not in) the layer runs unpacked, still exact."""
    if not native.available:
        pytest.skip(native.reason)
    ins, hidden = _layer(op, "bidirectional", 2, seq=9, inp=40, hidden=24)
    fn = rnn_mod.lstm if op == "LSTM" else rnn_mod.gru
    const = [a if a is None else a.copy() for a in ins]
    for a in const[1:4]:
        a.flags.writeable = False  # (the model's constants are read-only: packed once, cached)
    packed = fn(*const, hidden_size=hidden, direction="bidirectional")
    per_call = fn(*ins, hidden_size=hidden, direction="bidirectional")
    for p, q in zip(packed, per_call):
        np.testing.assert_array_equal(p, q)
    layer = rnn_mod._native_layer(op, *const[1:4], None, const[0], 2, False, hidden, 0, None, 0, 0)
    assert layer.prep[0] is not layer.prep[1]  # (a struct with the pack, one without)
    before = native.isa
    try:
        native.select_isa("baseline")
        again = fn(*const, hidden_size=hidden, direction="bidirectional")
    finally:
        native.select_isa(before)
    for p, q in zip(again, per_call):
        np.testing.assert_allclose(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
@pytest.mark.parametrize("batch", [1, 3])
def test_bidirectional_directions_on_two_threads_match_one_thread(op, batch):
    """At two threads a bidirectional layer runs its directions at once, one per thread: the outputs
    are exactly those of one thread (each product's sums do not depend on the thread count)."""
    if not native.available:
        pytest.skip(native.reason)
    ins, hidden = _layer(op, "bidirectional", batch, seq=12, inp=33, hidden=40, lens=batch > 1, init=True)
    fn = rnn_mod.lstm if op == "LSTM" else rnn_mod.gru
    before = native.threads()
    try:
        native.set_threads(1)
        one = fn(*ins, hidden_size=hidden, direction="bidirectional")
        native.set_threads(2)
        two = fn(*ins, hidden_size=hidden, direction="bidirectional")
    finally:
        native.set_threads(before)
    for p, q in zip(one, two):
        np.testing.assert_array_equal(p, q)
