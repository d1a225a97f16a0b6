"""Warm-up at load (D90): a small model of fixed input shapes runs once on zeros while its session is
created, so that the caller's first run replays the native program that run recorded; and the run
that warm-up makes records the declared memory plan's results and the program in the same pass."""
from __future__ import annotations

import re
import warnings

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

import minirt
from minirt import plan as plan_mod
from minirt.builder.build import build
from minirt.targets.flops import node_flops

from tests.native.conftest import requires_native


def _conv_model() -> onnx.ModelProto:
    """Conv -> Relu -> Sigmoid -> Add over a fixed 1x3x8x8 image (all native, recordable)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    nodes = [
        h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c"], ["r"]),
        h.make_node("Sigmoid", ["r"], ["s"]),
        h.make_node("Add", ["s", "c"], ["y"]),
    ]
    graph = h.make_graph(nodes, "conv", [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 8, 8])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [1, 4, 8, 8])], [w, b])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def _program_of(sess) -> str | None:
    (plan,) = sess.memory_plans()
    return plan["native_program"]


def _image(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 3, 8, 8)).astype(np.float32)


@pytest.fixture(scope="module")
def conv_model():
    model = _conv_model()
    return model, build(model, None).data


@requires_native
def test_a_small_fixed_shape_model_warms_up_and_its_first_run_replays(conv_model):
    model, data = conv_model
    sess = minirt.Session(data, threads=1)
    assert sess.warmed_up
    assert re.fullmatch(r"\d+ native calls", _program_of(sess)), _program_of(sess)
    ref = ReferenceEvaluator(model)
    for seed in range(3):  # the program recorded on zeros gives each new input's result
        x = _image(seed)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)


@requires_native
@pytest.mark.parametrize("how", ["argument", "environment"])
def test_without_warm_up_the_first_run_plans_and_the_second_records(conv_model, monkeypatch, how):
    """Without warm-up the caller's first run records the memory plan only (recording the program as
    well would cost that run more than it saves the next, D82); the second records the program."""
    model, data = conv_model
    if how == "environment":
        monkeypatch.setenv("MINIRT_WARM_UP", "0")
        sess = minirt.Session(data, threads=1)
    else:
        sess = minirt.Session(data, threads=1, warm_up=False)
    assert not sess.warmed_up and sess.memory_plans() == []
    x = _image(1)
    first = sess.run(None, {"x": x})[0]
    assert _program_of(sess) is None  # (planned, no program yet)
    np.testing.assert_allclose(first, ReferenceEvaluator(model).run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], first)
    assert re.fullmatch(r"\d+ native calls", _program_of(sess)), _program_of(sess)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], first)  # (replayed)


@requires_native
def test_warm_up_that_fails_leaves_the_session_as_without_it(conv_model, monkeypatch):
    model, data = conv_model

    def refuse(*args, **kwargs):
        raise ValueError("a shape read from zeros")

    with monkeypatch.context() as m:
        m.setattr(plan_mod.Plan, "record_program", refuse)
        sess = minirt.Session(data, threads=1)
    assert not sess.warmed_up and sess.memory_plans() == []
    x = _image(2)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], ReferenceEvaluator(model).run(None, {"x": x})[0],
                               rtol=1e-5, atol=1e-5)


def _warm_up_runs(monkeypatch) -> list:
    """The warm-up's runs of the sessions made from here on, as (dry, completed)."""
    runs = []
    real = minirt.Session._warm_up_run

    def spy(self, feed, dry):
        ok = real(self, feed, dry)
        runs.append((dry, ok))
        return ok

    monkeypatch.setattr(minirt.Session, "_warm_up_run", spy)
    return runs


