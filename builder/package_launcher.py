#!/usr/bin/env python3
"""The launcher of a minirt package (written by `minirt package`, copied beside model.mrt as run.py).

On the device, after ``sh install.sh``::

    .venv/bin/python run.py info                      # the model's inputs and outputs, the runtime, the kernels
    .venv/bin/python run.py check                     # every file against manifest.json (sha256)
    .venv/bin/python run.py run x.npy                 # one run; inputs: .npy (one input), .npz (by name), .json
    .venv/bin/python run.py classify x.npy --top 5    # the top classes of a one-output model
    .venv/bin/python run.py folder DIR --out results.jsonl   # every .npy / .npz / .json input in DIR
    .venv/bin/python run.py serve --port 8080         # HTTP: POST /run {"inputs": {name: nested list}}; GET /health

Needs numpy and the minirt runtime only (no network).  Exit status 0 on success, 2 on bad input (the
message says what and where), 1 on a failed check.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


class BadInput(Exception):
    """Input the launcher cannot use: the message names the file and what was expected."""


def _manifest() -> dict:
    path = HERE / "manifest.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BadInput(f"{path}: not a readable manifest ({exc}); this folder is not a minirt package") from None


def _session():
    import minirt

    return minirt.InferenceSession(str(HERE / _manifest()["model"]["file"]))


def _load_inputs(session, path: Path) -> dict:
    """The feed of one input file: .npy (the model's only input), .npz (arrays by input name) or .json
    ({name: nested list})."""
    import numpy as np

    inputs = session.get_inputs()
    try:
        if path.suffix == ".npy":
            if len(inputs) != 1:
                raise BadInput(f"{path}: a .npy file feeds a one-input model; this one has {len(inputs)} inputs "
                               f"({', '.join(i.name for i in inputs)}): use an .npz keyed by input name")
            return {inputs[0].name: np.load(path, allow_pickle=False)}
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as data:
                return {k: data[k] for k in data.files}
        if path.suffix == ".json":
            return _json_feed(session, json.loads(path.read_text()), str(path))
    except BadInput:
        raise
    except (OSError, ValueError) as exc:
        raise BadInput(f"{path}: cannot read it ({exc})") from None
    raise BadInput(f"{path}: unknown input file type {path.suffix!r} (expected .npy, .npz or .json)")


_DTYPES = {"tensor(float)": "float32", "tensor(double)": "float64", "tensor(int64)": "int64",
           "tensor(int32)": "int32", "tensor(uint8)": "uint8", "tensor(int8)": "int8", "tensor(bool)": "bool",
           "tensor(float16)": "float16"}


def _json_feed(session, obj, where: str) -> dict:
    import numpy as np

    if not isinstance(obj, dict):
        raise BadInput(f"{where}: expected a JSON object {{input name: nested list}}, got {type(obj).__name__}")
    feed = {}
    types = {i.name: i.type for i in session.get_inputs()}
    for name, value in obj.items():
        if name not in types:
            raise BadInput(f"{where}: unknown input {name!r}; the model's inputs are {sorted(types)}")
        try:
            feed[name] = np.asarray(value, dtype=_DTYPES.get(types[name], "float32"))
        except (TypeError, ValueError) as exc:
            raise BadInput(f"{where}: input {name!r} is not a rectangular array of numbers ({exc})") from None
    return feed


def _run(session, feed: dict) -> dict:
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feed)))


def cmd_info(args) -> int:
    import minirt

    manifest = _manifest()
    session = _session()
    print(f"model: {manifest['model']['file']} (sha256 {manifest['model']['sha256'][:16]}..., from "
          f"{manifest['model'].get('source', '?')}), target {manifest['target']['name']}")
    for i in session.get_inputs():
        print(f"  input  {i.name}: {i.type} {i.shape}")
    for o in session.get_outputs():
        print(f"  output {o.name}: {o.type} {o.shape}")
    from minirt import native

    print(f"minirt {minirt.__version__}; providers {session.get_providers()}; native kernels: "
          f"{native.describe() if native.available else 'not active (' + str(native.reason) + ')'}")
    return 0


def cmd_check(args) -> int:
    manifest = _manifest()
    bad = []
    for name, digest in sorted(manifest["files"].items()):
        path = HERE / name
        if not path.is_file():
            bad.append(f"{name}: missing")
            continue
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        if h.hexdigest() != digest:
            bad.append(f"{name}: sha256 {h.hexdigest()} differs from the manifest's {digest}")
    for line in bad:
        print(f"check: {line}", file=sys.stderr)
    print(f"check: {len(manifest['files']) - len(bad)} of {len(manifest['files'])} files match the manifest")
    return 1 if bad else 0


def cmd_run(args) -> int:
    import numpy as np

    session = _session()
    feed = _load_inputs(session, Path(args.input))
    t0 = time.perf_counter()
    outputs = _run(session, feed)
    ms = (time.perf_counter() - t0) * 1e3
    if args.out:
        np.savez(args.out, **outputs)
        print(f"wrote {args.out} ({ms:.2f} ms)")
    else:
        for name, value in outputs.items():
            print(f"{name}: shape {list(np.shape(value))} {np.asarray(value).ravel()[:8].tolist()}"
                  f"{' ...' if np.size(value) > 8 else ''}")
        print(f"({ms:.2f} ms)")
    return 0


def _top(session, outputs: dict, k: int) -> list:
    import numpy as np

    if len(outputs) != 1:
        raise BadInput(f"classify needs a one-output model; this one has {len(outputs)} ({', '.join(outputs)})")
    scores = np.asarray(next(iter(outputs.values())), dtype=np.float64).reshape(-1)
    order = np.argsort(-scores)[:k]
    labels = session.get_modelmeta().custom_metadata_map.get("labels")
    names = json.loads(labels) if labels else None
    return [{"class": int(i), "score": float(scores[i]), **({"label": names[i]} if names and i < len(names) else {})}
            for i in order]


def cmd_classify(args) -> int:
    session = _session()
    for path in args.inputs:
        top = _top(session, _run(session, _load_inputs(session, Path(path))), args.top)
        print(f"{path}: " + ", ".join(f"{t.get('label', t['class'])} {t['score']:.4f}" for t in top))
    return 0


def cmd_folder(args) -> int:
    import numpy as np

    session = _session()
    folder = Path(args.folder)
    if not folder.is_dir():
        raise BadInput(f"{folder}: not a folder")
    files = sorted(p for p in folder.iterdir() if p.suffix in (".npy", ".npz", ".json"))
    if not files:
        raise BadInput(f"{folder}: no .npy, .npz or .json inputs in it")
    out = open(args.out, "w") if args.out else sys.stdout
    try:
        for path in files:
            t0 = time.perf_counter()
            outputs = _run(session, _load_inputs(session, path))
            row = {"file": path.name, "ms": round((time.perf_counter() - t0) * 1e3, 3),
                   "outputs": {k: np.asarray(v).tolist() for k, v in outputs.items()}}
            out.write(json.dumps(row) + "\n")
    finally:
        if out is not sys.stdout:
            out.close()
    if args.out:
        print(f"wrote {len(files)} results to {args.out}")
    return 0


def cmd_serve(args) -> int:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import numpy as np

    session = _session()

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802 (http.server's name)
            if self.path == "/health":
                self._reply(200, {"status": "ok", "model": _manifest()["model"]["sha256"]})
            else:
                self._reply(404, {"error": f"unknown path {self.path!r}: GET /health, POST /run"})

        def do_POST(self):  # noqa: N802
            if self.path != "/run":
                self._reply(404, {"error": f"unknown path {self.path!r}: POST /run"})
                return
            try:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                feed = _json_feed(session, body.get("inputs") if isinstance(body, dict) else None, "request body")
                outputs = _run(session, feed)
            except BadInput as exc:
                self._reply(400, {"error": str(exc)})
                return
            except ValueError as exc:
                self._reply(400, {"error": f"request body: {exc}"})
                return
            except Exception as exc:  # (a model error: reported, the server keeps serving)
                self._reply(500, {"error": f"{type(exc).__name__}: {exc}"})
                return
            self._reply(200, {"outputs": {k: np.asarray(v).tolist() for k, v in outputs.items()}})

        def log_message(self, fmt, *a):
            if not args.quiet:
                super().log_message(fmt, *a)

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"serving {_manifest()['model']['file']} on http://{args.host}:{server.server_port} "
          f"(POST /run, GET /health)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="run.py", description="Run the packaged minirt model.")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="the model's inputs and outputs, the runtime and its kernels").set_defaults(func=cmd_info)
    sub.add_parser("check", help="every file against manifest.json").set_defaults(func=cmd_check)
    s = sub.add_parser("run", help="one run on an input file (.npy, .npz or .json)")
    s.add_argument("input")
    s.add_argument("--out", help="write the outputs to this .npz")
    s.set_defaults(func=cmd_run)
    s = sub.add_parser("classify", help="the top classes of a one-output model for each input file")
    s.add_argument("inputs", nargs="+")
    s.add_argument("--top", type=int, default=5)
    s.set_defaults(func=cmd_classify)
    s = sub.add_parser("folder", help="run every .npy / .npz / .json input of a folder; one JSON line per file")
    s.add_argument("folder")
    s.add_argument("--out", help="write the JSON lines here (default: stdout)")
    s.set_defaults(func=cmd_folder)
    s = sub.add_parser("serve", help="an HTTP server: POST /run, GET /health")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8080)
    s.add_argument("-q", "--quiet", action="store_true", help="no request log")
    s.set_defaults(func=cmd_serve)
    args = p.parse_args(argv)
    try:
        return args.func(args)
    except BadInput as exc:
        print(f"run.py: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"run.py: {exc}: install the runtime first (sh install.sh)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
