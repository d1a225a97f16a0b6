"""Real sweeps on a local Ray cluster of 2 workers (conftest.ray_cluster): the digits model and PP-OCR's
text direction classifier over 16 candidates per target on 3 targets; a rerun from the cache; an
interrupted sweep resumed; a worker killed mid-sweep; the command line."""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest

import minirt
from minirt.builder.sweep import run_sweep
from minirt.builder.sweep.config import load_config
from minirt.builder.sweep.space import expand
from minirt.cli import main

from .conftest import (CANDIDATES_PER_TARGET, DIGITS, OCR_EVAL, TARGETS, digits_model_toml, write_config)


def _choices(result) -> dict:
    return result.chosen()


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # (no /proc: macOS)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def test_every_candidate_once_with_size_accuracy_and_both_latencies(full_sweep):
    config, result, _ = full_sweep
    expected = [c.id for c in expand(load_config(config))]
    ids = [r["candidate"] for r in result.rows]
    assert ids == expected and len(set(ids)) == len(ids)
    for model in ("digits", "ocr-cls"):
        for target in TARGETS:
            rows = [r for r in result.rows if r["model"] == model and r["target"] == target]
            assert len(rows) == CANDIDATES_PER_TARGET
    assert all(r["status"] == "ok" for r in result.rows), [r["error"] for r in result.rows if r["status"] != "ok"]
    for r in result.rows:
        assert r["size_bytes"] > 0 and 0.0 <= r["accuracy"] <= 1.0
        assert r["latency_modeled_ms"] > 0 and "cost model" in r["latency_modeled_basis"]
        assert r["latency_host_ms"] > 0 and r["latency_host_basis"].startswith("measured")
    # The table on disk holds the same rows.
    with open(result.csv_path, newline="") as f:
        table = list(csv.DictReader(f))
    assert [row["candidate"] for row in table] == expected
    assert "latency_modeled_ms" in table[0] and "latency_host_ms" in table[0]
    doc = json.loads(Path(result.json_path).read_text())
    assert [row["candidate"] for row in doc["candidates"]] == expected


def test_modeled_latency_follows_the_target_profiles(full_sweep):
    _, result, _ = full_sweep
    by = {(r["model"], r["target"], r["label"]): r for r in result.rows}
    for model in ("digits", "ocr-cls"):
        float_o2 = {t: next(r for (m, tt, _), r in by.items() if m == model and tt == t and r["label"].startswith("none O2"))
                    for t in TARGETS}
        # one float graph, priced at each target's GMAC/s: the Cortex-A72 is the slowest, AVX2 the fastest
        assert float_o2["rpi4"]["latency_modeled_ms"] > float_o2["rpi5"]["latency_modeled_ms"] > \
            float_o2["x86-64-v3"]["latency_modeled_ms"]
        # int8 on the A76 (dot products) is cheaper relative to float than on the A72 (none), by the cost model
        int8 = {t: next(r for (m, tt, label), r in by.items() if m == model and tt == t
                        and label.startswith("int8 minmax per-channel") and "O2" in label) for t in ("rpi4", "rpi5")}
        ratio = {t: int8[t]["modeled_cost_mmac"] / float_o2[t]["modeled_cost_mmac"] for t in ("rpi4", "rpi5")}
        assert ratio["rpi5"] < ratio["rpi4"]
        assert int8["rpi5"]["size_bytes"] < 0.5 * float_o2["rpi5"]["size_bytes"]


def test_the_choice_is_the_best_candidate_within_the_limits(full_sweep):
    config, result, _ = full_sweep
    cfg = load_config(config)
    assert len(result.choices) == 2 * len(TARGETS)
    for choice in result.choices:
        rows = [r for r in result.rows if r["task"] == choice["task"] and r["target"] == choice["target"]]
        max_size, max_lat = cfg.limits(choice["task"], choice["target"])
        ok = [r for r in rows if (max_size is None or r["size_bytes"] <= max_size)
              and r["latency_modeled_ms"] <= max_lat]
        assert [r["candidate"] for r in rows if r["feasible"]] == [r["candidate"] for r in ok]
        assert ok, f"nothing feasible for {choice}"
        top = max(r["accuracy"] for r in ok)
        # (ties broken as builder/sweep/objective.py's rank_key: latency, size, then the candidate id)
        tied = sorted((r for r in ok if r["accuracy"] == top),
                      key=lambda r: (r["latency_modeled_ms"], r["size_bytes"], r["candidate"]))
        assert choice["candidate"] == tied[0]["candidate"]
        assert sum(r["chosen"] for r in rows) == 1
        assert any(r["pareto"] for r in rows) and result.by_id[choice["candidate"]]["pareto"]
    # digits has a 64 KiB limit: every float candidate (> 64 KiB) is out, and the choice is quantized
    digits = [c for c in result.choices if c["task"] == "digits"]
    assert all(result.by_id[c["candidate"]]["quantize"] in ("int8", "int8-dynamic") for c in digits)


def test_chosen_artifacts_run_and_score_as_the_table_says(full_sweep):
    _, result, _ = full_sweep
    heldout = np.load(DIGITS / "heldout.npz")
    for choice in result.choices:
        path = Path(choice["artifact"])
        report = json.loads(Path(choice["report"]).read_text())
        row = result.by_id[choice["candidate"]]
        assert path.stat().st_size == row["size_bytes"] and report["row"]["candidate"] == row["candidate"]
        assert report["build_report"]["target"] == choice["target"]
        if choice["task"] == "digits":  # scored again here, without Ray or shards (batch 1: the sweep's eval_batch)
            sess = minirt.Session(str(path))
            pred = [sess.run(None, {"image": heldout["image"][i:i + 1]})[0].argmax() for i in range(360)]
            assert float((np.array(pred) == heldout["label"]).mean()) == pytest.approx(row["accuracy"], abs=1e-12)
    assert not list(Path(result.out_dir, "chosen").glob("*.minirt-tmp"))


