"""The native CRC-32 (minirt/native/crc32_impl.h: PCLMULQDQ folding on x86-64, the CRC32X instruction
on aarch64) against zlib's, which defines the format's checksum (docs/format.md).  It runs in the
normal suite and inside the emulated Raspberry Pi (``make test-arm64``), where the ARMv8 path is taken."""
from __future__ import annotations

import os
import platform
import random
import zlib

import pytest

from minirt import native

pytestmark = pytest.mark.skipif(not native.available, reason=f"native kernels not available: {native.reason}")


def _bytes(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def _mrt_crc32(data, crc: int = 0) -> int:
    """The C function itself (``native.crc32`` takes zlib's on a CPU without the instructions: the
    bitwise fallback is tested there, the hardware path where the CPU has it)."""
    return native._lib.mrt_crc32(native._ffi.from_buffer("uint8_t[]", data), memoryview(data).nbytes, crc)


def test_the_hardware_path_is_taken_where_the_cpu_has_it():
    machine = platform.machine().lower()
    if machine in ("aarch64", "arm64") and os.environ.get("MINIRT_EXPECT_NATIVE") == "1":
        assert native._lib.mrt_crc32_hw() == 1  # (every Pi from the 3 on, and qemu's default CPU, have CRC32)
    if machine in ("x86_64", "amd64") and native.features.get("avx2"):
        assert native._lib.mrt_crc32_hw() == 1  # (every AVX2 CPU has PCLMULQDQ)
    assert native._hw_crc32 == bool(native._lib.mrt_crc32_hw())


@pytest.mark.parametrize("offset", [0, 1, 3, 8])
def test_every_length_and_alignment_matches_zlib(offset):
    # every length around the folding's block sizes (16-byte lanes, 64-byte rounds) and beyond
    data = _bytes(600 + offset, offset)
    for n in range(0, 600):
        view = memoryview(data)[offset:offset + n]
        for start in (0, 0xFFFFFFFF, 0x1234ABCD):
            assert _mrt_crc32(view, start) == zlib.crc32(view, start), (n, offset, start)


@pytest.mark.parametrize("n", [4096, 65_537, 1 << 20, (3 << 20) + 13])
def test_large_buffers_match_zlib(n):
    data = _bytes(n, n)
    assert _mrt_crc32(data) == zlib.crc32(data) == native.crc32(data)
    # continuing a CRC over two ranges is the CRC of their concatenation, as with zlib
    assert _mrt_crc32(data[n // 3:], _mrt_crc32(data[: n // 3])) == zlib.crc32(data)


def test_special_inputs():
    assert _mrt_crc32(b"123456789") == 0xCBF43926  # the standard check value
    assert _mrt_crc32(b"") == 0 and _mrt_crc32(b"", 0x5A5A5A5A) == 0x5A5A5A5A
    assert _mrt_crc32(bytes(1 << 16)) == zlib.crc32(bytes(1 << 16))
    assert _mrt_crc32(b"\xff" * 4099) == zlib.crc32(b"\xff" * 4099)
    import numpy as np

    a = np.arange(10_000, dtype=np.float32)  # any C-contiguous buffer, as the loader passes mmap slices
    assert native.crc32(a) == _mrt_crc32(a) == zlib.crc32(a.tobytes())
