"""Ed25519 signatures (RFC 8032, section 5.1) in pure Python.

The runtime verifies artifact signatures with :func:`verify`; the builder
signs with :func:`sign`.  Only ``hashlib`` (SHA-512) and Python integers are
used, so verification adds no dependency to the runtime.

Written from the RFC's prose and formulas:

* field: integers modulo ``P = 2**255 - 19``; curve ``-x**2 + y**2 = 1 + D x**2 y**2``
  with ``D = -121665/121666``; group order ``L = 2**252 + 27742317777372353535851937790883648493``;
  base point ``B``: the point with ``y = 4/5`` and even ``x``;
* points in extended twisted Edwards coordinates ``(X, Y, Z, T)`` with
  ``x = X/Z``, ``y = Y/Z``, ``x*y = T/Z`` (no inversion until encoding);
* scalar multiplication with a 4-bit fixed window; verification computes
  ``[S]B - [k]A`` with one shared chain of doublings (Straus), multiplies the
  difference with ``R`` by the cofactor 8 and checks for the neutral element
  (the cofactored equation of RFC 8032 5.1.7).

Security notes.  Verification handles public data only, so variable-time
arithmetic is fine there.  :func:`sign` is *not* constant-time (Python
integers never are): it is meant for an offline build machine, not for a
service that signs attacker-chosen messages while an attacker measures it.
"""
from __future__ import annotations

import hashlib

