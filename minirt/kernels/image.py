"""ImageDecoder (opset 20) for the formats decodable with the standard library:
PNG (zlib), BMP (uncompressed), PNM (PBM/PGM/PPM) and baseline uncompressed TIFF.

JPEG, JPEG 2000 and WebP need real codecs (entropy decoding, wavelets, VP8)
that minirt does not carry: those raise a clear error.  Data that looks like
a supported format but is damaged gives the empty (0, 0, 0) result the spec
asks for.  The output is uint8 (H, W, C): C = 3 for RGB/BGR, 1 for Grayscale.
"""
from __future__ import annotations

import struct
import zlib

import numpy as np

from minirt.kernels.registry import kernel


class _Corrupt(Exception):
    pass


# --------------------------------------------------------------------------- PNG


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def _png_unfilter(raw: bytes, height: int, stride: int, bpp: int) -> np.ndarray:
    """Undo the per-row PNG filters; returns (height, stride) uint8."""
    data = np.frombuffer(raw, dtype=np.uint8)
    if data.size < height * (stride + 1):
        raise _Corrupt("PNG: image data too short")
    rows = data[: height * (stride + 1)].reshape(height, stride + 1)
    out = np.zeros((height, stride), dtype=np.uint8)
    prev = np.zeros(stride, dtype=np.uint8)
    for y in range(height):
        ftype, line = int(rows[y, 0]), rows[y, 1:]
        if ftype == 0:  # None
            cur = line.copy()
        elif ftype == 1:  # Sub: running sum per byte lane (stride bpp), mod 256
            lanes = np.zeros(stride + (-stride) % bpp, dtype=np.int64)
            lanes[:stride] = line
            cur = (np.cumsum(lanes.reshape(-1, bpp), axis=0).reshape(-1)[:stride] % 256).astype(np.uint8)
        elif ftype == 2:  # Up
            cur = (line.astype(np.uint16) + prev).astype(np.uint8)
        elif ftype in (3, 4):  # Average / Paeth depend on the just-decoded left byte
            cur = np.zeros(stride, dtype=np.uint8)
            ln, up = line.tolist(), prev.tolist()
            vals = [0] * stride
            for i in range(stride):
                left = vals[i - bpp] if i >= bpp else 0
                if ftype == 3:
                    pred = (left + up[i]) >> 1
                else:
                    pred = _paeth(left, up[i], up[i - bpp] if i >= bpp else 0)
                vals[i] = (ln[i] + pred) & 0xFF
            cur[:] = vals
        else:
            raise _Corrupt(f"PNG: unknown filter type {ftype}")
        out[y] = cur
        prev = cur
    return out


