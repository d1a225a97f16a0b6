"""minirt vs onnxruntime, side by side, on the benchmark models.

Two sets: ``--set real`` (the default, ``benchmarks/realworld.py``: real models
from wheels and real torchvision / timm / transformers architectures, the
yardstick) and ``--set synthetic`` (``benchmarks/models.py``: small onnx.helper
stand-ins, kept as micro-benchmarks).

For every model and thread count (1 and 2 by default):

* latency: at 1 thread both runtimes in this process, calls interleaved
  (alternating order); at 2+ threads each runtime in a process of its own,
  alternating in rounds (their worker threads would disturb each other in one
  process); median and p90 wall time per runtime, the median CPU time of the
  calling thread (``time.thread_time()``: the work done on the caller's thread,
  without the time it waited or was preempted; worker threads not included)
  and the ratios minirt/onnxruntime;
* native program: whether minirt's timed runs replayed one native program
  (docs/decisions.md D32) or, if not, the node that stopped the recording and why;
* cold start: a fresh ``python -c`` per runtime that imports it, loads the
  model and runs once; the time from just before the process is spawned to
  the first result, median over a few interleaved repetitions;
* first run / steady: the same processes time their first ``run`` (after the
  model is loaded) against the steady median latency;
* peak RSS: the same fresh processes report their peak resident set after a
  few more runs (interpreter + numpy included for both, as a user sees it).

A model that cannot be exported, built or run gets a row with the error text
(and the stage) instead of its numbers: it is not dropped.

minirt runs the .mrt the builder makes from the ONNX file; onnxruntime runs
the ONNX file with its default (full) graph optimisation, intra-op threads
set to the thread count and sequential execution.

Writes a markdown table to stdout and ``benchmarks/results.md``, the raw
numbers to ``benchmarks/results.json`` and a plot to ``benchmarks/results.png``
(``results_synthetic.*`` for ``--set synthetic``)
(needs matplotlib: ``pip install -e '.[dev,bench]'``).  This is a benchmark,
not a test: the numbers depend on the machine and its load.

    python benchmarks/run.py [--set real|synthetic] [--models resnet18,bert_mini] [--threads 1,2] [--seconds 4]
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
import traceback
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import minirt  # noqa: E402
from benchmarks import realworld  # noqa: E402
from benchmarks.models import MODELS as SYNTHETIC  # noqa: E402
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
t_own = time.time()  # from here on: the runtime's own share (import, session, first run)
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
t0 = time.perf_counter()
sess.run(None, feed)
first_s = time.perf_counter() - t0
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
times, cpu = [], []
if timed_s > 0:
    for _ in range(5):
        sess.run(None, feed)
    end = time.perf_counter() + timed_s
    while time.perf_counter() < end or len(times) < 10:
        t0 = time.perf_counter()
        c0 = time.thread_time()
        sess.run(None, feed)
        c1 = time.thread_time()
        times.append(time.perf_counter() - t0)
        cpu.append(c1 - c0)
print(json.dumps({"t_first": t_first, "own_s": t_first - t_own, "first_s": first_s, "peak_rss": rss, "times": times, "cpu": cpu}))
"""


def catalogue(which: str) -> dict:
    """name -> {"description", "family", "source"} of a set."""
    if which == "real":
        return {n: {"description": m.description, "family": m.family, "source": m.source}
                for n, m in realworld.MODELS.items()}
    return {n: {"description": d, "family": "synthetic", "source": "onnx.helper (benchmarks/models.py)"}
            for n, (d, _) in SYNTHETIC.items()}


