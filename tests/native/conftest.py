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
    native.select_isa(before if before in ("avx512", "avx2") else "baseline")


@pytest.fixture(params=[1, 2, 3])
def threads(request):
    before = native.threads()
    native.set_threads(request.param)
    yield request.param
    native.set_threads(before)
