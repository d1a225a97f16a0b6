"""Latency sampling and summaries for ``minirt bench`` and ``minirt demo``.

:func:`sample_interleaved` times several callables in alternating order
(round i runs them in order, round i+1 in reverse), so that frequency scaling,
cache state and background load affect every contender alike.
"""
from __future__ import annotations

import statistics
import sys
import time
from typing import Callable, Mapping, Sequence


def sample(fn: Callable[[], object], runs: int, warmup: int = 0) -> list[float]:
    """Call ``fn`` ``warmup`` times untimed, then ``runs`` times; seconds per call."""
    return sample_interleaved({"fn": fn}, runs, warmup)["fn"]


def sample_interleaved(fns: Mapping[str, Callable[[], object]], runs: int, warmup: int = 0) -> dict[str, list[float]]:
    """Time every callable ``runs`` times, alternating between them; name -> seconds per call."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    clock = time.perf_counter
    out: dict[str, list[float]] = {name: [] for name in names}
    for i in range(runs):
        for name in names if i % 2 == 0 else reversed(names):
            fn = fns[name]
            t0 = clock()
            fn()
            out[name].append(clock() - t0)
    return out


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation, like numpy's default."""
    xs = sorted(samples)
    if not xs:
        raise ValueError("no samples")
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(samples: Sequence[float]) -> dict[str, float]:
    """median (p50), p90, p99, mean, min, max (seconds) and the sample count."""
    return {
        "median_s": statistics.median(samples),
        "p90_s": percentile(samples, 90),
        "p99_s": percentile(samples, 99),
        "mean_s": statistics.fmean(samples),
        "min_s": min(samples),
        "max_s": max(samples),
        "runs": len(samples),
    }


def peak_rss_bytes() -> int | None:
    """Peak resident set size of this process so far, in bytes (``None`` where unknown)."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS (and the other BSD-derived kernels) bytes.
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def fmt_seconds(s: float) -> str:
    """``0.000012`` -> ``'12.0 us'``; ``0.0123`` -> ``'12.30 ms'``."""
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1.0:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.3f} s"


def fmt_bytes(n: float | None) -> str:
    """``191234`` -> ``'186.8 KiB'``."""
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
