"""The device wheel (``MINIRT_WHEEL=runtime pip wheel .``, setup.py): the runtime alone, its compiled
module without debug information, no C sources, no builder; installed, it runs an artifact with its
native kernels.  Building it compiles the kernels (about two minutes of one core)."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


# (runtime_wheel: tests/conftest.py, built once per session and shared with tests/test_package.py)


def test_the_device_wheel_holds_the_runtime_only(runtime_wheel):
    names = zipfile.ZipFile(runtime_wheel).namelist()
    assert not [n for n in names if n.startswith(("minirt/builder/", "minirt/targets/"))]
    assert not [n for n in names if n.endswith((".c", ".onnx", ".npz"))]  # (no sources, no demo data)
    assert not [n for n in names if n.endswith(".h")]  # (the expected ABI version is a Python constant)
    # nor the modules that compile the kernels (the wheel holds the compiled module), nor verify's
    # off-device Core ML reference
    assert not [n for n in names if n.startswith(("minirt/native/build_native", "minirt/native/build_progress",
                                                   "minirt/tools/mil_eval", "minirt/tools/coreml_spec_eval"))]
    modules = [n for n in names if n.startswith("minirt/native/_kernels") and n.endswith((".so", ".pyd"))]
    assert len(modules) == 1, names


def test_the_compiled_module_has_no_debug_information(runtime_wheel, tmp_path):
    if sys.platform != "linux":
        pytest.skip("ELF sections are read on Linux")
    zf = zipfile.ZipFile(runtime_wheel)
    (name,) = [n for n in zf.namelist() if n.startswith("minirt/native/_kernels")]
    data = zf.read(name)
    assert b".debug_info" not in data and b".debug_line" not in data
    # (the kernels of three x86-64 ISA levels, or NEON and its dot-product int8 GEMM on arm64)
    assert len(data) < 2_500_000, len(data)


def test_the_installed_device_wheel_runs_an_artifact_natively(runtime_wheel, tmp_path):
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "-q",
                           "--disable-pip-version-check", "--target", str(target), str(runtime_wheel)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    size = sum(f.stat().st_size for f in (target / "minirt").rglob("*") if f.is_file())
    assert size < 3_000_000, f"installed runtime (no bytecode) is {size:,} bytes"
    from minirt.builder import build

    digits = tmp_path / "digits.mrt"
    build(str(ROOT / "examples" / "digits" / "digits_cnn.onnx"), str(digits))
    code = ("import sys, numpy as np, minirt; from minirt import native; "
            "assert minirt.__file__.startswith(sys.argv[1]), minirt.__file__; "
            "s = minirt.Session(sys.argv[2]); i = s.get_inputs()[0]; "
            "x = np.zeros([d if isinstance(d, int) else 1 for d in i.shape], np.float32); "
            "print(native.available, s.run(None, {i.name: x})[0].shape)")
    # (-S: no site module, so the checkout's editable install (a .pth hook) stays out; numpy and cffi come
    # from this environment's site-packages, on PYTHONPATH after the installed wheel)
    import numpy

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), str(Path(numpy.__file__).parent.parent)]))
    proc = subprocess.run([sys.executable, "-S", "-c", code, str(target), str(digits)], capture_output=True,
                          text=True, timeout=300, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[0] == "True", proc.stdout


def test_the_demo_data_is_package_data_that_the_example_folder_links_to():
    """``minirt demo`` reads its model and images from the package (so it runs after pip install);
    examples/digits/ holds links to the same files."""
    import minirt
    from minirt import cli

    assert cli.DIGITS_DIR.parent == Path(minirt.__file__).resolve().parent
    for name in ("digits_cnn.onnx", "heldout.npz", "calibration.npz"):
        example = ROOT / "examples" / "digits" / name
        assert example.resolve() == (cli.DIGITS_DIR / name).resolve()
