"""Rewrite ``unsupported.txt`` from the current conformance results.

Runs every node case (the same :func:`tests.conformance.cases.outcome` the
test suite uses) and writes the failing ones, sorted, one per line.  A case
that was already listed keeps its reason; a newly failing case (or one whose
name or reason matches ``--refresh REGEX``) gets the first line of its
exception as the reason (edit it into something readable before
committing).  Fixed cases drop out.  Prints what changed and the pass rate,
with the ``PASS_RATE_FLOOR`` value to put in ``test_onnx_node_cases.py``.

    .venv/bin/python -m tests.conformance.regenerate_unsupported [--dry-run]
"""
from __future__ import annotations

import argparse
import math
import re
import sys

from tests.conformance import cases as C

HEADER = (
    "# ONNX node cases minirt does not pass yet: `test_name  # reason`, sorted.\n"
    "# Each is a strict xfail: a listed case that passes fails the run (XPASS(strict)); then delete its line.\n"
)
MAX_REASON = 160


def _reason(exc: BaseException) -> str:
    lines = [" ".join(ln.split()) for ln in str(exc).splitlines() if ln.strip()]
    line = f"{type(exc).__name__}: {'; '.join(lines[:3])}" if lines else type(exc).__name__
    line = line.replace("#", "no.")
    return line[:MAX_REASON]


def regenerate(path: str = C.UNSUPPORTED_FILE, dry_run: bool = False, refresh: str | None = None) -> int:
    old = C.load_unsupported(path)
    names = sorted(C.node_cases())
    failing: dict[str, str] = {}
    for name in names:
        exc = C.outcome(name)
        if exc is not None:
            keep = old.get(name)
            if keep and refresh and (re.search(refresh, keep) or re.search(refresh, name)):
                keep = None
            failing[name] = keep or _reason(exc)
    fixed = sorted(set(old) - set(failing))
    added = sorted(set(failing) - set(old))
    passed = len(names) - len(failing)
    rate = passed / len(names)
    if not dry_run:
        with open(path, "w", encoding="utf-8") as f:
            f.write(HEADER)
            for name in sorted(failing):
                f.write(f"{name}  # {failing[name]}\n")
    for name in fixed:
        print(f"fixed:   {name}")
    for name in added:
        print(f"failing: {name}  # {failing[name]}")
    floor = math.floor(rate * 1000) / 1000
    print(f"{passed}/{len(names)} passed ({rate:.4f}); {len(failing)} listed; PASS_RATE_FLOOR = {floor}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="report only; do not rewrite the file")
    ap.add_argument("--refresh", metavar="REGEX",
                    help="recompute the reason of listed cases whose name or reason matches REGEX")
    args = ap.parse_args(argv)
    return regenerate(dry_run=args.dry_run, refresh=args.refresh)


if __name__ == "__main__":
    sys.exit(main())
