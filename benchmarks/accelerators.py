"""Accelerator coverage on the real-world benchmark set (issue 27): each model built with its input
shapes fixed (the feed's, as a deployment would) for ``--target macos`` (Core ML) and
``--target android-api34`` (NNAPI), and the build report read back.

Per model and target: the nodes on the accelerator, the share of the estimated FLOPs there (with the
count of nodes whose FLOPs are unknown), the partitions, the artifact's size with the CPU fallback
and without it (``--no-cpu-fallback``), and the ops left on the CPU.  Nothing is timed: the figures
are the builder's plan; ``minirt verify`` checks the programs.

    python -m benchmarks.accelerators [--models a,b] [--out benchmarks/results_accelerators.md]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile

from benchmarks import realworld
from minirt.builder import build
from minirt.builder.errors import BuildError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = ("macos", "android-api34")


def coverage(name: str, target: str) -> dict:
    """One model's build for ``target``: its partition report and the two artifact sizes."""
    path, feed, _ = realworld.obtain(name)
    shapes = {k: list(v.shape) for k, v in feed.items()}
    values = realworld.MODELS[name].input_values or None
    with tempfile.TemporaryDirectory() as tmp:
        full = build(path, os.path.join(tmp, "full.mrt"), target=target, input_shapes=shapes, input_values=values)
        try:
            thin = build(path, os.path.join(tmp, "thin.mrt"), target=target, input_shapes=shapes,
                         input_values=values, cpu_fallback=False).artifact_bytes
        except BuildError:
            thin = None
    report = full.partitions or {}
    cpu_ops = collections.Counter(row["op"] for row in report.get("cpu_nodes", []))
    return {"model": name, "target": target, "nodes": report.get("nodes", 0),
            "accelerated_nodes": report.get("accelerated_nodes", 0),
            "flops_share": report.get("accelerated_share", 0.0), "mflops": report.get("total_flops", 0.0) / 1e6,
            "unknown_cost_nodes": len(report.get("unknown_cost_nodes", [])),
            "partitions": len(report.get("partitions", [])), "artifact_bytes": full.artifact_bytes,
            "thin_bytes": thin, "source_bytes": full.source_bytes,
            "cpu_ops": dict(cpu_ops.most_common())}


def _row(r: dict) -> str:
    nodes = f"{r['accelerated_nodes']}/{r['nodes']} ({100 * r['accelerated_nodes'] / r['nodes']:.0f}%)" if r["nodes"] else "-"
    unknown = f" ({r['unknown_cost_nodes']} unknown)" if r["unknown_cost_nodes"] else ""
    thin = f"{r['thin_bytes'] / 2**20:.1f}" if r["thin_bytes"] else "-"
    cpu = ", ".join(f"{op} x{n}" for op, n in r["cpu_ops"].items()) or "-"
    return (f"| {r['model']} | {r['target']} | {nodes} | {100 * r['flops_share']:.1f}%{unknown} | {r['partitions']} | "
            f"{r['source_bytes'] / 2**20:.1f} | {r['artifact_bytes'] / 2**20:.1f} | {thin} | {cpu} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None, help="comma-separated names (default: the whole set)")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results_accelerators.md"))
    args = parser.parse_args()
    names = args.models.split(",") if args.models else list(realworld.MODELS)
    lines = ["| model | target | nodes on the accelerator | estimated FLOPs there | partitions | source MiB | "
             "artifact MiB | --no-cpu-fallback MiB | left on the CPU |", "|---|---|---|---|---|---|---|---|---|"]
    rows = []
    for name in names:
        for target in TARGETS:
            try:
                r = coverage(name, target)
            except Exception as exc:  # noqa: BLE001 - one model's failure is a row, not the end of the table
                lines.append(f"| {name} | {target} | build failed: {type(exc).__name__}: {str(exc)[:120]} |||||||")
                print(lines[-1], flush=True)
                continue
            rows.append(r)
            lines.append(_row(r))
            print(lines[-1], flush=True)
    with open(args.out, "w") as f:
        f.write("# Accelerator coverage on the real-world set (issue 27)\n\n"
                "`python -m benchmarks.accelerators`: each model built with its feed's input shapes fixed; the "
                "builder's partition report (estimated FLOPs: unknown costs are counted apart, never as 0).\n\n"
                + "\n".join(lines) + "\n")
    with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
