"""Latency of a candidate: modeled from the target profile, and measured on the host (labelled apart).

*Modeled* is the builder's cost model (builder/quantize/cost.py, D87), in its unit, the time of one
float32 multiply-add in a GEMM, for one run with the batch at 1: the optimized float graph costs its
products' multiply-adds plus ``element_cost`` per FLOP of every other node (targets/flops.py), as the
cost model prices the float model; an int8 build costs that times the ratio its quantization report
estimated for the target (``build.quantization.estimate``), fp16 the float cost (fp16 weights are
converted back at load: the kernels compute float32).  Milliseconds come from the target's float32
GMAC/s of one core (config.py's ASSUMED_GMACS, or ``gmacs`` in the config).  Partitions an
accelerator runs (Core ML, NNAPI) are priced as on the CPU: the profile has no accelerator cost model.

*Measured* is the median time of a batch-1 run on the machine that ran the evaluation task, 1 thread,
while the sweep's other tasks ran beside it: for information, it decides nothing (the device is not
the build machine).
"""
from __future__ import annotations

import statistics
import time
from typing import Any

_COST_MEMO: dict = {}  # per worker process: (model, opt-level, shapes, values, profile) -> float cost


def float_cost(model: Any, model_sha: str, opt_level: int, input_shapes: dict | None, input_values: dict | None,
               profile) -> tuple[float | None, str]:
    """(cost of one run of the optimized float graph on ``profile``, or None, and why/what)."""
    from minirt.builder.build import _apply_input_shapes, _normalise, _pin_input_values, parse_input_shapes
    from minirt.builder.load import load_model
    from minirt.builder.passes import optimize as optimize_graph
    from minirt.builder.quantize.cost import _PRODUCTS, _with_unit_batch
    from minirt.targets.flops import estimate as flops_estimate

    key = (model_sha, opt_level, repr(sorted((input_shapes or {}).items())),
           repr(sorted((input_values or {}).items())), profile.name, profile.element_cost)
    if key in _COST_MEMO:
        return _COST_MEMO[key]
    shapes = parse_input_shapes(input_shapes)
    model_ir, _ = load_model(model)
    if shapes:
        _apply_input_shapes(model_ir, shapes)
    if input_values:
        _pin_input_values(model_ir, input_values)
    _normalise(model_ir)
    optimize_graph(model_ir, opt_level, input_shapes=shapes)
    model_ir = _with_unit_batch(model_ir)
    element = float(profile.element_cost)
    total, unknown = 0.0, []
    for node in model_ir.graph:
        flops = flops_estimate(node)
        if flops is None:
            unknown.append(node.op_type)
            continue
        total += flops / 2 if node.op_type in _PRODUCTS else element * flops
    heavy = [op for op in unknown if op in _PRODUCTS or op in ("LSTM", "GRU", "RNN")]
    if heavy or total <= 0:
        result = (None, f"cost unknown: {len(unknown)} node(s) of unknown size ({', '.join(sorted(set(unknown)))}); "
                        "fix the input shapes (input_shapes)")
    else:
        note = f"; {len(unknown)} small node(s) of unknown size priced 0" if unknown else ""
        result = (total, f"{profile.name} cost model{note}")
    _COST_MEMO[key] = result
    return result


def modeled_cost(float_cost_value: float | None, mode: str | None, quantization: dict) -> tuple[float | None, str]:
    """The candidate's cost from the float cost and its build's quantization report."""
    if float_cost_value is None:
        return None, "unknown float cost"
    if mode in (None, "none", "fp16"):
        return float_cost_value, "float32 compute" + (" (fp16 weights)" if mode == "fp16" else "")
    est = quantization.get("estimate") or {}
    ratio = est.get("ratio")
    if ratio is None:
        return None, f"no {mode} estimate ({est.get('why', 'no int8 layer of known size')})"
    return float_cost_value * float(ratio), f"{mode}: {float(ratio):.3f}x float by the cost model"


def measure_host(session, feed: dict, runs: int, warmup: int = 2) -> float:
    """Median seconds of ``runs`` runs of ``session`` on ``feed`` (after ``warmup``)."""
    for _ in range(warmup):
        session.run(None, feed)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        session.run(None, feed)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
