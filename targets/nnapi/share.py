"""Weights shared between an NNAPI program and the CPU version of its partition (issue 27, part 5).

A constant tensor operand of the NNAPI model (the blob, ``targets.nnapi.model``) whose values are
those of one of the artifact's tensors (a CPU-version initializer) is stored as a reference to that
tensor instead of a copy of its bytes: ``"r": [tensor index]`` when the bytes are the same (the
tensor reshaped to the operand's dims: FULLY_CONNECTED weights of a Gemm with ``transB=1``, biases,
per-channel scales...), ``"r": [tensor index, perm]`` when the operand is a transpose of it
(``np.transpose(tensor, perm)`` reshaped to the operand's dims: CONV_2D filters OHWI of an OIHW
weight, DEPTHWISE_CONV_2D ``[1, kh, kw, C]``, FULLY_CONNECTED ``[N, K]`` of a MatMul's ``[K, N]``),
``"r": [tensor index, perm, shape]`` when it is a transpose of the tensor reshaped to ``shape`` (one
axis of a matrix split in two: a Gemm's columns in (H, W, C) order behind a Flatten).
Every match is checked element for element (bitwise) here, so a reference is only ever written for
values that are exactly equal; a constant the lowering computed (folded scales, permuted Gemm columns
with a bias folded in, HardSigmoid folding) matches nothing and keeps its copy.

The runtime (``minirt.providers.nnapi.decode_blob``) resolves ``"r"`` against the artifact: an exact
reference is a view of the mapped tensor (zero copy: NNAPI's setOperandValue points into the file);
a transposed one is made once when the program is compiled and kept alive with it (a copy in
memory: the file stores the weights once, the process holds the NNAPI layout once).
"""
from __future__ import annotations

import hashlib
import itertools

import numpy as np

from minirt.providers import _program
from minirt.providers.nnapi import MAGIC, _TENSOR_DTYPES

MIN_SHARED_BYTES = 1024  # smaller constants keep their copy (a reference saves little, costs a lookup)


def _bits(a: np.ndarray) -> np.ndarray:
    """The array's elements as unsigned integers of the same width (bitwise comparison: -0.0 != 0.0, NaN == NaN)."""
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _squeezed(shape) -> tuple:
    return tuple(int(d) for d in shape if d != 1)


def _digest(a: np.ndarray) -> bytes:
    return hashlib.blake2b(memoryview(np.ascontiguousarray(a)).cast("B"), digest_size=16).digest()


