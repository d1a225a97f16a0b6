"""The ``minirt`` command line, called in-process through ``minirt.cli.main`` and once as a real process."""
from __future__ import annotations

import collections
import json
import os
import re
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import minirt
from minirt.cli import main

REPO = Path(__file__).resolve().parents[1]
DIGITS = REPO / "examples" / "digits"
DIGITS_ONNX = DIGITS / "digits_cnn.onnx"
LONG_NOTE = "a long model note " * 10  # ends up in the artifact's metadata, abbreviated by `inspect`

# The runtime commands must work where onnx/onnxruntime are not installed:
# this prelude makes importing them fail, as on a device.
def _without(*modules: str) -> str:
    return f"import sys\nfor m in {modules!r}:\n    sys.modules[m] = None\n"


_NO_ONNX = _without("onnx", "onnx_ir", "onnxruntime")


def _tiny_model() -> onnx.ModelProto:
    """y = Relu(x @ W + b) with x: float32[N, 4]."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "b")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["xw"], name="matmul"),
            helper.make_node("Add", ["xw", "b"], ["xwb"], name="add"),
            helper.make_node("Relu", ["xwb"], ["y"], name="relu"),
        ],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        initializer=[w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="test_cli")
    model.ir_version = 8
    helper.set_model_props(model, {"note": LONG_NOTE})
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny") / "tiny.onnx"
    onnx.save(_tiny_model(), path)
    return path


@pytest.fixture(scope="module")
def tiny_mrt(tiny_onnx, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny_mrt") / "tiny.mrt"
    # opt-level 0: these artifacts keep the source's nodes, so the tests can
    # compare histograms with the ONNX model (the optimizer has its own tests).
    assert main(["build", str(tiny_onnx), "-o", str(out), "-q", "--opt-level", "0"]) == 0
    return out


@pytest.fixture(scope="module")
def digits_mrt(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("digits") / "digits.mrt"
    assert main(["build", str(DIGITS_ONNX), "-o", str(out), "-q", "--opt-level", "0"]) == 0
    return out


def _run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# --- build ------------------------------------------------------------------------


def test_build_writes_artifact_and_prints_report(tiny_onnx, tmp_path, capsys):
    out = tmp_path / "model.mrt"
    code, stdout, stderr = _run_cli(capsys, "build", tiny_onnx, "-o", out)
    assert code == 0, stderr
    assert out.is_file() and out.stat().st_size > 0
    assert f"built {out}" in stdout
    assert "x float[N,4]" in stdout and "y float[N,3]" in stdout
    assert "loading model" in stderr  # progress goes to stderr, not into the report


def test_build_default_output_is_model_with_mrt_suffix(tiny_onnx, tmp_path, capsys):
    model = tmp_path / "copy.onnx"
    shutil.copy(tiny_onnx, model)
    code, _, stderr = _run_cli(capsys, "build", model, "-q")
    assert code == 0, stderr
    assert stderr == ""
    assert (tmp_path / "copy.mrt").is_file()


def test_build_json(tiny_onnx, tmp_path, capsys):
    code, stdout, _ = _run_cli(capsys, "build", tiny_onnx, "-o", tmp_path / "t.mrt", "--json", "--target", "rpi4",
                               "--opt-level", "0")
    assert code == 0
    report = json.loads(stdout)
    assert report["target"] == "rpi4"
    assert report["op_histogram"] == {"Add": 1, "MatMul": 1, "Relu": 1}
    assert report["artifact_bytes"] == (tmp_path / "t.mrt").stat().st_size


def test_build_optimizes_by_default_and_inspect_shows_the_optimizer_report(tiny_onnx, tmp_path, capsys):
    code, stdout, _ = _run_cli(capsys, "build", tiny_onnx, "-o", tmp_path / "t.mrt", "--json")
    assert code == 0
    report = json.loads(stdout)
    assert report["opt_level"] == 2 and report["nodes_before"] == 3 and report["nodes_after"] == 1
    assert report["optimizer"]["nodes_after"] == 1
    code, stdout, _ = _run_cli(capsys, "inspect", tmp_path / "t.mrt")
    assert code == 0
    assert "optimizer (opt-level 2): nodes 3 -> 1" in stdout and "fuse_activation" in stdout


def test_build_disable_pass(tiny_onnx, tmp_path, capsys):
    code, stdout, _ = _run_cli(capsys, "build", tiny_onnx, "-o", tmp_path / "t.mrt", "--json",
                               "--disable-pass", "fuse_activation", "--disable-pass", "matmul_to_gemm")
    assert code == 0
    assert json.loads(stdout)["nodes_after"] == 3
    code, _, stderr = _run_cli(capsys, "build", tiny_onnx, "-o", tmp_path / "u.mrt", "--disable-pass", "no_such_pass")
    assert code == 2 and "no_such_pass" in stderr and not (tmp_path / "u.mrt").exists()


def test_build_weight_pack(tmp_path, capsys):
    """--weight-pack N stores packed weights for panels of N; the Pi targets default to 8, 0 turns it off."""
    def packs(*options):
        out = tmp_path / "d.mrt"
        code, _, _ = _run_cli(capsys, "build", DIGITS_ONNX, "-o", out, "-q", "--input-shape", "image=1x1x8x8", *options)
        assert code == 0
        art = minirt.Session(str(out)).artifact
        return {e.nr for e in art.packed_weights}, art.metadata["build.options"]["weight_pack"]

    assert packs() == (set(), 0)
    assert packs("--weight-pack", "32") == ({32}, 32)
    assert packs("--target", "rpi4") == ({8}, 8)
    assert packs("--target", "rpi4", "--weight-pack", "0") == (set(), 0)
    code, _, stderr = _run_cli(capsys, "build", DIGITS_ONNX, "-o", tmp_path / "e.mrt", "--weight-pack", "12")
    assert code == 2 and "--weight-pack" in stderr


def test_build_compresses_the_structure_sections_unless_uncompressed(tmp_path, capsys):
    """A real model (PP-OCR's direction classifier, from the rapidocr wheel): its graph and tensor table
    pass 4 KiB, so the default build stores them as zlib streams (format version 2; the metadata too when it
    passes 4 KiB, D174) and --uncompressed writes version 1; both load to the same graph and results."""
    from tests.test_real_models import PPOCR_CLS, ppocr_input

    if PPOCR_CLS is None:
        pytest.skip("rapidocr's PP-OCR models are not installed")
    arts = {}
    for name, options in (("v2", ()), ("v1", ("--uncompressed",))):
        out = tmp_path / f"{name}.mrt"
        code, _, stderr = _run_cli(capsys, "build", PPOCR_CLS, "-o", out, "-q", *options)
        assert code == 0, stderr
        code, stdout, _ = _run_cli(capsys, "inspect", out, "--json")
        arts[name] = (out, json.loads(stdout))
    (v2, info2), (v1, info1) = arts["v2"], arts["v1"]
    assert (info2["format_version"], info1["format_version"]) == (2, 1)
    stored2 = {s["kind"]: s for s in info2["sections"]}
    stored1 = {s["kind"]: s for s in info1["sections"]}
    for kind in ("graphs", "tensors"):
        assert stored2[kind]["flags"] & 2 and stored2[kind]["length"] * 3 < stored1[kind]["length"], kind
        assert stored2[kind]["inflated"] == stored1[kind]["length"] and "inflated" not in stored1[kind]
    assert bool(stored2["metadata"]["flags"] & 2) == (stored1["metadata"]["length"] >= 4096)
    assert "inflated" not in stored2["tensor_data"] and stored2["tensor_data"]["length"] == stored1["tensor_data"]["length"]
    assert v2.stat().st_size < v1.stat().st_size - 20_000
    x = {"x": ppocr_input((2, 3, 48, 192), 1)}
    a, b = minirt.Session(str(v2)), minirt.Session(str(v1))
    np.testing.assert_array_equal(a.run(None, x)[0], b.run(None, x)[0])
    assert [n.name for n in a.artifact.main_graph.nodes] == [n.name for n in b.artifact.main_graph.nodes]


def test_build_missing_model_is_a_clean_error(tmp_path, capsys):
    missing = tmp_path / "nowhere" / "missing.onnx"
    code, stdout, stderr = _run_cli(capsys, "build", missing, "-q")
    assert code == 2
    assert stderr.startswith("minirt build: error: ")
    assert str(missing) in stderr
    assert "Traceback" not in stderr


def test_build_bad_option_values(tiny_onnx, tmp_path, capsys):
    out = tmp_path / "t.mrt"
    code, _, stderr = _run_cli(capsys, "build", tiny_onnx, "-o", out, "--target", "toaster", "-q")
    assert code == 2 and "unknown target 'toaster'" in stderr
    code, _, stderr = _run_cli(capsys, "build", tiny_onnx, "-o", out, "--input-shape", "x", "-q")
    assert code == 2 and "--input-shape" in stderr
    code, _, stderr = _run_cli(capsys, "build", tiny_onnx, "-o", out, "--opt-level", "fast")
    assert code == 2 and "--opt-level" in stderr  # argparse's own message, same exit status
    assert not out.exists()


# --- inspect ----------------------------------------------------------------------


def test_inspect_json_matches_the_model(digits_mrt, capsys):
    code, stdout, _ = _run_cli(capsys, "inspect", digits_mrt, "--json")
    assert code == 0
    info = json.loads(stdout)
    data = digits_mrt.read_bytes()
    model = onnx.load(DIGITS_ONNX)

    assert info["format_version"] == 1
    assert info["file_size"] == len(data)
    assert [s["kind"] for s in info["sections"]] == ["metadata", "operators", "graphs", "tensors", "tensor_data"]
    for s in info["sections"]:
        assert s["crc32"] == zlib.crc32(data[s["offset"] : s["offset"] + s["length"]])
    assert info["opsets"] == {"ai.onnx": 17}
    assert {(o.domain or "ai.onnx"): o.version for o in model.opset_import} == info["opsets"]
    assert info["op_histogram"] == dict(collections.Counter(n.op_type for n in model.graph.node))
    assert info["op_histogram"] == {"Relu": 4, "Conv": 3, "BatchNormalization": 2, "Gemm": 2, "Flatten": 1, "MaxPool": 1}
    assert info["nodes"] == len(model.graph.node) == 13
    assert info["graphs"] == 1
    assert info["tensors"] == len(model.graph.initializer)
    assert info["weight_bytes"] == sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer)
    assert info["inputs"] == [{"name": "image", "dtype": "float32", "shape": ["batch", 1, 8, 8]}]
    assert info["outputs"] == [{"name": "logits", "dtype": "float32", "shape": ["batch", 10]}]
    assert info["metadata"]["source.file"] == "digits_cnn.onnx"
    assert info["metadata"] == minirt.Session(str(digits_mrt)).metadata


def test_inspect_text(digits_mrt, capsys):
    code, stdout, _ = _run_cli(capsys, "inspect", digits_mrt)
    assert code == 0
    assert "format version 1" in stdout and f"{digits_mrt.stat().st_size:,} bytes" in stdout
    for kind in ("metadata", "operators", "graphs", "tensors", "tensor_data"):
        assert re.search(rf"^\s+{kind}\s+\d+\s+\d+\s+0x[0-9a-f]{{8}}$", stdout, re.M), kind
    assert "opsets: ai.onnx 17" in stdout
    assert re.search(r"^\s+Relu\s+4$", stdout, re.M)
    assert re.search(r"^\s+Conv\s+3$", stdout, re.M)
    assert "graphs 1, nodes 13" in stdout
    assert re.search(r"^\s+image\s+float32\s+\[batch, 1, 8, 8\]$", stdout, re.M)
    assert re.search(r"^\s+logits\s+float32\s+\[batch, 10\]$", stdout, re.M)


def test_inspect_abbreviates_long_metadata_only_in_text(tiny_mrt, capsys):
    _, text, _ = _run_cli(capsys, "inspect", tiny_mrt)
    line = next(l for l in text.splitlines() if "source.metadata_props" in l)
    assert "see --json" in line and LONG_NOTE not in line
    _, js, _ = _run_cli(capsys, "inspect", tiny_mrt, "--json")
    assert json.loads(js)["metadata"]["source.metadata_props"] == {"note": LONG_NOTE}


def test_inspect_errors(tmp_path, capsys):
    code, _, stderr = _run_cli(capsys, "inspect", tmp_path / "missing.mrt")
    assert code == 2 and "missing.mrt" in stderr and stderr.startswith("minirt inspect: error: ")
    code, _, stderr = _run_cli(capsys, "inspect", DIGITS_ONNX)
    assert code == 2 and "not a .mrt file" in stderr


# --- run --------------------------------------------------------------------------


def test_run_random_inputs(tiny_mrt, capsys):
    code, stdout, stderr = _run_cli(capsys, "run", tiny_mrt, "--dim", "N=5", "--seed", "3")
    assert code == 0, stderr
    assert re.search(r"^\s+x\s+float32\[5, 4\]\s+random \(seed 3\)$", stdout, re.M)
    m = re.search(r"^\s+y\s+float32\[5, 3\]\s+min (\S+)\s+max (\S+)\s+mean (\S+)$", stdout, re.M)
    assert m, stdout
    assert float(m.group(1)) >= 0.0  # Relu


def test_run_symbolic_dims_default_to_one(digits_mrt, capsys):
    code, stdout, _ = _run_cli(capsys, "run", digits_mrt)
    assert code == 0
    assert "image  float32[1, 1, 8, 8]" in stdout and "logits  float32[1, 10]" in stdout


def test_run_shape_option_sets_a_full_random_shape(digits_mrt, capsys):
    code, stdout, _ = _run_cli(capsys, "run", digits_mrt, "--shape", "image=3x1x8x8")
    assert code == 0
    assert "image  float32[3, 1, 8, 8]" in stdout and "logits  float32[3, 10]" in stdout


def test_run_with_input_file_and_save(tiny_mrt, tmp_path, capsys):
    x = np.random.default_rng(7).standard_normal((6, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    saved = tmp_path / "out.npz"
    code, stdout, stderr = _run_cli(capsys, "run", tiny_mrt, "--input", f"x={tmp_path / 'x.npy'}", "--save", saved)
    assert code == 0, stderr
    assert "from file" in stdout
    (expected,) = minirt.Session(str(tiny_mrt)).run(None, {"x": x})
    with np.load(saved) as got:
        assert list(got.files) == ["y"]
        np.testing.assert_array_equal(got["y"], expected)


def test_run_digits_from_npz(digits_mrt, tmp_path, capsys):
    saved = tmp_path / "logits.npz"
    code, _, _ = _run_cli(capsys, "run", digits_mrt, "--input", f"image={DIGITS / 'heldout.npz'}", "--save", saved)
    assert code == 0
    with np.load(DIGITS / "heldout.npz") as data, np.load(saved) as got:
        assert (got["logits"].argmax(axis=1) == data["label"]).mean() > 0.95


def test_run_wrong_dtype_is_the_sessions_message(tiny_mrt, tmp_path, capsys):
    np.save(tmp_path / "x64.npy", np.zeros((2, 4), dtype=np.int64))
    code, stdout, stderr = _run_cli(capsys, "run", tiny_mrt, "--input", f"x={tmp_path / 'x64.npy'}")
    assert code == 2
    assert stderr.startswith("minirt run: error: ")
    assert "input 'x': expected dtype tensor(float) (float32), got int64" in stderr


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--input", "x"], "expected NAME=FILE.npy"),
        (["--input", "x=does-not-exist.npy"], "does-not-exist.npy: no such file"),
        (["--input", "z=HERE"], "unknown input name 'z'"),
        (["--dim", "N=two"], "'two' is not an integer"),
        (["--dim", "batch=2"], "--dim names ['batch']"),
        (["--shape", "y=1x4"], "--shape names ['y']"),
        (["--shape", "x=1xfour"], "is not a list of integers"),
    ],
)
def test_run_bad_arguments(tiny_mrt, tmp_path, capsys, extra, message):
    np.save(tmp_path / "z.npy", np.zeros((1, 4), dtype=np.float32))
    extra = [e.replace("HERE", str(tmp_path / "z.npy")) for e in extra]
    code, _, stderr = _run_cli(capsys, "run", tiny_mrt, *extra)
    assert code == 2
    assert message in stderr and "Traceback" not in stderr


# --- bench ------------------------------------------------------------------------


def test_bench_json(tiny_mrt, capsys):
    code, stdout, stderr = _run_cli(capsys, "bench", tiny_mrt, "--runs", "5", "--warmup", "1", "--dim", "N=2", "--json")
    assert code == 0, stderr
    r = json.loads(stdout)
    m = r["minirt"]
    assert r["inputs"] == {"x": {"dtype": "float32", "shape": [2, 4]}}
    assert m["runs"] == 5 and 0 < m["min_s"] <= m["median_s"] <= m["p90_s"] <= m["p99_s"] <= m["max_s"]
    assert m["load_s"] > 0 and m["first_run_s"] > 0 and m["nodes"] == 3 and m["overhead_per_node_us"] >= 0
    # time per op type, largest first, one entry per op type of the 3 nodes
    assert sum(op["nodes"] for op in m["ops"]) == 3 and all(op["seconds"] > 0 for op in m["ops"])
    assert [op["seconds"] for op in m["ops"]] == sorted((op["seconds"] for op in m["ops"]), reverse=True)
    assert m["peak_rss_bytes"] >= r["peak_rss_before_load_bytes"] > 1_000_000
    assert "onnxruntime" not in r and "ratio" not in r


def test_bench_text(tiny_mrt, capsys):
    code, stdout, _ = _run_cli(capsys, "bench", tiny_mrt, "--runs", "3", "--threads", "1")
    assert code == 0
    for label in ("load", "first inference", "p50 latency", "p90 latency", "p99 latency", "time per op type",
                  "per-node Python overhead", "peak RSS"):
        assert label in stdout
    assert "threads 1" in stdout


def test_bench_plot_and_top(tiny_mrt, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    plot = tmp_path / "bench.png"
    code, stdout, stderr = _run_cli(capsys, "bench", tiny_mrt, "--runs", "4", "--dim", "N=2", "--top", "1",
                                    "--plot", plot)
    assert code == 0, stderr
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "(top 1 of " in stdout
    code, _, stderr = _run_cli(capsys, "bench", tiny_mrt, "--runs", "1", "--plot", tmp_path / "no" / "dir.png")
    assert code == 2 and "cannot write" in stderr


def test_bench_compare_with_onnxruntime(digits_mrt, capsys):
    pytest.importorskip("onnxruntime")
    code, stdout, stderr = _run_cli(
        capsys, "bench", digits_mrt, "--runs", "5", "--dim", "batch=4", "--threads", "1", "--compare", DIGITS_ONNX, "--json"
    )
    assert code == 0, stderr
    r = json.loads(stdout)
    assert r["onnxruntime"]["runs"] == r["minirt"]["runs"] == 5
    assert r["ratio"] == pytest.approx(r["minirt"]["median_s"] / r["onnxruntime"]["median_s"])
    assert set(r["max_abs_diff"]) == {"logits"}
    assert r["max_abs_diff"]["logits"] <= 1e-4
    assert r["peak_rss_end_bytes"] >= r["minirt"]["peak_rss_bytes"] > 0
    if minirt.native.available:  # how the timed runs ran: one native program (D32), or why not
        program = r["minirt"]["native_program"]
        assert re.fullmatch(r"\d+ native calls", program) or "node " in program, program

    code, stdout, _ = _run_cli(capsys, "bench", digits_mrt, "--runs", "3", "--compare", DIGITS_ONNX)
    assert code == 0
    assert re.search(r"latency ratio minirt/onnxruntime: [\d.]+x", stdout)
    m = re.search(r"max abs diff logits: (\S+)", stdout)
    assert m and float(m.group(1)) <= 1e-4


def test_bench_compare_missing_model(tiny_mrt, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    code, _, stderr = _run_cli(capsys, "bench", tiny_mrt, "--runs", "1", "--compare", tmp_path / "nope.onnx")
    assert code == 2 and "nope.onnx: no such file" in stderr


def test_bench_rejects_zero_runs(tiny_mrt, capsys):
    code, _, stderr = _run_cli(capsys, "bench", tiny_mrt, "--runs", "0")
    assert code == 2 and "--runs" in stderr


# --- demo, info, entry points -----------------------------------------------------


def _accuracies(stdout: str) -> list[str]:
    line = next(l for l in stdout.splitlines() if l.strip().startswith("accuracy"))
    return re.findall(r"(\d+\.\d+ % \(\d+/\d+\))", line)


def test_demo(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    code, stdout, stderr = _run_cli(capsys, "demo", "--runs", "2", "--out", tmp_path)
    assert code == 0, stderr
    mine, theirs = _accuracies(stdout)
    assert mine == theirs
    assert mine.endswith("/360)")
    assert float(mine.split()[0]) > 95
    assert "latency batch 1" in stdout and "latency batch 360" in stdout
    assert re.search(r"model size .*\.mrt .*\.onnx", stdout)
    diff = float(re.search(r"max abs logit difference minirt vs onnxruntime: (\S+)", stdout).group(1))
    assert diff <= 1e-4
    assert (tmp_path / "digits_cnn.mrt").is_file()


def test_demo_without_onnxruntime_shows_minirt_only(tmp_path):
    code = _without("onnxruntime") + "from minirt.cli import main\nsys.exit(main(['demo', '--runs', '1']))\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert len(_accuracies(proc.stdout)) == 1
    assert "onnxruntime is not installed" in proc.stdout


def test_info(capsys):
    code, stdout, _ = _run_cli(capsys, "info")
    assert code == 0
    assert f"minirt          {minirt.__version__}" in stdout
    assert re.search(r"^numpy\s+" + re.escape(np.__version__), stdout, re.M)
    assert re.search(r"^providers\s+(\w+, )*cpu$", stdout, re.M)  # accelerators available here first, cpu last
    assert re.search(r"^builder extra\s+onnx \S+, onnx_ir \S+", stdout, re.M)
    from minirt import native

    assert re.search(r"^native kernels\s+" + re.escape(native.describe()), stdout, re.M)


def test_no_command_prints_usage(capsys):
    code, _, stderr = _run_cli(capsys)
    assert code == 2 and "usage: minirt" in stderr


def test_runtime_commands_work_without_onnx(tiny_mrt, tmp_path):
    """inspect/run/bench/info on a device where neither onnx nor onnxruntime is installed."""
    code = _NO_ONNX + (
        "from minirt.cli import main\n"
        f"art = {str(tiny_mrt)!r}\n"
        "for argv in (['inspect', art], ['run', art], ['bench', art, '--runs', '2'], ['info']):\n"
        "    assert main(argv) == 0, argv\n"
        "leaked = sorted(m for m in sys.modules if (m.split('.')[0] in ('onnx', 'onnx_ir', 'onnxruntime')\n"
        "                or m.startswith(('minirt.builder', 'minirt.targets')))\n"
        "                and sys.modules[m] is not None)\n"
        "assert not leaked, leaked\n"
        "assert main(['build', 'x.onnx']) == 2\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "onnxruntime     not installed" in proc.stdout
    assert "minirt build: error: this command needs the builder extra" in proc.stderr


def _entry_point() -> list[str]:
    script = Path(sys.executable).with_name("minirt")
    return [str(script)] if script.is_file() and os.access(script, os.X_OK) else [sys.executable, "-m", "minirt"]


def test_entry_point_subprocess(tiny_mrt, tmp_path):
    proc = subprocess.run([*_entry_point(), "inspect", str(tiny_mrt), "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["op_histogram"] == {"Add": 1, "MatMul": 1, "Relu": 1}

    proc = subprocess.run([sys.executable, "-m", "minirt", "run", str(tmp_path / "missing.mrt")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"minirt run: error: {tmp_path / 'missing.mrt'}: no such file"


def test_build_quantize_int8_with_calibration(tmp_path, capsys):
    out = tmp_path / "q.mrt"
    code, stdout, _ = _run_cli(
        capsys, "build", DIGITS_ONNX, "-o", out, "--quantize", "int8",
        "--calibration", DIGITS_ONNX.parent / "calibration.npz", "--json",
    )
    assert code == 0
    report = json.loads(stdout)
    assert report["quantize"] == "int8" and report["quantization"]
    float_out = tmp_path / "f.mrt"
    assert _run_cli(capsys, "build", DIGITS_ONNX, "-o", float_out, "-q")[0] == 0
    assert out.stat().st_size <= 0.35 * float_out.stat().st_size
    code, stdout, _ = _run_cli(capsys, "inspect", out, "--json")
    assert json.loads(stdout)["metadata"]["build.quantization"]["mode"] == "int8"
    # the final Gemm computes in int8 by default (D149); --no-quantize-final keeps it float
    assert "/13/Gemm" in report["quantization"]["quantized"]
    code, stdout, _ = _run_cli(capsys, "build", DIGITS_ONNX, "-o", tmp_path / "qf.mrt", "--quantize", "int8",
                               "--calibration", DIGITS_ONNX.parent / "calibration.npz", "--json",
                               "--no-quantize-final")
    kept = {k["node"]: k["reason"] for k in json.loads(stdout)["quantization"]["kept_float"]}
    assert code == 0 and "final layer" in kept["/13/Gemm"]


def test_build_quantize_disable_pass_and_inspect_show_the_quantizer_passes(tmp_path, capsys):
    out = tmp_path / "q.mrt"
    code, stdout, _ = _run_cli(
        capsys, "build", DIGITS_ONNX, "-o", out, "--quantize", "int8", "--calibration",
        DIGITS_ONNX.parent / "calibration.npz", "--json", "--disable-pass", "quant_fuse_flatten",
    )
    assert code == 0
    passes = json.loads(stdout)["quantization"]["passes"]
    assert passes["disabled"] == ["quant_fuse_flatten"] and "quant_fuse_max_pool" in passes["pipeline"]
    code, stdout, _ = _run_cli(capsys, "inspect", out)
    assert code == 0 and "quantizer (int8) passes" in stdout and "quant_fuse_max_pool" in stdout
    assert "disabled: quant_fuse_flatten" in stdout


def test_build_quantize_rejects_unknown_mode(capsys, tmp_path):
    code, _, stderr = _run_cli(capsys, "build", DIGITS_ONNX, "-o", tmp_path / "q.mrt", "--quantize", "int3")
    assert code == 2 and "int3" in stderr


def test_build_providers_override_and_bench_times_the_cpu_alongside(tmp_path, capsys):
    pytest.importorskip("ai_edge_litert")
    out = tmp_path / "tfl.mrt"
    code, stdout, _ = _run_cli(capsys, "build", DIGITS_ONNX, "-o", out, "--providers", "tflite,cpu",
                               "--input-shape", "image=1x1x8x8", "--json")
    assert code == 0
    report = json.loads(stdout)
    assert [p["provider"] for p in report["partitions"]["partitions"]] == ["tflite"]
    code, stdout, _ = _run_cli(capsys, "bench", out, "--runs", "3", "--warmup", "1", "--json")
    assert code == 0
    result = json.loads(stdout)
    assert result["minirt"]["providers"] == ["tflite", "cpu"] and result["cpu"]["median_s"] > 0
    assert result["minirt"]["partitions"][0]["runs_on"] == "tflite"


def test_build_rejects_unknown_provider(tmp_path, capsys):
    code, _, stderr = _run_cli(capsys, "build", DIGITS_ONNX, "-o", tmp_path / "x.mrt", "--providers", "tpu,cpu")
    assert code == 2 and "tpu" in stderr and not (tmp_path / "x.mrt").exists()


# --- inspect: the ONNX view for Netron and the graph drawing ----------------------


def test_inspect_exports_an_onnx_view_with_shapes_providers_and_precision(tmp_path, capsys):
    """The optimized, partitioned graph as ONNX: every node from the artifact, its provider and
    partition (a tflite partition here) and its precision (int8 for the quantized build) in the
    node's metadata, value shapes as value_info, weights as initializers."""
    pytest.importorskip("ai_edge_litert")
    name = onnx.load(DIGITS_ONNX).graph.input[0].name
    from minirt.builder import build

    cases = {"tflite": build(str(DIGITS_ONNX), None, providers="tflite,cpu", input_shapes={name: [1, 1, 8, 8]}),
             "int8": build(str(DIGITS_ONNX), None, quantize="int8", calibration=str(DIGITS / "calibration.npz"))}
    for kind, report in cases.items():
        art_path = tmp_path / f"{kind}.mrt"
        art_path.write_bytes(report.data)
        out = tmp_path / f"{kind}.onnx"
        code, _, stderr = _run_cli(capsys, "inspect", art_path, "--onnx", out)
        assert code == 0 and "Netron" in stderr, stderr
        view = onnx.load(out)
        art = minirt.Session(str(art_path), providers=["cpu"]).artifact
        assert [n.op_type for n in view.graph.node] == [art.operators[n.op_index].op_type
                                                         for n in art.main_graph.nodes]
        meta = [{p.key: p.value for p in n.metadata_props} for n in view.graph.node]
        if kind == "tflite":
            assert art.partitions and all(m["minirt.provider"] == "tflite" and m["minirt.partition"] == "0"
                                          for m in meta[:art.partitions[0].node_count])
        else:
            assert any(n.op_type.startswith("Q") for n in view.graph.node)
            assert all(m["minirt.precision"] == "int8" for n, m in zip(view.graph.node, meta) if n.op_type.startswith("Q"))
        shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in view.graph.value_info}
        assert shapes and all(dims for dims in shapes.values())
        assert len(view.graph.initializer) == len(art.main_graph.initializers)


