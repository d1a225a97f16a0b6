"""onnxruntime drop-in (docs/ort_compat.md): a typical onnxruntime script runs unchanged under minirt.

The script body (:func:`typical_script`) is written once against a runtime module ``rt`` and run
with ``onnxruntime`` and with ``minirt``; both must give the same results.  The other tests cover
one promise each: provider warnings, threads, terminate from another thread, IOBinding into the
caller's memory, lists as feeds, the exception names, profiling, ONNX in with its cache and the
message without the builder, and the compatibility table covering every public name.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
import types
import warnings
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

import minirt
from minirt import builder

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits" / "digits_cnn.onnx"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    """Every test builds ONNX models into its own cache, never the user's."""
    monkeypatch.setenv("MINIRT_CACHE_DIR", str(tmp_path / "cache"))


def typical_script(rt, model_path: str, x: np.ndarray) -> dict:
    """What an onnxruntime user writes, with ``rt`` for ``onnxruntime``."""
    so = rt.SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = rt.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = rt.ExecutionMode.ORT_SEQUENTIAL
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sess = rt.InferenceSession(model_path, sess_options=so,
                                   providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert "CPUExecutionProvider" in sess.get_providers()
    input_name = sess.get_inputs()[0].name
    output_name = sess.get_outputs()[0].name
    ro = rt.RunOptions()
    ro.log_severity_level = 3
    (by_name,) = sess.run([output_name], {input_name: x}, ro)
    (from_list,) = sess.run(None, {input_name: x.tolist()})  # a Python list as the feed value
    binding = sess.io_binding()
    binding.bind_cpu_input(input_name, x)
    buffer = np.zeros((x.shape[0], 10), np.float32)
    binding.bind_ortvalue_output(output_name, rt.OrtValue.ortvalue_from_numpy(buffer))
    sess.run_with_iobinding(binding, ro)
    (copied,) = binding.copy_outputs_to_cpu()
    (ortvalue,) = sess.run_with_ort_values([output_name], {input_name: rt.OrtValue.ortvalue_from_numpy(x)})
    return {
        "providers": sess.get_providers(),
        "cuda_warned": any("CUDAExecutionProvider" in str(w.message) for w in caught),
        "input": (input_name, sess.get_inputs()[0].type),
        "output": output_name,
        "by_name": by_name,
        "from_list": from_list,
        "buffer": buffer,
        "copied": copied,
        "ortvalue": ortvalue.numpy(),
        "ortvalue_type": ortvalue.data_type(),
    }


def test_typical_onnxruntime_script_same_results_under_both_runtimes():
    ort = pytest.importorskip("onnxruntime")
    x = np.random.default_rng(0).random((3, 1, 8, 8), dtype=np.float32)
    ours = typical_script(minirt, str(DIGITS), x)
    theirs = typical_script(ort, str(DIGITS), x)
    assert ours["providers"] == theirs["providers"] == ["CPUExecutionProvider"]
    assert ours["cuda_warned"] and theirs["cuda_warned"]
    for key in ("input", "output", "ortvalue_type"):
        assert ours[key] == theirs[key], key
    for key in ("by_name", "from_list", "buffer", "copied", "ortvalue"):
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-4, atol=1e-5, err_msg=key)
    # the bound buffer received the result in place, under both runtimes
    np.testing.assert_array_equal(ours["buffer"], ours["by_name"])


