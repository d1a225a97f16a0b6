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
    pytest.importorskip("minirt.builder")
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


def test_builder_packed_weights_are_seeded(artifacts, manifest, monkeypatch):
    """The Pi targets store weights packed for panels of 8 (NEON's layout; docs/decisions.md D61):
    on arm64 the session seeds them and the first run packs nothing; where the kernels use another
    layout (x86 hosts with AVX2 / AVX-512) they are ignored and packed lazily.  Same bits either way."""
    if not native.available:
        pytest.skip(f"native kernels not available: {native.reason}")
    if os.environ.get("MINIRT_EXPECT_NATIVE") == "1" and platform.machine() in ("aarch64", "arm64"):
        assert native.packed_panel_width() == 8, native.describe()
    case, feeds, _expected, _labels = _load(artifacts, manifest, "digits_rpi4")
    path = str(artifacts / case["artifact"])
    entries = minirt.Session(path).artifact.packed_weights
    assert len(entries) == 5 and {e.nr for e in entries} == {8}
    made = []
    cached_pack = native._cached_pack

    def counting(owner, tag, pack):
        def packing():
            packed = pack()
            if packed is not None:
                made.append(tag)
            return packed
        return cached_pack(owner, tag, packing)

    monkeypatch.setattr(native, "_cached_pack", counting)
    with monkeypatch.context() as m:
        m.setattr(native, "seed_pack", lambda owner, tag, packed: None)  # a session that ignores the packs
        want = minirt.Session(path).run(None, feeds)
    assert len(made) == len(entries)  # the runtime packs exactly what the builder stored
    made.clear()
    got = minirt.Session(path).run(None, feeds)
    assert len(made) == (0 if native.packed_panel_width() == 8 else len(entries))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


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
# what minirt must choose there: (isa, int8 GEMM microkernel)
PI_CHOICE = {"cortex-a53": ("neon", "portable"), "cortex-a72": ("neon", "portable"),
             "cortex-a76": ("dotprod", "dotprod")}

_ON_ONE_CPU = r"""
import json, sys
import numpy as np
import minirt
from minirt import native
art, name = sys.argv[1], sys.argv[2]
data = np.load(f"{art}/{name}.npz")
(y,) = minirt.Session(f"{art}/{name}.mrt").run(None, {"image": data["in.image"]})
err = float(np.abs(y - data["out.logits"]).max())
chosen = {"isa": native.isa, "qgemm_isa": native.qgemm_isa, "describe": native.describe()}
# the int8 GEMM on every level this CPU can run: exact against numpy's integer math
exact, timing, nbits = {}, {}, {}
if native.available:
    import time
    rng = np.random.default_rng(0)
    for level in ("best", "dotprod", "neon", "baseline"):
        got = native.select_isa(level)
        ok = True
        for m, k, n in ((1, 1, 1), (7, 5, 33), (13, 27, 70), (6, 130, 32), (20, 300, 45)):
            for zp in (0, 7, 128, 255):
                w = rng.integers(-128, 128, (m, k), dtype=np.int8)
                x = rng.integers(0, 256, (k, n), dtype=np.uint8)
                w[:, :1] = -128
                x[:, :2] = 255
                c = np.empty((m, n), np.float32)
                native.qgemm(native.qpack(w), m, k, x, zp, np.ones(m, np.float32), c)
                ok = ok and np.array_equal(c, (w.astype(np.int64) @ (x.astype(np.int64) - zp)).astype(np.float32))
        exact[f"{level}->{got}/{native.qgemm_isa}"] = bool(ok)
        # the 4-bit MatMulNBits product (nbits_impl.h) of this level against decoder.py's numpy reference
        from minirt.kernels import decoder
        nb_ok = True
        for rows, K, N, bs in ((1, 64, 20, 32), (5, 96, 37, 32), (3, 256, 16, 64)):
            B = rng.integers(0, 256, (N, -(-K // bs), bs // 2), dtype=np.uint8)
            sc = (rng.random((N, -(-K // bs))) * 0.1 + 0.01).astype(np.float32)
            zp = rng.integers(0, 256, (N, -(-K // bs // 2) or 1), dtype=np.uint8) if rows != 1 else None
            a = rng.standard_normal((rows, K)).astype(np.float32)
            ref = decoder._matmul_int8(a, *decoder._int8_operands(B, sc, zp, K, N, 4, bs), K, bs)
            y = np.empty((rows, N), np.float32)
            work = np.empty(native.qnbits_workspace_bytes(rows, K, bs), np.uint8)
            native.qnbits_matmul(decoder._fused_weights(B, sc, zp, K, N, bs), a, y, work)
            nb_ok = nb_ok and bool(np.allclose(y, ref, rtol=2e-5, atol=2e-5 * np.abs(ref).max()))
        nbits[got] = nb_ok
        # indicative only: qemu does not model the core's timing
        m, k, n = 64, 288, 200
        w = rng.integers(-128, 128, (m, k), dtype=np.int8)
        x = rng.integers(0, 256, (k, n), dtype=np.uint8)
        p, c = native.qpack(w), np.empty((m, n), np.float32)
        native.set_threads(1)
        ts = []
        for _ in range(3):
            t0 = time.perf_counter()
            native.qgemm(p, m, k, x, 3, np.ones(m, np.float32), c)
            ts.append(time.perf_counter() - t0)
        timing[f"{got}/{native.qgemm_isa}"] = round(min(ts) * 1e3, 2)
    native.select_isa("best")
print(json.dumps({"features": native.features, "available": native.available, "err": err, **chosen,
                  "exact": exact, "nbits": nbits, "qgemm_64x288x200_ms": timing}))
"""


@pytest.mark.parametrize("cpu", list(PI_CPUS))
def test_one_install_on_every_pi_cpu(artifacts, cpu):
    """The same build picks its kernels at run time: qemu emulates each Pi's CPU (QEMU_CPU).

    Pi 3/4 (A53/A72): "neon" with the portable int8 GEMM; Pi 5 (A76, asimddp): the SDOT
    int8 GEMM.  On each, the int8 GEMM of every level is exact against numpy."""
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
        assert (got["isa"], got["qgemm_isa"]) == PI_CHOICE[cpu], got["describe"]
        assert f"int8 GEMM {PI_CHOICE[cpu][1]}" in got["describe"]
        # best, dotprod (-> neon without the dot product), neon, baseline: all exact
        assert len(got["exact"]) == 4 and all(got["exact"].values()), got["exact"]
        assert ("best->dotprod/dotprod" in got["exact"]) is dotprod
        assert "baseline->baseline/portable" in got["exact"]
        # MatMulNBits: SDOT on the A76, NEON widening multiplies on A53/A72, plain C: all match numpy
        assert got["nbits"] and all(got["nbits"].values()), got["nbits"]
        assert ("dotprod" in got["nbits"]) is dotprod and "neon" in got["nbits"] and "baseline" in got["nbits"]


def test_baseline_forced_on_pi5():
    """MINIRT_NATIVE_ISA=baseline wins over the dot product on a Cortex-A76."""
    if os.environ.get("MINIRT_ARM64_EMULATED") != "1" or os.environ.get("MINIRT_EXPECT_NATIVE") != "1":
        pytest.skip("only under qemu-user with the native kernels (make test-arm64)")
    import subprocess
    import sys

    code = "from minirt import native; print(native.isa, native.qgemm_isa, native.features['asimddp'])"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, QEMU_CPU="cortex-a76", MINIRT_NATIVE_ISA="baseline"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["baseline", "portable", "True"], proc.stdout