def prepare(name: str, which: str, reexport: bool = False) -> dict:
    """Obtain the ONNX model and its feed, build the .mrt (fixed shapes unless the model is a
    dynamic one) into benchmarks/.cache.  Raises StageError (export / build) on failure."""
    from minirt import builder
    import onnx

    CACHE.mkdir(exist_ok=True)
    try:
        values = {}
        if which == "real":
            onnx_path, feed, dynamic = realworld.obtain(name, reexport)
            cache = realworld.CACHE
            values = realworld.MODELS[name].input_values
            # Fixed shapes (as a deployment builds them) unless the model is the dynamic kind.
            shapes = None if dynamic else {k: list(v.shape) for k, v in feed.items() if k not in values}
        else:
            src, feed, shapes = SYNTHETIC[name][1]()  # (shapes None: the file's own, already fixed)
            dynamic, cache = False, CACHE
            onnx_path = CACHE / f"{name}.onnx"
            if isinstance(src, (str, os.PathLike)):
                onnx_path = Path(src)
            else:
                onnx.save(src, onnx_path)
    except Exception as exc:
        raise StageError("export", exc) from exc
    mrt_path = cache / f"{name}.mrt"
    t0 = time.perf_counter()
    try:
        # target "host": weights packed for this machine's kernels, as a deployment builds for its device
        builder.build(str(onnx_path), str(mrt_path), input_shapes=shapes, input_values=values, target="host")
    except Exception as exc:
        raise StageError("build", exc) from exc
    build_s = time.perf_counter() - t0
    feed_path = cache / f"{name}.feed.npz"
    np.savez(feed_path, **feed)
    return {"onnx": str(onnx_path), "mrt": str(mrt_path), "feed": feed, "feed_path": str(feed_path),
            "build_s": build_s, "dynamic": dynamic}


class StageError(Exception):
    """A model that could not be obtained, built or run: the stage and the original error."""

    def __init__(self, stage: str, exc: BaseException):
        self.stage = stage
        lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
        first = lines[0] if lines else ""
        self.text = f"{type(exc).__name__}: {first}"[:400]
        self.detail = "".join(traceback.format_exception(exc))[-3000:]
        super().__init__(f"{stage}: {self.text}")


def ort_session(path: str, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def sample_interleaved(fns: dict, runs: int, warmup: int) -> dict:
    """Like minirt.tools.timing.sample_interleaved (alternating order per round), timing each call
    by wall clock and by the calling thread's CPU clock: name -> (wall seconds, cpu seconds)."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    wall, thread = time.perf_counter, time.thread_time
    out: dict = {name: ([], []) for name in names}
    for i in range(runs):
        for name in names if i % 2 == 0 else reversed(names):
            fn = fns[name]
            t0 = wall()
            c0 = thread()
            fn()
            c1 = thread()
            out[name][0].append(wall() - t0)
            out[name][1].append(c1 - c0)
    return out


def max_abs_diff(a: list, b: list) -> float | str:
    """max |minirt - onnxruntime| over the outputs; a text when shapes differ (data-dependent outputs
    such as NMS boxes may keep a different number of boxes when scores tie within float error)."""
    worst = 0.0
    for i, (x, y) in enumerate(zip(a, b)):
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != y.shape:
            return f"output {i}: shape {x.shape} vs {y.shape}"
        if x.size:
            worst = max(worst, float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))))
    return worst


def program_status(session) -> str:
    """Whether the session's runs replay one native program (D32): "yes (N native calls)", "partly:
    ..." (If / Loop / Scan bodies do, the main graph has no memory plan) or "no: <node 'name' (Op)
    ...why>" as the recording reported it (Session.native_program_status)."""
    return session.native_program_status()


def latency(prep: dict, threads: int, seconds: float) -> dict:
    feed = prep["feed"]
    try:
        mine = minirt.Session(prep["mrt"], threads=threads)
        mine.run(None, feed)
    except Exception as exc:
        raise StageError("run", exc) from exc
    try:
        theirs = ort_session(prep["onnx"], threads)
        theirs.run(None, feed)
    except Exception as exc:
        raise StageError("onnxruntime", exc) from exc
    fns = {"minirt": lambda: mine.run(None, feed), "onnxruntime": lambda: theirs.run(None, feed)}
    if threads == 1:
        # Calibrate: enough interleaved rounds to fill ~`seconds`, within [15, 300].
        t0 = time.perf_counter()
        for f in fns.values():
            f()
            f()
        per_round = (time.perf_counter() - t0) / 2
        runs = int(min(300, max(15, seconds / max(per_round, 1e-6))))
        samples = sample_interleaved(fns, runs, warmup=3)
    else:  # worker threads of the two runtimes must not share this process (see latency_in_own_processes)
        samples = latency_in_own_processes(prep, threads, seconds)
    out = {}
    for k, (wall, cpu) in samples.items():
        out[k] = timing.summarize(wall)
        out[k]["cpu_median_s"] = statistics.median(cpu)
    a, b = mine.run(None, feed), theirs.run(None, feed)
    out["max_abs_diff"] = max_abs_diff(a, b)
    overheads = []
    for _ in range(5):
        _, prof = mine.run_profiled(feed)
        overheads.append(prof["overhead_per_node_s"])
    out["nodes"] = len(prof["nodes"])
    out["overhead_per_node_us"] = statistics.median(overheads) * 1e6
    # the timed runs: one native program (D32; the per-node overhead above is then not paid) or node by node
    for _ in range(3):  # (at 2 threads the timed runs were in other processes: plan and record here too)
        mine.run(None, feed)
    out["program"] = program_status(mine)
    out["native_program"] = out["program"].startswith("yes")
    out["ratio_median"] = out["minirt"]["median_s"] / out["onnxruntime"]["median_s"]
    out["ratio_p90"] = out["minirt"]["p90_s"] / out["onnxruntime"]["p90_s"]
    out["ratio_cpu"] = out["minirt"]["cpu_median_s"] / max(out["onnxruntime"]["cpu_median_s"], 1e-9)
    return out


# A probe run's address-space cap: a model whose run needs more fails there with MemoryError (and
# the node) instead of taking the machine's memory (minirt on SSDlite's NMS took 24 GB and was killed).
PROBE_MEMORY = 8 * 2**30


def _limit_memory():  # (in the child, before exec)
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (PROBE_MEMORY, PROBE_MEMORY))


