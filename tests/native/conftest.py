from __future__ import annotations

import contextlib

import pytest

from minirt import native


@contextlib.contextmanager
def numpy_path():
    """Run the numpy implementation of the kernels (the reference for the native ones)."""
    saved = native.available
    native.available = False
    try:
        yield
    finally:
        native.available = saved


requires_native = pytest.mark.skipif(not native.available, reason=f"native kernels not available: {native.reason}")


@pytest.fixture(params=["best", "baseline"])
def isa(request):
    """Each test runs with the best implementation for this CPU and with the baseline one."""
    if not native.available:
        pytest.skip(f"native kernels not available: {native.reason}")
    before = native.isa
    chosen = native.select_isa(request.param)
    if request.param == "best" and chosen == "baseline" and request.node.get_closest_marker("needs_simd"):
        pytest.skip("no SIMD implementation for this CPU")
    yield chosen
    native.select_isa(before if before in ALL_ISAS else "baseline")


# Every implementation level minirt has, on any architecture (x86-64: avx512, avx2; aarch64: dotprod,
# neon); the ones this CPU lacks are skipped.  "avx512" takes the AMX int8 GEMM where the CPU has it
# (native.qgemm_isa "amx").
ALL_ISAS = ("avx512", "avx2", "dotprod", "neon", "baseline")
# ... and for the int8 GEMM's tests (test_int8.py), "avx512-vnni" too: that level without AMX, run only
# where it differs (the float kernels are the same, so the other tests do not repeat it).
INT8_ISAS = ("avx512", "avx512-vnni", "avx2", "dotprod", "neon", "baseline")


def run_on_level(request):
    """The body of the every_isa fixtures: select request.param, skip where this CPU lacks it, yield the
    level's name, select the level in use before again."""
    if not native.available:
        pytest.skip(f"native kernels not available: {native.reason}")
    before = _current_level()
    chosen = native.select_isa(request.param)
    if request.param == "avx512-vnni":  # (select_isa returns the float kernels' level: avx512)
        chosen = request.param if chosen == "avx512" and _amx_host() else f"{chosen} (no AMX here to leave out)"
    try:
        if chosen != request.param:
            pytest.skip(f"{request.param} is not available on this CPU (got {chosen})")
        yield chosen
    finally:
        native.select_isa(before)


@pytest.fixture(params=ALL_ISAS)
def every_isa(request):
    """Each test runs on every implementation this CPU can run (x86 hosts see only the x86 ones)."""
    yield from run_on_level(request)


def _amx_host() -> bool:
    """Whether "avx512" takes the AMX int8 GEMM here (then "avx512-vnni" is a path of its own)."""
    return bool(native.features.get("amx")) and native.isa == "avx512" and native.qgemm_isa in ("amx", "vnni")


def _current_level() -> str:
    """The select_isa name that brings back the implementation in use now."""
    if native.isa == "avx512" and native.qgemm_isa == "vnni" and native.features.get("amx"):
        return "avx512-vnni"
    return native.isa if native.isa in INT8_ISAS else "baseline"


@pytest.fixture(params=[1, 2, 3])
def threads(request):
    before = native.threads()
    native.set_threads(request.param)
    yield request.param
    native.set_threads(before)


def run_under_scratch_limit(fn, nbytes: int):
    """``fn()`` on a new thread (the native scratch is per thread and kept, so a new one starts empty and the
    bound applies to it) under ``native.set_scratch_limit(nbytes)``; returns its result, its exception
    raised here; then the bound the sessions last set, or none."""
    import threading

    from minirt.kernels import _limits

    results, failures = [], []

    def run():
        try:
            results.append(fn())
        except BaseException as exc:  # noqa: BLE001 - raised below, on the test's thread
            failures.append(exc)

    try:
        native.set_scratch_limit(nbytes)
        worker = threading.Thread(target=run)
        worker.start()
        worker.join()
    finally:
        native.set_scratch_limit(_limits._scratch_limit if _limits._scratch_limit >= 0 else 2**63 - 1)
    if failures:
        raise failures[0]
    return results[0]

