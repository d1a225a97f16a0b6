"""The TFLite provider: runs a partition's TFLite translation with a TFLite interpreter.

The program (provider blob, written by ``targets.tflite``) is a ``.tflite``
flatbuffer behind a small header saying which partition inputs it takes and
the NCHW<->NHWC transposes around the call (docs/nnapi.md).  Any installed
interpreter works, tried in this order: ``ai_edge_litert`` (LiteRT, numpy 2),
``tflite_runtime`` (e.g. Raspberry Pi OS, numpy 1.x), ``tensorflow.lite``.
With XNNPACK (the interpreters' default CPU delegate) this gives optimized
NHWC kernels on ARM and x86.
"""
from __future__ import annotations

import importlib
import importlib.util
import threading

import numpy as np

from minirt.errors import Error
from minirt.providers import _program

MAGIC = b"MRTTFLIT"
_MODULES = ("ai_edge_litert.interpreter", "tflite_runtime.interpreter", "tensorflow.lite")


class TFLiteError(Error):
    """The TFLite program could not be loaded or run."""


def decode_blob(blob) -> tuple[dict, bytes]:
    header, mv, base = _program.unpack(blob, MAGIC, 1, "TFLite", TFLiteError)
    return header, bytes(mv[base:])


def _interpreter_module():
    for name in _MODULES:
        top = name.split(".")[0]
        if importlib.util.find_spec(top) is None:
            continue
        try:
            mod = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a broken install (e.g. tflite-runtime 2.14 with numpy 2)
            continue
        return mod
    return None


def _find_spec_names():
    return [n for n in _MODULES if importlib.util.find_spec(n.split(".")[0]) is not None]


class TFLiteProvider:
    name = "tflite"

    def available(self) -> tuple[bool, str]:
        names = _find_spec_names()
        if not names:
            return False, "no TFLite interpreter installed (pip install ai-edge-litert, or tflite-runtime with numpy 1.x)"
        return True, f"TFLite interpreter from {names[0].split('.')[0]}"

    def compile(self, blob, partition, artifact, options):
        header, flat = decode_blob(blob)
        return program_from_flatbuffer(flat, header, int((options or {}).get("num_threads") or 0) or None)


def program_from_flatbuffer(flat: bytes, header: dict, threads: int | None = None):
    """The callable that runs a ``.tflite`` flatbuffer on the TFLite interpreter, its inputs and outputs
    laid out by ``header`` (input_map, input_perm, output_perm: :func:`make_program`)."""
    mod = _interpreter_module()
    if mod is None:
        raise TFLiteError("no importable TFLite interpreter")
    interp = mod.Interpreter(model_content=flat, num_threads=threads)
    interp.allocate_tensors()
    ins = [d["index"] for d in interp.get_input_details()]
    outs = [d["index"] for d in interp.get_output_details()]
    in_dtypes = [d["dtype"] for d in interp.get_input_details()]
    return make_program(interp, ins, outs, in_dtypes, header)


def make_program(interp, ins, outs, in_dtypes, header):
    input_map = header.get("input_map") or list(range(len(ins)))
    in_perm = header.get("input_perm") or [None] * len(ins)
    out_perm = header.get("output_perm") or [None] * len(outs)
    lock = threading.Lock()

    def program(*args):
        if len(args) == len(input_map):
            feeds = [None] * len(ins)
            for a, pos in zip(args, input_map):
                if pos is not None:
                    feeds[pos] = a
        elif len(args) == len(ins):
            feeds = list(args)
        else:
            raise TFLiteError(f"the program takes {len(ins)} runtime inputs, got {len(args)}")
        with lock:  # an interpreter runs one invocation at a time
            for t, a, p, dt in zip(ins, feeds, in_perm, in_dtypes):
                a = np.asarray(a)
                if p is not None:
                    a = np.transpose(a, p)
                interp.set_tensor(t, np.ascontiguousarray(a, dtype=dt))
            interp.invoke()
            res = [interp.get_tensor(t) for t in outs]
        return tuple(np.ascontiguousarray(np.transpose(r, p)) if p is not None else r for r, p in zip(res, out_perm))

    program.interpreter = interp
    return program
