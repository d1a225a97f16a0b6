"""One comparison of a case's outputs with the expected ones, shared by the test subset (inside the
emulated Pi) and the device check (on the host, for the outputs a packaged model wrote on the device
root).  Needs numpy only.

The rules (the tolerances are in the manifest that ``tests/arm64/prepare.py`` writes, from
``tests/arm64/subset.py``; why they are what they are: docs/packaging.md, "Tolerances"):

* every output has onnxruntime's dtype and shape; float outputs within ``assert_allclose(rtol, atol)``
  of onnxruntime's, others equal;
* a labelled case has onnxruntime's accuracy (the argmax of its one output against the true labels);
* a case with ``x86_rel`` (artifacts minirt quantized) is also within ``x86_rel * max|x86|`` of minirt's
  own outputs on the x86-64 host.
"""
from __future__ import annotations

import numpy as np


def check_outputs(name: str, case: dict, got: dict, expected: dict, labels=None, x86: dict | None = None) -> list[str]:
    """The lines that describe the differences found (for the log); AssertionError on any rule broken."""
    lines = []
    for out in case["outputs"]:
        assert out in got, f"{name}: no output {out!r} (got {sorted(got)})"
        e, a = expected[out], np.asarray(got[out])
        assert a.dtype == e.dtype, f"{name}/{out}: dtype {a.dtype} != {e.dtype}"
        assert a.shape == e.shape, f"{name}/{out}: shape {a.shape} != {e.shape}"
        if e.dtype.kind in "fc":
            np.testing.assert_allclose(a, e, rtol=case["rtol"], atol=case["atol"], err_msg=f"{name}/{out}")
            diff = float(np.abs(a.astype(np.float64) - e).max()) if e.size else 0.0
            lines.append(f"{name}/{out}: max |minirt - onnxruntime| {diff:.3g} (atol {case['atol']:.3g}, "
                         f"rtol {case['rtol']:.3g}, max |onnxruntime| {float(np.abs(e).max()) if e.size else 0:.3g})")
        else:
            np.testing.assert_array_equal(a, e, err_msg=f"{name}/{out}")
    if labels is not None:
        first = case["outputs"][0]
        logits, ref = np.asarray(got[first]), expected[first]
        acc, ref_acc = (logits.argmax(1) == labels).mean(), (ref.argmax(1) == labels).mean()
        assert acc == ref_acc, f"{name}: accuracy {acc} != onnxruntime's {ref_acc}"
        assert acc > 0.9
        lines.append(f"{name}: accuracy {acc:.4f} (onnxruntime {ref_acc:.4f})")
    if case.get("x86_rel") is not None:
        assert x86, f"{name}: the manifest asks for a comparison with x86-64 outputs that the data lacks"
        for out, h in x86.items():
            a = np.asarray(got[out]).astype(np.float64)
            scale = float(np.abs(h).max()) or 1.0
            rel = float(np.abs(a - h).max()) / scale
            lines.append(f"{name}/{out}: max |minirt here - minirt x86-64| / max|x86-64| {rel:.3g} "
                         f"(bound {case['x86_rel']:g})")
            assert rel <= case["x86_rel"], f"{name}/{out}: {rel:.3g} from minirt's x86-64 outputs > {case['x86_rel']:g}"
    return lines


def load_case(artifacts, manifest: dict, name: str):
    """(case, feeds, expected, labels, x86) of case ``name`` from the prepared folder ``artifacts``."""
    case = manifest["cases"][name]
    with np.load(f"{artifacts}/{case['data']}") as data:
        feeds = {k: data[f"in.{k}"] for k in case["inputs"]}
        expected = {k: data[f"out.{k}"] for k in case["outputs"]}
        labels = data["label"] if case["labelled"] else None
        x86 = {k[len("x86."):]: data[k] for k in data.files if k.startswith("x86.")} or None
    return case, feeds, expected, labels, x86


def greedy_tokens(lib, model, prompt, new: int) -> list[int]:
    """The ``new`` tokens a greedy generation chooses after ``prompt`` (exactly that many: EOS cannot stop
    it), with ``lib`` minirt.genai or onnxruntime_genai (same API): the subset's decoder case, prepared on
    the host and checked in the emulated Pi."""
    params = lib.GeneratorParams(model)
    total = len(prompt) + new
    params.set_search_options(max_length=total, min_length=total)
    gen = lib.Generator(model, params)
    gen.append_tokens(np.array(prompt, np.int32))
    tokens = []
    while not gen.is_done():
        gen.generate_next_token()
        tokens.append(int(gen.get_next_tokens()[0]))
    return tokens
