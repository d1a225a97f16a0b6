"""docs/decisions.md stays a decision log: an index first, one numbering scheme, short entries.

Checked here: the file opens (after its title and preamble) with the index table; every
``## Dn.`` heading has an index row and every index row a heading; numbers are unique; no entry is
longer than :data:`MAX_ENTRY_LINES` (its heading to the next heading); and every docs/perf page that
an entry links to exists.  Long narratives belong on a docs/perf page (docs/perf/README.md).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
DECISIONS = DOCS / "decisions.md"
MAX_ENTRY_LINES = 60

_HEADING = re.compile(r"^## (D\d+)\. ")
_INDEX_ROW = re.compile(r"^\| (D\d+) \| .+ \| (active|superseded by D\d+(, D\d+)*|partly superseded by D\d+(, D\d+)*) \|$")


def _sections(lines: list[str]) -> list[tuple[str, int, int]]:
    """(heading line, first line index, past-the-end index) of every ``## `` section."""
    starts = [i for i, line in enumerate(lines) if line.startswith("## ")]
    return [(lines[s], s, e) for s, e in zip(starts, starts[1:] + [len(lines)])]


def check_decisions(text: str) -> list[str]:
    """Every way ``text`` (decisions.md) breaks the log's rules; empty when it keeps them."""
    lines = text.split("\n")
    problems = []
    sections = _sections(lines)
    if not sections or sections[0][0] != "## Index":
        problems.append("the first section must be '## Index'")
        index_rows = []
    else:
        _, s, e = sections[0]
        body = [line for line in lines[s + 1:e] if line.strip()]
        if body[:2] != ["| D | title | status |", "|---|---|---|"]:
            problems.append("the index must be a table '| D | title | status |'")
        index_rows = []
        for line in body[2:]:
            m = _INDEX_ROW.match(line)
            if m is None:
                problems.append(f"index row not understood (status: active / superseded by Dn / partly superseded by Dn): {line}")
            else:
                index_rows.append(m.group(1))
    headings = []
    for heading, s, e in sections[1:]:
        m = _HEADING.match(heading)
        if m is None:
            problems.append(f"a section that is not a decision '## Dn. Title': {heading}")
            continue
        headings.append(m.group(1))
        if e - s > MAX_ENTRY_LINES:
            problems.append(f"{m.group(1)} is {e - s} lines long (at most {MAX_ENTRY_LINES}): move its narrative to docs/perf/")
    for what, numbers in (("heading", headings), ("index row", index_rows)):
        dup = sorted({n for n in numbers if numbers.count(n) > 1})
        if dup:
            problems.append(f"{what} numbers used twice: {dup}")
    if set(headings) - set(index_rows):
        problems.append(f"entries missing from the index: {sorted(set(headings) - set(index_rows))}")
    if set(index_rows) - set(headings):
        problems.append(f"index rows without an entry: {sorted(set(index_rows) - set(headings))}")
    return problems


def test_decisions_log_keeps_its_rules():
    problems = check_decisions(DECISIONS.read_text())
    assert not problems, "docs/decisions.md:\n" + "\n".join(problems)


def test_linked_perf_pages_exist():
    for page in sorted(set(re.findall(r"\(perf/([\w.-]+\.md)", DECISIONS.read_text()))):
        assert (DOCS / "perf" / page).is_file(), f"docs/decisions.md links docs/perf/{page}, which does not exist"


@pytest.mark.parametrize(
    "breakage, expected",
    [
        (lambda t: t.replace("## Index", "## Contents", 1), "first section"),
        (lambda t: t.replace("\n## D2. ", "\n## D1. ", 1), "used twice"),
        (lambda t: t.replace("| D3 |", "| D9999 |", 1), "without an entry"),
        (lambda t: t.replace("\n## D4. ", "\n" + "filler\n" * 70 + "## D4. ", 1), "lines long"),
        (lambda t: t + "\n## D-named. A named entry\n", "not a decision"),
    ],
)
def test_the_check_fails_on_a_broken_log(breakage, expected):
    """The check is not vacuous: each kind of breakage of the real file is reported."""
    problems = check_decisions(breakage(DECISIONS.read_text()))
    assert any(expected in p for p in problems), problems
