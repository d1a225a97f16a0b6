"""``minirt verify model.mrt``: run every partition on each available provider
and compare with the golden outputs the builder stored (the CPU result on a
reference input).

Per partition and provider: max absolute error, max error relative to the
golden output's largest magnitude, and pass/fail against ``rtol``; a
provider that is not available here is reported with the reason.
"""
from __future__ import annotations

import numpy as np

from minirt import providers as providers_mod


def verify(path, rtol: float = 1e-2, providers=None, verify_key=None, require_signature=None) -> dict:
    """Report per partition and provider how far the provider is from the golden outputs (the artifact loaded
    under the trust policy of ``verify_key`` / ``require_signature``, as a Session takes them)."""
    import minirt

    cpu_sess = minirt.Session(path, providers=[providers_mod.CPU], verify_key=verify_key,
                              require_signature=require_signature)
    art = cpu_sess.artifact
    names = providers if providers is not None else sorted({p.provider for p in art.partitions})
    report = {"partitions": [], "providers": {n: providers_mod.availability(n) for n in set(p.provider for p in art.partitions)}}
    for index, part in enumerate(art.partitions):
        row = {"partition": index, "provider": part.provider, "nodes": part.node_count, "results": []}
        if not part.golden_outputs:
            row["results"].append({"runs_on": None, "status": "no golden outputs stored"})
            report["partitions"].append(row)
            continue
        golden_in = [art.tensor(t) for t in part.golden_inputs]
        golden_out = [art.tensor(t) for t in part.golden_outputs]
        candidates = []
        if part.provider in names:
            ok, why = providers_mod.availability(part.provider)
            if ok:
                candidates.append(part.provider)
            else:
                row["results"].append({"runs_on": part.provider, "status": f"not available: {why}"})
        for who in candidates:
            try:
                call = providers_mod.get(who).compile(art.provider_blob(part.blob), part, art, dict(part.options))
                outs = call(*golden_in)
            except Exception as exc:  # noqa: BLE001 - report, don't crash
                row["results"].append({"runs_on": who, "status": f"failed: {type(exc).__name__}: {exc}"})
                continue
            row["results"].append(_compare(who, outs, golden_out, rtol))
        report["partitions"].append(row)
    return report


def _compare(who, outs, golden, rtol):
    max_abs, max_rel = 0.0, 0.0
    for got, want in zip(outs, golden):
        got = np.asarray(got, dtype=np.float64)
        want = np.asarray(want, dtype=np.float64)
        if got.shape != want.shape:
            return {"runs_on": who, "status": f"shape {got.shape} != golden {want.shape}"}
        err = float(np.abs(got - want).max()) if want.size else 0.0
        scale = float(np.abs(want).max()) if want.size else 0.0
        max_abs = max(max_abs, err)
        max_rel = max(max_rel, err / scale if scale else err)
    return {"runs_on": who, "max_abs": max_abs, "max_rel": max_rel, "status": "ok" if max_rel <= rtol else "MISMATCH"}


def format_verify(report: dict) -> str:
    lines = []
    for name, (ok, why) in sorted(report["providers"].items()):
        lines.append(f"provider {name}: {'available' if ok else 'not available'} ({why})")
    for row in report["partitions"]:
        head = f"partition {row['partition']} ({row['provider']}, {row['nodes']} nodes)"
        if not row["results"]:
            lines.append(f"{head}: provider not run (not in the requested providers)")
        for r in row["results"]:
            if "max_abs" in r:
                lines.append(f"{head} on {r['runs_on']}: max abs {r['max_abs']:.3g}, max rel {r['max_rel']:.3g} -> {r['status']}")
            else:
                lines.append(f"{head}: {r['status']}")
    if not report["partitions"]:
        lines.append("the artifact has no partitions")
    return "\n".join(lines)
