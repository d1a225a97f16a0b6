"""Seed artifacts for the fuzzer: small, valid .mrt files covering the grammar.

Three are built from ONNX models through the real builder (so they are what
the toolchain actually produces); two are written directly with
``builder.writer.ArtifactWriter`` to reach parts of the format no kernel uses
yet: attributes of every kind (graph, graphs, strings, tensors), a subgraph
with captures, string tensors, every metadata value type and an optional
provider-blob section.
"""
from __future__ import annotations

import functools

import numpy as np

from minirt.format import schema as S


def _build(model, **options) -> bytes:
    """Build with the real builder, then pin the build timestamp so seeds are reproducible."""
    import re

    from minirt.builder import build_bytes
    from tests.fuzz.mutator import assemble, split

    entries = split(build_bytes(model, **options))
    for e in entries:
        if e.kind == S.SECTION_METADATA:
            e.payload = re.sub(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", b"2000-01-01T00:00:00Z", e.payload)
    return assemble(entries)


def mlp_model():
    import onnx
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32), "W1"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.standard_normal((3, 8)).astype(np.float32), "W2"),
        numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "b2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h0"], name="fc1"),
        helper.make_node("Add", ["h0", "b1"], ["h1"], name="bias1"),
        helper.make_node("Relu", ["h1"], ["h2"], name="act1"),
        helper.make_node("Gemm", ["h2", "W2", "b2"], ["logits"], name="fc2", transB=1, alpha=1.0),
        helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("probs", onnx.TensorProto.FLOAT, ["N", 3])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="fuzz-seed")
    model.ir_version = 8
    return model


def conv_model():
    import onnx
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(1)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "Wc"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "Bc"),
        numpy_helper.from_array(rng.standard_normal((2, 4)).astype(np.float32), "Wf"),
    ]
    nodes = [
        helper.make_node("Conv", ["img", "Wc", "Bc"], ["c"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["p"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten", axis=1),
        helper.make_node("Gemm", ["f", "Wf"], ["out"], name="head", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "convnet",
        [helper.make_tensor_value_info("img", onnx.TensorProto.FLOAT, ["B", 3, 6, 6])],
        [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, ["B", 2])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="fuzz-seed")
    model.ir_version = 8
    return model


def attrs_model():
    """Several initializers of different dtypes and attributes of the kinds kernels accept."""
    import onnx
    from onnx import helper, numpy_helper

    inits = [
        numpy_helper.from_array(np.array([-1, 2, 3], dtype=np.int64), "shape"),
        numpy_helper.from_array(np.array([0, 0, 1, 0, 0, 1], dtype=np.int64), "pads"),
        numpy_helper.from_array(np.array([True, False, True]), "cond"),
        numpy_helper.from_array(np.array([0.5, -0.5, 2.0], dtype=np.float64), "dbl"),
        numpy_helper.from_array(np.array([0, 2, 3], dtype=np.int32), "idx"),
        numpy_helper.from_array(np.arange(6, dtype=np.uint8), "u8"),
    ]
    nodes = [
        helper.make_node("Constant", [], ["c"], name="const_t", value=numpy_helper.from_array(np.linspace(-1, 1, 6).astype(np.float32))),
        helper.make_node("Constant", [], ["cf"], name="const_fs", value_floats=[1.0, 2.0, 3.0]),
        helper.make_node("Add", ["x", "c"], ["a"], name="add"),
        helper.make_node("LeakyRelu", ["a"], ["b"], name="leaky", alpha=0.2),
        helper.make_node("Reshape", ["b", "shape"], ["r"], name="reshape"),
        helper.make_node("Transpose", ["r"], ["t"], name="transpose", perm=[0, 2, 1]),
        helper.make_node("Pad", ["t", "pads"], ["p"], name="pad", mode="constant"),
        helper.make_node("Cast", ["p"], ["h"], name="to_half", to=onnx.TensorProto.FLOAT16),
        helper.make_node("Cast", ["h"], ["f"], name="to_float", to=onnx.TensorProto.FLOAT),
        helper.make_node("Gather", ["f", "idx"], ["g"], name="gather", axis=2),
        helper.make_node("Mul", ["g", "cf"], ["m"], name="mul"),
        helper.make_node("Cast", ["dbl"], ["d32"], name="dbl_to_f", to=onnx.TensorProto.FLOAT),
        helper.make_node("Where", ["cond", "m", "d32"], ["y"], name="where"),
        helper.make_node("Cast", ["u8"], ["u8f"], name="u8_to_f", to=onnx.TensorProto.FLOAT),
        helper.make_node("Shape", ["x"], ["xs"], name="shape_of"),
    ]
    graph = helper.make_graph(
        nodes,
        "attrs",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 6])],
        [
            helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 3, 3]),
            helper.make_tensor_value_info("u8f", onnx.TensorProto.FLOAT, [6]),
            helper.make_tensor_value_info("xs", onnx.TensorProto.INT64, [2]),
        ],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="fuzz-seed")
    model.ir_version = 8
    return model


