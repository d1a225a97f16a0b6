"""The device wheel (``MINIRT_WHEEL=runtime pip wheel .``, setup.py): the runtime alone, its compiled
module without debug information, no C sources, no builder; installed, it runs an artifact with its
native kernels.  Building it compiles the kernels (about two minutes of one core)."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


# (runtime_wheel: tests/conftest.py, built once per session and shared with tests/test_package.py)


def _names(wheel: Path) -> list[str]:
    """The wheel's files, with the modules of its archive (minirt/_runtime.zip) listed as if unpacked."""
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        with zipfile.ZipFile(io.BytesIO(zf.read("minirt/_runtime.zip"))) as archive:
            return names + archive.namelist()


def test_the_device_wheel_holds_the_runtime_only(runtime_wheel):
    names = _names(runtime_wheel)
    assert "minirt/session.py" in names and "minirt/kernels/nn.pyc" in names
    assert not [n for n in names if n.startswith(("minirt/builder/", "minirt/targets/"))]
    assert not [n for n in names if n.endswith((".c", ".onnx", ".npz"))]  # (no sources, no demo data)
    assert not [n for n in names if n.endswith(".h")]  # (the expected ABI version is a Python constant)
    # nor the modules that compile the kernels (the wheel holds the compiled module), nor verify's
    # off-device Core ML reference
    assert not [n for n in names if n.startswith(("minirt/native/build_native", "minirt/native/build_progress",
                                                   "minirt/tools/mil_eval", "minirt/tools/coreml_spec_eval"))]
    modules = [n for n in names if n.startswith("minirt/native/_kernels") and n.endswith((".so", ".pyd"))]
    assert len(modules) == 1, names


def test_the_device_wheel_keeps_its_modules_in_one_archive(runtime_wheel):
    """pip compiles bytecode for every .py file it installs (more bytes than the sources): the wheel's only
    one is the package entry, and the archive holds each module's source beside its bytecode (D148)."""
    with zipfile.ZipFile(runtime_wheel) as zf:
        loose = [n for n in zf.namelist() if n.endswith(".py")]
    assert loose == ["minirt/__init__.py"], loose
    archived = _names(runtime_wheel)
    sources = {n for n in archived if n.endswith(".py") and n != "minirt/__init__.py"}
    assert sources and {n + "c" for n in sources} <= set(archived)
    assert "minirt/__init__.pyc" in archived  # (the real package body, which the entry runs)


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
    # (with the bytecode pip compiles, as a device's pip install leaves it)
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q",
                           "--disable-pip-version-check", "--target", str(target), str(runtime_wheel)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    size = sum(f.stat().st_size for f in (target / "minirt").rglob("*") if f.is_file())
    assert size < 3_000_000, f"installed runtime (with bytecode) is {size:,} bytes"
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

    # from the archive: every kernel family is found, and a traceback formatted by the traceback module
    # (logging, pytest, the interpreter's own from Python 3.13 on) shows the failing source line, which
    # linecache asks of zipimport (Python 3.11's interpreter prints file names and line numbers only)
    from minirt import kernels

    code = ("import minirt, minirt.kernels as k, traceback; print(minirt.kernels.__file__); "
            "print(*k.family_modules())\ntry: minirt.InferenceSession(b'xx')\nexcept minirt.Error: traceback.print_exc()")
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=300, env=env,
                          cwd=str(tmp_path))
    where, families = proc.stdout.splitlines()
    assert where.startswith(str(target / "minirt" / "_runtime.zip")), where
    assert families.split() == kernels.family_modules()
    assert 'File "minirt/format/reader.py"' in proc.stderr and "raise FormatError(" in proc.stderr, proc.stderr
    assert "not a .mrt file" in proc.stderr.splitlines()[-1]


def test_the_demo_data_is_package_data_that_the_example_folder_links_to():
    """``minirt demo`` reads its model and images from the package (so it runs after pip install);
    examples/digits/ holds links to the same files."""
    import minirt
    from minirt import cli

    assert cli.DIGITS_DIR.parent == Path(minirt.__file__).resolve().parent
    for name in ("digits_cnn.onnx", "heldout.npz", "calibration.npz"):
        example = ROOT / "examples" / "digits" / name
        assert example.resolve() == (cli.DIGITS_DIR / name).resolve()


def test_packing_the_modules_is_reproducible_and_keeps_the_rest(tmp_path):
    """scripts/zip_runtime.py: the same tree gives the same archive; non-Python files stay, .py files and
    bytecode caches leave, the entry becomes the device wheel's __init__.py."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import zip_runtime
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    archives = []
    for attempt in ("a", "b"):
        package = tmp_path / attempt / "minirt"
        (package / "sub" / "__pycache__").mkdir(parents=True)
        (package / "__init__.py").write_text("VALUE = 1\n")
        (package / "sub" / "__init__.py").write_text("")
        (package / "sub" / "mod.py").write_text("def f():\n    return 2\n")
        (package / "sub" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"stale")
        (package / "sub" / "_ext.so").write_bytes(b"\x7fELF")
        archives.append(zip_runtime.pack(package).read_bytes())
        rest = sorted(p.relative_to(package).as_posix() for p in package.rglob("*") if p.is_file())
        assert rest == ["__init__.py", "_runtime.zip", "sub/_ext.so"], rest
        assert (package / "__init__.py").read_bytes() == zip_runtime.STUB.read_bytes()
    assert archives[0] == archives[1]
    names = zipfile.ZipFile(io.BytesIO(archives[0])).namelist()
    assert names == ["minirt/__init__.py", "minirt/__init__.pyc", "minirt/sub/__init__.py", "minirt/sub/__init__.pyc",
                     "minirt/sub/mod.py", "minirt/sub/mod.pyc"]
    with pytest.raises(SystemExit, match="not the minirt package folder"):
        zip_runtime.pack(tmp_path / "a")
