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


# Every implementation level minirt has, on any architecture (x86-64: avx512, avx2;
# aarch64: dotprod, neon); the ones this CPU lacks are skipped.
ALL_ISAS = ("avx512", "avx2", "dotprod", "neon", "baseline")


@pytest.fixture(params=ALL_ISAS)
def every_isa(request):
    """Each test runs on every implementation this CPU can run (x86 hosts see only the x86 ones)."""
    if not native.available:
        pytest.skip(f"native kernels not available: {native.reason}")
    before = native.isa
    chosen = native.select_isa(request.param)
    try:
        if chosen != request.param:
            pytest.skip(f"{request.param} is not available on this CPU (got {chosen})")
        yield chosen
    finally:
        native.select_isa(before if before in ALL_ISAS else "baseline")


@pytest.fixture(params=[1, 2, 3])
def threads(request):
    before = native.threads()
    native.set_threads(request.param)
    yield request.param
    native.set_threads(before)
