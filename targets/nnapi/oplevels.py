"""NNAPI operation codes and the Android API level that introduced each of them.

Numbers are those of the NDK header ``NeuralNetworks.h`` (``OperationCode``,
``OperandCode``, ``FuseCode``).  ``MIN_API_LEVEL`` is the first Android API
level whose NNAPI runtime accepts the operation; the lowering also checks the
operand-level features that arrived later (dilation and the layout flag in
API 29, resize corner modes in API 30, ...) with :data:`FEATURE_API_LEVEL`.

NNAPI feature level 6 (Android 13, API 33, via the NNAPI mainline module)
added BATCH_MATMUL and PACK; feature level 7 (Android 14, API 34) added
MIRROR_PAD and REVERSE (the header's "Available since NNAPI feature level N"
of each operation).
"""
from __future__ import annotations

# --- operand types (OperandCode) -------------------------------------------
FLOAT32 = 0
INT32 = 1
UINT32 = 2
TENSOR_FLOAT32 = 3
TENSOR_INT32 = 4
TENSOR_QUANT8_ASYMM = 5
BOOL = 6
TENSOR_QUANT16_SYMM = 7
TENSOR_FLOAT16 = 8
TENSOR_BOOL8 = 9
FLOAT16 = 10
TENSOR_QUANT8_SYMM_PER_CHANNEL = 11
TENSOR_QUANT16_ASYMM = 12
TENSOR_QUANT8_SYMM = 13
TENSOR_QUANT8_ASYMM_SIGNED = 14

SCALAR_TYPES = {FLOAT32, INT32, UINT32, BOOL, FLOAT16}
OPERAND_TYPE_NAMES = {
    FLOAT32: "FLOAT32", INT32: "INT32", UINT32: "UINT32", TENSOR_FLOAT32: "TENSOR_FLOAT32",
    TENSOR_INT32: "TENSOR_INT32", TENSOR_QUANT8_ASYMM: "TENSOR_QUANT8_ASYMM", BOOL: "BOOL",
    TENSOR_QUANT16_SYMM: "TENSOR_QUANT16_SYMM", TENSOR_FLOAT16: "TENSOR_FLOAT16", TENSOR_BOOL8: "TENSOR_BOOL8",
    FLOAT16: "FLOAT16", TENSOR_QUANT8_SYMM_PER_CHANNEL: "TENSOR_QUANT8_SYMM_PER_CHANNEL",
    TENSOR_QUANT16_ASYMM: "TENSOR_QUANT16_ASYMM", TENSOR_QUANT8_SYMM: "TENSOR_QUANT8_SYMM",
    TENSOR_QUANT8_ASYMM_SIGNED: "TENSOR_QUANT8_ASYMM_SIGNED",
}
# operand type -> first API level
OPERAND_API_LEVEL = {
    FLOAT32: 27, INT32: 27, UINT32: 27, TENSOR_FLOAT32: 27, TENSOR_INT32: 27, TENSOR_QUANT8_ASYMM: 27,
    BOOL: 29, TENSOR_QUANT16_SYMM: 29, TENSOR_FLOAT16: 29, TENSOR_BOOL8: 29, FLOAT16: 29,
    TENSOR_QUANT8_SYMM_PER_CHANNEL: 29, TENSOR_QUANT16_ASYMM: 29, TENSOR_QUANT8_SYMM: 29,
    TENSOR_QUANT8_ASYMM_SIGNED: 30,
}

# --- fused activations (FuseCode) ------------------------------------------
FUSED_NONE = 0
FUSED_RELU = 1
FUSED_RELU1 = 2
FUSED_RELU6 = 3

