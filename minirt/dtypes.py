"""ONNX TensorProto element-type codes <-> numpy dtypes.

Only the types minirt can hold in a numpy array are mapped.  bfloat16 (16)
and the float8 family have no numpy dtype and are deliberately absent:
looking them up raises ``ValueError`` via :func:`numpy_dtype`.
"""
from __future__ import annotations

import numpy as np

# TensorProto.DataType code -> numpy dtype.  STRING (8) is held as object arrays.
ONNX_TO_NUMPY: dict[int, np.dtype] = {
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

# numpy dtype -> TensorProto code.  numpy's unicode/bytes string dtypes also map
# to STRING so that arrays built from Python strings are accepted.
NUMPY_TO_ONNX: dict[np.dtype, int] = {dt: code for code, dt in ONNX_TO_NUMPY.items()}

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
        raise ValueError(f"ONNX element type {name} is not supported by minirt") from None


def onnx_code(dtype: np.dtype | type) -> int:
    """The ONNX element type code for a numpy dtype; ValueError if unsupported."""
    dt = np.dtype(dtype)
    if dt.kind in ("U", "S", "O"):
        return 8
    try:
        return NUMPY_TO_ONNX[dt]
    except KeyError:
        raise ValueError(f"numpy dtype {dt} has no ONNX element type") from None
