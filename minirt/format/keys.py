"""Ed25519 key files for signing artifacts (``minirt keygen``, ``minirt build --sign``).

File formats (both are text, one line, so they survive copy/paste and email):

* ``NAME.key`` - the **private** key: the 32-byte Ed25519 seed as 64 lowercase
  hex digits and a newline.  Written with mode 0600.  Readers also accept a
  file holding exactly the 32 raw bytes.
* ``NAME.pub`` - the **public** key: 32 bytes as 64 lowercase hex digits and a
  newline.  This is what goes onto devices (``Session(..., verify_key=...)``).

Only the public key is needed to verify, so a device that is compromised
cannot sign artifacts.

It lives in ``minirt/format`` beside the signature section because the reader
loads ``verify_key`` with it: the runtime's format package imports nothing
from the command-line tools (``minirt/tools``).
"""
from __future__ import annotations

import os
import string
from typing import Any

from minirt.errors import InvalidArgument
from minirt.format import ed25519
from minirt.format.signature import fingerprint

__all__ = ["fingerprint", "generate", "load_public_key", "load_signing_key", "public_key_of", "write_keypair"]

_HEX = frozenset(string.hexdigits)
_MAX_KEY_FILE = 4096  # a key file is ~65 bytes; refuse to read anything big


def _parse_key_text(data: bytes, what: str, where: str) -> bytes:
    if len(data) == 32:
        return data
    text = data.strip()
    try:
        decoded = text.decode("ascii")
    except UnicodeDecodeError:
        decoded = ""
    if len(decoded) == 64 and set(decoded) <= _HEX:
        return bytes.fromhex(decoded)
    raise InvalidArgument(
        f"{where}: not an Ed25519 {what}: expected 64 hex digits (or 32 raw bytes), got {len(data)} bytes"
    )


def _read_key_file(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_KEY_FILE + 1)
    except FileNotFoundError:
        raise InvalidArgument(f"{path}: no such {what} file") from None
    except OSError as exc:
        raise InvalidArgument(f"{path}: cannot read {what} file: {exc.strerror or exc}") from None
    if len(data) > _MAX_KEY_FILE:
        raise InvalidArgument(f"{path}: too large to be an Ed25519 {what} file")
    return _parse_key_text(data, what, path)


def _load(source: Any, what: str) -> bytes:
    if isinstance(source, (bytes, bytearray, memoryview)):
        raw = bytes(source)
        if len(raw) == 32:
            return raw
        return _parse_key_text(raw, what, f"{what} bytes")  # 64 hex digits as bytes
    if isinstance(source, str):
        text = source.strip()
        if len(text) == 64 and set(text) <= _HEX and not os.path.exists(source):
            return bytes.fromhex(text)
        return _read_key_file(source, what)
    if isinstance(source, os.PathLike):
        return _read_key_file(os.fspath(source), what)
    raise InvalidArgument(
        f"{what} must be 32 bytes, a 64-digit hex string or a path to a key file, got {type(source).__name__}"
    )


def load_public_key(source: Any) -> bytes:
    """A 32-byte public key from raw bytes, a hex string, or a path to a ``.pub`` file."""
    key = _load(source, "public key")
    try:
        ed25519.decode_point(key)
    except ed25519.BadEncoding as exc:
        raise InvalidArgument(f"not a valid Ed25519 public key ({exc})") from None
    return key


def load_trusted_keys(source: Any) -> list[bytes]:
    """The public keys a session accepts signatures from: ``source`` one key (as :func:`load_public_key`
    takes it), a folder whose ``*.pub`` files are the keys, or a list / tuple of either."""
    if isinstance(source, (list, tuple)):
        if not source:
            raise InvalidArgument("the list of trusted keys is empty")
        return [k for item in source for k in load_trusted_keys(item)]
    if isinstance(source, (str, os.PathLike)) and os.path.isdir(source):
        folder = os.fspath(source)
        names = sorted(n for n in os.listdir(folder) if n.endswith(".pub"))
        if not names:
            raise InvalidArgument(f"{folder}: a folder of trusted keys holds no .pub file")
        return [load_public_key(os.path.join(folder, n)) for n in names]
    return [load_public_key(source)]


def load_signing_key(source: Any) -> bytes:
    """A 32-byte private key (seed) from raw bytes, a hex string, or a path to a ``.key`` file."""
    return _load(source, "private key")


def generate() -> bytes:
    """A new random private key (seed) from the operating system's CSPRNG."""
    return os.urandom(ed25519.SEED_BYTES)


def public_key_of(seed: bytes) -> bytes:
    return ed25519.public_key(seed)


def write_keypair(prefix: str | os.PathLike, *, overwrite: bool = False) -> tuple[str, str, bytes]:
    """Create ``PREFIX.key`` (mode 0600) and ``PREFIX.pub``; returns (key path, pub path, public key).

    Refuses to replace an existing file unless ``overwrite``: losing a signing
    key by accident is worse than an error.
    """
    prefix = os.fspath(prefix)
    key_path, pub_path = prefix + ".key", prefix + ".pub"
    if not overwrite:
        for path in (key_path, pub_path):
            if os.path.exists(path):
                raise InvalidArgument(f"{path} already exists; remove it or choose another prefix")
    seed = generate()
    pub = public_key_of(seed)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_BINARY", 0)
    if not overwrite:
        flags |= os.O_EXCL
    fd = os.open(key_path, flags, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(seed.hex() + "\n")
    if hasattr(os, "fchmod"):
        os.chmod(key_path, 0o600)  # O_CREAT's mode does not apply to an existing file
    with open(pub_path, "w") as f:
        f.write(pub.hex() + "\n")
    return key_path, pub_path, pub
