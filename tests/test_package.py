"""`minirt package` (builder/package.py): the folder a device gets, installed and run the way its README
says, offline, against onnxruntime; the reduced runtime; the launcher's commands and its errors; the
errors of the packaging command itself."""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import numpy as np
import pytest

from minirt.builder.errors import BuildError
from minirt.builder.package import find_wheel, package

ROOT = Path(__file__).resolve().parent.parent
DIGITS = ROOT / "examples" / "digits" / "digits_cnn.onnx"
ort = pytest.importorskip("onnxruntime")


def _numpy_path() -> str:
    """The folder numpy is installed in: the device's system numpy, for a venv made with
    --system-site-packages from an interpreter that has none."""
    return str(Path(np.__file__).parent.parent)


@pytest.fixture(scope="module")
def packaged(tmp_path_factory, runtime_wheel):
    """The digits model packaged for this machine with a reduced runtime, then installed by its install.sh
    (python3 -> this interpreter; the system numpy -> this environment's, on PYTHONPATH)."""
    out = tmp_path_factory.mktemp("pkg") / "digits-pkg"
    report = package(str(DIGITS), "host", str(out), wheel=str(runtime_wheel), reduced=True)
    bin_dir = out.parent / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", PYTHONPATH=_numpy_path())
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run(["sh", str(out / "install.sh")], capture_output=True, text=True, timeout=600, env=env,
                          cwd=str(out.parent))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return out, report, env, proc.stdout


