"""minirt vs onnxruntime, side by side, on the benchmark models (benchmarks/models.py).

For every model and thread count (1 and 2 by default):

* latency: at 1 thread both runtimes in this process, calls interleaved
  (alternating order); at 2+ threads each runtime in a process of its own,
  alternating in rounds (their worker threads would disturb each other in one
  process); median and p90 per runtime and their ratios minirt/onnxruntime;
* cold start: a fresh ``python -c`` per runtime that imports it, loads the
  model and runs once; the time from just before the process is spawned to
  the first result, median over a few interleaved repetitions;
* peak RSS: the same fresh processes report their peak resident set after a
  few more runs (interpreter + numpy included for both, as a user sees it).

minirt runs the .mrt the builder makes from the ONNX file; onnxruntime runs
the ONNX file with its default (full) graph optimisation, intra-op threads
set to the thread count and sequential execution.

Writes a markdown table to stdout and ``benchmarks/results.md``, the raw
numbers to ``benchmarks/results.json`` and a plot to ``benchmarks/results.png``
(needs matplotlib: ``pip install -e '.[dev,bench]'``).  This is a benchmark,
not a test: the numbers depend on the machine and its load.

    python benchmarks/run.py [--models mobilenet,yolo] [--threads 1,2] [--seconds 4]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import minirt  # noqa: E402
from benchmarks.models import MODELS  # noqa: E402
from minirt import native  # noqa: E402
from minirt.tools import timing  # noqa: E402

CACHE = HERE / ".cache"

CHILD = r"""
import json, sys, time
runtime, path, feed_path, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
timed_s = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0  # > 0: also time warm runs for this long
import numpy as np
with np.load(feed_path) as f:
    feed = {k: f[k] for k in f.files}
if runtime == "minirt":
    import minirt
    sess = minirt.Session(path, threads=threads)
else:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
sess.run(None, feed)
t_first = time.time()
for _ in range(3):
    sess.run(None, feed)
# Linux: VmHWM is this process's own high-water mark.  (ru_maxrss is not: it
# survives execve, so a child of a big parent would report the parent's peak.)
rss = None
try:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                rss = int(line.split()[1]) * 1024
except OSError:
    pass
if rss is None:
    import resource
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss = rss if sys.platform == "darwin" else rss * 1024
times = []
if timed_s > 0:
    for _ in range(5):
        sess.run(None, feed)
    end = time.perf_counter() + timed_s
    while time.perf_counter() < end or len(times) < 10:
        t0 = time.perf_counter()
        sess.run(None, feed)
        times.append(time.perf_counter() - t0)
