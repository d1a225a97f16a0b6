"""The folding constants of the x86-64 CRC-32 (minirt/native/crc32_impl.h), derived here from the
polynomial, and the loader's use of the native CRC (equality with zlib: tests/arm64/test_crc32.py)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from minirt import native

HEADER = Path(native.__file__).with_name("crc32_impl.h")
POLY = 0x104C11DB7  # x^32 + x^26 + ... + 1, the CRC-32 polynomial of zlib (normal bit order)


def _x_pow_mod(e: int) -> int:
    """x^e mod P, by repeated multiplication by x."""
    r = 1
    for _ in range(e):
        r <<= 1
        if r >> 32:
            r ^= POLY
    return r


def _reflect33(v: int) -> int:
    """v (< 2^32) reflected over 33 bits: the one-bit shift of a product of reflected operands folded in."""
    return int(format(v, "033b")[::-1], 2)


@pytest.mark.parametrize("name,exponent", [("FOLD512_LO", 512 + 32), ("FOLD512_HI", 512 - 32),
                                           ("FOLD128_LO", 128 + 32), ("FOLD128_HI", 128 - 32)])
def test_folding_constants_are_powers_of_x_mod_p(name, exponent):
    found = re.search(rf"#define CRC32_K_{name} (0x[0-9a-f]+)ULL", HEADER.read_text())
    assert found, f"CRC32_K_{name} not in {HEADER.name}"
    assert int(found.group(1), 16) == _reflect33(_x_pow_mod(exponent))


def test_the_loader_checks_sections_with_the_native_crc(tmp_path, monkeypatch):
    from minirt.builder import build
    from minirt.errors import ChecksumError
    from minirt.format import reader

    root = Path(__file__).resolve().parents[2]
    path = tmp_path / "digits.mrt"
    build(str(root / "examples" / "digits" / "digits_cnn.onnx"), str(path))
    calls = []
    real = native.crc32
    monkeypatch.setattr(native, "crc32", lambda data, crc=0: calls.append(len(data)) or real(data, crc))
    reader.load(str(path))
    assert calls and max(calls) > 1000  # (the tensor data section among them)
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 0x01  # a flipped bit in the last section's payload
    with pytest.raises(ChecksumError, match="CRC-32"):
        reader.load(bytes(raw))
