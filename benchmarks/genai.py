"""minirt.genai against onnxruntime-genai: prefill and decode tokens/s, time per token against the
context length, peak RSS, on the same int4 and fp32 model folders (issue 24).

    python benchmarks/genai.py                       # Llama, ~30M parameters, int4 and fp32, 1 and 2 threads
    python benchmarks/genai.py --arch qwen2 --precisions int4 --threads 1
    python benchmarks/genai.py --quick               # fewer tokens and repeats (a smoke run)

The model is a ``transformers`` architecture with random weights made locally (tests/genai/
make_decoders.py, size "bench": hidden 512, 8 layers, 8 heads / 4 KV heads, MLP 1536, a 4096-token
BPE vocabulary trained on the repository's docs, context 2048) and converted by onnxruntime-genai's
model builder (``-p fp32`` / ``-p int4 -e cpu``: MatMulNBits, block 32, accuracy_level 4); kept in
``benchmarks/.cache/genai/`` (git-ignored).  Both runtimes open the same folder: onnxruntime-genai
its model.onnx, minirt.genai the .mrt it builds from it.

Measured, in one process, the two runtimes interleaved (A B A B ... per repeat, median of repeats):

* prefill: ``append_tokens`` of a ``--prompt``-token prompt (one model run over the prompt),
  tokens/s = prompt tokens / time;
* decode: ``--decode`` tokens after that prompt, each ``generate_next_token`` after the first one
  (which only chooses from the prefill's logits) running the model on one token; tokens/s = tokens
  / time.  Greedy, EOS held back by min_length;
* time per token against the context: one generation from a 16-token prompt to ``--context``
  tokens (1 thread), the median step time around each context length listed;
* peak RSS: a child process per runtime and precision that loads the model and generates the
  prompt + decode tokens at 1 thread (``ru_maxrss``: the process's high-water mark, Python and numpy
  included).

Threads: onnxruntime-genai through genai_config's ``session_options.intra_op_num_threads``
(a Config overlay, with ``session.intra_op.allow_spinning=0`` so that its idle threads do not spin on
the cores the other runtime's turn needs), minirt through ``Model(threads=N)``.  Writes
benchmarks/results_genai.md, including the machine's load average before and after (the numbers of a
shared machine are only as good as its idle cores).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CACHE = HERE / ".cache" / "genai"
sys.path.insert(0, str(ROOT))

from tests.genai import make_decoders as md  # noqa: E402


def _prompt_ids(folder: str, n: int) -> np.ndarray:
    import minirt.genai as mg

    tok = mg.Tokenizer(folder)
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    ids = tok.encode(text)
    if len(ids) < n:
        ids = np.tile(ids, n // len(ids) + 1)
    return np.concatenate([[md.BOS_ID], ids[:n - 1]]).astype(np.int32)


_ARTIFACTS: dict = {}  # model folder -> the .mrt minirt.genai built from it (resolved once per process)


def open_model(lib: str, folder: str, threads: int):
    if lib == "minirt":
        import minirt.genai as mg

        config = mg.Config(folder)
        artifact = os.environ.get("GENAI_BENCH_MRT") or _ARTIFACTS.get(folder)
        if artifact is None:
            artifact = _ARTIFACTS[folder] = mg.Model(folder).artifact_path
        # (the artifact named, not the .onnx: a builder edited meanwhile must not rebuild it mid-benchmark)
        config.overlay(json.dumps({"model": {"decoder": {"filename": os.path.relpath(artifact, folder)}}}))
        return mg, mg.Model(config, threads=threads)
    import onnxruntime_genai as og

    config = og.Config(folder)
    # (no spin-waiting: the threads of one runtime must not eat the cores of the other, interleaved)
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {
        "intra_op_num_threads": threads, "inter_op_num_threads": 1, "session.intra_op.allow_spinning": "0"}}}}))
    return og, og.Model(config)


def run_once(lib, model, prompt: np.ndarray, new: int) -> tuple[float, list[float]]:
    """(prefill seconds, seconds of each generate_next_token)."""
    params = lib.GeneratorParams(model)
    total = len(prompt) + new
    params.set_search_options(max_length=total, min_length=total, do_sample=False)
    gen = lib.Generator(model, params)
    t0 = time.perf_counter()
    gen.append_tokens(prompt)
    prefill = time.perf_counter() - t0
    steps = []
    while not gen.is_done():
        t = time.perf_counter()
        gen.generate_next_token()
        gen.get_next_tokens()
        steps.append(time.perf_counter() - t)
    return prefill, steps


def measure(folder: str, threads: int, prompt: np.ndarray, new: int, repeats: int, log) -> dict:
    runtimes = {name: open_model(name, folder, threads) for name in ("ort-genai", "minirt")}
    # Warm-up: first runs (minirt plans its memory, ORT its kernels), then two generations of the measured
    # shapes: minirt records the prefill's and the decode step's memory plans and native programs on the
    # first generations of a max_length (D123), which a chat at a fixed max_length pays once
    for lib, model in runtimes.values():
        run_once(lib, model, prompt[:16], 8)
        for _ in range(2):
            run_once(lib, model, prompt, new)
    results = {name: {"prefill": [], "decode": []} for name in runtimes}
    for r in range(repeats):
        for name, (lib, model) in runtimes.items():
            prefill, steps = run_once(lib, model, prompt, new)
            results[name]["prefill"].append(len(prompt) / prefill)
            results[name]["decode"].append((len(steps) - 1) / sum(steps[1:]))
            log(f"  {name:9s} threads {threads} repeat {r + 1}: prefill {results[name]['prefill'][-1]:8.1f} tok/s, "
                f"decode {results[name]['decode'][-1]:7.1f} tok/s")
    return {name: {k: statistics.median(v) for k, v in res.items()} for name, res in results.items()}


def context_sweep(folder: str, context: int, points: list[int], log) -> dict:
    out = {}
    prompt = _prompt_ids(folder, 16)
    for name in ("ort-genai", "minirt"):
        lib, model = open_model(name, folder, 1)
        run_once(lib, model, prompt, 8)
        _, steps = run_once(lib, model, prompt, context - len(prompt))
        # step i (i >= 1) runs the model at context len(prompt) + i (the new token's position + 1)
        ctx = np.arange(len(steps)) + len(prompt)
        row = {}
        for p in points:
            sel = [s for c, s in zip(ctx[1:], steps[1:]) if abs(c - p) <= 8]
            row[p] = statistics.median(sel) * 1e3 if sel else float("nan")
        out[name] = row
        log(f"  {name:9s} ms/token at context " + ", ".join(f"{p}: {row[p]:.2f}" for p in points))
    return out


def _vm_hwm_kib() -> int:
    """This process's peak resident set (VmHWM).  Not ru_maxrss: Linux carries that across fork + exec,
    so a child started by a big parent reports the parent's peak."""
    with open("/proc/self/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # (not Linux: the best there is)


def rss_child(lib: str, folder: str, prompt_len: int, new: int) -> None:
    prompt = _prompt_ids(folder, prompt_len)
    lib_mod, model = open_model(lib, folder, 1)
    run_once(lib_mod, model, prompt, new)
    print(json.dumps({"maxrss_kib": _vm_hwm_kib()}))


def peak_rss(folder: str, prompt_len: int, new: int) -> dict:
    out = {}
    for name in ("ort-genai", "minirt"):
        env = dict(os.environ, GENAI_BENCH_MRT=_ARTIFACTS.get(folder, ""))
        proc = subprocess.run([sys.executable, __file__, "--rss-child", name, folder, str(prompt_len), str(new)],
                              capture_output=True, text=True, timeout=3600, cwd=str(ROOT), env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"RSS child {name} failed:\n{proc.stderr[-3000:]}")
        out[name] = json.loads(proc.stdout.strip().splitlines()[-1])["maxrss_kib"] / 1024
    return out


def _params(hf_folder: str) -> int:
    """Parameters of the transformers model (its model.safetensors header)."""
    import struct

    with open(os.path.join(hf_folder, "model.safetensors"), "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return sum(int(np.prod(v["shape"])) for k, v in header.items() if k != "__metadata__")


def _cpu() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _native_state() -> str:
    from minirt import native

    if not getattr(native, "available", False):
        return f"numpy kernels only (native kernels unavailable: {getattr(native, 'reason', '')})"
    isa = getattr(native, "isa", None)
    return f"native kernels loaded (ISA {isa() if callable(isa) else isa})"


def write_report(path: Path, args, load_before: float, results: dict) -> None:
    """The report of every architecture measured: ``results`` {arch: (parameters, speed, sweep, rss)}."""
    import onnxruntime
    import onnxruntime_genai

    import minirt

    b = md.SIZES["bench"]
    lines = [
        "# minirt.genai vs onnxruntime-genai: generation speed",
        "",
        f"Written by `python benchmarks/genai.py --arch {','.join(results)}` "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}). Ratio = minirt / onnxruntime-genai (above 1: "
        "minirt faster).",
        "",
        f"- models: each architecture's transformers config at size `bench` (hidden {b['hidden']}, {b['layers']} "
        f"layers, {b['heads']} heads / {b['kv_heads']} KV heads, MLP {b['intermediate']}, vocabulary {b['vocab']}), "
        "random weights, converted by onnxruntime-genai's builder (fp32; int4 = MatMulNBits block 32, "
        "accuracy_level 4)",
        f"- prompt {args.prompt} tokens, decode {args.decode} tokens (greedy), median of {args.repeats} interleaved "
        f"repeats after two warm-up generations of the same shapes",
        f"- machine: {_cpu()}, {os.cpu_count()} CPUs; Python {platform.python_version()}; load average "
        f"{load_before:.2f} before, {os.getloadavg()[0]:.2f} after (1 min)",
        f"- minirt {minirt.__version__}: {_native_state()}; onnxruntime {onnxruntime.__version__}, "
        f"onnxruntime-genai {onnxruntime_genai.__version__}",
    ]
    for arch, (params, speed, sweep, rss) in results.items():
        lines += ["", f"## {arch} ({params / 1e6:.1f}M parameters)", "", "Prefill and decode tokens/s:", "",
                  "| precision | threads | prefill ORT-genai | prefill minirt | ratio | decode ORT-genai | decode minirt "
                  "| ratio |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for (prec, threads), res in speed.items():
            o, m = res["ort-genai"], res["minirt"]
            lines.append(f"| {prec} | {threads} | {o['prefill']:.0f} | {m['prefill']:.0f} | "
                         f"{m['prefill'] / o['prefill']:.2f} | {o['decode']:.1f} | {m['decode']:.1f} | "
                         f"{m['decode'] / o['decode']:.2f} |")
        if sweep:
            points = sorted(next(iter(next(iter(sweep.values())).values())).keys())
            lines += ["", f"Time per decoded token (ms) against the context length (1 thread, up to {args.context}):",
                      "", "| precision | runtime | " + " | ".join(str(p) for p in points) + " |",
                      "|---|---|" + "---:|" * len(points)]
            for prec, rows in sweep.items():
                for name, row in rows.items():
                    lines.append(f"| {prec} | {name} | " + " | ".join(f"{row[p]:.2f}" for p in points) + " |")
        if rss:
            lines += ["", "Peak RSS (MiB, 1 thread, a process per runtime: load + prompt + decode):", "",
                      "| precision | ORT-genai | minirt | ratio |", "|---|---:|---:|---:|"]
            for prec, res in rss.items():
                lines.append(f"| {prec} | {res['ort-genai']:.0f} | {res['minirt']:.0f} | "
                             f"{res['minirt'] / res['ort-genai']:.2f} |")
    lines += ["", "Notes:", "",
              "- The kernels line above says whether minirt's native kernels (4-bit GEMV/GEMM, KV-cache attention "
              "where the build has them) ran, or its numpy kernels only (docs/decisions.md D117).",
              "- minirt.genai's KV cache is one [1, kv_heads, max_length, head_size] array per layer and key/value, "
              "allocated with the Generator and bound as both past and present (IOBinding): GroupQueryAttention "
              "appends to it in place. With genai's static attention mask every decode step has the same shapes "
              "and runs as one native program (docs/decisions.md D123), recorded on the first generations of a "
              "max_length (the warm-up here).",
              "- Peak RSS is each process's VmHWM: interpreter, numpy and the runtime's own libraries included. "
              "minirt maps its artifact (float weights packed in the file for this CPU).",
              "- On a shared machine (see the load average) single figures move by tens of percent; the runtimes "
              "alternate within each repeat so that both see the same load.", ""]
    path.write_text("\n".join(lines), encoding="utf-8")


def measure_arch(arch: str, args, precisions: list, threads: list, log) -> tuple:
    """(parameters, speed, sweep, rss) of one architecture's 'bench' models (made once into CACHE)."""
    import minirt.genai as mg

    t0 = time.perf_counter()
    log(f"making / finding the {arch} 'bench' models in {CACHE}")
    folders = md.make(str(CACHE), [arch], precisions, size="bench", timeout=3600)
    log(f"  ready in {time.perf_counter() - t0:.0f} s")
    speed, sweep, rss = {}, {}, {}
    for prec in precisions:
        folder = folders[(arch, prec)]
        t = time.perf_counter()
        _ARTIFACTS[folder] = mg.Model(folder).artifact_path  # (builds the .mrt once, outside the timings)
        log(f"{arch} {prec}: minirt artifact ready in {time.perf_counter() - t:.1f} s: {_ARTIFACTS[folder]}")
        prompt = _prompt_ids(folder, args.prompt)
        for n in threads:
            speed[(prec, n)] = measure(folder, n, prompt, args.decode, args.repeats, log)
        if args.context:
            points = [p for p in (32, 64, 128, 256, 512, 1024, 2048) if 24 < p <= args.context]
            sweep[prec] = context_sweep(folder, args.context, points, log)
        if not args.no_rss:
            rss[prec] = peak_rss(folder, args.prompt, args.decode)
            log(f"  peak RSS MiB: {rss[prec]}")
    return _params(md.folder(str(CACHE), arch, "hf", "bench")), speed, sweep, rss


def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--rss-child":
        rss_child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="llama", help=f"architectures, comma-separated, or 'all' ({', '.join(md.ARCHS)})")
    ap.add_argument("--precisions", default="int4,fp32")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens (default 128)")
    ap.add_argument("--decode", type=int, default=128, help="decoded tokens (default 128)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--context", type=int, default=1024, help="context of the per-token sweep (0: no sweep)")
    ap.add_argument("--no-rss", action="store_true")
    ap.add_argument("--quick", action="store_true", help="prompt 32, decode 32, 1 repeat, context 256")
    ap.add_argument("--out", default=str(HERE / "results_genai.md"))
    args = ap.parse_args(argv)
    if args.quick:
        args.prompt, args.decode, args.repeats, args.context = 32, 32, 1, 256
    precisions = [p for p in args.precisions.split(",") if p]
    threads = [int(t) for t in args.threads.split(",") if t]

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    archs = list(md.ARCHS) if args.arch == "all" else [a for a in args.arch.split(",") if a]
    unknown = [a for a in archs if a not in md.ARCHS]
    if unknown:
        ap.error(f"unknown architecture(s) {', '.join(unknown)}: choose from {', '.join(md.ARCHS)} or 'all'")
    t0 = time.perf_counter()
    load_before = os.getloadavg()[0]
    results = {}
    for arch in archs:
        results[arch] = measure_arch(arch, args, precisions, threads, log)
    write_report(Path(args.out), args, load_before, results)
    log(f"wrote {args.out} in {time.perf_counter() - t0:.0f} s")
    print(Path(args.out).read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
