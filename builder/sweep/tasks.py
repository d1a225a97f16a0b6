"""The work of a sweep as plain functions, each run as one Ray task by run.py.

* :func:`prepare`: one model's calibration set, or one shard of its evaluation set, preprocessed for an
  input-shape variant (once per variant, shared by every candidate of it through Ray's object store);
* :func:`build_candidate`: one build, in memory (``build(..., None)``: no file), with the candidate's
  modeled cost; returns ``(meta, artifact bytes)``;
* :func:`reference_outputs`: the float reference model's outputs on one shard (reference metrics);
* :func:`evaluate_shard`: one candidate on one shard: the metric's statistics; on the first shard
  also the host latency.

No task writes a file: results travel back through the object store and the driver writes them
(atomically) only once a candidate is complete, so a worker that dies mid-task leaves nothing
behind, and Ray's retry (``max_retries``) reruns it from its inputs.  A build the builder refuses
(:class:`minirt.Error`: "nothing to quantize", ...) is a result, ``status: failed``, not an exception:
it is deterministic, so it is cached like a success.  Native kernels run on 1 thread: a task has one CPU.
"""
from __future__ import annotations

import os
import socket
import time
from typing import Any, Callable

import numpy as np


def prepare(fn: Callable | None, arrays: dict, shapes: dict) -> dict:
    from minirt.builder.sweep.data import preprocess

    return preprocess(fn, arrays, shapes)


def build_candidate(payload: Any, model_sha: str, kwargs: dict, target: str, calibration: dict | None,
                    fixed: dict) -> tuple[dict, bytes | None]:
    """Build one candidate; ``(meta, artifact bytes or None)``."""
    import hashlib

    from minirt.builder import build
    from minirt.builder.sweep import latency
    from minirt.errors import Error
    from minirt.targets.profiles import get_target

    t0 = time.perf_counter()
    quantized = kwargs["quantize"] != "none"
    try:
        report = build(payload, None, target=target, calibration=calibration if quantized else None, **kwargs)
    except Error as exc:
        return {"status": "failed", "error": f"{type(exc).__name__}: {exc}", "build_s": time.perf_counter() - t0}, None
    build_s = time.perf_counter() - t0
    data = report.data
    profile = get_target(target)
    try:
        fcost, basis = latency.float_cost(payload, model_sha, kwargs["opt_level"], kwargs.get("input_shapes"),
                                          fixed.get("input_values"), profile)
    except Error as exc:
        fcost, basis = None, f"cost unknown: {exc}"
    cost, how = latency.modeled_cost(fcost, report.quantize, report.quantization)
    as_dict = report.as_dict()
    meta = {
        "status": "ok",
        "size_bytes": len(data),
        "artifact_sha256": hashlib.sha256(data).hexdigest(),
        "quantize_built": report.quantize,  # (auto: what the target chose; None: float32)
        "modeled_cost": cost,
        "modeled_basis": f"{basis}; {how}",
        "build_s": build_s,
        "warnings": list(report.warnings),
        "report": as_dict,
        "report_text": str(report),
    }
    return meta, data


def _batches(session, feeds: dict, batch: int) -> list[dict]:
    """``feeds`` (samples stacked on axis 0) as the runs to make: chunks of the batch the artifact's inputs
    fix (a model built with input_shapes 1x3x48x192 runs sample by sample), else of ``batch``.  Results
    of int8-dynamic artifacts depend on the batch (the activation range is the whole batch's), so the
    evaluation batch is fixed (``sweep.eval_batch``, default 1 as on a device), never the shard."""
    n = next(iter(feeds.values())).shape[0]
    fixed = {arg.shape[0] for arg in session.get_inputs()
             if arg.name in feeds and arg.shape and isinstance(arg.shape[0], int) and arg.shape[0] > 0}
    b = fixed.pop() if len(fixed) == 1 else batch
    if b >= n:
        return [feeds]
    return [{k: v[i:i + b] for k, v in feeds.items()} for i in range(0, n, b)]


def run_outputs(artifact: bytes, shard: dict, input_names: list, batch: int) -> dict[str, np.ndarray]:
    import minirt
    from minirt.builder.sweep.metrics import split_labels

    session = minirt.Session(artifact, threads=1)
    feeds, _ = split_labels(shard, input_names)
    names = [o.name for o in session.get_outputs()]
    per: dict[str, list] = {n: [] for n in names}
    for feed in _batches(session, feeds, batch):
        for name, y in zip(names, session.run(None, feed)):
            per[name].append(np.asarray(y))
    return {n: (np.concatenate(v, axis=0) if len(v) > 1 else v[0]) for n, v in per.items()}


def reference_outputs(artifact: bytes | None, shard: dict, input_names: list, batch: int) -> dict | None:
    return None if artifact is None else run_outputs(artifact, shard, input_names, batch)


def evaluate_shard(artifact: bytes | None, shard: dict, reference: dict | None, metric, input_names: list,
                   output: str | None, batch: int, latency_runs: int) -> dict:
    """One candidate on one shard: ``{"n", statistics..., "eval_s"[, "host_latency_s", "host"]}``."""
    import minirt
    from minirt.builder.sweep import latency
    from minirt.builder.sweep.metrics import shard_stats, split_labels

    if artifact is None:  # (the build failed: its row says why)
        return {"skipped": True}
    t0 = time.perf_counter()
    if metric.needs_reference and reference is None:
        raise ValueError(f"metric {metric.label} compares with the float model, whose build failed")
    outputs = run_outputs(artifact, shard, input_names, batch)
    _, labels = split_labels(shard, input_names)
    stats = shard_stats(metric, outputs, shard, reference, labels, output)
    stats["eval_s"] = time.perf_counter() - t0
    if latency_runs:
        session = minirt.Session(artifact, threads=1)
        feeds, _ = split_labels(shard, input_names)
        one = {k: v[:1] for k, v in feeds.items()}
        stats["host_latency_s"] = latency.measure_host(session, one, latency_runs)
        stats["host"] = f"{socket.gethostname()} pid {os.getpid()}"
    return stats