P = 2**255 - 19
L = 2**252 + 27742317777372353535851937790883648493
D = (-121665 * pow(121666, P - 2, P)) % P
D2 = (2 * D) % P
SQRT_M1 = pow(2, (P - 1) // 4, P)  # a square root of -1 modulo P

PUBLIC_KEY_BYTES = 32
SEED_BYTES = 32
SIGNATURE_BYTES = 64

_IDENTITY = (0, 1, 1, 0)


class BadEncoding(ValueError):
    """A 32-byte string that is not the encoding of a curve point."""


# --- point arithmetic (extended coordinates, a = -1) --------------------------


def _add(p, q):
    x1, y1, z1, t1 = p
    x2, y2, z2, t2 = q
    a = (y1 - x1) * (y2 - x2) % P
    b = (y1 + x1) * (y2 + x2) % P
    c = t1 * D2 % P * t2 % P
    d = 2 * z1 * z2 % P
    e, f, g, h = b - a, d - c, d + c, b + a
    return (e * f % P, g * h % P, f * g % P, e * h % P)


def _double(p):
    x1, y1, z1, _ = p
    a = x1 * x1 % P
    b = y1 * y1 % P
    c = 2 * z1 * z1 % P
    e = ((x1 + y1) * (x1 + y1) - a - b) % P
    g = b - a  # a*A + B with a = -1
    f = g - c
    h = -a - b
    return (e * f % P, g * h % P, f * g % P, e * h % P)


def _neg(p):
    x, y, z, t = p
    return (-x % P, y, z, -t % P)


def _is_identity(p) -> bool:
    x, y, z, _ = p
    return x % P == 0 and (y - z) % P == 0


def _window_table(p) -> list:
    """[0*p, 1*p, ..., 15*p]."""
    table = [_IDENTITY, p]
    for _ in range(14):
        table.append(_add(table[-1], p))
    return table


def _digits(k: int) -> list[int]:
    """4-bit digits of 0 <= k < 2**256, most significant first (64 digits)."""
    return [(k >> s) & 15 for s in range(252, -4, -4)]


def _mul(k: int, table: list):
    """k * p, given ``table = _window_table(p)``."""
    q = _IDENTITY
    for digit in _digits(k):
        q = _double(_double(_double(_double(q))))
        if digit:
            q = _add(q, table[digit])
    return q


def _double_mul(k1: int, t1: list, k2: int, t2: list):
    """k1 * p1 + k2 * p2 with one shared chain of doublings."""
    q = _IDENTITY
    for d1, d2 in zip(_digits(k1), _digits(k2)):
        q = _double(_double(_double(_double(q))))
        if d1:
            q = _add(q, t1[d1])
        if d2:
            q = _add(q, t2[d2])
    return q


# --- encoding (RFC 8032 5.1.2 and 5.1.3) -----------------------------------------


def _recover_x(y: int, sign: int) -> int:
    if y >= P:
        raise BadEncoding("y coordinate is not below p")
    u = (y * y - 1) % P
    v = (D * y * y + 1) % P
    # Candidate root x = u v^3 (u v^7)^((p-5)/8).
    v3 = v * v % P * v % P
    x = u * v3 % P * pow(u * v3 % P * v3 % P * v % P, (P - 5) // 8, P) % P
    vx2 = v * x % P * x % P
    if vx2 == u:
        pass
    elif vx2 == (-u) % P:
        x = x * SQRT_M1 % P
    else:
        raise BadEncoding("no square root: not a point on the curve")
    if x == 0 and sign:
        raise BadEncoding("x = 0 with the sign bit set")
    if x & 1 != sign:
        x = P - x
    return x


def decode_point(data: bytes):
    if len(data) != 32:
        raise BadEncoding(f"a point encoding is 32 bytes, got {len(data)}")
    n = int.from_bytes(data, "little")
    sign = n >> 255
    y = n & ((1 << 255) - 1)
    x = _recover_x(y, sign)
    return (x, y, 1, x * y % P)


def encode_point(p) -> bytes:
    x, y, z, _ = p
    zi = pow(z, P - 2, P)
    x, y = x * zi % P, y * zi % P
    return (y | ((x & 1) << 255)).to_bytes(32, "little")


_B = decode_point((4 * pow(5, P - 2, P) % P).to_bytes(32, "little"))
_B_TABLE = _window_table(_B)


def _sha512_int(*parts: bytes) -> int:
    h = hashlib.sha512()
    for part in parts:
        h.update(part)
    return int.from_bytes(h.digest(), "little")


# --- keys, signing, verifying (RFC 8032 5.1.5 - 5.1.7) ---------------------------


def _expand(seed: bytes) -> tuple[int, bytes]:
    if len(seed) != SEED_BYTES:
        raise ValueError(f"an Ed25519 private key (seed) is {SEED_BYTES} bytes, got {len(seed)}")
    h = hashlib.sha512(seed).digest()
    s = int.from_bytes(h[:32], "little")
    s &= (1 << 254) - 8  # clear the 3 low bits and bit 255 (and 254, set just below)
    s |= 1 << 254
    return s, h[32:]


def public_key(seed: bytes) -> bytes:
    """The 32-byte public key of a 32-byte private key (seed)."""
    s, _ = _expand(bytes(seed))
    return encode_point(_mul(s, _B_TABLE))


def sign(seed: bytes, message: bytes) -> bytes:
    """The 64-byte Ed25519 signature of ``message`` under private key ``seed``."""
    seed, message = bytes(seed), bytes(message)
    s, prefix = _expand(seed)
    a_enc = encode_point(_mul(s, _B_TABLE))
    r = _sha512_int(prefix, message) % L
    r_enc = encode_point(_mul(r, _B_TABLE))
    k = _sha512_int(r_enc, a_enc, message) % L
    return r_enc + ((r + k * s) % L).to_bytes(32, "little")


def verify(public: bytes, message: bytes, signature: bytes) -> bool:
    """True if ``signature`` is a valid signature of ``message`` by ``public``.

    Never raises for malformed keys or signatures: they simply do not verify.
    """
    public, signature = bytes(public), bytes(signature)
    if len(public) != PUBLIC_KEY_BYTES or len(signature) != SIGNATURE_BYTES:
        return False
    try:
        a = decode_point(public)
        r = decode_point(signature[:32])
    except BadEncoding:
        return False
    s = int.from_bytes(signature[32:], "little")
    if s >= L:  # RFC 8032 5.1.7: reject non-canonical S (malleability)
        return False
    k = _sha512_int(signature[:32], public, bytes(message)) % L
    # [S]B - [k]A - R must be a small-order point: check 8 * it is neutral.
    q = _double_mul(s, _B_TABLE, k, _window_table(_neg(a)))
    q = _add(q, _neg(r))
    q = _double(_double(_double(q)))
    return _is_identity(q)