@requires_native
def test_the_warm_up_runs_for_real_up_to_its_flops_and_dry_above(conv_model, monkeypatch):
    """D92: a model whose run the builder estimates at most WARM_UP_WET_FLOPS warms up for real (its
    kernels' first touches then not the first run's); above, dry, and a dry run that records no program
    is followed by one for real only up to WARM_UP_MAX_FLOPS or when the caller asked for it."""
    _, data = conv_model
    runs = _warm_up_runs(monkeypatch)
    monkeypatch.setattr(minirt.Session, "WARM_UP_REPLAY_FLOPS", 0)  # (its replay: the next test)
    assert minirt.Session(data, threads=1).warmed_up and runs == [(False, True)]
    monkeypatch.setattr(minirt.Session, "WARM_UP_WET_FLOPS", 0)
    monkeypatch.setattr(minirt.Session, "WARM_UP_MAX_FLOPS", 0)
    runs.clear()
    sess = minirt.Session(data, threads=1)
    assert sess.warmed_up and runs == [(True, True)]  # (above both limits: dry, and it recorded the program)
    assert re.fullmatch(r"\d+ native calls", _program_of(sess)), _program_of(sess)
    monkeypatch.setattr(minirt.Session, "_recorded_program", lambda self: False)  # (as if it recorded none)
    runs.clear()
    assert not minirt.Session(data, threads=1).warmed_up and runs == [(True, True)]
    runs.clear()
    assert minirt.Session(data, threads=1, warm_up=True).warmed_up and runs == [(True, True), (False, True)]


@requires_native
@pytest.mark.parametrize("threads", [1, 2])
def test_a_tiny_model_replays_its_recorded_program_once_while_it_warms_up(conv_model, monkeypatch, threads):
    """Up to WARM_UP_REPLAY_FLOPS the warm-up's wet run (which records the program node by node) is
    followed by one replay of that program, so that the caller's first run is not the program's first
    (Silero VAD: 2.8x a steady run, each call 2-4x); above it, no replay.  Results are unchanged."""
    from minirt.native import program

    model, data = conv_model
    runs, replays = _warm_up_runs(monkeypatch), []
    real = program.Program.run
    monkeypatch.setattr(program.Program, "run", lambda self, env, ns=None: replays.append(self) or real(self, env, ns))
    sess = minirt.Session(data, threads=threads)
    assert sess.warmed_up and runs == [(False, True), (False, True)] and len(replays) == 1
    x = _image(7)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], ReferenceEvaluator(model).run(None, {"x": x})[0],
                               rtol=1e-5, atol=1e-5)
    assert len(replays) == 2 and replays[1] is replays[0]  # (the caller's first run replays the same program)
    monkeypatch.setattr(minirt.Session, "WARM_UP_REPLAY_FLOPS", 0)
    runs.clear()
    replays.clear()
    assert minirt.Session(data, threads=threads).warmed_up and runs == [(False, True)] and not replays


def test_no_warm_up_with_random_ops():
    graph = h.make_graph([h.make_node("RandomNormalLike", ["x"], ["n"]), h.make_node("Add", ["x", "n"], ["y"])],
                         "noise", [h.make_tensor_value_info("x", TP.FLOAT, [2, 3])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [2, 3])])
    noisy = build(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), None).data
    assert not minirt.Session(noisy).warmed_up  # (a warm-up would draw from the generator)


@requires_native
def test_warm_up_feeds_pinned_inputs_their_values_and_shows_no_warning():
    # y = Log(Relu(Conv(x))) + Cast(k): on zeros Relu gives zeros where a bias is negative and Log warns;
    # k is pinned to 3, and a run that fed it 0 would be refused
    rng = np.random.default_rng(4)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(np.array([-1, 1, -1, 1], np.float32), "b")
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c"], ["r"]),
             h.make_node("Log", ["r"], ["l"]), h.make_node("Cast", ["k"], ["kf"], to=TP.FLOAT),
             h.make_node("Add", ["l", "kf"], ["y"])]
    graph = h.make_graph(nodes, "logk", [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 8, 8]),
                                         h.make_tensor_value_info("k", TP.INT64, [])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [1, 4, 8, 8])], [w, b])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    data = build(model, None, input_values={"k": 3}).data
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sess = minirt.Session(data, threads=1)
    assert sess.warmed_up
    x, k = _image(5), np.array(3, np.int64)
    with np.errstate(divide="ignore"):
        want = ReferenceEvaluator(model).run(None, {"x": x, "k": k})[0]
        got = sess.run(None, {"x": x, "k": k})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)  # (Log near 1 magnifies the conv's rounding)


