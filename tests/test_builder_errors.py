"""The builder on bad input: every failure is a ``builder.BuildError`` with a clear
message, and a failed build leaves the output folder exactly as it was (no
artifact, no temporary file).
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from minirt import builder
from minirt.builder import BuildError, UnsupportedModel
from minirt.builder.build import build
from tests.fuzz.seeds import mlp_model


@pytest.fixture
def dirs(tmp_path):
    src = tmp_path / "src"
    out = tmp_path / "out"
    src.mkdir()
    out.mkdir()
    (out / "keep.txt").write_text("unrelated file")
    return src, out


def _listing(folder) -> list:
    return sorted(os.listdir(folder))  # includes dot files such as .minirt-*.tmp


def _fails(match: str, model, out_dir, *, error=BuildError, out_name="model.mrt", **options) -> BuildError:
    before = _listing(out_dir)
    with pytest.raises(error, match=match) as info:
        builder.build(model, os.path.join(out_dir, out_name), **options)
    assert _listing(out_dir) == before, "a failed build left files behind"
    return info.value


# --- the model cannot be read ---------------------------------------------------------


def test_malformed_onnx_bytes(dirs):
    _src, out = dirs
    _fails("not a valid ONNX model", b"this is not a protobuf \xff\xfe", out)


def test_malformed_onnx_file(dirs):
    src, out = dirs
    bad = src / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage\xff\xff\xff")
    err = _fails("not a valid ONNX model", str(bad), out)
    assert str(bad) in str(err)


def test_truncated_onnx_file(dirs):
    src, out = dirs
    data = mlp_model().SerializeToString()
    bad = src / "truncated.onnx"
    bad.write_bytes(data[: len(data) // 2])
    _fails("truncated.onnx", str(bad), out)


def test_file_that_does_not_exist(dirs):
    src, out = dirs
    _fails("no such file", str(src / "missing.onnx"), out)


def test_directory_instead_of_a_model(dirs):
    src, out = dirs
    _fails("is a directory", str(src), out)


def test_unloadable_python_object(dirs):
    _src, out = dirs
    _fails("cannot load a model from int", 123, out)


def test_model_the_onnx_checker_rejects(dirs):
    _src, out = dirs
    m = mlp_model()
    m.graph.node[0].input[0] = "undefined_value"
    _fails("checker rejects", m, out)


def test_inputs_of_one_type_constraint_with_different_types(dirs):
    """A float64 Conv weight on a float32 input: onnxruntime refuses the model when loading it; the builder
    refuses it too (it used to build, and the artifact failed at its first run)."""
    _, out = dirs
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float64), "W")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "W"], ["y"], kernel_shape=[3, 3])], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 6, 6])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    err = _fails("element types disagree", model, out)
    assert "Conv" in str(err) and "tensor(double)" in str(err) and "cast one of them" in str(err)


def test_empty_graph(dirs):
    _src, out = dirs
    g = helper.make_graph([], "empty", [], [])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    _fails("empty", m, out)


# --- external data ------------------------------------------------------------------------------


def _save_with_external_data(folder) -> str:
    path = os.path.join(folder, "ext.onnx")
    onnx.save_model(mlp_model(), path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location="ext.data", size_threshold=0)
    assert os.path.exists(os.path.join(folder, "ext.data"))
    return path


def test_external_data_present_builds(dirs):
    src, out = dirs
    path = _save_with_external_data(src)
    builder.build(path, os.path.join(out, "model.mrt"))
    assert os.path.exists(os.path.join(out, "model.mrt"))


def test_external_data_file_missing(dirs):
    src, out = dirs
    path = _save_with_external_data(src)
    os.remove(os.path.join(src, "ext.data"))
    err = _fails("external data", path, out)
    assert "ext.data" in str(err)


def test_external_data_file_missing_from_bytes(dirs):
    """From bytes there is no folder to look in: the checker's complaint names the file."""
    src, out = dirs
    path = _save_with_external_data(src)
    os.remove(os.path.join(src, "ext.data"))
    with open(path, "rb") as f:
        data = f.read()
    _fails("ext.data", data, out)


