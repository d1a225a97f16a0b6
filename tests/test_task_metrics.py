"""The scoring behind benchmarks/task_metrics.py (issue 20, item 2): edit distance against a
brute-force definition, the grouping of OCR boxes into lines, the line and character scores, the
rendered pages and the labelled file corpus."""
from __future__ import annotations

import functools
import itertools
import os

import pytest

from benchmarks import task_metrics as tm


def _distance_by_definition(a: str, b: str) -> int:
    """The smallest number of single-character insertions, deletions and substitutions (recursive)."""

    @functools.lru_cache(maxsize=None)
    def d(i: int, j: int) -> int:
        if i == 0 or j == 0:
            return i + j
        return min(d(i - 1, j) + 1, d(i, j - 1) + 1, d(i - 1, j - 1) + (a[i - 1] != b[j - 1]))

    return d(len(a), len(b))


def test_edit_distance_is_the_definition():
    words = ["", "a", "ab", "ba", "abc", "kitten", "sitting", "Monday", "mondays"]
    for a, b in itertools.product(words, repeat=2):
        assert tm.edit_distance(a, b) == _distance_by_definition(a, b), (a, b)


def test_boxes_of_one_line_join_left_to_right():
    boxes = [[300, 33, 70, "edge"], [40, 35, 63, "socket"],  # one line, given right to left
             [40, 93, 128, "invoice 8124"], [260, 96, 126, "brake"]]
    assert tm.rows_of(boxes) == ["socket edge", "invoice 8124 brake"]
    assert tm.rows_of([]) == []


def test_ocr_scores():
    truth = [["London switch", "edge 42"], ["coffee"]]
    read = [["Londonswitch", "edge 43"], []]  # spaces ignored; one wrong digit; a line not found
    s = tm.ocr_scores(truth, read)
    assert s["lines"] == 3 and s["exact_lines"] == pytest.approx(1 / 3)
    assert s["chars"] == len("Londonswitchedge42") + len("coffee")
    assert s["char_accuracy"] == pytest.approx(1 - (1 + 6) / s["chars"])


def test_rendered_pages_and_file_corpus(tmp_path):
    pytest.importorskip("PIL")
    pytest.importorskip("matplotlib")
    from PIL import Image

    pages = tm.render_pages(3, seed=7, folder=tmp_path)
    assert len(pages) == 3
    for path, lines in pages:
        assert 1 <= len(lines) <= 3 and all(lines)
        with Image.open(path) as img:
            assert img.width > 100 and img.height > 60 and img.getextrema() != ((255, 255),) * 3
    assert tm.render_pages(3, seed=7, folder=tmp_path / "again")[0][1] == pages[0][1]  # (seeded)
    corpus = tm.file_corpus(2, seed=1)
    labels = {lab for _, lab in corpus}
    assert {"python", "json"} <= labels
    for path, lab in corpus:
        assert tm.EXTENSION_LABELS[os.path.splitext(path)[1].lower()] == lab and os.path.getsize(path) >= 64
