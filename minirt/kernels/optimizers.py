"""Training optimizer steps of the ``ai.onnx.preview.training`` domain: Adagrad, Momentum, Adam.

Each op takes the learning rate ``R`` and update count ``T`` and then, for
n optimized tensors, the n tensors, their n gradients and their n (or 2n)
optimizer-state tensors; it returns the n new tensors followed by the new
states.  The update is elementwise, computed in float64 and rounded to each
tensor's dtype once.
"""
from __future__ import annotations

import math

import numpy as np

from minirt.kernels.registry import kernel

TRAINING = "ai.onnx.preview.training"


def _split(op: str, tensors: tuple, groups: int) -> list[tuple]:
    if not tensors or len(tensors) % groups:
        raise ValueError(f"{op}: expected {groups} inputs per optimized tensor after R and T, got {len(tensors)}")
    n = len(tensors) // groups
    return [tensors[i * n:(i + 1) * n] for i in range(groups)]


def _scalar(v, name: str, op: str) -> float:
    a = np.asarray(v)
    if a.size != 1:
        raise ValueError(f"{op}: {name} must be a scalar, got shape {a.shape}")
    return float(a.reshape(()))


def _f64(x) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


@kernel("Adagrad", since=1, domain=TRAINING)
def adagrad(r, t, *tensors, decay_factor=0.0, epsilon=1e-6, norm_coefficient=0.0):
    xs, gs, hs = _split("Adagrad", tensors, 3)
    rate = _scalar(r, "R", "Adagrad") / (1 + _scalar(t, "T", "Adagrad") * decay_factor)
    x_new, h_new = [], []
    for x, g, h in zip(xs, gs, hs):
        g_reg = norm_coefficient * _f64(x) + _f64(g)
        h2 = _f64(h) + g_reg * g_reg
        x_new.append((_f64(x) - rate * g_reg / (np.sqrt(h2) + epsilon)).astype(np.asarray(x).dtype))
        h_new.append(h2.astype(np.asarray(h).dtype))
    return tuple(x_new + h_new)


@kernel("Momentum", since=1, domain=TRAINING)
def momentum(r, t, *tensors, alpha=None, beta=None, mode=None, norm_coefficient=None):
    if alpha is None or beta is None or mode is None or norm_coefficient is None:
        raise ValueError("Momentum: alpha, beta, mode and norm_coefficient are required")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in ("standard", "nesterov"):
        raise ValueError(f"Momentum: mode must be 'standard' or 'nesterov', got {mode!r}")
    xs, gs, vs = _split("Momentum", tensors, 3)
    rate = _scalar(r, "R", "Momentum")
    beta_adj = beta if _scalar(t, "T", "Momentum") > 0 else 1.0  # the first step takes the whole gradient
    x_new, v_new = [], []
    for x, g, v in zip(xs, gs, vs):
        g_reg = norm_coefficient * _f64(x) + _f64(g)
        v2 = alpha * _f64(v) + beta_adj * g_reg
        step = g_reg + alpha * v2 if mode == "nesterov" else v2
        x_new.append((_f64(x) - rate * step).astype(np.asarray(x).dtype))
        v_new.append(v2.astype(np.asarray(v).dtype))
    return tuple(x_new + v_new)


@kernel("Adam", since=1, domain=TRAINING)
def adam(r, t, *tensors, alpha=0.9, beta=0.999, epsilon=1e-6, norm_coefficient=0.0, norm_coefficient_post=0.0):
    xs, gs, vs, hs = _split("Adam", tensors, 4)
    rate = _scalar(r, "R", "Adam")
    step = _scalar(t, "T", "Adam")
    if step > 0:
        rate = rate * math.sqrt(1 - beta ** step) / (1 - alpha ** step)  # bias correction
    x_new, v_new, h_new = [], [], []
    for x, g, v, h in zip(xs, gs, vs, hs):
        g_reg = norm_coefficient * _f64(x) + _f64(g)
        v2 = alpha * _f64(v) + (1 - alpha) * g_reg
        h2 = beta * _f64(h) + (1 - beta) * g_reg * g_reg
        xn = _f64(x) - rate * v2 / (np.sqrt(h2) + epsilon)
        x_new.append(((1 - norm_coefficient_post) * xn).astype(np.asarray(x).dtype))
        v_new.append(v2.astype(np.asarray(v).dtype))
        h_new.append(h2.astype(np.asarray(h).dtype))
    return tuple(x_new + v_new + h_new)
