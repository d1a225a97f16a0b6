"""The project's vocabulary, declared once: fused activations (with their native enum member),
op families and the execution-provider table.

Every other registry reads from here: the runtime's kernels and providers, the native wrappers, the
builder's passes and build options, the target lowerings, FLOPs estimates and profiles.  Where a
registry legitimately covers less (the ops one lowering handles, the ones a pass walks through), it
says so next to its definition and ``tests/test_vocabulary.py`` checks the subset relation; every
other registry must equal its table here, and the same test fails when one of them drifts.

Adding an op to a family changes every reader at once: that is the point, so check the readers
(``grep -rn "vocabulary" minirt builder targets``) before growing one.

Runtime module: it imports nothing but the standard library (``import minirt`` must stay light).
"""
from __future__ import annotations

import collections


Activation = collections.namedtuple("Activation", "name params native onnx_op", defaults=(None,))
Activation.__doc__ = """A fused activation, as named in the ``activation`` attribute of the com.minirt fused ops.

``params``: how many float parameters it takes (``activation_params``), in order.
``native``: the member of the C enum in ``minirt/native/kernels.h`` that computes it in the
native epilogues (its numeric value is read from the compiled module, never written here),
or None where only numpy computes it.
``onnx_op``: the standard ONNX op that computes it (its attributes or inputs carry the params; Gelu's
``approximate`` picks Gelu or GeluTanh), which ``fuse_activation`` folds into a producer; None
(the default) where no single ONNX op does (SiLU comes from ``recognise_activations``).
"""


# Invariant: the empty name is "no activation"; every ``native`` name exists in kernels.h
# (checked by tests/test_vocabulary.py against what cffi reads).
ACTIVATIONS: dict[str, Activation] = {a.name: a for a in (
    Activation("", 0, "MRT_ACT_NONE"),
    Activation("Relu", 0, "MRT_ACT_RELU", "Relu"),
    Activation("Clip", 2, "MRT_ACT_CLIP", "Clip"),                 # min(max(x, a0), a1)
    Activation("LeakyRelu", 1, "MRT_ACT_LEAKY", "LeakyRelu"),      # x >= 0 ? x : a0 * x
    Activation("Sigmoid", 0, "MRT_ACT_SIGMOID", "Sigmoid"),
    Activation("SiLU", 0, "MRT_ACT_SILU"),                         # x * sigmoid(x)
    Activation("HardSigmoid", 2, "MRT_ACT_HARDSIGMOID", "HardSigmoid"),  # max(0, min(1, a0 * x + a1))
    Activation("HardSwish", 0, "MRT_ACT_HARDSWISH", "HardSwish"),  # x * hardsigmoid(x, 1/6, 1/2)
    Activation("Gelu", 0, "MRT_ACT_GELU", "Gelu"),                 # exact (erf)
    Activation("GeluTanh", 0, "MRT_ACT_GELU_TANH", "Gelu"),        # tanh approximation
    Activation("Tanh", 0, "MRT_ACT_TANH", "Tanh"),
)}

NATIVE_ACTIVATIONS = frozenset(name for name, a in ACTIVATIONS.items() if a.native is not None)

# The ONNX ops ``fuse_activation`` folds into a Conv / ConvTranspose / Gemm / MatMul epilogue.
FUSABLE_ACTIVATION_OPS = frozenset(a.onnx_op for a in ACTIVATIONS.values() if a.onnx_op is not None)

# Gate activations of the recurrent ops (RNN, GRU, LSTM ``activations`` attribute), in the ONNX
# spelling; matched case-insensitively (minirt/kernels/rnn.py).  A vocabulary of its own: these
# are not fused-activation names.
RNN_ACTIVATIONS = frozenset({
    "Relu", "Tanh", "Sigmoid", "Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh", "HardSigmoid", "Elu",
    "Softsign", "Softplus",
})


# --- op families ------------------------------------------------------------------------------
# ONNX default-domain op types unless said otherwise.  Every op of every family in FAMILIES has a
# kernel in the runtime (tests/test_vocabulary.py checks minirt/kernels/_index.py).

MINIRT_DOMAIN = "com.minirt"  # minirt's own ops (docs/fused_ops.md)
# the com.minirt node that stands for a partition built without its CPU version (docs/format.md, "Partitions")
DELEGATED_PARTITION = "DelegatedPartition"

