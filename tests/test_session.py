"""minirt.Session: the onnxruntime-like API on small models built with onnx.helper."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from minirt import builder
import minirt
from minirt.builder.build import _normalise
from minirt.builder.load import load_model
from minirt.builder.lower import free_value_names, lower_model
from minirt.builder.writer import ArtifactWriter
from minirt.format import reader
from minirt.kernels.registry import kernel, lookup

OPSET = 17


def _vi(name, shape, dtype=TP.FLOAT):
    return h.make_tensor_value_info(name, dtype, shape)


def _model(nodes, inputs, outputs, inits=(), name="g", opsets=((("", OPSET),))):
    m = h.make_model(
        h.make_graph(nodes, name, inputs, outputs, list(inits)),
        opset_imports=[h.make_opsetid(d, v) for d, v in opsets],
        producer_name="tests",
    )
    onnx.checker.check_model(m)
    return m


def _session(model, **kw):
    return minirt.Session(builder.build_bytes(model), **kw)


def _ort(model):
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def add_relu_model():
    """y = Relu(x + b); z = x * 2, over x[batch, 3]."""
    b = nh.from_array(np.array([1.0, -2.0, 0.5], np.float32), "b")
    two = nh.from_array(np.array(2.0, np.float32), "two")
    return _model(
        [h.make_node("Add", ["x", "b"], ["s"], name="add"), h.make_node("Relu", ["s"], ["y"], name="relu"),
         h.make_node("Mul", ["x", "two"], ["z"], name="mul")],
        [_vi("x", ["batch", 3])],
        [_vi("y", ["batch", 3]), _vi("z", ["batch", 3])],
        [b, two],
    )


def mlp_model():
    rng = np.random.default_rng(0)
    w1 = nh.from_array(rng.standard_normal((4, 8)).astype(np.float32), "w1")
    b1 = nh.from_array(rng.standard_normal(8).astype(np.float32), "b1")
    w2 = nh.from_array(rng.standard_normal((8, 3)).astype(np.float32), "w2")
    b2 = nh.from_array(rng.standard_normal(3).astype(np.float32), "b2")
    shape = nh.from_array(np.array([-1, 6], np.int64), "shape")
    return _model(
        [
            h.make_node("MatMul", ["x", "w1"], ["m1"], name="mm1"),
            h.make_node("Add", ["m1", "b1"], ["a1"], name="add1"),
            h.make_node("Relu", ["a1"], ["h1"], name="relu1"),
            h.make_node("Gemm", ["h1", "w2", "b2"], ["logits"], name="gemm", alpha=0.5, beta=2.0),
            h.make_node("Concat", ["logits", "logits"], ["cat"], name="cat", axis=1),
            h.make_node("Reshape", ["cat", "shape"], ["flat"], name="reshape"),
        ],
        [_vi("x", ["batch", 4])],
        [_vi("logits", ["batch", 3]), _vi("flat", ["batch", 6])],
        [w1, b1, w2, b2, shape],
        name="mlp",
    )


def two_input_model():
    """out = MatMul(a, b) with a[n, k], b[k, m]: 'k' is shared between the inputs."""
    return _model(
        [h.make_node("MatMul", ["a", "b"], ["out"], name="matmul")],
        [_vi("a", ["n", "k"]), _vi("b", ["k", 5])],
        [_vi("out", ["n", 5])],
    )


# --- introspection ------------------------------------------------------------------


def test_get_inputs_outputs():
    sess = _session(_model(
        [h.make_node("Add", ["x", "u"], ["y"])],
        [_vi("x", ["batch", 3]), _vi("u", [None, 3])],
        [_vi("y", ["batch", 3])],
    ))
    ins, outs = sess.get_inputs(), sess.get_outputs()
    assert [(a.name, a.shape, a.type) for a in ins] == [("x", ["batch", 3], "tensor(float)"), ("u", [None, 3], "tensor(float)")]
    assert [(a.name, a.shape, a.type) for a in outs] == [("y", ["batch", 3], "tensor(float)")]
    assert "tensor(float)" in repr(ins[0])


def test_io_types_other_than_float():
    sess = _session(_model(
        [h.make_node("Add", ["i", "j"], ["o"])],
        [_vi("i", [2], TP.INT64), _vi("j", [2], TP.INT64)],
        [_vi("o", [2], TP.INT64)],
    ))
    assert [a.type for a in sess.get_inputs() + sess.get_outputs()] == ["tensor(int64)"] * 3
    (o,) = sess.run(None, {"i": np.array([1, 2]), "j": np.array([3, 4])})
    assert o.dtype == np.int64 and o.tolist() == [4, 6]


def test_initializers_are_not_inputs_and_metadata():
    sess = _session(add_relu_model())
    assert [a.name for a in sess.get_inputs()] == ["x"]
    assert sess.get_overridable_initializers() == []
    meta = sess.get_modelmeta()
    assert meta.producer_name == "tests" and meta.graph_name == "g"
    assert sess.metadata["producer.name"] == "minirt-builder"


def test_inference_session_alias_and_path(tmp_path):
    assert minirt.InferenceSession is minirt.Session
    path = tmp_path / "m.mrt"
    builder.build(add_relu_model(), path)
    x = np.array([[1, 2, 3]], np.float32)
    from_path = minirt.InferenceSession(str(path))
    from_pathlike = minirt.Session(path)
    from_bytes = minirt.Session(path.read_bytes())
    results = [s.run(None, {"x": x}) for s in (from_path, from_pathlike, from_bytes)]
    for r in results[1:]:
        for a, b in zip(results[0], r):
            np.testing.assert_array_equal(a, b)


# --- running -----------------------------------------------------------------------------


def test_run_none_and_named_outputs_keep_order():
    sess = _session(add_relu_model())
    x = np.array([[-1.0, 1.0, 0.0], [2.0, 3.0, -4.0]], np.float32)
    y, z = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, np.maximum(x + [1.0, -2.0, 0.5], 0))
    np.testing.assert_allclose(z, x * 2)
    z2, y2 = sess.run(["z", "y"], {"x": x})
    np.testing.assert_array_equal(z2, z)
    np.testing.assert_array_equal(y2, y)
    (only,) = sess.run(["z"], {"x": x})
    np.testing.assert_array_equal(only, z)
    assert sess.run([], {"x": x}) == []
    twice = sess.run(("y", "y"), {"x": x})
    np.testing.assert_array_equal(twice[0], twice[1])


@pytest.mark.parametrize("batch", [1, 3, 17])
def test_parity_with_onnxruntime(batch):
    model = mlp_model()
    ref = _ort(model)
    sess = _session(model)
    x = np.random.default_rng(batch).standard_normal((batch, 4)).astype(np.float32)
    got = sess.run(None, {"x": x})
    want = ref.run(None, {"x": x})
    assert [o.name for o in sess.get_outputs()] == [o.name for o in ref.get_outputs()]
    assert [i.name for i in sess.get_inputs()] == [i.name for i in ref.get_inputs()]
    assert [i.shape for i in sess.get_inputs()] == [i.shape for i in ref.get_inputs()]
    assert [i.type for i in sess.get_inputs()] == [i.type for i in ref.get_inputs()]
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_symbolic_batch_changes_between_runs():
    sess = _session(mlp_model())
    for batch in (5, 1, 9, 0, 2):
        x = np.ones((batch, 4), np.float32)
        logits, flat = sess.run(None, {"x": x})
        assert logits.shape == (batch, 3) and flat.shape == (batch, 6)


def test_outputs_that_are_inputs_or_initializers_are_copies():
    k = nh.from_array(np.array([1.0, 2.0], np.float32), "k")
    sess = _session(_model(
        [h.make_node("Relu", ["x"], ["r"])],
        [_vi("x", ["N", 2])],
        [_vi("r", ["N", 2]), _vi("x", ["N", 2]), _vi("k", [2])],
        [k],
    ))
    x = np.array([[1.0, -1.0]], np.float32)
    r, x_out, k_out = sess.run(None, {"x": x})
    assert not np.shares_memory(x_out, x)
    assert x_out.flags.writeable and k_out.flags.writeable and k_out.flags.owndata
    x_out[...] = 42
    k_out[...] = 42
    assert x.tolist() == [[1.0, -1.0]]
    _, _, k_again = sess.run(None, {"x": x})
    assert k_again.tolist() == [1.0, 2.0]


def test_outputs_of_view_kernels_over_initializers_are_writable():
    w = nh.from_array(np.arange(6, dtype=np.float32), "w")
    shape = nh.from_array(np.array([2, 3], np.int64), "shape")
    sess = _session(_model(
        [h.make_node("Reshape", ["w", "shape"], ["y"]), h.make_node("Identity", ["x"], ["xi"])],
        [_vi("x", [1])],
        [_vi("y", [2, 3]), _vi("xi", [1])],
        [w, shape],
    ))
    y, _ = sess.run(None, {"x": np.zeros(1, np.float32)})
    assert y.flags.writeable
    y[...] = -1
    (y2, _) = sess.run(None, {"x": np.zeros(1, np.float32)})
    assert y2.tolist() == [[0, 1, 2], [3, 4, 5]]


def test_identity_output_does_not_alias_the_feed():
    sess = _session(_model([h.make_node("Identity", ["x"], ["y"])], [_vi("x", [2])], [_vi("y", [2])]))
    x = np.zeros(2, np.float32)
    (y,) = sess.run(None, {"x": x})
    assert not np.shares_memory(y, x)


def test_run_profiled():
    # opt-level 0 keeps the nodes as written, so the profile can be checked name by name.
    sess = minirt.Session(builder.build_bytes(mlp_model(), opt_level=0))
    x = np.ones((2, 4), np.float32)
    outputs, prof = sess.run_profiled({"x": x})
    for a, b in zip(outputs, sess.run(None, {"x": x})):
        np.testing.assert_array_equal(a, b)
    assert set(prof) >= {"total_s", "kernel_s", "nodes", "overhead_per_node_s"}
    assert prof["total_s"] >= prof["kernel_s"] >= 0 and prof["overhead_per_node_s"] >= 0
    assert prof["total_s"] < 10
    assert [(n, op) for n, op, _ in prof["nodes"]] == [
        ("mm1", "MatMul"), ("add1", "Add"), ("relu1", "Relu"), ("gemm", "Gemm"), ("cat", "Concat"), ("reshape", "Reshape"),
    ]
    assert all(t >= 0 for _, _, t in prof["nodes"])
    assert abs(sum(t for _, _, t in prof["nodes"]) - prof["kernel_s"]) < 1e-9


# --- providers and options ------------------------------------------------------------------------


def test_providers():
    data = builder.build_bytes(add_relu_model())
    available = minirt.get_available_providers()
    # onnxruntime's spelling (docs/ort_compat.md); accelerators found on this machine (e.g. tflite) come first
    assert available[-1] == "CPUExecutionProvider"
    # A generic-target artifact's default providers are the target's: the CPU only.
    assert minirt.Session(data).get_providers() == ["CPUExecutionProvider"]
    assert minirt.Session(data, providers=["CPUExecutionProvider"]).get_providers() == ["CPUExecutionProvider"]
    assert minirt.Session(data, ["cpu"]).get_providers() == ["CPUExecutionProvider"]
    assert minirt.Session(data, providers=[("CPUExecutionProvider", {})]).get_providers() == ["CPUExecutionProvider"]
    # as onnxruntime: an unknown provider warns, naming the available ones, and is skipped
    with pytest.warns(UserWarning, match="Specified provider 'CUDAExecutionProvider' is not a provider minirt knows"
                      ".*CPUExecutionProvider"):
        sess = minirt.Session(data, providers=["CUDAExecutionProvider"])
    assert sess.get_providers() == ["CPUExecutionProvider"]


def test_bad_session_options():
    data = builder.build_bytes(add_relu_model())
    with pytest.raises(minirt.InvalidArgument, match="unknown Session option"):
        minirt.Session(data, bogus=1)
    with pytest.raises(minirt.InvalidArgument, match="threads must be a positive integer"):
        minirt.Session(data, threads=0)


def test_invalid_artifact_is_format_error():
    with pytest.raises(minirt.FormatError, match="magic"):
        minirt.Session(b"\0" * 128)


# --- input validation -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sess2():
    return _session(two_input_model())


A = np.ones((2, 3), np.float32)
B = np.ones((3, 5), np.float32)


def _bad(sess, feed, *fragments, outputs=None):
    with pytest.raises(minirt.InvalidArgument) as info:
        sess.run(outputs, feed)
    assert isinstance(info.value, minirt.Error) and isinstance(info.value, ValueError)
    for f in fragments:
        assert f in str(info.value), (f, str(info.value))
    return str(info.value)


def test_valid_feed(sess2):
    (out,) = sess2.run(None, {"a": A, "b": B})
    assert out.shape == (2, 5) and np.allclose(out, 3)


def test_unknown_input_name(sess2):
    _bad(sess2, {"a": A, "b": B, "c": A}, "unknown input name 'c'", "['a', 'b']")


def test_missing_input(sess2):
    _bad(sess2, {"a": A}, "missing input(s) ['b']", "'b'", "tensor(float)", "['k', 5]")


def test_wrong_dtype(sess2):
    _bad(sess2, {"a": A.astype(np.float64), "b": B}, "input 'a'", "expected dtype tensor(float)", "got float64", "[2, 3]")


def test_python_list_is_converted_then_checked(sess2):
    # as onnxruntime: a list takes the declared dtype (float32) when numpy reads it as the same kind
    # (docs/ort_compat.md); one that cannot convert is still refused, naming both dtypes
    (y,) = sess2.run(None, {"a": [[1.0, 2.0, 3.0]], "b": B})
    np.testing.assert_array_equal(y, sess2.run(None, {"a": np.array([[1.0, 2.0, 3.0]], np.float32), "b": B})[0])
    _bad(sess2, {"a": [["x", "y", "z"]], "b": B}, "input 'a'", "expected dtype tensor(float)", "got <U1")


def test_wrong_rank(sess2):
    _bad(sess2, {"a": np.ones(3, np.float32), "b": B}, "input 'a'", "expected rank 2 with shape [n, k]", "got rank 1 with shape [3]")


def test_fixed_dimension_mismatch(sess2):
    _bad(sess2, {"a": A, "b": np.ones((3, 4), np.float32)}, "input 'b'", "dimension 1 must be 5", "[k, 5]", "got shape [3, 4]")


def test_inconsistent_symbolic_dim(sess2):
    msg = _bad(sess2, {"a": A, "b": np.ones((4, 5), np.float32)}, "input 'b'", "'k' = 4", "'a' dimension 1", "'k' = 3")
    assert "symbol" in msg


def test_unknown_output_name(sess2):
    _bad(sess2, {"a": A, "b": B}, "unknown output name 'nope'", "['out']", outputs=["nope"])


def test_feed_not_a_dict(sess2):
    _bad(sess2, [A, B], "input feed must be a dict", "list")


def test_output_names_plain_string(sess2):
    _bad(sess2, {"a": A, "b": B}, "output_names must be a list of names or None, not a single string", outputs="out")


def test_kernel_failure_names_node_op_and_shapes():
    sess = _session(_model(
        [h.make_node("MatMul", ["a", "b"], ["out"], name="the_matmul")],
        [_vi("a", ["n", "k"]), _vi("b", ["j", "m"])],
        [_vi("out", ["n", "m"])],
    ))
    with pytest.raises(minirt.KernelError) as info:
        sess.run(None, {"a": np.ones((2, 3), np.float32), "b": np.ones((4, 5), np.float32)})
    msg = str(info.value)
    assert isinstance(info.value, minirt.Error)
    assert "'the_matmul'" in msg and "MatMul" in msg and "float32[2, 3]" in msg and "float32[4, 5]" in msg


# --- subgraphs: lowering and captures -------------------------------------------------------------


def if_model():
    """main: a = Relu(x); y = If(cond) with nested Ifs reading a, k, t1 and x from outer scopes."""
    k = nh.from_array(np.array([10.0, 20.0], np.float32), "k")
    inner_then = h.make_graph([h.make_node("Mul", ["t1", "x"], ["tt"])], "inner_then", [], [_vi("tt", [2])])
    inner_else = h.make_graph([h.make_node("Identity", ["a"], ["te"])], "inner_else", [], [_vi("te", [2])])
    then = h.make_graph(
        [
            h.make_node("Add", ["a", "k"], ["t1"]),
            h.make_node("If", ["cond"], ["tout"], then_branch=inner_then, else_branch=inner_else),
        ],
        "then",
        [],
        [_vi("tout", [2])],
    )
    other = h.make_graph([h.make_node("Mul", ["x", "k"], ["e"])], "else", [], [_vi("e", [2])])
    return _model(
        [h.make_node("Relu", ["x"], ["a"]), h.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)],
        [_vi("cond", [], TP.BOOL), _vi("x", [2])],
        [_vi("y", [2])],
        [k],
        name="main",
    )


def lower_bytes(model) -> bytes:
    """Load + normalise + lower + encode, without the kernel-support check (no If kernel needed)."""
    model_ir, _ = load_model(model)
    _normalise(model_ir)
    w = ArtifactWriter()
    lower_model(model_ir, w)
    return w.to_bytes()


def test_free_value_names():
    model_ir, _ = load_model(if_model())
    main = model_ir.graph
    assert free_value_names(main) == set()
    if_node = [n for n in main if n.op_type == "If"][0]
    then, other = if_node.attributes["then_branch"].value, if_node.attributes["else_branch"].value
    assert free_value_names(then) == {"a", "k", "cond", "x"}  # x and a only through the nested Ifs
    assert free_value_names(other) == {"x", "k"}
    inner = [n for n in then if n.op_type == "If"][0]
    assert free_value_names(inner.attributes["then_branch"].value) == {"t1", "x"}
    assert free_value_names(inner.attributes["else_branch"].value) == {"a"}


def test_if_lowering_graphs_and_captures():
    art = reader.load(lower_bytes(if_model()))
    names = [g.name for g in art.graphs]
    assert names[0] == "main" and sorted(names) == sorted(["main", "then", "inner_then", "inner_else", "else"])
    by_name = {g.name: (i, g) for i, g in enumerate(art.graphs)}

    def captures(name):
        _, g = by_name[name]
        return [g.values[v].name for v in g.captures]

    assert captures("main") == []
    assert captures("then") == ["a", "cond", "k", "x"]  # sorted by name
    assert captures("else") == ["k", "x"]
    assert captures("inner_then") == ["t1", "x"]
    assert captures("inner_else") == ["a"]

    # every GRAPH attribute points after its own graph, and each capture resolves by name one level up
    parents = {}
    for gi, g in enumerate(art.graphs):
        for node in g.nodes:
            for attr in node.attributes.values():
                if attr.kind == 5:
                    assert attr.value > gi
                    parents[attr.value] = gi
    assert set(parents) == set(range(1, len(art.graphs)))
    for si, parent in parents.items():
        sub = art.graphs[si]
        outer_names = {v.name for v in art.graphs[parent].values}
        assert {sub.values[v].name for v in sub.captures} <= outer_names
    assert art.graphs[parents[by_name["inner_then"][0]]].name == "then"
    # the main graph's If node reads only cond; the rest reaches the branches through captures
    main = art.main_graph
    if_node = [n for n in main.nodes if art.operators[n.op_index].op_type == "If"][0]
    assert [main.values[v].name for v in if_node.inputs] == ["cond"]


@pytest.mark.skipif(lookup("", "If", OPSET) is None, reason="no If kernel yet")
@pytest.mark.parametrize("cond", [True, False])
def test_if_end_to_end_matches_onnxruntime(cond):
    model = if_model()
    feed = {"cond": np.array(cond), "x": np.array([-1.0, 3.0], np.float32)}
    (got,) = _session(model).run(None, feed)
    (want,) = _ort(model).run(None, feed)
    np.testing.assert_allclose(got, want)


# A test-only control-flow kernel in a private domain exercises captures end to end
# without depending on the real If/Loop kernels.
TEST_DOMAIN = "test.minirt.session"
if lookup(TEST_DOMAIN, "CallBody", 1) is None:

    @kernel("CallBody", since=1, domain=TEST_DOMAIN)
    def _call_body(x, *, body):
        return tuple(body.run(x))


def _call_body_model(reuse_captured_before: bool):
    """main: a = Relu(x); [b = Neg(a)]; c = CallBody(x2){ r = Add(a, s) } — the body captures a."""
    body = h.make_graph([h.make_node("Add", ["a", "s"], ["r"])], "body", [_vi("s", [2])], [_vi("r", [2])])
    nodes = [h.make_node("Relu", ["x"], ["a"])]
    feed_name = "x"
    if reuse_captured_before:
        nodes.append(h.make_node("Neg", ["a"], ["b"]))
        feed_name = "b"
    nodes.append(h.make_node("CallBody", [feed_name], ["c"], domain=TEST_DOMAIN, body=body))
    return _model(nodes, [_vi("x", [2])], [_vi("c", [2])], opsets=(("", OPSET), (TEST_DOMAIN, 1)))


def test_capture_end_to_end():
    x = np.array([-1.0, 2.0], np.float32)
    art_bytes = builder.build_bytes(_call_body_model(False))
    art = reader.load(art_bytes)
    assert [art.graphs[1].values[v].name for v in art.graphs[1].captures] == ["a"]
    (c,) = minirt.Session(art_bytes).run(None, {"x": x})
    np.testing.assert_allclose(c, np.maximum(x, 0) + x)


def test_capture_of_value_whose_last_direct_use_is_earlier():
    x = np.array([-1.0, 2.0], np.float32)
    (c,) = _session(_call_body_model(True)).run(None, {"x": x})
    a = np.maximum(x, 0)
    np.testing.assert_allclose(c, a + -a)
