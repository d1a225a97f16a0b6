"""Lower a partition to a Core ML ML Program and package it as a provider blob.

The program is built with coremltools' MIL builder (one function ``main``),
converted with ``ct.convert(..., convert_to="mlprogram",
skip_model_load=True)`` (so this works on Linux) in fp16 or fp32 compute
precision, saved as an ``.mlpackage`` and stored as a zip of that package
(deterministic: sorted entries, fixed timestamps, package identifiers derived
from the content).

Program interface: inputs ``in_0 .. in_{n-1}`` (the partition's run-time
inputs, in order) and outputs ``out_0 .. out_{m-1}`` (its outputs, in order),
fp32 (or the ONNX value's fp16); an integer or bool value is an int32 input or
output (Core ML's model interface has no int64 or bool arrays): a bool input is
cast to MIL bool inside, a bool output is cast to int32 (0/1), and the runtime
casts int64 / bool arrays to int32 on the way in and every output back to its
ONNX dtype on the way out (``minirt/providers/coreml.py``).  The partition
options record the names and the ONNX value names they stand for.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import re
import tempfile
import uuid
import zipfile

import numpy as np

from minirt.targets.coreml.rules import RULES
from minirt.targets.providers import LoweringError
from minirt.targets.rules import Emitter

BLOB_FORMAT = "mlpackage-zip"
_ZIP_TIME = (2020, 1, 1, 0, 0, 0)


def import_coremltools():
    """Import coremltools quietly (it logs about its missing native libraries on Linux)."""
    logger = logging.getLogger("coremltools")
    old = logger.level
    logger.setLevel(logging.ERROR)
    try:
        import coremltools as ct  # noqa: F401
    finally:
        logger.setLevel(old)
    return ct


class LowerEnv(Emitter):
    """Value bindings while building one MIL function (see targets/coreml/rules.py)."""

    def __init__(self, ctx, mb):
        super().__init__(ctx)
        self.mb = mb
        self.vars: dict[int, object] = {}
        self._names: set[str] = set()

    def n(self, node, suffix: str) -> str:
        base = re.sub(r"[^A-Za-z0-9_]", "_", f"{node.name or node.op_type}_{suffix}")
        if not re.match(r"[A-Za-z_]", base):
            base = "v_" + base
        name, k = base, 1
        while name in self._names:
            k += 1
            name = f"{base}_{k}"
        self._names.add(name)
        return name

    def get(self, value):
        var = self.vars.get(id(value))
        if var is not None:
            return var
        arr = self.ctx.const(value)
        if arr is None:
            raise LoweringError(f"value {value.name!r} is neither computed in the partition nor constant")
        if arr.dtype == np.float64:
            arr = arr.astype(np.float32)
        elif arr.dtype == np.int64:
            arr = arr.astype(np.int32)
        return arr

    def const(self, value):
        return self.ctx.const(value)

    def shape(self, value):
        s = self.ctx.static_shape(value)
        if s is None:
            raise LoweringError(f"value {value.name!r} has no static shape")
        return s

    def set(self, value, var, rename: bool = False):
        self.vars[id(value)] = var


def build_program(part, ctx, opset_version):
    """The pymil Program for ``part`` (PartitionIR)."""
    ct = import_coremltools()
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import Function, Program, types

    specs = {}
    for i, v in enumerate(part.inputs):
        specs[f"in_{i}"] = mb.placeholder(shape=list(ctx.static_shape(v)), dtype=_io_type(ctx.dtype(v), types))
    with Function(specs, opset_version=opset_version) as func:
        env = LowerEnv(ctx, mb)
        for i, v in enumerate(part.inputs):
            var = func.inputs[f"in_{i}"]
            if ctx.dtype(v) == np.bool_:
                var = mb.cast(x=var, dtype="bool", name=f"in_{i}_bool")
            env.set(v, var)
        RULES.emit_all(part.nodes, env)
        outs = []
        for i, v in enumerate(part.outputs):
            var = env.vars.get(id(v))
            if var is None:
                raise LoweringError(f"partition output {v.name!r} was not produced")
            if var.dtype == types.bool:
                outs.append(mb.cast(x=var, dtype="int32", name=f"out_{i}"))
            else:
                outs.append(mb.identity(x=var, name=f"out_{i}"))
        func.set_outputs(outs)
    prog = Program()
    prog.add_function("main", func)
    return prog


def _io_type(dtype, types):
    """The MIL type of a program input standing for an ONNX value of numpy ``dtype``."""
    if dtype == np.float16:
        return types.fp16
    if dtype is not None and np.dtype(dtype).kind in "biu":
        return types.int32  # (int64 and bool arrive as int32: the module docstring)
    return types.fp32


def convert(prog, precision: str, deployment_target: str):
    """``ct.convert`` the program to an ML Program model (not loaded: works on Linux)."""
    ct = import_coremltools()
    target = getattr(ct.target, deployment_target)
    prec = ct.precision.FLOAT16 if precision == "fp16" else ct.precision.FLOAT32
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        return ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=target,
                          compute_precision=prec, skip_model_load=True)


def package_bytes(mlmodel) -> bytes:
    """Save ``mlmodel`` as an .mlpackage and return it as deterministic zip bytes."""
    with tempfile.TemporaryDirectory(prefix="minirt-coreml-") as tmp:
        path = os.path.join(tmp, "model.mlpackage")
        with contextlib.redirect_stderr(io.StringIO()):
            mlmodel.save(path)
        _stabilise_spec(path)
        _stabilise_manifest(path)
        return zip_dir(path)


def _stabilise_spec(pkg: str) -> None:
    """Re-serialise the package's model spec with its protobuf maps in key order: coremltools writes them
    in the order of Python's string hashes, which change from process to process, so two builds of one
    model gave different blobs (D174)."""
    from coremltools.proto import Model_pb2

    for folder, _dirs, files in os.walk(os.path.join(pkg, "Data")):
        for name in files:
            if not name.endswith(".mlmodel"):
                continue
            full = os.path.join(folder, name)
            spec = Model_pb2.Model()
            with open(full, "rb") as f:
                spec.ParseFromString(f.read())
            with open(full, "wb") as f:
                f.write(spec.SerializeToString(deterministic=True))


def _stabilise_manifest(pkg: str) -> None:
    """Replace the random item identifiers of Manifest.json by content-derived ones."""
    mpath = os.path.join(pkg, "Manifest.json")
    with open(mpath, encoding="utf-8") as f:
        manifest = json.load(f)
    entries = manifest.get("itemInfoEntries", {})
    mapping = {}
    for old, info in entries.items():
        item = os.path.join(pkg, "Data", info.get("path", ""))
        digest = hashlib.sha256(info.get("path", "").encode())
        if os.path.isfile(item):
            with open(item, "rb") as f:
                digest.update(f.read())
        mapping[old] = str(uuid.UUID(bytes=digest.digest()[:16], version=4)).upper()
    manifest["itemInfoEntries"] = {mapping[k]: v for k, v in entries.items()}
    if manifest.get("rootModelIdentifier") in mapping:
        manifest["rootModelIdentifier"] = mapping[manifest["rootModelIdentifier"]]
    with open(mpath, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)


def zip_dir(path: str) -> bytes:
    buf = io.BytesIO()
    root = os.path.basename(path.rstrip(os.sep))
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for folder, dirs, files in sorted(os.walk(path)):
            dirs.sort()
            for name in sorted(files):
                full = os.path.join(folder, name)
                rel = os.path.join(root, os.path.relpath(full, path)).replace(os.sep, "/")
                info = zipfile.ZipInfo(rel, _ZIP_TIME)
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                with open(full, "rb") as f:
                    zf.writestr(info, f.read())
    return buf.getvalue()


def unzip_package(blob: bytes, dest: str) -> str:
    """Extract a blob made by :func:`zip_dir` into ``dest``; returns the .mlpackage path."""
    with zipfile.ZipFile(io.BytesIO(bytes(blob))) as zf:
        names = zf.namelist()
        for n in names:
            if n.startswith("/") or ".." in n.split("/"):
                raise ValueError(f"unsafe path {n!r} in Core ML blob")
        zf.extractall(dest)
    root = names[0].split("/")[0]
    return os.path.join(dest, root)