def if_model():
    """An If whose branches read outer values (captures) and an initializer of the main graph."""
    import onnx
    from onnx import helper, numpy_helper

    then_g = helper.make_graph(
        [helper.make_node("Add", ["x", "bias"], ["t0"], name="then_add"), helper.make_node("Relu", ["t0"], ["t"], name="then_relu")],
        "then_branch", [], [helper.make_tensor_value_info("t", onnx.TensorProto.FLOAT, ["N", 3])],
    )
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"], name="else_neg")],
        "else_branch", [], [helper.make_tensor_value_info("e", onnx.TensorProto.FLOAT, ["N", 3])],
    )
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["cond"], name="positive"),
        helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=then_g, else_branch=else_g),
    ]
    graph = helper.make_graph(
        nodes, "if_model",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 3])],
        initializer=[numpy_helper.from_array(np.array([1.0, -2.0, 0.5], np.float32), "bias"),
                     numpy_helper.from_array(np.array(0.0, np.float32), "zero")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="fuzz-seed")
    model.ir_version = 8
    return model


def grammar_artifact() -> bytes:
    """Hand-written: every attribute kind, a subgraph with a capture, strings, metadata types.

    The session refuses it (no kernel takes graph attributes yet), but the
    reader decodes all of it, so mutants exercise every branch of the grammar.
    """
    from minirt.builder.writer import ArtifactWriter

    w = ArtifactWriter()
    w.set_metadata("i", 7)
    w.set_metadata("f", 0.5)
    w.set_metadata("s", "text")
    w.set_metadata("b", True)
    w.set_metadata("j", {"k": [1, 2, {"n": None}]})
    w.opsets[""] = 17
    ident = w.operator("", "Identity", 17)
    add = w.operator("", "Add", 17)
    t_f = w.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    t_s = w.tensor(np.array(["a", "bc", ""], dtype=object))
    t_i = w.tensor(np.array(5, dtype=np.int64))
    _, g0 = w.graph("main")
    g1_index = 1
    x = g0.value("x", 1, ("N", 3))
    g0.inputs.append(x)
    wv = g0.value("w", 1, (2, 3))
    g0.initializers.append((wv, t_f))
    sv = g0.value("s", 8, (3,))
    g0.initializers.append((sv, t_s))
    y = g0.value("y", 1, ("N", None))
    g0.add_node("add", add, [x, wv], [y], [])
    z = g0.value("z", 0, None)
    g0.add_node(
        "ident",
        ident,
        [y, -1],
        [z, -1],
        [
            ("f", S.ATTR_FLOAT, 1.5),
            ("i", S.ATTR_INT, -3),
            ("s", S.ATTR_STRING, b"str"),
            ("t", S.ATTR_TENSOR, t_i),
            ("g", S.ATTR_GRAPH, g1_index),
            ("fs", S.ATTR_FLOATS, (1.0, 2.0)),
            ("is", S.ATTR_INTS, (1, -1, 2**40)),
            ("ss", S.ATTR_STRINGS, (b"a", b"")),
            ("ts", S.ATTR_TENSORS, (t_f, t_i)),
            ("gs", S.ATTR_GRAPHS, (g1_index, 2)),
        ],
    )
    g0.outputs += [z, sv]
    _, g1 = w.graph("body")
    cap = g1.value("y")
    g1.captures.append(cap)
    o = g1.value("o", 1, (2, "M"))
    g1.add_node("inner", ident, [cap], [o], [])
    g1.outputs.append(o)
    _, g2 = w.graph("body2")
    i2 = g2.value("in", 7, ())
    g2.inputs.append(i2)
    g2.outputs.append(i2)
    if hasattr(S, "VALUE_SEQUENCE"):
        g2.value("unused_sequence", 1, (None,), kind=S.VALUE_SEQUENCE)
    w.provider_blobs.append(b"provider-blob-bytes")
    return w.to_bytes()


def strings_artifact() -> bytes:
    """Hand-written and runnable: a string initializer passed through Identity."""
    from minirt.builder.writer import ArtifactWriter

    w = ArtifactWriter()
    w.set_metadata("source.model_version", 3)
    w.set_metadata("source.metadata_props", {"k": "v"})
    w.opsets[""] = 17
    ident = w.operator("", "Identity", 17)
    t_s = w.tensor(np.array([["x", "yy"], ["zzz", "é"]], dtype=object))
    _, g = w.graph("strings")
    sv = g.value("labels", 8, (2, 2))
    g.initializers.append((sv, t_s))
    x = g.value("x", 7, ("K",))
    g.inputs.append(x)
    out = g.value("out", 8, (2, 2))
    g.add_node("copy", ident, [sv], [out], [])
    xo = g.value("xo", 7, ("K",))
    g.add_node("copy_x", ident, [x], [xo], [])
    g.outputs += [out, xo]
    return w.to_bytes()


@functools.lru_cache(maxsize=None)
def seed_artifacts() -> tuple:
    """(name, bytes) of every built-in seed; built once per process."""
    return (
        ("mlp", _build(mlp_model())),
        ("conv", _build(conv_model())),
        # a packed_weights section (kind 9): the conv's and the Gemm's weights in panels of 8
        ("packed", _build(conv_model(), input_shapes={"img": [1, 3, 6, 6]}, weight_pack=8)),
        ("attrs", _build(attrs_model())),
        ("if", _build(if_model())),
        ("grammar", grammar_artifact()),
        ("strings", strings_artifact()),
        ("signed", signed_artifact()),
    )


# A fixed key for the signed seed; the driver loads some mutants with its public key.
SIGNING_SEED = bytes(range(32))


def signed_artifact() -> bytes:
    """The mlp seed signed with :data:`SIGNING_SEED` (a signature section, kind 8, last)."""
    from minirt.builder.writer import sign_artifact

    return sign_artifact(_build(mlp_model()), SIGNING_SEED)


def signing_public_key() -> bytes:
    from minirt.format import ed25519

    return ed25519.public_key(SIGNING_SEED)
