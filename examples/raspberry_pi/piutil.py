"""Helpers shared by the Raspberry Pi example scripts (numpy only).

* Image files: PNG (8-bit, non-interlaced), PGM and PPM are decoded here with
  numpy and zlib, so a fresh Raspberry Pi OS with only ``python3-numpy`` can
  read them; Pillow or OpenCV are used for other formats when installed.
* Preprocessing for the digits model: grayscale, ink-is-bright, area-average
  to 8x8, values in [0, 1] (the model was trained on scikit-learn's digits,
  whose 0-16 intensities are the ink counts of 4x4 blocks, divided by 16).
* Board facts for the benchmark: model name, CPU temperature, clock, and the
  firmware's throttling flags where the Pi exposes them.
"""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DIGITS_ONNX = HERE.parent / "digits" / "digits_cnn.onnx"
DEFAULT_MODEL = HERE / "digits.mrt"
SAMPLES_DIR = HERE / "samples"
IMAGE_SUFFIXES = (".png", ".pgm", ".ppm", ".pnm", ".jpg", ".jpeg", ".bmp")


class ImageError(ValueError):
    """An image file that cannot be read."""


# --------------------------------------------------------------------------- reading images


def read_image(path: str | os.PathLike) -> np.ndarray:
    """The image at ``path`` as uint8, shape (H, W) for gray or (H, W, C) for colour.

    PNG/PGM/PPM use the built-in decoders; anything else needs Pillow or OpenCV.
    """
    path = Path(path)
    data = path.read_bytes()
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return decode_png(data)
    if data[:2] in (b"P5", b"P6", b"P2", b"P3"):
        return decode_pnm(data)
    img = _read_with_library(path)
    if img is None:
        raise ImageError(f"{path}: not a PNG/PGM/PPM file, and neither Pillow nor OpenCV is installed to read it")
    return img


def _read_with_library(path: Path) -> np.ndarray | None:
    try:
        from PIL import Image  # type: ignore[import-not-found]
    except ImportError:
        pass
    else:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB") if im.mode not in ("L", "RGB") else im)
    try:
        import cv2  # type: ignore[import-not-found]
    except ImportError:
        return None
    img = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if img is None:
        raise ImageError(f"{path}: OpenCV cannot read this file")
    return img[:, :, ::-1].copy()  # BGR -> RGB


def _pnm_tokens(data: bytes, count: int) -> tuple[list[int], int]:
    """The first ``count`` header integers of a PNM file and the offset after them."""
    values, pos = [], 2
    while len(values) < count:
        while pos < len(data) and data[pos : pos + 1].isspace():
            pos += 1
        if data[pos : pos + 1] == b"#":
            while pos < len(data) and data[pos : pos + 1] not in (b"\n", b"\r"):
                pos += 1
            continue
        start = pos
        while pos < len(data) and data[pos : pos + 1].isdigit():
            pos += 1
        if start == pos:
            raise ImageError("malformed PGM/PPM header")
        values.append(int(data[start:pos]))
    return values, pos


def decode_pnm(data: bytes) -> np.ndarray:
    """Binary or ASCII PGM (P5/P2) and PPM (P6/P3), maxval up to 65535, as uint8."""
    magic = data[:2]
    channels = 1 if magic in (b"P5", b"P2") else 3
    (width, height, maxval), pos = _pnm_tokens(data, 3)
    if not (0 < maxval < 65536) or width <= 0 or height <= 0:
        raise ImageError(f"bad PGM/PPM header: {width}x{height}, maxval {maxval}")
    n = width * height * channels
    if magic in (b"P5", b"P6"):
        pos += 1  # exactly one whitespace byte before the raster
        dtype = np.dtype(">u2") if maxval > 255 else np.dtype(np.uint8)
        raw = np.frombuffer(data, dtype=dtype, count=n, offset=pos) if len(data) >= pos + n * dtype.itemsize else None
        if raw is None:
            raise ImageError("PGM/PPM raster is truncated")
    else:
        raw = np.array(data[pos:].split()[:n], dtype=np.int64)
        if raw.size < n:
            raise ImageError("PGM/PPM raster is truncated")
    if maxval != 255:
        raw = np.rint(raw.astype(np.float64) * (255.0 / maxval))
    return raw.astype(np.uint8).reshape((height, width) if channels == 1 else (height, width, 3))


