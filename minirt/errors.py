"""The runtime's error hierarchy.

Every error the runtime raises on purpose derives from :class:`Error`, so a
caller can catch one class and know that nothing escaped from deep inside a
kernel unexplained.  Messages name what was wrong, where, and what was
expected.
"""
from __future__ import annotations


class Error(Exception):
    """Base class of every error raised by minirt."""


class InvalidArgument(Error, ValueError):
    """A caller passed something the session cannot take (feeds, names, options)."""


class FormatError(Error):
    """An artifact is not a valid .mrt file: truncated, corrupted or malformed."""


class ChecksumError(FormatError):
    """A section's stored checksum does not match its bytes."""


class VersionError(FormatError):
    """The artifact was written by a newer format version than this runtime reads."""


class SignatureError(FormatError):
    """A session asked for a signed artifact (``verify_key``) and the signature is
    missing, made by another key, or does not match the artifact's contents."""


class UnsupportedOperator(Error):
    """No kernel exists for an operator at the opset the model uses."""


class UnsupportedType(UnsupportedOperator):
    """The artifact uses an element type this installation cannot hold (e.g. bfloat16 without ml_dtypes)."""


class KernelError(Error):
    """A kernel failed while running a node; the message names node, op, inputs."""


class ResourceError(KernelError):
    """A kernel would allocate a tensor larger than the session's ``max_tensor_bytes``."""