def probe(prep: dict, timeout: float = 300.0) -> None:
    """Run the model once with minirt in a fresh process, capped in memory and time, so that a
    model that crashes, exhausts memory or hangs becomes a "run" error row instead of ending the
    benchmark.  Raises StageError("run") with the child's last error line."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(HERE.parent) + os.pathsep + env.get("PYTHONPATH", "")
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD, "minirt", prep["mrt"], prep["feed_path"], "1", "0"],
                              capture_output=True, text=True, timeout=timeout, env=env,
                              preexec_fn=_limit_memory if os.name == "posix" else None)
    except subprocess.TimeoutExpired:
        raise StageError("run", TimeoutError(f"one run took more than {timeout:.0f} s")) from None
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        why = lines[-1] if lines else f"killed by signal {-proc.returncode}" if proc.returncode < 0 else "failed"
        if "MemoryError" in proc.stderr and "MemoryError" not in why:
            why = f"MemoryError (over {PROBE_MEMORY / 2**30:.0f} GB): {why}"
        raise StageError("run", RuntimeError(f"{why} [exit {proc.returncode}]"))


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
    return {"cold_s": r["t_first"] - t_spawn, "own_s": r["own_s"], "first_s": r["first_s"], "peak_rss": r["peak_rss"],
            "times": r["times"], "cpu": r["cpu"]}


def latency_in_own_processes(prep: dict, threads: int, seconds: float, rounds: int = 4) -> dict:
    """Warm-run latency of each runtime in a process of its own, alternating runtimes ``rounds`` times:
    name -> (wall seconds, calling thread's cpu seconds).

    For 2+ threads: in one process the runtimes' worker threads disturb each other (onnxruntime's keep
    spinning for milliseconds after a call and take the core our worker needs; measured: MobileNet at
    2 threads 1.7 ms alone, 3.2 ms beside a spinning onnxruntime session), which no deployment sees.
    Alternating short blocks keeps the comparison side by side in time."""
    samples: dict = {"minirt": ([], []), "onnxruntime": ([], [])}
    for i in range(rounds):
        for rt in (("minirt", "onnxruntime") if i % 2 == 0 else ("onnxruntime", "minirt")):
            r = fresh_process(rt, prep, threads, seconds / (2 * rounds))
            samples[rt][0].extend(r["times"])
            samples[rt][1].extend(r["cpu"])
    return samples


def cold(prep: dict, threads: int, reps: int, steady: dict) -> dict:
    """Cold start, first run and peak RSS in fresh processes; ``steady``: runtime -> steady median (s)."""
    res: dict = {"minirt": [], "onnxruntime": []}
    for i in range(reps):
        order = ("minirt", "onnxruntime") if i % 2 == 0 else ("onnxruntime", "minirt")
        for rt in order:
            res[rt].append(fresh_process(rt, prep, threads))
    out = {}
    for rt, xs in res.items():
        out[rt] = {"cold_s": statistics.median(x["cold_s"] for x in xs),
                   "own_s": statistics.median(x["own_s"] for x in xs),
                   "first_s": statistics.median(x["first_s"] for x in xs),
                   "peak_rss": statistics.median(x["peak_rss"] for x in xs)}
        out[rt]["first_steady"] = out[rt]["first_s"] / steady[rt]
    out["cold_ratio"] = out["minirt"]["cold_s"] / out["onnxruntime"]["cold_s"]
    out["own_ratio"] = out["minirt"]["own_s"] / out["onnxruntime"]["own_s"]
    out["rss_ratio"] = out["minirt"]["peak_rss"] / out["onnxruntime"]["peak_rss"]
    return out


def fmt_ms(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def fmt_mb(b: float) -> str:
    return f"{b / 2**20:.0f} MB"


def fmt_diff(d) -> str:
    return d if isinstance(d, str) else f"{d:.2g}"


COLUMNS = ("model", "family", "shapes", "threads", "minirt median wall (thread CPU)",
           "onnxruntime median wall (thread CPU)", "latency ratio wall", "ratio thread CPU", "ratio p90",
           "native program", "cold start minirt / ort (ratio)",
           "own share of cold start minirt / ort (ratio)", "peak RSS minirt / ort (ratio)",
           "first run / steady minirt, ort", "µs/node (nodes)", "max abs diff")


def table(results: list) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in results:
        shapes = "dynamic" if r.get("dynamic") else "fixed"
        head = f"| {r['model']} | {r.get('family', '')} | {shapes} | {r['threads']} "
        if "error" in r:
            e = r["error"]
            text = e["text"].replace("|", "\\|")
            lines.append(head + f"| **{e['stage']} error**: {text} |" + " |" * (len(COLUMNS) - 5))
            continue
        lat, c = r["latency"], r["cold"]
        m, o = lat["minirt"], lat["onnxruntime"]
        program = lat.get("program", "").replace("|", "\\|")
        lines.append(
            head + f"| {fmt_ms(m['median_s'])} ({fmt_ms(m['cpu_median_s'])}) "
            f"| {fmt_ms(o['median_s'])} ({fmt_ms(o['cpu_median_s'])}) | **{lat['ratio_median']:.2f}x** "
            f"| {lat['ratio_cpu']:.2f}x | {lat['ratio_p90']:.2f}x | {program} "
            f"| {fmt_ms(c['minirt']['cold_s'])} / {fmt_ms(c['onnxruntime']['cold_s'])} (**{c['cold_ratio']:.2f}x**) "
            f"| {fmt_ms(c['minirt']['own_s'])} / {fmt_ms(c['onnxruntime']['own_s'])} (**{c['own_ratio']:.2f}x**) "
            f"| {fmt_mb(c['minirt']['peak_rss'])} / {fmt_mb(c['onnxruntime']['peak_rss'])} "
            f"(**{c['rss_ratio']:.2f}x**) "
            f"| {c['minirt']['first_steady']:.1f}x, {c['onnxruntime']['first_steady']:.1f}x "
            f"| {lat['overhead_per_node_us']:.1f} ({lat['nodes']}) | {fmt_diff(lat['max_abs_diff'])} |"
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
    """One panel per ratio (rows), models along x, a bar per thread count; failed models have no bar
    and are marked "error" on the x axis."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        print("matplotlib not installed (pip install -e '.[dev,bench]'): no plot", file=sys.stderr)
        return False
    models = list(dict.fromkeys(r["model"] for r in results))
    threads = sorted({r["threads"] for r in results})
    by = {(r["model"], r["threads"]): r for r in results if "error" not in r}
    failed = {r["model"] for r in results if "error" in r}
    labels = [f"{m} (error)" if m in failed and not any((m, t) in by for t in threads) else m for m in models]
    # Ratios on a log axis (2x slower and 2x faster are equally far from 1), except RSS.
    panels = [
        ("latency ratio (median wall time)", lambda r: r["latency"]["ratio_median"],
         [(1.0, "parity / goal"), (1.5, "milestone")], True),
        ("latency ratio (median CPU time of the calling thread)", lambda r: r["latency"]["ratio_cpu"],
         [(1.0, "parity")], True),
        ("cold start ratio (process spawn to first result)", lambda r: r["cold"]["cold_ratio"],
         [(1.0, "parity")], True),
        ("cold start ratio, the runtime's own share (import after numpy, session, first run)",
         lambda r: r["cold"]["own_ratio"], [(1.0, "parity"), (0.5, "goal")], True),
        ("peak RSS ratio", lambda r: r["cold"]["rss_ratio"], [(1.0, "parity / goal")], False),
        ("minirt first run / steady run", lambda r: r["cold"]["minirt"]["first_steady"], [(1.0, "no warm-up")],
         True),
    ]
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(12, 0.55 * len(models) * len(threads) + 3),
                                                      3.3 * len(panels)), constrained_layout=True)
    x = np.arange(len(models))
    width = 0.8 / len(threads)
    colours = ["#3b75af", "#ef8536", "#519e3e", "#c53a32"]
    for ax, (title, get, refs, log) in zip(axes, panels):
        allvals = []
        for j, t in enumerate(threads):
            vals = [get(by[(m, t)]) if (m, t) in by else np.nan for m in models]
            allvals += [v for v in vals if np.isfinite(v) and v > 0]
            bars = ax.bar(x + (j - (len(threads) - 1) / 2) * width, vals, width, label=f"{t} thread{'s' * (t > 1)}",
                          color=colours[j % len(colours)])
            for b, v in zip(bars, vals):
                if np.isfinite(v):
                    ax.annotate(f"{v:.2f}" if v < 10 else f"{v:.0f}", (b.get_x() + b.get_width() / 2, v),
                                ha="center", va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points")
        for y, label in refs:
            ax.axhline(y, color="grey", linestyle="--" if y == 1.0 else ":", linewidth=1)
            ax.annotate(label, (-0.45, y), ha="left", va="bottom", fontsize=8, color="grey")
        ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=8)
        ax.set_xlim(-0.6, len(models) - 0.4)
        ax.set_title(f"minirt / onnxruntime: {title} (lower is better{', log scale' if log else ''})"
                     if "minirt first" not in title else f"{title} (lower is better, log scale)", fontsize=10)
        allvals += [y for y, _ in refs]
        if log:
            ax.set_yscale("log")
            ax.set_ylim(min(allvals) / 1.6, max(allvals) * 2.5)
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
            ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        else:
            ax.set_ylim(0, max(max(allvals), 1.0) * 1.15)
        ax.legend(fontsize=8, loc="upper right")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", dest="which", choices=("real", "synthetic"), default="real",
                    help="real-world models (default, benchmarks/realworld.py) or the synthetic micro-benchmarks "
                         "(benchmarks/models.py)")
    ap.add_argument("--models", default="", help="comma-separated subset of the set (default: all of it)")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--seconds", type=float, default=4.0, help="latency sampling time per model and thread count")
    ap.add_argument("--cold-reps", type=int, default=3, help="fresh processes per runtime for cold start / RSS")
    ap.add_argument("--reexport", action="store_true", help="export the real models again (ignore the cache)")
    ap.add_argument("--out", default=str(HERE), help="directory for results.md/.json/.png (default benchmarks/)")
    ap.add_argument("--replot", action="store_true", help="only redraw results.png from results.json")
    realworld.add_native_kernels_flag(ap)
    args = ap.parse_args(argv)
    # The real set writes results.*, the synthetic micro-benchmarks results_synthetic.*
    stem = "results" if args.which == "real" else "results_synthetic"
    if args.replot:
        data = json.loads((Path(args.out) / f"{stem}.json").read_text(encoding="utf-8"))
        return 0 if plot(data["results"], Path(args.out) / f"{stem}.png") else 1
    realworld.require_native_kernels(ap, args.allow_numpy_kernels)
    known = catalogue(args.which)
    names = [m for m in args.models.split(",") if m] or list(known)
    unknown = [m for m in names if m not in known]
    if unknown:
        ap.error(f"unknown model(s) {unknown} in --set {args.which}; known: {list(known)}")
    thread_counts = [int(t) for t in args.threads.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # Cold start compares installed packages: numpy's and onnxruntime's bytecode was
    # compiled at install time, so compile minirt's too (an editable checkout run with
    # PYTHONDONTWRITEBYTECODE=1 would otherwise recompile every module in every child).
    import compileall

    compileall.compile_dir(str(Path(minirt.__file__).parent), quiet=1)
    env = environment()
    env["set"] = args.which
    print(f"# minirt vs onnxruntime, {args.which} set ({env['date']})\n")
    for k in ("machine", "python", "numpy", "minirt", "onnxruntime", "native", "blas", "load_average"):
        print(f"- {k}: {env[k]}")
    print(flush=True)
    results = []
    for name in names:
        info = {"model": name, **known[name]}
        try:
            prep = prepare(name, args.which, args.reexport)
        except StageError as exc:
            print(f"{name}: {exc}", file=sys.stderr, flush=True)
            results += [{**info, "threads": t, "error": {"stage": exc.stage, "text": exc.text, "detail": exc.detail}}
                        for t in thread_counts]
            continue
        info["dynamic"] = prep["dynamic"]
        info["build_s"] = prep["build_s"]
        try:
            probe(prep)
        except StageError as exc:
            print(f"{name}: {exc}", file=sys.stderr, flush=True)
            results += [{**info, "threads": t, "error": {"stage": exc.stage, "text": exc.text, "detail": exc.detail}}
                        for t in thread_counts]
            continue
        for t in thread_counts:
            print(f"{name}, {t} thread(s) ...", file=sys.stderr, flush=True)
            try:
                lat = latency(prep, t, args.seconds)
                steady = {rt: lat[rt]["median_s"] for rt in ("minirt", "onnxruntime")}
                try:
                    c = cold(prep, t, args.cold_reps, steady)
                except Exception as exc:
                    raise StageError("cold start", exc) from exc
                results.append({**info, "threads": t, "latency": lat, "cold": c})
            except StageError as exc:
                print(f"{name}: {exc}", file=sys.stderr, flush=True)
                results.append({**info, "threads": t,
                                "error": {"stage": exc.stage, "text": exc.text, "detail": exc.detail}})
    md = table(results)
    print(md)
    env["load_average_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    models_md = "\n".join(f"- **{n}** ({known[n]['family']}, {known[n]['source']}): {known[n]['description']}"
                          for n in names)
    errors = [r for r in results if "error" in r and r["threads"] == thread_counts[0]]
    errors_md = "".join(f"\n### {r['model']}: {r['error']['stage']} error\n\n```\n{r['error']['detail'].strip()}\n```\n"
                        for r in errors)
    doc = (
        f"# minirt vs onnxruntime: {args.which} set\n\nGenerated by `python benchmarks/run.py "
        f"{' '.join(sys.argv[1:]) or '--set real'}` on {env['date']}. Ratios are "
        "minirt / onnxruntime (lower is better for minirt). Latency: both runtimes in one process, calls "
        "interleaved at 1 thread; at 2 threads each runtime runs in a process of its own, the two alternating in "
        "4 rounds (in one process onnxruntime's spinning workers take the core ours need). Wall time and, in "
        "brackets, the CPU time of the calling thread (`time.thread_time()`; worker threads not counted). "
        "Shapes: \"fixed\" models are built with the feed's input shapes (`input_shapes`), \"dynamic\" ones "
        "keep their dynamic dimensions (control flow, variable-length inputs). "
        "Cold start: process spawn to first result in a fresh `python -c` (import, load, one run); its own share: from after numpy is imported and the feed loaded to the first result (importing the runtime, creating the session, the first run). "
        "First run / steady: those processes' first `run` after loading against the steady median. "
        "Peak RSS: the same fresh processes after 4 runs (interpreter and numpy included for both). "
        "minirt's bytecode is compiled before the cold-start runs, as an install would have it. "
        "Native program: \"yes\" when the timed runs replayed one native program without Python between the "
        "nodes (docs/decisions.md D32); \"partly\" when the main graph has no memory plan but its If / Loop "
        "bodies replay native programs of their own (D76); else the node that stopped the recording and why. "
        "µs/node: minirt's Python overhead per node when the nodes run one by one.\n\n"
        + "\n".join(f"- {k}: {env[k]}" for k in ("machine", "python", "numpy", "minirt", "onnxruntime", "native",
                                               "blas", "load_average", "load_average_end"))
        + f"\n\nModels:\n\n{models_md}\n\n{md}\n\n![ratios]({stem}.png)\n"
        + (f"\n## Errors\n{errors_md}" if errors else "")
    )
    (out / f"{stem}.md").write_text(doc, encoding="utf-8")
    (out / f"{stem}.json").write_text(json.dumps({"environment": env, "results": results}, indent=1),
                                      encoding="utf-8")
    if plot(results, out / f"{stem}.png"):
        print(f"\nwrote {out / stem}.md, .json, .png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
