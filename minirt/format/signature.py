"""The signature section (kind 8): what is signed, how it is encoded and checked.

Shared by the writer (``builder/writer.py`` signs) and the reader
(``minirt/format/reader.py`` verifies when a session passes ``verify_key``).
The layout is specified in ``docs/format.md`` ("Signature"):

* payload (100 bytes): ``u32 algorithm`` (1 = Ed25519), 32-byte public key,
  64-byte signature;
* signed message: ``SIGNATURE_TAGS[format_version]`` (``b"MINIRT-SIG-V1"``)
  followed by the 32-byte SHA-256 digest of, for every *other* section in
  section-table order, ``u32 kind``, ``u32 flags``, ``u64 length`` and the
  ``length`` payload bytes.
"""
from __future__ import annotations

import hashlib
from typing import Iterable

from minirt.errors import SignatureError
from minirt.format import ed25519
from minirt.format import schema as S


def fingerprint(public_key: bytes) -> str:
    """Short, stable name of a public key: ``ed25519:`` + first 16 hex digits of its SHA-256."""
    return "ed25519:" + hashlib.sha256(bytes(public_key)).hexdigest()[:16]


def signed_message(sections: Iterable[tuple[int, int, bytes | memoryview]], format_version: int = S.FORMAT_VERSION) -> bytes:
    """The message a signature covers, from ``(kind, flags, payload)`` of every section but the signature."""
    tag = S.SIGNATURE_TAGS.get(format_version)
    if tag is None:
        raise SignatureError(f"no signature scheme is defined for .mrt format version {format_version}")
    h = hashlib.sha256()
    for kind, flags, payload in sections:
        if kind == S.SECTION_SIGNATURE:
            continue
        h.update(S.SIGNATURE_DIGEST_ENTRY.pack(kind, flags, len(payload)))
        h.update(payload)
    return tag + h.digest()


def signature_payload(seed: bytes, sections: Iterable[tuple[int, int, bytes]], format_version: int = S.FORMAT_VERSION) -> bytes:
    """The signature section's payload for ``sections`` under private key ``seed``."""
    message = signed_message(sections, format_version)
    return S.SIGNATURE_PAYLOAD.pack(S.SIG_ALG_ED25519, ed25519.public_key(seed), sign(seed, message))


def sign(seed: bytes, message: bytes) -> bytes:
    """Ed25519's signature of ``message``: by the ``cryptography`` package when it is installed (a maintained,
    constant-time implementation: the builder extra brings it), else by minirt's own pure-Python code, which is
    not constant-time.  Ed25519 signatures are deterministic: both give the same bytes."""
    try:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    except ImportError:
        return ed25519.sign(seed, message)
    return Ed25519PrivateKey.from_private_bytes(bytes(seed)).sign(message)


def decode_payload(payload: bytes | memoryview) -> tuple[int, bytes, bytes] | None:
    """``(algorithm, public key, signature)``, or None if the payload is not 100 bytes."""
    if len(payload) != S.SIGNATURE_PAYLOAD.size:
        return None
    alg, pub, sig = S.SIGNATURE_PAYLOAD.unpack(bytes(payload))
    return alg, pub, sig


def verify_sections(
    expected_keys: bytes | list[bytes],
    sections: list[tuple[int, int, memoryview]],
    format_version: int,
) -> None:
    """Raise :class:`SignatureError` unless ``sections`` carry a valid signature by one of ``expected_keys``
    (one key or a list: the trusted keys).

    ``sections`` are ``(kind, flags, payload)`` in section-table order,
    including the signature section itself.
    """
    trusted = [expected_keys] if isinstance(expected_keys, (bytes, bytearray)) else list(expected_keys)
    want = ", ".join(fingerprint(k) for k in trusted)
    one = "key" if len(trusted) == 1 else "one of the keys"
    sigs = [p for k, _, p in sections if k == S.SECTION_SIGNATURE]
    if not sigs:
        raise SignatureError(f"artifact is not signed, but the session requires a signature by {one} {want}")
    if len(sigs) > 1:
        raise SignatureError("artifact has more than one signature section")
    decoded = decode_payload(sigs[0])
    if decoded is None:
        raise SignatureError(
            f"malformed signature section: {len(sigs[0])} bytes, expected {S.SIGNATURE_PAYLOAD.size}"
        )
    alg, pub, sig = decoded
    if alg != S.SIG_ALG_ED25519:
        raise SignatureError(f"unsupported signature algorithm {alg} (this runtime verifies 1 = Ed25519)")
    if pub not in trusted:
        raise SignatureError(
            f"artifact is signed by another key: signed by {fingerprint(pub)}, but the session requires {want}"
        )
    if not ed25519.verify(pub, signed_message(sections, format_version), sig):
        raise SignatureError(
            f"signature does not match the artifact's contents (key {fingerprint(pub)}): the file was modified "
            f"after signing"
        )