def _external_model(location: str, data: bytes | None, folder) -> str:
    """The MLP with W1 stored externally at ``location`` (written with ``data`` if given)."""
    m = mlp_model()
    t = m.graph.initializer[0]
    raw = numpy_helper.to_array(t).tobytes()
    t.ClearField("raw_data")
    t.ClearField("float_data")
    for key, value in (("location", location), ("offset", "0"), ("length", str(len(raw)))):
        entry = t.external_data.add()
        entry.key, entry.value = key, value
    t.data_location = onnx.TensorProto.EXTERNAL
    if data is not None:
        with open(os.path.join(folder, location), "wb") as f:
            f.write(data if data else raw)
    path = os.path.join(folder, "model.onnx")
    with open(path, "wb") as f:
        f.write(m.SerializeToString())
    return path


@pytest.mark.parametrize(
    "location,data",
    [("../outside.bin", None), ("/etc/passwd", None), ("short.bin", b"\x00" * 8)],
    ids=["escapes-folder", "absolute-path", "shorter-than-declared"],
)
def test_bad_external_data_reference(dirs, location, data):
    src, out = dirs
    path = _external_model(location, data, src)
    _fails("external data", path, out)


# --- unsupported content ------------------------------------------------------------------------


def test_custom_domain_operator_names_op_node_and_opset(dirs):
    _src, out = dirs
    node = helper.make_node("FancyOp", ["x"], ["y"], name="my_custom_node", domain="com.example")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 3)])
    m.ir_version = 8
    err = _fails("FancyOp", m, out, error=UnsupportedModel)
    msg = str(err)
    assert "my_custom_node" in msg and "com.example" in msg and "opset 3" in msg


def test_unsupported_standard_operator_is_listed_with_the_others(dirs):
    _src, out = dirs
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="fine"),
        helper.make_node("FancyOp", ["a"], ["b"], name="first_bad", domain="com.example"),
        helper.make_node("OtherOp", ["b"], ["y"], name="second_bad", domain="com.example"),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    m.ir_version = 8
    err = _fails("cannot be built", m, out, error=UnsupportedModel)
    assert "first_bad" in str(err) and "second_bad" in str(err) and "fine" not in str(err)


# --- bad options ----------------------------------------------------------------------------------


def test_unknown_target(dirs):
    _src, out = dirs
    err = _fails("unknown target 'pdp11'", mlp_model(), out, target="pdp11")
    assert "generic" in str(err)  # lists the known ones


@pytest.mark.parametrize("level", [7, -1, "2", None, 1.5])
def test_bad_opt_level(dirs, level):
    _src, out = dirs
    _fails("opt_level must be one of", mlp_model(), out, opt_level=level)


def test_bad_quantize_mode(dirs):
    _src, out = dirs
    _fails("quantize must be one of", mlp_model(), out, quantize="int3")


@pytest.mark.parametrize(
    "spec,match",
    [
        (["x"], "expected NAME=DIMxDIM"),
        (["=1x4"], "expected NAME=DIMxDIM"),
        (["x=1xa"], "not a list of integers"),
        (["x=1x4.5"], "not a list of integers"),
        (["x=-1x4"], "must be >= 0"),
    ],
)
def test_bad_input_shape_spec(dirs, spec, match):
    _src, out = dirs
    _fails(match, mlp_model(), out, input_shapes=spec)


@pytest.mark.parametrize("spec", [["y=1x4"], {"nope": (1, 4)}])
def test_input_shape_naming_an_unknown_input(dirs, spec):
    _src, out = dirs
    err = _fails("names", mlp_model(), out, input_shapes=spec)
    assert "'x'" in str(err)  # tells the user what the inputs are


@pytest.mark.parametrize("spec", [["x=1x4x5"], ["x=4"], {"x": ()}])
def test_input_shape_with_the_wrong_rank(dirs, spec):
    _src, out = dirs
    _fails("rank", mlp_model(), out, input_shapes=spec)


def test_input_shape_contradicting_a_fixed_dim(dirs):
    _src, out = dirs
    _fails("dimension 1 is fixed to 4", mlp_model(), out, input_shapes=["x=1x5"])


def test_input_shape_that_fits_builds(dirs):
    _src, out = dirs
    builder.build(mlp_model(), os.path.join(out, "model.mrt"), input_shapes=["x=2x4"])
    import minirt

    sess = minirt.Session(os.path.join(out, "model.mrt"))
    assert sess.get_inputs()[0].shape == [2, 4]


# --- the output path --------------------------------------------------------------------------------


def test_output_folder_missing(dirs):
    _src, out = dirs
    _fails("does not exist", mlp_model(), out, out_name=os.path.join("no", "such", "model.mrt"))


