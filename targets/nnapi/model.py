"""An NNAPI model under construction, and its serialisation (the provider blob).

The blob is minirt's own compact description of an NNAPI model (see
docs/nnapi.md): the operands (type, dims, quantization, constant value),
the operations (code, input and output operand indices), the model's inputs
and outputs, and the layout changes the runtime does around the call
(NCHW partition inputs are fed to NNAPI in NHWC and its NHWC outputs are
returned in NCHW).  The runtime provider (``minirt.providers.nnapi``)
replays it through the NNAPI C API; the TFLite translator
(``targets.tflite.translate``) turns the same description into a TFLite
flatbuffer.
"""
from __future__ import annotations

import numpy as np

from minirt.providers import _program
from minirt.targets.nnapi import oplevels as C

MAGIC = b"MRTNNAPI"
VERSION = 1

TENSOR_DTYPES = {
    C.TENSOR_FLOAT32: np.float32, C.TENSOR_INT32: np.int32, C.TENSOR_QUANT8_ASYMM: np.uint8,
    C.TENSOR_FLOAT16: np.float16, C.TENSOR_BOOL8: np.bool_, C.TENSOR_QUANT8_SYMM_PER_CHANNEL: np.int8,
    C.TENSOR_QUANT8_SYMM: np.int8, C.TENSOR_QUANT8_ASYMM_SIGNED: np.int8, C.TENSOR_QUANT16_SYMM: np.int16,
    C.TENSOR_QUANT16_ASYMM: np.uint16,
}


class Operand:
    __slots__ = ("type", "dims", "scale", "zero_point", "value", "channel_dim", "channel_scales", "name")

    def __init__(self, type_, dims, scale=0.0, zero_point=0, value=None, channel_dim=None, channel_scales=None,
                 name=""):
        self.type = int(type_)
        self.dims = tuple(int(d) for d in dims)
        self.scale = float(scale)
        self.zero_point = int(zero_point)
        self.value = value  # np.ndarray (tensor constant), python scalar (scalar constant) or None
        self.channel_dim = channel_dim
        self.channel_scales = None if channel_scales is None else [float(s) for s in channel_scales]
        self.name = name