def test_iobinding_writes_into_the_callers_buffer():
    sess = minirt.InferenceSession(str(DIGITS))
    x = np.random.default_rng(1).random((2, 1, 8, 8), dtype=np.float32)
    buffer = np.full((2, 10), np.nan, np.float32)
    binding = sess.io_binding()
    binding.bind_ortvalue_input("image", minirt.OrtValue.ortvalue_from_numpy(x))
    binding.bind_ortvalue_output("logits", minirt.OrtValue.ortvalue_from_numpy(buffer))
    for _ in range(3):  # (the later runs replay the planned run: still into the buffer)
        buffer[:] = np.nan
        sess.run_with_iobinding(binding)
        (result,) = binding.get_outputs()
        assert np.shares_memory(result.numpy(), buffer)
        np.testing.assert_array_equal(buffer, sess.run(None, {"image": x})[0])
    # the node computing the output (Gemm: it takes out=) wrote straight into the buffer: no copy
    from minirt import session as session_mod

    def no_copy(*args):
        raise AssertionError("the bound output was copied into the buffer, not written there by its node")

    session_mod._write_into, saved = no_copy, session_mod._write_into
    try:
        buffer[:] = np.nan
        sess.run_with_iobinding(binding)
        np.testing.assert_array_equal(buffer, sess.run(None, {"image": x})[0])
    finally:
        session_mod._write_into = saved
    # an output bound without a buffer is allocated by the run
    binding.clear_binding_outputs()
    binding.bind_output("logits")
    sess.run_with_iobinding(binding)
    np.testing.assert_array_equal(binding.copy_outputs_to_cpu()[0], buffer)
    # a buffer of the wrong shape: an error naming both
    binding.clear_binding_outputs()
    binding.bind_ortvalue_output("logits", minirt.OrtValue.ortvalue_from_numpy(np.zeros((3, 10), np.float32)))
    with pytest.raises(minirt.InvalidArgument, match=r"output 'logits': the bound buffer is float32\[3, 10\], "
                                                     r"the result is float32\[2, 10\]"):
        sess.run_with_iobinding(binding)


def test_providers_warn_and_skip_as_onnxruntime_does():
    data = DIGITS.read_bytes()
    with pytest.warns(UserWarning, match="'CUDAExecutionProvider' is not a provider minirt knows; skipped. "
                                         "Available providers: .*CPUExecutionProvider"):
        sess = minirt.InferenceSession(data, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert sess.get_providers() == ["CPUExecutionProvider"]
    assert sess.get_provider_options() == {"CPUExecutionProvider": {}}
    assert minirt.get_available_providers()[-1] == "CPUExecutionProvider"
    assert "CoreMLExecutionProvider" in minirt.get_all_providers()
    from minirt import providers

    if not providers.availability("coreml")[0]:  # known but not available here: warned and skipped too
        with pytest.warns(UserWarning, match="'CoreMLExecutionProvider' is not available on this device"):
            sess = minirt.InferenceSession(data, providers=["CoreMLExecutionProvider", "cpu"])
        assert sess.get_providers() == ["CPUExecutionProvider"]
    with pytest.warns(UserWarning, match="Specified provider 'FooProvider'"):
        sess.set_providers(["FooProvider"])
    assert sess.get_providers() == ["CPUExecutionProvider"]
    sess.disable_fallback()
    sess.enable_fallback()


def test_session_options_threads_and_memory_plan():
    data = DIGITS.read_bytes()
    so = minirt.SessionOptions()
    assert minirt.InferenceSession(data, so).threads is None  # 0: the default (every CPU)
    so.intra_op_num_threads = 1
    so.enable_mem_pattern = False
    sess = minirt.InferenceSession(data, so)
    assert sess.threads == 1 and sess.memory_plan is False
    assert sess.get_session_options() is so
    assert minirt.InferenceSession(data, so, threads=2).threads == 2  # minirt's own argument wins
    so.intra_op_num_threads = -1
    with pytest.raises(minirt.InvalidArgument, match="intra_op_num_threads must be an integer >= 0"):
        minirt.InferenceSession(data, so)
    so.intra_op_num_threads = 0
    so.execution_mode = minirt.ExecutionMode.ORT_PARALLEL
    with pytest.warns(UserWarning, match="minirt ignores these SessionOptions: execution_mode=ORT_PARALLEL"):
        minirt.InferenceSession(data, so)
    # onnxruntime's own SessionOptions object is read the same way
    ort = pytest.importorskip("onnxruntime")
    theirs = ort.SessionOptions()
    theirs.intra_op_num_threads = 1
    assert minirt.InferenceSession(data, theirs).threads == 1


def _long_chain(n: int = 400, size: int = 1 << 18) -> bytes:
    """A model of n dependent Adds over a large vector: a run long enough to be stopped halfway."""
    nodes = [h.make_node("Add", ["x" if i == 0 else f"t{i - 1}", "x"], [f"t{i}" if i < n - 1 else "y"])
             for i in range(n)]
    graph = h.make_graph(nodes, "chain", [h.make_tensor_value_info("x", TP.FLOAT, [size])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [size])])
    return builder.build_bytes(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), opt_level=0)


