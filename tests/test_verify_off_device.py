"""``minirt verify`` off the device (issue 27): a partition whose provider is not available here runs on
the reference this machine has for it (an NNAPI program through its TFLite translation on the TFLite
interpreter; a Core ML program on minirt's MIL evaluator) against the golden outputs; the command
passes on a correct provider blob and fails (exit 1) on a deliberately corrupted one."""
from __future__ import annotations

import json

import numpy as np
import pytest

import minirt
from minirt import cli
from minirt.targets.nnapi.model import NNModel
from tests.format.util import fix_section_crcs
from tests.test_cli import DIGITS_ONNX


def _android_artifact(tmp_path):
    out = tmp_path / "android.mrt"
    assert cli.main(["build", str(DIGITS_ONNX), "-o", str(out), "--target", "android-api34",
                     "--input-shape", "image=1x1x8x8"]) == 0
    return out


def _verify(capsys, path) -> tuple[int, dict]:
    capsys.readouterr()
    code = cli.main(["verify", str(path), "--json"])
    return code, json.loads(capsys.readouterr().out)


def _corrupt_nnapi_weights(path) -> None:
    """Negate the largest constant of the first NNAPI program in place (same bytes count, every section's
    CRC recomputed): the file loads, the program parses and runs, and computes something else.  A conv
    filter the program shares with the CPU version (a reference "r": [tensor, [0, 2, 3, 1]] in its header,
    targets/nnapi/share.py) is corrupted instead: its kernel is read with rows and columns swapped."""
    data = bytearray(path.read_bytes())
    art = minirt.Session(bytes(data), providers=["cpu"]).artifact
    blob = bytes(art.provider_blob(art.partitions[0].blob))
    shared = blob.find(b",[0,2,3,1]]")
    if shared >= 0:
        at = data.find(blob)
        data[at + shared:at + shared + 11] = b",[0,3,2,1]]"
        path.write_bytes(bytes(fix_section_crcs(data)))
        return
    model = NNModel.from_bytes(blob, art)
    weights = max((o.value for o in model.operands if isinstance(o.value, np.ndarray) and o.value.dtype == np.float32),
                  key=lambda v: v.size)
    raw = np.ascontiguousarray(weights).tobytes()
    at = data.find(raw)
    assert at > 0 and data.find(raw, at + 1) < 0, "the constant's bytes are not found once in the file"
    data[at:at + len(raw)] = (-np.ascontiguousarray(weights) - 1.0).astype(np.float32).tobytes()
    path.write_bytes(bytes(fix_section_crcs(data)))


def test_nnapi_partitions_verify_off_device_and_a_corrupted_blob_fails(tmp_path, capsys):
    pytest.importorskip("ai_edge_litert")
    path = _android_artifact(tmp_path)
    code, report = _verify(capsys, path)
    results = [r for row in report["partitions"] for r in row["results"] if "max_abs" in r]
    assert code == 0 and results and all(r["status"] == "ok" for r in results)
    assert all("off-device" in r["runs_on"] for r in results)
    _corrupt_nnapi_weights(path)
    code, report = _verify(capsys, path)
    statuses = [r["status"] for row in report["partitions"] for r in row["results"]]
    assert code == 1 and "MISMATCH" in statuses


def test_coreml_partitions_verify_off_device(tmp_path, capsys):
    pytest.importorskip("coremltools")
    out = tmp_path / "macos.mrt"
    assert cli.main(["build", str(DIGITS_ONNX), "-o", str(out), "--target", "macos",
                     "--input-shape", "image=1x1x8x8"]) == 0
    code, report = _verify(capsys, out)
    results = [r for row in report["partitions"] for r in row["results"] if "max_abs" in r]
    assert code == 0 and results and all(r["status"] == "ok" for r in results), report
    assert all("MIL evaluator" in r["runs_on"] for r in results)


