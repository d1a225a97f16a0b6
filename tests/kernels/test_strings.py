"""String kernels compared against onnxruntime."""
from __future__ import annotations

import numpy as np
import pytest

from tests.kernels.test_elementwise import check


def check_normalizer(x, attrs):
    # onnxruntime builds StringNormalizer only for an installed locale: "C" always is.
    check("StringNormalizer", [x], dict(attrs, locale="C"), opset=10)


def S(*values, shape=None):
    a = np.array(list(values), dtype=object)
    return a.reshape(shape) if shape is not None else a


WORDS = S("Monday", "tuesday", "WEDNESDAY", "monday", "thursday", "Friday")


@pytest.mark.parametrize("action", ["NONE", "LOWER", "UPPER"])
@pytest.mark.parametrize("case_sensitive", [0, 1])
@pytest.mark.parametrize("row", [False, True])
def test_string_normalizer(action, case_sensitive, row):
    x = WORDS.reshape(1, -1) if row else WORDS
    attrs = {"case_change_action": action, "is_case_sensitive": case_sensitive, "stopwords": ["monday", "friday"]}
    check_normalizer(x, attrs)


def test_string_normalizer_all_dropped():
    check_normalizer(S("a", "b"), {"stopwords": ["a", "b"]})
    check_normalizer(S("a", "b", shape=(1, 2)), {"stopwords": ["A", "B"]})


@pytest.mark.parametrize("a,b", [
    (S("ab", "c", "", "ü"), S("x", "yz", "", "€")),
    (S("a", "b", "c", "d", shape=(2, 2)), S("_1", "_2")),
    (S("p", shape=()), S("q", "r")),
])
def test_string_concat(a, b):
    check("StringConcat", [a, b], opset=20)


@pytest.mark.parametrize("attrs", [{}, {"delimiter": ","}, {"delimiter": ",", "maxsplit": 1}, {"maxsplit": 2},
                                   {"delimiter": "--"}])
def test_string_split(attrs):
    x = S("a,b,,c", "  one two   three ", "", "x--y--z,w", shape=(2, 2))
    check("StringSplit", [x], attrs, opset=20, n_outputs=2)


@pytest.mark.parametrize("pattern", [r"[a-z]+@[a-z]+\.com", r"\d{3}-\d{4}", r".*", r"a|b"])
def test_regex_full_match(pattern):
    x = S("john@example.com", "555-1234", "", "a", "ab", "JOHN@example.com", shape=(2, 3))
    check("RegexFullMatch", [x], {"pattern": pattern}, opset=20)


TFIDF_INT = {"pool_int64s": [2, 3, 5, 4, 5, 6, 7, 8, 6, 7], "ngram_counts": [0, 4],
             "ngram_indexes": [0, 1, 2, 3, 4, 5, 6]}
TFIDF_STR = {"pool_strings": ["two", "three", "five", "four", "five", "six", "seven", "eight", "six", "seven"],
             "ngram_counts": [0, 4], "ngram_indexes": [0, 1, 2, 3, 4, 5, 6]}
WORDS_BY_INT = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 1: "one"}


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize("grams,skip", [((1, 1), 0), ((2, 2), 0), ((1, 2), 3), ((2, 2), 5)])
@pytest.mark.parametrize("strings", [False, True])
@pytest.mark.parametrize("batch", [False, True])
def test_tfidf_vectorizer(mode, grams, skip, strings, batch):
    ints = np.array([[1, 1, 3, 3, 3, 7, 8, 6, 7, 5, 6, 8], [8, 8, 7, 7, 6, 5, 4, 5, 6, 7, 8, 2]], np.int64)
    x = ints if batch else ints[0]
    attrs = dict(TFIDF_STR if strings else TFIDF_INT)
    if strings:
        x = np.vectorize(WORDS_BY_INT.get, otypes=[object])(x)
    attrs.update(mode=mode, min_gram_length=grams[0], max_gram_length=grams[1], max_skip_count=skip,
                 weights=[0.5, 1.0, 2.0, 1.5, 3.0, 0.25, 1.0])
    check("TfIdfVectorizer", [x], attrs, opset=9)
