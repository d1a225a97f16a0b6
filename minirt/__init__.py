"""minirt: the on-device runtime for .mrt artifacts.

Needs numpy and nothing else.  The API mirrors onnxruntime's::

    import minirt
    sess = minirt.InferenceSession("model.mrt")
    outputs = sess.run(None, {"input": x})
"""
from __future__ import annotations

__version__ = "0.1.0"

from minirt.errors import (
    ChecksumError,
    Error,
    Fail,
    FormatError,
    InvalidArgument,
    InvalidProtobuf,
    KernelError,
    NoSuchFile,
    ResourceError,
    UnsupportedGeometry,
    FileChanged,
    RunTerminated,
    RuntimeException,
    SignatureError,
    UnsupportedOperator,
    UnsupportedType,
    VersionError,
)
from minirt.session import InferenceSession, ModelMetadata, NodeArg, Session, get_available_providers

# onnxruntime's other public names (docs/ort_compat.md), loaded on first use: a script that only
# runs an artifact never imports minirt.ort_compat (tests/test_cold_start.py).
_ORT_COMPAT = frozenset({
    "SessionOptions", "RunOptions", "GraphOptimizationLevel", "ExecutionMode", "ExecutionOrder", "OrtValue",
    "IOBinding", "SessionIOBinding", "get_all_providers", "get_device", "get_version_string", "get_build_info",
    "set_default_logger_severity", "set_default_logger_verbosity", "set_seed", "disable_telemetry_events",
    "enable_telemetry_events",
})


def __getattr__(name: str):
    if name in _ORT_COMPAT:
        from minirt import ort_compat

        return getattr(ort_compat, name)
    if name == "capi":
        import minirt.capi.onnxruntime_pybind11_state  # noqa: F401 - the package as onnxruntime lays it out

        return globals()["capi"]
    raise AttributeError(f"module 'minirt' has no attribute {name!r}")


version = __version__  # onnxruntime.version

__all__ = [
    "ChecksumError",
    "Error",
    "Fail",
    "FormatError",
    "InferenceSession",
    "InvalidArgument",
    "InvalidProtobuf",
    "KernelError",
    "ModelMetadata",
    "NoSuchFile",
    "NodeArg",
    "ResourceError",
    "UnsupportedGeometry",
    "FileChanged",
    "RunTerminated",
    "RuntimeException",
    "Session",
    "SignatureError",
    "UnsupportedOperator",
    "UnsupportedType",
    "VersionError",
    "__version__",
    "get_available_providers",
    *sorted(_ORT_COMPAT),
]
