"""The framing of a provider program blob, shared by the NNAPI and TFLite programs.

Layout: 8-byte magic, u32 version, u32 length of a JSON header, the header, zero
padding to a multiple of 16 bytes, then the payload (NNAPI: operand data; TFLite:
the flatbuffer), so the payload starts aligned wherever the blob itself is aligned.
Written by the builder (``targets/``), read by the runtime providers.
"""
from __future__ import annotations

import json
import struct


def pack(magic: bytes, version: int, header: dict, payload: bytes) -> bytes:
    """The blob holding ``header`` (JSON-serialisable) and ``payload`` behind ``magic`` / ``version``."""
    hj = json.dumps(header, separators=(",", ":")).encode()
    head = magic + struct.pack("<II", version, len(hj)) + hj
    head += b"\0" * ((-len(head)) % 16)
    return bytes(head) + bytes(payload)


def unpack(blob, magic: bytes, version: int, kind: str, error: type) -> tuple[dict, memoryview, int]:
    """(header, the blob as bytes, payload offset); raises ``error`` naming ``kind`` on a foreign or newer blob."""
    mv = memoryview(blob).cast("B")
    if bytes(mv[:8]) != magic:
        raise error(f"not a {kind} program: bad magic (expected {magic!r})")
    found, hlen = struct.unpack_from("<II", mv, 8)
    if found != version:
        raise error(f"{kind} program version {found} is newer than this runtime reads ({version})")
    header = json.loads(bytes(mv[16:16 + hlen]))
    return header, mv, 16 + hlen + ((-(16 + hlen)) % 16)