def test_output_path_is_a_directory(dirs):
    _src, out = dirs
    os.mkdir(os.path.join(out, "model.mrt"))
    _fails("directory", mlp_model(), out)


def test_failed_rebuild_keeps_the_previous_artifact(dirs):
    _src, out = dirs
    target = os.path.join(out, "model.mrt")
    builder.build(mlp_model(), target)
    with open(target, "rb") as f:
        good = f.read()
    before = _listing(out)
    with pytest.raises(BuildError):
        builder.build(mlp_model(), target, target="pdp11")
    m = mlp_model()
    m.graph.node[1].op_type = "NoSuchOp"
    with pytest.raises(BuildError):
        builder.build(m, target)
    assert _listing(out) == before
    with open(target, "rb") as f:
        assert f.read() == good


# --------------------------------------------------------------------------- quantization that would change nothing


def _relu_model():
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _matmul_in_if_model():
    """y = If(c, x @ W1, x @ W2): every weight sits inside a branch."""
    rng = np.random.default_rng(0)

    def branch(name, seed):
        w = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32) + seed, f"w_{name}")
        return helper.make_graph([helper.make_node("MatMul", ["x", f"w_{name}"], [f"y_{name}"])], name, [],
                                 [helper.make_tensor_value_info(f"y_{name}", onnx.TensorProto.FLOAT, [1, 64])], [w])

    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=branch("then", 0), else_branch=branch("else", 1))], "g",
        [helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 64])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _depthwise_model(channels: int = 4):
    """A depthwise conv: kept float on every target, and its weights (9 a channel) under the targets'
    weight_only_min_elements, so not stored int8 (from 64 of them, stored float16: D174)."""
    c = channels
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((c, 1, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], group=c, pads=[1, 1, 1, 1])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, c, 6, 6])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, c, 6, 6])], [w])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("mode", ["int8-dynamic", "fp16"])
def test_quantizing_nothing_fails_and_says_why(dirs, mode):
    _, out = dirs
    err = _fails("nothing was quantized", _relu_model(), out, quantize=mode)
    assert f"--quantize {mode}" in str(err) and "--allow-float-fallback" in str(err)
    assert ("initializers" if mode == "fp16" else "Conv, ConvTranspose, MatMul, Gemm") in str(err)


def test_final_layers_in_if_bodies_store_int8_weights(dirs):
    """The quantizer enters If bodies (D95): the branches' MatMuls are candidates, here both final layers:
    with quantize_final=False computed in float from int8-stored weights (D127), named so in the report; by
    default (D149) both are computed in int8."""
    res = build(_matmul_in_if_model(), None, quantize="int8-dynamic", quantize_final=False)
    q = res.quantization
    assert len(q["weight_only"]) == 2 and not q["quantized"]
    assert all("final layer" in k["reason"] and "weights stored int8" in k["reason"] for k in q["kept_float"])
    res = build(_matmul_in_if_model(), None, quantize="int8-dynamic", quantize_final=True)
    assert len(res.quantization["quantized"]) == 2 and not res.quantization["weight_only"]


@pytest.mark.parametrize("channels", [4, 8])
def test_quantizing_nothing_lists_the_layers_kept_float(dirs, channels):
    """With 8 channels the kept-float conv's 72 weights would be stored float16: that is no int8 layer, and
    the int8 build still fails and says why."""
    _, out = dirs
    rng = np.random.default_rng(1)
    calib = [{"x": rng.standard_normal((1, channels, 6, 6)).astype(np.float32)} for _ in range(2)]
    err = _fails("kept float", _depthwise_model(channels), out, quantize="int8", calibration=calib,
                 quantize_final=True)
    assert "all 1 candidate layer(s) kept float" in str(err) and "depthwise" in str(err)


def test_float_fallback_when_asked_or_automatic(dirs):
    _, out = dirs
    path = os.path.join(out, "relu.mrt")
    report = builder.build(_relu_model(), path, quantize="int8-dynamic", allow_float_fallback=True)
    assert os.path.exists(path)
    assert any("the artifact is the float model" in w for w in report.quantization["warnings"])
    # --quantize auto (the target's default mode) never fails on a model it cannot quantize
    report = builder.build(_relu_model(), path, quantize="auto", target="rpi4")
    assert any("nothing was quantized" in w for w in report.quantization["warnings"])