def test_run_options_terminate_from_another_thread():
    from minirt.capi.onnxruntime_pybind11_state import Fail

    sess = minirt.InferenceSession(_long_chain(), warm_up=False)
    x = np.ones(1 << 18, np.float32)
    t0 = time.perf_counter()
    (y,) = sess.run(None, {"x": x}, minirt.RunOptions())  # (also records the memory plan)
    full = time.perf_counter() - t0
    assert y[0] == 401.0
    # fresh and not warmed up (D90): its first run walks the nodes (no replay)
    sess = minirt.InferenceSession(_long_chain(), warm_up=False)
    ro = minirt.RunOptions()
    seen_nodes = []

    class Watched(minirt.RunOptions):  # counts the checks, so the test knows the run was underway
        @property
        def terminate(self):
            seen_nodes.append(1)
            return ro.terminate

        @terminate.setter
        def terminate(self, value):
            pass

    setter = threading.Timer(full / 4, lambda: setattr(ro, "terminate", True))
    setter.start()
    t0 = time.perf_counter()
    with pytest.raises(Fail, match="Exiting due to terminate flag being set to true"):
        sess.run(None, {"x": x}, Watched())
    setter.join()
    assert 1 < len(seen_nodes) < 400  # stopped between nodes, before the end
    assert time.perf_counter() - t0 < full
    # the flag stays set: the next run with these options stops at once; without options it runs
    with pytest.raises(minirt.RunTerminated):
        sess.run(None, {"x": x}, ro)
    assert sess.run(None, {"x": x})[0][0] == 401.0


def test_run_async_calls_back():
    sess = minirt.InferenceSession(str(DIGITS))
    x = np.zeros((1, 1, 8, 8), np.float32)
    done = threading.Event()
    got = []

    def callback(outputs, user_data, err):
        got.append((outputs, user_data, err))
        done.set()

    sess.run_async(None, {"image": x}, callback, "tag")
    assert done.wait(60)
    (outputs, user_data, err) = got[0]
    assert err == "" and user_data == "tag"
    np.testing.assert_array_equal(outputs[0], sess.run(None, {"image": x})[0])
    done.clear()
    sess.run_async(None, {"nope": x}, callback, None)
    assert done.wait(60) and got[1][0] is None and "InvalidArgument: unknown input name 'nope'" in got[1][2]


def test_lists_as_feeds_take_the_declared_dtype():
    sess = minirt.InferenceSession(str(DIGITS))
    x = np.random.default_rng(2).random((1, 1, 8, 8), dtype=np.float32)
    np.testing.assert_array_equal(sess.run(None, {"image": x.tolist()})[0], sess.run(None, {"image": x})[0])
    with pytest.raises(minirt.InvalidArgument, match="expected dtype tensor\\(float\\)"):
        sess.run(None, {"image": [[[["a"] * 8] * 8]]})


def test_exceptions_under_onnxruntime_names(tmp_path):
    from minirt.capi.onnxruntime_pybind11_state import (
        InvalidArgument, InvalidProtobuf, NoSuchFile, NotImplemented, RuntimeException,
    )

    assert InvalidArgument is minirt.InvalidArgument
    assert issubclass(minirt.KernelError, RuntimeException) and issubclass(minirt.UnsupportedOperator, NotImplemented)
    sess = minirt.InferenceSession(str(DIGITS))
    with pytest.raises(InvalidArgument):
        sess.run(None, {"nope": np.zeros((1, 1, 8, 8), np.float32)})
    with pytest.raises(NoSuchFile):
        minirt.InferenceSession(str(tmp_path / "missing.mrt"))
    with pytest.raises(InvalidProtobuf):
        minirt.InferenceSession(b"garbage, neither .mrt nor ONNX")
    with pytest.raises(NotImplemented, match="custom ops"):
        minirt.SessionOptions().register_custom_ops_library("libx.so")


