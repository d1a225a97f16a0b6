"""mrt_prefault (kernels.c): the pages of a buffer backed in one call (MADV_POPULATE_WRITE) or touched
one by one, its contents kept: arenas are prefaulted when made, and a native program's own buffers,
which hold the recording run's results, when it is built (D92)."""
from __future__ import annotations

import mmap

import numpy as np
import pytest

from minirt import native

pytestmark = pytest.mark.skipif(not native.available, reason="native module not available")


@pytest.mark.parametrize("offset, nbytes", [(0, 1), (3, 4093), (1, 3 * 4096 + 5), (4096, 1 << 20)])
def test_prefault_keeps_the_contents_of_any_range(offset, nbytes):
    buf = np.frombuffer(mmap.mmap(-1, (1 << 20) + 3 * 4096), dtype=np.uint8)
    rng = np.random.default_rng(nbytes)
    part = buf[offset:offset + nbytes]
    part[:] = rng.integers(1, 256, nbytes, dtype=np.uint8)  # (no zero: a zeroed byte would show)
    before = part.copy()
    populated = native.prefault(part)
    assert isinstance(populated, bool)
    np.testing.assert_array_equal(part, before)


def test_prefault_of_fresh_memory_backs_it_and_of_nothing_is_a_no_op():
    fresh = np.frombuffer(mmap.mmap(-1, 64 * 4096), dtype=np.uint8)
    native.prefault(fresh)
    assert not fresh.any()  # (anonymous memory reads zeros, backed or not)
    assert native.prefault(np.empty(0, np.uint8)) is False
    assert native.prefault_span(100, 100) is False
