"""The native module's state, its fallbacks, and the thread plumbing of Session."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from minirt import builder
from minirt import native
from minirt.native import blas

CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import minirt
    from minirt import native
    sess = minirt.Session(sys.argv[1])
    (y,) = sess.run(None, {"x": np.ones((1, 4, 9, 9), np.float32)})
    print(json.dumps({"available": native.available, "reason": native.reason, "isa": native.isa,
                      "describe": native.describe(), "sum": float(y.sum()),
                      "loaded": "minirt.native._kernels" in sys.modules}))
    """
)


@pytest.fixture(scope="module")
def dw_artifact(tmp_path_factory):
    rng = np.random.default_rng(0)
    w = nh.from_array(rng.standard_normal((4, 1, 3, 3)).astype(np.float32), "w")
    model = h.make_model(
        h.make_graph(
            [h.make_node("Conv", ["x", "w"], ["c"], group=4, pads=[1, 1, 1, 1]),
             h.make_node("MaxPool", ["c"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
            "g",
            [h.make_tensor_value_info("x", TP.FLOAT, [1, 4, 9, 9])],
            [h.make_tensor_value_info("y", TP.FLOAT, [1, 4, 4, 4])],
            [w],
        ),
        opset_imports=[h.make_opsetid("", 17)],
    )
    path = tmp_path_factory.mktemp("native") / "dw.mrt"
    builder.build(model, path)
    return str(path)


def _child(path, **env):
    base = {k: v for k, v in os.environ.items() if k not in ("MINIRT_DISABLE_NATIVE", "MINIRT_NATIVE_ISA")}
    proc = subprocess.run([sys.executable, "-c", CHILD, path], capture_output=True, text=True, timeout=120,
                          env={**base, **env})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_state_is_consistent():
    assert isinstance(native.available, bool)
    assert isinstance(native.features, dict)
    if native.available:
        assert native.reason == ""
        assert native.isa in ("avx512", "avx2", "dotprod", "neon", "baseline")
        assert native.describe().startswith("active")
    else:
        assert native.reason
        assert "numpy" in native.describe()


def test_disabled_by_environment(dw_artifact):
    r = _child(dw_artifact, MINIRT_DISABLE_NATIVE="1")
    assert r["available"] is False
    assert r["reason"] == "disabled by MINIRT_DISABLE_NATIVE"
    assert not r["loaded"]
    assert "disabled by MINIRT_DISABLE_NATIVE" in r["describe"]
    if native.available:
        enabled = _child(dw_artifact)
        assert enabled["available"] and enabled["loaded"]
        assert enabled["sum"] == pytest.approx(r["sum"], rel=1e-5)


def test_baseline_isa_by_environment(dw_artifact):
    if not native.available:
        pytest.skip(native.reason)
    r = _child(dw_artifact, MINIRT_NATIVE_ISA="baseline")
    assert r["isa"] == "baseline"


def test_missing_extension_falls_back(dw_artifact, tmp_path):
    """A minirt whose extension was never compiled (no C compiler) still runs, on numpy."""
    import shutil

    import minirt

    src = os.path.dirname(minirt.__file__)
    dst = tmp_path / "minirt"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("_kernels*", "__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != "MINIRT_DISABLE_NATIVE"}
    proc = subprocess.run([sys.executable, "-c", CHILD, dw_artifact], capture_output=True, text=True, timeout=120,
                          env={**env, "PYTHONPATH": str(tmp_path)}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["available"] is False
    assert "not built" in r["reason"]


def test_select_isa_rejects_unknown():
    if not native.available:
        pytest.skip(native.reason)
    with pytest.raises(ValueError):
        native.select_isa("sse9")


def test_session_threads_set_native_and_blas(dw_artifact, monkeypatch):
    import minirt

    x = {"x": np.ones((1, 4, 9, 9), np.float32)}
    blas.set_threads(None)  # the library's own default (earlier sessions may have changed it)
    before = blas.get_threads()
    openblas = blas.status.startswith("OpenBLAS")
    try:
        minirt.Session(dw_artifact, threads=1).run(None, x)
        assert native.threads() == 1
        if openblas:
            assert blas.get_threads() == 1
        minirt.Session(dw_artifact, threads=2).run(None, x)
        assert native.threads() == 2
        if openblas and native.available:  # native kernels do the threading: BLAS stays at 1 (D28)
            assert blas.get_threads() == 1
        minirt.Session(dw_artifact).run(None, x)  # threads=None: the native default comes back
        assert native.threads() == native._DEFAULT_THREADS
        if openblas and native.available:
            assert blas.get_threads() == 1
        # numpy kernels only: BLAS is the parallelism, it follows `threads` (None: its own default)
        monkeypatch.setattr(native, "available", False)
        minirt.Session(dw_artifact, threads=2).run(None, x)
        if openblas:
            assert blas.get_threads() == 2
        minirt.Session(dw_artifact).run(None, x)
        if openblas:
            assert blas.get_threads() == before
    finally:
        native.set_threads(None)
        blas.set_threads(None)


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler here")
@pytest.mark.skipif(bool(os.environ.get("MINIRT_DISABLE_NATIVE")), reason="native kernels disabled on purpose")
def test_native_kernels_are_built_where_a_compiler_exists():
    """With a compiler the install builds the extension: a compile error must not pass as the numpy fallback."""
    assert native.available, f"native kernels unavailable although a C compiler exists: {native.reason}"


BLAS_PROBE_CHILD = textwrap.dedent(
    """
    import json, os
    import numpy
    from minirt.native import blas
    before = blas._mapped_libraries()
    blas.set_threads(1)
    print(json.dumps({"before": before, "after": blas._mapped_libraries(), "status": blas.status,
                      "threads": blas.get_threads()}))
    """
)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps (Linux)")
def test_blas_probe_finds_the_library_numpy_loaded_and_loads_none():
    """The probe tries the wheel's libraries with RTLD_NOLOAD first (no /proc read): it must still
    bind the OpenBLAS numpy loaded, found in /proc/self/maps, and never map a second library."""
    proc = subprocess.run([sys.executable, "-c", BLAS_PROBE_CHILD], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(r["after"]) == sorted(r["before"])
    if not r["status"].startswith("OpenBLAS"):
        pytest.skip(f"no OpenBLAS behind this numpy: {r['status']}")
    bound = r["status"].split(" via ", 1)[1].split(" (", 1)[0]
    assert bound in {os.path.basename(p) for p in r["before"]}
    assert r["threads"] == 1


BLAS_STOP_CHILD = textwrap.dedent(
    """
    import json, os, threading, time
    import numpy as np
    from minirt.native import blas

    def threads():
        return len(os.listdir("/proc/self/task"))

    a = np.random.default_rng(0).random((400, 400))
    blas.set_threads(2)
    a @ a  # a threaded call: OpenBLAS's workers exist (and spin for a while)
    r = {"status": blas.status, "has_shutdown": blas._shutdown is not None, "with_workers": threads()}
    r["refused_at_2"] = not blas.stop_idle_threads()  # BLAS still threaded: nothing stopped
    blas.set_threads(1)
    event = threading.Event()
    other = threading.Thread(target=event.wait)
    other.start()
    r["refused_beside_a_thread"] = not blas.stop_idle_threads()
    event.set()
    other.join()
    r["stopped"] = blas.stop_idle_threads()
    # (a stopped worker may still be listed for a moment after the call returns: up to 2 s to leave)
    deadline = time.monotonic() + 2.0
    while threads() >= r["with_workers"] and time.monotonic() < deadline:
        time.sleep(0.01)
    r["after_stop"] = threads()
    blas.set_threads(2)  # OpenBLAS starts its workers again by itself, with correct products
    r["product_ok"] = bool(np.allclose(a @ a, np.einsum("ij,jk->ik", a, a)))
    r["restarted"] = threads()
    print(json.dumps(r))
    """
)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc/self/task (Linux)")
def test_blas_idle_workers_stop_and_come_back():
    """stop_idle_threads (D136) stops OpenBLAS's workers only with BLAS at 1 thread and no other Python
    thread; a later threaded product starts them again and is right."""
    proc = subprocess.run([sys.executable, "-c", BLAS_STOP_CHILD], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    if not (r["status"].startswith("OpenBLAS") and r["has_shutdown"]):
        pytest.skip(f"no OpenBLAS with blas_thread_shutdown_ behind this numpy: {r['status']}")
    if r["with_workers"] < 2:
        pytest.skip("OpenBLAS started no workers here (1 CPU)")
    assert r["refused_at_2"] and r["refused_beside_a_thread"]
    assert r["stopped"] and r["after_stop"] < r["with_workers"]
    assert r["product_ok"] and r["restarted"] == r["with_workers"]


def test_a_rebuild_removes_the_older_module_python_would_import_instead(tmp_path):
    """`make native` writes ``_kernels.<interpreter tag>.so``, `pip install -e .` ``_kernels.abi3.so``;
    Python imports the tagged one first, so the rebuild that wrote the other name ran stale kernels.
    ``drop_shadowed`` leaves the build just made as the only one (and touches nothing else)."""
    import importlib.machinery

    from minirt.native.build_native import drop_shadowed

    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    names = ["_kernels" + s for s in suffixes] + ["_other" + suffixes[0], "_kernels.c"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    fresh = tmp_path / ("_kernels" + suffixes[-1])
    removed = drop_shadowed(str(fresh))
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([fresh.name, "_other" + suffixes[0], "_kernels.c"]), left
    assert len(removed) == len(suffixes) - 1


def test_a_failed_compile_installs_nothing(tmp_path):
    """The extension is optional, so setuptools only warns when the compiler fails and leaves the previous
    build in build/native: ``built_since`` then finds no module written by this build, and
    build_native.py exits non-zero instead of copying the stale one over ("installed", while the tests ran
    the old kernels)."""
    import time

    from minirt.native.build_native import built_since

    folder = tmp_path / "minirt" / "native"
    folder.mkdir(parents=True)
    stale = folder / "_kernels.cpython-311-x86_64-linux-gnu.so"
    stale.write_bytes(b"x")
    (folder / "_kernels.c").write_bytes(b"x")
    os.utime(stale, (1_000_000, 1_000_000))
    started = time.time()
    assert built_since(str(tmp_path), started) == []
    fresh = folder / "_kernels.abi3.so"
    fresh.write_bytes(b"y")
    assert built_since(str(tmp_path), float(int(started))) == [str(fresh)]
