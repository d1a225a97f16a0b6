"""``minirt verify model.mrt``: run every partition on each available provider
and compare with the golden outputs the builder stored (the CPU result on a
reference input).

Off the device, where a partition's provider is not available, its program runs on
the reference that this machine has for it (issue 27): an NNAPI program through its
TFLite translation on the TFLite interpreter (ai-edge-litert or tflite-runtime), a
Core ML program on minirt's MIL evaluator (minirt/tools/mil_eval.py, needs
coremltools).  A provider with neither is reported as not verified, with the reason.

Per partition and provider: max absolute error, max error relative to the
golden output's largest magnitude, and pass/fail against ``rtol``.
"""
from __future__ import annotations

import numpy as np

from minirt import providers as providers_mod


def verify(path, rtol: float = 1e-2, providers=None, verify_key=None, require_signature=None) -> dict:
    """Report per partition and provider how far the provider is from the golden outputs (the artifact loaded
    under the trust policy of ``verify_key`` / ``require_signature``, as a Session takes them)."""
    from minirt.format import reader
    from minirt.session import trusted_keys

    # (the artifact alone, no session: a thin one, --no-cpu-fallback, has no CPU version to compile)
    art = reader.load(path, verify_key=trusted_keys(verify_key, require_signature))
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
        runs = []  # (who runs it, compile(blob, partition, artifact, options) -> callable)
        if part.provider in names:
            ok, why = providers_mod.availability(part.provider)
            if ok:
                runs.append((part.provider, providers_mod.get(part.provider).compile))
            else:  # (off the device: the reference this machine has, the provider's absence said once above)
                compile_reference, what = _off_device_reference(part.provider)
                if compile_reference is not None:
                    runs.append((f"{part.provider} off-device ({what})", compile_reference))
                else:
                    row["results"].append({"runs_on": part.provider, "status": f"not verified: {what}"})
        for who, compile_program in runs:
            try:
                call = compile_program(art.provider_blob(part.blob), part, art, dict(part.options))
                outs = call(*golden_in)
            except Exception as exc:  # noqa: BLE001 - report, don't crash
                row["results"].append({"runs_on": who, "status": f"failed: {type(exc).__name__}: {exc}"})
                continue
            row["results"].append(_compare(who, outs, golden_out, rtol))
        report["partitions"].append(row)
    return report


def failed(report: dict) -> bool:
    """Whether a partition's program disagreed with its golden outputs or failed to run."""
    return any(r["status"] == "MISMATCH" or r["status"].startswith(("failed", "shape"))
               for row in report["partitions"] for r in row["results"])


def _off_device_reference(provider: str):
    """(compile(blob, partition, artifact, options) -> callable, what it is) of the reference that runs a
    ``provider`` partition on this machine, or (None, why there is none).  Both references are desktop
    tools: the device wheel has neither the TFLite translation (minirt.targets) nor the MIL evaluator."""
    import importlib.util

    needs = {"nnapi": "minirt.targets", "coreml": "minirt.tools.mil_eval"}.get(provider)
    if needs is not None and importlib.util.find_spec(needs) is None:
        return None, (f"this install has no {needs} (a device install runs the provider itself; the "
                      "off-device reference needs the full install: pip install 'minirt[builder]')")
    if provider == "nnapi":
        from minirt.providers import tflite

        if tflite._interpreter_module() is None:
            return None, ("no TFLite interpreter here to run the NNAPI program's TFLite translation "
                          "(pip install ai-edge-litert)")
        return _nnapi_on_tflite, "its TFLite translation on the TFLite interpreter"
    if provider == "coreml":
        if importlib.util.find_spec("coremltools") is None:
            return None, "no coremltools here to read the ML program for minirt's MIL evaluator"
        return _coreml_on_mil_evaluator, "minirt's MIL evaluator (its spec evaluator for tree / GLM models)"
    return None, f"no off-device reference for {provider}"


def _nnapi_on_tflite(blob, partition, artifact, options):
    """An NNAPI partition's program, translated to TFLite (targets/tflite) and run on the interpreter."""
    from minirt.providers.tflite import program_from_flatbuffer
    from minirt.targets.nnapi.model import NNModel
    from minirt.targets.tflite.translate import to_tflite

    model = NNModel.from_bytes(bytes(blob), artifact)  # (shared weights: the artifact's tensors)
    header = {"input_map": model.input_map, "input_perm": model.input_perm, "output_perm": model.output_perm}
    return program_from_flatbuffer(to_tflite(model), header)


def _coreml_on_mil_evaluator(blob, partition, artifact, options):
    """A Core ML partition's ML program on minirt's MIL evaluator (minirt/tools/mil_eval.py); a classical
    model (tree ensemble / GLM spec) on minirt's spec evaluator (minirt/tools/coreml_spec_eval.py)."""
    from minirt.providers.coreml import SPEC_FORMAT, io_names
    from minirt.tools import mil_eval

    if options.get("format") == SPEC_FORMAT:
        from minirt.tools import coreml_spec_eval

        return coreml_spec_eval.compile_reference(blob, partition, artifact, options)

    _, program = mil_eval.read_package(bytes(blob))
    in_names, out_names = io_names(partition, options)

    def run(*arrays):
        results = mil_eval.run_program(program, dict(zip(in_names, arrays)))
        return tuple(results[n] for n in out_names)

    return run


def _compare(who, outs, golden, rtol):
    max_abs, max_rel = 0.0, 0.0
    non_finite = 0  # values the program made NaN / infinite where the golden output is finite
    for got, want in zip(outs, golden):
        if np.asarray(want).dtype.kind in "OUS" or np.asarray(got).dtype.kind in "OUS":
            # labels (strings): equal or not; a difference counts as a relative error of 1
            same = np.asarray(got).shape == np.asarray(want).shape and bool(np.all(np.asarray(got) == np.asarray(want)))
            max_rel = max(max_rel, 0.0 if same else 1.0)
            continue
        got = np.asarray(got, dtype=np.float64)
        want = np.asarray(want, dtype=np.float64)
        if got.shape != want.shape:
            return {"runs_on": who, "status": f"shape {got.shape} != golden {want.shape}"}
        # Equal values (infinities of one sign, NaN against NaN included) differ by 0; a NaN or an
        # infinity against anything else is an infinite error (np.max would skip a NaN: a program
        # that made NaNs used to pass)
        same = (got == want) | (np.isnan(got) & np.isnan(want))
        with np.errstate(invalid="ignore"):  # (inf - inf: NaN, made infinite below)
            diff = np.where(same, 0.0, np.abs(got - want))
        diff[np.isnan(diff)] = np.inf
        non_finite += int(np.count_nonzero(~np.isfinite(got) & np.isfinite(want)))
        err = float(diff.max()) if want.size else 0.0
        finite = want[np.isfinite(want)]
        scale = float(np.abs(finite).max()) if finite.size else 0.0
        max_abs = max(max_abs, err)
        max_rel = max(max_rel, err / scale if scale else err)
    return {"runs_on": who, "max_abs": max_abs, "max_rel": max_rel, "non_finite": non_finite,
            "status": "ok" if max_rel <= rtol else "MISMATCH"}


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
                if r.get("non_finite"):
                    hint = (" (float16 overflow? build with --coreml-precision fp32)"
                            if row["provider"] == "coreml" else "")
                    lines.append(f"  {r['non_finite']} output value(s) are NaN or infinite where the golden ones are "
                                 f"finite{hint}")
            else:
                lines.append(f"{head}: {r['status']}")
    if not report["partitions"]:
        lines.append("the artifact has no partitions")
    return "\n".join(lines)
