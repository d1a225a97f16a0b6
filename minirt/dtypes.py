"""ONNX TensorProto element-type codes <-> numpy dtypes.

The standard numpy types are always mapped.  The narrow types ONNX added for
quantisation and training -- bfloat16, the float8 family, int4/uint4,
int2/uint2, float4 -- have no numpy dtype of their own; minirt holds them with
the ``ml_dtypes`` package, imported lazily the first time such a code is
looked up, so ``import minirt`` and every model without those types stay
numpy-only.  Without ml_dtypes installed those codes are simply absent and
:func:`numpy_dtype` explains what to install.

Sub-byte types (int4, uint4, int2, uint2, float4) are held unpacked, one
element per byte, both in memory and in the .mrt tensor-data section.
"""
from __future__ import annotations

import numpy as np

# ONNX code -> ml_dtypes attribute name, for the types numpy lacks.
_EXTENDED_NAMES: dict[int, str] = {
    16: "bfloat16",
    17: "float8_e4m3fn",
    18: "float8_e4m3fnuz",
    19: "float8_e5m2",
    20: "float8_e5m2fnuz",
    21: "uint4",
    22: "int4",
    23: "float4_e2m1fn",
    24: "float8_e8m0fnu",
    25: "uint2",
    26: "int2",
}
EXTENDED_CODES = frozenset(_EXTENDED_NAMES)


class _CodeToDtype(dict):
    """code -> dtype; extended codes resolve through ml_dtypes on first use."""

    _loaded = False

    def _load_extended(self) -> bool:
        if not self._loaded:
            type(self)._loaded = True
            try:
                import ml_dtypes
            except ImportError:
                return False
            for code, name in _EXTENDED_NAMES.items():
                dt = np.dtype(getattr(ml_dtypes, name, None)) if hasattr(ml_dtypes, name) else None
                if dt is not None:
                    dict.__setitem__(self, code, dt)
                    dict.__setitem__(NUMPY_TO_ONNX, dt, code)
        return True

    def __missing__(self, code):
        if code in _EXTENDED_NAMES and self._load_extended() and dict.__contains__(self, code):
            return dict.__getitem__(self, code)
        raise KeyError(code)

    def __contains__(self, code) -> bool:
        if dict.__contains__(self, code):
            return True
        return code in _EXTENDED_NAMES and self._load_extended() and dict.__contains__(self, code)

    def get(self, code, default=None):
        try:
            return self[code]
        except (KeyError, TypeError):
            return default


# TensorProto.DataType code -> numpy dtype.  STRING (8) is held as object arrays.
ONNX_TO_NUMPY: dict[int, np.dtype] = _CodeToDtype(
    {
        1: np.dtype(np.float32),
        2: np.dtype(np.uint8),
        3: np.dtype(np.int8),
        4: np.dtype(np.uint16),
        5: np.dtype(np.int16),
        6: np.dtype(np.int32),
        7: np.dtype(np.int64),
        8: np.dtype(object),
        9: np.dtype(np.bool_),
        10: np.dtype(np.float16),
        11: np.dtype(np.float64),
        12: np.dtype(np.uint32),
        13: np.dtype(np.uint64),
    }
)

# numpy dtype -> TensorProto code.  ml_dtypes types join once they are loaded
# (an array of such a type can only exist after ml_dtypes was imported).
NUMPY_TO_ONNX: dict[np.dtype, int] = {dt: code for code, dt in dict.items(ONNX_TO_NUMPY)}


def _extended_code(dt: np.dtype) -> int | None:
    for code, name in _EXTENDED_NAMES.items():
        if dt.name == name:
            ONNX_TO_NUMPY.get(code)  # registers the ml_dtypes types in both tables
            return code
    return None


# Names as they appear in onnxruntime type strings, e.g. 'tensor(float)'.
_ONNX_TYPE_NAMES: dict[int, str] = {
    1: "float",
    2: "uint8",
    3: "int8",
    4: "uint16",
    5: "int16",
    6: "int32",
    7: "int64",
    8: "string",
    9: "bool",
    10: "float16",
    11: "double",
    12: "uint32",
    13: "uint64",
    16: "bfloat16",
    17: "float8e4m3fn",
    18: "float8e4m3fnuz",
    19: "float8e5m2",
    20: "float8e5m2fnuz",
    21: "uint4",
    22: "int4",
    23: "float4e2m1",
    24: "float8e8m0",
    25: "uint2",
    26: "int2",
}


def onnx_type_name(code: int) -> str:
    """The onnxruntime name of ONNX element type ``code`` (1 -> 'float')."""
    try:
        return _ONNX_TYPE_NAMES[int(code)]
    except KeyError:
        raise ValueError(f"unknown or unsupported ONNX element type code {code}") from None


def numpy_dtype(code: int) -> np.dtype:
    """The numpy dtype for ONNX element type ``code``; ValueError if unsupported."""
    try:
        return ONNX_TO_NUMPY[int(code)]
    except KeyError:
        name = _ONNX_TYPE_NAMES.get(int(code), str(code))
        if int(code) in _EXTENDED_NAMES:
            raise ValueError(
                f"ONNX element type {name} needs the ml_dtypes package, which is not installed "
                f"(pip install ml_dtypes)"
            ) from None
        raise ValueError(f"ONNX element type {name} is not supported by minirt") from None


def onnx_code(dtype: np.dtype | type) -> int:
    """The ONNX element type code for a numpy dtype; ValueError if unsupported."""
    dt = np.dtype(dtype)
    if dt.kind in ("U", "S", "O"):
        return 8
    try:
        return NUMPY_TO_ONNX[dt]
    except KeyError:
        code = _extended_code(dt)
        if code is not None:
            return code
        raise ValueError(f"numpy dtype {dt} has no ONNX element type") from None
