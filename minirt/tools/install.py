"""``minirt install NEW.mrt LIVE.mrt``: put a new model where running sessions load theirs, safely.

Copying over a model file that processes have loaded (``cp``, ``scp``, many over-the-air updaters) rewrites
it in place: a session that maps it (``map_file``) would read other weights, or pages past the file's new
end (a SIGBUS).  An atomic rename replaces the directory entry instead: the loaded file stays intact for
whoever has it open, and the next session loads the new one.  This module checks the new artifact first
(every checksum, a signature when a key is given), writes exactly the bytes it checked to a temporary file
in the destination's folder, flushes it to the disk, and renames it over the destination (docs/runtime.md,
D97).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from minirt.errors import InvalidArgument
from minirt.format import reader
from minirt.tools import atomic_file


def install(new: str | os.PathLike, live: str | os.PathLike, verify_key: Any = None,
            require_signature: bool | None = None) -> dict:
    """Check ``new`` and atomically replace ``live`` with it (``live`` a folder: the file of ``new``'s name in
    it).  Returns {"path", "bytes", "replaced", "signer"}.  Nothing is written unless ``new`` verifies, under
    the trust policy a Session applies (``verify_key``, ``require_signature``, ``MINIRT_TRUSTED_KEYS``); a
    failure leaves ``live`` as it was and no temporary file behind."""
    from minirt.session import trusted_keys

    verify_key = trusted_keys(verify_key, require_signature)
    new_path = Path(new)
    live_path = Path(live)
    if live_path.is_dir():
        live_path = live_path / new_path.name
    folder = live_path.parent
    if not folder.is_dir():
        raise InvalidArgument(f"{live}: its folder {str(folder) or '.'!r} does not exist")
    if live_path.exists() and not live_path.is_file():
        raise InvalidArgument(f"{live_path}: exists and is not a file")
    try:
        if new_path.resolve() == live_path.resolve():
            raise InvalidArgument(f"{new} and {live} are the same file: nothing to install")
    except OSError:
        pass
    # what gets written is the private copy that was verified (map_file=False), not the file read again
    artifact = reader.load(new_path, verify_checksums=True, verify_key=verify_key, map_file=False)
    data = memoryview(artifact._buffer)
    replaced = live_path.exists()
    atomic_file.write(live_path, data)
    signer = None
    if artifact.signer is not None and verify_key is not None:
        from minirt.format.signature import fingerprint

        signer = fingerprint(artifact.signer[1])
    return {"path": str(live_path), "bytes": len(data), "replaced": replaced, "signer": signer}