# --- operations (OperationCode) --------------------------------------------
ADD = 0
AVERAGE_POOL_2D = 1
CONCATENATION = 2
CONV_2D = 3
DEPTHWISE_CONV_2D = 4
DEPTH_TO_SPACE = 5
DEQUANTIZE = 6
FLOOR = 8
FULLY_CONNECTED = 9
L2_NORMALIZATION = 11
LOCAL_RESPONSE_NORMALIZATION = 13
LOGISTIC = 14
MAX_POOL_2D = 17
MUL = 18
RELU = 19
RELU1 = 20
RELU6 = 21
RESHAPE = 22
RESIZE_BILINEAR = 23
SOFTMAX = 25
SPACE_TO_DEPTH = 26
TANH = 28
DIV = 30
MEAN = 31
PAD = 32
SQUEEZE = 34
STRIDED_SLICE = 35
SUB = 36
TRANSPOSE = 37
ABS = 38
EXP = 49
GATHER = 51
GREATER = 53
GROUPED_CONV_2D = 55
LESS = 58
LOG = 60
LOG_SOFTMAX = 64
MAXIMUM = 65
MINIMUM = 66
NEG = 67
PAD_V2 = 69
POW = 70
PRELU = 71
QUANTIZE = 72
REDUCE_MAX = 77
REDUCE_SUM = 80
RSQRT = 83
SELECT = 84
SLICE = 86
SPLIT = 87
SQRT = 88
TRANSPOSE_CONV_2D = 91
RESIZE_NEAREST_NEIGHBOR = 94
ELU = 98
HARD_SWISH = 99
BATCH_MATMUL = 102
MIRROR_PAD = 104

OPERATION_NAMES = {v: k for k, v in dict(globals()).items()
                   if k.isupper() and isinstance(v, int) and k not in OPERAND_TYPE_NAMES.values()
                   and not k.startswith("FUSED_") and k not in ("SCALAR_TYPES",)}

# operation -> first Android API level whose NNAPI has it
MIN_API_LEVEL = {
    # NNAPI 1.0, Android 8.1 (API 27)
    ADD: 27, AVERAGE_POOL_2D: 27, CONCATENATION: 27, CONV_2D: 27, DEPTHWISE_CONV_2D: 27, DEPTH_TO_SPACE: 27,
    DEQUANTIZE: 27, FLOOR: 27, FULLY_CONNECTED: 27, L2_NORMALIZATION: 27, LOCAL_RESPONSE_NORMALIZATION: 27, LOGISTIC: 27, MAX_POOL_2D: 27, MUL: 27,
    RELU: 27, RELU1: 27, RELU6: 27, RESHAPE: 27, RESIZE_BILINEAR: 27, SOFTMAX: 27, SPACE_TO_DEPTH: 27, TANH: 27,
    # NNAPI 1.1, Android 9 (API 28)
    DIV: 28, MEAN: 28, PAD: 28, SQUEEZE: 28, STRIDED_SLICE: 28, SUB: 28, TRANSPOSE: 28,
    # NNAPI 1.2, Android 10 (API 29)
    ABS: 29, EXP: 29, GATHER: 29, GREATER: 29, GROUPED_CONV_2D: 29, LESS: 29, LOG: 29, LOG_SOFTMAX: 29, MAXIMUM: 29,
    MINIMUM: 29, NEG: 29, SELECT: 29,
    PAD_V2: 29, POW: 29, PRELU: 29, QUANTIZE: 29, REDUCE_MAX: 29, REDUCE_SUM: 29, RSQRT: 29, SLICE: 29, SPLIT: 29,
    SQRT: 29, TRANSPOSE_CONV_2D: 29, RESIZE_NEAREST_NEIGHBOR: 29,
    # NNAPI 1.3, Android 11 (API 30)
    ELU: 30, HARD_SWISH: 30,
    # NNAPI feature level 6, Android 13 (API 33)
    BATCH_MATMUL: 33,
    # NNAPI feature level 7, Android 14 (API 34)
    MIRROR_PAD: 34,
}

# Operand-level features that arrived after the operation itself.
FEATURE_API_LEVEL = {
    "conv_dilation": 29,          # CONV_2D / DEPTHWISE_CONV_2D dilation factors (+ layout flag)
    "softmax_axis": 29,           # SOFTMAX axis parameter; API 27-28 take 2-D or 4-D input only
    "rank_1_3_softmax": 29,
    "resize_corner_modes": 30,    # RESIZE_* align_corners / half_pixel_centers
    "fc_no_bias": 29,
    "int32_arithmetic": 30,
}

LEVELS = (27, 28, 29, 30, 31, 32, 33, 34)


def operations_at(level: int) -> frozenset:
    """Operation codes an NNAPI runtime of API ``level`` accepts (of those this lowering emits)."""
    return frozenset(op for op, lv in MIN_API_LEVEL.items() if lv <= level)


def op_table() -> dict:
    """API level -> sorted operation names: the per-level op tables the android profiles reference."""
    return {lv: sorted(OPERATION_NAMES[op] for op in operations_at(lv)) for lv in LEVELS}
