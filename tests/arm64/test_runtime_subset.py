"""The runtime subset: prebuilt artifacts vs onnxruntime's outputs, native and numpy kernels.

Inside the emulated Raspberry Pi (``make test-arm64``: Debian arm64; ``make
test-arm32``: Debian armhf) the artifacts come prebuilt from the host through
``MINIRT_ARM64_ARTIFACTS`` and only minirt (installed from the runtime
wheel), numpy and pytest are needed.  In the normal suite (no such variable)
the fixture builds them with ``tests/arm64/prepare.py`` first, so the subset
and the host-side preparation are tested on every ``make test`` too.

Environment (set by scripts/emulated/run-tests.sh inside the chroot):

``MINIRT_ARM64_ARTIFACTS``   folder with manifest.json, NAME.mrt, NAME.npz
``MINIRT_ARM64_EMULATED=1``  running under qemu-user (either architecture)
``MINIRT_EXPECT_NATIVE=1``   the native kernels must be compiled and active
``MINIRT_EXPECT_NUMPY``      numpy must be this version (Debian's, not PyPI's)
``MINIRT_ARM64_DIFFS``       append the measured differences of every case to this file
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
from tests.arm64.compare import check_outputs, greedy_tokens, load_case
from tests.arm64.subset import CASES, MANIFEST

MACHINE = platform.machine().lower()
ARM32 = MACHINE.startswith("armv")  # armv7l (armhf); aarch64 / arm64 is the 64-bit one


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


def _check(artifacts: Path, manifest: dict, name: str) -> None:
    case, feeds, expected, labels, x86 = load_case(artifacts, manifest, name)
    sess = minirt.Session(str(artifacts / case["artifact"]))
    names = case["outputs"]
    got = dict(zip(names, sess.run(names, feeds)))
    lines = check_outputs(name, case, got, expected, labels, x86)
    print("\n".join(lines))
    report = os.environ.get("MINIRT_ARM64_DIFFS")  # (run-tests.sh prints the measured differences)
    if report and native.available:
        with open(report, "a") as f:
            f.write("".join(f"{line} [{native.isa}]\n" for line in lines))


@pytest.mark.parametrize("name", list(CASES))
def test_case_matches_onnxruntime(artifacts, manifest, name):
    _check(artifacts, manifest, name)


@pytest.mark.parametrize("name", ["digits_rpi4", "conv_block", "conv_strided", "digits_int8_ort"])
def test_case_with_numpy_kernels_only(artifacts, manifest, name, numpy_kernels_only):
    _check(artifacts, manifest, name)


def test_builder_packed_weights_are_seeded(artifacts, manifest, monkeypatch):
    """The Pi targets store weights packed for panels of 8 (NEON's layout; docs/decisions.md D61):
    on arm64 the session seeds them and the first run packs nothing; where the kernels use another
    layout (x86 hosts with AVX2 / AVX-512) they are ignored and packed lazily.  Same bits either way."""
    if not native.available:
        pytest.skip(f"native kernels not available: {native.reason}")
    if os.environ.get("MINIRT_EXPECT_NATIVE") == "1" and (MACHINE in ("aarch64", "arm64") or ARM32):
        assert native.packed_panel_width() == 8, native.describe()  # (both levels of 32-bit ARM too)
    case, feeds, _expected, _labels, _x86 = load_case(artifacts, manifest, "digits_rpi4")
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
    for name in ("digits_rpi3", "digits_rpi4", "digits_rpi5", "digits_rpi3-armhf"):
        sess = minirt.Session(str(artifacts / manifest["cases"][name]["artifact"]))
        meta = sess.get_modelmeta().minirt
        target = name.split("_")[1]
        assert meta.get("target.name") == target, meta.get("target.name")
        profile = meta.get("target.profile")
        if profile is not None:  # recorded since the rpi profiles grew CPU facts
            assert profile["arch"] == ("armv7" if target.endswith("-armhf") else "arm64")
            assert "neon" in profile["cpu_features"]
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
    if MACHINE in ("aarch64", "arm64") or ARM32:
        assert native.features.get("neon"), native.features
    if ARM32:  # (the main run's CPU, a Cortex-A7, has NEON and VFPv4: the NEON copy of the float kernels)
        assert native.features.get("fma") and native.isa == "neon", native.describe()
    print(f"native kernels: {native.describe()}")


# qemu CPU model -> (Pi, whether the CPU reports the ARMv8.2 dot-product instructions)
PI_CPUS = {"cortex-a53": ("rpi3", False), "cortex-a72": ("rpi4", False), "cortex-a76": ("rpi5", True)}
# what minirt must choose there: (isa, int8 GEMM microkernel)
PI_CHOICE = {"cortex-a53": ("neon", "portable"), "cortex-a72": ("neon", "portable"),
             "cortex-a76": ("dotprod", "dotprod")}
# 32-bit ARM (qemu-arm's CPU models): the Pi 2's Cortex-A7 and a Cortex-A15 have NEON and VFPv4 (what a
# Pi 3/4 reports in AArch32 too): the NEON copy of the float kernels; a Cortex-A8 has NEON without VFPv4
# (no fused multiply-add): the baseline, scalar VFP code.  The int8 GEMM is the portable one on all.
# qemu CPU model -> (name, NEON, VFPv4)
PI_CPUS_32 = {"cortex-a7": ("rpi2", True, True), "cortex-a15": ("a15", True, True), "cortex-a8": ("a8", True, False)}
PI_CHOICE_32 = {"cortex-a7": ("neon", "portable"), "cortex-a15": ("neon", "portable"),
                "cortex-a8": ("baseline", "portable")}

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
exact, timing, nbits, level_err = {}, {}, {}, {}
if native.available:
    import time
    rng = np.random.default_rng(0)
    for level in ("best", "dotprod", "neon", "baseline"):
        got = native.select_isa(level)
        # the float kernels of this level (32-bit ARM: the NEON copy or the scalar baseline) against onnxruntime
        errs = []
        for case in (name, "conv_block", "conv_strided", "ppocr_cls"):
            d = np.load(f"{art}/{case}.npz")
            outs = [k[4:] for k in d.files if k.startswith("out.")]
            ys = minirt.Session(f"{art}/{case}.mrt").run(outs, {k[3:]: d[k] for k in d.files if k.startswith("in.")})
            errs.append(max(float(np.abs(a - d["out." + o]).max()) for a, o in zip(ys, outs) if a.dtype.kind == "f"))
        level_err[got] = max(errs)
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
                  "exact": exact, "nbits": nbits, "level_err": level_err, "qgemm_64x288x200_ms": timing}))
"""


@pytest.mark.parametrize("cpu", list(PI_CPUS_32 if ARM32 else PI_CPUS))
def test_one_install_on_every_pi_cpu(artifacts, cpu):
    """The same build picks its kernels at run time: qemu emulates each Pi's CPU (QEMU_CPU).

    arm64: Pi 3/4 (A53/A72): "neon" with the portable int8 GEMM; Pi 5 (A76, asimddp): the SDOT
    int8 GEMM.  32-bit ARM: the NEON copy of the float kernels where the CPU has NEON and VFPv4, the
    baseline elsewhere.  On each, every level's float kernels match onnxruntime and its int8 GEMM is
    exact against numpy."""
    if os.environ.get("MINIRT_ARM64_EMULATED") != "1":
        pytest.skip("only under qemu-user (make test-arm64 / make test-arm32)")
    import subprocess
    import sys

    if ARM32:
        pi, neon, vfpv4 = PI_CPUS_32[cpu]
        dotprod, choice = False, PI_CHOICE_32[cpu]
    else:
        (pi, dotprod), choice = PI_CPUS[cpu], PI_CHOICE[cpu]
    case = "digits_rpi3-armhf" if ARM32 else f"digits_{pi}"
    proc = subprocess.run([sys.executable, "-c", _ON_ONE_CPU, str(artifacts), case],
                          env=dict(os.environ, QEMU_CPU=cpu), capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{pi} ({cpu}): {got}")
    assert got["err"] < 1e-4
    if os.environ.get("MINIRT_EXPECT_NATIVE") == "1":
        assert got["available"]
        assert got["features"]["neon"] is True
        assert got["features"]["asimddp"] is dotprod
        if ARM32:
            assert got["features"]["fma"] is vfpv4
        assert (got["isa"], got["qgemm_isa"]) == choice, got["describe"]
        assert f"int8 GEMM {choice[1]}" in got["describe"]
        # best, dotprod (-> neon without the dot product), neon, baseline: all exact
        assert len(got["exact"]) == 4 and all(got["exact"].values()), got["exact"]
        assert ("best->dotprod/dotprod" in got["exact"]) is dotprod
        assert "baseline->baseline/portable" in got["exact"]
        # every level's float kernels within the subset's float bound of onnxruntime
        assert set(got["level_err"]) == ({"neon", "baseline"} | ({"dotprod"} if dotprod else set())
                                         if choice[0] != "baseline" else {"baseline"}), got["level_err"]
        assert all(e < 1e-4 for e in got["level_err"].values()), got["level_err"]
        # MatMulNBits: SDOT on the A76, NEON widening multiplies on A53/A72, plain C (and on 32-bit ARM): all
        # match numpy
        assert got["nbits"] and all(got["nbits"].values()), got["nbits"]
        assert ("dotprod" in got["nbits"]) is dotprod and "baseline" in got["nbits"]
        assert ("neon" in got["nbits"]) is (choice[0] != "baseline")


def test_baseline_forced_on_pi5():
    """MINIRT_NATIVE_ISA=baseline wins over the dot product on a Cortex-A76 (32-bit ARM: over NEON on a
    Cortex-A7)."""
    if os.environ.get("MINIRT_ARM64_EMULATED") != "1" or os.environ.get("MINIRT_EXPECT_NATIVE") != "1":
        pytest.skip("only under qemu-user with the native kernels (make test-arm64 / make test-arm32)")
    import subprocess
    import sys

    feature = "neon" if ARM32 else "asimddp"
    code = f"from minirt import native; print(native.isa, native.qgemm_isa, native.features['{feature}'])"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, QEMU_CPU="cortex-a7" if ARM32 else "cortex-a76",
                                   MINIRT_NATIVE_ISA="baseline"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["baseline", "portable", "True"], proc.stdout


def test_int4_decoder_generates_the_tokens_of_x86(artifacts, manifest):
    """The subset's language model (tests/arm64/subset.py, DECODER): the greedy tokens minirt.genai chooses
    here are the ones it chose on the x86-64 host (the same as onnxruntime-genai's there for this model,
    recorded beside them), native 4-bit products and attention of this CPU included."""
    dec = manifest.get("decoder")
    if dec is None:
        pytest.skip("no decoder prepared: the host lacks onnxruntime-genai / transformers / torch")
    import minirt.genai as mg

    tokens = greedy_tokens(mg, mg.Model(str(artifacts / dec["folder"])), dec["prompt"], len(dec["x86"]))
    assert dec["x86"] == dec["onnxruntime_genai"], "minirt and onnxruntime-genai disagreed on the host already"
    assert tokens == dec["x86"], f"{MACHINE}: first difference at token {next(i for i, (a, b) in enumerate(zip(tokens, dec['x86'])) if a != b)}"

