"""Text renderings of build reports stored in an artifact's metadata.

Lives in the runtime so that ``minirt inspect`` can show them on a device
without the builder installed; the builder prints the same tables.
"""
from __future__ import annotations

import collections
from typing import Mapping

from minirt import vocabulary


def format_report(d: Mapping) -> str:
    """Text table of a report (also works on the dict kept in artifact metadata)."""
    # Reports stored before the quantizer's passes had one have no "stage": the optimizer's.
    stage = d.get("stage", "optimizer")
    title = f"optimizer (opt-level {d['opt_level']})" if stage == "optimizer" else f"{stage} passes"
    # (the timings are the build's: an artifact's copy of the report has none, D174)
    timed = "seconds" in d
    lines = [
        f"{title}: nodes {d['nodes_before']} -> {d['nodes_after']} in {d['iterations']} sweep(s)"
        + (f", {d['seconds'] * 1000:.0f} ms" if timed else "")
        + ("" if d.get("converged", True) else " (stopped before a fixed point)")
    ]
    if d.get("disabled"):
        lines.append("  disabled: " + ", ".join(d["disabled"]))
    lines.append(f"  {'pass':<28} {'before':>7} {'after':>7} {'removed':>8}" + (f" {'ms':>8}" if timed else ""))
    for row in d["passes"]:
        lines.append(
            f"  {row['name']:<28} {row['nodes_before']:>7} {row['nodes_after']:>7} {row['nodes_removed']:>8}"
            + (f" {row['seconds'] * 1000:>8.1f}" if timed else "")
        )
    refused = [(row["name"], r) for row in d["passes"] for r in row["refused"]]
    if refused:
        lines.append(f"  refused matches ({len(refused)}):")
        for name, r in refused[:30]:
            lines.append(f"    {name}: {r['pattern']} at {r['node']!r}: {r['reason']}")
        if len(refused) > 30:
            lines.append(f"    ... and {len(refused) - 30} more (see the artifact metadata)")
    return "\n".join(lines)


def format_sensitivity(budget: dict, top: int = 10, indent: str = "    ") -> list[str]:
    """The per-layer sensitivity table of a budget fit (each layer quantized alone, the others float;
    most sensitive first), its ``top`` rows, or one line saying why there is none."""
    rows = budget.get("sensitivity") or {}
    if not rows:
        return [f"{indent}sensitivity: not measured (the budget held with every layer quantized)"] if budget.get(
            "met") else []
    metric = str(budget.get("spec", "")).split("<")[0].split(">")[0] or "metric"
    lines = [f"{indent}sensitivity (each layer quantized alone, the others float), most sensitive first:"]
    width = max(len(n) for n in list(rows)[:top])
    for name, r in list(rows.items())[:top]:
        lines.append(f"{indent}  {name:<{width}}  {metric} {r['metric']:.5g}  cosine deficit {r['cosine_deficit']:.3g}")
    if len(rows) > top:
        lines.append(f"{indent}  ... {len(rows) - top} more (--json)")
    return lines


def format_partition_report(report: dict, max_cpu_nodes: int = 40) -> list[str]:
    """``PartitionPlan.report()`` (e.g. ``BuildReport.partitions``) as report lines."""
    if not report or not report.get("providers") and not report.get("notes"):
        return []
    parts = report.get("partitions", [])
    nodes = report.get("nodes") or 0
    share_of_nodes = (f"{report.get('accelerated_nodes', 0)} of {nodes} nodes "
                      f"({100 * report.get('accelerated_nodes', 0) / nodes:.1f}%) and " if nodes else "")
    lines = [
        f"  partitions: {len(parts)}; {share_of_nodes}{report.get('accelerated_share', 0) * 100:.1f}% of the "
        f"estimated {report.get('total_flops', 0) / 1e6:.1f} MFLOPs on accelerators "
        f"({', '.join(report.get('providers', [])) or 'none'})"
    ]
    unknown = report.get("unknown_cost_nodes", [])
    if unknown:
        on_cpu = [row for row in unknown if row["runs_on"] == vocabulary.CPU]
        ops = collections.Counter(row["op"] for row in on_cpu)
        lines.append(f"    FLOPs unknown for {len(unknown)} node(s) (shapes or op without an estimate), "
                     f"{len(on_cpu)} of them on the CPU" + (f": {', '.join(f'{op} x{k}' for op, k in ops.most_common())}"
                                                             if on_cpu else "")
                     + "; the FLOPs shares count the estimated nodes only")
    for p in parts:
        lines.append(f"    #{p['index']} {p['provider']}: {p['nodes']} nodes, {p['flops_share'] * 100:.1f}% FLOPs, "
                     f"{len(p['inputs'])} in / {len(p['outputs'])} out, program {p['blob_bytes'] / 1024:.1f} KiB"
                     + (f", golden tensors {p['golden_bytes'] / 1024:.1f} KiB" if p.get("golden_bytes") else "")
                     + ("" if p.get("cpu_version", True) else ", no CPU version"))
    lines += [f"    note: {n}" for n in report.get("notes", [])]
    cpu = report.get("cpu_nodes", [])
    if cpu:
        lines.append(f"  on the CPU: {len(cpu)} node(s)")
        for i, row in enumerate(cpu):
            if i >= max_cpu_nodes:
                lines.append(f"    ... and {len(cpu) - max_cpu_nodes} more (see build.partitions)")
                break
            lines.append(f"    {row['node']} ({row['op']}): {row['reason']}")
    return lines
