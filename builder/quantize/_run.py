"""Run an IR model with minirt itself: lower to bytes, open a Session, time it."""
from __future__ import annotations

import statistics
import time

import numpy as np
import onnx_ir as ir

import minirt
from minirt.builder.lower import artifact_bytes


def session(model: ir.Model) -> minirt.Session:
    return minirt.Session(artifact_bytes(model), verify_checksums=False)


def run_all(sess: minirt.Session, feeds) -> dict[str, np.ndarray]:
    """Outputs over every feed, concatenated along axis 0 (kept per feed when shapes differ)."""
    names = [o.name for o in sess.get_outputs()]
    per: dict[str, list] = {n: [] for n in names}
    for feed in feeds:
        for n, y in zip(names, sess.run(None, feed)):
            per[n].append(np.asarray(y))
    return per


def collect(model: ir.Model, names: list[str], feeds, visit) -> None:
    """Run ``model`` on every feed; ``visit(name, array)`` each value named in ``names`` whenever it is
    computed: a feed, a node's result, or a value inside an If / Loop / Scan body (once per body run:
    every iteration of a Loop, only the branch an If takes), through the session's value observer (D95)."""
    wanted = set(names)
    sess = minirt.Session(artifact_bytes(model), verify_checksums=False, memory_plan=False, native_program=False,
                          warm_up=False)

    def observe(name, value):
        if name in wanted and type(value) is np.ndarray:
            visit(name, value)

    sess._observe_values(observe)
    for feed in feeds:
        for n, arr in feed.items():
            if n in wanted:
                visit(n, np.asarray(arr))
        sess.run(None, feed)


def median_latency(sessions: dict, feed: dict, runs: int = 5, warmup: int = 1) -> dict[str, float]:
    """Median seconds per run of each session on ``feed``, runs interleaved."""
    times: dict[str, list] = {k: [] for k in sessions}
    for _ in range(warmup):
        for s in sessions.values():
            s.run(None, feed)
    for _ in range(runs):
        for k, s in sessions.items():
            t0 = time.perf_counter()
            s.run(None, feed)
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}
