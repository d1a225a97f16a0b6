"""String kernels: StringNormalizer, StringConcat, StringSplit, RegexFullMatch.

Strings are numpy object arrays of Python ``str``.  These ops are per element
with no arithmetic to vectorise, so they loop in Python over the flattened
input and rebuild arrays of the right shape.  RegexFullMatch uses Python's
``re`` module, which agrees with RE2 on the syntax RE2 accepts (RE2 lacks
backreferences and lookaround, so RE2 patterns are valid Python patterns).
"""
from __future__ import annotations

import functools
import re

import numpy as np

from minirt.kernels.registry import kernel


def _text(v) -> str:
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


def _strings(values, shape) -> np.ndarray:
    out = np.empty(shape, dtype=object)
    flat = out.reshape(-1)
    for i, v in enumerate(values):
        flat[i] = v
    return out


def _as_str_array(x, op: str) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != object and x.dtype.kind not in "US":
        raise ValueError(f"{op}: string input required, got {x.dtype}")
    return x


@kernel("StringConcat", since=20)
def string_concat(x, y, /):
    x, y = _as_str_array(x, "StringConcat"), _as_str_array(y, "StringConcat")
    try:
        bx, by = np.broadcast_arrays(x, y)
    except ValueError:
        raise ValueError(f"StringConcat: shapes {x.shape} and {y.shape} do not broadcast") from None
    return _strings((_text(a) + _text(b) for a, b in zip(bx.reshape(-1), by.reshape(-1))), bx.shape)


@functools.lru_cache(maxsize=64)
def _compile(pattern: str):
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"RegexFullMatch: invalid pattern {pattern!r}: {exc}") from None


@kernel("RegexFullMatch", since=20)
def regex_full_match(x, /, *, pattern=None):
    if pattern is None:
        raise ValueError("RegexFullMatch: the pattern attribute is required")
    rx = _compile(_text(pattern))
    x = _as_str_array(x, "RegexFullMatch")
    flat = [rx.fullmatch(_text(v)) is not None for v in x.reshape(-1)]
    return np.array(flat, dtype=bool).reshape(x.shape)


@kernel("StringSplit", since=20)
def string_split(x, /, *, delimiter=None, maxsplit=None):
    x = _as_str_array(x, "StringSplit")
    sep = _text(delimiter) if delimiter is not None else ""
    limit = -1 if maxsplit is None else int(maxsplit)
    # An empty element has no substrings (as onnxruntime; str.split(sep) would give [""]);
    # whitespace splitting drops leading/trailing whitespace, also from a maxsplit remainder.
    parts = [(_text(v).split(sep, limit) if sep else _text(v).strip().split(None, limit)) if _text(v) else []
             for v in x.reshape(-1)]
    width = max((len(p) for p in parts), default=0)
    y = np.empty(x.shape + (width,), dtype=object)
    y.fill("")
    y2 = y.reshape(-1, width) if width else y
    for i, p in enumerate(parts):
        for j, s in enumerate(p):
            y2[i, j] = s
    z = np.array([len(p) for p in parts], dtype=np.int64).reshape(x.shape)
    return y, z


@kernel("StringNormalizer", since=10)
def string_normalizer(x, /, *, case_change_action="NONE", is_case_sensitive=0, locale=None, stopwords=None):
    x = _as_str_array(x, "StringNormalizer")
    if x.ndim == 2 and x.shape[0] == 1:
        row = True
    elif x.ndim == 1:
        row = False
    else:
        raise ValueError(f"StringNormalizer: input must be [C] or [1, C], got shape {x.shape}")
    action = _text(case_change_action)
    if action not in ("NONE", "LOWER", "UPPER"):
        raise ValueError(f"StringNormalizer: case_change_action must be NONE, LOWER or UPPER, got {action!r}")
    words = [_text(v) for v in x.reshape(-1)]
    if stopwords:
        stops = [_text(s) for s in stopwords]
        if is_case_sensitive:
            stopset = set(stops)
            words = [w for w in words if w not in stopset]
        else:
            stopset = {s.lower() for s in stops}
            words = [w for w in words if w.lower() not in stopset]
    if action == "LOWER":
        words = [w.lower() for w in words]
    elif action == "UPPER":
        words = [w.upper() for w in words]
    if not words:
        words = [""]  # all dropped: one empty string
    return _strings(words, (1, len(words)) if row else (len(words),))


# --------------------------------------------------------------------------- TfIdfVectorizer


def _vocab_ids(items, vocab_sorted, is_str: bool) -> np.ndarray:
    """Index of every item in the sorted vocabulary, -1 where absent."""
    if is_str:
        table = {v: i for i, v in enumerate(vocab_sorted)}
        return np.array([table.get(_text(v), -1) for v in items], dtype=np.int64)
    items = np.asarray(items, dtype=np.int64)
    if len(vocab_sorted) == 0:
        return np.full(items.shape, -1, dtype=np.int64)
    pos = np.clip(np.searchsorted(vocab_sorted, items), 0, len(vocab_sorted) - 1)
    return np.where(vocab_sorted[pos] == items, pos, -1)


