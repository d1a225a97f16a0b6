"""The runtime's error hierarchy.

Every error the runtime raises on purpose derives from :class:`Error`, so a
caller can catch one class and know that nothing escaped from deep inside a
kernel unexplained.  Messages name what was wrong, where, and what was
expected.  The helpers at the end format the errors of a failed node (used by
the plan's run loops, minirt/plan.py).
"""
from __future__ import annotations


class Error(Exception):
    """Base class of every error raised by minirt."""


# --- onnxruntime's error classes (onnxruntime.capi.onnxruntime_pybind11_state), as bases ------------
# minirt's own classes derive from the onnxruntime class that names the same failure, so a script's
# ``except Fail`` / ``except RuntimeException`` / ``except InvalidProtobuf`` catches minirt's error
# once its import says ``minirt.capi.onnxruntime_pybind11_state`` (which re-exports these under
# onnxruntime's names; docs/ort_compat.md).  onnxruntime's classes derive from Exception only;
# here they also derive from Error, so ``except minirt.Error`` still catches everything.


class Fail(Error):
    """onnxruntime's ``Fail``: a generic failure (e.g. a run cancelled by ``RunOptions.terminate``)."""


class RuntimeException(Error):
    """onnxruntime's ``RuntimeException``: a failure while running the graph."""


class InvalidProtobuf(Error):
    """onnxruntime's ``InvalidProtobuf``: the model file cannot be decoded."""


class NoSuchFile(Error, FileNotFoundError):
    """onnxruntime's ``NoSuchFile``: the model path does not exist."""


class NotImplementedByRuntime(Error):
    """onnxruntime's ``NotImplemented`` (re-exported under that name by minirt.capi, not here: it
    would shadow the builtin constant): an operator or feature this runtime does not implement."""


class RunTerminated(Fail):
    """A run stopped because its ``RunOptions.terminate`` was set (from another thread)."""


class FileChanged(Fail):
    """The file of a session that maps it (``map_file``) was truncated or rewritten after it was loaded: the
    session refuses to run rather than read changed or missing weights (docs/runtime.md, D97)."""


class InvalidArgument(Error, ValueError):
    """A caller passed something the session cannot take (feeds, names, options)."""


class FormatError(InvalidProtobuf):
    """An artifact is not a valid .mrt file: truncated, corrupted or malformed."""


class MissingFile(FormatError, NoSuchFile):
    """The artifact's path does not exist (a FormatError as before, and onnxruntime's NoSuchFile)."""


class ChecksumError(FormatError):
    """A section's stored checksum does not match its bytes."""


class VersionError(FormatError):
    """The artifact was written by a newer format version than this runtime reads."""


class SignatureError(FormatError):
    """A session asked for a signed artifact (``verify_key``) and the signature is
    missing, made by another key, or does not match the artifact's contents."""


class UnsupportedOperator(NotImplementedByRuntime):
    """No kernel exists for an operator at the opset the model uses."""


class UnsupportedType(UnsupportedOperator):
    """The artifact uses an element type this installation cannot hold (e.g. bfloat16 without ml_dtypes)."""


class KernelError(RuntimeException):
    """A kernel failed while running a node; the message names node, op, inputs."""


class ResourceError(KernelError):
    """A kernel would allocate a tensor larger than the session's ``max_tensor_bytes``."""


class UnsupportedGeometry(KernelError):
    """A window operation (Conv, pooling, ...) whose sizes, strides, pads or dilations the native kernels
    cannot compute with (a value out of their range, or a derived size that would overflow)."""


# --- formatting the error of a failed node ------------------------------------------------------
# ``step`` is a step of a compiled plan (minirt.plan): its ``node`` (name, attributes), ``op``
# (domain, op_type, opset) and ``ins`` (input slots, -1 for an absent optional input).


def with_node(step, exc: KernelError) -> KernelError:
    """A kernel's own minirt error (e.g. ResourceError), prefixed with the node that raised it."""
    if step is None or str(exc).startswith("node "):
        return exc
    op = step.op
    return type(exc)(f"node {step.node.name!r} ({op.domain or 'ai.onnx'}::{op.op_type}): {exc}")


def kernel_error(step, env: list, exc: Exception) -> KernelError:
    """A KernelError for an exception ``exc`` a kernel raised: the node, its op and opset, the dtype and
    shape of each input (read from the run's slots ``env``) and its attribute names."""
    import numpy as np  # (here, not at import: this module needs nothing else, and this is the error path)

    if step is None:
        return KernelError(f"execution failed before the first node: {exc}")
    node, op = step.node, step.op
    described = []
    for v in step.ins:
        if v < 0:
            described.append("<absent>")
            continue
        x = env[v]
        if isinstance(x, np.ndarray):
            described.append(f"{x.dtype}{list(x.shape)}")
        else:
            described.append(type(x).__name__)
    return KernelError(
        f"node {node.name!r} ({op.domain or 'ai.onnx'}::{op.op_type}, opset {op.opset}) failed on inputs "
        f"({', '.join(described)}) with attributes {sorted(node.attributes)}: {type(exc).__name__}: {exc}"
    )