_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # colour type -> samples per pixel


def decode_png(data: bytes) -> np.ndarray:
    """8-bit, non-interlaced PNG (gray, gray+alpha, RGB, RGBA, palette) as uint8.

    Alpha is composited onto white; palette images are expanded to RGB.
    """
    pos, chunks, idat = 8, {}, []
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        if len(body) != length:
            raise ImageError("PNG chunk is truncated")
        if kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
        else:
            chunks.setdefault(kind, body)
        pos += 12 + length
    if b"IHDR" not in chunks:
        raise ImageError("PNG has no IHDR chunk")
    width, height, depth, ctype, _comp, _filt, interlace = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    if depth != 8 or ctype not in _PNG_CHANNELS:
        raise ImageError(f"PNG with bit depth {depth} / colour type {ctype}: only 8-bit images are supported")
    if interlace:
        raise ImageError("interlaced PNG is not supported")
    bpp = _PNG_CHANNELS[ctype]
    stride = width * bpp
    try:
        raw = zlib.decompress(b"".join(idat))
    except zlib.error as exc:
        raise ImageError(f"PNG image data is corrupt: {exc}") from None
    if len(raw) < height * (stride + 1):
        raise ImageError("PNG image data is truncated")
    rows = np.frombuffer(raw, dtype=np.uint8, count=height * (stride + 1)).reshape(height, stride + 1)
    out = np.zeros((height, stride), dtype=np.uint8)
    prev = np.zeros(stride, dtype=np.uint8)
    for y in range(height):
        ftype, line = rows[y, 0], rows[y, 1:]
        out[y] = _unfilter(ftype, line, prev, bpp)
        prev = out[y]
    img = out.reshape(height, width, bpp)
    if ctype == 3:
        if b"PLTE" not in chunks:
            raise ImageError("palette PNG without a PLTE chunk")
        palette = np.frombuffer(chunks[b"PLTE"], dtype=np.uint8).reshape(-1, 3)
        return palette[np.minimum(img[:, :, 0], len(palette) - 1)]
    if ctype in (4, 6):  # composite alpha onto white
        color, alpha = img[:, :, :-1].astype(np.float32), img[:, :, -1:].astype(np.float32) / 255.0
        img = np.rint(color * alpha + 255.0 * (1.0 - alpha)).astype(np.uint8)
    return img[:, :, 0] if img.shape[2] == 1 else img


def _unfilter(ftype: int, line: np.ndarray, prev: np.ndarray, bpp: int) -> np.ndarray:
    if ftype == 0:
        return line
    if ftype == 2:  # Up
        return line + prev  # uint8 arithmetic wraps modulo 256, as PNG wants
    if ftype == 1:  # Sub: a running sum per channel
        acc = np.cumsum(line.reshape(-1, bpp).astype(np.uint32), axis=0)
        return (acc & 0xFF).astype(np.uint8).reshape(-1)
    if ftype not in (3, 4):
        raise ImageError(f"PNG filter type {ftype} is invalid")
    cur = bytearray(line.tobytes())
    up = prev.tobytes()
    for i in range(len(cur)):
        a = cur[i - bpp] if i >= bpp else 0
        b = up[i]
        if ftype == 3:  # Average
            cur[i] = (cur[i] + ((a + b) >> 1)) & 0xFF
        else:  # Paeth
            c = up[i - bpp] if i >= bpp else 0
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            cur[i] = (cur[i] + pred) & 0xFF
    return np.frombuffer(bytes(cur), dtype=np.uint8)


def encode_png(img: np.ndarray) -> bytes:
    """uint8 (H, W), (H, W, 3) or (H, W, 4) as a PNG file (filter 0, zlib level 9)."""
    img = np.ascontiguousarray(img, dtype=np.uint8)
    ctype = {2: 0, 3: {1: 0, 3: 2, 4: 6}.get(img.shape[-1] if img.ndim == 3 else 0)}[img.ndim]
    if ctype is None:
        raise ValueError(f"cannot write an image of shape {img.shape} as PNG")
    if img.ndim == 3 and img.shape[2] == 1:
        img = img[:, :, 0]
    h, w = img.shape[:2]
    rows = img.reshape(h, -1)
    raw = np.concatenate([np.zeros((h, 1), dtype=np.uint8), rows], axis=1).tobytes()

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, ctype, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def encode_pnm(img: np.ndarray) -> bytes:
    """uint8 (H, W) as binary PGM or (H, W, 3) as binary PPM."""
    img = np.ascontiguousarray(img, dtype=np.uint8)
    magic = b"P5" if img.ndim == 2 else b"P6"
    return magic + f"\n{img.shape[1]} {img.shape[0]}\n255\n".encode() + img.tobytes()