def test_build_records_the_flops_of_one_run(conv_model):
    _, data = conv_model
    flops = minirt.Session(data, warm_up=False).metadata["build.flops"]
    # the 3x3 conv: 256 outputs x 2 x 27 products, plus its fused bias / activation epilogue per output
    assert 2 * 27 * 256 <= flops <= 2 * 27 * 256 + 8 * 256


def test_recurrent_flops_count_the_input_projection_and_the_recurrence():
    x = ir.Value(name="x", shape=ir.Shape([5, 2, 3]), type=ir.TensorType(ir.DataType.FLOAT))
    w = ir.Value(name="w", shape=ir.Shape([2, 16, 3]), type=ir.TensorType(ir.DataType.FLOAT))
    r = ir.Value(name="r", shape=ir.Shape([2, 16, 4]), type=ir.TensorType(ir.DataType.FLOAT))
    lstm = ir.Node("", "LSTM", [x, w, r], attributes=[ir.AttrInt64("hidden_size", 4)])
    gate_values = 5 * 2 * 2 * 16  # steps x batch x directions x (4 gates x hidden 4)
    assert node_flops(lstm) == 2 * gate_values * (3 + 4) + 4 * gate_values
    # layout 1: (batch, steps, input)
    xb = ir.Value(name="xb", shape=ir.Shape([2, 5, 3]), type=ir.TensorType(ir.DataType.FLOAT))
    gru = ir.Node("", "GRU", [xb, ir.Value(name="wg", shape=ir.Shape([1, 12, 3]))],
                  attributes=[ir.AttrInt64("hidden_size", 4), ir.AttrInt64("layout", 1)])
    gate_values = 5 * 2 * 1 * 12
    assert node_flops(gru) == 2 * gate_values * (3 + 4) + 4 * gate_values


def test_asking_for_a_warm_up_of_a_model_without_fixed_shapes_is_harmless():
    graph = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "dyn",
                         [h.make_tensor_value_info("x", TP.FLOAT, ["n", 3])],
                         [h.make_tensor_value_info("y", TP.FLOAT, ["n", 3])])
    data = build(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), None).data
    sess = minirt.Session(data, warm_up=True)
    assert not sess.warmed_up  # (no one feed stands for every run)
    x = np.array([[-1, 2, -3]], np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.maximum(x, 0))


def _tagger_model(layout: int) -> onnx.ModelProto:
    """A BiLSTM over a padded batch whose lengths arrive as int64 and reach sequence_lens through a Cast
    (as torch exports a packed sequence)."""
    rng = np.random.default_rng(5)
    seq, batch, inp, hid = 6, 3, 5, 4
    x_shape = [batch, seq, inp] if layout else [seq, batch, inp]
    inits = [numpy_helper.from_array(rng.standard_normal((2, 4 * hid, inp)).astype(np.float32) / 2, "w"),
             numpy_helper.from_array(rng.standard_normal((2, 4 * hid, hid)).astype(np.float32) / 2, "r")]
    nodes = [h.make_node("Cast", ["lens"], ["lens32"], to=TP.INT32),
             h.make_node("LSTM", ["x", "w", "r", "", "lens32"], ["y"], hidden_size=hid, direction="bidirectional",
                         layout=layout)]
    y_shape = [batch, seq, 2, hid] if layout else [seq, 2, batch, hid]
    graph = h.make_graph(nodes, "tagger", [h.make_tensor_value_info("x", TP.FLOAT, x_shape),
                                           h.make_tensor_value_info("lens", TP.INT64, [batch])],
                         [h.make_tensor_value_info("y", TP.FLOAT, y_shape)], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 14)])


