"""The sweep's content-addressed cache: nothing done twice, nothing half-written.

Two kinds of entries, under the cache folder (``.minirt-sweep/`` beside the config, or ``--cache``):

``builds/<key>.json`` (+ ``builds/<key>.mrt``)
    one build: its meta (status, size, modeled cost, the build report) and the artifact.  ``key`` is
    the sha256 of the model's content, the canonical build options (+ the model's fixed ones), the
    target profile (all its fields: a profile changed by a new minirt misses), the calibration data's
    hash (quantized builds only), minirt's version and :data:`VERSION`.
``evals/<key>.json``
    one candidate's evaluation: the metric, per-shard sample counts, the host latency.  ``key`` adds the
    build key, the evaluation data's hash, the preprocess function's identity (its module's source
    hash) and the metric's.

Every file is written to a temporary name and renamed over its final name (:mod:`minirt.tools.atomic_file`),
the artifact before its meta: a meta file therefore names a complete artifact (whose sha256 it records
and which is checked on reading), and an interrupted sweep leaves either a whole entry or none.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import minirt
from minirt.builder.sweep.options import canonical_json
from minirt.tools import atomic_file

VERSION = 1  # bump when what an entry means changes


def key(parts: dict) -> str:
    return hashlib.sha256(canonical_json({"v": VERSION, "minirt": minirt.__version__, **parts}).encode()).hexdigest()


class Cache:
    """Entries under ``folder``; ``enabled=False``: nothing read (everything recomputed), still written."""

    def __init__(self, folder: str | os.PathLike, enabled: bool = True):
        self.folder = Path(folder)
        self.enabled = enabled
        for sub in ("builds", "evals"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)

    def _path(self, kind: str, k: str, suffix: str) -> Path:
        return self.folder / kind / f"{k}{suffix}"

    def get_build(self, k: str, always: bool = False) -> tuple[dict, bytes | None] | None:
        """(meta, artifact bytes or None for a failed build), or None when absent or damaged (or when the
        cache is not read, unless ``always``)."""
        if not (self.enabled or always):
            return None
        meta = self._read_json(self._path("builds", k, ".json"))
        if meta is None:
            return None
        if meta.get("status") != "ok":
            return meta, None
        try:
            data = self._path("builds", k, ".mrt").read_bytes()
        except OSError:
            return None
        if hashlib.sha256(data).hexdigest() != meta.get("artifact_sha256"):
            return None  # (not the artifact this meta describes: rebuilt)
        return meta, data

    def put_build(self, k: str, meta: dict, data: bytes | None) -> None:
        if data is not None:
            atomic_file.write(self._path("builds", k, ".mrt"), data)
        self._write_json(self._path("builds", k, ".json"), meta)

    def artifact_path(self, k: str) -> Path:
        return self._path("builds", k, ".mrt")

    def get_eval(self, k: str) -> dict | None:
        return self._read_json(self._path("evals", k, ".json")) if self.enabled else None

    def put_eval(self, k: str, result: dict) -> None:
        self._write_json(self._path("evals", k, ".json"), result)

    @staticmethod
    def _read_json(path: Path) -> Any:
        try:
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return None  # (damaged by hand: recomputed and rewritten)

    @staticmethod
    def _write_json(path: Path, obj: Any) -> None:
        atomic_file.write(path, json.dumps(obj, indent=1, sort_keys=True, default=str).encode("utf-8"))