def test_inspect_graph_boxes_show_result_shapes(digits_mrt, tmp_path, capsys):
    out = tmp_path / "g.svg"
    code, _, stderr = _run_cli(capsys, "inspect", digits_mrt, "--graph", out)
    assert code == 0, stderr
    text = out.read_text()
    assert re.search(r">f32 \S*x10<", text)  # (the logits' box: float32, batch x 10)
    assert "in: " in text and "out: " in text


def test_inspect_onnx_into_a_missing_folder_is_a_clear_error(digits_mrt, tmp_path, capsys):
    code, _, stderr = _run_cli(capsys, "inspect", digits_mrt, "--onnx", tmp_path / "no" / "view.onnx")
    assert code == 2 and "--onnx" in stderr


# --- papercuts (issue 21): each a clear error, early, or accepted -----------------


def test_run_shape_that_contradicts_a_dim_is_an_error(digits_mrt, capsys):
    code, _, stderr = _run_cli(capsys, "run", digits_mrt, "--shape", "image=3x1x8x8", "--dim", "batch=2")
    assert code == 2 and "--dim batch=2" in stderr and "dimension 0 is 3" in stderr
    code, stdout, _ = _run_cli(capsys, "run", digits_mrt, "--shape", "image=2x1x8x8", "--dim", "batch=2")
    assert code == 0 and "logits  float32[2, 10]" in stdout


