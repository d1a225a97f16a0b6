"""What a sweep writes: the results table (CSV and JSON), a Pareto plot per target, the chosen artifacts.

In the output folder (``sweep.output``, ``--out``)::

    results.csv, results.json      every candidate, one row each (columns: :data:`COLUMNS`)
    pareto-<target>.png            metric against modeled latency, one panel per task (matplotlib)
    chosen/<task>@<target>.mrt     the chosen artifact (a copy of the cached build)
    chosen/<task>@<target>.json    its row, its build report and the limits it met

Latency columns are labelled by where they come from: ``latency_modeled_ms`` (the target profile's
cost model, what the objective uses) and ``latency_host_ms`` (timed on the machine that evaluated it,
for information).  Every file is written to a temporary name and renamed (minirt.tools.atomic_file).
"""
from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

from minirt.tools import atomic_file

COLUMNS = ("candidate", "model", "task", "target", "label", "status", "quantize", "quantize_built",
           "calibration_method", "per_channel", "symmetric_activations", "accuracy_budget", "opt_level",
           "input_shapes", "quantize_final", "weight_pack", "metric", "accuracy", "size_bytes",
           "latency_modeled_ms", "modeled_cost_mmac", "latency_modeled_basis", "latency_host_ms",
           "latency_host_basis", "feasible", "infeasible_reason", "pareto", "chosen", "cached", "build_s", "eval_s",
           "eval_samples", "eval_shards", "error", "build_key", "eval_key")


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True, separators=(",", ":"))
    return str(v)


def write_table(rows: list[dict], out_dir: Path, header: dict) -> tuple[Path, Path]:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in rows:
        w.writerow([_cell(r.get(c)) for c in COLUMNS])
    csv_path, json_path = out_dir / "results.csv", out_dir / "results.json"
    atomic_file.write(csv_path, buf.getvalue().encode("utf-8"))
    doc = {**header, "columns": list(COLUMNS), "candidates": rows}
    atomic_file.write(json_path, json.dumps(doc, indent=1, default=str).encode("utf-8"))
    return csv_path, json_path


def write_chosen(choice: dict, row: dict | None, artifact: bytes | None, build_meta: dict | None, out_dir: Path) -> dict:
    """``chosen/<task>@<target>.{mrt,json}``; returns the paths written (a stale artifact of an earlier
    sweep is removed when this one chose nothing for the pair)."""
    folder = out_dir / "chosen"
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{choice['task']}@{choice['target']}"
    mrt, meta = folder / f"{stem}.mrt", folder / f"{stem}.json"
    doc = dict(choice)
    if row is not None and artifact is not None:
        atomic_file.write(mrt, artifact)
        doc.update({"artifact": str(mrt), "row": row, "build_report": (build_meta or {}).get("report")})
    else:
        try:
            os.unlink(mrt)
        except FileNotFoundError:
            pass
        doc["artifact"] = None
    atomic_file.write(meta, json.dumps(doc, indent=1, default=str).encode("utf-8"))
    return {"artifact": str(mrt) if doc["artifact"] else None, "report": str(meta)}


_MODE_COLOURS = {"none": "#1f77b4", "fp16": "#2ca02c", "int8-dynamic": "#ff7f0e", "int8": "#d62728", "auto": "#9467bd"}


def _front_2d(rows: list[dict], higher: bool) -> list[dict]:
    """The points no other beats on both the metric and the modeled latency, by latency."""
    front, best = [], None
    for r in sorted(rows, key=lambda r: (r["latency_modeled_ms"], -r["accuracy"] if higher else r["accuracy"])):
        v = r["accuracy"] if higher else -r["accuracy"]
        if best is None or v > best:
            front.append(r)
            best = v
    return front


