"""Native programs (D32): a planned run whose nodes are all native calls is recorded once and then
replayed by one C call (minirt/native/program.py, program_impl.h).  A replay must give exactly what
running the nodes gives, for every new input (the input pointers are patched per run), and must
never be made from a run it cannot reproduce."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

import minirt
from minirt.builder.build import build
from minirt import native
from minirt.errors import KernelError
from minirt.native import program

from tests.native.conftest import requires_native

pytestmark = requires_native

ROOT = Path(__file__).resolve().parent.parent
DIGITS = ROOT / "examples" / "digits"


@pytest.fixture(scope="module")
def digits():
    return {
        "float": build(str(DIGITS / "digits_cnn.onnx"), None).data,
        "int8": build(str(DIGITS / "digits_cnn.onnx"), None, quantize="int8",
                      calibration=str(DIGITS / "calibration.npz")).data,
        "int8-dynamic": build(str(DIGITS / "digits_cnn.onnx"), None, quantize="int8-dynamic").data,
    }


@pytest.fixture(scope="module")
def images():
    return np.load(DIGITS / "heldout.npz")["image"]


def _program_of(sess) -> str | None:
    (plan,) = sess.memory_plans()
    return plan["native_program"]


@pytest.mark.parametrize("kind", ["float", "int8"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch", [1, 5])
def test_demo_model_runs_as_one_program_with_the_nodes_results(digits, images, kind, threads, batch):
    sess = minirt.Session(digits[kind], threads=threads)
    nodes = minirt.Session(digits[kind], threads=threads, native_program=False)
    for i in range(6):  # run 1 plans memory, run 2 records the program, the rest replay it
        x = np.ascontiguousarray(images[i * batch:(i + 1) * batch])
        got = sess.run(None, {"image": x})[0]
        np.testing.assert_array_equal(got, nodes.run(None, {"image": x})[0])
    assert re.fullmatch(r"\d+ native calls", _program_of(sess)), _program_of(sess)
    assert nodes.memory_plans()[0]["native_program"] is None


def test_replayed_runs_read_the_current_input_and_return_outputs_the_caller_owns(digits, images):
    sess = minirt.Session(digits["float"], threads=1)
    nodes = minirt.Session(digits["float"], threads=1, native_program=False)
    x = np.ascontiguousarray(images[:1])
    for _ in range(3):
        first = sess.run(None, {"image": x})[0]
    assert _program_of(sess).endswith("native calls")
    x[...] = images[1:2]  # the same array, new contents
    second = sess.run(None, {"image": x})[0]
    np.testing.assert_array_equal(second, nodes.run(None, {"image": x})[0])
    assert not np.array_equal(first, second)
    assert not np.shares_memory(first, second)
    second[...] = 0  # the caller's to change: the next run is unaffected
    np.testing.assert_array_equal(sess.run(None, {"image": x})[0], nodes.run(None, {"image": x})[0])
    # an input of the same shape that is not C-contiguous: the nodes run instead, with the same result
    wide = np.zeros((1, 1, 8, 16), np.float32)
    wide[..., ::2] = images[2:3]
    strided = wide[..., ::2]
    np.testing.assert_array_equal(sess.run(None, {"image": strided})[0],
                                  nodes.run(None, {"image": np.ascontiguousarray(strided)})[0])


def test_a_program_keeps_no_input_of_the_run_it_was_recorded_on(digits, images):
    import gc
    import weakref

    sess = minirt.Session(digits["int8"], threads=1)
    x = np.ascontiguousarray(images[:1])
    for _ in range(3):
        sess.run(None, {"image": x})
    assert _program_of(sess).endswith("native calls")
    gone = weakref.ref(x)
    del x
    gc.collect()
    assert gone() is None
    np.testing.assert_array_equal(sess.run(None, {"image": images[1:2]})[0],
                                  minirt.Session(digits["int8"], threads=1).run(None, {"image": images[1:2]})[0])


def test_the_steady_state_shortcut_steps_aside_for_anything_else(digits, images):
    """Session.run's shortcut for a replayed program (minirt.plan.ReplayShortcut) takes only the last feed layout
    with all outputs and the settings it was made under; anything else takes the general path, with
    the same results and the same errors."""
    sess = minirt.Session(digits["int8"], threads=1)
    nodes = minirt.Session(digits["int8"], threads=1, native_program=False)
    x1, x5 = np.ascontiguousarray(images[:1]), np.ascontiguousarray(images[1:6])

    def same(feed, names=None):
        np.testing.assert_array_equal(sess.run(names, feed)[0], nodes.run(names, feed)[0])

    for _ in range(3):
        same({"image": x1})
    assert sess._shortcut is not None
    same({"image": x5})  # another shape: its own plan and program; then back
    same({"image": x1})
    same({"image": x1}, ["logits"])  # outputs by name: the general path
    same({"image": np.asfortranarray(x5)})  # not C-contiguous: the nodes run
    sess.native_program = False  # settings changed after the shortcut was made
    same({"image": x1})
    sess.native_program, sess.threads = True, 2
    nodes.threads = 2
    for _ in range(3):
        same({"image": x1})
    sess.memory_plan = False
    same({"image": x1})
    with pytest.raises(minirt.InvalidArgument, match="dtype"):
        sess.run(None, {"image": x1.astype(np.float64)})
    with pytest.raises(minirt.InvalidArgument, match="unknown input name"):
        sess.run(None, {"image": x1, "extra": x1})


def test_outputs_of_the_recording_run_are_the_callers_too():
    """An output computed straight from the input (no arena buffer behind it, so the memory plan would
    not copy it) is a buffer the program keeps and writes on every replay: the run that recorded the
    program must hand out a copy, or the next run changes the caller's array."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), n) for n in ("w1", "w2")]
    inits.append(numpy_helper.from_array(rng.standard_normal((5, 4, 3, 3)).astype(np.float32), "w3"))
    nodes = [h.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             h.make_node("Conv", ["x", "w2"], ["hidden"], pads=[1, 1, 1, 1]),
             h.make_node("Conv", ["hidden", "w3"], ["b"], pads=[1, 1, 1, 1])]
    graph = h.make_graph(nodes, "two_outputs", [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 6, 6])],
                         [h.make_tensor_value_info("a", TP.FLOAT, [1, 4, 6, 6]),
                          h.make_tensor_value_info("b", TP.FLOAT, [1, 5, 6, 6])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    sess = minirt.Session(build(model, None).data, threads=1)
    results = []
    for _ in range(5):
        x = rng.standard_normal((1, 3, 6, 6)).astype(np.float32)
        got = sess.run(None, {"x": x})
        results.append((x, [r.copy() for r in got], got))
    assert _program_of(sess).endswith("native calls"), _program_of(sess)
    ref = minirt.Session(build(model, None).data, threads=1, memory_plan=False)
    for x, snapshot, handed_out in results:
        for want, kept, got in zip(ref.run(None, {"x": x}), snapshot, handed_out):
            np.testing.assert_array_equal(kept, want)
            np.testing.assert_array_equal(got, want)  # (unchanged by the runs after it)


def test_isa_and_thread_changes_record_the_program_again(digits, images):
    sess = minirt.Session(digits["int8"], threads=1)
    nodes = minirt.Session(digits["int8"], threads=1, native_program=False)
    x = np.ascontiguousarray(images[:3])
    before = native.isa
    try:
        for isa in ("baseline", before, "baseline"):
            native.select_isa(isa)
            for _ in range(3):
                np.testing.assert_array_equal(sess.run(None, {"image": x})[0], nodes.run(None, {"image": x})[0])
            assert _program_of(sess).endswith("native calls")
    finally:
        native.select_isa(before)
    sess.threads = nodes.threads = 2
    for _ in range(3):
        np.testing.assert_array_equal(sess.run(None, {"image": x})[0], nodes.run(None, {"image": x})[0])


def test_fp16_weights_materialized_once_run_as_a_program(images):
    """fp16 artifacts keep their weights in half precision and materialize them in float32 once
    (DequantizeWeights, read-only, the same array every run): those nodes are constants of the program."""
    data = build(str(DIGITS / "digits_cnn.onnx"), None, quantize="fp16").data
    sess = minirt.Session(data, threads=1)
    nodes = minirt.Session(data, threads=1, native_program=False)
    for i in range(5):
        x = np.ascontiguousarray(images[i:i + 1])
        np.testing.assert_array_equal(sess.run(None, {"image": x})[0], nodes.run(None, {"image": x})[0])
    assert _program_of(sess).endswith("native calls"), _program_of(sess)


def test_a_constant_node_must_give_a_read_only_array():
    """A node that makes no call may be a constant of the program only with a read-only result (one
    that nothing can refill between runs); otherwise the run stays node by node."""

    class Step:
        subgraphs, outs = (), (0,)
        node = type("Node", (), {"name": "n"})()
        op = type("Op", (), {"op_type": "DequantizeWeights"})()

    for writeable in (False, True):
        y = np.ones(4, np.float32)
        y.flags.writeable = writeable
        with program.Recorder() as rec:
            rec.begin()
            native.constant_result(y)
            rec.end(Step(), (), y)
        assert (rec.refused is None) == (not writeable), rec.refused
        assert rec.constants == ([] if writeable else [y])


@pytest.mark.parametrize("threads", [1, 2])
def test_dynamic_quantization_replays_with_each_inputs_own_scales(digits, images, threads):
    """int8-dynamic derives its scales from each input: the native calls compute them (D146), so the
    model replays as one program and each replayed run quantizes by its own input's range (a recorded
    scale would give other bits from the third run on, where the ranges change)."""
    sess = minirt.Session(digits["int8-dynamic"], threads=threads)
    nodes = minirt.Session(digits["int8-dynamic"], threads=threads, native_program=False)
    for i in range(6):
        x = np.ascontiguousarray(images[i:i + 1]) * (i + 1)  # new ranges, new scales
        np.testing.assert_array_equal(sess.run(None, {"image": x})[0], nodes.run(None, {"image": x})[0])
    assert re.fullmatch(r"\d+ native calls", _program_of(sess)), _program_of(sess)


def _conv_model(tail: str) -> onnx.ModelProto:
    """Conv + Relu -> MaxPool -> Flatten -> Gemm, then ``tail`` ("" or an op applied to the logits)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b"),
             numpy_helper.from_array(rng.standard_normal((10, 8 * 4 * 4)).astype(np.float32), "g"),
             numpy_helper.from_array(rng.standard_normal(10).astype(np.float32), "gb")]
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c"], ["r"]),
             h.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             h.make_node("Flatten", ["p"], ["f"]), h.make_node("Gemm", ["f", "g", "gb"], ["logits"], transB=1)]
    out = "logits"
    if tail:
        nodes.append(h.make_node(tail, ["logits"], ["y"]))
        out = "y"
    graph = h.make_graph(nodes, "conv_model", [h.make_tensor_value_info("x", TP.FLOAT, [2, 3, 8, 8])],
                         [h.make_tensor_value_info(out, TP.FLOAT, [2, 10])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("tail", ["", "Softmax", "Sin"])
def test_a_node_outside_the_native_calls_keeps_the_run_in_python(tail):
    """Against onnxruntime on every run; with a node that is not one recorded native call (Sin) the
    session says why there is no program.  Softmax is one (mrt_softmax_f32): the run replays."""
    ort = pytest.importorskip("onnxruntime")
    model = _conv_model(tail)
    sess = minirt.Session(build(model, None).data, threads=1)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for _ in range(5):
        x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
    summary = _program_of(sess)
    if tail == "Sin":
        assert tail in summary and "not one native call" in summary, summary
    else:
        assert summary.endswith("native calls"), summary


def test_global_average_pool_heads_run_as_programs():
    """Conv -> GlobalAveragePool -> Flatten -> Gemm (a MobileNet-style head) against onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(rng.standard_normal((32, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal((10, 32)).astype(np.float32), "g")]
    nodes = [h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
             h.make_node("Relu", ["c"], ["r"]), h.make_node("GlobalAveragePool", ["r"], ["p"]),
             h.make_node("Flatten", ["p"], ["f"]), h.make_node("Gemm", ["f", "g"], ["y"], transB=1)]
    graph = h.make_graph(nodes, "gap_head", [h.make_tensor_value_info("x", TP.FLOAT, [3, 3, 15, 17])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [3, 10])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    sess = minirt.Session(build(model, None).data, threads=2)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for _ in range(5):
        x = rng.standard_normal((3, 3, 15, 17)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
    assert _program_of(sess).endswith("native calls"), _program_of(sess)


def _yolo_block() -> onnx.ModelProto:
    """A YOLOv8-style block: conv, Split into two channel halves, a bottleneck with a residual Add, the
    halves Concat'ed, a nearest 2x Resize, Sub / Mul / Div of same-shape maps, a last 1x1 conv."""
    rng = np.random.default_rng(4)

    def w(name, *shape):
        return numpy_helper.from_array((0.3 * rng.standard_normal(shape)).astype(np.float32), name)

    inits = [w("w1", 8, 3, 3, 3), w("w2", 4, 4, 3, 3), w("w3", 4, 4, 3, 3), w("w4", 6, 12, 1, 1), w("w5", 6, 6, 1, 1),
             numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
             numpy_helper.from_array(np.array([4, 4], np.int64), "halves")]
    nodes = [h.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("Split", ["r1", "halves"], ["s0", "s1"], axis=1),
             h.make_node("Conv", ["s1", "w2"], ["b1"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["b1"], ["b1r"]),
             h.make_node("Conv", ["b1r", "w3"], ["b2"], pads=[1, 1, 1, 1]), h.make_node("Add", ["s1", "b2"], ["res"]),
             h.make_node("Concat", ["s0", "s1", "res"], ["cat"], axis=1),
             h.make_node("Conv", ["cat", "w4"], ["c4"]),
             h.make_node("Resize", ["c4", "", "scales"], ["up"], mode="nearest"),
             h.make_node("Sub", ["up", "up"], ["z"]), h.make_node("Mul", ["up", "up"], ["sq"]),
             h.make_node("Add", ["sq", "z"], ["sq2"]), h.make_node("Div", ["sq2", "up"], ["q"]),
             h.make_node("Conv", ["q", "w5"], ["y"])]  # (a graph output has no arena buffer: Div is not last)
    graph = h.make_graph(nodes, "yolo_block", [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 10, 14])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [1, 6, 20, 28])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("threads", [1, 2])
def test_split_concat_add_resize_run_as_a_program(threads):
    """Split (channel parts of the input: views), Concat (one native row copy per input), same-shape
    Add / Sub / Mul / Div (one native pass) and nearest Resize are recorded too: the block runs as a
    program, bit for bit as node by node, and matches onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    model = _yolo_block()
    data = build(model, None).data
    sess = minirt.Session(data, threads=threads)
    nodes = minirt.Session(data, threads=threads, native_program=False)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    for _ in range(5):
        x = rng.standard_normal((1, 3, 10, 14)).astype(np.float32)
        got = sess.run(None, {"x": x})[0]
        np.testing.assert_array_equal(got, nodes.run(None, {"x": x})[0])
        np.testing.assert_allclose(got, ref.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
    assert _program_of(sess).endswith("native calls"), _program_of(sess)


def test_a_failing_call_names_its_node(digits, images):
    sess = minirt.Session(digits["float"], threads=1)
    x = np.ascontiguousarray(images[:1])
    for _ in range(3):
        sess.run(None, {"image": x})
    (arena,) = sess._mplans[sess._STATIC_SIGNATURE if sess._static_inputs else next(iter(sess._mplans))]._free
    prog = arena.program
    prog.calls[prog.n - 1].entry = 999  # an entry point the executor does not know: it fails there
    with pytest.raises(KernelError, match="Gemm"):
        sess.run(None, {"image": x})


# --------------------------------------------------------------------------- what a recording accepts


def _recorder_with(calls) -> program.Recorder:
    rec = program.Recorder()
    rec.steps = [calls]
    rec.nodes = ["node 'pool' (MaxPool)"]
    return rec


def _maxpool_call(x, y):
    """A recorded 2x2 stride-2 max pool of x (1, 1, 4, 4) into y (1, 1, 2, 2), made by native.maxpool2d_call."""
    with program.Recorder() as rec:
        native.maxpool2d_call(native.maxpool2d_prepare(x.shape, (2, 2), (2, 2), (1, 1), (0, 0), (2, 2)), x, y)
        return list(native._recording.calls)


def test_build_accepts_inputs_arena_and_earlier_results_and_refuses_anything_else():
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    arena = np.zeros((1, 1, 2, 2), np.float32)
    span = (arena.ctypes.data, arena.ctypes.data + arena.nbytes)
    calls = _maxpool_call(x, arena)
    prog = program.build(_recorder_with(calls), {0: x}, {1: arena}, [], span)
    x_position = native.RECORDABLE["mrt_maxpool2d_f32"][0][0]  # (the argument the input is patched into)
    assert isinstance(prog, program.Program) and prog.patches == ((0, x_position, 0),)
    # replayed on a new input: the arena holds its pool
    x2 = -x
    assert prog.run([x2, None]) == -1
    np.testing.assert_array_equal(arena, _pool2x2(x2))
    # a read of an array the recorded calls did not make (a copy of the input, say)
    refused = program.build(_recorder_with(_maxpool_call(x.copy(), arena)), {0: x}, {1: arena}, [], span)
    assert refused == "node 'pool' (MaxPool): call mrt_maxpool2d_f32 reads a buffer made outside the recorded calls"
    # a read of a model constant is fine; a write into one, or into an input, is not
    const = x.copy()
    const.flags.writeable = False
    assert isinstance(program.build(_recorder_with(_maxpool_call(const, arena)), {0: x}, {1: arena}, [const], span),
                      program.Program)
    name, args, reads, _ = calls[0]
    for target, constants, position in ((x, [], 2), (const, [const], 1), (const, [const], 2)):
        bad = [(name, args, reads, ((position, target),))]  # (classified only, never run)
        assert "writes into a model input or constant" in program.build(
            _recorder_with(bad), {0: x}, {1: arena}, constants, span)
    # ... except a write through the very argument the call reads the whole input by: an update in place
    # (a KV cache bound as past input and present output, D123), patched with the read
    in_place = program.build(_recorder_with([(name, args, reads, ((x_position, x),))]), {0: x}, {1: arena}, [], span)
    assert isinstance(in_place, program.Program) and in_place.patches == ((0, x_position, 0),)
    assert not any(a is x for a in in_place.keep[0])  # (the caller's memory: not kept)
    # an output that no recorded call made (an input passed through as is is one: taken from each run)
    assert "graph output" in program.build(_recorder_with(calls), {0: x}, {1: x.copy()}, [], span)
    passed = program.build(_recorder_with(calls), {0: x}, {1: x}, [], span)
    assert passed.aliases == {1: 0} and passed.results([1], [x2, None])[0].tolist() == x2.tolist()


def _pool2x2(x):
    n, c, hh, ww = x.shape
    return x.reshape(n, c, hh // 2, 2, ww // 2, 2).max(axis=(3, 5))


def test_the_executor_reads_each_argument_as_its_parameter_type():
    """program_impl.h passes argument j of each entry point as P(j) / I(j) / L(j) / F(j); the recorder
    stores it by the parameter's C type (cffi's view of kernels.h).  The two must agree everywhere."""
    source = (ROOT / "minirt" / "native" / "program_impl.h").read_text()
    cases = re.findall(r"case (MRT_CALL_\w+):\s*(?:return\s+)?(mrt_\w+)\(([^;]*)\);", source)
    assert len(cases) == len([n for n in dir(native._lib) if n.startswith("MRT_CALL_")]) >= 11
    letter = {"int": "I", "long": "L", "float": "F"}
    for code, fn, arglist in cases:
        assert code == "MRT_CALL_" + fn[len("mrt_"):].upper()
        params = native._ffi.typeof(getattr(native._lib, fn)).args
        got = re.findall(r"([PILF])\((\d+)\)", arglist)
        assert [int(j) for _, j in got] == list(range(len(params))), fn
        want = ["P" if p.kind == "pointer" else letter[p.cname] for p in params]
        assert [m for m, _ in got] == want, fn


def test_recordings_nest():
    """An If / Loop body records its own program while the enclosing graph's run records (D76): the
    enclosing recording's calls and state come back when the inner one ends."""
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    y1, y2 = np.zeros((1, 1, 2, 2), np.float32), np.zeros((1, 1, 2, 2), np.float32)
    prep = native.maxpool2d_prepare(x.shape, (2, 2), (2, 2), (1, 1), (0, 0), (2, 2))
    with program.Recorder():
        native.maxpool2d_call(prep, x, y1)
        outer_calls = native._recording.calls
        native.final(y1)
        with program.Recorder():
            native.maxpool2d_call(prep, x, y2)
            assert len(native._recording.calls) == 1 and native._recording.final is None
        assert native._recording.calls is outer_calls and len(outer_calls) == 1
        assert native._recording.final is y1
    assert native._recording.calls is None


def _dynamic_width_model() -> onnx.ModelProto:
    """A recognizer's shape arithmetic over a dynamic width: Conv, then Shape -> Gather -> Div ->
    Concat -> Reshape to (batch, width / 2, 64), plus an initial state made by ConstantOfShape from
    the batch size (Shape -> Slice -> Concat), added to the result; the shape values are int64
    numpy work around no native call."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 1, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([3], np.int64), "i3"),
             numpy_helper.from_array(np.array([0], np.int64), "i0"),
             numpy_helper.from_array(np.array([1], np.int64), "i1"),
             numpy_helper.from_array(np.array([2], np.int64), "two"),
             numpy_helper.from_array(np.array([64], np.int64), "sixtyfour")]
    nodes = [h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             h.make_node("Shape", ["c"], ["s"]),
             h.make_node("Gather", ["s", "i3"], ["width"], axis=0),
             h.make_node("Div", ["width", "two"], ["half"]),
             h.make_node("Slice", ["s", "i0", "i1"], ["batch"]),
             h.make_node("Concat", ["batch", "half", "sixtyfour"], ["target"], axis=0),
             h.make_node("Reshape", ["c", "target"], ["r"]),
             h.make_node("Concat", ["batch", "i1", "sixtyfour"], ["state_shape"], axis=0),
             h.make_node("ConstantOfShape", ["state_shape"], ["state"],
                         value=numpy_helper.from_array(np.array([0.5], np.float32))),
             h.make_node("Add", ["r", "state"], ["y"])]
    graph = h.make_graph(nodes, "dynamic_width", [h.make_tensor_value_info("x", TP.FLOAT, [1, 1, 4, "W"])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [1, None, 64])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_shape_arithmetic_of_a_dynamic_width_replays_per_signature():
    """Shape results are fixed per input signature (each has its own plan and program), and so is
    what is computed from them and the constants alone: those nodes are kept as read-only values and
    the run replays; every width gets its own program, and every run matches onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    model = _dynamic_width_model()
    sess = minirt.Session(build(model, None).data, threads=1)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(6)
    for width in (8, 8, 8, 12, 12, 12, 8, 12):
        x = rng.standard_normal((1, 1, 4, width)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)
    programs = {plan["inputs"]["x"]: plan["native_program"] for plan in sess.memory_plans()}
    assert programs == {(1, 1, 4, 8): "2 native calls", (1, 1, 4, 12): "2 native calls"}, programs


def test_a_graph_output_computed_from_shapes_is_not_a_kept_value():
    """A graph output must be made by the program's calls: a Shape that is an output keeps the run in
    Python (its value is still right for every width)."""
    model = _dynamic_width_model()
    model.graph.output.append(h.make_tensor_value_info("s", TP.INT64, [4]))
    sess = minirt.Session(build(model, None).data, threads=1)
    for width in (8, 8, 8, 10):
        got = sess.run(None, {"x": np.zeros((1, 1, 4, width), np.float32)})[1]
        np.testing.assert_array_equal(got, [1, 8, 4, width])


def test_values_taken_from_the_data_are_never_replayed_stale():
    """Clip's bounds as graph inputs, LSTM weights as graph inputs: a program would keep the recorded run's
    values (a scalar argument, a packed copy), so those nodes are not declared final and every run uses its
    own (before, a fixed-shape model's first run already replayed the warm-up's zeros)."""
    from onnx import TensorProto, helper

    from minirt.builder import build_bytes

    F = TensorProto.FLOAT
    clip = helper.make_graph(
        [helper.make_node("Clip", ["x", "lo", "hi"], ["t"]), helper.make_node("Relu", ["t"], ["y"])], "clip",
        [helper.make_tensor_value_info("x", F, [3, 4, 5]), helper.make_tensor_value_info("lo", F, []),
         helper.make_tensor_value_info("hi", F, [])], [helper.make_tensor_value_info("y", F, [3, 4, 5])])
    sess = minirt.InferenceSession(build_bytes(helper.make_model(clip, opset_imports=[helper.make_opsetid("", 13)])))
    x = np.random.default_rng(0).standard_normal((3, 4, 5)).astype(np.float32)
    for lo, hi in ((-1, 1), (-0.5, 0.5), (0, 2), (-2, 0.1)):
        got = sess.run(None, {"x": x, "lo": np.float32(lo), "hi": np.float32(hi)})[0]
        np.testing.assert_array_equal(got, np.maximum(np.clip(x, np.float32(lo), np.float32(hi)), 0))
    H, I = 3, 4
    lstm = helper.make_graph(
        [helper.make_node("LSTM", ["x", "w", "r"], ["y"], hidden_size=H), helper.make_node("Relu", ["y"], ["z"])],
        "lstm", [helper.make_tensor_value_info("x", F, [2, 1, I]), helper.make_tensor_value_info("w", F, [1, 4 * H, I]),
                 helper.make_tensor_value_info("r", F, [1, 4 * H, H])],
        [helper.make_tensor_value_info("z", F, [2, 1, 1, H])])
    model = helper.make_model(lstm, opset_imports=[helper.make_opsetid("", 14)])
    sess = minirt.InferenceSession(build_bytes(model))
    ref = minirt.InferenceSession(build_bytes(model), native_program=False)
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((2, 1, I)).astype(np.float32)
    for _ in range(4):
        feed = {"x": xs, "w": rng.standard_normal((1, 4 * H, I)).astype(np.float32),
                "r": rng.standard_normal((1, 4 * H, H)).astype(np.float32)}
        np.testing.assert_array_equal(sess.run(None, feed)[0], ref.run(None, feed)[0])


def test_a_timed_replay_gives_the_same_results_and_a_time_per_call(digits, images, monkeypatch):
    """Program.run with ``ns`` (mrt_program_run_timed): the same outputs as an untimed replay, and each
    call's elapsed time added to its slot, run after run (benchmarks/program_calls.py reads them)."""
    sess = minirt.Session(digits["float"], threads=1)
    x = np.ascontiguousarray(images[:1])
    want = sess.run(None, {"image": x})[0]
    programs = {}
    untimed = program.Program.run

    def timed(self, env, ns=None):
        ns = programs.setdefault(id(self), (self, np.zeros(self.n)))[1]
        return untimed(self, env, ns=ns)

    monkeypatch.setattr(program.Program, "run", timed)
    for _ in range(3):
        np.testing.assert_array_equal(sess.run(None, {"image": x})[0], want)
    ((prog, ns),) = programs.values()
    assert ns.shape == (prog.n,) and prog.n > 1 and (ns > 0).all(), ns
    first = ns.copy()
    sess.run(None, {"image": x})
    assert (ns > first).all()  # (added to, run after run)
    with pytest.raises(ValueError, match="contiguous float64"):
        untimed(prog, {}, ns=np.zeros(prog.n, np.float32))


def test_status_is_no_when_the_reason_ends_in_native_calls():
    """A refusal whose reason ends with the words "native calls" ("... nor all made by native calls": a
    TopK's two results) is a "no", naming the node: it read as "yes (...)" before (torchvision's Faster
    R-CNN in benchmarks/run.py's table)."""
    k = numpy_helper.from_array(np.array([5], np.int64), "k")
    nodes = [h.make_node("Relu", ["x"], ["r"]), h.make_node("TopK", ["r", "k"], ["v", "i"], axis=1, name="topk"),
             h.make_node("Neg", ["v"], ["y"]), h.make_node("Cast", ["i"], ["z"], to=TP.FLOAT)]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [1, 100])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1, 5]), h.make_tensor_value_info("z", TP.FLOAT, [1, 5])],
                     [k])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    sess = minirt.Session(build(m, None).data)
    x = {"x": np.random.default_rng(0).standard_normal((1, 100)).astype(np.float32)}
    for _ in range(3):
        sess.run(None, x)
    status = sess.native_program_status()
    assert status.startswith("no: ") and "'topk' (TopK)" in status and status.endswith("native calls"), status
