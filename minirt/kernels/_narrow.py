"""Conversions to and from the narrow element types held with ``ml_dtypes``.

numpy's ``astype`` through ml_dtypes already rounds to nearest even; what it
does not do is ONNX's *saturating* float8 conversion (out-of-range values and
infinities become the largest finite value) or the float8e8m0 rounding modes,
and it wraps rather than clamps when a quantizer produces int4/uint4/int2/uint2
values.  Nothing here imports ml_dtypes: every function looks at dtypes that
already exist (an array of such a type means ml_dtypes is loaded), so models
without narrow types stay numpy-only.
"""
from __future__ import annotations

import numpy as np

FLOAT8_NAMES = frozenset({"float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"})
E8M0_NAME = "float8_e8m0fnu"
FLOAT4_NAME = "float4_e2m1fn"
NARROW_FLOAT_NAMES = FLOAT8_NAMES | {E8M0_NAME, FLOAT4_NAME, "bfloat16"}
# name -> (min, max) of the sub-byte integer types
SUBBYTE_INT_RANGE = {"int4": (-8, 7), "uint4": (0, 15), "int2": (-2, 1), "uint2": (0, 3)}
# Largest finite value of each float8 / float4 type.
_FINITE_MAX = {
    "float8_e4m3fn": 448.0,
    "float8_e4m3fnuz": 240.0,
    "float8_e5m2": 57344.0,
    "float8_e5m2fnuz": 57344.0,
    "float4_e2m1fn": 6.0,
}


def is_narrow_float(dt: np.dtype) -> bool:
    # ml_dtypes' types are user-defined numpy dtypes (isbuiltin == 2); numpy's own never are, and
    # checking that first skips ``dtype.name`` (built in Python by numpy: ~2 us) on every hot call
    dt = np.dtype(dt)
    return dt.isbuiltin == 2 and dt.name in NARROW_FLOAT_NAMES


def is_subbyte_int(dt: np.dtype) -> bool:
    dt = np.dtype(dt)
    return dt.isbuiltin == 2 and dt.name in SUBBYTE_INT_RANGE


def is_float_like(dt: np.dtype) -> bool:
    """A floating-point type, numpy's own or a narrow ml_dtypes one."""
    dt = np.dtype(dt)
    return dt.kind == "f" or is_narrow_float(dt)


def widen(x: np.ndarray) -> np.ndarray:
    """A narrow-typed array as float32 (floats) or int8/uint8 (sub-byte ints); others unchanged."""
    name = x.dtype.name
    if name in NARROW_FLOAT_NAMES:
        return x.astype(np.float32)
    if name in SUBBYTE_INT_RANGE:
        return x.astype(np.int8 if name.startswith("int") else np.uint8)
    return x


def to_float8(x: np.ndarray, dtype: np.dtype, saturate: int = 1) -> np.ndarray:
    """Cast a float array to a float8 / float4 type, rounding to nearest even.

    ``saturate`` (the default) maps infinities and values beyond the type's
    range to +/- its largest finite value; without it they become what the
    type uses for overflow (inf for e5m2, NaN for the others).
    """
    dtype = np.dtype(dtype)
    xf = np.asarray(x)
    if xf.dtype.kind != "f" or xf.dtype.itemsize < 4:
        xf = xf.astype(np.float32)
    if saturate:
        m = xf.dtype.type(_FINITE_MAX[dtype.name])
        xf = np.clip(xf, -m, m)  # NaN stays NaN
    return xf.astype(dtype)


def to_e8m0(x: np.ndarray, dtype: np.dtype, saturate: int = 1, round_mode: str = "up") -> np.ndarray:
    """Cast to float8e8m0 (a bare power of two 2**k, k in [-127, 127]; 0xFF is NaN).

    ``round_mode`` picks between the two powers of two around a value: "up"
    (away from zero), "down" (towards zero) or "nearest" (the nearer one by
    the float32 mantissa, ties up).  With ``saturate`` zero, tiny values and
    infinities/large values clamp to 2**-127 / 2**127; without it they are NaN.
    """
    if round_mode not in ("up", "down", "nearest"):
        raise ValueError(f"Cast: round_mode must be 'up', 'down' or 'nearest', got {round_mode!r}")
    xf = np.asarray(x).astype(np.float64)
    mant, exp = np.frexp(xf)  # xf = mant * 2**exp, 0.5 <= |mant| < 1
    exact = mant == 0.5
    k = exp.astype(np.int64) - 1  # floor(log2 x) for positive finite x
    if round_mode == "up":
        k = np.where(exact, k, k + 1)
    elif round_mode == "nearest":
        # float32 mantissa: round up when its top fraction bit is set (value >= 1.5 * 2**k)
        k = np.where(mant >= 0.75, k + 1, k)
    finite_pos = np.isfinite(xf) & (xf > 0)
    bits = np.clip(k, -127, 127) + 127
    if saturate:
        bits = np.where((xf == 0) | (finite_pos & (k < -127)), 0, bits)
        bits = np.where(np.isposinf(xf) | (finite_pos & (k > 127)), 254, bits)
        bad = np.isnan(xf) | (xf < 0)
    else:
        bad = ~finite_pos | (k < -127) | (k > 127)
    bits = np.where(bad, 255, bits).astype(np.uint8)
    return bits.view(np.dtype(dtype))


def to_subbyte_int(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Clamp (already rounded) values to a sub-byte integer type's range and convert."""
    dtype = np.dtype(dtype)
    lo, hi = SUBBYTE_INT_RANGE[dtype.name]
    return np.clip(values, lo, hi).astype(np.int8).astype(dtype)


def cast(x: np.ndarray, dtype: np.dtype, saturate: int = 1, round_mode: str = "up") -> np.ndarray | None:
    """ONNX Cast when either side is a narrow type; ``None`` if neither is."""
    dtype = np.dtype(dtype)
    src = x.dtype
    if dtype.name in FLOAT8_NAMES or dtype.name == FLOAT4_NAME:
        if src.kind == "b" or src.kind in "iu" or is_subbyte_int(src):
            return to_float8(widen(x).astype(np.float32), dtype, saturate)
        return to_float8(widen(x), dtype, saturate)
    if dtype.name == E8M0_NAME:
        return to_e8m0(widen(x), dtype, saturate, round_mode)
    if not (is_narrow_float(dtype) or is_subbyte_int(dtype) or is_narrow_float(src) or is_subbyte_int(src)):
        return None
    if src.kind == "b" or dtype.kind == "b":
        return widen(x).astype(np.float32).astype(dtype) if dtype.kind != "b" else widen(x) != 0
    if is_narrow_float(src) and dtype.kind in "iu":
        return widen(x).astype(dtype)
    return x.astype(dtype)
