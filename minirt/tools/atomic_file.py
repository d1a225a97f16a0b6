"""Temporary files for writing a file by a rename (``minirt build``'s artifact, ``minirt install``).

A writer killed before its rename (SIGKILL, a power cut) leaves its temporary file beside the target.
Named ``.<target name>.<pid>.<random>.minirt-tmp``, such files can be told apart: before writing, the
next writer of the same target removes those whose process no longer runs on this machine (a pid in use
again, or one this process cannot signal, is left alone: a file too many is better than a file another
live writer still needs).
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path

SUFFIX = ".minirt-tmp"


def temp_path(target: str | os.PathLike) -> Path:
    """A fresh temporary path beside ``target`` for this process (create it with O_EXCL)."""
    target = Path(target)
    return target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}{SUFFIX}")


def remove_stale(target: str | os.PathLike) -> list[Path]:
    """Remove the temporary files of ``target`` that writers which no longer run left behind; returns them."""
    target = Path(target)
    prefix = f".{target.name}."
    removed = []
    try:
        names = os.listdir(target.parent if str(target.parent) else ".")
    except OSError:
        return removed
    for name in names:
        if not (name.startswith(prefix) and name.endswith(SUFFIX)):
            continue
        parts = name[len(prefix):-len(SUFFIX)].split(".")
        if len(parts) != 2 or not parts[0].isdigit() or _alive(int(parts[0])):
            continue
        path = target.with_name(name)
        try:
            path.unlink()
            removed.append(path)
        except OSError:
            pass
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid() or os.name == "nt":  # (Windows' os.kill(pid, 0) would terminate the process)
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError, OverflowError):
        return True  # (someone else's process, or a pid this platform cannot check: leave its file)
    return True
