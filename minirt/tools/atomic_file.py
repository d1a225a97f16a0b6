"""Writing a file by a rename (``minirt build``'s artifact, ``minirt install``): :func:`write`.

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
from typing import Iterable

SUFFIX = ".minirt-tmp"


def write(target: str | os.PathLike, data: bytes | memoryview | Iterable[bytes]) -> None:
    """Replace ``target`` with ``data`` (bytes-like, or an iterable of chunks) through a temporary file beside
    it and a rename, so that a reader finds the old file or the new one, never a part: the stale temporary
    files of ``target`` removed first; the new file created 0600, given the mode of the file it replaces (else
    0666 minus the umask), flushed to the disk, renamed over ``target``, the folder flushed too.  On any
    failure the temporary file is removed and ``target`` is as it was."""
    target = os.path.abspath(os.fspath(target))
    remove_stale(target)
    tmp = temp_path(target)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o600)
    try:
        if os.path.exists(target):
            os.fchmod(fd, os.stat(target).st_mode & 0o777)
        else:
            os.fchmod(fd, 0o666 & ~_current_umask())
        with os.fdopen(fd, "wb") as f:
            for chunk in (data,) if isinstance(data, (bytes, bytearray, memoryview)) else data:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_folder(os.path.dirname(target))


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_folder(folder: str) -> None:
    """Flush a rename in ``folder`` to the disk (a power cut after it then finds the new file, not the old or
    none).  Not every platform opens folders (Windows): there the rename is as durable as the OS makes it."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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
