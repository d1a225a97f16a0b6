"""Signal processing: DFT, STFT and the window generators.

Complex values travel as a trailing axis of size 2 (real, imaginary); a real
signal has a trailing axis of size 1.
"""
from __future__ import annotations

import numpy as np

from minirt.dtypes import ONNX_TO_NUMPY
from minirt.kernels._limits import check_alloc
from minirt.kernels.registry import kernel


def _to_complex(x: np.ndarray) -> np.ndarray:
    return x[..., 0] + 1j * x[..., 1] if x.shape[-1] == 2 else x[..., 0].astype(np.complex128)


def _from_complex(c: np.ndarray, dtype) -> np.ndarray:
    return np.stack([c.real, c.imag], axis=-1).astype(dtype)


def _dft(x, dft_length, axis, inverse, onesided):
    x = np.asarray(x)
    ax = axis + x.ndim if axis < 0 else axis
    if ax == x.ndim - 1:
        raise ValueError("DFT: axis must not be the trailing real/imaginary axis")
    n = None if dft_length is None else int(np.asarray(dft_length).reshape(-1)[0])
    if n is not None:
        check_alloc(x.shape[:ax] + (max(n, 0),) + x.shape[ax + 1 : -1], np.complex128, "DFT output")
    if inverse:
        c = _to_complex(x)
        if onesided:
            m = c.shape[ax]
            n = n if n is not None else 2 * (m - 1)
            return np.fft.irfft(c, n=n, axis=ax)[..., None].astype(x.dtype)
        return _from_complex(np.fft.ifft(c, n=n, axis=ax), x.dtype)
    if onesided:
        if x.shape[-1] != 1:
            raise ValueError("DFT: onesided needs a real input")
        return _from_complex(np.fft.rfft(x[..., 0], n=n, axis=ax), x.dtype)
    return _from_complex(np.fft.fft(_to_complex(x), n=n, axis=ax), x.dtype)


@kernel("DFT", since=17)
def dft17(input, dft_length=None, axis=1, inverse=0, onesided=0):  # noqa: A002
    return _dft(input, dft_length, axis, inverse, onesided)


@kernel("DFT", since=20)
def dft(input, dft_length=None, axis=None, inverse=0, onesided=0):  # noqa: A002
    ax = -2 if axis is None else int(np.asarray(axis).reshape(-1)[0])
    return _dft(input, dft_length, ax, inverse, onesided)


@kernel("STFT", since=17)
def stft(signal, frame_step, window=None, frame_length=None, onesided=1):
    x = np.asarray(signal)
    step = int(np.asarray(frame_step).reshape(-1)[0])
    if frame_length is not None:
        fl = int(np.asarray(frame_length).reshape(-1)[0])
    elif window is not None:
        fl = int(np.asarray(window).shape[0])
    else:
        raise ValueError("STFT: needs a window or a frame_length")
    c = _to_complex(x)  # [batch, length]
    frames = 1 + (c.shape[1] - fl) // step
    check_alloc((c.shape[0], max(frames, 0), max(fl, 0)), np.complex128, "STFT frames")
    idx = np.arange(frames)[:, None] * step + np.arange(fl)[None, :]
    framed = c[:, idx]  # [batch, frames, fl]
    if window is not None:
        framed = framed * np.asarray(window)
    if onesided and x.shape[-1] == 1:
        spec = np.fft.rfft(framed.real, axis=-1)
    else:
        spec = np.fft.fft(framed, axis=-1)
    return _from_complex(spec, x.dtype)


def _window(size, periodic, output_datatype, coeffs):
    n = int(np.asarray(size).reshape(-1)[0])
    check_alloc((max(n, 0),), np.float64, "window output")
    denom = n if periodic else n - 1
    k = np.arange(n, dtype=np.float64)
    w = np.zeros(n)
    for i, a in enumerate(coeffs):
        w = w + a * np.cos(2 * np.pi * i * k / denom) if denom else w + a
    return w.astype(ONNX_TO_NUMPY[int(output_datatype)])


@kernel("HannWindow", since=17)
def hann_window(size, output_datatype=1, periodic=1):
    return _window(size, periodic, output_datatype, (0.5, -0.5))


@kernel("HammingWindow", since=17)
def hamming_window(size, output_datatype=1, periodic=1):
    return _window(size, periodic, output_datatype, (25.0 / 46.0, -21.0 / 46.0))


@kernel("BlackmanWindow", since=17)
def blackman_window(size, output_datatype=1, periodic=1):
    return _window(size, periodic, output_datatype, (0.42, -0.5, 0.08))