def test_profiling_writes_a_chrome_trace(tmp_path):
    so = minirt.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "prof")
    sess = minirt.InferenceSession(str(DIGITS), so)
    x = np.zeros((1, 1, 8, 8), np.float32)
    for _ in range(2):
        sess.run(None, {"image": x})
    path = sess.end_profiling()
    assert path.startswith(str(tmp_path / "prof_")) and path.endswith(".json")
    events = json.loads(Path(path).read_text())
    runs = [e for e in events if e["cat"] == "Session" and e["name"] == "model_run"]
    nodes = [e for e in events if e["cat"] == "Node"]
    assert len(runs) == 2 and len(nodes) == 2 * len(sess.artifact.main_graph.nodes)
    assert {"ph", "ts", "dur", "pid", "tid", "name"} <= set(nodes[0]) and nodes[0]["ph"] == "X"
    assert nodes[0]["args"]["provider"] == "CPUExecutionProvider" and nodes[0]["args"]["op_name"]
    assert minirt.InferenceSession(str(DIGITS)).end_profiling() == ""


def test_onnx_in_builds_once_then_loads_the_cache(tmp_path, monkeypatch):
    x = np.random.default_rng(3).random((1, 1, 8, 8), dtype=np.float32)
    first = minirt.InferenceSession(str(DIGITS))
    assert first.built_from["cached"] is False and os.path.isfile(first.built_from["cache"])
    assert first.built_from["cache"].startswith(str(tmp_path / "cache"))

    def no_build(*args, **kwargs):
        raise AssertionError("the second start rebuilt the model instead of loading the cache")

    monkeypatch.setattr(builder, "build_bytes", no_build)
    t0 = time.perf_counter()
    second = minirt.InferenceSession(str(DIGITS))
    assert second.built_from == dict(first.built_from, cached=True)
    assert time.perf_counter() - t0 < 1.0
    np.testing.assert_array_equal(first.run(None, {"image": x})[0], second.run(None, {"image": x})[0])
    # ONNX recognised by content too: bytes, and a file without the .onnx suffix
    renamed = tmp_path / "model.bin"
    renamed.write_bytes(DIGITS.read_bytes())
    assert minirt.InferenceSession(str(renamed)).built_from["cached"] is True
    assert minirt.InferenceSession(DIGITS.read_bytes()).built_from["cached"] is True
    # another optimization level is another artifact
    monkeypatch.undo()
    monkeypatch.setenv("MINIRT_CACHE_DIR", str(tmp_path / "cache"))
    so = minirt.SessionOptions()
    so.graph_optimization_level = minirt.GraphOptimizationLevel.ORT_DISABLE_ALL
    third = minirt.InferenceSession(str(DIGITS), so)
    assert third.built_from["cached"] is False and third.built_from["cache"] != first.built_from["cache"]


def test_onnx_in_with_external_data(tmp_path):
    # weights in model.onnx.data beside the model (as large exports and genai folders save them): built from
    # the path, so the checker and the builder find the file; new weights in that file are a new artifact
    import onnx
    from onnx import numpy_helper as nh

    def save(w):
        graph = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"])], "g",
                             [h.make_tensor_value_info("x", TP.FLOAT, [1, 16])],
                             [h.make_tensor_value_info("y", TP.FLOAT, [1, 16])], [nh.from_array(w, "w")])
        model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
        onnx.save_model(model, str(tmp_path / "model.onnx"), save_as_external_data=True,
                        all_tensors_to_one_file=True, location="model.onnx.data", size_threshold=0)

    x = np.ones((1, 16), np.float32)
    w = np.arange(256, dtype=np.float32).reshape(16, 16) / 100
    save(w)
    first = minirt.InferenceSession(str(tmp_path / "model.onnx"))
    np.testing.assert_allclose(first.run(None, {"x": x})[0], x @ w, rtol=1e-6)
    time.sleep(0.01)  # (a later modification time on coarse file systems)
    save(w * 2)
    second = minirt.InferenceSession(str(tmp_path / "model.onnx"))
    assert second.built_from["cached"] is False and second.built_from["cache"] != first.built_from["cache"]
    np.testing.assert_allclose(second.run(None, {"x": x})[0], x @ (w * 2), rtol=1e-6)


