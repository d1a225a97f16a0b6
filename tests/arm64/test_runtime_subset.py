"""The runtime subset: prebuilt artifacts vs onnxruntime's outputs, native and numpy kernels.

Inside the emulated Raspberry Pi (``make test-arm64``) the artifacts come
prebuilt from the host through ``MINIRT_ARM64_ARTIFACTS`` and only minirt,
numpy and pytest are needed.  In the normal suite (no such variable) the
fixture builds them with ``tests/arm64/prepare.py`` first, so the subset and
the host-side preparation are tested on every ``make test`` too.

Environment (set by scripts/arm64/run-tests.sh inside the chroot):

``MINIRT_ARM64_ARTIFACTS``   folder with manifest.json, NAME.mrt, NAME.npz
``MINIRT_EXPECT_NATIVE=1``   the native kernels must be compiled and active
``MINIRT_EXPECT_NUMPY``      numpy must be this version (Debian's, not PyPI's)
"""
from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import numpy as np
import pytest

import minirt
from minirt import native
from tests.arm64.subset import CASES, MANIFEST


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory) -> Path:
    given = os.environ.get("MINIRT_ARM64_ARTIFACTS")
    if given:
        path = Path(given)
        assert (path / MANIFEST).is_file(), f"MINIRT_ARM64_ARTIFACTS={given} has no {MANIFEST}"
        return path
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    pytest.importorskip("builder")
    from tests.arm64.prepare import prepare

    return prepare(tmp_path_factory.mktemp("arm64-artifacts"))


@pytest.fixture(scope="session")
def manifest(artifacts) -> dict:
    return json.loads((artifacts / MANIFEST).read_text())


@pytest.fixture
def numpy_kernels_only():
    """Run with the native kernels switched off (every kernel checks the flag per call)."""
    saved = native.available
    native.available = False
    try:
        yield
    finally:
        native.available = saved


def _load(artifacts: Path, manifest: dict, name: str):
    case = manifest["cases"][name]
    data = np.load(artifacts / case["data"])
    feeds = {k: data[f"in.{k}"] for k in case["inputs"]}
    expected = {k: data[f"out.{k}"] for k in case["outputs"]}
    labels = data["label"] if case["labelled"] else None
    return case, feeds, expected, labels


def _check(artifacts: Path, manifest: dict, name: str) -> None:
    case, feeds, expected, labels = _load(artifacts, manifest, name)
    sess = minirt.Session(str(artifacts / case["artifact"]))
    names = case["outputs"]
    got = dict(zip(names, sess.run(names, feeds)))
    for out in names:
        e, a = expected[out], got[out]
        assert a.dtype == e.dtype, f"{name}/{out}: dtype {a.dtype} != {e.dtype}"
        assert a.shape == e.shape, f"{name}/{out}: shape {a.shape} != {e.shape}"
        if e.dtype.kind in "fc":
            np.testing.assert_allclose(a, e, rtol=case["rtol"], atol=case["atol"], err_msg=f"{name}/{out}")
        else:
            np.testing.assert_array_equal(a, e, err_msg=f"{name}/{out}")
    if labels is not None:
        (logits,) = got.values()
        acc, ref_acc = (logits.argmax(1) == labels).mean(), (expected[names[0]].argmax(1) == labels).mean()
        assert acc == ref_acc, f"{name}: accuracy {acc} != onnxruntime's {ref_acc}"
        assert acc > 0.9


@pytest.mark.parametrize("name", list(CASES))
def test_case_matches_onnxruntime(artifacts, manifest, name):
    _check(artifacts, manifest, name)


@pytest.mark.parametrize("name", ["digits_rpi4", "conv_block", "conv_strided"])
def test_case_with_numpy_kernels_only(artifacts, manifest, name, numpy_kernels_only):
    _check(artifacts, manifest, name)


def test_artifacts_record_their_target(artifacts, manifest):
    for name in ("digits_rpi3", "digits_rpi4", "digits_rpi5"):
        sess = minirt.Session(str(artifacts / manifest["cases"][name]["artifact"]))
        meta = sess.get_modelmeta().minirt
        target = name.split("_")[1]
        assert meta.get("target.name") == target, meta.get("target.name")
        profile = meta.get("target.profile")
        if profile is not None:  # recorded since the rpi profiles grew CPU facts
            assert profile["arch"] == "arm64" and "neon" in profile["cpu_features"]
            assert ("dotprod" in profile["cpu_features"]) == (target == "rpi5")


def test_numpy_is_the_expected_one():
    want = os.environ.get("MINIRT_EXPECT_NUMPY")
    if not want:
        pytest.skip("MINIRT_EXPECT_NUMPY not set (only the arm64 runner pins it)")
    assert np.__version__ == want, f"numpy {np.__version__} (from {np.__file__}), expected Debian's {want}"


def test_native_kernels_built_and_chosen():
    """In the emulated Pi the kernels are compiled by pip with Debian's gcc and must be active."""
    if os.environ.get("MINIRT_EXPECT_NATIVE") != "1":
        pytest.skip("MINIRT_EXPECT_NATIVE=1 not set (the host may have no compiler)")
    assert native.available, native.reason
    if platform.machine() in ("aarch64", "arm64"):
        assert native.features.get("neon"), native.features
    print(f"native kernels: {native.describe()}")


# qemu CPU model -> (Pi, whether the CPU reports the ARMv8.2 dot-product instructions)
PI_CPUS = {"cortex-a53": ("rpi3", False), "cortex-a72": ("rpi4", False), "cortex-a76": ("rpi5", True)}

_ON_ONE_CPU = r"""
import json, sys
import numpy as np
import minirt
from minirt import native
art, name = sys.argv[1], sys.argv[2]
data = np.load(f"{art}/{name}.npz")
(y,) = minirt.Session(f"{art}/{name}.mrt").run(None, {"image": data["in.image"]})
err = float(np.abs(y - data["out.logits"]).max())
print(json.dumps({"features": native.features, "isa": native.isa, "available": native.available, "err": err}))
"""


@pytest.mark.parametrize("cpu", list(PI_CPUS))
def test_one_install_on_every_pi_cpu(artifacts, cpu):
    """The same build picks its kernels at run time: qemu emulates each Pi's CPU (QEMU_CPU)."""
    if os.environ.get("MINIRT_ARM64_EMULATED") != "1":
        pytest.skip("only under qemu-user (make test-arm64)")
    import subprocess
    import sys

    pi, dotprod = PI_CPUS[cpu]
    proc = subprocess.run([sys.executable, "-c", _ON_ONE_CPU, str(artifacts), f"digits_{pi}"],
                          env=dict(os.environ, QEMU_CPU=cpu), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{pi} ({cpu}): {got}")
    assert got["err"] < 1e-4
    if os.environ.get("MINIRT_EXPECT_NATIVE") == "1":
        assert got["available"]
        assert got["features"]["neon"] is True
        assert got["features"]["asimddp"] is dotprod