@kernel("TfIdfVectorizer", since=9)
def tfidf_vectorizer(x, /, *, max_gram_length=None, max_skip_count=None, min_gram_length=None, mode=None,
                     ngram_counts=None, ngram_indexes=None, pool_int64s=None, pool_strings=None, weights=None):
    """Counts of the pool's n-grams (contiguous or with up to ``max_skip_count`` skipped items) per row.

    Items are first mapped to ids in the pool's vocabulary; an n-gram of ids
    is packed into one int64 key (mixed radix), so finding every n-gram of
    every row in the pool is one ``searchsorted`` per (length, skip) pair.
    """
    if mode not in ("TF", "IDF", "TFIDF") and _text(mode or "") not in ("TF", "IDF", "TFIDF"):
        raise ValueError(f"TfIdfVectorizer: mode must be TF, IDF or TFIDF, got {mode!r}")
    mode = _text(mode)
    if (pool_int64s is None) == (pool_strings is None):
        raise ValueError("TfIdfVectorizer: exactly one of pool_int64s and pool_strings must be set")
    x = np.asarray(x)
    if x.ndim not in (1, 2):
        raise ValueError(f"TfIdfVectorizer: input must be [C] or [N, C], got shape {x.shape}")
    is_str = pool_strings is not None
    pool = [_text(s) for s in pool_strings] if is_str else np.asarray(pool_int64s, dtype=np.int64).reshape(-1)
    starts = [int(v) for v in (ngram_counts or ())]
    idx_out = np.asarray(ngram_indexes if ngram_indexes is not None else (), dtype=np.int64).reshape(-1)
    lo, hi, skips = int(min_gram_length), int(max_gram_length), int(max_skip_count)
    if not 1 <= lo <= hi:
        raise ValueError(f"TfIdfVectorizer: need 1 <= min_gram_length <= max_gram_length, got {lo}, {hi}")
    width = int(idx_out.max()) + 1 if idx_out.size else 0
    w = np.ones(idx_out.size) if weights is None else np.asarray(weights, dtype=np.float64).reshape(-1)
    vocab = sorted(set(pool)) if is_str else np.unique(pool)
    radix = len(vocab) + 1
    rows = x.reshape(1, -1) if x.ndim == 1 else x
    n_rows, c = rows.shape
    ids = _vocab_ids(rows.reshape(-1), vocab, is_str).reshape(n_rows, c)
    # the pool's n-grams: group g holds (g+1)-grams from starts[g] to the next start
    bounds = starts + [len(pool)]
    keys_by_len: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    k = 0
    pool_ids = _vocab_ids(pool, vocab, is_str)
    for g in range(len(starts)):
        n = g + 1
        seg = pool_ids[bounds[g]:bounds[g + 1]].reshape(-1, n)
        key = np.zeros(seg.shape[0], dtype=np.int64)
        for j in range(n):
            key = key * radix + seg[:, j] + 1
        keys_by_len[n] = (key, np.arange(k, k + seg.shape[0]))
        k += seg.shape[0]
    counts = np.zeros((n_rows, width), dtype=np.float64)
    if radix ** hi >= 2 ** 62:
        raise ValueError("TfIdfVectorizer: vocabulary too large for the n-gram length")
    for n in range(lo, hi + 1):
        if n not in keys_by_len or keys_by_len[n][0].size == 0:
            continue
        pkeys, pnum = keys_by_len[n]
        order = np.argsort(pkeys, kind="stable")
        pkeys, pnum = pkeys[order], pnum[order]
        for skip in range(skips + 1 if n > 1 else 1):  # 1-grams have nothing to skip
            span = (n - 1) * (skip + 1) + 1
            if span > c:
                break
            n_start = c - span + 1
            key = np.zeros((n_rows, n_start), dtype=np.int64)
            valid = np.ones((n_rows, n_start), dtype=bool)
            for j in range(n):
                col = ids[:, j * (skip + 1): j * (skip + 1) + n_start]
                valid &= col >= 0
                key = key * radix + col + 1
            pos = np.clip(np.searchsorted(pkeys, key), 0, pkeys.size - 1)
            hit = valid & (pkeys[pos] == key)
            r, _ = np.nonzero(hit)
            np.add.at(counts, (r, idx_out[pnum[pos[hit]]]), 1.0)
    if mode in ("IDF", "TFIDF"):
        if mode == "IDF":
            counts = np.minimum(counts, 1.0)
        scale = np.zeros(width)
        scale[idx_out] = w
        counts = counts * scale
    y = counts.astype(np.float32)
    return y.reshape(-1) if x.ndim == 1 else y