def plot_target(target: str, groups: dict[str, list[dict]], metric_names: dict[str, str],
                higher: dict[str, bool], limits: dict[str, dict], chosen: dict[str, str | None], path: Path) -> Path:
    """One figure for ``target``: per task, the metric against the modeled latency (log scale), marker
    area by artifact size, colour by quantization mode, the Pareto front as a step line, the latency
    limit as a dashed line, infeasible points hollow, the choice starred."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    tasks = list(groups)
    fig, axes = plt.subplots(1, len(tasks), figsize=(6.0 * len(tasks), 4.6), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        rows = [r for r in groups[task] if r.get("status") == "ok" and r.get("accuracy") is not None]
        with_lat = [r for r in rows if r.get("latency_modeled_ms") is not None]
        if not with_lat:
            ax.text(0.5, 0.5, "no candidate with a modeled latency", ha="center", va="center", transform=ax.transAxes)
            ax.set_title(f"{task} on {target}")
            continue
        sizes = [r["size_bytes"] for r in with_lat]
        smax = max(sizes)
        for mode, colour in _MODE_COLOURS.items():
            pts = [r for r in with_lat if r["quantize"] == mode]
            if not pts:
                continue
            for feasible in (True, False):
                sel = [r for r in pts if bool(r.get("feasible")) == feasible]
                if not sel:
                    continue
                ax.scatter([r["latency_modeled_ms"] for r in sel], [r["accuracy"] for r in sel],
                           s=[20 + 180 * r["size_bytes"] / smax for r in sel],
                           facecolors=colour if feasible else "none", edgecolors=colour, alpha=0.8,
                           label=f"{mode}" if feasible else f"{mode} (over a limit)")
        front = _front_2d(with_lat, higher[task])
        ax.step([r["latency_modeled_ms"] for r in front], [r["accuracy"] for r in front], where="post",
                color="black", linewidth=1, alpha=0.6, label="Pareto front (metric, latency)")
        lim = limits[task].get("max_latency_ms")
        lats = [r["latency_modeled_ms"] for r in with_lat]
        if lim is not None and lim <= 4 * max(lats):  # (a limit far right of every point would squash them)
            ax.axvline(lim, color="grey", linestyle="--", linewidth=1, label=f"max latency {lim:g} ms")
        pick = next((r for r in with_lat if r["candidate"] == chosen.get(task)), None)
        if pick is not None:
            ax.scatter([pick["latency_modeled_ms"]], [pick["accuracy"]], marker="*", s=320, color="gold",
                       edgecolors="black", zorder=5, label="chosen")
            ax.annotate(pick["label"], (pick["latency_modeled_ms"], pick["accuracy"]), textcoords="offset points",
                        xytext=(6, -14), fontsize=7)
        ax.set_xscale("log")
        plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
        ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_formatter(plain)
        ax.tick_params(axis="x", which="minor", labelsize=7)
        ax.set_xlabel("latency modeled on the target (ms, cost model; not timed)")
        arrow = "higher is better" if higher[task] else "lower is better"
        ax.set_ylabel(f"{metric_names[task]} ({arrow})")
        size_note = f", max size {limits[task]['max_size']} B" if limits[task].get("max_size") else ""
        ax.set_title(f"{task} on {target} (marker area: artifact size{size_note})", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_file.write(path, buf.getvalue())
    return path


def summary_lines(result) -> list[str]:
    """The end-of-sweep summary (run.SweepResult)."""
    rows = result.rows
    counts = {s: sum(1 for r in rows if r["status"] == s) for s in ("ok", "failed", "error")}
    cached = sum(1 for r in rows if r.get("cached"))
    lines = [f"sweep {result.name}: {len(rows)} candidates ({counts['ok']} ok, {counts['failed']} failed to build, "
             f"{counts['error']} errors; {cached} from the cache) in {result.wall_s:.1f} s on {result.workers}"]
    for c in result.choices:
        head = f"  {c['task']} @ {c['target']}: "
        if c["candidate"] is None:
            lines.append(head + f"no choice: {c['reason']}")
            continue
        r = result.by_id[c["candidate"]]
        lat = f"{r['latency_modeled_ms']:.4g} ms modeled" if r.get("latency_modeled_ms") is not None else "latency unknown"
        host = f", {r['latency_host_ms']:.3g} ms on the host" if r.get("latency_host_ms") is not None else ""
        lines.append(head + f"{r['label']}: {r['metric']} {r['accuracy']:.4g}, {r['size_bytes'] / 1024:.1f} KiB, "
                            f"{lat}{host} ({c['feasible_count']} of {c['candidates']} within the limits) -> "
                            f"{c['artifact']}")
    lines.append(f"  table: {result.csv_path} and {result.json_path}")
    for p in result.plots:
        lines.append(f"  plot: {p}")
    return lines
