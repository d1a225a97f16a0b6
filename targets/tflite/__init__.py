"""TFLite back end of the builder: the NNAPI lowering, translated to a TFLite flatbuffer.

The "tflite" provider runs a partition through whatever TFLite interpreter
the device has (tflite-runtime on a Raspberry Pi, ai-edge-litert, or
TensorFlow), so it gets XNNPACK's kernels.  Its program is built in two
steps: the partition is lowered to an NNAPI model description (the NNAPI
lowering at the newest API level, ``targets.nnapi``), which
:func:`targets.tflite.translate.to_tflite` turns into TFLite operators one for
one.  The same translation checks the NNAPI lowering in the tests.

Blob: ``b"MRTTFLIT"``, u32 version (1), u32 header length, a JSON header
(``input_map``, ``input_perm``, ``output_perm``), zero padding to 16 bytes,
then the ``.tflite`` flatbuffer (docs/nnapi.md).
"""
from __future__ import annotations

from minirt.providers import _program
from minirt.targets.nnapi.lower import Unsupported, lower_nodes, node_support
from minirt.targets.nnapi.rules import RULES
from minirt.targets.providers import LoweringError
from minirt.targets.rules import RuleSpec
from minirt.targets.tflite.translate import TranslationError, to_tflite

MAGIC = b"MRTTFLIT"
# the newest NNAPI level: every operation this lowering knows, all of which translate
LEVEL = 34


def tflite_blob(model) -> bytes:
    """Wrap NNModel ``model``'s TFLite translation with the layout header."""
    header = {"input_map": model.input_map, "input_perm": model.input_perm, "output_perm": model.output_perm,
              "input_names": model.input_names, "output_names": model.output_names}
    return _program.pack(MAGIC, 1, header, to_tflite(model))


class TFLiteSpec(RuleSpec):
    """The NNAPI rules (ONNX -> NNAPI at :data:`LEVEL`), then the translation's rules (NNAPI -> TFLite)."""

    name = "tflite"
    rules = RULES
    cache_support = True  # a refusal costs a trial lowering
    # XNNPACK on the same CPU: a call costs little, but the NCHW<->NHWC copies still count
    dispatch_cost = 5.0e4

    def refusal(self, node, ctx) -> str | None:
        ok, why = node_support(node, ctx, LEVEL)
        # no API level applies to TFLite: drop NNAPI's "(target API 34)" from the reason
        return None if ok else why.replace(f" (target API {LEVEL})", "")

    def lower(self, partition, ctx) -> tuple[bytes, dict]:
        try:
            model = lower_nodes(partition.nodes, partition.inputs, partition.outputs, ctx, LEVEL)
            blob = tflite_blob(model)
        except (Unsupported, TranslationError) as exc:
            raise LoweringError(str(exc)) from None
        return blob, {"operations": len(model.operations), "num_threads": (getattr(ctx, "options", None) or {}).get(
            "tflite_threads", 0)}


__all__ = ["TFLiteSpec", "tflite_blob", "to_tflite"]
