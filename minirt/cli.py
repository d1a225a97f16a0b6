"""The ``minirt`` command line: build, inspect, run and benchmark .mrt artifacts.

::

    minirt build model.onnx -o model.mrt [--target rpi4] [--input-shape image=1x3x224x224] [--sign NAME.key]
    minirt keygen NAME           # NAME.key (private, keep off devices) and NAME.pub (public)
    minirt inspect model.mrt [--json]
    minirt run model.mrt [--input image=x.npy] [--dim batch=4] [--save out.npz]
    minirt bench model.mrt [--runs 50] [--compare model.onnx] [--json]
    minirt demo                  # build and check the digits example end to end
    minirt sweep sweep.toml [--workers 2] [--address auto]   # best build options per target, on Ray
    minirt generate MODEL_DIR --prompt TEXT [--max-length N] [--top-k K --top-p P --temperature T]
    minirt info

The runtime commands (``run``, ``inspect``, ``bench``, ``info``) need numpy
only: the builder (onnx, onnx-ir) is imported inside ``build`` and ``demo``,
and onnxruntime only by ``bench --compare`` and ``demo``.

Every user mistake (a bad path, a malformed option, an input the model does
not accept, any :class:`minirt.Error`) prints ``minirt <cmd>: error: <message>``
to stderr and exits with status 2.  Anything else is a bug and raises.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

import minirt
from minirt.dtypes import ONNX_TO_NUMPY
from minirt.errors import Error
from minirt.format import keys, reader
from minirt import providers as _providers
from minirt.tools import inputs as tool_inputs
from minirt.tools import timing
from minirt.tools.reports import format_report as format_optimizer_report
from minirt.tools.timing import fmt_bytes, fmt_seconds
from minirt.vocabulary import ACCELERATORS, CPU

_PROVIDER_NAMES = ", ".join((*ACCELERATORS, CPU))  # the provider table (minirt/vocabulary.py), the CPU last
DIGITS_DIR = Path(__file__).resolve().parent / "demo"  # (package data: the demo runs after pip install too)
_TEXT_VALUE_WIDTH = 72  # metadata values longer than this are abbreviated in text mode


class CommandError(Error):
    """A user mistake detected by the CLI itself (missing file, missing extra...)."""


# --- small helpers --------------------------------------------------------------


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=False, default=_json_default))


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if isinstance(obj, (bytes, bytearray)):
        return obj.hex()
    return str(obj)


def _table(rows: Sequence[Sequence[Any]], header: Sequence[str] | None = None, align: str = "", indent: str = "  ") -> str:
    """Rows as aligned columns; ``align`` has one 'l' or 'r' per column (default: all left)."""
    all_rows = [list(map(str, r)) for r in ([header] if header else []) + list(rows)]
    if not all_rows:
        return indent + "(none)"
    ncols = max(map(len, all_rows))
    widths = [max(len(r[i]) for r in all_rows if i < len(r)) for i in range(ncols)]
    align = align.ljust(ncols, "l")
    lines = []
    for r in all_rows:
        cells = [c.rjust(widths[i]) if align[i] == "r" else c.ljust(widths[i]) for i, c in enumerate(r)]
        lines.append((indent + "  ".join(cells)).rstrip())
    return "\n".join(lines)


def _fmt_shape(shape: Sequence | None) -> str:
    if shape is None:
        return "[unknown rank]"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _dtype_name(code: int) -> str:
    dt = ONNX_TO_NUMPY.get(code)
    if dt is None:
        return "undefined" if code == 0 else f"code {code}"
    return "string" if dt.kind == "O" else str(dt)


def _arg_dtype_name(arg) -> str:
    dt = tool_inputs.input_dtype(arg)
    if dt is None:
        return "undefined"
    return "string" if dt.kind == "O" else str(dt)


def _require_file(path: str, what: str) -> None:
    if not os.path.exists(path):
        raise CommandError(f"{path}: no such file ({what})")
    if os.path.isdir(path):
        raise CommandError(f"{path}: is a directory, expected {what}")


def _stats(arr: np.ndarray) -> str:
    if arr.size == 0:
        return "(empty)"
    if arr.dtype.kind not in "biuf":
        return ""
    a = arr.astype(np.float64) if arr.dtype.kind == "b" else arr
    return f"min {a.min():.6g}  max {a.max():.6g}  mean {a.mean(dtype=np.float64):.6g}"


def _max_abs_diff(a: np.ndarray, b: np.ndarray) -> float | str:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return f"shape mismatch {list(a.shape)} vs {list(b.shape)}"
    if a.size == 0:
        return 0.0
    if a.dtype.kind in "biuf" and b.dtype.kind in "biuf":
        return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
    return 0.0 if np.array_equal(a, b) else "values differ"


def _import_builder():
    missing = [m for m in ("onnx", "onnx_ir") if importlib.util.find_spec(m) is None]
    if missing:
        raise CommandError(
            f"this command needs the builder extra ({', '.join(missing)} not installed): pip install 'minirt[builder]'"
        )
    from minirt import builder

    return builder


def _import_onnxruntime():
    if importlib.util.find_spec("onnxruntime") is None:
        raise CommandError("--compare needs onnxruntime, which is not installed: pip install onnxruntime")
    import onnxruntime

    return onnxruntime


def _ort_session(ort, model_path: str, threads: int | None):
    _require_file(model_path, "an .onnx model")
    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    try:
        return ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime's load errors (bad file, bad model) are user input errors
        raise CommandError(f"onnxruntime cannot load {model_path}: {exc}") from None


def _ort_feed(ort_session, feed: dict) -> dict:
    names = [i.name for i in ort_session.get_inputs()]
    missing = [n for n in names if n not in feed]
    if missing:
        raise CommandError(f"the ONNX model needs input(s) {missing} that the artifact does not have ({list(feed)})")
    return {n: feed[n] for n in names}


def _make_feed(session: minirt.Session, args: argparse.Namespace) -> dict[str, np.ndarray]:
    given = tool_inputs.load_input_specs(args.input)
    dims = tool_inputs.parse_dim_specs(args.dim)
    shapes = tool_inputs.parse_shape_specs(args.shape)
    return tool_inputs.make_feed(session.get_inputs(), given, dims, seed=args.seed, shapes=shapes)


def _int_at_least(minimum: int):
    """An argparse type: an integer >= ``minimum``."""

    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {n}")
        return n

    return parse


_positive = _int_at_least(1)
_non_negative = _int_at_least(0)


# --- build ----------------------------------------------------------------------


def cmd_build(args: argparse.Namespace) -> int:
    builder = _import_builder()
    out = args.output or str(Path(args.model).with_suffix(".mrt"))
    # Read the key before the (slow) build so that a bad key file fails at once.
    sign = {"sign_key": keys.load_signing_key(args.sign)} if args.sign else {}
    report = builder.build(args.model, out, target=args.target, progress=_progress_lines("build", args.quiet),
                           **_build_options(args), **sign)
    if args.json:
        _print_json(report.as_dict())
    else:
        print(report)
    return 0


def _progress_lines(command: str, quiet: bool):
    """A progress callback printing ``minirt COMMAND: [seconds since now] message`` lines on stderr."""
    start = time.perf_counter()

    def progress(message: str) -> None:
        if not quiet:
            print(f"minirt {command}: [{time.perf_counter() - start:6.2f}s] {message}", file=sys.stderr, flush=True)

    return progress


def _build_options(args: argparse.Namespace) -> dict:
    """The builder's keyword arguments from the options of _add_build_options (minirt build and package)."""
    return dict(
        opt_level=args.opt_level,
        providers=args.providers,
        weight_pack=args.weight_pack,
        cpu_fallback=not args.no_cpu_fallback,
        coreml_precision=args.coreml_precision,
        compress_sections=not args.uncompressed,
        disabled_passes=args.disable_pass,
        input_shapes=args.input_shape,
        input_values=args.input_value,
        quantize=args.quantize,
        calibration=args.calibration,
        calibration_method=args.calibration_method,
        per_channel=args.per_channel,
        symmetric_activations=args.symmetric_activations,
        accuracy_budget=args.accuracy_budget,
        eval_data=args.eval,
        quantize_final=args.quantize_final,
        block_size=args.block_size,
        symmetric_weights=not args.asymmetric_weights,
        allow_float_fallback=args.allow_float_fallback,
    )