def share_weights(blob: bytes, tensors: dict, relayout: bool = True, min_bytes: int = MIN_SHARED_BYTES):
    """(new blob, stats): ``blob`` with its constant operands of at least ``min_bytes`` that equal one of
    ``tensors`` (artifact tensor index -> array) replaced by references.  ``relayout``: also transposed
    matches.  stats: ``constant_bytes`` (tensor constants of the program before), ``shared_bytes`` (exact
    references), ``relayout_bytes`` (transposed references), ``shared_operands``.  A blob with no match
    comes back unchanged (still version 1)."""
    header, mv, base = _program.unpack(blob, MAGIC, 1, "NNAPI", ValueError)
    data = mv[base:]
    by_digest: dict = {}  # (dtype, digest) -> tensor indices, filled per (dtype, size) on first need
    hashed: set = set()
    by_size: dict = {}
    for index, arr in tensors.items():
        arr = np.asarray(arr)
        if arr.dtype == object or arr.nbytes < min_bytes or arr.dtype.itemsize not in (1, 2, 4, 8):
            continue
        by_size.setdefault((arr.dtype.str, arr.size), []).append(index)
    stats = {"constant_bytes": 0, "shared_bytes": 0, "relayout_bytes": 0, "shared_operands": 0}
    refs: dict = {}  # operand position -> "r" record
    for pos, rec in enumerate(header["operands"]):
        if "v" not in rec:
            continue
        off, length = rec["v"]
        stats["constant_bytes"] += length
        dt = np.dtype(_TENSOR_DTYPES.get(int(rec["t"]), np.uint8))
        if length < min_bytes or int(rec["t"]) not in _TENSOR_DTYPES:
            continue
        value = np.frombuffer(data, dtype=dt, count=length // dt.itemsize, offset=off).reshape(rec["d"])
        cands = by_size.get((dt.str, value.size))
        if not cands:
            continue
        key = (dt.str, _digest(value))
        if (dt.str, value.size) not in hashed:
            for index in cands:
                by_digest.setdefault((dt.str, _digest(tensors[index])), []).append(index)
            hashed.add((dt.str, value.size))
        found = None
        for index in by_digest.get(key, ()):
            if np.array_equal(_bits(np.ascontiguousarray(tensors[index]).reshape(-1)), _bits(value.reshape(-1))):
                found = [int(index)]
                stats["shared_bytes"] += length
                break
        if found is None and relayout:
            found = _transposed_match(value, cands, tensors)
            if found is not None:
                stats["relayout_bytes"] += length
        if found is not None:
            refs[pos] = found
            stats["shared_operands"] += 1
    if not refs:
        return bytes(blob), stats
    new_data = bytearray()
    operands = []
    for pos, rec in enumerate(header["operands"]):
        rec = dict(rec)
        if pos in refs:
            del rec["v"]
            rec["r"] = refs[pos]
        elif "v" in rec:
            off, length = rec["v"]
            new_data += b"\0" * ((-len(new_data)) % 16)
            rec["v"] = [len(new_data), length]
            new_data += bytes(data[off:off + length])
        operands.append(rec)
    header = dict(header)
    header["operands"] = operands
    header["version"] = 2
    return _program.pack(MAGIC, 2, header, bytes(new_data)), stats


def _transposed_match(value: np.ndarray, cands: list, tensors: dict):
    """[tensor index, perm] (or [tensor index, perm, shape]: the tensor reshaped to ``shape`` first) of a
    candidate whose transpose (then reshape to the operand's dims) equals ``value`` bitwise, or None.
    The ``shape`` form splits one axis of a matrix in two: a Gemm's weight columns put in (H, W, C) order
    behind a Flatten of an NCHW map (``[N, C*H*W]`` -> ``[N, C, H*W]``, perm ``[0, 2, 1]``)."""
    for index in cands:
        src = np.asarray(tensors[index])
        if src.ndim < 2 or src.ndim > 4:
            continue
        found = _match_perms(value, src, src.shape)
        if found is not None:
            return [int(index), found]
    for index in cands:
        src = np.asarray(tensors[index])
        if src.ndim != 2:
            continue
        for axis in (0, 1):
            dim = int(src.shape[axis])
            for a in range(2, min(dim, 4096)):
                if dim % a:
                    continue
                shape = src.shape[:axis] + (a, dim // a) + src.shape[axis + 1:]
                found = _match_perms(value, src.reshape(shape), shape, any_shape=True)
                if found is not None:
                    return [int(index), found, [int(d) for d in shape]]
    return None


def _match_perms(value: np.ndarray, src: np.ndarray, shape, any_shape: bool = False) -> list | None:
    """The perm (not the identity) whose transpose of ``src``, flattened, is ``value`` flattened; unless
    ``any_shape``, only perms whose result has the operand's dims (but for axes of 1)."""
    want = _squeezed(value.shape)
    for perm in itertools.permutations(range(src.ndim)):
        if perm == tuple(range(src.ndim)):
            continue
        t = np.transpose(src, perm)
        if not any_shape and _squeezed(t.shape) != want:
            continue
        # cheap first look: the first row of the last axis
        probe = t[(0,) * (t.ndim - 1)]
        vprobe = value.reshape(t.shape)[(0,) * (t.ndim - 1)]
        if not np.array_equal(_bits(np.ascontiguousarray(probe)), _bits(np.ascontiguousarray(vprobe))):
            continue
        if np.array_equal(_bits(np.ascontiguousarray(t)).reshape(-1), _bits(value).reshape(-1)):
            return [int(p) for p in perm]
    return None
