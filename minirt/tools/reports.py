"""Text renderings of build reports stored in an artifact's metadata.

Lives in the runtime so that ``minirt inspect`` can show them on a device
without the builder installed; the builder prints the same tables.
"""
from __future__ import annotations

from typing import Mapping


def format_report(d: Mapping) -> str:
    """Text table of a report (also works on the dict kept in artifact metadata)."""
    # Reports stored before the quantizer's passes had one have no "stage": the optimizer's.
    stage = d.get("stage", "optimizer")
    title = f"optimizer (opt-level {d['opt_level']})" if stage == "optimizer" else f"{stage} passes"
    lines = [
        f"{title}: nodes {d['nodes_before']} -> {d['nodes_after']} "
        f"in {d['iterations']} sweep(s), {d['seconds'] * 1000:.0f} ms"
        + ("" if d.get("converged", True) else " (stopped before a fixed point)")
    ]
    if d.get("disabled"):
        lines.append("  disabled: " + ", ".join(d["disabled"]))
    lines.append(f"  {'pass':<28} {'before':>7} {'after':>7} {'removed':>8} {'ms':>8}")
    for row in d["passes"]:
        lines.append(
            f"  {row['name']:<28} {row['nodes_before']:>7} {row['nodes_after']:>7} "
            f"{row['nodes_removed']:>8} {row['seconds'] * 1000:>8.1f}"
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