print(json.dumps({"t_first": t_first, "peak_rss": rss, "times": times}))
"""


def prepare(name: str) -> dict:
    """Write the ONNX model, its .mrt build and the feed into benchmarks/.cache."""
    import builder
    import onnx

    CACHE.mkdir(exist_ok=True)
    src, feed, shapes = MODELS[name][1]()
    onnx_path = CACHE / f"{name}.onnx"
    if isinstance(src, (str, os.PathLike)):
        onnx_path = Path(src)
    else:
        onnx.save(src, onnx_path)
    mrt_path = CACHE / f"{name}.mrt"
    t0 = time.perf_counter()
    builder.build(str(onnx_path), str(mrt_path), input_shapes=shapes)
    build_s = time.perf_counter() - t0
    feed_path = CACHE / f"{name}.feed.npz"
    np.savez(feed_path, **feed)
    return {"onnx": str(onnx_path), "mrt": str(mrt_path), "feed": feed, "feed_path": str(feed_path),
            "build_s": build_s}


def ort_session(path: str, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def latency(prep: dict, threads: int, seconds: float) -> dict:
    feed = prep["feed"]
    mine = minirt.Session(prep["mrt"], threads=threads)
    theirs = ort_session(prep["onnx"], threads)
    fns = {"minirt": lambda: mine.run(None, feed), "onnxruntime": lambda: theirs.run(None, feed)}
    if threads == 1:
        # Calibrate: enough interleaved rounds to fill ~`seconds`, within [15, 300].
        t0 = time.perf_counter()
        for f in fns.values():
            f()
            f()
        per_round = (time.perf_counter() - t0) / 2
        runs = int(min(300, max(15, seconds / max(per_round, 1e-6))))
        samples = timing.sample_interleaved(fns, runs, warmup=3)
    else:  # worker threads of the two runtimes must not share this process (see latency_in_own_processes)
        samples = latency_in_own_processes(prep, threads, seconds)
    out = {k: timing.summarize(v) for k, v in samples.items()}
    a, b = mine.run(None, feed), theirs.run(None, feed)
    out["max_abs_diff"] = max(float(np.max(np.abs(x.astype(np.float64) - y))) for x, y in zip(a, b))
    overheads = []
    for _ in range(5):
        _, prof = mine.run_profiled(feed)
        overheads.append(prof["overhead_per_node_s"])
    out["nodes"] = len(prof["nodes"])
    out["overhead_per_node_us"] = statistics.median(overheads) * 1e6
    # the timed runs: one native program (D32; the per-node overhead above is then not paid) or node by node
    for _ in range(3):  # (at 2 threads the timed runs were in other processes: plan and record here too)
        mine.run(None, feed)
    program = next((p["native_program"] for p in mine.memory_plans()), None)
    out["native_program"] = bool(program and program.endswith("native calls"))
    out["ratio_median"] = out["minirt"]["median_s"] / out["onnxruntime"]["median_s"]
    out["ratio_p90"] = out["minirt"]["p90_s"] / out["onnxruntime"]["p90_s"]
    return out


def fresh_process(runtime: str, prep: dict, threads: int, timed_s: float = 0.0) -> dict:
    path = prep["mrt"] if runtime == "minirt" else prep["onnx"]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(HERE.parent) + os.pathsep + env.get("PYTHONPATH", "")
    t_spawn = time.time()
    proc = subprocess.run([sys.executable, "-c", CHILD, runtime, path, prep["feed_path"], str(threads), str(timed_s)],
                          capture_output=True, text=True, timeout=600, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{runtime} child failed:\n{proc.stderr}")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"cold_s": r["t_first"] - t_spawn, "peak_rss": r["peak_rss"], "times": r["times"]}


def latency_in_own_processes(prep: dict, threads: int, seconds: float, rounds: int = 4) -> dict:
    """Warm-run latency of each runtime in a process of its own, alternating runtimes ``rounds`` times.

    For 2+ threads: in one process the runtimes' worker threads disturb each other (onnxruntime's keep
    spinning for milliseconds after a call and take the core our worker needs; measured: MobileNet at
    2 threads 1.7 ms alone, 3.2 ms beside a spinning onnxruntime session), which no deployment sees.
    Alternating short blocks keeps the comparison side by side in time."""
    samples: dict = {"minirt": [], "onnxruntime": []}
    for i in range(rounds):
        for rt in (("minirt", "onnxruntime") if i % 2 == 0 else ("onnxruntime", "minirt")):
            samples[rt].extend(fresh_process(rt, prep, threads, seconds / (2 * rounds))["times"])
    return samples


def cold(prep: dict, threads: int, reps: int) -> dict:
    res: dict = {"minirt": [], "onnxruntime": []}
    for i in range(reps):
        order = ("minirt", "onnxruntime") if i % 2 == 0 else ("onnxruntime", "minirt")
        for rt in order:
            res[rt].append(fresh_process(rt, prep, threads))
    out = {}
    for rt, xs in res.items():
        out[rt] = {"cold_s": statistics.median(x["cold_s"] for x in xs),
                   "peak_rss": statistics.median(x["peak_rss"] for x in xs)}
    out["cold_ratio"] = out["minirt"]["cold_s"] / out["onnxruntime"]["cold_s"]
    out["rss_ratio"] = out["minirt"]["peak_rss"] / out["onnxruntime"]["peak_rss"]
    return out


def fmt_ms(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def fmt_mb(b: float) -> str:
    return f"{b / 2**20:.0f} MB"


def table(results: list) -> str:
    head = ("| model | threads | minirt median | onnxruntime median | latency ratio (median) | ratio p90 "
            "| cold start minirt / ort (ratio) | peak RSS minirt / ort (ratio) | µs/node (nodes) | max abs diff |")
    lines = [head, "|" + "---|" * 10]
    for r in results:
        lat, c = r["latency"], r["cold"]
        lines.append(
            f"| {r['model']} | {r['threads']} | {fmt_ms(lat['minirt']['median_s'])} "
            f"| {fmt_ms(lat['onnxruntime']['median_s'])} | **{lat['ratio_median']:.2f}x** | {lat['ratio_p90']:.2f}x "
            f"| {fmt_ms(c['minirt']['cold_s'])} / {fmt_ms(c['onnxruntime']['cold_s'])} (**{c['cold_ratio']:.2f}x**) "
            f"| {fmt_mb(c['minirt']['peak_rss'])} / {fmt_mb(c['onnxruntime']['peak_rss'])} "
            f"(**{c['rss_ratio']:.2f}x**) | {lat['overhead_per_node_us']:.1f} ({lat['nodes']})"
            f"{', program' if lat.get('native_program') else ''} "
            f"| {lat['max_abs_diff']:.2g} |"
        )
    return "\n".join(lines)


def environment() -> dict:
    import onnxruntime as ort

    from minirt.native import blas

    return {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "minirt": minirt.__version__,
        "onnxruntime": ort.__version__,
        "native": native.describe(),
        "blas": blas.status if blas.get_threads() is not None else blas.status,
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


def plot(results: list, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install -e '.[dev,bench]'): no plot", file=sys.stderr)
        return False
    models = list(dict.fromkeys(r["model"] for r in results))
    threads = sorted({r["threads"] for r in results})
    by = {(r["model"], r["threads"]): r for r in results}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8), constrained_layout=True)
    x = np.arange(len(models))
    width = 0.8 / len(threads)
    colours = ["#3b75af", "#ef8536", "#519e3e", "#c53a32"]
    # Ratios on a log axis (2x slower and 2x faster are equally far from 1), except RSS.
    panels = [
        ("latency ratio (median)", lambda r: r["latency"]["ratio_median"], [(1.0, "parity / goal"), (1.5, "milestone")],
         True),
        ("cold start ratio", lambda r: r["cold"]["cold_ratio"], [(1.0, "parity"), (0.2, "goal")], True),
        ("peak RSS ratio", lambda r: r["cold"]["rss_ratio"], [(1.0, "parity / goal")], False),
    ]
    for ax, (title, get, refs, log) in zip(axes, panels):
        for j, t in enumerate(threads):
            vals = [get(by[(m, t)]) if (m, t) in by else np.nan for m in models]
            bars = ax.bar(x + (j - (len(threads) - 1) / 2) * width, vals, width, label=f"{t} thread{'s' * (t > 1)}",
                          color=colours[j % len(colours)])
            for b, v in zip(bars, vals):
                if np.isfinite(v):
                    ax.annotate(f"{v:.2f}", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=8,
                                xytext=(0, 2), textcoords="offset points")
        for y, label in refs:
            ax.axhline(y, color="grey", linestyle="--" if y == 1.0 else ":", linewidth=1)
            ax.annotate(label, (-0.45, y), ha="left", va="bottom", fontsize=8, color="grey")
        ax.set_xticks(x, models, rotation=20)
        ax.set_title(f"minirt / onnxruntime: {title}\n(lower is better{', log scale' if log else ''})", fontsize=10)
        if log:
            from matplotlib.ticker import FuncFormatter

            vals = [get(r) for r in results] + [y for y, _ in refs]
            ax.set_yscale("log")
            ax.set_ylim(min(vals) / 1.6, max(vals) * 2.5)
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
            ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        else:
            ax.set_ylim(0, max(max(get(r) for r in results), 1.0) * 1.15)
        ax.legend(fontsize=8, loc="upper right")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {','.join(MODELS)}")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--seconds", type=float, default=4.0, help="latency sampling time per model and thread count")
    ap.add_argument("--cold-reps", type=int, default=3, help="fresh processes per runtime for cold start / RSS")
    ap.add_argument("--out", default=str(HERE), help="directory for results.md/.json/.png (default benchmarks/)")
    ap.add_argument("--replot", action="store_true", help="only redraw results.png from results.json")
    args = ap.parse_args()
    if args.replot:
        data = json.loads((Path(args.out) / "results.json").read_text(encoding="utf-8"))
        return 0 if plot(data["results"], Path(args.out) / "results.png") else 1
    names = [m for m in args.models.split(",") if m]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {list(MODELS)}")
    thread_counts = [int(t) for t in args.threads.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # Cold start compares installed packages: numpy's and onnxruntime's bytecode was
    # compiled at install time, so compile minirt's too (an editable checkout run with
    # PYTHONDONTWRITEBYTECODE=1 would otherwise recompile every module in every child).
    import compileall

    compileall.compile_dir(str(Path(minirt.__file__).parent), quiet=1)
    env = environment()
    print(f"# minirt vs onnxruntime ({env['date']})\n")
    for k in ("machine", "python", "numpy", "minirt", "onnxruntime", "native", "blas", "load_average"):
        print(f"- {k}: {env[k]}")
    print(flush=True)
    results = []
    for name in names:
        prep = prepare(name)
        for t in thread_counts:
            print(f"{name}, {t} thread(s) ...", file=sys.stderr, flush=True)
            results.append({"model": name, "description": MODELS[name][0], "threads": t,
                            "latency": latency(prep, t, args.seconds), "cold": cold(prep, t, args.cold_reps)})
    md = table(results)
    print(md)
    env["load_average_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    models_md = "\n".join(f"- **{n}**: {MODELS[n][0]}" for n in names)
    doc = (
        f"# minirt vs onnxruntime\n\nGenerated by `benchmarks/run.py` on {env['date']}. Ratios are "
        "minirt / onnxruntime (lower is better for minirt). Latency: both runtimes in one process, calls "
        "interleaved at 1 thread; at 2 threads each runtime runs in a process of its own, the two alternating in "
        "4 rounds (in one process onnxruntime's spinning workers take the core ours need). Cold start: process spawn to first result in a fresh `python -c` (import, load, one run). "
        "Peak RSS: the same fresh processes after 4 runs (interpreter and numpy included for both). "
        "minirt's bytecode is compiled before the cold-start runs, as an install would have it. "
        "µs/node: minirt's Python overhead per node when the nodes run one by one; \"program\": the timed runs "
        "replayed one native program instead, without Python between the nodes (docs/decisions.md D32).\n\n"
        + "\n".join(f"- {k}: {env[k]}" for k in ("machine", "python", "numpy", "minirt", "onnxruntime", "native",
                                               "blas", "load_average", "load_average_end"))
        + f"\n\nModels:\n\n{models_md}\n\n{md}\n\n![ratios](results.png)\n"
    )
    (out / "results.md").write_text(doc, encoding="utf-8")
    (out / "results.json").write_text(json.dumps({"environment": env, "results": results}, indent=1), encoding="utf-8")
    if plot(results, out / "results.png"):
        print(f"\nwrote {out / 'results.md'}, {out / 'results.json'}, {out / 'results.png'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