def test_build_accepts_input_shapes_with_commas(tmp_path, capsys):
    out = tmp_path / "d.mrt"
    code, _, stderr = _run_cli(capsys, "build", DIGITS_ONNX, "-o", out, "--input-shape", "image=2,1,8,8")
    assert code == 0, stderr
    assert minirt.Session(str(out)).get_inputs()[0].shape == [2, 1, 8, 8]


def test_build_errors_that_need_no_model_come_before_loading_it(tmp_path, capsys, monkeypatch):
    """A missing output folder or calibration file is reported without loading the model first."""
    import importlib

    build_mod = importlib.import_module("minirt.builder.build")  # (the module; minirt.builder.build is the function)

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the argument error was found")

    monkeypatch.setattr(build_mod, "load_model", no_load)
    code, _, stderr = _run_cli(capsys, "build", DIGITS_ONNX, "-o", tmp_path / "no" / "d.mrt")
    assert code == 2 and "output folder" in stderr and "does not exist" in stderr
    code, _, stderr = _run_cli(capsys, "build", DIGITS_ONNX, "-o", tmp_path / "d.mrt", "--quantize", "int8",
                               "--calibration", tmp_path / "missing.npz")
    assert code == 2 and "--calibration" in stderr and "missing.npz: no such file" in stderr