@requires_native
@pytest.mark.parametrize("layout", [0, 1])
def test_warm_up_feeds_full_sequence_lengths(monkeypatch, layout):
    """Lengths of zero would skip the recurrence (its code and scratch then the first run's page faults):
    an input that reaches an LSTM's sequence_lens is fed the sequence length; the others zeros."""
    model = _tagger_model(layout)
    data = build(model, None).data
    feeds = []
    real_run = minirt.Session._run
    monkeypatch.setattr(minirt.Session, "_run", lambda self, names, feed, **kw: feeds.append(feed) or
                        real_run(self, names, feed, **kw))
    sess = minirt.Session(data, threads=1, warm_up=True)
    # (a model this small warms up for real, D92: one run)
    assert sess.warmed_up and len(feeds) == 1
    np.testing.assert_array_equal(feeds[0]["lens"], np.full(3, 6, np.int64))
    assert not feeds[0]["x"].any()
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 6, 5) if layout else (6, 3, 5)).astype(np.float32)
    lens = np.array([6, 2, 4], np.int64)
    # (onnxruntime as the reference: the onnx package's evaluator ignores sequence_lens; onnxruntime
    # takes layout 0 only, so layout 1 is checked as the layout-0 model on the transposed input)
    ort = pytest.importorskip("onnxruntime")
    want = ort.InferenceSession(_tagger_model(0).SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x.transpose(1, 0, 2) if layout else x, "lens": lens})[0]
    if layout:
        want = want.transpose(2, 0, 1, 3)  # (seq, 2, batch, hidden) -> (batch, seq, 2, hidden)
    np.testing.assert_allclose(sess.run(None, {"x": x, "lens": lens})[0], want, rtol=1e-5, atol=1e-5)


@requires_native
def test_the_warm_up_records_dry_without_running_a_recordable_kernel(conv_model, monkeypatch):
    """D92: the warm-up's run keeps the recordable calls without running them (its outputs are thrown
    away), so it costs no kernel time; the caller's first run replays the program and is right."""
    from minirt import native

    model, data = conv_model
    seen = []
    real_call = native._call

    def spy(entry, args, *data_):
        seen.append((entry.__name__, native._recording.dry, native._recording.calls is not None))
        return real_call(entry, args, *data_)

    monkeypatch.setattr(minirt.Session, "WARM_UP_WET_FLOPS", 0)  # (dry whatever the model's size)
    monkeypatch.setattr(native, "_call", spy)
    sess = minirt.Session(data, threads=1)
    monkeypatch.undo()
    assert sess.warmed_up and not native._recording.dry
    recordable = [s for s in seen if s[0] in native.RECORDABLE]
    assert recordable and all(dry and recording for _, dry, recording in recordable), seen
    assert re.fullmatch(r"\d+ native calls", _program_of(sess)), _program_of(sess)
    x = _image(4)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], ReferenceEvaluator(model).run(None, {"x": x})[0],
                               rtol=1e-5, atol=1e-5)


@requires_native
def test_a_dry_warm_up_that_meets_a_value_it_must_compute_runs_for_real(monkeypatch):
    """A node fixed for the program (here a product of two constants the build kept, opt-level 0) is
    computed once and kept by the recording: a dry run cannot, so the warm-up runs on zeros instead."""
    a = numpy_helper.from_array(np.arange(4, dtype=np.float32).reshape(1, 4, 1, 1), "a")
    b = numpy_helper.from_array(np.full((1, 4, 1, 1), 2.0, np.float32), "b")
    nodes = [h.make_node("Mul", ["a", "b"], ["s"]), h.make_node("Mul", ["x", "s"], ["y"])]
    graph = h.make_graph(nodes, "scale", [h.make_tensor_value_info("x", TP.FLOAT, [1, 4, 8, 8])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [1, 4, 8, 8])], [a, b])
    data = build(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), None, opt_level=0).data
    monkeypatch.setattr(minirt.Session, "WARM_UP_WET_FLOPS", 0)  # (dry whatever the model's size)
    runs = _warm_up_runs(monkeypatch)
    sess = minirt.Session(data, threads=1)
    assert runs == [(True, False), (False, True)] and sess.warmed_up
    assert re.fullmatch(r"\d+ native calls", _program_of(sess)), _program_of(sess)
    x = np.random.default_rng(5).standard_normal((1, 4, 8, 8)).astype(np.float32)
    want = x * (np.arange(4, dtype=np.float32) * 2.0).reshape(1, 4, 1, 1)
    for _ in range(2):  # (the first run replays the program; the constant it keeps is the real product)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-6)


