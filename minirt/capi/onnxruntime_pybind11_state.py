"""onnxruntime's exception classes under their onnxruntime names (docs/ort_compat.md).

Every class here is a :class:`minirt.Error`; those minirt raises are the bases of minirt's own
classes (minirt/errors.py), so ``except InvalidArgument`` catches ``minirt.InvalidArgument``,
``except InvalidProtobuf`` catches a ``minirt.FormatError``, ``except RuntimeException`` a
``minirt.KernelError``, ``except NotImplemented`` a ``minirt.UnsupportedOperator`` and
``except Fail`` a run stopped by ``RunOptions.terminate``.  The others exist so that a script's
``except`` clause naming them still compiles; minirt never raises them.
"""
from __future__ import annotations

from minirt.errors import (  # noqa: F401 - re-exports
    Error,
    Fail,
    InvalidArgument,
    InvalidProtobuf,
    NoSuchFile,
    NotImplementedByRuntime,
    RuntimeException,
)

NotImplemented = NotImplementedByRuntime  # noqa: A001 - onnxruntime's name, shadowing the builtin on purpose


class EPFail(Error):
    """onnxruntime's ``EPFail``; minirt falls back to the CPU instead (never raised)."""


class EngineError(Error):
    """onnxruntime's ``EngineError`` (never raised by minirt)."""


class InvalidGraph(Error):
    """onnxruntime's ``InvalidGraph`` (never raised: the builder validates graphs)."""


class NoModel(Error):
    """onnxruntime's ``NoModel`` (never raised by minirt)."""


class ModelLoaded(Error):
    """onnxruntime's ``ModelLoaded`` (never raised by minirt)."""


class NotFound(Error):
    """onnxruntime's ``NotFound`` (never raised by minirt)."""


class DeviceReset(Error):
    """onnxruntime's ``DeviceReset`` (never raised by minirt)."""


class ModelLoadCanceled(Error):
    """onnxruntime's ``ModelLoadCanceled`` (never raised by minirt)."""


class ModelRequiresCompilation(Error):
    """onnxruntime's ``ModelRequiresCompilation`` (never raised by minirt)."""


__all__ = [
    "DeviceReset", "EPFail", "EngineError", "Fail", "InvalidArgument", "InvalidGraph", "InvalidProtobuf",
    "ModelLoadCanceled", "ModelLoaded", "ModelRequiresCompilation", "NoModel", "NoSuchFile", "NotFound",
    "NotImplemented", "RuntimeException",
]
