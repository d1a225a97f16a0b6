"""examples/raspberry_pi: the scripts run, read images without Pillow, and classify the samples.

Runs on the host (builds the digits artifact with the builder) and inside
the emulated Pi (``make test-arm64`` sets ``MINIRT_PI_DIGITS_MODEL`` to a
prebuilt artifact, and there is no Pillow, OpenCV or camera there).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "raspberry_pi"
sys.path.insert(0, str(EXAMPLES))

import piutil  # noqa: E402

HELDOUT = EXAMPLES.parent / "digits" / "heldout.npz"


@pytest.fixture(scope="module")
def digits_model(tmp_path_factory) -> Path:
    given = os.environ.get("MINIRT_PI_DIGITS_MODEL")
    if given:
        return Path(given)
    pytest.importorskip("onnx")
    from minirt.builder import build

    out = tmp_path_factory.mktemp("pi") / "digits.mrt"
    build(str(piutil.DIGITS_ONNX), str(out), target="rpi4")
    return out


def _run(script: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True,
                          timeout=600, env=env, cwd=str(EXAMPLES))
    if check:
        assert proc.returncode == 0, f"{script} {args}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


# --------------------------------------------------------------------------- scripts


@pytest.mark.parametrize("script", ["classify.py", "benchmark.py", "make_samples.py"])
def test_help(script):
    out = _run(script, "--help").stdout
    assert out.startswith("usage:") and "--" in out


def test_classify_the_samples_folder(digits_model):
    proc = _run("classify.py", "--model", str(digits_model), "--json", "--top", "3", str(piutil.SAMPLES_DIR))
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(rows) == 10
    for row in rows:
        want = int(Path(row["source"]).stem.split("_")[1])
        assert row["digit"] == want, row
        assert row["confidence"] > 0.9 and len(row["top"]) == 3 and row["ms"] > 0


def test_classify_text_output_and_single_file(digits_model):
    proc = _run("classify.py", "--model", str(digits_model), str(piutil.SAMPLES_DIR / "digit_3.png"))
    assert ": 3 (" in proc.stdout
    assert "mean inference" in proc.stderr


def test_classify_pgm_and_ppm_folder_matches_the_labels(tmp_path, digits_model):
    data = np.load(HELDOUT)
    images, labels = data["image"][:12], data["label"][:12]
    for i, img in enumerate(images):
        gray = np.rint(255 * (1 - np.kron(img.reshape(8, 8), np.ones((5, 5))))).astype(np.uint8)
        if i % 2:
            (tmp_path / f"{i:02d}.pgm").write_bytes(piutil.encode_pnm(gray))
        else:
            (tmp_path / f"{i:02d}.ppm").write_bytes(piutil.encode_pnm(np.stack([gray] * 3, axis=-1)))
    (tmp_path / "notes.txt").write_text("not an image")
    proc = _run("classify.py", "--model", str(digits_model), "--json", str(tmp_path))
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [Path(r["source"]).name for r in rows] == sorted(p.name for p in tmp_path.glob("*.p?m"))
    predicted = np.array([r["digit"] for r in rows])
    assert (predicted == labels).mean() >= 0.9


def test_camera_falls_back_to_a_still_image(digits_model):
    proc = _run("classify.py", "--model", str(digits_model), "--camera", "--camera-backend", "still",
                "--frames", "2", "--json")
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["digit"] for r in rows] == [7, 7]
    assert rows[0]["source"] == "still:digit_7.png#0"


def test_missing_camera_backend_is_an_error(digits_model):
    try:
        import picamera2  # noqa: F401
        pytest.skip("picamera2 is installed here")
    except ImportError:
        pass
    proc = _run("classify.py", "--model", str(digits_model), "--camera", "--camera-backend", "picamera2", check=False)
    assert proc.returncode == 2 and "no camera available" in proc.stderr


def test_missing_model_is_an_error(tmp_path):
    proc = _run("classify.py", "--model", str(tmp_path / "nope.mrt"), check=False)
    assert proc.returncode == 2 and "no such model file" in proc.stderr


def test_benchmark_json(digits_model):
    proc = _run("benchmark.py", "--model", str(digits_model), "--runs", "5", "--warmup", "1", "--batch", "3",
                "--compare-numpy", "--json")
    report = json.loads(proc.stdout)
    from minirt import native

    assert set(report["latency"]) == ({"native", "numpy"} if native.available else {"numpy"})
    for r in report["latency"].values():
        assert r["runs"] == 5 and 0 < r["min_ms"] <= r["median_ms"] <= r["p99_ms"]
    assert report["batch"] == 3 and report["numpy"] == np.__version__
    assert {"temperature_c", "throttled", "throttled_flags", "cpu_mhz"} <= set(report["before"])


def test_benchmark_text(digits_model):
    out = _run("benchmark.py", "--model", str(digits_model), "--runs", "3", "--warmup", "0").stdout
    for word in ("latency", "median", "temp", "throttling", "kernels"):
        assert word in out, out


# --------------------------------------------------------------------------- image decoding


def _png(raw_rows: bytes, w: int, h: int, ctype: int, extra: bytes = b"") -> bytes:
    import struct

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, ctype, 0, 0, 0)) + extra
            + chunk(b"IDAT", zlib.compress(raw_rows)) + chunk(b"IEND", b""))


def _filter_rows(img: np.ndarray, bpp: int) -> bytes:
    """Encode with every PNG filter type in turn (row y uses filter y % 5)."""
    h = img.shape[0]
    rows = img.reshape(h, -1).astype(np.int32)
    out = bytearray()
    prev = np.zeros(rows.shape[1], np.int32)
    for y in range(h):
        cur, f = rows[y], y % 5
        left = np.concatenate([np.zeros(bpp, np.int32), cur[:-bpp]])
        upleft = np.concatenate([np.zeros(bpp, np.int32), prev[:-bpp]])
        if f == 0:
            enc = cur
        elif f == 1:
            enc = cur - left
        elif f == 2:
            enc = cur - prev
        elif f == 3:
            enc = cur - (left + prev) // 2
        else:
            p = left + prev - upleft
            pa, pb, pc = np.abs(p - left), np.abs(p - prev), np.abs(p - upleft)
            pred = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, prev, upleft))
            enc = cur - pred
        out += bytes([f]) + (enc % 256).astype(np.uint8).tobytes()
        prev = cur
    return bytes(out)


@pytest.mark.parametrize("channels,ctype", [(1, 0), (3, 2), (4, 6), (2, 4)])
def test_png_decoder_all_filters(channels, ctype):
    rng = np.random.default_rng(channels)
    img = rng.integers(0, 256, size=(11, 7, channels), dtype=np.uint8)
    if channels in (2, 4):
        img[..., -1] = 255  # opaque: compositing onto white must not change colours
    got = piutil.decode_png(_png(_filter_rows(img, channels), 7, 11, ctype))
    want = img[..., :-1] if channels in (2, 4) else img
    np.testing.assert_array_equal(got, want[..., 0] if want.shape[-1] == 1 else want)


def test_png_alpha_and_palette():
    rgba = np.zeros((2, 2, 4), np.uint8)
    rgba[..., 3] = 0  # fully transparent -> white
    np.testing.assert_array_equal(piutil.decode_png(piutil.encode_png(rgba)), np.full((2, 2, 3), 255, np.uint8))
    palette = bytes([255, 0, 0, 0, 0, 255])
    import struct

    plte = struct.pack(">I", 6) + b"PLTE" + palette + struct.pack(">I", zlib.crc32(b"PLTE" + palette) & 0xFFFFFFFF)
    raw = b"\x00\x00\x01\x00\x01\x00"
    img = piutil.decode_png(_png(raw, 2, 2, 3, plte))
    assert img.shape == (2, 2, 3) and img[0, 0].tolist() == [255, 0, 0] and img[0, 1].tolist() == [0, 0, 255]


def test_png_roundtrip_and_pillow_agrees(tmp_path):
    rng = np.random.default_rng(1)
    img = (np.add.outer(np.arange(20), np.arange(30)) * 4 % 256).astype(np.uint8)
    np.testing.assert_array_equal(piutil.decode_png(piutil.encode_png(img)), img)
    rgb = rng.integers(0, 256, size=(9, 13, 3), dtype=np.uint8)
    np.testing.assert_array_equal(piutil.decode_png(piutil.encode_png(rgb)), rgb)
    Image = pytest.importorskip("PIL.Image")
    path = tmp_path / "pil.png"
    smooth = np.stack([img, img[::-1], 255 - img], axis=-1)
    Image.fromarray(smooth).save(path, optimize=True)  # Pillow picks its own filters
    np.testing.assert_array_equal(piutil.read_image(path), smooth)


def test_png_errors():
    with pytest.raises(piutil.ImageError, match="8-bit"):
        import struct

        hdr = struct.pack(">IIBBBBB", 1, 1, 16, 0, 0, 0, 0)
        body = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + hdr + b"\0\0\0\0"
        piutil.decode_png(body)
    with pytest.raises(piutil.ImageError, match="truncated|corrupt"):
        piutil.decode_png(piutil.encode_png(np.zeros((4, 4), np.uint8))[:-30])


def test_pnm_variants():
    gray = np.array([[0, 128], [255, 7]], np.uint8)
    np.testing.assert_array_equal(piutil.decode_pnm(b"P5\n# comment\n2 2\n255\n" + gray.tobytes()), gray)
    np.testing.assert_array_equal(piutil.decode_pnm(b"P2 2 2 255\n0 128\n255 7\n"), gray)
    rgb = np.arange(12, dtype=np.uint8).reshape(2, 2, 3)
    np.testing.assert_array_equal(piutil.decode_pnm(piutil.encode_pnm(rgb)), rgb)
    wide = np.array([[0, 65535]], ">u2")
    np.testing.assert_array_equal(piutil.decode_pnm(b"P5 2 1 65535\n" + wide.tobytes()), [[0, 255]])
    with pytest.raises(piutil.ImageError):
        piutil.decode_pnm(b"P5 4 4 255\n" + b"\0" * 3)


# --------------------------------------------------------------------------- preprocessing and board state


def test_sample_preprocessing_recovers_the_heldout_image():
    data = np.load(HELDOUT)
    x = piutil.preprocess_digit(piutil.read_image(piutil.SAMPLES_DIR / "digit_7.png"))
    assert x.shape == (1, 1, 8, 8) and x.dtype == np.float32
    dist = np.abs(data["image"] - x).reshape(len(data["image"]), -1).max(axis=1)
    assert dist.min() <= 1.0 / 255 + 1e-6 and data["label"][dist.argmin()] == 7


def test_preprocess_camera_like_frame():
    frame = np.full((120, 160, 3), 230, np.uint8)  # white paper, 4:3
    frame[40:80, 70:80] = 20  # a dark vertical stroke: a "1"
    x = piutil.preprocess_digit(frame, crop=True)
    assert x.shape == (1, 1, 8, 8) and 0 <= x.min() and x.max() <= 1
    assert x[0, 0, :, 3:5].mean() > x[0, 0, :, [0, 7]].mean()  # ink in the middle columns


def test_area_resize_and_small_images():
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    np.testing.assert_allclose(piutil.area_resize(x, 2), [[2.5, 4.5], [10.5, 12.5]])
    assert piutil.area_resize(np.ones((3, 5), np.float32), 8).shape == (8, 8)


def test_board_state_helpers(tmp_path):
    assert piutil.decode_throttled(0) == []
    assert piutil.decode_throttled(0x50005) == [
        "under-voltage now", "throttled now", "under-voltage has occurred", "throttling has occurred"]
    zone = tmp_path / "sys" / "class" / "thermal" / "thermal_zone0"
    zone.mkdir(parents=True)
    (zone / "type").write_text("cpu-thermal\n")
    (zone / "temp").write_text("48312\n")
    assert piutil.cpu_temperature_c(str(tmp_path)) == pytest.approx(48.312)
    assert piutil.cpu_temperature_c(str(tmp_path / "none")) is None
    assert piutil.guess_target("Raspberry Pi 5 Model B Rev 1.0") == "rpi5"
    assert piutil.guess_target("Raspberry Pi 4 Model B Rev 1.4") == "rpi4"
    assert piutil.guess_target("Raspberry Pi 3 Model B Plus Rev 1.3") == "rpi3"
    assert piutil.guess_target("Raspberry Pi 400 Rev 1.0") == "rpi4"
    assert piutil.guess_target("") == "generic"