@requires_native
def test_a_graph_of_more_nodes_than_the_limit_does_not_warm_up(conv_model, monkeypatch):
    """Recording costs ~50 us a node: a huge graph loads without it (issue 22: a 16k-node graph loads and
    plans in well under a second) and records on its second run, as without the warm-up."""
    _, data = conv_model
    monkeypatch.setattr(minirt.Session, "WARM_UP_MAX_NODES", 1)
    assert not minirt.Session(data, threads=1).warmed_up
    monkeypatch.setattr(minirt.Session, "WARM_UP_MAX_NODES", 4096)
    assert minirt.Session(data, threads=1).warmed_up


def _gru_model() -> onnx.ModelProto:
    """One GRU (hidden 32) over a fixed 12-step sequence (fed batch-first), then a Tanh; int8-dynamic stores
    its weights int8 (weights-only: DequantizeWeights feeds the layer)."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array((0.2 * rng.standard_normal(s)).astype(np.float32), n)
             for n, s in (("W", (1, 96, 24)), ("R", (1, 96, 32)), ("B", (1, 192)))]
    # (batch-first input transposed, as exporters write it: the memory plan then places that copy)
    nodes = [h.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
             h.make_node("GRU", ["t", "W", "R", "B"], ["g", "last"], hidden_size=32, linear_before_reset=1),
             h.make_node("Tanh", ["g"], ["y"])]
    graph = h.make_graph(nodes, "gru", [h.make_tensor_value_info("x", TP.FLOAT, [1, 12, 24])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [12, 1, 1, 32]),
                          h.make_tensor_value_info("last", TP.FLOAT, [1, 1, 32])], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 14)])


@requires_native
def test_a_dry_warm_up_keeps_materialized_weights_as_they_are(monkeypatch):
    """DequantizeWeights declares its result constant on its first run too: in a dry warm-up (its first
    run) the recording kept an unaligned copy of the float weights instead, and the program's GRU read
    its recurrent weights there on every replay (KWS GRU int8-dynamic 1.19x its float program)."""
    from minirt.kernels import qlinear, rnn
    from minirt.native import program

    data = build(_gru_model(), None, quantize="int8-dynamic").data
    monkeypatch.setattr(rnn, "_layers", {})  # (this session's layers and weights only)
    monkeypatch.setattr(qlinear, "_DEQUANTIZED", {})
    monkeypatch.setattr(minirt.Session, "WARM_UP_WET_FLOPS", 0)  # (dry whatever the model's size)
    runs = _warm_up_runs(monkeypatch)
    sess = minirt.Session(data, threads=1)
    assert runs == [(True, True)] and re.fullmatch(r"\d+ native calls", _program_of(sess)), _program_of(sess)
    materialized = {a.ctypes.data for _ref, _scale, a in qlinear._DEQUANTIZED.values()}
    r_pointers = {int(minirt.native._ffi.cast("uintptr_t", layer.prep[1].r)) for layer in rnn._layers.values()}
    assert r_pointers and r_pointers <= materialized, (r_pointers, materialized)
    assert all(p % 64 == 0 for p in r_pointers)
    x = np.random.default_rng(4).standard_normal((1, 12, 24)).astype(np.float32)
    want = minirt.Session(data, threads=1, warm_up=False, native_program=False).run(None, {"x": x})
    for got, expected in zip(sess.run(None, {"x": x}), want):
        np.testing.assert_array_equal(got, expected)
    # (the recording's own kept copies start on 64-byte boundaries too)
    kept = program._aligned_copy(np.arange(1000, dtype=np.float64).reshape(10, 100)[:, 1:])
    assert kept.ctypes.data % 64 == 0 and kept.flags.c_contiguous and kept.shape == (10, 99)
    np.testing.assert_array_equal(kept, np.arange(1000, dtype=np.float64).reshape(10, 100)[:, 1:])