class NNModel:
    """Operands and operations in NNAPI's terms, built by ``targets.nnapi.lower``."""

    def __init__(self):
        self.operands: list[Operand] = []
        self.operations: list[tuple[int, list, list]] = []
        self.inputs: list[int] = []  # model input operand indices
        self.outputs: list[int] = []
        # per partition input (in partition order): model input position or None (constant, embedded)
        self.input_map: list = []
        self.input_perm: list = []  # per model input: permutation applied by the runtime before the call, or None
        self.output_perm: list = []  # per model output: permutation applied after the call, or None
        self.min_api_level = 27
        self.input_names: list = []
        self.output_names: list = []

    # --- building -----------------------------------------------------------
    def add_operand(self, type_, dims=(), **kw) -> int:
        self.operands.append(Operand(type_, dims, **kw))
        return len(self.operands) - 1

    def tensor(self, dims, type_=C.TENSOR_FLOAT32, **kw) -> int:
        return self.add_operand(type_, dims, **kw)

    def const(self, array, type_=None, **kw) -> int:
        a = np.ascontiguousarray(array)
        if type_ is None:
            if a.dtype == np.float32:
                type_ = C.TENSOR_FLOAT32
            elif a.dtype in (np.int32, np.int64):
                type_, a = C.TENSOR_INT32, a.astype(np.int32)
            elif a.dtype == np.float16:
                type_ = C.TENSOR_FLOAT16
            elif a.dtype == np.bool_:
                type_ = C.TENSOR_BOOL8
            else:
                a = a.astype(np.float32)
                type_ = C.TENSOR_FLOAT32
        a = np.ascontiguousarray(a, dtype=TENSOR_DTYPES[type_])
        return self.add_operand(type_, a.shape, value=a, **kw)

    def i32(self, v: int) -> int:
        return self.add_operand(C.INT32, (), value=int(v))

    def f32(self, v: float) -> int:
        return self.add_operand(C.FLOAT32, (), value=float(v))

    def boolean(self, v: bool) -> int:
        return self.add_operand(C.BOOL, (), value=bool(v))

    def op(self, code: int, inputs, outputs) -> None:
        self.operations.append((int(code), [int(i) for i in inputs], [int(o) for o in outputs]))
        self.min_api_level = max(self.min_api_level, C.MIN_API_LEVEL[code])

    def need(self, level: int) -> None:
        self.min_api_level = max(self.min_api_level, level)

    def prune(self) -> None:
        """Drop the operations whose results nothing reads (a model output counts as read) and the
        operands no remaining operation, input or output names; operand indices are renumbered.  The
        lowering leaves such operations behind when a later rule reads an earlier operand directly
        (a RESHAPE of a RESHAPE reads the first one's source)."""
        read = set(self.outputs)
        kept = []
        for code, ins, outs in reversed(self.operations):  # (topological order: readers come later)
            if any(o in read for o in outs):
                kept.append((code, ins, outs))
                read.update(ins)
        kept.reverse()
        used = set(self.inputs) | set(self.outputs) | {i for _, ins, outs in kept for i in ins + outs}
        remap = {}
        for i in range(len(self.operands)):
            if i in used:
                remap[i] = len(remap)
        self.operands = [o for i, o in enumerate(self.operands) if i in used]
        self.operations = [(c, [remap[i] for i in ins], [remap[o] for o in outs]) for c, ins, outs in kept]
        self.inputs = [remap[i] for i in self.inputs]
        self.outputs = [remap[o] for o in self.outputs]

    # --- serialisation ------------------------------------------------------
    def to_bytes(self) -> bytes:
        data = bytearray()
        ops = []
        for o in self.operands:
            rec = {"t": o.type, "d": list(o.dims)}
            if o.scale:
                rec["s"] = o.scale
            if o.zero_point:
                rec["z"] = o.zero_point
            if o.channel_scales is not None:
                rec["cd"], rec["cs"] = int(o.channel_dim), o.channel_scales
            if o.name:
                rec["n"] = o.name
            if isinstance(o.value, np.ndarray):
                pad = (-len(data)) % 16
                data += b"\0" * pad
                raw = o.value.tobytes()
                rec["v"] = [len(data), len(raw)]
                data += raw
            elif o.value is not None:
                rec["c"] = o.value
            ops.append(rec)
        header = {
            "version": VERSION,
            "min_api_level": self.min_api_level,
            "operands": ops,
            "operations": [[c, i, o] for c, i, o in self.operations],
            "inputs": self.inputs,
            "outputs": self.outputs,
            "input_map": self.input_map,
            "input_perm": self.input_perm,
            "output_perm": self.output_perm,
            "input_names": self.input_names,
            "output_names": self.output_names,
        }
        return _program.pack(MAGIC, VERSION, header, bytes(data))

    @classmethod
    def from_bytes(cls, blob, artifact=None) -> "NNModel":
        """The model of a blob; constants that refer to artifact tensors (weights shared with the CPU
        version, ``targets.nnapi.share``) are read from ``artifact`` (copied where transposed)."""
        from minirt.providers.nnapi import decode_blob

        d = decode_blob(blob, artifact)
        m = cls()
        for o in d["operands"]:
            m.operands.append(Operand(o["type"], o["dims"], o["scale"], o["zero_point"], o["value"],
                                      o.get("channel_dim"), o.get("channel_scales"), o.get("name", "")))
        m.operations = [(c, list(i), list(o)) for c, i, o in d["operations"]]
        for k in ("inputs", "outputs", "input_map", "input_perm", "output_perm", "min_api_level", "input_names",
                  "output_names"):
            setattr(m, k, d[k])
        return m

    def summary(self) -> dict:
        counts: dict = {}
        for code, _, _ in self.operations:
            name = C.OPERATION_NAMES.get(code, str(code))
            counts[name] = counts.get(name, 0) + 1
        return {"operands": len(self.operands), "operations": len(self.operations), "ops": counts,
                "min_api_level": self.min_api_level}
