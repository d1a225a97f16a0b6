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
    FormatError,
    InvalidArgument,
    KernelError,
    ResourceError,
    SignatureError,
    UnsupportedOperator,
    UnsupportedType,
    VersionError,
)
from minirt.session import InferenceSession, NodeArg, Session, get_available_providers

__all__ = [
    "ChecksumError",
    "Error",
    "FormatError",
    "InferenceSession",
    "InvalidArgument",
    "KernelError",
    "NodeArg",
    "ResourceError",
    "Session",
    "SignatureError",
    "UnsupportedOperator",
    "UnsupportedType",
    "VersionError",
    "__version__",
    "get_available_providers",
]