# --- package --------------------------------------------------------------------


def cmd_package(args: argparse.Namespace) -> int:
    """minirt package (builder/package.py): the .mrt, the runtime wheel, a launcher and a manifest."""
    _import_builder()
    from minirt.builder.package import package

    sign = {"sign_key": keys.load_signing_key(args.sign)} if args.sign else {}
    report = package(args.model, args.target, args.output, wheel=args.wheel, wheel_dir=args.wheel_dir,
                     reduced=args.reduced, archive=args.archive, progress=_progress_lines("package", args.quiet),
                     **_build_options(args), **sign)
    if args.json:
        _print_json(report.as_dict())
    else:
        print(report)
    return 0


# --- sweep ----------------------------------------------------------------------


def cmd_sweep(args: argparse.Namespace) -> int:
    """Builds and evaluations on Ray (builder/sweep, docs/sweep.md); Ray is imported there, lazily."""
    _import_builder()
    from minirt.builder import sweep
    from minirt.builder.sweep.report import summary_lines

    try:
        result = sweep.run_sweep(args.config, workers=args.workers, address=args.address, cache_dir=args.cache,
                                 out_dir=args.out, use_cache=not args.rebuild,
                                 progress=_progress_lines("sweep", args.quiet))
    except KeyboardInterrupt:
        print("minirt sweep: interrupted; the candidates finished so far are in the cache: the same command "
              "resumes from there", file=sys.stderr)
        return 130
    if args.json:
        _print_json({"sweep": result.name, "table": str(result.json_path), "csv": str(result.csv_path),
                     "plots": result.plots, "chosen": result.choices, "wall_s": result.wall_s})
    else:
        print("\n".join(summary_lines(result)))
    return 0


# --- generate -------------------------------------------------------------------


def cmd_generate(args: argparse.Namespace) -> int:
    """Text generation with minirt.genai (docs/genai.md); imported only for this command."""
    from minirt.genai._cli import generate

    return generate(args)


# --- keygen ---------------------------------------------------------------------


def cmd_keygen(args: argparse.Namespace) -> int:
    key_path, pub_path, pub = keys.write_keypair(args.prefix, overwrite=args.force)
    print(f"private key: {key_path}  (keep it secret; used by: minirt build --sign {key_path})")
    print(f"public key:  {pub_path}  ({keys.fingerprint(pub)}; devices: Session(path, verify_key={pub_path!r}))")
    return 0


# --- inspect --------------------------------------------------------------------


def _signature(art: reader.Artifact) -> tuple[list[dict], list[dict]]:
    graph = art.main_graph
    init_slots = {v for v, _ in graph.initializers}

    def entry(v: int) -> dict:
        info = graph.values[v]
        return {
            "name": info.name,
            "dtype": _dtype_name(info.dtype),
            "shape": None if info.shape is None else list(info.shape),
        }

    ins = [entry(v) for v in graph.inputs if v not in init_slots]
    outs = [entry(v) for v in graph.outputs]
    return ins, outs


def _op_histogram(art: reader.Artifact) -> dict[str, int]:
    counts: dict[str, int] = {}
    for graph in art.graphs:
        for node in graph.nodes:
            op = art.operators[node.op_index]
            key = op.op_type if op.domain in ("", "ai.onnx") else f"{op.domain}::{op.op_type}"
            counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def inspect_artifact(path: str, verify_key: Any = None, require_signature: bool = False) -> dict:
    """Everything ``minirt inspect`` shows, as plain JSON-able data.  The signature is checked only when asked
    (``verify_key``, ``require_signature``: then under the environment's trusted keys too); otherwise its
    signer is shown, unverified (inspecting a file is not running it)."""
    keys_ = None
    if verify_key is not None or require_signature:
        from minirt.session import trusted_keys

        keys_ = trusted_keys(verify_key, True)
    art = reader.load(path, verify_key=keys_)
    ins, outs = _signature(art)
    signer = None if art.signer is None else keys.fingerprint(art.signer[1])
    return {
        "path": os.fspath(path),
        "signature": {"signer": signer, "verified": signer is not None and keys_ is not None},
        "format_version": art.format_version,
        "file_size": art.size,
        "sections": [
            {"kind": s.name, "kind_code": s.kind, "flags": s.flags, "offset": s.offset, "length": s.length, "crc32": s.crc32,
             **({"inflated": s.inflated} if s.deflated else {})}  # (a zlib stream of `inflated` bytes, format 2)
            for s in art.sections
        ],
        "opsets": {(domain or "ai.onnx"): version for domain, version in art.opsets.items()},
        "op_histogram": _op_histogram(art),
        "graphs": len(art.graphs),
        "nodes": sum(len(g.nodes) for g in art.graphs),
        "tensors": len(art.tensors),
        "weight_bytes": art.weight_bytes(),
        "inputs": ins,
        "outputs": outs,
        "metadata": dict(art.metadata),
    }