def list_images(paths: list[str]) -> list[Path]:
    """Files named directly, plus the image files (by suffix) inside folders, sorted."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(f for f in p.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
        elif p.exists():
            out.append(p)
        else:
            raise FileNotFoundError(f"{p}: no such file or folder")
    return out


# --------------------------------------------------------------------------- preprocessing


def to_gray(img: np.ndarray) -> np.ndarray:
    """uint8 image -> float32 luma in [0, 1] (ITU-R BT.601 weights)."""
    x = np.asarray(img, dtype=np.float32) / np.float32(255.0)
    if x.ndim == 3:
        x = x[:, :, :3] @ np.array([0.299, 0.587, 0.114], dtype=np.float32) if x.shape[2] >= 3 else x[:, :, 0]
    return x


def area_resize(x: np.ndarray, size: int) -> np.ndarray:
    """(H, W) -> (size, size) by averaging the pixels that fall in each cell."""
    h, w = x.shape
    if h < size or w < size:  # too small: nearest-neighbour up first
        fy, fx = -(-size // h), -(-size // w)
        x = np.repeat(np.repeat(x, fy, axis=0), fx, axis=1)
        h, w = x.shape
    ry = (np.arange(size) * h) // size
    rx = (np.arange(size) * w) // size
    sums = np.add.reduceat(np.add.reduceat(x.astype(np.float64), ry, axis=0), rx, axis=1)
    counts = np.diff(np.append(ry, h))[:, None] * np.diff(np.append(rx, w))[None, :]
    return (sums / counts).astype(np.float32)


def center_square(x: np.ndarray) -> np.ndarray:
    """The largest centred square of an (H, W) image (camera frames are 4:3 or 16:9)."""
    h, w = x.shape
    s = min(h, w)
    top, left = (h - s) // 2, (w - s) // 2
    return x[top : top + s, left : left + s]


def crop_to_ink(x: np.ndarray, margin: float = 0.1) -> np.ndarray:
    """Square crop around the bright (ink) pixels, with a margin; the whole image if there is no ink."""
    mask = x > max(0.25, float(x.mean()) + 0.1)
    if not mask.any():
        return x
    ys, xs = np.nonzero(mask)
    cy, cx = (ys.min() + ys.max()) / 2.0, (xs.min() + xs.max()) / 2.0
    half = max(ys.max() - ys.min(), xs.max() - xs.min()) / 2.0 * (1.0 + margin) + 1.0
    h, w = x.shape
    pad = int(np.ceil(half)) + 1
    padded = np.pad(x, pad)
    top, left = int(round(cy - half)) + pad, int(round(cx - half)) + pad
    size = int(round(2 * half))
    return padded[max(top, 0) : max(top, 0) + size, max(left, 0) : max(left, 0) + size]


def preprocess_digit(img: np.ndarray, *, invert: str = "auto", crop: bool = False) -> np.ndarray:
    """Any uint8 image -> float32 [1, 1, 8, 8] in [0, 1], bright ink on dark, as the digits model expects.

    ``invert``: "auto" (invert when the border is brighter than the middle, i.e.
    dark ink on paper), "yes" or "no".  ``crop``: zoom onto the ink first
    (helps with camera frames where the digit is small).
    """
    x = to_gray(img)
    if invert == "yes" or (invert == "auto" and _border_is_bright(x)):
        x = 1.0 - x
    if crop:
        x = crop_to_ink(x)
    else:
        x = center_square(x)
    small = np.clip(area_resize(x, 8), 0.0, 1.0)
    return small.reshape(1, 1, 8, 8).astype(np.float32)


def _border_is_bright(x: np.ndarray) -> bool:
    border = np.concatenate([x[0], x[-1], x[:, 0], x[:, -1]])
    return float(np.median(border)) > 0.5


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


# --------------------------------------------------------------------------- the model


def pi_model() -> str | None:
    """The board's model string, e.g. "Raspberry Pi 4 Model B Rev 1.4" (None off a Pi/SBC)."""
    for p in ("/proc/device-tree/model", "/sys/firmware/devicetree/base/model"):
        try:
            return Path(p).read_bytes().rstrip(b"\x00\n").decode("utf-8", "replace")
        except OSError:
            continue
    return None


