"""Choosing the next token from logits: onnxruntime-genai's CPU search, in numpy.

The order and the semantics are onnxruntime-genai's (standard decoding step, CPU greedy search):

1. min_length: while the sequence is shorter than ``min_length``, every EOS id gets the lowest float;
2. repetition penalty ``r`` (if != 1): each distinct token already in the sequence (prompt included)
   has its logit ``l`` replaced by ``l * r`` if ``l < 0`` else ``l / r``;
3. no_repeat_ngram_size ``n``: a token that would repeat an n-gram of the sequence gets the lowest float;
4. the choice: greedy (argmax, the first of equal maxima) when ``do_sample`` is off, ``top_k == 1``
   or ``temperature == 0``; else sampling from softmax(logits / temperature) restricted to the
   ``top_k`` largest logits (``top_k > 1``), then, within those (renormalised), to the smallest prefix
   whose probability reaches ``top_p`` (``0 < top_p < 1``); ``top_k`` 0 or 1 with sampling: the
   nucleus over the whole vocabulary.

Sampling draws from a numpy ``Generator`` seeded by ``random_seed`` (-1: from the OS), so a fixed seed
reproduces minirt's own runs; the random stream differs from onnxruntime-genai's (std::mt19937).
"""
from __future__ import annotations

import numpy as np

LOWEST = np.finfo(np.float32).min


def apply_min_length(logits: np.ndarray, length: int, min_length: int, eos_ids) -> None:
    if length < min_length:
        for e in eos_ids:
            if 0 <= e < logits.shape[-1]:
                logits[e] = LOWEST


def apply_repetition_penalty(logits: np.ndarray, sequence: np.ndarray, penalty: float) -> None:
    if penalty == 1.0 or not len(sequence):
        return
    seen = np.unique(sequence)
    seen = seen[(seen >= 0) & (seen < logits.shape[-1])]
    vals = logits[seen]
    p = np.float32(penalty)
    logits[seen] = np.where(vals < 0, vals * p, vals / p)


def apply_no_repeat_ngram(logits: np.ndarray, sequence: np.ndarray, n: int) -> None:
    if n <= 0 or len(sequence) < n:
        return
    seq = np.asarray(sequence)
    prefix = seq[len(seq) - (n - 1):] if n > 1 else seq[:0]
    for start in range(len(seq) - n + 1):
        if np.array_equal(seq[start:start + n - 1], prefix):
            t = int(seq[start + n - 1])
            if 0 <= t < logits.shape[-1]:
                logits[t] = LOWEST


def is_greedy(opts: dict) -> bool:
    return not opts["do_sample"] or int(opts["top_k"]) == 1 or float(opts["temperature"]) == 0.0


def distribution(logits: np.ndarray, top_k: int, top_p: float, temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, their probabilities) of the truncated distribution sampling draws from."""
    x = logits.astype(np.float64)
    inv_t = 1.0 / float(temperature)
    v = x.shape[-1]
    if top_k > 1:
        m = min(int(top_k), v)
        # the m largest, in descending order; equal logits keep the lower id first (stable sort)
        idx = np.argsort(-x, kind="stable")[:m]
        e = np.exp((x[idx] - x[idx[0]]) * inv_t)
        probs = e / e.sum()
        keep = m
        if 0.0 < top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), top_p) + 1)
            keep = min(keep, m)
        idx, probs = idx[:keep], probs[:keep]
        return idx, probs / probs.sum()
    order = np.argsort(-x, kind="stable")
    e = np.exp((x[order] - x[order[0]]) * inv_t)
    probs = e / e.sum()
    if 0.0 < top_p < 1.0:
        keep = min(int(np.searchsorted(np.cumsum(probs), top_p) + 1), v)
        order, probs = order[:keep], probs[:keep]
    return order, probs / probs.sum()


def choose(logits: np.ndarray, opts: dict, rng: np.random.Generator) -> int:
    """The next token (see the module docstring); ``logits`` float32 [vocab], already penalised."""
    if is_greedy(opts):
        return int(np.argmax(logits))
    ids, probs = distribution(logits, int(opts["top_k"]), float(opts["top_p"]), float(opts["temperature"]))
    return int(ids[rng.choice(len(ids), p=probs)]) if len(ids) > 1 else int(ids[0])
