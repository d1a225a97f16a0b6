"""``minirt sweep`` wall time against the number of Ray workers, on one machine (issue 26).

The same sweep (default: the example, examples/sweep/sweep.toml: 180 candidates, the digits CNN and
PP-OCR's direction classifier on 3 targets) runs once per worker count, each in a fresh process
(``python -m minirt sweep CONFIG --workers N``: its own local Ray instance of N CPUs) from an empty
cache in a temporary folder, so no run reuses another's builds.  The figure is the command's wall
time, Ray's start included; the runs alternate between the worker counts over ``--reps`` rounds.  The
machine is shared: each run's load average before it and the share of both CPUs busy during it
(all processes, /proc/stat) are recorded, and the summary takes each count's fastest run (Ray runs
its workers at nice 15 by default, so other users' work slows them first: the benchmark starts them
at nice 0).  Every run must choose the same artifacts (checked).

    python -m benchmarks.sweep [--config examples/sweep/sweep.toml] [--workers 1,2] [--reps 1]
                               [--out benchmarks/results_sweep.md]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Ray starts its workers at nice 15 (RAY_worker_niceness): on a machine shared with other work they then
# get a core only when nothing else wants it, and 2 workers measure the others' load more than the sweep.
# The benchmark runs them at the default priority, as the other processes.
NICENESS = 0


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot; (0, 0) without /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def run_once(config: str, workers: int) -> dict:
    """One sweep from an empty cache in a fresh process: wall time, candidates, choices."""
    with tempfile.TemporaryDirectory(prefix="minirt-sweep-bench-") as tmp:
        load = os.getloadavg()[0]
        busy0, total0 = _cpu_jiffies()
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "minirt", "sweep", config, "--workers", str(workers),
                               "--cache", os.path.join(tmp, "cache"), "--out", os.path.join(tmp, "out"),
                               "--json", "-q"], capture_output=True, text=True, cwd=ROOT,
                              env={**os.environ, "RAY_worker_niceness": str(NICENESS)})
        wall = time.perf_counter() - t0
        busy1, total1 = _cpu_jiffies()
        if proc.returncode != 0:
            raise SystemExit(f"minirt sweep failed ({proc.returncode}):\n{proc.stderr}")
        doc = json.loads(proc.stdout)
        with open(doc["table"]) as f:
            rows = json.load(f)["candidates"]
    busy = (busy1 - busy0) / (total1 - total0) if total1 > total0 else float("nan")
    return {"workers": workers, "wall_s": wall, "sweep_s": doc["wall_s"], "load": load, "busy": busy,
            "candidates": len(rows),
            "ok": sum(r["status"] == "ok" for r in rows),
            "chosen": {f"{c['task']}@{c['target']}": c["candidate"] for c in doc["chosen"]}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "examples", "sweep", "sweep.toml"))
    ap.add_argument("--workers", default="1,2", help="worker counts, comma-separated (default 1,2)")
    ap.add_argument("--reps", type=int, default=1, help="rounds over the worker counts (default 1)")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results_sweep.md"))
    args = ap.parse_args(argv)
    counts = [int(w) for w in args.workers.split(",")]
    runs = []
    for rep in range(args.reps):
        for w in (counts if rep % 2 == 0 else counts[::-1]):
            r = run_once(args.config, w)
            print(f"workers {w}: {r['wall_s']:.1f} s ({r['candidates']} candidates, load {r['load']:.2f})", flush=True)
            runs.append(r)
    choices = {json.dumps(r["chosen"], sort_keys=True) for r in runs}
    assert len(choices) == 1, f"the runs chose differently: {choices}"
    best = {w: min(r["wall_s"] for r in runs if r["workers"] == w) for w in counts}
    lines = [
        "# `minirt sweep`: wall time against the number of Ray workers",
        "",
        f"`python -m benchmarks.sweep --workers {args.workers} --reps {args.reps}`: "
        f"`{os.path.relpath(args.config, ROOT)}`, each run in a fresh process (`minirt sweep --workers N`: a local "
        "Ray instance of N CPUs, workers at nice 0) from an empty cache; wall time of the command, Ray's start "
        "included. "
        f"{_cpu_model()}, {os.cpu_count()} CPUs, shared with other work: the load average before each run and the "
        "share of the CPUs busy during it (all processes) are given; the summary takes each count's fastest run.",
        "",
        "| workers | candidates | fastest run | speed-up |",
        "|---|---|---|---|",
    ]
    for w in counts:
        mine = [r for r in runs if r["workers"] == w]
        lines.append(f"| {w} | {mine[0]['candidates']} ({mine[0]['ok']} ok) | {best[w]:.1f} s | "
                     f"{best[counts[0]] / best[w]:.2f}x |")
    lines += ["", "Every run, in order:", "", "| run | workers | wall time | of which the sweep | load before | CPUs busy |",
              "|---|---|---|---|---|---|"]
    for i, r in enumerate(runs, 1):
        lines.append(f"| {i} | {r['workers']} | {r['wall_s']:.1f} s | {r['sweep_s']:.1f} s | {r['load']:.2f} | "
                     f"{r['busy'] * 100:.0f} % |")
    lines += ["", "Every run chose the same artifacts:", ""]
    lines += [f"- {k}: `{v}`" for k, v in sorted(runs[0]["chosen"].items())]
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