def guess_target(model: str | None = None) -> str:
    """The builder's --target for this board: rpi3/rpi4/rpi5, or generic."""
    model = pi_model() if model is None else model
    if model:
        for n in ("5", "4", "3"):
            if f"Raspberry Pi {n}" in model or f"Raspberry Pi Compute Module {n}" in model:
                return f"rpi{n}"
        if "Raspberry Pi 400" in model:
            return "rpi4"
        if "Raspberry Pi 500" in model:
            return "rpi5"
    return "generic"


def resolve_model(path: str | None, *, quiet: bool = False) -> Path:
    """The .mrt to run: ``path``, else ``digits.mrt`` beside the scripts.

    When that does not exist and the builder (``pip install minirt[builder]``)
    is importable, it is built from examples/digits/digits_cnn.onnx for this
    board's target; otherwise the error says how to build and copy it.
    """
    if path:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"{p}: no such model file")
        return p
    if DEFAULT_MODEL.is_file():
        return DEFAULT_MODEL
    try:
        from minirt.builder import build  # noqa: F401  (onnx + onnx-ir present?)
    except ImportError:
        raise FileNotFoundError(
            f"no model: pass --model, or build {DEFAULT_MODEL.name} on a desktop with\n"
            f"  minirt build examples/digits/digits_cnn.onnx -o digits.mrt --target {guess_target()}\n"
            f"and copy it to {DEFAULT_MODEL}"
        ) from None
    from minirt.builder import build

    target = guess_target()
    if not quiet:
        print(f"building {DEFAULT_MODEL.name} from {DIGITS_ONNX} for target {target} ...", file=sys.stderr)
    build(str(DIGITS_ONNX), str(DEFAULT_MODEL), target=target)
    return DEFAULT_MODEL


# --------------------------------------------------------------------------- board state


def cpu_temperature_c(root: str = "/") -> float | None:
    """SoC temperature in degrees C from the thermal zone (None where there is none)."""
    base = Path(root, "sys/class/thermal")
    zones = sorted(base.glob("thermal_zone*")) if base.is_dir() else []
    for z in zones:
        try:
            kind = (z / "type").read_text().strip()
            if kind in ("cpu-thermal", "soc-thermal", "cpu_thermal", "x86_pkg_temp") or len(zones) == 1:
                return int((z / "temp").read_text().strip()) / 1000.0
        except (OSError, ValueError):
            continue
    return None


def cpu_freq_mhz(root: str = "/") -> float | None:
    try:
        return int(Path(root, "sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq").read_text()) / 1000.0
    except (OSError, ValueError):
        return None


# Bits of `vcgencmd get_throttled` (Raspberry Pi firmware).
THROTTLE_BITS = {
    0: "under-voltage now",
    1: "ARM frequency capped now",
    2: "throttled now",
    3: "soft temperature limit now",
    16: "under-voltage has occurred",
    17: "ARM frequency capping has occurred",
    18: "throttling has occurred",
    19: "soft temperature limit has occurred",
}


def decode_throttled(value: int) -> list[str]:
    """The flags set in a get_throttled value, e.g. 0x50005 -> under-voltage now, throttled now, ..."""
    return [text for bit, text in THROTTLE_BITS.items() if value & (1 << bit)]


def throttled_state() -> int | None:
    """The firmware's throttled bits (vcgencmd, or the sysfs file newer kernels have); None if not a Pi."""
    try:
        return int(Path("/sys/devices/platform/soc/soc:firmware/get_throttled").read_text().strip(), 16)
    except (OSError, ValueError):
        pass
    vcgencmd = shutil.which("vcgencmd")
    if vcgencmd:
        try:
            out = subprocess.run([vcgencmd, "get_throttled"], capture_output=True, text=True, timeout=5).stdout
            return int(out.strip().split("=")[1], 16)
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            return None
    return None
