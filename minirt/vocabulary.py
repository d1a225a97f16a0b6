"""The project's vocabulary, declared once: fused activations (with their native enum member),
op families and the execution-provider table.

Every other registry reads from here: the runtime's kernels, the native wrappers, the builder's
passes and the target lowerings.  ``tests/test_vocabulary.py`` fails when one of them drifts.

Runtime module: it imports nothing but the standard library (``import minirt`` must stay light).
"""
from __future__ import annotations

from typing import NamedTuple


class Activation(NamedTuple):
    """A fused activation, as named in the ``activation`` attribute of the com.minirt fused ops.

    ``params``: how many float parameters it takes (``activation_params``), in order.
    ``native``: the member of the C enum in ``minirt/native/kernels.h`` that computes it in the
    native epilogues (its numeric value is read from the compiled module, never written here),
    or None where only numpy computes it.
    """

    name: str
    params: int
    native: str | None


# Invariant: the empty name is "no activation"; every ``native`` name exists in kernels.h
# (checked by tests/test_vocabulary.py against what cffi reads).
ACTIVATIONS: dict[str, Activation] = {a.name: a for a in (
    Activation("", 0, "MRT_ACT_NONE"),
    Activation("Relu", 0, "MRT_ACT_RELU"),
    Activation("Clip", 2, "MRT_ACT_CLIP"),            # min(max(x, a0), a1)
    Activation("LeakyRelu", 1, "MRT_ACT_LEAKY"),      # x >= 0 ? x : a0 * x
    Activation("Sigmoid", 0, "MRT_ACT_SIGMOID"),
    Activation("SiLU", 0, "MRT_ACT_SILU"),            # x * sigmoid(x)
    Activation("HardSigmoid", 2, "MRT_ACT_HARDSIGMOID"),  # max(0, min(1, a0 * x + a1))
    Activation("HardSwish", 0, "MRT_ACT_HARDSWISH"),  # x * hardsigmoid(x, 1/6, 1/2)
    Activation("Gelu", 0, "MRT_ACT_GELU"),            # exact (erf)
    Activation("GeluTanh", 0, "MRT_ACT_GELU_TANH"),   # tanh approximation
    Activation("Tanh", 0, None),
)}

NATIVE_ACTIVATIONS = frozenset(name for name, a in ACTIVATIONS.items() if a.native is not None)