def test_calibration_samples_stacked_on_the_batch_axis_are_split(tmp_path, capsys):
    """One .npz of 16 images for a model built with batch 1: 16 calibration feeds, not one refused batch."""
    with np.load(DIGITS / "calibration.npz") as f:
        key = f.files[0]
        images = f[key]
    stacked = tmp_path / "stacked.npz"
    np.savez(stacked, image=images[:16].reshape(16, 1, 8, 8))
    out = tmp_path / "q.mrt"
    code, stdout, stderr = _run_cli(capsys, "build", DIGITS_ONNX, "-o", out, "--input-shape", "image=1x1x8x8",
                                    "--quantize", "int8", "--calibration", stacked, "--json")
    assert code == 0, stderr
    report = json.loads(stdout)
    assert report["quantization"]["calibration_feeds"] == 16


def test_bench_and_inspect_give_the_accelerated_share_in_nodes_flops_and_cpu_time(tmp_path, capsys):
    """Built for an Android target (its NNAPI partitions run on the CPU here): bench gives the share in
    nodes and estimated FLOPs from the build's report and the share of a CPU-only run's time that the
    CPU-fallback nodes take; inspect shows the report."""
    out = tmp_path / "android.mrt"
    code, stdout, _ = _run_cli(capsys, "build", DIGITS_ONNX, "-o", out, "--target", "android-api34",
                               "--input-shape", "image=1x1x8x8", "--json")
    assert code == 0
    report = json.loads(stdout)["partitions"]
    assert report["accelerated_nodes"] >= 1 and report["nodes"] >= report["accelerated_nodes"]
    code, stdout, _ = _run_cli(capsys, "bench", out, "--runs", "3", "--warmup", "1", "--json")
    assert code == 0
    acc = json.loads(stdout)["accelerators"]
    assert acc["target"] == "android-api34" and acc["nodes"] == report["nodes"]
    assert acc["accelerated_nodes"] == report["accelerated_nodes"]
    assert acc["cpu_fallback_nodes"] == report["nodes"] - report["accelerated_nodes"]
    assert 0.0 <= acc["cpu_fallback_time_share"] <= 1.0
    assert (acc["cpu_fallback_time_share"] > 0) == (acc["cpu_fallback_nodes"] > 0)
    code, stdout, _ = _run_cli(capsys, "bench", out, "--runs", "2")
    assert code == 0 and "built for android-api34:" in stdout and "CPU-fallback nodes take" in stdout
    code, stdout, _ = _run_cli(capsys, "inspect", out)
    assert code == 0 and "accelerators (built for android-api34):" in stdout
    assert f"{report['accelerated_nodes']} of {report['nodes']} nodes" in stdout


def test_info_inside_the_source_checkout_says_why_the_kernels_look_missing(monkeypatch, capsys, tmp_path):
    """On a Pi, minirt installed from a checkout with pip and `python3 -m minirt info` run inside it imports
    the checkout (no compiled module there): info says so, and only there."""
    from minirt import native

    root = Path(minirt.__file__).resolve().parent.parent
    monkeypatch.setattr(native, "available", False)
    monkeypatch.setattr(native, "reason", "extension not built (no C compiler when minirt was installed?)")
    monkeypatch.chdir(root)
    assert main(["info"]) == 0
    assert f"this is the source checkout in {root}" in capsys.readouterr().out
    monkeypatch.chdir(tmp_path)
    assert main(["info"]) == 0
    assert "source checkout" not in capsys.readouterr().out