def _run(pkg: Path, env: dict, *args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([str(pkg / ".venv" / "bin" / "python"), str(pkg / "run.py"), *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=str(pkg))


def test_the_package_holds_what_a_device_needs(packaged, runtime_wheel):
    pkg, report, _, install_log = packaged
    names = sorted(str(p.relative_to(pkg)) for p in pkg.rglob("*") if p.is_file() and ".venv" not in p.parts)
    assert names == sorted(["README.txt", "install.sh", "manifest.json", "model.mrt", "run.py",
                            f"wheels/{runtime_wheel.name}"])
    manifest = json.loads((pkg / "manifest.json").read_text())
    assert manifest["format"] == "minirt-package/1" and manifest["model"]["source"] == DIGITS.name
    assert manifest["target"]["arch"] in ("x86_64", "arm64")
    assert set(manifest["files"]) == set(names) - {"manifest.json"}
    # the check the install ran, and what it printed
    assert "files match the manifest" in install_log and "input" in install_log


def _module_names(wheel) -> list:
    """The modules of a device wheel: the entries of its archive (minirt/_runtime.zip, D148)."""
    with zipfile.ZipFile(wheel) as zf, zipfile.ZipFile(io.BytesIO(zf.read("minirt/_runtime.zip"))) as archive:
        return archive.namelist()


def test_the_reduced_runtime_keeps_only_the_families_the_model_uses(packaged, runtime_wheel):
    pkg, report, _, _ = packaged
    kept = _module_names(next((pkg / "wheels").glob("*.whl")))
    full = _module_names(runtime_wheel)
    families = {n.rsplit("/", 1)[1][:-3] for n in kept if n.startswith("minirt/kernels/") and n.endswith(".py")
                and not n.rsplit("/", 1)[1].startswith("_")}
    assert {"nn", "linalg"} <= families and "trees" not in families and "decoder" not in families
    assert {n for n in kept if n.endswith(".pyc")} == {n + "c" for n in kept if n.endswith(".py")}
    assert "minirt/kernels/trees.py" in full and "minirt/kernels/trees.pyc" in full
    assert "minirt/providers/coreml.py" in full and "minirt/providers/coreml.py" not in kept
    assert report.reduced and report.wheel_bytes < report.full_wheel_bytes
    assert report.kernel_families == sorted(families)


def test_the_installed_package_runs_the_model_like_onnxruntime(packaged, tmp_path):
    pkg, _, env, _ = packaged
    x = np.random.default_rng(5).random((2, 1, 8, 8), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    proc = _run(pkg, env, "run", str(tmp_path / "x.npy"), "--out", str(tmp_path / "y.npz"))
    assert proc.returncode == 0, proc.stderr
    expected = ort.InferenceSession(str(DIGITS), providers=["CPUExecutionProvider"]).run(None, {"image": x})[0]
    with np.load(tmp_path / "y.npz") as y:
        np.testing.assert_allclose(y[next(iter(y.files))], expected, rtol=1e-4, atol=1e-5)
    # the same input as .json, and a folder of inputs
    (tmp_path / "inputs").mkdir()
    np.save(tmp_path / "inputs" / "a.npy", x[:1])
    (tmp_path / "inputs" / "b.json").write_text(json.dumps({"image": x[1:].tolist()}))
    proc = _run(pkg, env, "folder", str(tmp_path / "inputs"))
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["file"] for r in rows] == ["a.npy", "b.json"]
    got = np.array([r["outputs"][next(iter(r["outputs"]))] for r in rows]).reshape(expected.shape)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    proc = _run(pkg, env, "classify", str(tmp_path / "inputs" / "a.npy"), "--top", "3")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{tmp_path / 'inputs' / 'a.npy'}: {int(expected[0].argmax())} ")


def test_the_launcher_serves_http(packaged):
    pkg, _, env, _ = packaged
    server = subprocess.Popen([str(pkg / ".venv" / "bin" / "python"), str(pkg / "run.py"), "serve", "--port", "0",
                               "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(pkg))
    try:
        line = server.stdout.readline()
        assert "serving" in line, line + server.stderr.read()
        base = line.split("http://", 1)[1].split(" ", 1)[0]
        with urllib.request.urlopen(f"http://{base}/health", timeout=30) as r:
            assert json.loads(r.read())["status"] == "ok"
        x = np.random.default_rng(6).random((1, 1, 8, 8), dtype=np.float32)
        req = urllib.request.Request(f"http://{base}/run", data=json.dumps({"inputs": {"image": x.tolist()}}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            outputs = json.loads(r.read())["outputs"]
        expected = ort.InferenceSession(str(DIGITS), providers=["CPUExecutionProvider"]).run(None, {"image": x})[0]
        np.testing.assert_allclose(np.array(next(iter(outputs.values()))), expected, rtol=1e-4, atol=1e-5)
        # bad input: a 400 that says what was wrong, and the server keeps serving
        bad = urllib.request.Request(f"http://{base}/run", data=json.dumps({"inputs": {"pixels": [1]}}).encode())
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(bad, timeout=30)
        assert exc.value.code == 400 and "unknown input 'pixels'" in exc.value.read().decode()
        with urllib.request.urlopen(f"http://{base}/health", timeout=30) as r:
            assert r.status == 200
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_launcher_reports_bad_input_and_tampering(packaged, tmp_path):
    pkg, _, env, _ = packaged
    (tmp_path / "x.txt").write_text("1 2 3")
    proc = _run(pkg, env, "run", str(tmp_path / "x.txt"))
    assert proc.returncode == 2 and "unknown input file type '.txt'" in proc.stderr and "Traceback" not in proc.stderr
    (tmp_path / "bad.json").write_text(json.dumps({"image": [[1, 2], [3]]}))
    proc = _run(pkg, env, "run", str(tmp_path / "bad.json"))
    assert proc.returncode == 2 and "not a rectangular array" in proc.stderr
    # a changed byte in the model: check names the file and fails
    copy = tmp_path / "copy"
    shutil.copytree(pkg, copy, symlinks=True, ignore=shutil.ignore_patterns(".venv"))
    data = bytearray((copy / "model.mrt").read_bytes())
    data[-1] ^= 0xFF
    (copy / "model.mrt").write_bytes(bytes(data))
    proc = subprocess.run([sys.executable, str(copy / "run.py"), "check"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "model.mrt: sha256" in proc.stderr and "4 of 5 files" in proc.stdout


def test_archive_and_packaging_errors(tmp_path, runtime_wheel):
    report = package(str(DIGITS), "host", str(tmp_path / "digits"), wheel=str(runtime_wheel), archive=True)
    assert report.output.endswith("digits.tar.gz") and not report.reduced
    with tarfile.open(report.output) as tar:
        names = tar.getnames()
    assert "digits/manifest.json" in names and "digits/model.mrt" in names
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # (no temporary folder left)
    with pytest.raises(BuildError, match="unknown target 'rpi9'"):
        package(str(DIGITS), "rpi9", str(tmp_path / "x"), wheel=str(runtime_wheel))
    with pytest.raises(BuildError, match="no such model file"):
        package(str(tmp_path / "missing.onnx"), "host", str(tmp_path / "x"), wheel=str(runtime_wheel))
    machine = "aarch64" if "x86_64" in runtime_wheel.name else "x86_64"
    other = "rpi4" if machine == "aarch64" else "x86-64-v3"
    with pytest.raises(BuildError, match=f"no runtime wheel for {machine}.*make wheels"):
        package(str(DIGITS), other, str(tmp_path / "x"), wheel_dir=str(tmp_path / "empty"))
    with pytest.raises(BuildError, match=f"is for .*needs {machine}"):
        package(str(DIGITS), other, str(tmp_path / "x"), wheel=str(runtime_wheel))
    (tmp_path / "notpkg").mkdir()
    (tmp_path / "notpkg" / "keep.txt").write_text("mine")
    with pytest.raises(BuildError, match="not a minirt package"):
        package(str(DIGITS), "host", str(tmp_path / "notpkg"), wheel=str(runtime_wheel))
    assert (tmp_path / "notpkg" / "keep.txt").read_text() == "mine"  # (nothing of the user's lost)
    assert find_wheel("arm64", tmp_path / "empty") is None


def test_the_cli_packages(tmp_path, runtime_wheel):
    proc = subprocess.run([sys.executable, "-m", "minirt", "package", str(DIGITS), "--target", "host", "-o",
                           str(tmp_path / "p"), "--wheel", str(runtime_wheel), "--json", "-q"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["output"] == str(tmp_path / "p")
    proc = subprocess.run([sys.executable, "-m", "minirt", "package", str(DIGITS), "--target", "rpi9", "-o",
                           str(tmp_path / "q")], capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0 and "unknown target 'rpi9'" in proc.stderr and "Traceback" not in proc.stderr
