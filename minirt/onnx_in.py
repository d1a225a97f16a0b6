"""ONNX in: ``InferenceSession("model.onnx")`` builds the artifact in memory, through a cache.

Imported only when a session is given something that is an ONNX model, not a .mrt artifact
(:func:`looks_like_onnx`, which the session calls after the .mrt magic check failed): the runtime never imports onnx or the builder otherwise (tests/test_runtime_imports.py).

With the builder installed (``pip install 'minirt[builder]'``) the model is built with dynamic
shapes at the builder opt level the session options ask for, and the artifact is kept in a
per-user cache keyed by the sha256 of the model's bytes, the builder's version and the options: a
second start with the same model loads the cached .mrt and builds nothing.  Without the builder, a
:class:`minirt.InvalidArgument` says how to build the artifact.

Cache directory: ``$MINIRT_CACHE_DIR``, else ``$XDG_CACHE_HOME/minirt``, else ``~/.cache/minirt``;
entries are written atomically (temporary file + rename), so concurrent starts never read a
partial artifact.  A cache that cannot be written only costs the next start a build.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Any

from minirt.errors import InvalidArgument, InvalidProtobuf

# The first byte of a serialised ModelProto: the tag of one of its fields (field << 3 | wire type):
# ir_version (1, varint) comes first in every exporter's output; the others are accepted for models
# written field by field.  A .mrt artifact starts with its magic instead (minirt/format/schema.py).
_MODELPROTO_FIRST_TAGS = frozenset({0x08, 0x12, 0x1A, 0x22, 0x28, 0x32, 0x3A, 0x42, 0x72})


def _head(source: Any, n: int = 16) -> bytes:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source[:n])
    try:
        with open(os.fspath(source), "rb") as f:
            return f.read(n)
    except (OSError, TypeError):  # (not a readable path: nothing to recognise)
        return b""


def looks_like_onnx(source: Any) -> bool:
    """Whether ``source`` (path or bytes) is an ONNX model: not content that starts with the .mrt magic
    (a built artifact saved under an application's ``model.onnx`` is the artifact), and a ``.onnx``
    path or content that starts like a serialised ModelProto."""
    from minirt.format import schema as S

    head = _head(source)
    if head.startswith(S.MAGIC):
        return False
    if not isinstance(source, (bytes, bytearray, memoryview)):
        try:
            if os.fspath(source).lower().endswith(".onnx"):
                return True
        except TypeError:
            return False
    return bool(head) and head[0] in _MODELPROTO_FIRST_TAGS


def cache_dir() -> str:
    """Where built artifacts are kept (see the module docstring)."""
    explicit = os.environ.get("MINIRT_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "minirt")


def _builder_fingerprint(builder: Any) -> str:
    """The builder's version and the newest modification time of its sources: an edited (editable
    install) builder makes new cache keys rather than serving artifacts an older builder made."""
    import minirt

    root = os.path.dirname(os.path.abspath(builder.__file__))
    newest = 0
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                newest = max(newest, os.stat(os.path.join(folder, name)).st_mtime_ns)
    return f"{getattr(builder, '__version__', minirt.__version__)}:{newest}"


def _no_builder_error(source: Any, exc: Exception) -> InvalidArgument:
    name = "the model" if isinstance(source, (bytes, bytearray, memoryview)) else os.fspath(source)
    shown = name if name != "the model" else "model.onnx"
    stem = os.path.splitext(shown)[0]
    return InvalidArgument(
        f"{name} is an ONNX model, not a .mrt artifact: build it with `minirt build {shown} -o {stem}.mrt` "
        f"(pip install 'minirt[builder]'), or install the builder to load ONNX directly "
        f"(the builder is not importable here: {exc})"
    )


def _external_data_stamps(data: bytes, folder: str) -> list:
    """(location, size, mtime) of the external data files the model's tensors name (none: [])."""
    if b"location" not in data:
        return []
    import onnx
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    try:
        model = onnx.load_model_from_string(data)
    except Exception:  # (the build reports a model that does not parse)
        return []
    stamps = set()
    for tensor in _get_all_tensors(model):
        if uses_external_data(tensor):
            location = next((e.value for e in tensor.external_data if e.key == "location"), "")
            try:
                st = os.stat(os.path.join(folder, location))
                stamps.add((location, st.st_size, st.st_mtime_ns))
            except OSError:
                stamps.add((location, -1, -1))
    return sorted(stamps)


def build_cached(source: Any, opt_level: int) -> tuple[bytes | str, dict]:
    """The .mrt artifact for ONNX model ``source`` (path or bytes): a cache path or the built bytes,
    and what happened: ``{"onnx": source name, "cache": path or None, "cached": loaded from cache}``."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data, name = bytes(source), "<bytes>"
    else:
        name = os.fspath(source)
        try:
            with open(name, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            from minirt.errors import MissingFile

            raise MissingFile(f"{name}: no such file") from None
    try:
        from minirt import builder
    except ImportError as exc:
        raise _no_builder_error(source, exc) from None
    options = {"opt_level": opt_level, "input_shapes": None, "target": "generic"}
    key = hashlib.sha256(data)
    key.update(json.dumps([_builder_fingerprint(builder), options], sort_keys=True).encode())
    if name != "<bytes>":  # weights in external data files: they are part of the model (their size and time)
        stamps = _external_data_stamps(data, os.path.dirname(os.path.abspath(name)))
        if stamps:  # (none: the key of the same bytes given as bytes)
            key.update(json.dumps(stamps).encode())
    folder = cache_dir()
    path = os.path.join(folder, "onnx", key.hexdigest()[:40] + ".mrt")
    info = {"onnx": name, "cache": path, "cached": False}
    if os.path.isfile(path):
        info["cached"] = True
        return path, info
    try:
        # (from the path when there is one: the builder reads external data files relative to it)
        built = builder.build_bytes(data if name == "<bytes>" else name, opt_level=opt_level)
    except builder.BuildError as exc:
        if "protobuf" in str(exc).lower() or "parse" in str(exc).lower():
            raise InvalidProtobuf(f"{name}: not a valid ONNX model: {exc}") from exc
        raise
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(built)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as exc:  # a read-only home, a full disk: this start works, the next one builds again
        from minirt.providers import log_info

        log_info("minirt: cannot cache the artifact built from %s in %s: %s", name, folder, exc)
        info["cache"] = None
        return built, info
    return path, info
