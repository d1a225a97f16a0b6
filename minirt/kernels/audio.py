"""MelWeightMatrix (opset 17): the triangular mel filterbank for a one-sided spectrum.

num_mel_bins + 2 points equally spaced on the mel scale (mel(f) = 2595 *
log10(1 + f / 700)) from lower_edge_hertz, stepping (high - low) / (num_mel_bins + 2)
(the spacing ONNX's conformance data use), are mapped to spectrogram bins
floor((dft_length + 1) * f / sample_rate).  Mel bin i is the triangle over
bins [p_i, p_{i+2}] that peaks at p_{i+1} with value 1: rising (j - p_i) /
(p_{i+1} - p_i) up to the peak, falling (p_{i+2} - j) / (p_{i+2} - p_{i+1})
after it.  Computed for all bins at once by broadcasting.
"""
from __future__ import annotations

import numpy as np

from minirt.dtypes import ONNX_TO_NUMPY
from minirt.kernels.registry import kernel


def _scalar(v, cast):
    return cast(np.asarray(v).reshape(-1)[0])


@kernel("MelWeightMatrix", since=17)
def mel_weight_matrix(num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz, /, *,
                      output_datatype=1):
    n = _scalar(num_mel_bins, int)
    dft = _scalar(dft_length, int)
    sr = _scalar(sample_rate, int)
    lo, hi = _scalar(lower_edge_hertz, float), _scalar(upper_edge_hertz, float)
    if n < 1 or dft < 1 or sr <= 0:
        raise ValueError(f"MelWeightMatrix: need num_mel_bins, dft_length, sample_rate > 0, got {n}, {dft}, {sr}")
    if not 0 <= lo < hi:
        raise ValueError(f"MelWeightMatrix: need 0 <= lower_edge_hertz < upper_edge_hertz, got {lo}, {hi}")
    out_dt = ONNX_TO_NUMPY.get(int(output_datatype))
    if out_dt is None:
        raise ValueError(f"MelWeightMatrix: unsupported output_datatype {output_datatype}")
    n_spec = dft // 2 + 1
    mel_lo = 2595.0 * np.log10(1.0 + lo / 700.0)
    mel_hi = 2595.0 * np.log10(1.0 + hi / 700.0)
    mels = mel_lo + np.arange(n + 2) * ((mel_hi - mel_lo) / (n + 2))
    hz = 700.0 * (10.0 ** (mels / 2595.0) - 1.0)
    points = np.floor((dft + 1) * hz / sr).astype(np.int64)
    left, centre, right = points[:-2], points[1:-1], points[2:]  # (n,) each
    j = np.arange(n_spec)[:, None]  # (n_spec, 1)
    rise_w = np.where(centre > left, centre - left, 1)
    rising = np.where((j >= left) & (j <= centre), (j - left) / rise_w, 0.0)
    rising = np.where((centre == left) & (j == centre), 1.0, rising)
    fall_w = np.where(right > centre, right - centre, 1)
    falling = (j >= centre) & (j < right)
    w = np.where(falling, (right - j) / fall_w, rising)
    return w.astype(out_dt)
