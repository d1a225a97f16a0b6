"""Fixtures shared by the kernel tests."""
from __future__ import annotations

import pytest

from minirt import native


@pytest.fixture(params=["native", "native-baseline", "numpy"])
def path(request, monkeypatch):
    """Which implementation the kernel takes: the native kernels at the best ISA, at the baseline ISA,
    or numpy alone (native switched off)."""
    if request.param == "numpy":
        monkeypatch.setattr(native, "available", False)
        yield "numpy"
        return
    if not native.available:
        pytest.skip(f"native kernels not available: {native.reason}")
    before = native.isa
    native.select_isa("baseline" if request.param == "native-baseline" else "best")
    try:
        yield request.param
    finally:
        native.select_isa(before)