def _abbreviate(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=_json_default)
    text = text.replace("\n", "\\n")
    if len(text) > _TEXT_VALUE_WIDTH:
        return f"{text[: _TEXT_VALUE_WIDTH - 3]}... ({len(text)} chars, see --json)"
    return text


def cmd_install(args: argparse.Namespace) -> int:
    from minirt.tools.install import install

    done = install(args.new, args.live, **_trust(args))
    signed = f", signed by {done['signer']}" if done["signer"] else ""
    what = "replaced" if done["replaced"] else "created"
    print(f"installed {args.new} -> {done['path']} ({done['bytes']:,} bytes, every checksum verified{signed}; {what} "
          f"by an atomic rename: sessions that loaded the old file keep running it, new sessions load this one)")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from minirt.tools.verify import failed, format_verify, verify

    report = verify(args.artifact, rtol=args.rtol, **_trust(args))
    if args.json:
        _print_json(report)
    else:
        print(format_verify(report))
    return 1 if failed(report) else 0


def cmd_inspect(args: argparse.Namespace) -> int:
    if getattr(args, "graph", None):
        from minirt.tools.graph_render import render

        try:
            render(minirt.Session(args.artifact, providers=[CPU]).artifact, args.graph)
        except (ValueError, OSError) as exc:
            raise CommandError(str(exc)) from None
        print(f"graph written to {args.graph}", file=sys.stderr)
    if getattr(args, "onnx", None):
        from minirt.format import reader
        from minirt.tools.onnx_export import export

        try:
            export(reader.load(args.artifact), args.onnx)
        except (RuntimeError, OSError) as exc:
            raise CommandError(f"--onnx {args.onnx}: {exc}") from None
        print(f"ONNX view written to {args.onnx} (open it in Netron)", file=sys.stderr)
    info = inspect_artifact(args.artifact, args.verify_key, args.require_signature)
    if args.json:
        _print_json(info)
        return 0
    print(f"{info['path']}: minirt artifact, format version {info['format_version']}, "
          f"{info['file_size']:,} bytes ({fmt_bytes(info['file_size'])})")
    sig = info["signature"]
    if sig["signer"] is None:
        print("signature: none (unsigned)")
    else:
        print(f"signature: {sig['signer']} " + ("(verified)" if sig["verified"] else
                                                "(not verified: --verify-key KEY.pub checks it)"))
    print("sections:")
    rows = [[s["kind"], s["offset"], s["length"], f"{s['crc32']:#010x}"] for s in info["sections"]]
    header, align = ["kind", "offset", "length", "crc32"], "lrrr"
    if any("inflated" in s for s in info["sections"]):  # (format 2: a column for the compressed ones)
        for row, s in zip(rows, info["sections"]):
            row.append(f"zlib of {s['inflated']}" if "inflated" in s else "")
        header.append("stored")
        align += "l"
    print(_table(rows, header=tuple(header), align=align))
    print("opsets: " + ", ".join(f"{d} {v}" for d, v in info["opsets"].items()))
    print(f"graphs {info['graphs']}, nodes {info['nodes']}, tensors {info['tensors']}, "
          f"weights {info['weight_bytes']:,} bytes ({fmt_bytes(info['weight_bytes'])})")
    print("operators:")
    print(_table(list(info["op_histogram"].items()), align="lr"))
    for title, values in (("inputs", info["inputs"]), ("outputs", info["outputs"])):
        print(f"{title}:")
        print(_table([(v["name"], v["dtype"], _fmt_shape(v["shape"])) for v in values]))
    print("metadata:")
    print(_table([(k, _abbreviate(v)) for k, v in sorted(info["metadata"].items())]))
    optimizer = info["metadata"].get("build.optimizer")
    if isinstance(optimizer, dict) and optimizer.get("passes") is not None:
        print(format_optimizer_report(optimizer))
    quantization = info["metadata"].get("build.quantization") or {}
    budget = quantization.get("budget") if isinstance(quantization, dict) else None
    if isinstance(budget, dict) and budget:
        from minirt.tools.reports import format_sensitivity

        print(f"accuracy budget {budget.get('spec')}{' (default)' if budget.get('default') else ''}: "
              f"{'met' if budget.get('met') else 'NOT met'} (value {budget.get('value')}), "
              f"{len(budget.get('reverted', []))} layer(s) returned to float")
        print("\n".join(format_sensitivity(budget, top=20, indent="  ")))
    quantizer = quantization.get("passes") if isinstance(quantization, dict) else None
    if isinstance(quantizer, dict) and quantizer.get("passes") is not None:
        print(format_optimizer_report(quantizer))
    partitions = info["metadata"].get("build.partitions")
    if isinstance(partitions, dict) and partitions.get("providers"):
        from minirt.tools.reports import format_partition_report

        print(f"accelerators (built for {partitions.get('target')}):")
        print("\n".join(format_partition_report(partitions)))
    return 0


# --- run ------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    session = minirt.Session(args.artifact, threads=args.threads, **_trust(args))
    feed = _make_feed(session, args)
    outputs = session.run(None, feed)
    given = {spec.partition("=")[0] for spec in args.input}
    print("inputs:")
    print(_table([(n, tool_inputs.describe(a), "from file" if n in given else f"random (seed {args.seed})")
                  for n, a in feed.items()]))
    print("outputs:")
    names = [o.name for o in session.get_outputs()]
    print(_table([(n, tool_inputs.describe(a), _stats(a)) for n, a in zip(names, outputs)]))
    if args.save:
        with open(args.save, "wb") as f:
            np.savez(f, **dict(zip(names, outputs)))
        print(f"saved {len(outputs)} output(s) to {args.save}")
    return 0


