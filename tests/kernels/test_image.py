"""ImageDecoder against Pillow: images encoded by Pillow in every supported
format/mode, decoded by the minirt kernel, compared with Pillow's own decode."""
from __future__ import annotations

import io

import numpy as np
import pytest

from tests.kernels.test_elementwise import run_kernel

PIL = pytest.importorskip("PIL.Image")
RNG = np.random.default_rng(21)


def _encode(img, fmt, **kw) -> np.ndarray:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return np.frombuffer(buf.getvalue(), dtype=np.uint8).copy()


def _decode(stream, pixel_format="RGB"):
    (y,) = run_kernel("ImageDecoder", [stream], {"pixel_format": pixel_format}, opset=20)
    return y


def _photo(h=19, w=23):
    # smooth gradients plus noise: exercises every PNG filter type Pillow picks
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([xx * 255 // w, yy * 255 // h, (xx + yy) * 127 // (h + w)], axis=-1)
    return np.clip(base + RNG.integers(-20, 20, (h, w, 3)), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "LA", "P", "1", "I;16"])
def test_png_modes(mode):
    img = PIL.fromarray(_photo()).convert(mode) if mode != "I;16" else \
        PIL.fromarray(_photo()[..., 0].astype(np.uint16) * 257)
    y = _decode(_encode(img, "PNG"))
    expected = np.asarray(PIL.open(io.BytesIO(_encode(img, "PNG").tobytes())).convert("RGB")) if mode != "I;16" \
        else np.repeat((np.asarray(img) >> 8).astype(np.uint8)[..., None], 3, axis=2)
    np.testing.assert_array_equal(y, expected)


@pytest.mark.parametrize("fmt,mode", [("BMP", "RGB"), ("BMP", "P"), ("PPM", "RGB"), ("PPM", "L"),
                                      ("TIFF", "RGB"), ("TIFF", "L")])
def test_other_formats(fmt, mode):
    img = PIL.fromarray(_photo(8, 13)).convert(mode)
    y = _decode(_encode(img, fmt))
    np.testing.assert_array_equal(y, np.asarray(img.convert("RGB")))


def test_pixel_formats():
    rgb = _photo()
    stream = _encode(PIL.fromarray(rgb), "PNG")
    np.testing.assert_array_equal(_decode(stream, "BGR"), rgb[..., ::-1])
    gray = _decode(stream, "Grayscale")
    assert gray.shape == rgb.shape[:2] + (1,)
    expected = np.rint(rgb.astype(np.float64) @ [0.299, 0.587, 0.114])
    assert np.abs(gray[..., 0].astype(int) - expected).max() <= 1


def test_unknown_or_damaged_data_gives_empty():
    assert _decode(np.frombuffer(b"not an image", np.uint8)).shape == (0, 0, 0)
    png = _encode(PIL.fromarray(_photo()), "PNG")
    assert _decode(png[:60]).shape == (0, 0, 0)


def test_jpeg_is_rejected_clearly():
    with pytest.raises(ValueError, match="JPEG"):
        _decode(_encode(PIL.fromarray(_photo()), "JPEG"))