def test_a_corrupted_coreml_program_fails_verification(tmp_path, capsys, monkeypatch):
    """A Core ML program whose conv weights were altered when it was lowered (the goldens still come from
    onnxruntime on the source model): `minirt verify` reports the mismatch and exits 1."""
    pytest.importorskip("coremltools")
    from minirt.targets.coreml.lower import LowerEnv

    const = LowerEnv.const
    monkeypatch.setattr(LowerEnv, "const", lambda self, value: (
        lambda w: -w - 1.0 if w is not None and w.ndim == 4 else w)(const(self, value)))
    out = tmp_path / "macos.mrt"
    assert cli.main(["build", str(DIGITS_ONNX), "-o", str(out), "--target", "macos",
                     "--input-shape", "image=1x1x8x8"]) == 0
    code, report = _verify(capsys, out)
    statuses = [r["status"] for row in report["partitions"] for r in row["results"]]
    assert code == 1 and "MISMATCH" in statuses, report


def test_golden_outputs_come_from_onnxruntime_on_the_source_model():
    """The partitions' golden tensors are onnxruntime's values of the source model where the value
    kept its name through the passes; the caller's ModelProto is left as it was."""
    import onnx
    import onnxruntime as ort

    from minirt.builder import build

    proto = onnx.load(str(DIGITS_ONNX))
    before = proto.SerializeToString()
    name = proto.graph.input[0].name
    result = build(proto, None, target="android-api34", input_shapes={name: [1, 1, 8, 8]})
    assert proto.SerializeToString() == before
    notes = result.partitions["notes"]
    assert any("computed by onnxruntime on the source model" in n for n in notes), notes
    art = minirt.Session(result.data, providers=["cpu"]).artifact
    part = art.partitions[-1]
    graph = art.graphs[part.graph]
    out_names = [graph.values[v].name for v in part.outputs]
    in_names = [graph.values[v].name for v in part.inputs]
    source_outputs = {o for node in proto.graph.node for o in node.output}
    shared = [n for n in out_names if n in source_outputs]
    assert shared, "no boundary value of the last partition is a source model value"
    assert in_names == [name]  # (the demo model is one partition from the model's input to its logits)
    feed = {name: art.tensor(part.golden_inputs[0])}
    extra = onnx.ModelProto()
    extra.CopyFrom(proto)
    extra.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in shared
                              if n not in {o.name for o in proto.graph.output})
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    got = ort.InferenceSession(extra.SerializeToString(), opts).run(shared, feed)
    for n, value in zip(shared, got):
        np.testing.assert_array_equal(art.tensor(part.golden_outputs[out_names.index(n)]), value)


@pytest.mark.parametrize("provider, module", [("nnapi", "minirt.targets"), ("coreml", "minirt.tools.mil_eval")])
def test_a_device_install_says_the_off_device_reference_needs_the_full_install(monkeypatch, provider, module):
    """The device wheel ships neither reference (setup.py): verify reports the partition as not verified,
    with what to install, instead of failing on an import."""
    import importlib.util

    from minirt.tools import verify

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a))
    compile_fn, why = verify._off_device_reference(provider)
    assert compile_fn is None
    assert module in why and "pip install 'minirt[builder]'" in why


def test_non_finite_outputs_are_compared_not_skipped():
    """A program that makes NaN (or an infinity) where the golden output is finite fails: np.max skips
    NaNs, and a Core ML fp16 program overflowing on onnx's light GoogLeNet used to pass with "max abs 0".
    Equal non-finite values (NaN against NaN, inf against inf) are no error."""
    from minirt.tools.verify import _compare

    want = np.array([[0.5, -1.0, 2.0]], np.float32)
    assert _compare("p", [want.copy()], [want], 1e-2)["status"] == "ok"
    for bad in (np.nan, np.inf, -np.inf):
        got = want.copy()
        got[0, 1] = bad
        r = _compare("p", [got], [want], 1e-2)
        assert r["status"] == "MISMATCH" and r["max_rel"] == np.inf, (bad, r)
    both = np.array([np.nan, np.inf, -np.inf, 1.0], np.float32)
    r = _compare("p", [both.copy()], [both], 1e-2)
    assert r["status"] == "ok" and r["max_abs"] == 0.0, r
    r = _compare("p", [np.array([np.inf, 1.0])], [np.array([-np.inf, 1.0])], 1e-2)
    assert r["status"] == "MISMATCH", r
