"""The objective: the best metric subject to the size and modeled-latency limits, per task and target.

A candidate is *feasible* on its target when it built, was evaluated, and is within the target's
``max_size`` (artifact bytes) and ``max_latency_ms`` (modeled: a candidate whose modeled latency is
unknown does not meet a latency limit).  The choice is the feasible candidate with the best metric;
ties go to the lower modeled latency, then the smaller artifact, then the candidate id, so the
choice never depends on the host's timing (noisy, and not the device's) or on the order results
arrived in.  The Pareto set of a (task, target) is the candidates no other one beats on the metric,
the modeled latency and the size at once (limits aside).
"""
from __future__ import annotations

import math
from typing import Iterable


def _lat(row: dict) -> float:
    v = row.get("latency_modeled_ms")
    return math.inf if v is None else float(v)


def _score(row: dict, higher: bool) -> float:
    v = row["accuracy"]
    return float(v) if higher else -float(v)  # larger is better either way


def usable(row: dict) -> bool:
    return row.get("status") == "ok" and row.get("accuracy") is not None and not math.isnan(float(row["accuracy"]))


def feasibility(row: dict, max_size: int | None, max_latency_ms: float | None) -> tuple[bool, str]:
    if not usable(row):
        return False, row.get("status", "?")
    why = []
    if max_size is not None and row["size_bytes"] > max_size:
        why.append(f"size {row['size_bytes']} B > {max_size} B")
    if max_latency_ms is not None:
        lat = row.get("latency_modeled_ms")
        if lat is None:
            why.append("modeled latency unknown")
        elif lat > max_latency_ms:
            why.append(f"modeled latency {lat:.4g} ms > {max_latency_ms:g} ms")
    return not why, "; ".join(why)


def rank_key(row: dict, higher: bool) -> tuple:
    """Sort key, best first."""
    return (-_score(row, higher), _lat(row), row["size_bytes"], row["candidate"])


def best(rows: Iterable[dict], higher: bool) -> dict | None:
    rows = [r for r in rows if usable(r)]
    return min(rows, key=lambda r: rank_key(r, higher)) if rows else None


def pareto(rows: Iterable[dict], higher: bool) -> set[str]:
    """Ids of the usable rows that no other usable row dominates (metric, modeled latency, size)."""
    pts = [(r["candidate"], _score(r, higher), _lat(r), r["size_bytes"]) for r in rows if usable(r)]
    out = set()
    for cid, s, lat, size in pts:
        dominated = any(s2 >= s and l2 <= lat and z2 <= size and (s2 > s or l2 < lat or z2 < size)
                        for c2, s2, l2, z2 in pts if c2 != cid)
        if not dominated:
            out.add(cid)
    return out