def test_an_artifact_under_an_onnx_name_loads_as_the_artifact(tmp_path, monkeypatch):
    """An application opens "model.onnx"; the user put a built (say int8) artifact there: it loads as
    the artifact, nothing is built (the content decides, not the suffix)."""
    artifact = builder.build_bytes(str(DIGITS))
    shipped = tmp_path / "model.onnx"
    shipped.write_bytes(artifact)

    def no_build(*args, **kwargs):
        raise AssertionError("an artifact was sent to the ONNX builder because of its .onnx name")

    monkeypatch.setattr(builder, "build_bytes", no_build)
    sess = minirt.InferenceSession(str(shipped))
    assert sess.built_from is None
    x = np.random.default_rng(4).random((2, 1, 8, 8), dtype=np.float32)
    want = minirt.InferenceSession(artifact).run(None, {"image": x})[0]
    np.testing.assert_array_equal(sess.run(None, {"image": x})[0], want)
    broken = tmp_path / "broken.onnx"  # neither: the ONNX loader's error, naming the file
    broken.write_bytes(b"\x00\x01 not a model")
    monkeypatch.undo()
    with pytest.raises(minirt.Error):
        minirt.InferenceSession(str(broken))


def test_onnx_in_without_the_builder_says_how_to_build(tmp_path):
    child = textwrap.dedent(
        """
        import sys
        class NoBuilder:  # the runtime-only install: minirt.builder (and onnx) cannot be imported
            def find_spec(self, name, path=None, target=None):
                if name == "minirt.builder" or name.startswith(("minirt.builder.", "onnx")):
                    raise ImportError(f"No module named {name!r}")
        sys.meta_path.insert(0, NoBuilder())
        import minirt
        try:
            minirt.InferenceSession(sys.argv[1])
        except minirt.InvalidArgument as exc:
            print(exc)
        else:
            print("loaded")
        """
    )
    proc = subprocess.run([sys.executable, "-c", child, str(DIGITS)], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, MINIRT_CACHE_DIR=str(tmp_path / "cache")), cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr
    assert f"{DIGITS} is an ONNX model, not a .mrt artifact: build it with `minirt build {DIGITS} -o " in proc.stdout
    assert "pip install 'minirt[builder]'" in proc.stdout


def _ort_public_names(ort) -> dict[str, list[str]]:
    # (submodules such as onnxruntime.quantization appear in dir() only once something imported them:
    # they are tools, not the runtime API, and the table covers the runtime's names)
    names = {"onnxruntime": [n for n in dir(ort) if not n.startswith("_")
                             and not isinstance(getattr(ort, n), types.ModuleType)]}
    for cls in ("InferenceSession", "SessionOptions", "RunOptions", "OrtValue", "IOBinding"):
        names[cls] = [n for n in dir(getattr(ort, cls)) if not n.startswith("_")]
    return names


def test_compat_table_covers_every_public_name():
    ort = pytest.importorskip("onnxruntime")
    doc = (ROOT / "docs" / "ort_compat.md").read_text()
    sections = dict(re.findall(r"^## `([\w.]+)`\n(.*?)(?=^## |\Z)", doc, flags=re.S | re.M))
    missing = {}
    for section, names in _ort_public_names(ort).items():
        text = sections.get(section, "")
        absent = [n for n in names if f"| `{n}` |" not in text]
        if absent:
            missing[section] = absent
    assert not missing, f"docs/ort_compat.md lacks rows for {missing}"


def test_import_minirt_does_not_load_the_compat_layer():
    proc = subprocess.run([sys.executable, "-c", "import sys, minirt; print('minirt.ort_compat' in sys.modules, "
                           "minirt.SessionOptions.__module__)"], capture_output=True, text=True, timeout=60,
                          cwd=str(ROOT))
    assert proc.stdout.split() == ["False", "minirt.ort_compat"], proc.stderr
