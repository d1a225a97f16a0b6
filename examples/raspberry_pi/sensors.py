"""Machine-health readings for the sensor example (numpy only, shared by both of its scripts).

A motor's monitoring board samples five sensors; the state to recognise is one of
``STATES``.  :func:`simulate` draws readings the way such a board sees them (each state shifts
and spreads the sensors differently, with noise and some overlap between states), so the desktop
script can train a model and the Pi script can feed a stream without real hardware; a CSV with
the same columns (a header row naming ``FEATURES``, an optional ``state`` column) is read by
:func:`read_csv`.
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

FEATURES = ("temperature_c", "vibration_rms_g", "current_a", "humidity_pct", "rpm")
STATES = ("normal", "overheating", "bearing_wear", "overload")

# per state: mean and spread of each feature (FEATURES order)
_MEANS = np.array([[45.0, 0.20, 4.0, 40.0, 1450.0],
                   [72.0, 0.25, 4.3, 35.0, 1440.0],
                   [50.0, 0.85, 4.2, 42.0, 1420.0],
                   [58.0, 0.40, 7.5, 40.0, 1310.0]])
_SPREADS = np.array([[6.0, 0.06, 0.6, 10.0, 25.0],
                     [8.0, 0.08, 0.7, 10.0, 30.0],
                     [7.0, 0.25, 0.7, 10.0, 40.0],
                     [7.0, 0.12, 1.2, 10.0, 60.0]])


def simulate(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` readings (float32 [n, len(FEATURES)]) and their true states (int64 [n], indices of STATES);
    about 70% normal, the rest spread over the faults."""
    rng = np.random.default_rng(seed)
    states = rng.choice(len(STATES), size=n, p=[0.7, 0.1, 0.1, 0.1]).astype(np.int64)
    x = rng.normal(_MEANS[states], _SPREADS[states])
    return x.astype(np.float32), states


def write_csv(path: str | Path, x: np.ndarray, states: np.ndarray | None = None) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(list(FEATURES) + (["state"] if states is not None else []))
        for i, row in enumerate(x):
            w.writerow([f"{v:.4g}" for v in row] + ([STATES[int(states[i])]] if states is not None else []))


def read_csv(path: str | Path) -> tuple[np.ndarray, list[str] | None]:
    """(readings float32 [n, len(FEATURES)], the ``state`` column if the file has one).  The header must
    name every feature; a row with a missing or non-numeric feature is an error naming the line."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        raise ValueError(f"{path}: empty file; expected a header row naming {', '.join(FEATURES)}")
    header = [h.strip() for h in rows[0]]
    missing = [name for name in FEATURES if name not in header]
    if missing:
        raise ValueError(f"{path}: the header lacks {', '.join(missing)} (it has {', '.join(header)})")
    cols = [header.index(name) for name in FEATURES]
    state_col = header.index("state") if "state" in header else None
    x = np.empty((len(rows) - 1, len(FEATURES)), np.float32)
    states = [] if state_col is not None else None
    for i, row in enumerate(rows[1:]):
        try:
            x[i] = [float(row[c]) for c in cols]
        except (ValueError, IndexError):
            raise ValueError(f"{path}, line {i + 2}: expected a number in each of {', '.join(FEATURES)}, "
                             f"got {row}") from None
        if states is not None:
            states.append(row[state_col].strip() if state_col < len(row) else "")
    return x, states