# --- bench ----------------------------------------------------------------------


def _profile_overhead(session: minirt.Session, feed: dict, runs: int) -> tuple[float, int, list, dict]:
    """Median per-node Python overhead (seconds) over ``runs`` profiled runs, the node count, the
    time per op type (mean seconds per run, node count), largest first: [(op type, seconds, nodes)],
    and the mean seconds per run of each node by name."""
    per_node, nodes = [], 0
    by_op: dict[str, list] = {}
    by_node: dict[str, float] = {}
    for _ in range(runs):
        _, profile = session.run_profiled(feed)
        per_node.append(profile["overhead_per_node_s"])
        nodes = len(profile["nodes"])
        for node, op_type, seconds in profile["nodes"]:
            entry = by_op.setdefault(op_type, [0.0, 0])
            entry[0] += seconds / runs
            entry[1] += 1
            by_node[node] = by_node.get(node, 0.0) + seconds / runs
    ops = sorted(((op, s, n // runs) for op, (s, n) in by_op.items()), key=lambda r: -r[1])
    return statistics.median(per_node), nodes, ops, by_node


def _accelerated_shares(report: dict, node_seconds: dict) -> dict:
    """The accelerated share of a build for accelerators (its ``build.partitions`` report): in nodes,
    in estimated FLOPs, and in the CPU time measured here for the nodes that stay on the CPU on the
    device (``node_seconds``: each node's time in a CPU-only run, by name)."""
    cpu_nodes = {row["node"] for row in report.get("cpu_nodes", [])}
    total = sum(node_seconds.values())
    fallback = sum(t for name, t in node_seconds.items() if name in cpu_nodes)
    return {"target": report.get("target"), "nodes": report.get("nodes"),
            "accelerated_nodes": report.get("accelerated_nodes"), "flops_share": report.get("accelerated_share"),
            "unknown_cost_nodes": len(report.get("unknown_cost_nodes", [])), "cpu_fallback_nodes": len(cpu_nodes),
            "cpu_fallback_seconds": fallback, "cpu_fallback_time_share": fallback / total if total else None}


def _bench_plot(path: str, samples: dict, ops: list, top: int) -> None:
    """The latency distribution of each timed runtime and minirt's time per op type, as a PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CommandError("--plot needs matplotlib (pip install matplotlib)") from None
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True)
    for name, xs in samples.items():
        left.hist([x * 1e3 for x in xs], bins=min(40, max(5, len(xs) // 2)), alpha=0.6, label=name)
    left.set_xlabel("latency (ms)")
    left.set_ylabel("runs")
    left.legend()
    shown = ops[:top][::-1]
    right.barh([f"{op} ({n})" for op, _, n in shown], [s * 1e3 for _, s, _ in shown])
    right.set_xlabel("minirt time per run, node by node (ms)")
    right.set_title("per op type (node count)")
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise CommandError(f"--plot {path}: cannot write: {exc}") from None
    plt.close(fig)


def cmd_bench(args: argparse.Namespace) -> int:
    rss_before = timing.peak_rss_bytes()
    t0 = time.perf_counter()
    provs = [s.strip() for s in args.providers.split(",")] if args.providers else None
    session = minirt.Session(args.artifact, threads=args.threads, providers=provs, **_trust(args))
    load_s = time.perf_counter() - t0
    feed = _make_feed(session, args)
    t0 = time.perf_counter()
    session.run(None, feed)  # the first inference (and a bad feed fails here, before any timing)
    first_s = time.perf_counter() - t0
    rss_minirt = timing.peak_rss_bytes()  # before onnxruntime is imported by --compare

    result: dict[str, Any] = {
        "artifact": args.artifact,
        "inputs": {n: {"dtype": str(a.dtype), "shape": list(a.shape)} for n, a in feed.items()},
        "runs": args.runs,
        "warmup": args.warmup,
        "threads": args.threads,
        "top": args.top,
        "minirt": {"version": minirt.__version__, "load_s": load_s, "first_run_s": first_s},
        "native": _native_status(),
    }
    fns = {"minirt": lambda: session.run(None, feed)}
    # (minirt's own names in its reports; get_providers spells them as onnxruntime does)
    result["minirt"]["providers"] = [_providers.canonical_name(p) for p in session.get_providers()]
    result["minirt"]["partitions"] = session.get_partitions()
    if any(p["runs_on"] != CPU for p in session.get_partitions()):
        # An accelerator runs part of the model: time the CPU-only session alongside.
        cpu_session = minirt.Session(args.artifact, threads=args.threads, providers=[CPU], **_trust(args))
        result["cpu"] = {"providers": [CPU]}  # "cpu": the key of the CPU-only figures in the JSON
        fns["cpu"] = lambda: cpu_session.run(None, feed)
    ort_session = ort_feed = None
    if args.compare:
        ort = _import_onnxruntime()
        t0 = time.perf_counter()
        ort_session = _ort_session(ort, args.compare, args.threads)
        ort_load_s = time.perf_counter() - t0
        ort_feed = _ort_feed(ort_session, feed)
        t0 = time.perf_counter()
        ort_session.run(None, ort_feed)
        ort_first_s = time.perf_counter() - t0
        result["onnxruntime"] = {"version": ort.__version__, "model": args.compare, "load_s": ort_load_s,
                                 "first_run_s": ort_first_s}
        fns["onnxruntime"] = lambda: ort_session.run(None, ort_feed)

    samples = timing.sample_interleaved(fns, args.runs, args.warmup)
    for name, xs in samples.items():
        result[name].update(timing.summarize(xs))
    overhead, nodes, ops, node_seconds = _profile_overhead(session, feed, args.profile_runs)
    result["minirt"].update(nodes=nodes, overhead_per_node_us=overhead * 1e6)
    report = session.metadata.get("build.partitions")
    if isinstance(report, dict) and report.get("partitions"):
        if "cpu" in result:  # (a provider runs here: the nodes' own times come from the CPU-only session)
            node_seconds = _profile_overhead(cpu_session, feed, args.profile_runs)[3]
        result["accelerators"] = _accelerated_shares(report, node_seconds)
    result["minirt"]["ops"] = [{"op_type": op, "seconds": s, "nodes": n} for op, s, n in ops]
    if args.plot:
        _bench_plot(args.plot, samples, ops, args.top)
        result["plot"] = args.plot
    # how the timed runs ran: one native program (D32) or node by node, and why
    result["minirt"]["native_program"] = next((p["native_program"] for p in session.memory_plans()), None)
    result["minirt"]["native_program_status"] = session.native_program_status()
    result["minirt"]["peak_rss_bytes"] = rss_minirt if args.compare else timing.peak_rss_bytes()
    result["peak_rss_before_load_bytes"] = rss_before
    result["peak_rss_end_bytes"] = timing.peak_rss_bytes()

    if ort_session is not None:
        mine = session.run(None, feed)
        theirs = ort_session.run(None, ort_feed)
        names = [o.name for o in session.get_outputs()]
        ort_names = [o.name for o in ort_session.get_outputs()]
        by_name = dict(zip(ort_names, theirs))
        result["max_abs_diff"] = {
            n: (_max_abs_diff(a, by_name[n]) if n in by_name else "not an onnxruntime output")
            for n, a in zip(names, mine)
        }
        result["ratio"] = result["minirt"]["median_s"] / result["onnxruntime"]["median_s"]

    if args.json:
        _print_json(result)
    else:
        _print_bench(result)
    return 0


def _print_bench(r: dict) -> None:
    feed = ", ".join(f"{n} {v['dtype']}{v['shape']}" for n, v in r["inputs"].items())
    threads = r["threads"] if r["threads"] is not None else "default"
    print(f"{r['artifact']}: {r['runs']} runs after {r['warmup']} warm-up, threads {threads}")
    print(f"  inputs: {feed}")
    m = r["minirt"]
    o = r.get("onnxruntime")
    header = ("", "minirt", f"onnxruntime {o['version']}") if o else ("", "minirt")
    rows = [
        (label, fmt_seconds(m[key])) + ((fmt_seconds(o[key]),) if o else ())
        for label, key in (("load", "load_s"), ("first inference", "first_run_s"), ("p50 latency", "median_s"),
                           ("p90 latency", "p90_s"), ("p99 latency", "p99_s"), ("min latency", "min_s"))
    ]
    print(_table(rows, header=header, align="lrr"))
    ops = m.get("ops") or []
    total = sum(op["seconds"] for op in ops) or 1.0
    if ops:
        print(f"  time per op type, node by node (top {min(r['top'], len(ops))} of {len(ops)}):")
        print(_table([(op["op_type"], str(op["nodes"]), fmt_seconds(op["seconds"]), f"{100 * op['seconds'] / total:.1f}%")
                      for op in ops[:r["top"]]], header=("  op type", "nodes", "per run", "share"), align="lrrr"))
    if "cpu" in r:
        delegated = [p for p in m["partitions"] if p["runs_on"] != CPU]
        print(f"  providers {', '.join(m['providers'])}: {len(delegated)} partition(s) delegated; "
              f"cpu-only median {fmt_seconds(r['cpu']['median_s'])}, "
              f"ratio with providers / cpu-only: {m['median_s'] / r['cpu']['median_s']:.2f}x")
    acc = r.get("accelerators")
    if acc:
        fallback = acc["cpu_fallback_time_share"]
        print(f"  built for {acc['target']}: {acc['accelerated_nodes']} of {acc['nodes']} nodes and "
              f"{100 * acc['flops_share']:.1f}% of the estimated FLOPs on accelerators"
              + (f" (FLOPs unknown for {acc['unknown_cost_nodes']} nodes)" if acc["unknown_cost_nodes"] else "")
              + f"; the {acc['cpu_fallback_nodes']} CPU-fallback nodes take "
              + (f"{100 * fallback:.1f}%" if fallback is not None else "an unknown share")
              + " of a CPU-only run's time here")
    print(f"  per-node Python overhead: {m['overhead_per_node_us']:.1f} us ({m['nodes']} nodes)")
    program = m.get("native_program")
    if program and program.endswith("native calls"):
        print(f"  runs: one native program of {program[:-len(' native calls')]} calls (no Python between the nodes)")
    elif program:
        print(f"  runs: node by node ({program})")
    elif m.get("native_program_status", "").startswith("partly"):
        print(f"  runs: {m['native_program_status']}")
    print(f"  native kernels: {r['native']}")
    print(f"  peak RSS: {fmt_bytes(m['peak_rss_bytes'])} with minirt "
          f"({fmt_bytes(r['peak_rss_before_load_bytes'])} before loading the artifact"
          + (f", {fmt_bytes(r['peak_rss_end_bytes'])} with onnxruntime too)" if o else ")"))
    if o:
        print(f"  latency ratio minirt/onnxruntime: {r['ratio']:.2f}x (median)")
        for name, diff in r["max_abs_diff"].items():
            shown = f"{diff:.3g}" if isinstance(diff, float) else diff
            print(f"  max abs diff {name}: {shown}")


# --- demo -----------------------------------------------------------------------


def _accuracy(logits: np.ndarray, labels: np.ndarray) -> str:
    correct = int((logits.argmax(axis=1) == labels).sum())
    return f"{correct / len(labels) * 100:.2f} % ({correct}/{len(labels)})"


def cmd_demo(args: argparse.Namespace) -> int:
    model, heldout = DIGITS_DIR / "digits_cnn.onnx", DIGITS_DIR / "heldout.npz"
    calibration = DIGITS_DIR / "calibration.npz"
    for path in (model, heldout, calibration):
        if not path.is_file():
            raise CommandError(f"{path}: demo file missing (this minirt was installed without its demo data: "
                               f"the device wheel leaves it out; pip install 'minirt[demo]' has it)")
    builder = _import_builder()
    with np.load(heldout) as data:
        images, labels = data["image"], data["label"]

    with tempfile.TemporaryDirectory(prefix="minirt-demo-") as tmp:
        out_dir = Path(args.out or tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        artifact = out_dir / "digits_cnn.mrt"
        report = builder.build(str(model), str(artifact))
        print(f"minirt demo: digits CNN, {len(labels)} held-out 8x8 images")
        print(f"  built {artifact if args.out else artifact.name} from {model.name} in "
              f"{fmt_seconds(sum(report.timings.values()))} ({report.nodes_after} nodes)")

        # One thread on both sides: in one process, onnxruntime's worker threads keep spinning after
        # each of its calls and take the core our second thread needs, which no deployment sees
        # (docs/decisions.md D27); benchmarks/run.py measures 2 threads in separate processes.
        session = minirt.Session(str(artifact), threads=1)
        name = session.get_inputs()[0].name
        runners = {"minirt": lambda x: session.run(None, {name: x})[0]}
        sizes = {"minirt": f"{fmt_bytes(artifact.stat().st_size)} .mrt"}
        ratio_size = ""
        if importlib.util.find_spec("onnxruntime") is not None:
            import onnxruntime as ort

            ort_session = _ort_session(ort, str(model), 1)
            runners["onnxruntime"] = lambda x: ort_session.run(None, {name: x})[0]
            sizes["onnxruntime"] = f"{fmt_bytes(model.stat().st_size)} .onnx"
            ratio_size = f"{artifact.stat().st_size / model.stat().st_size:.2f}x"

        logits = {side: run(images) for side, run in runners.items()}
        latency: dict[str, list[float]] = {side: [] for side in runners}
        for batch in (images[:1], images):  # each batch size times both sides interleaved
            fns = {side: (lambda run=run: run(batch)) for side, run in runners.items()}
            for side, xs in timing.sample_interleaved(fns, args.runs, warmup=2).items():
                latency[side].append(statistics.median(xs))

        # The int8 build beside the float one, calibrated on training images.
        q_artifact = out_dir / "digits_cnn.int8.mrt"
        q_report = builder.build(str(model), str(q_artifact), quantize="int8", calibration=str(calibration))
        from minirt.builder.quantize import demo_rows

        int8_rows = demo_rows(str(artifact), str(q_artifact), images, labels, runs=args.runs)

    accuracy = {side: _accuracy(x, labels) for side, x in logits.items()}
    sides = list(runners)
    compare = len(sides) == 2

    def ratio(values: list[float]) -> str:
        return f"{values[0] / values[1]:.2f}x" if compare else ""

    rows = [
        ("accuracy", *accuracy.values(), ""),
        ("model size", *sizes.values(), ratio_size),
        ("latency batch 1", *(fmt_seconds(latency[s][0]) for s in sides), ratio([latency[s][0] for s in sides])),
        (f"latency batch {len(labels)}", *(fmt_seconds(latency[s][1]) for s in sides), ratio([latency[s][1] for s in sides])),
    ]
    print(_table(rows, header=("", *sides, "ratio" if compare else ""), align="lrrr"))
    print(f"  latency: median of {args.runs} runs each, 1 thread"
          + (", interleaved; ratio = minirt / onnxruntime" if compare else ""))
    if not compare:
        print("  onnxruntime is not installed: only minirt's side is shown (pip install onnxruntime to compare)")
        _print_int8_demo(int8_rows, q_report)
        return 0
    diff = float(np.max(np.abs(logits["minirt"] - logits["onnxruntime"])))
    print(f"  max abs logit difference minirt vs onnxruntime: {diff:.3g}")
    if accuracy["minirt"] != accuracy["onnxruntime"] or diff > 1e-3:
        print("minirt demo: MISMATCH between minirt and onnxruntime", file=sys.stderr)
        return 1
    print("  OK: minirt matches onnxruntime")
    _print_int8_demo(int8_rows, q_report)
    return 0


def _print_int8_demo(rows: list, report) -> None:
    print("minirt demo: int8 build (calibrated on 128 training images) beside the float build")
    print(_table(rows, header=("", "float", "int8", "ratio"), align="lrrr"))
    for warning in report.warnings:
        print(f"  warning: {warning}")


# --- info -----------------------------------------------------------------------


def _package_status(module: str, dist: str) -> str:
    if importlib.util.find_spec(module) is None:
        return "not installed"
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "installed"


def _native_status() -> str:
    from minirt import native

    text = native.describe()
    hint = _source_tree_hint(native)
    return text if hint is None else f"{text}; {hint}"


def _source_tree_hint(native) -> str | None:
    """Why the kernels may look missing: ``python -m minirt`` run inside a source checkout imports that
    checkout (the current folder comes first on sys.path), whose folder has no compiled module when
    minirt was installed from it with pip (not editable); the installed package has one."""
    if native.available:
        return None
    package = Path(minirt.__file__).resolve().parent
    checkout = package.parent
    if not (checkout / "setup.py").is_file() or not (checkout / "pyproject.toml").is_file():
        return None
    if Path.cwd().resolve() != checkout:
        return None
    return (f"this is the source checkout in {checkout} (python -m imports it from the current folder, not the "
            f"installed package): run `python3 -m minirt info` from another folder")


def cmd_info(args: argparse.Namespace) -> int:
    rows = [
        ("minirt", minirt.__version__),
        ("numpy", np.__version__),
        ("python", f"{platform.python_version()} ({platform.python_implementation()}) {sys.executable}"),
        ("platform", f"{platform.platform()} ({platform.machine()})"),
        ("providers", ", ".join(_providers.get_available_providers())),  # (minirt's names)
        ("builder extra", ", ".join(f"{m} {_package_status(m, d)}" for m, d in (("onnx", "onnx"), ("onnx_ir", "onnx-ir")))),
        ("onnxruntime", _package_status("onnxruntime", "onnxruntime") + " (for bench --compare and demo)"),
        ("native kernels", _native_status()),
    ]
    print(_table(rows, indent=""))
    return 0


# --- argument parsing -----------------------------------------------------------


def _add_trust_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--verify-key", metavar="KEY", help="require a valid signature by this public key (a .pub file, "
                                                       "a folder of them, or 64 hex digits)")
    p.add_argument("--require-signature", action="store_true",
                   help="refuse an artifact without a signature by a trusted key (--verify-key or MINIRT_TRUSTED_KEYS)")


def _trust(args: argparse.Namespace) -> dict:
    """The Session arguments of --verify-key / --require-signature (the environment's policy otherwise)."""
    return {"verify_key": args.verify_key, "require_signature": True if args.require_signature else None}


def _add_feed_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                   help="take input NAME from a .npy file (or a .npz holding NAME); repeatable; others are random")
    p.add_argument("--dim", action="append", default=[], metavar="SYMBOL=N",
                   help="size of a symbolic dimension for random inputs (default 1); repeatable")
    p.add_argument("--shape", action="append", default=[], metavar="NAME=DIMxDIM...",
                   help="full shape of random input NAME, e.g. x=1x3x48x192 (for unknown dims); repeatable")
    p.add_argument("--seed", type=int, default=0, help="seed for random inputs (default 0)")
    p.add_argument("--threads", type=_positive, default=None, help="kernel threads (default: library default)")


def _add_build_options(p: argparse.ArgumentParser) -> None:
    """The build options of minirt build, which minirt package takes too."""
    p.add_argument("--target", default="generic", help="device profile, e.g. generic, rpi4, android-api30, x86-64-v3, or host (this "
                        "machine) (default generic)")
    p.add_argument("--providers", default=None, metavar="LIST",
                   help=f"override the target's provider priority, e.g. tflite,cpu (names: {_PROVIDER_NAMES})")
    p.add_argument("--no-cpu-fallback", action="store_true",
                   help="a thin accelerator artifact: the partitions' provider programs without their CPU "
                        "version (a device where the provider cannot run a partition refuses the artifact)")
    p.add_argument("--coreml-precision", default=None, choices=("fp16", "fp32"),
                   help="compute precision of the Core ML programs (default: the --target's, fp16); fp32 where "
                        "activations leave float16's range (minirt verify reports an overflowing program)")
    p.add_argument("--weight-pack", type=int, default=None, choices=(0, 8, 16, 32), metavar="N",
                   help="store conv / MatMul / Gemm weights packed for the native kernels' panels of N output "
                        "channels (8: arm64 NEON and x86 SSE2, 16: AVX2, 32: AVX-512; 0: off), so the first "
                        "run does not pack them (default: the --target's: 8 on the arm64 targets, 16 on x86-64-v3, "
                        "32 on x86-64-v4, this machine's on host, 0 on generic)")
    p.add_argument("--uncompressed", action="store_true",
                   help="store every section as it is: a format-version-1 file, for runtimes that read only "
                        "version 1 (default: the operators, graph and tensor table as zlib streams once they "
                        "pass 4 KiB, format version 2)")
    p.add_argument("--opt-level", type=int, default=2, choices=(0, 1, 2, 3),
                   help="optimisation level: 0 none, 1 cleanup/folding/CSE, 2 + fusions (default), 3 + pattern recognition")
    p.add_argument("--disable-pass", action="append", default=[], metavar="NAME",
                   help="skip one optimizer or quantizer pass by name (repeatable; for debugging; the build "
                        "report lists them)")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=1x3x224x224",
                   help="fix an input's shape; repeatable")
    p.add_argument("--input-value", action="append", default=[], metavar="NAME=VALUE",
                   help="fix an input's value (NAME=16000, NAME=1,2,3 or NAME=FILE.npy): the graph is specialised "
                        "for it (branches and shapes that depend on it fold away); the input stays, and runs "
                        "must feed that value; repeatable")
    p.add_argument("--quantize", choices=["none", "fp16", "int4", "int8-dynamic", "int8", "auto"], default=None,
                   help="fp16 weights (half the size), int4 MatMul/Gemm weights in blocks along K (a float "
                        "decoder made int4: MatMulNBits; --block-size, --asymmetric-weights), int8 with "
                        "calibrated activations, int8 weights with "
                        "activations quantized at run time, none (float32), or auto: the --target's default "
                        "(rpi3/rpi4 int8-dynamic, rpi5 int8 with --calibration, else int8-dynamic; others "
                        "float32) when its cost model estimates it faster than float on this model.  Not "
                        "given: auto on the Raspberry Pi targets, float32 elsewhere")
    p.add_argument("--calibration", default=None, metavar="PATH",
                   help="calibration inputs for --quantize int8: an .npz keyed by input name, a folder of them, "
                        "or a folder of images with preprocess.json")
    p.add_argument("--calibration-method", choices=["minmax", "percentile", "entropy"], default="minmax",
                   help="how activation ranges are chosen (default minmax)")
    p.add_argument("--per-channel", action=argparse.BooleanOptionalAction, default=True,
                   help="per-output-channel weight scales (default on)")
    p.add_argument("--symmetric-activations", action="store_true", help="zero point 0 for activations")
    p.add_argument("--accuracy-budget", metavar="SPEC", default=None,
                   help="keep the most sensitive layers in float until it holds: top1-drop<=1, accuracy-drop<=X, "
                        "cosine>=0.99, max-abs<=X, mean-abs<=X; none: no budget.  Default with calibration or "
                        "eval data: cosine>=0.99 for int8 modes, max-abs<=0.005 for fp16")
    p.add_argument("--eval", metavar="PATH", default=None, help="held-out inputs for the accuracy report")
    p.add_argument("--quantize-final", action=argparse.BooleanOptionalAction, default=True,
                   help="compute the layers that feed outputs in int8 too (default); --no-quantize-final: they "
                        "compute in float32 from int8-stored weights")
    p.add_argument("--block-size", type=int, default=32, metavar="N",
                   help="--quantize int4: K values per 4-bit scale (a power of two >= 16; default 32)")
    p.add_argument("--asymmetric-weights", action="store_true",
                   help="--quantize int4: a zero point per block (default: symmetric, zero point 8)")
    p.add_argument("--allow-float-fallback", action="store_true",
                   help="with --quantize, build the float model (with a warning) when nothing would be quantized, "
                        "instead of failing")
    p.add_argument("--sign", default=None, metavar="KEYFILE",
                   help="sign the artifact with this Ed25519 private key (from 'minirt keygen')")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minirt", description="Build, inspect, run and benchmark minirt .mrt artifacts.")
    parser.add_argument("--version", action="version", version=f"minirt {minirt.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("build", help="build an ONNX model into a .mrt artifact (needs the builder extra)")
    p.add_argument("model", metavar="MODEL.onnx")
    p.add_argument("-o", "--output", metavar="OUT.mrt", help="output path (default: MODEL with a .mrt suffix)")
    _add_build_options(p)
    p.add_argument("--json", action="store_true", help="print the build report as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("package", help="build MODEL for a device and write what the device needs into one folder: "
                                       "model.mrt, the runtime wheel, run.py, install.sh, manifest.json")
    p.add_argument("model", metavar="MODEL.onnx")
    p.add_argument("-o", "--output", metavar="DIR", help="output folder (or DIR.tar.gz with --archive; default: "
                                                          "MODEL-TARGET beside the model)")
    p.add_argument("--wheel", default=None, metavar="PATH", help="the runtime wheel to ship (default: the newest one "
                                                                  "for the target's architecture in --wheel-dir)")
    p.add_argument("--wheel-dir", default=None, metavar="DIR",
                   help="where `make wheels` put the runtime wheels (default: dist/ of the source checkout); for this "
                        "machine's architecture a missing wheel is built")
    p.add_argument("--reduced", action="store_true",
                   help="ship a runtime without the kernel families and providers the model does not use")
    p.add_argument("--archive", action="store_true", help="write one .tar.gz instead of a folder")
    _add_build_options(p)
    p.add_argument("--json", action="store_true", help="print the package report as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=cmd_package)

    p = sub.add_parser("sweep", help="search build options per target on Ray: a results table, Pareto plots and "
                                     "the best artifact per target (needs the sweep extra)")
    p.add_argument("config", metavar="CONFIG", help="the sweep's .toml (or .yaml) file (docs/sweep.md)")
    p.add_argument("--workers", type=_positive, default=None, metavar="N",
                   help="CPUs of the local Ray instance (default: this machine's)")
    p.add_argument("--address", default=None, metavar="ADDR", help="join an existing Ray cluster (e.g. auto, or HOST:PORT)")
    p.add_argument("--cache", default=None, metavar="DIR", help="the result cache (default: .minirt-sweep beside CONFIG)")
    p.add_argument("--out", default=None, metavar="DIR", help="output folder (default: the config's sweep.output)")
    p.add_argument("--rebuild", action="store_true", help="recompute every candidate (the cache is rewritten, not read)")
    p.add_argument("--json", action="store_true", help="print the choices as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("keygen", help="create an Ed25519 key pair for signing artifacts: PREFIX.key and PREFIX.pub")
    p.add_argument("prefix", metavar="PREFIX", help="path prefix, e.g. keys/release -> keys/release.key, keys/release.pub")
    p.add_argument("--force", action="store_true", help="overwrite existing key files")
    p.set_defaults(func=cmd_keygen)

    p = sub.add_parser("inspect", help="show an artifact's sections, operators, signature and metadata")
    p.add_argument("artifact", metavar="ART.mrt")
    p.add_argument("--json", action="store_true", help="machine-readable output with full metadata")
    p.add_argument("--graph", metavar="OUT.svg", help="also draw the main graph, nodes coloured by provider (.svg or .png)")
    p.add_argument("--onnx", metavar="OUT.onnx",
                   help="also export the optimized, partitioned graph as ONNX for Netron: shapes on the edges, "
                        "provider, partition and precision in each node's metadata (needs onnx)")
    _add_trust_options(p)
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("install", help="check NEW.mrt and atomically replace LIVE.mrt with it (safe under running "
                                       "sessions, unlike cp)")
    p.add_argument("new", metavar="NEW.mrt")
    p.add_argument("live", metavar="LIVE.mrt", help="the file to replace or create (or a folder: NEW's name in it)")
    _add_trust_options(p)
    p.set_defaults(func=cmd_install)

    p = sub.add_parser("verify", help="run every partition on the available providers and compare with the golden outputs")
    p.add_argument("artifact", metavar="ART.mrt")
    p.add_argument("--rtol", type=float, default=1e-2, help="max error relative to the golden output's magnitude (default 0.01)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _add_trust_options(p)
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("run", help="run an artifact once on given or random inputs")
    p.add_argument("artifact", metavar="ART.mrt")
    _add_feed_options(p)
    p.add_argument("--save", metavar="OUT.npz", help="write the outputs to an .npz keyed by output name")
    _add_trust_options(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("bench", help="measure load time, latency, per-node overhead and peak memory")
    p.add_argument("artifact", metavar="ART.mrt")
    _add_feed_options(p)
    p.add_argument("--runs", type=_positive, default=20, help="timed runs (default 20)")
    p.add_argument("--warmup", type=_non_negative, default=3, help="untimed warm-up runs (default 3)")
    p.add_argument("--profile-runs", type=_positive, default=5, help="profiled runs for the per-node overhead (default 5)")
    p.add_argument("--compare", metavar="MODEL.onnx", help="also time onnxruntime on this model, interleaved")
    p.add_argument("--top", type=_positive, default=10, help="op types in the per-op table (default 10)")
    p.add_argument("--plot", metavar="FILE.png", help="draw the latency distribution and the per-op times (matplotlib)")
    p.add_argument("--providers", default=None, metavar="LIST",
                   help="session providers, e.g. tflite,cpu (default: the artifact's target order); when an "
                        "accelerator runs a partition the CPU-only session is timed alongside")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _add_trust_options(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("demo", help="build the digits example and compare minirt with onnxruntime")
    p.add_argument("--runs", type=_positive, default=20, help="timed runs per latency figure (default 20)")
    p.add_argument("--out", metavar="DIR", help="keep the built artifact in DIR (default: a temporary folder)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("generate", help="generate text with a language model folder (onnxruntime-genai's layout), "
                                        "streaming it, with tokens/s (needs the genai extra)")
    from minirt.genai._cli import add_arguments as _generate_arguments  # (numpy only: no tokenizer, no onnx)

    _generate_arguments(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("info", help="versions, platform, providers and installed extras")
    p.set_defaults(func=cmd_info)
    return parser


def _error_message(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed usage and 'minirt <cmd>: error: ...'
        return exc.code if isinstance(exc.code, int) else 2
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.func(args)
    except BrokenPipeError:  # e.g. `minirt inspect x.mrt | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except (Error, OSError) as exc:
        print(f"minirt {args.command}: error: {_error_message(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