def _decode_png(data: bytes) -> np.ndarray:
    pos, idat, palette, trns = 8, [], None, None
    width = height = depth = ctype = None
    interlace = 0
    while pos + 8 <= len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        tag = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        if len(body) != length:
            raise _Corrupt("PNG: truncated chunk")
        if tag == b"IHDR":
            width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
        elif tag == b"PLTE":
            palette = np.frombuffer(body, dtype=np.uint8).reshape(-1, 3)
        elif tag == b"tRNS":
            trns = body
        elif tag == b"IDAT":
            idat.append(body)
        elif tag == b"IEND":
            break
        pos += 12 + length
    if width is None or not idat:
        raise _Corrupt("PNG: missing IHDR or IDAT")
    if interlace:
        raise ValueError("ImageDecoder: interlaced (Adam7) PNG is not supported by minirt")
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}.get(ctype)
    if channels is None or depth not in (1, 2, 4, 8, 16):
        raise _Corrupt(f"PNG: bad colour type {ctype} / bit depth {depth}")
    try:
        raw = zlib.decompress(b"".join(idat))
    except zlib.error as exc:
        raise _Corrupt(f"PNG: {exc}") from None
    bits = depth * channels
    stride = (width * bits + 7) // 8
    rows = _png_unfilter(raw, height, stride, max(1, bits // 8))
    if depth == 16:
        img = rows.reshape(height, width, channels, 2)[..., 0]  # the high byte
    elif depth == 8:
        img = rows.reshape(height, width, channels)
    else:  # 1/2/4-bit grey or palette indices
        unpacked = np.unpackbits(rows, axis=1).reshape(height, -1, depth)
        weights = (1 << np.arange(depth - 1, -1, -1)).astype(np.uint8)
        img = (unpacked * weights).sum(axis=2).astype(np.uint8)[:, :width, None]
        if ctype == 0:  # scale grey levels to 0..255
            img = (img.astype(np.uint16) * 255 // ((1 << depth) - 1)).astype(np.uint8)
    if ctype == 3:
        if palette is None:
            raise _Corrupt("PNG: palette image without PLTE")
        return palette[np.minimum(img[..., 0], len(palette) - 1)]
    if ctype in (0, 4):
        return np.repeat(img[..., :1], 3, axis=2)
    return img[..., :3]


# --------------------------------------------------------------------------- BMP


def _decode_bmp(data: bytes) -> np.ndarray:
    if len(data) < 54:
        raise _Corrupt("BMP: header too short")
    (offset,) = struct.unpack("<I", data[10:14])
    (hsize,) = struct.unpack("<I", data[14:18])
    width, height, _, bpp, compression = struct.unpack("<iiHHI", data[18:34])
    if compression not in (0, 3) or bpp not in (8, 24, 32):
        raise ValueError(f"ImageDecoder: BMP with {bpp} bits/pixel, compression {compression} is not supported")
    top_down = height < 0
    h, w = abs(height), width
    row_bytes = (w * bpp // 8 + 3) & ~3
    if len(data) < offset + row_bytes * h:
        raise _Corrupt("BMP: pixel data truncated")
    rows = np.frombuffer(data, dtype=np.uint8, count=row_bytes * h, offset=offset).reshape(h, row_bytes)
    if bpp == 8:
        n_colors = struct.unpack("<I", data[46:50])[0] or 256
        pal = np.frombuffer(data, dtype=np.uint8, count=4 * n_colors, offset=14 + hsize).reshape(-1, 4)[:, 2::-1]
        img = pal[rows[:, :w]]
    else:
        img = rows[:, : w * (bpp // 8)].reshape(h, w, bpp // 8)[..., 2::-1]  # BGR(A) -> RGB
    return img if top_down else img[::-1]


# --------------------------------------------------------------------------- PNM


def _decode_pnm(data: bytes) -> np.ndarray:
    magic = data[:2]
    tokens, pos = [], 2
    need = 3 if magic in (b"P2", b"P3", b"P5", b"P6") else 2
    while len(tokens) < need:
        while pos < len(data) and data[pos:pos + 1].isspace():
            pos += 1
        if data[pos:pos + 1] == b"#":
            while pos < len(data) and data[pos:pos + 1] not in (b"\n", b"\r"):
                pos += 1
            continue
        start = pos
        while pos < len(data) and not data[pos:pos + 1].isspace():
            pos += 1
        if start == pos:
            raise _Corrupt("PNM: truncated header")
        tokens.append(int(data[start:pos]))
    w, h = tokens[0], tokens[1]
    maxval = tokens[2] if need == 3 else 1
    pos += 1  # the single whitespace before binary data
    channels = 3 if magic in (b"P3", b"P6") else 1
    if magic in (b"P5", b"P6"):
        dt = np.dtype(">u2") if maxval > 255 else np.dtype(np.uint8)
        count = w * h * channels
        if len(data) < pos + count * dt.itemsize:
            raise _Corrupt("PNM: pixel data truncated")
        img = np.frombuffer(data, dtype=dt, count=count, offset=pos).astype(np.int64).reshape(h, w, channels)
    elif magic in (b"P2", b"P3"):
        img = np.array(data[pos:].split()[: w * h * channels], dtype=np.int64).reshape(h, w, channels)
    elif magic == b"P4":
        row = (w + 7) // 8
        bits = np.unpackbits(np.frombuffer(data, np.uint8, count=row * h, offset=pos).reshape(h, row), axis=1)
        img = (1 - bits[:, :w, None].astype(np.int64))  # 1 is black
    elif magic == b"P1":
        digits = [c for c in data[pos:].decode("ascii") if c in "01"][: w * h]
        img = 1 - np.array(digits, dtype=np.int64).reshape(h, w, 1)
    else:
        raise _Corrupt("PNM: unknown magic")
    if maxval != 255:
        img = (img * 255 + maxval // 2) // maxval
    img = img.astype(np.uint8)
    return np.repeat(img, 3, axis=2) if channels == 1 else img


# --------------------------------------------------------------------------- TIFF


def _decode_tiff(data: bytes) -> np.ndarray:
    end = "<" if data[:2] == b"II" else ">"
    (ifd,) = struct.unpack(end + "I", data[4:8])
    (count,) = struct.unpack(end + "H", data[ifd:ifd + 2])
    sizes = {1: 1, 3: 2, 4: 4}
    tags = {}
    for i in range(count):
        e = ifd + 2 + 12 * i
        tag, typ, n = struct.unpack(end + "HHI", data[e:e + 8])
        size = sizes.get(typ)
        if size is None:
            continue
        fmt = {1: "B", 3: "H", 4: "I"}[typ]
        where = e + 8 if size * n <= 4 else struct.unpack(end + "I", data[e + 8:e + 12])[0]
        tags[tag] = list(struct.unpack(end + fmt * n, data[where:where + size * n]))
    w, h = tags[256][0], tags[257][0]
    if tags.get(259, [1])[0] != 1:
        raise ValueError("ImageDecoder: compressed TIFF is not supported by minirt (only uncompressed)")
    spp = tags.get(277, [1])[0]
    if set(tags.get(258, [8])) != {8} or tags.get(284, [1])[0] != 1:
        raise ValueError("ImageDecoder: only 8-bit, chunky (interleaved) TIFF is supported by minirt")
    strips = b"".join(data[o:o + c] for o, c in zip(tags[273], tags[279]))
    if len(strips) < w * h * spp:
        raise _Corrupt("TIFF: strip data truncated")
    img = np.frombuffer(strips, dtype=np.uint8, count=w * h * spp).reshape(h, w, spp)
    photometric = tags.get(262, [2])[0]
    if photometric in (0, 1):
        g = img[..., :1] if photometric == 1 else 255 - img[..., :1]
        return np.repeat(g, 3, axis=2)
    return img[..., :3]


# --------------------------------------------------------------------------- ImageDecoder


def _sniff(data: bytes):
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return _decode_png
    if data[:2] == b"BM":
        return _decode_bmp
    if data[:2] in (b"II", b"MM") and data[2:4] in (b"*\x00", b"\x00*"):
        return _decode_tiff
    if len(data) > 2 and data[:1] == b"P" and data[1:2] in b"123456" and data[2:3].isspace():
        return _decode_pnm
    if data[:2] == b"\xff\xd8":
        raise ValueError("ImageDecoder: JPEG decoding is not supported by minirt (no codec in numpy)")
    if data[:4] == b"\x00\x00\x00\x0c" or data[:4] == b"\xffO\xffQ":
        raise ValueError("ImageDecoder: JPEG 2000 decoding is not supported by minirt")
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        raise ValueError("ImageDecoder: WebP decoding is not supported by minirt")
    return None


@kernel("ImageDecoder", since=20)
def image_decoder(encoded_stream, /, *, pixel_format="RGB"):
    fmt = pixel_format.decode() if isinstance(pixel_format, bytes) else pixel_format
    if fmt not in ("RGB", "BGR", "Grayscale"):
        raise ValueError(f"ImageDecoder: pixel_format must be RGB, BGR or Grayscale, got {fmt!r}")
    data = np.asarray(encoded_stream, dtype=np.uint8).reshape(-1).tobytes()
    decode = _sniff(data)
    empty = np.zeros((0, 0, 0), dtype=np.uint8)
    if decode is None:
        return empty
    try:
        rgb = decode(data)
    except (_Corrupt, struct.error, IndexError, KeyError, ValueError) as exc:
        if isinstance(exc, ValueError) and str(exc).startswith("ImageDecoder:"):
            raise
        return empty
    rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
    if fmt == "BGR":
        return np.ascontiguousarray(rgb[..., ::-1])
    if fmt == "Grayscale":  # ITU-R BT.601 luma, rounded
        y = rgb.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
        return np.clip(np.rint(y), 0, 255).astype(np.uint8)[..., None]
    return rgb
