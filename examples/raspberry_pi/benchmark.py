#!/usr/bin/env python3
"""Benchmark a .mrt model on a Raspberry Pi: latency, throughput and board state.

    python3 benchmark.py                         # the digits model, 200 runs
    python3 benchmark.py --model mobilenet.mrt --runs 50 --batch 1
    python3 benchmark.py --compare-numpy         # native kernels vs numpy kernels
    python3 benchmark.py --json > result.json

Besides the latency percentiles it prints what the Pi exposes about its own
state: board model, SoC temperature before and after the run, CPU clock, and
the firmware's throttling flags (under-voltage, frequency capping, thermal
throttling), so that a slow number can be told apart from a hot or
under-powered board.  Off a Pi those lines say "n/a".
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

import piutil  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Time a minirt model and report the Raspberry Pi's temperature and throttling.")
    p.add_argument("--model", help="the .mrt artifact (default: digits.mrt beside this script)")
    p.add_argument("--runs", type=int, default=200, help="timed runs (default 200)")
    p.add_argument("--warmup", type=int, default=10, help="untimed runs first (default 10)")
    p.add_argument("--batch", type=int, default=1, help="batch size for a dynamic first dimension (default 1)")
    p.add_argument("--threads", type=int, default=None, help="runtime threads (default: all cores)")
    p.add_argument("--compare-numpy", action="store_true",
                   help="also time with the native kernels switched off (numpy kernels only); "
                        "nothing to compare when they are not built")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    return p


_ONNX_TYPES = {"float": "float32", "double": "float64", "float16": "float16", "int8": "int8", "uint8": "uint8",
               "int16": "int16", "int32": "int32", "int64": "int64", "bool": "bool"}


def _input_for(arg, batch: int, rng: np.random.Generator) -> np.ndarray:
    shape = [batch if (i == 0 and not isinstance(d, int)) else (d if isinstance(d, int) else 1)
             for i, d in enumerate(arg.shape or [])]
    onnx_name = arg.type[len("tensor("):-1] if arg.type.startswith("tensor(") else "float"
    dtype = np.dtype(_ONNX_TYPES.get(onnx_name, "float32"))
    if dtype.kind == "f":
        return rng.random(shape, dtype=np.float64).astype(dtype)
    return rng.integers(0, 10, size=shape).astype(dtype)


def time_session(session, feed: dict, runs: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        session.run(None, feed)
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        session.run(None, feed)
        out.append(time.perf_counter() - t0)
    return out


def summary(samples: list[float], batch: int) -> dict:
    xs = sorted(samples)

    def pct(q: float) -> float:
        pos = (len(xs) - 1) * q / 100.0
        lo = int(pos)
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    median = statistics.median(xs)
    return {
        "runs": len(xs),
        "median_ms": median * 1e3,
        "p90_ms": pct(90) * 1e3,
        "p99_ms": pct(99) * 1e3,
        "min_ms": xs[0] * 1e3,
        "mean_ms": statistics.fmean(xs) * 1e3,
        "throughput_per_s": batch / median if median > 0 else float("inf"),
    }


def board_state() -> dict:
    throttled = piutil.throttled_state()
    return {
        "temperature_c": piutil.cpu_temperature_c(),
        "cpu_mhz": piutil.cpu_freq_mhz(),
        "throttled": None if throttled is None else hex(throttled),
        "throttled_flags": [] if throttled is None else piutil.decode_throttled(throttled),
    }


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.runs < 1 or args.warmup < 0 or args.batch < 1:
        print("benchmark.py: error: --runs and --batch must be >= 1, --warmup >= 0", file=sys.stderr)
        return 2
    try:
        model = piutil.resolve_model(args.model)
    except FileNotFoundError as exc:
        print(f"benchmark.py: error: {exc}", file=sys.stderr)
        return 2

    import minirt
    from minirt import native

    session = minirt.Session(str(model), threads=args.threads)
    rng = np.random.default_rng(0)
    feed = {a.name: _input_for(a, args.batch, rng) for a in session.get_inputs()}

    before = board_state()
    first = "native" if native.available else "numpy"
    results = {first: summary(time_session(session, feed, args.runs, args.warmup), args.batch)}
    if args.compare_numpy and native.available:
        saved = native.available
        native.available = False  # every kernel checks this flag per call
        try:
            results["numpy"] = summary(time_session(session, feed, args.runs, args.warmup), args.batch)
        finally:
            native.available = saved
    after = board_state()

    report = {
        "model": str(model),
        "batch": args.batch,
        "threads": args.threads or os.cpu_count(),
        "board": piutil.pi_model(),
        "target": piutil.guess_target(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "minirt": minirt.__version__,
        "native_kernels": native.describe(),
        "latency": results,
        "before": before,
        "after": after,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0

    def na(v, fmt="{}"):
        return "n/a" if v is None else fmt.format(v)

    print(f"model      {report['model']} (batch {args.batch}, threads {report['threads']})")
    print(f"board      {na(report['board'])}  [{report['machine']}, target {report['target']}]")
    print(f"software   python {report['python']}, numpy {report['numpy']}, minirt {report['minirt']}")
    print(f"kernels    {report['native_kernels']}")
    for name, r in results.items():
        label = "latency" if len(results) == 1 else name
        print(f"{label:<10} median {r['median_ms']:.3f} ms  p90 {r['p90_ms']:.3f} ms  p99 {r['p99_ms']:.3f} ms  "
              f"min {r['min_ms']:.3f} ms  ({r['throughput_per_s']:.1f} inferences/s, {r['runs']} runs)")
    print(f"temp       {na(before['temperature_c'], '{:.1f} C')} before, {na(after['temperature_c'], '{:.1f} C')} after")
    print(f"cpu clock  {na(after['cpu_mhz'], '{:.0f} MHz')}")
    if after["throttled"] is None:
        print("throttling n/a (no vcgencmd / firmware interface: not a Raspberry Pi)")
    else:
        flags = ", ".join(after["throttled_flags"]) or "none"
        print(f"throttling {after['throttled']}: {flags}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
