"""Calibration data loading and range collection on synthetic data of known ranges."""
import numpy as np
import pytest

from minirt.builder.errors import BuildError
from minirt.builder.quantize.calibration import RangeCollector, entropy_threshold, load_feeds


def _collect(method, arrays, **kw):
    col = RangeCollector(method, **kw)
    for a in arrays:
        col.update_minmax("t", a)
    if col.needs_histograms:
        for a in arrays:
            col.update_histogram("t", a)
    return col.range("t")


def test_minmax_is_exact_over_batches():
    rng = np.random.default_rng(0)
    batches = [rng.uniform(-1.0, 3.0, 1000).astype(np.float32) for _ in range(3)]
    batches[1][5] = -1.5
    batches[2][7] = 3.25
    assert _collect("minmax", batches) == (-1.5, 3.25)


def test_percentile_ignores_rare_outliers():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(200_000).astype(np.float32)
    x[:3] = [40.0, -35.0, 50.0]
    lo, hi = _collect("percentile", [x], percentile=99.9)
    # the 99.9th percentile of N(0, 1) is 3.09; one histogram bin is 85/2048 wide
    assert 3.09 - 0.1 < hi < 3.09 + 0.1
    assert -3.09 - 0.1 < lo < -3.09 + 0.1


def test_percentile_of_non_negative_data_starts_at_zero():
    x = np.random.default_rng(2).uniform(0.5, 2.0, 10_000).astype(np.float32)
    lo, hi = _collect("percentile", [x], percentile=99.99)
    assert lo == 0.0 and 1.95 < hi <= 2.0


def test_entropy_clips_a_lone_outlier_and_keeps_a_plain_distribution():
    rng = np.random.default_rng(3)
    relu = np.maximum(rng.standard_normal(200_000), 0).astype(np.float32)
    relu[0] = 40.0  # one huge outlier: the threshold must land far below it
    lo, hi = _collect("entropy", [relu])
    assert lo == 0.0 and 2.5 < hi < 10.0
    signed = rng.standard_normal(200_000).astype(np.float32)
    lo, hi = _collect("entropy", [signed])
    assert lo == -hi and 2.5 < hi <= float(np.abs(signed).max()) + 1e-6


def test_entropy_threshold_of_uniform_histogram_is_the_end():
    hist = np.full(2048, 100)
    edges = np.linspace(0, 1, 2049)
    assert entropy_threshold(hist, edges, 128) == pytest.approx(1.0, abs=0.01)


def test_load_feeds_npz_file_folder_and_iterable(tmp_path):
    x = np.ones((2, 3), np.float32)
    np.savez(tmp_path / "a.npz", x=x, label=np.array([1, 2]))
    np.savez(tmp_path / "b.npz", x=x * 2, label=np.array([3, 4]))
    one = load_feeds(str(tmp_path / "a.npz"), ["x"])
    assert len(one) == 1 and np.array_equal(one[0]["x"], x) and list(one.labels[0]) == [1, 2]
    both = load_feeds(str(tmp_path), ["x"])
    assert len(both) == 2 and list(both.all_labels()) == [1, 2, 3, 4]
    it = load_feeds(({"x": x * i} for i in range(3)), ["x"])
    assert len(it) == 3 and it.all_labels() is None
    with pytest.raises(BuildError, match="no array for input"):
        load_feeds(str(tmp_path / "a.npz"), ["x", "y"])
    with pytest.raises(BuildError, match="no such file"):
        load_feeds(str(tmp_path / "missing.npz"), ["x"])


def test_image_folder_needs_a_spec(tmp_path):
    pil = pytest.importorskip("PIL.Image")
    pil.fromarray(np.full((4, 6, 3), 255, np.uint8)).save(tmp_path / "a.png")
    with pytest.raises(BuildError, match="preprocessing spec"):
        load_feeds(str(tmp_path), ["x"])
    feeds = load_feeds(str(tmp_path), ["x"], spec={"size": [2, 3], "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]})
    assert feeds[0]["x"].shape == (1, 3, 2, 3)
    assert np.allclose(feeds[0]["x"], 1.0)