# Elementwise with broadcasting inputs.
ARITHMETIC = frozenset({"Add", "Sub", "Mul", "Div"})  # also the native binary kernel's four (MRT_BINARY_*)
BINARY_MATH = ARITHMETIC | {"Pow", "Max", "Min", "Mod"}  # Max / Min are variadic in ONNX
COMPARISON = frozenset({"Equal", "Less", "Greater"})
LOGICAL = frozenset({"And", "Or", "Not"})
# Elementwise, one input.
UNARY_MATH = frozenset({"Abs", "Neg", "Sqrt", "Reciprocal", "Floor", "Ceil", "Round", "Sign", "Exp", "Log", "Erf"})
# Activation ops: the result has the input's shape (PRelu's slope broadcasts to it).  The fused
# activations (ACTIVATIONS) cover FUSABLE_ACTIVATION_OPS of them.
ACTIVATION_OPS = frozenset({
    "Relu", "LeakyRelu", "PRelu", "Clip", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Gelu", "Elu", "Selu",
    "Softplus", "Mish",
})
ELEMENTWISE = BINARY_MATH | COMPARISON | LOGICAL | UNARY_MATH | ACTIVATION_OPS | {"Where", "Cast"}

# Normalisations over an axis.
SOFTMAX = frozenset({"Softmax", "LogSoftmax"})
NORMALIZATION = frozenset({"BatchNormalization", "InstanceNormalization", "LayerNormalization", "GroupNormalization"})
REDUCE = frozenset({
    "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceL1", "ReduceSumSquare",
})
POOL = frozenset({"MaxPool", "AveragePool", "LpPool"})
GLOBAL_POOL = frozenset({"GlobalAveragePool", "GlobalMaxPool"})

# Shape-only ops: the result is the input's data in the same order (a view where the runtime can).
RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})

# Ops whose result is drawn at random: never folded at build time, never merged by CSE.
RANDOM = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"})

# Producers with a com.minirt fused form (a residual input and an activation epilogue,
# docs/fused_ops.md); FusedConvTranspose takes the activation only.
FUSED_FORMS: dict[str, str] = {
    "Conv": "FusedConv", "ConvTranspose": "FusedConvTranspose", "Gemm": "FusedGemm", "MatMul": "FusedMatMul",
}

FAMILIES: dict[str, frozenset] = {
    "ARITHMETIC": ARITHMETIC, "BINARY_MATH": BINARY_MATH, "COMPARISON": COMPARISON, "LOGICAL": LOGICAL,
    "UNARY_MATH": UNARY_MATH, "ACTIVATION_OPS": ACTIVATION_OPS, "ELEMENTWISE": ELEMENTWISE, "SOFTMAX": SOFTMAX,
    "NORMALIZATION": NORMALIZATION, "REDUCE": REDUCE, "POOL": POOL, "GLOBAL_POOL": GLOBAL_POOL,
    "RESHAPES": RESHAPES, "RANDOM": RANDOM, "FUSABLE_ACTIVATION_OPS": FUSABLE_ACTIVATION_OPS,
}


# --- execution providers ----------------------------------------------------------------------

Provider = collections.namedtuple("Provider", "name ort_name runtime spec requires always_available")
Provider.__doc__ = """One execution provider, as every registry names it.

``name``: the short name in artifacts, build options, the CLI, target profiles and sessions.  The
.mrt format stores it as a string in each partition record (docs/format.md, "Partitions"): it
has no numeric code, and renaming a provider orphans the artifacts already built for it.
``ort_name``: the onnxruntime spelling ``Session(providers=...)`` also accepts (any case);
None where onnxruntime has no such provider.
``runtime``: ``"module:Class"`` of the runtime provider, imported on first use (None: the CPU,
which the session runs itself).
``spec``: ``"module:Class"`` of the builder's lowering (``targets.providers.ProviderSpec``).
``requires``: top-level modules the runtime side needs, any one of them (empty: none).
``always_available``: True only for the CPU, the fallback for whatever no provider takes.
"""


CPU = "cpu"

PROVIDERS: dict[str, Provider] = {p.name: p for p in (
    Provider(CPU, "CPUExecutionProvider", None, None, (), True),
    Provider("coreml", "CoreMLExecutionProvider", "minirt.providers.coreml:CoreMLProvider",
             "minirt.targets.coreml:CoreMLSpec", ("coremltools",), False),
    Provider("nnapi", "NnapiExecutionProvider", "minirt.providers.nnapi:NNAPIProvider",
             "minirt.targets.nnapi:NNAPISpec", ("cffi",), False),
    Provider("tflite", None, "minirt.providers.tflite:TFLiteProvider",
             "minirt.targets.tflite:TFLiteSpec", ("ai_edge_litert", "tflite_runtime", "tensorflow"), False),
)}

# The accelerators in table order (the order build errors and help texts list them, the CPU last).
ACCELERATORS: tuple[str, ...] = tuple(name for name in PROVIDERS if name != CPU)