def test_evaluation_is_sharded(full_sweep):
    _, result, _ = full_sweep
    for r in result.rows:
        n, shards = (360, 6) if r["model"] == "digits" else (OCR_EVAL, 2)
        assert (r["eval_samples"], r["eval_shards"]) == (n, shards)


def test_pareto_plots(full_sweep):
    _, result, _ = full_sweep
    assert [Path(p).name for p in result.plots] == [f"pareto-{t}.png" for t in TARGETS]
    for p in result.plots:
        data = Path(p).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_progress_reports_counts_and_best_so_far(full_sweep):
    _, result, lines = full_sweep
    total = len(result.rows)
    done = [line for line in lines if line.startswith("[")]
    assert len(done) == total and done[-1].startswith(f"[{total}/{total}]")
    assert any(line.strip().startswith("best so far for ocr-cls @ rpi5") for line in lines)


def test_a_rerun_takes_everything_from_the_cache(full_sweep):
    config, first, _ = full_sweep
    again = run_sweep(config)  # (nothing left to run: Ray is not even asked)
    assert again.executed == 0 and all(r["cached"] for r in again.rows)
    assert again.workers.startswith("no workers")
    assert [(r["candidate"], r["accuracy"], r["size_bytes"]) for r in again.rows] == \
        [(r["candidate"], r["accuracy"], r["size_bytes"]) for r in first.rows]
    assert _choices(again) == _choices(first)


def _digits_baseline(full_sweep) -> tuple[dict, dict]:
    _, result, _ = full_sweep
    rows = {r["candidate"]: r for r in result.rows if r["model"] == "digits"}
    return rows, {k: v for k, v in result.chosen().items() if k[0] == "digits"}


def test_an_interrupted_sweep_resumes_where_it_stopped(full_sweep, tmp_path):
    baseline, chosen = _digits_baseline(full_sweep)
    # (shards of 120 here, of 60 in the baseline: the results must not depend on the sharding either)
    config = write_config(tmp_path, digits_model_toml(), name="resume", shard_size=120)
    seen: list[str] = []

    def stop_after_ten(line: str) -> None:
        seen.append(line)
        if sum(1 for s in seen if s.startswith("[")) == 10:
            raise KeyboardInterrupt  # (as Ctrl-C in the middle of the sweep)

    with pytest.raises(KeyboardInterrupt):
        run_sweep(config, progress=stop_after_ten)
    assert not (tmp_path / "sweep-results" / "results.csv").exists()
    evals = list((tmp_path / ".minirt-sweep" / "evals").glob("*.json"))
    assert len(evals) == 10  # the candidates finished before the interruption, each whole
    assert not list((tmp_path / ".minirt-sweep").rglob("*.minirt-tmp"))
    resumed = run_sweep(config)
    assert resumed.executed == len(baseline) - 10
    assert sum(r["cached"] for r in resumed.rows) == 10
    assert sorted(r["candidate"] for r in resumed.rows) == sorted(baseline)
    assert {r["candidate"]: r["accuracy"] for r in resumed.rows} == {k: v["accuracy"] for k, v in baseline.items()}
    assert resumed.chosen() == chosen


KILLER = '''
"""The digits accuracy, except that the 12th call takes its Ray worker down (once, for the whole sweep)."""
import os

import numpy as np

CALLS = {calls!r}
MARKER = {marker!r}


def accuracy(outputs, data):
    with open(CALLS, "a") as f:
        f.write("x")
    if os.path.getsize(CALLS) >= 12:
        try:
            fd = os.open(MARKER, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pass
        else:
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            os._exit(1)  # the worker process dies in the middle of an evaluation shard
    logits = next(iter(outputs.values()))
    return float((logits.argmax(axis=1) == data["label"]).mean())
'''


def test_a_worker_killed_mid_sweep_changes_nothing(full_sweep, tmp_path):
    baseline, chosen = _digits_baseline(full_sweep)
    marker, calls = tmp_path / "killed.pid", tmp_path / "calls.txt"
    (tmp_path / "killer_metric.py").write_text(KILLER.format(calls=str(calls), marker=str(marker)))
    config = write_config(tmp_path, digits_model_toml(metric="killer_metric:accuracy"), name="killed")
    result = run_sweep(config)
    pid = int(marker.read_text())  # a worker did die ...
    assert pid != os.getpid() and not _alive(pid)
    assert os.path.getsize(calls) > 12  # ... and the sweep went on after it
    # ... and the table is as an undisturbed run's: every candidate once, the same scores, the same choice
    ids = [r["candidate"] for r in result.rows]
    assert sorted(ids) == sorted(baseline) and len(set(ids)) == len(ids)
    assert all(r["status"] == "ok" for r in result.rows), [r["error"] for r in result.rows if r["error"]]
    assert {r["candidate"]: r["accuracy"] for r in result.rows} == {k: v["accuracy"] for k, v in baseline.items()}
    assert result.chosen() == chosen
    assert not list(tmp_path.rglob("*.minirt-tmp"))


def test_command_line(full_sweep, capsys, tmp_path):
    config, result, _ = full_sweep
    out = tmp_path / "cli-out"
    assert main(["sweep", str(config), "--out", str(out), "--json", "-q"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {(c["task"], c["target"]): c["candidate"] for c in doc["chosen"]} == result.chosen()
    assert (out / "results.csv").is_file() and len(list((out / "chosen").glob("*.mrt"))) == 2 * len(TARGETS)
    assert main(["sweep", str(config), "--out", str(out), "--workers", "0"]) == 2
    assert "--workers: must be at least 1" in capsys.readouterr().err
